"""hack-router's OpenAI-compatible API end to end (DESIGN.md §5), against real local clusters
started by cluster.py: the official `openai` client for the API surface, raw sockets for
malformed requests, and 2 prefill + 2 decode nodes for routing, failures, backpressure and
cancellation.

Golden outputs come from build/bin/hack-run (one process, no router, no network) and token
counts from build/bin/hack-tokenize — never from the router itself.

    cd tests/e2e && HACK_BUILD_DIR=../../build python3 -m unittest -v openai_api_test
"""

import http.client
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import unittest

try:
    import openai
except ImportError as e:  # a failure, not a skip: CI must have it
    raise ImportError("the `openai` Python package is missing: pip install -r scripts/requirements-test.txt "
                      "(scripts/install-deps.sh does it)") from e

import cluster

MODEL = "hack-tiny"  # the served name: the model directory's name
MAX_MODEL_LEN = 1024  # models/hack-tiny max_position_embeddings
API_KEY = "sk-e2e-" + os.urandom(4).hex()
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# A reply to the router's end of a request that the nodes have to settle; slack for 2 loaded cores.
SETTLE_S = 10.0

PROMPT = "In the beginning God created"
UNICODE_PROMPT = "Grüße aus Köln — 世界, naïve café ✓ ½ €"


# ---- references -----------------------------------------------------------------------------

def hack_run(prompt=None, chat=None, max_tokens=32, temperature=0.0, seed=None, logprobs=None):
    """hack-run --json on one process: the reference for text, ids and logprobs. Same KV format
    (hack, 2-bit) and thread count as the nodes, so greedy ids must match exactly."""
    argv = [cluster.binary("hack-run"), "--model", cluster.MODEL_DIR, "--kv", "hack", "--kv-dtype", "bf16",
            "--threads", "1", "--temperature", str(temperature), "--top-p", "1", "--top-k", "0", "--min-p", "0",
            "--max-tokens", str(max_tokens), "--json"]
    chat_file = None
    if chat is not None:
        chat_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(chat, chat_file)
        chat_file.close()
        argv += ["--chat-file", chat_file.name]
    else:
        argv += ["--prompt", prompt]
    if seed is not None:
        argv += ["--seed", str(seed)]
    if logprobs is not None:
        argv += ["--logprobs", str(logprobs)]
    try:
        out = subprocess.run(argv, check=True, capture_output=True, timeout=60)
    finally:
        if chat_file:
            os.unlink(chat_file.name)
    return json.loads(out.stdout)


def tokenize(text):
    """Prompt ids as hack-tokenize encodes them with the tokenizer's special tokens (BOS)."""
    out = subprocess.run([cluster.binary("hack-tokenize"), "--tokenizer", cluster.MODEL_DIR, "--text", text,
                          "--add-special-tokens", "--json"], check=True, capture_output=True, timeout=60)
    return json.loads(out.stdout)


def tokenize_chat(messages):
    """{"text", "ids"} of `messages` rendered with the model's template and a generation prompt."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(messages, f)
    try:
        out = subprocess.run([cluster.binary("hack-tokenize"), "--tokenizer", cluster.MODEL_DIR, "--chat-file",
                              f.name, "--add-generation-prompt", "--json"], check=True, capture_output=True, timeout=60)
    finally:
        os.unlink(f.name)
    return json.loads(out.stdout)


# ---- raw HTTP -------------------------------------------------------------------------------

def raw_request(port, method, path, body=None, headers=None, timeout=30.0):
    """(status, headers dict with lower-case names, body bytes) over a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


class SseStream:
    """A streaming request held open by the test: events are read one at a time, close()
    drops the connection (a client that went away)."""

    def __init__(self, port, path, body, headers=None, timeout=60.0):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json",
                                                                        **(headers or {})})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.done = False

    def next_event(self):
        """The next `data:` payload as a dict, "[DONE]", or None at the end of the stream."""
        while True:
            line = self.resp.readline()
            if not line:
                return None
            line = line.decode("utf-8").rstrip("\r\n")
            if line.startswith("data: "):
                data = line[len("data: "):]
                if data == "[DONE]":
                    self.done = True
                    return data
                return json.loads(data)

    def read_all(self):
        events = []
        while (e := self.next_event()) not in (None, "[DONE]"):
            events.append(e)
        return events

    def close(self):
        # shutdown() first: the server sees the FIN at once, whatever close() defers.
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        self.resp.close()
        self.conn.close()


def wait_for(predicate, timeout, what, interval=0.05):
    """Polls until predicate() is truthy; returns its value or fails with `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


class ErrorBodyMixin:
    def assert_error_body(self, body, status=None):
        """The router's error shape: {"error": {"message", "type", "param", "code"}}."""
        try:
            j = json.loads(body)
        except ValueError:
            self.fail(f"error body is not JSON (HTTP {status}): {body[:300]!r}")
        self.assertIn("error", j, body)
        err = j["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"}, err)
        self.assertIsInstance(err["message"], str)
        self.assertTrue(err["message"], err)
        self.assertIsInstance(err["type"], str)
        self.assertTrue(err["param"] is None or isinstance(err["param"], str), err)
        self.assertTrue(err["code"] is None or isinstance(err["code"], str), err)
        return err


# ---- the API through the openai client ------------------------------------------------------

class OpenAIApiTest(ErrorBodyMixin, unittest.TestCase):
    """1 prefill + 1 decode; the router requires an API key."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = cluster.Cluster(prefill=1, decode=1, router_flags=["--api-key", API_KEY])
        cls.router = cls.cluster.router
        cls.client = openai.OpenAI(base_url=f"http://127.0.0.1:{cls.router.port}/v1", api_key=API_KEY,
                                   max_retries=0, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def complete(self, **kw):
        kw.setdefault("model", MODEL)
        return self.client.completions.create(**kw)

    def chat(self, **kw):
        kw.setdefault("model", MODEL)
        return self.client.chat.completions.create(**kw)

    def stream_completion(self, **kw):
        """(text per choice index, finish_reason per index, chunks)."""
        chunks = list(self.complete(stream=True, **kw))
        texts, finish = {}, {}
        for c in chunks:
            for ch in c.choices:
                texts[ch.index] = texts.get(ch.index, "") + ch.text
                if ch.finish_reason is not None:
                    self.assertNotIn(ch.index, finish, "two finish reasons for one choice")
                    finish[ch.index] = ch.finish_reason
        return texts, finish, chunks

    def stream_chat(self, **kw):
        chunks = list(self.chat(stream=True, **kw))
        texts, finish, roles = {}, {}, {}
        for c in chunks:
            for ch in c.choices:
                if ch.delta.role:
                    roles[ch.index] = ch.delta.role
                texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
                if ch.finish_reason is not None:
                    self.assertNotIn(ch.index, finish, "two finish reasons for one choice")
                    finish[ch.index] = ch.finish_reason
        for i in texts:
            self.assertEqual(roles.get(i), "assistant", f"choice {i} has no role chunk")
        return texts, finish, chunks

    # -- basics --

    def test_models_lists_the_served_model(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], [MODEL])

    def test_greedy_completion_equals_hack_run(self):
        for prompt, n_tokens in ((PROMPT, 40), ("Hello there", 24), ("x", 7), (UNICODE_PROMPT, 30)):
            with self.subTest(prompt=prompt):
                ref = hack_run(prompt, max_tokens=n_tokens)
                # The router adds BOS exactly as hack-run does (prompt_ids come from hack-run itself).
                self.assertEqual(ref["prompt_ids"], tokenize(prompt))
                r = self.complete(prompt=prompt, max_tokens=n_tokens, temperature=0)
                self.assertEqual(r.object, "text_completion")
                self.assertTrue(r.id.startswith("cmpl-"), r.id)
                self.assertEqual(r.model, MODEL)
                self.assertEqual(len(r.choices), 1)
                self.assertEqual(r.choices[0].text, ref["text"])
                self.assertEqual(r.choices[0].finish_reason, ref["finish_reason"])
                self.assertEqual(r.usage.prompt_tokens, len(ref["prompt_ids"]))
                self.assertEqual(r.usage.completion_tokens, len(ref["ids"]))
                self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
                texts, finish, chunks = self.stream_completion(prompt=prompt, max_tokens=n_tokens, temperature=0)
                self.assertEqual(texts, {0: ref["text"]})
                self.assertEqual(finish, {0: ref["finish_reason"]})
                self.assertTrue(all(c.usage is None for c in chunks), "usage sent without include_usage")

    def test_batched_prompts_equal_single_requests(self):
        prompts = [PROMPT, "Hello there", "x"]
        singles = [self.complete(prompt=p, max_tokens=6, temperature=0, n=2).choices for p in prompts]
        r = self.complete(prompt=prompts, max_tokens=6, temperature=0, n=2)
        self.assertEqual([c.index for c in r.choices], list(range(6)))
        for p, single in enumerate(singles):
            for i in range(2):
                self.assertEqual(r.choices[p * 2 + i].text, single[i].text)
        self.assertEqual(r.usage.prompt_tokens, sum(len(tokenize(p)) for p in prompts))
        # Sampled with a seed: choice i of prompt p is sampled as choice i of that prompt alone.
        seeded = self.complete(prompt=[PROMPT, [1, 2, 3]], max_tokens=5, temperature=1.0, seed=11)
        alone = self.complete(prompt=[1, 2, 3], max_tokens=5, temperature=1.0, seed=11)
        self.assertEqual(seeded.choices[1].text, alone.choices[0].text)
        texts, finish, _ = self.stream_completion(prompt=prompts, max_tokens=6, temperature=0)
        self.assertEqual(texts, {p: singles[p][0].text for p in range(3)})

    def test_model_by_id_tokenize_and_detokenize(self):
        self.assertEqual(self.client.models.retrieve(MODEL).id, MODEL)
        with self.assertRaises(openai.NotFoundError):
            self.client.models.retrieve("no-such-model")
        status, _, body = raw_request(self.router.port, "POST", "/tokenize", {"prompt": PROMPT}, headers=AUTH)
        self.assertEqual(status, 200, body)
        t = json.loads(body)
        self.assertEqual(t["tokens"], tokenize(PROMPT))
        self.assertEqual(t["count"], len(t["tokens"]))
        messages = [{"role": "user", "content": "Hello"}]
        status, _, body = raw_request(self.router.port, "POST", "/tokenize", {"messages": messages}, headers=AUTH)
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["tokens"], tokenize_chat(messages)["ids"])
        status, _, body = raw_request(self.router.port, "POST", "/detokenize", {"tokens": t["tokens"][1:]}, headers=AUTH)
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["prompt"], PROMPT)
        for path, bad in (("/tokenize", {"prompt": 5}), ("/detokenize", {"tokens": [-1]}),
                          ("/detokenize", {"tokens": "x"}), ("/tokenize", "not json")):
            status, _, body = raw_request(self.router.port, "POST", path, bad, headers=AUTH)
            self.assertEqual(status, 400, (path, bad, body))

    def test_logit_bias_bans_and_forces_tokens(self):
        ref = hack_run(PROMPT, max_tokens=4)
        first = ref["ids"][0]
        # -100 on the greedy first token: another token comes first.
        r = self.complete(prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0, logit_bias={str(first): -100})
        self.assertNotEqual(r.choices[0].text, ref["text"])
        self.assertNotEqual(r.choices[0].logprobs.tokens[0], hack_run(PROMPT, max_tokens=1)["text"])
        # +100 on one token: every token is that one, sampled or greedy, streamed or not.
        one = hack_run(PROMPT, max_tokens=1)["text"]
        for temperature in (0, 1.0):
            r = self.complete(prompt=PROMPT, max_tokens=4, temperature=temperature, seed=5,
                              logit_bias={str(first): 100})
            self.assertEqual(r.choices[0].text, one * 4)
        texts, _, _ = self.stream_completion(prompt=PROMPT, max_tokens=4, temperature=0, logit_bias={str(first): 100})
        self.assertEqual(texts, {0: one * 4})
        # Reported logprobs are of the biased distribution (OpenAI's): a +100 token is certain.
        r = self.complete(prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1, logit_bias={str(first): 100})
        self.assertGreater(r.choices[0].logprobs.token_logprobs[0], -1e-3)
        c = self.chat(messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0,
                      logit_bias={str(first): 100})
        self.assertEqual(c.choices[0].message.content, one * 3)
        # Out of the vocabulary: a 400 naming the parameter.
        with self.assertRaises(openai.BadRequestError) as e:
            self.complete(prompt=PROMPT, max_tokens=2, logit_bias={"99999999": 1})
        self.assertIn("logit_bias", str(e.exception))

    def test_prompt_as_token_ids_equals_text_prompt(self):
        ids = tokenize(PROMPT)
        ref = hack_run(PROMPT, max_tokens=20)
        r = self.complete(prompt=ids, max_tokens=20, temperature=0)
        self.assertEqual(r.choices[0].text, ref["text"])
        self.assertEqual(r.usage.prompt_tokens, len(ids))
        # Without BOS the model sees another prompt: the router must not add one to token ids.
        r2 = self.complete(prompt=ids[1:], max_tokens=1, temperature=0)
        self.assertEqual(r2.usage.prompt_tokens, len(ids) - 1)

    def test_greedy_chat_equals_hack_run(self):
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Who made the heaven and the earth?"}]
        ref = hack_run(chat=messages, max_tokens=30)
        rendered = tokenize_chat(messages)
        self.assertEqual(ref["prompt_ids"], rendered["ids"])
        r = self.chat(messages=messages, max_tokens=30, temperature=0)
        self.assertEqual(r.object, "chat.completion")
        self.assertTrue(r.id.startswith("chatcmpl-"), r.id)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertEqual(r.choices[0].message.content, ref["text"])
        self.assertEqual(r.choices[0].finish_reason, ref["finish_reason"])
        self.assertEqual(r.usage.prompt_tokens, len(rendered["ids"]))
        self.assertEqual(r.usage.completion_tokens, len(ref["ids"]))
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        # max_completion_tokens is the chat name of max_tokens.
        r2 = self.chat(messages=messages, max_completion_tokens=30, temperature=0)
        self.assertEqual(r2.choices[0].message.content, ref["text"])
        texts, finish, chunks = self.stream_chat(messages=messages, max_tokens=30, temperature=0)
        self.assertEqual(texts, {0: ref["text"]})
        self.assertEqual(finish, {0: ref["finish_reason"]})
        self.assertTrue(all(c.object == "chat.completion.chunk" for c in chunks))
        self.assertEqual(len({c.id for c in chunks}), 1, "chunks of one stream carry one id")

    def test_stop_token_ids(self):
        # vLLM's stop_token_ids: generation ends after emitting one; a non-special stop token
        # stays in the text. The first occurrence of the greedy output's 6th token ends it.
        ref = hack_run(PROMPT, max_tokens=20, logprobs=0)
        stop_id = ref["ids"][5]
        first = ref["ids"].index(stop_id)
        r = self.complete(prompt=PROMPT, max_tokens=20, temperature=0, logprobs=0,
                          extra_body={"stop_token_ids": [stop_id]})
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.usage.completion_tokens, first + 1)
        self.assertTrue(ref["text"].startswith(r.choices[0].text), r.choices[0].text)
        self.assertEqual(r.choices[0].text, "".join(r.choices[0].logprobs.tokens))

    # -- stop strings --

    def _straddling_stop(self, strs, text, min_index=3):
        """A stop string made of the end of one generated token and the start of the next
        (`strs`: the tokens of a greedy `text`, from a logprobs response), whose first
        occurrence in the text is at that token boundary: (stop, expected text, tokens
        generated until it completes)."""
        self.assertEqual("".join(strs), text, "token strings do not concatenate to the text")
        offset = 0
        offsets = []
        for s in strs:
            offsets.append(offset)
            offset += len(s)
        for k in range(max(min_index, len(strs) // 3), len(strs)):
            a, b = strs[k - 1], strs[k]
            if len(a) < 2 or len(b) < 1 or not a.isprintable() or not b.isprintable():
                continue
            stop = a[-2:] + b[:2]
            start = offsets[k] - 2
            if text.find(stop) == start:
                return stop, text[:start], k + 1
        self.fail(f"no token boundary to straddle in {strs!r}")

    def test_stop_string_split_across_tokens_completions(self):
        ref = hack_run(PROMPT, max_tokens=60)
        greedy = self.complete(prompt=PROMPT, max_tokens=60, temperature=0, logprobs=0,
                               extra_body={"ignore_eos": True})
        self.assertEqual(greedy.choices[0].text, ref["text"])
        stop, expected, n_tokens = self._straddling_stop(greedy.choices[0].logprobs.tokens, ref["text"])
        for stops in ([stop], ["never-appears-\u2603", stop]):
            with self.subTest(stop=stops):
                r = self.complete(prompt=PROMPT, max_tokens=60, temperature=0, stop=stops,
                                  extra_body={"ignore_eos": True})
                self.assertEqual(r.choices[0].text, expected)
                self.assertEqual(r.choices[0].finish_reason, "stop")
                self.assertEqual(r.usage.completion_tokens, n_tokens)
                texts, finish, chunks = self.stream_completion(prompt=PROMPT, max_tokens=60, temperature=0,
                                                               stop=stops, extra_body={"ignore_eos": True})
                self.assertEqual(texts, {0: expected})
                self.assertEqual(finish, {0: "stop"})
                # No chunk ever carried any part of the stop string past the cut.
                sent = ""
                for c in chunks:
                    for ch in c.choices:
                        sent += ch.text
                        self.assertTrue(expected.startswith(sent), f"sent {sent!r} beyond {expected!r}")
        # vLLM's include_stop_str_in_output keeps the stop string.
        r = self.complete(prompt=PROMPT, max_tokens=60, temperature=0, stop=stop,
                          extra_body={"include_stop_str_in_output": True})
        self.assertEqual(r.choices[0].text, expected + stop)
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_stop_string_split_across_tokens_chat(self):
        messages = [{"role": "user", "content": "Tell me about Moses and the people of Israel."}]
        ref = hack_run(chat=messages, max_tokens=60)
        greedy = self.chat(messages=messages, max_tokens=60, temperature=0, logprobs=True)
        self.assertEqual(greedy.choices[0].message.content, ref["text"])
        self.assertGreaterEqual(len(ref["ids"]), 8, f"greedy reply too short to straddle: {ref['text']!r}")
        stop, expected, n_tokens = self._straddling_stop([e.token for e in greedy.choices[0].logprobs.content],
                                                         ref["text"])
        r = self.chat(messages=messages, max_tokens=60, temperature=0, stop=[stop])
        self.assertEqual(r.choices[0].message.content, expected)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.usage.completion_tokens, n_tokens)
        texts, finish, _ = self.stream_chat(messages=messages, max_tokens=60, temperature=0, stop=[stop])
        self.assertEqual(texts, {0: expected})
        self.assertEqual(finish, {0: "stop"})

    def test_stop_string_that_never_completes_is_flushed(self):
        # A held-back prefix of a stop string ("an" of "an-never") must be sent at max_tokens.
        ref = hack_run(PROMPT, max_tokens=30)
        tail = ref["text"][-2:]
        stop = tail + "\u2603never"
        r = self.complete(prompt=PROMPT, max_tokens=30, temperature=0, stop=stop)
        self.assertEqual(r.choices[0].text, ref["text"])
        self.assertEqual(r.choices[0].finish_reason, "length")
        texts, finish, _ = self.stream_completion(prompt=PROMPT, max_tokens=30, temperature=0, stop=stop)
        self.assertEqual(texts, {0: ref["text"]})
        self.assertEqual(finish, {0: "length"})

    # -- n, seed, sampling --

    def test_n_choices(self):
        ref = hack_run(PROMPT, max_tokens=16)
        r = self.complete(prompt=PROMPT, max_tokens=16, temperature=0, n=2)
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1])
        self.assertEqual([c.text for c in r.choices], [ref["text"]] * 2)
        self.assertEqual(r.usage.prompt_tokens, len(ref["prompt_ids"]))
        self.assertEqual(r.usage.completion_tokens, 2 * len(ref["ids"]))
        # Sampled: three choices, each its own stream of tokens, counted in usage.
        r = self.complete(prompt=PROMPT, max_tokens=24, temperature=1, n=3, seed=11, logprobs=0,
                          extra_body={"ignore_eos": True})
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1, 2])
        self.assertEqual(r.usage.completion_tokens, sum(len(c.logprobs.tokens) for c in r.choices))
        self.assertEqual(r.usage.completion_tokens, 3 * 24)
        self.assertEqual(len({c.text for c in r.choices}), 3, [c.text for c in r.choices])
        texts, finish, _ = self.stream_completion(prompt=PROMPT, max_tokens=24, temperature=1, n=3, seed=11,
                                                  extra_body={"ignore_eos": True})
        self.assertEqual(texts, {c.index: c.text for c in r.choices}, "stream and non-stream differ for one seed")
        self.assertEqual(finish, {0: "length", 1: "length", 2: "length"})
        messages = [{"role": "user", "content": "Name a prophet."}]
        ctexts, cfinish, _ = self.stream_chat(messages=messages, max_tokens=12, temperature=1, n=2, seed=5)
        self.assertEqual(set(ctexts), {0, 1})
        self.assertEqual(set(cfinish), {0, 1})
        c = self.chat(messages=messages, max_tokens=12, temperature=1, n=2, seed=5)
        self.assertEqual({ch.index: ch.message.content for ch in c.choices}, ctexts)

    def test_seed_reproducibility(self):
        kw = dict(prompt=PROMPT, max_tokens=48, temperature=1.0, extra_body={"ignore_eos": True})
        a = self.complete(seed=1234, **kw).choices[0].text
        b = self.complete(seed=1234, **kw).choices[0].text
        c = self.complete(seed=4321, **kw).choices[0].text
        self.assertEqual(a, b)
        self.assertNotEqual(a, c, "48 sampled tokens at temperature 1 are the same for two seeds")
        # The distributed sampler (first token on prefill, the rest on decode) continues the
        # same random stream as the single-process one.
        ref = hack_run(PROMPT, max_tokens=48, temperature=1.0, seed=1234)
        r = self.complete(seed=1234, prompt=PROMPT, max_tokens=48, temperature=1.0)
        self.assertEqual(r.choices[0].text, ref["text"])
        texts, _, _ = self.stream_completion(seed=1234, **kw)
        self.assertEqual(texts, {0: a})

    # -- logprobs --

    def assert_sorted_desc(self, values, what):
        self.assertEqual(list(values), sorted(values, reverse=True), f"{what} not sorted best first")

    def test_completion_logprobs(self):
        k = 3
        ref = hack_run(PROMPT, max_tokens=12, logprobs=k)
        r = self.complete(prompt=PROMPT, max_tokens=12, temperature=0, logprobs=k)
        lp = r.choices[0].logprobs
        n = r.usage.completion_tokens
        self.assertEqual(n, 12)
        self.assertEqual(len(lp.tokens), n)
        self.assertEqual(len(lp.token_logprobs), n)
        self.assertEqual(len(lp.top_logprobs), n)
        self.assertEqual(len(lp.text_offset), n)
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        self.assertEqual(lp.text_offset[0], 0)
        self.assertEqual(lp.text_offset, sorted(lp.text_offset))
        for i, (tok, val, top) in enumerate(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)):
            self.assertLessEqual(val, 0.0)
            self.assertLessEqual(len(top), k)
            self.assertGreaterEqual(len(top), 1)
            self.assertTrue(all(v <= 0.0 for v in top.values()), top)
            self.assert_sorted_desc(top.values(), f"top_logprobs[{i}]")
            # Greedy: the sampled token is the best one.
            self.assertIn(tok, top)
            self.assertAlmostEqual(top[tok], max(top.values()), places=5)
            self.assertAlmostEqual(val, top[tok], places=5)
            # Same numbers as the single-process run (same weights, KV format and threads).
            self.assertAlmostEqual(val, ref["logprobs"][i]["logprob"], delta=1e-4)
        # Streamed chunks carry the same logprobs, text_offset counting from the stream start.
        chunks = list(self.complete(prompt=PROMPT, max_tokens=12, temperature=0, logprobs=k, stream=True))
        s_tokens, s_lps, s_offsets = [], [], []
        for c in chunks:
            for ch in c.choices:
                if ch.logprobs:
                    s_tokens += ch.logprobs.tokens
                    s_lps += ch.logprobs.token_logprobs
                    s_offsets += ch.logprobs.text_offset
        self.assertEqual(s_tokens, lp.tokens)
        self.assertEqual(s_offsets, lp.text_offset)
        for a, b in zip(s_lps, lp.token_logprobs):
            self.assertAlmostEqual(a, b, places=5)
        # A stop string whose prefix keeps appearing holds text back mid-stream: the streamed
        # offsets must still count every token, as the non-stream response does.
        held = dict(prompt=PROMPT, max_tokens=30, temperature=0, logprobs=1, stop=["the law of the Z"])
        whole = self.complete(**held).choices[0].logprobs
        s_tokens, s_offsets = [], []
        for c in self.complete(stream=True, **held):
            for ch in c.choices:
                if ch.logprobs:
                    s_tokens += ch.logprobs.tokens
                    s_offsets += ch.logprobs.text_offset
        self.assertEqual(s_tokens, whole.tokens)
        self.assertEqual(s_offsets, whole.text_offset)
        # logprobs=0: the sampled token's logprob only.
        r0 = self.complete(prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0)
        self.assertEqual(len(r0.choices[0].logprobs.tokens), 4)
        # No logprobs asked, none sent.
        self.assertIsNone(self.complete(prompt=PROMPT, max_tokens=2, temperature=0).choices[0].logprobs)

    def test_chat_logprobs(self):
        k = 4
        messages = [{"role": "user", "content": "Who led Israel out of Egypt?"}]
        r = self.chat(messages=messages, max_tokens=10, temperature=0, logprobs=True, top_logprobs=k)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        self.assertEqual("".join(e.token for e in content), r.choices[0].message.content)
        for i, e in enumerate(content):
            self.assertLessEqual(e.logprob, 0.0)
            self.assertEqual(bytes(e.bytes), e.token.encode("utf-8"))
            self.assertEqual(len(e.top_logprobs), k)
            self.assert_sorted_desc([t.logprob for t in e.top_logprobs], f"content[{i}].top_logprobs")
            self.assertTrue(all(t.logprob <= 0.0 for t in e.top_logprobs))
            self.assertEqual(e.top_logprobs[0].token, e.token, "greedy token is not the top one")
            self.assertAlmostEqual(e.top_logprobs[0].logprob, e.logprob, places=5)
        # logprobs=True without top_logprobs: entries with empty alternatives.
        r = self.chat(messages=messages, max_tokens=3, temperature=0, logprobs=True)
        self.assertEqual(len(r.choices[0].logprobs.content), 3)
        self.assertEqual([len(e.top_logprobs) for e in r.choices[0].logprobs.content], [0, 0, 0])
        self.assertIsNone(self.chat(messages=messages, max_tokens=2, temperature=0).choices[0].logprobs)
        # Streamed.
        chunks = list(self.chat(messages=messages, max_tokens=10, temperature=0, logprobs=True, top_logprobs=k,
                                stream=True))
        streamed = [e for c in chunks for ch in c.choices if ch.logprobs and ch.logprobs.content
                    for e in ch.logprobs.content]
        self.assertEqual([e.token for e in streamed], [e.token for e in content])

    # -- usage --

    def test_usage_counts_prompt_tokens_like_hack_tokenize(self):
        for text in ("a", PROMPT, UNICODE_PROMPT, "word " * 50):
            with self.subTest(text=text[:20]):
                r = self.complete(prompt=text, max_tokens=1, temperature=0)
                self.assertEqual(r.usage.prompt_tokens, len(tokenize(text)))
                self.assertEqual(r.usage.completion_tokens, 1)
                self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 1)
        for messages in ([{"role": "user", "content": "hi"}],
                         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": UNICODE_PROMPT},
                          {"role": "assistant", "content": "Amen."}, {"role": "user", "content": "Again."}]):
            with self.subTest(messages=len(messages)):
                r = self.chat(messages=messages, max_tokens=2, temperature=0)
                self.assertEqual(r.usage.prompt_tokens, len(tokenize_chat(messages)["ids"]))

    def test_stream_options_include_usage(self):
        for endpoint in ("completions", "chat"):
            with self.subTest(endpoint=endpoint):
                if endpoint == "completions":
                    chunks = list(self.complete(prompt=PROMPT, max_tokens=9, temperature=0, n=2, stream=True,
                                                stream_options={"include_usage": True}))
                    expected_prompt = len(tokenize(PROMPT))
                else:
                    messages = [{"role": "user", "content": "Speak."}]
                    chunks = list(self.chat(messages=messages, max_tokens=9, temperature=0, n=2, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
                    expected_prompt = len(tokenize_chat(messages)["ids"])
                last = chunks[-1]
                self.assertEqual(last.choices, [])
                self.assertIsNotNone(last.usage)
                self.assertEqual(last.usage.prompt_tokens, expected_prompt)
                self.assertEqual(last.usage.completion_tokens, 18)
                self.assertEqual(last.usage.total_tokens, expected_prompt + 18)
                for c in chunks[:-1]:
                    self.assertIsNone(c.usage)
                    self.assertEqual(len(c.choices), 1)

    # -- unicode --

    def test_unicode_in_streamed_deltas(self):
        # echo=True sends the multi-byte prompt back in the stream; the completion after it is
        # decoded token by token, and a character split across tokens must arrive whole.
        kw = dict(prompt=UNICODE_PROMPT, max_tokens=40, temperature=0, echo=True)
        r = self.complete(**kw)
        self.assertTrue(r.choices[0].text.startswith(UNICODE_PROMPT), r.choices[0].text)
        texts, _, chunks = self.stream_completion(**kw)
        self.assertEqual(texts, {0: r.choices[0].text})
        for c in chunks:
            for ch in c.choices:
                self.assertNotIn("\ufffd", ch.text, "a delta split a UTF-8 character")
        # The echoed prompt is the text as sent (the tokenizer splits '世' into byte tokens), and
        # the completion after it is hack-run's.
        ref = hack_run(UNICODE_PROMPT, max_tokens=40)
        self.assertEqual(r.choices[0].text, UNICODE_PROMPT + ref["text"])
        # Sampled at temperature 2 the model emits raw byte tokens (partial or invalid UTF-8):
        # the stream must decode them exactly as the whole text is decoded by hack-run.
        seen_non_ascii = 0
        for seed in range(10):
            ref = hack_run(PROMPT, max_tokens=60, temperature=2.0, seed=seed)
            if all(ord(ch) < 128 for ch in ref["text"]):
                continue
            seen_non_ascii += 1
            with self.subTest(seed=seed):
                kw = dict(prompt=PROMPT, max_tokens=60, temperature=2.0, seed=seed)
                self.assertEqual(self.complete(**kw).choices[0].text, ref["text"])
                self.assertEqual(self.stream_completion(**kw)[0], {0: ref["text"]})
        self.assertGreater(seen_non_ascii, 0, "no seed in 0..9 produced a non-ASCII byte token")
        # Chat content with multi-byte characters, streamed.
        messages = [{"role": "user", "content": "Grüße! 世界 ½ — café"}]
        ctexts, _, _ = self.stream_chat(messages=messages, max_tokens=30, temperature=0)
        c = self.chat(messages=messages, max_tokens=30, temperature=0)
        self.assertEqual(ctexts, {0: c.choices[0].message.content})

    # -- errors --

    def test_unknown_model_is_not_found(self):
        with self.assertRaises(openai.NotFoundError) as cm:
            self.complete(model="no-such-model", prompt="x", max_tokens=1)
        self.assertEqual(cm.exception.status_code, 404)
        self.assertEqual(cm.exception.code, "model_not_found")
        self.assertEqual(cm.exception.param, "model")
        self.assertIn("no-such-model", cm.exception.message)
        with self.assertRaises(openai.NotFoundError):
            self.chat(model="no-such-model", messages=[{"role": "user", "content": "x"}], max_tokens=1)

    def test_bad_requests(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            self.complete(prompt="x", max_tokens=-1)
        self.assertEqual(cm.exception.status_code, 400)
        self.assertEqual(cm.exception.param, "max_tokens")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.chat(messages=[{"role": "user", "content": "x"}], max_tokens=0)
        self.assertEqual(cm.exception.param, "max_tokens")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.chat(messages=[], max_tokens=1)
        self.assertEqual(cm.exception.param, "messages")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.complete(prompt="x", temperature=3)
        self.assertEqual(cm.exception.param, "temperature")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.complete(prompt="x", logprobs=21)
        self.assertEqual(cm.exception.param, "logprobs")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.complete(prompt="x", n=0)
        self.assertEqual(cm.exception.param, "n")
        # A streamed request that is invalid is refused before the stream starts.
        with self.assertRaises(openai.BadRequestError) as cm:
            self.complete(prompt="x", max_tokens=-3, stream=True)
        self.assertEqual(cm.exception.param, "max_tokens")
        with self.assertRaises(openai.BadRequestError):
            self.chat(messages=[], stream=True)

    def test_too_long_prompt_names_the_limit(self):
        long_prompt = "and the " * 600
        n_prompt = len(tokenize(long_prompt))
        self.assertGreater(n_prompt, MAX_MODEL_LEN)
        for kw in (dict(), dict(max_tokens=10)):
            with self.subTest(**kw):
                with self.assertRaises(openai.BadRequestError) as cm:
                    self.complete(prompt=long_prompt, **kw)
                e = cm.exception
                self.assertEqual(e.code, "context_length_exceeded")
                self.assertEqual(e.param, "prompt")
                self.assertIn(str(MAX_MODEL_LEN), e.message)
                self.assertIn(str(n_prompt), e.message)
        # A prompt that fits but leaves too little room for max_tokens.
        fits = "and the " * 100
        n_fits = len(tokenize(fits))
        with self.assertRaises(openai.BadRequestError) as cm:
            self.complete(prompt=fits, max_tokens=MAX_MODEL_LEN - n_fits + 1)
        self.assertIn(str(MAX_MODEL_LEN), cm.exception.message)
        r = self.complete(prompt=fits, max_tokens=MAX_MODEL_LEN - n_fits, temperature=0,
                          extra_body={"ignore_eos": True})  # exactly the whole context
        self.assertEqual(r.usage.total_tokens, MAX_MODEL_LEN)
        self.assertEqual(r.choices[0].finish_reason, "length")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.chat(messages=[{"role": "user", "content": long_prompt}])
        self.assertEqual(cm.exception.code, "context_length_exceeded")
        self.assertEqual(cm.exception.param, "messages")

    def test_api_key_required(self):
        port = self.router.port
        for key in ("wrong-key", API_KEY + "x", API_KEY[:-1]):
            bad = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=30)
            with self.subTest(key=key):
                with self.assertRaises(openai.AuthenticationError) as cm:
                    bad.completions.create(model=MODEL, prompt="x", max_tokens=1)
                self.assertEqual(cm.exception.status_code, 401)
                self.assertEqual(cm.exception.code, "invalid_api_key")
                with self.assertRaises(openai.AuthenticationError):
                    bad.models.list()
        status, _, body = raw_request(port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
        self.assertEqual(status, 401)
        self.assert_error_body(body, status)
        # /health stays open for load balancers.
        self.assertEqual(raw_request(port, "GET", "/health")[0], 200)


# ---- malformed requests, raw ----------------------------------------------------------------

class MalformedRequestTest(ErrorBodyMixin, unittest.TestCase):
    """A router with a small body limit and header timeout, fed broken requests over raw
    sockets; after all of them it still serves."""

    HEADER_TIMEOUT_S = 1.0
    MAX_BODY_KB = 16

    @classmethod
    def setUpClass(cls):
        cls.cluster = cluster.Cluster(prefill=1, decode=1, router_flags=[
            "--header-timeout", str(cls.HEADER_TIMEOUT_S), "--max-body-kb", str(cls.MAX_BODY_KB)])
        cls.port = cls.cluster.router.port

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def assert_good_request_works(self):
        status, _, body = raw_request(self.port, "POST", "/v1/completions",
                                      {"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "temperature": 0})
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["usage"]["completion_tokens"], 5)

    def test_battery(self):
        C, CH = "/v1/completions", "/v1/chat/completions"
        msgs = [{"role": "user", "content": "hi"}]
        cases = [
            # (name, method, path, body, status, param)
            ("bad json", "POST", C, '{"prompt": "x",', 400, None),
            ("bad json chat", "POST", CH, "{'messages': []}", 400, None),
            ("empty body", "POST", C, "", 400, None),
            ("not an object", "POST", C, "[1, 2]", 400, None),
            ("invalid utf-8", "POST", C, b'{"prompt": "\xff\xfe"}', 400, None),
            ("deep nesting", "POST", C, '{"prompt": ' + "[" * 200 + "]" * 200 + "}", 400, None),
            ("prompt missing", "POST", C, {"max_tokens": 1}, 400, "prompt"),
            ("prompt wrong type", "POST", C, {"prompt": 5}, 400, "prompt"),
            ("prompt null", "POST", C, {"prompt": None}, 400, "prompt"),
            ("prompt empty list", "POST", C, {"prompt": []}, 400, "prompt"),
            ("prompt id out of vocab", "POST", C, {"prompt": [1, 99999]}, 400, "prompt"),
            ("prompt negative id", "POST", C, {"prompt": [-1]}, 400, "prompt"),
            ("batched prompts, one empty", "POST", C, {"prompt": ["a", []]}, 400, "prompt"),
            ("batched prompts, too many", "POST", C, {"prompt": ["a"] * 65}, 400, "prompt"),
            ("max_tokens string", "POST", C, {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
            ("max_tokens float", "POST", C, {"prompt": "x", "max_tokens": 2.5}, 400, "max_tokens"),
            ("max_tokens negative", "POST", C, {"prompt": "x", "max_tokens": -5}, 400, "max_tokens"),
            ("max_tokens huge", "POST", C, {"prompt": "x", "max_tokens": 10**12}, 400, "max_tokens"),
            ("max_tokens huger", "POST", C, '{"prompt": "x", "max_tokens": 1e400}', 400, None),
            ("max_tokens past context", "POST", C, {"prompt": "x", "max_tokens": 5000}, 400, "prompt"),
            ("temperature negative", "POST", C, {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
            ("temperature string", "POST", C, {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
            ("top_p zero", "POST", C, {"prompt": "x", "top_p": 0}, 400, "top_p"),
            ("top_k too small", "POST", C, {"prompt": "x", "top_k": -2}, 400, "top_k"),
            ("n zero", "POST", C, {"prompt": "x", "n": 0}, 400, "n"),
            ("n huge", "POST", C, {"prompt": "x", "n": 100000}, 400, "n"),
            ("logprobs too many", "POST", C, {"prompt": "x", "logprobs": 50}, 400, "logprobs"),
            ("logprobs bool on completions", "POST", C, {"prompt": "x", "logprobs": True}, 400, "logprobs"),
            ("stream string", "POST", C, {"prompt": "x", "stream": "yes"}, 400, "stream"),
            ("stream_options without stream", "POST", C, {"prompt": "x", "stream_options": {"include_usage": True}},
             400, "stream_options"),
            ("stop wrong type", "POST", C, {"prompt": "x", "stop": 7}, 400, "stop"),
            ("stop empty string", "POST", C, {"prompt": "x", "stop": [""]}, 400, "stop"),
            ("seed string", "POST", C, {"prompt": "x", "seed": "abc"}, 400, "seed"),
            ("presence_penalty out of range", "POST", C, {"prompt": "x", "presence_penalty": 9}, 400,
             "presence_penalty"),
            ("unknown field", "POST", C, {"prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
            ("chat field on completions", "POST", C, {"prompt": "x", "messages": msgs}, 400, "messages"),
            ("unknown model", "POST", C, {"model": "gpt-17", "prompt": "x"}, 404, "model"),
            ("model wrong type", "POST", C, {"model": 3, "prompt": "x"}, 400, "model"),
            ("messages missing", "POST", CH, {"model": MODEL}, 400, "messages"),
            ("messages empty", "POST", CH, {"messages": []}, 400, "messages"),
            ("messages not a list", "POST", CH, {"messages": "hi"}, 400, "messages"),
            ("message not an object", "POST", CH, {"messages": ["hi"]}, 400, "messages.[0]"),
            ("message bad role", "POST", CH, {"messages": [{"role": "wizard", "content": "x"}]}, 400,
             "messages.[0].role"),
            ("message no content", "POST", CH, {"messages": [{"role": "user"}]}, 400, "messages.[0].content"),
            ("message unknown field", "POST", CH, {"messages": [{"role": "user", "content": "x", "mood": 1}]}, 400,
             "messages.[0].mood"),
            ("top_logprobs without logprobs", "POST", CH, {"messages": msgs, "top_logprobs": 2}, 400, "top_logprobs"),
            ("prompt field on chat", "POST", CH, {"messages": msgs, "prompt": "x"}, 400, "prompt"),
            ("unknown model chat", "POST", CH, {"model": "gpt-17", "messages": msgs}, 404, "model"),
            ("GET completions", "GET", C, None, 405, None),
            ("PUT chat", "PUT", CH, {"messages": msgs}, 405, None),
            ("DELETE completions", "DELETE", C, None, 405, None),
            ("POST models", "POST", "/v1/models", {}, 405, None),
            ("unknown path", "POST", "/v1/engines/x/completions", {"prompt": "x"}, 404, None),
            ("unknown path GET", "GET", "/nope", None, 404, None),
        ]
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)  # one keep-alive connection
        try:
            for name, method, path, body, status, param in cases:
                with self.subTest(name):
                    if isinstance(body, (dict, list)):
                        body = json.dumps(body)
                    headers = {"Content-Type": "application/json"} if body is not None else {}
                    conn.request(method, path, body=body, headers=headers)
                    r = conn.getresponse()
                    raw = r.read()
                    self.assertEqual(r.status, status, raw[:300])
                    err = self.assert_error_body(raw, r.status)
                    if param is not None:
                        self.assertEqual(err["param"], param, err)
                    if status == 404 and param == "model":
                        self.assertEqual(err["code"], "model_not_found")
                    if r.getheader("Connection", "").lower() == "close":
                        conn.close()
                        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        finally:
            conn.close()
        self.assert_good_request_works()

    def test_oversized_body_is_413(self):
        body = json.dumps({"prompt": "x" * (self.MAX_BODY_KB * 1024 + 10), "max_tokens": 1})
        try:
            status, _, raw = raw_request(self.port, "POST", "/v1/completions", body)
        except (BrokenPipeError, ConnectionResetError):
            # The server may answer and close before the client finished sending the body; read
            # the answer off a socket that does not mind.
            status, raw = self._send_and_read_raw(
                f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body.encode())
        self.assertEqual(status, 413, raw[:300])
        self.assert_error_body(raw, status)
        # Announced too large: refused from the header alone.
        status, raw = self._send_and_read_raw(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000000\r\n\r\n{")
        self.assertEqual(status, 413)
        self.assert_error_body(raw, status)
        self.assert_good_request_works()

    def _send_and_read_raw(self, data, timeout=10.0):
        """Sends `data` on a fresh socket, ignores send errors, returns (status, body bytes)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        try:
            try:
                s.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                pass
            reply = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                reply += chunk
        finally:
            s.close()
        head, _, body = reply.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 "), reply[:200])
        return int(head.split()[1]), body

    def test_garbage_http_is_400(self):
        status, body = self._send_and_read_raw(b"THIS IS NOT HTTP\r\n\r\n")
        self.assertEqual(status, 400)
        self.assert_error_body(body, status)
        status, body = self._send_and_read_raw(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: banana\r\n\r\n")
        self.assertEqual(status, 400)
        self.assert_good_request_works()

    def test_slowloris_is_cut_off(self):
        # Headers dribbled one line at a time, forever: the router must answer 408 (or close)
        # once the head has taken longer than --header-timeout, not wait for it.
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        t0 = time.monotonic()
        reply = b""
        try:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            s.settimeout(0.2)
            i = 0
            while time.monotonic() - t0 < self.HEADER_TIMEOUT_S + 5:
                try:
                    s.sendall(f"X-Slow-{i}: {i}\r\n".encode())
                except (BrokenPipeError, ConnectionResetError):
                    break
                i += 1
                try:
                    chunk = s.recv(4096)
                except socket.timeout:
                    continue
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                reply += chunk
            elapsed = time.monotonic() - t0
        finally:
            s.close()
        self.assertLess(elapsed, self.HEADER_TIMEOUT_S + 2.5, "the slow client was not cut off")
        self.assertGreaterEqual(elapsed, self.HEADER_TIMEOUT_S * 0.9, "cut off before the header timeout")
        if reply:
            head, _, body = reply.partition(b"\r\n\r\n")
            self.assertTrue(head.startswith(b"HTTP/1.1 408"), reply[:200])
            self.assert_error_body(body, 408)
        self.assert_good_request_works()

    def test_many_bad_requests_then_good_ones_in_parallel(self):
        # Bad and good requests interleaved from several threads: every good one succeeds.
        errors = []

        def worker(i):
            try:
                for j in range(5):
                    status, _, body = raw_request(self.port, "POST", "/v1/completions",
                                                  '{"prompt": ' if (i + j) % 2 else
                                                  {"prompt": PROMPT, "max_tokens": 3, "temperature": 0})
                    expected = 400 if (i + j) % 2 else 200
                    if status != expected:
                        errors.append((i, j, status, body[:200]))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append((i, repr(e)))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(raw_request(self.port, "GET", "/health")[0], 200)


# ---- routing, failures, backpressure, cancellation ------------------------------------------

LONG = {"prompt": PROMPT, "max_tokens": MAX_MODEL_LEN - 16, "temperature": 0, "ignore_eos": True, "stream": True}


class RoutingTest(ErrorBodyMixin, unittest.TestCase):
    """2 prefill + 2 decode nodes, a fresh cluster per test (tests kill nodes)."""

    def start(self, router_flags=(), decode_flags=()):
        self.cluster = cluster.Cluster(prefill=2, decode=2, router_flags=list(router_flags),
                                       decode_flags=list(decode_flags))
        self.addCleanup(self.cluster.stop)
        self.port = self.cluster.router.port
        return self.cluster

    def complete(self, prompt=PROMPT, max_tokens=8, **extra):
        status, _, body = raw_request(self.port, "POST", "/v1/completions",
                                      {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra})
        return status, body

    def running_node(self, nodes, timeout=SETTLE_S):
        """The one node of `nodes` with a running request."""
        def one():
            running = [n for n in nodes if n.health()["running"] > 0]
            return running[0] if len(running) == 1 else None
        return wait_for(one, timeout, "exactly one decode node running a request")

    def assert_nodes_idle(self, timeout=SETTLE_S):
        def idle():
            hs = [d.health() for d in self.cluster.decode if d.alive()]
            busy = [h for h in hs if h["running"] or h["waiting"] or h["kv_sequences"] or h["kv_bytes_used"]]
            return not busy
        wait_for(idle, timeout, "decode nodes idle with no KV held")
        for p in self.cluster.prefill:
            if p.alive():
                wait_for(lambda p=p: p.health()["queue_tokens"] == 0, timeout, f"{p.name} queue empty")

    def test_shortest_queue_wins(self):
        # The long stream must outlive 7 short requests; hack-tiny decodes ~1000 tokens in
        # well under a second, so its decode node takes 5 ms a step (~5 s in all).
        c = self.start(["--health-interval", "0.1"], decode_flags=["--enable-test-hooks", "--test-step-delay-ms", "5"])
        long = SseStream(self.port, "/v1/completions", LONG)
        self.addCleanup(long.close)
        self.assertEqual(long.status, 200)
        self.assertIsInstance(long.next_event(), dict)
        busy = self.running_node(c.decode)
        idle = next(d for d in c.decode if d is not busy)
        # Every request while the long one runs goes to the idle decode node: its KV arrives
        # there (kv_bytes_transferred grows) and the busy node receives none.
        before = {d.name: d.health()["kv_bytes_transferred"] for d in c.decode}
        for _ in range(3):
            status, body = self.complete(max_tokens=4)
            self.assertEqual(status, 200, body)
        after = {d.name: d.health()["kv_bytes_transferred"] for d in c.decode}
        self.assertEqual(busy.health()["running"], 1, "the long request ended before the check was over")
        self.assertGreater(after[idle.name], before[idle.name])
        self.assertEqual(after[busy.name], before[busy.name], "a request went to the busier decode node")
        # Prefill of the long request is long done: both prefill nodes take new prompts again
        # (its prefill node is not charged for the whole generation).
        time.sleep(0.5)  # a health poll (0.1 s) sees both prefill queues empty
        p_before = {p.name: p.health()["kv_bytes_transferred"] for p in c.prefill}
        for _ in range(4):
            status, body = self.complete(max_tokens=2)
            self.assertEqual(status, 200, body)
        p_after = {p.name: p.health()["kv_bytes_transferred"] for p in c.prefill}
        self.assertEqual(busy.health()["running"], 1, "the long request ended before the check was over")
        self.assertTrue(all(p_after[n] > p_before[n] for n in p_before), f"prefill bytes {p_before} -> {p_after}")
        # A second long stream lands on the idle node too.
        second = SseStream(self.port, "/v1/completions", LONG)
        self.addCleanup(second.close)
        self.assertIsInstance(second.next_event(), dict)
        self.assertEqual(idle.health()["running"], 1)
        self.assertEqual(busy.health()["running"], 1)
        long.close()
        second.close()
        self.assert_nodes_idle()

    def test_sigterm_drains_a_decode_node(self):
        # SIGTERM on the decode node running a long stream: the stream still ends normally
        # (every token, finish_reason length), new requests go to the other node at once, and
        # the drained node exits 0 once its stream is done.
        c = self.start(["--health-interval", "0.1"], decode_flags=["--enable-test-hooks", "--test-step-delay-ms", "3"])
        body = dict(LONG, max_tokens=300, stream_options={"include_usage": True})
        long = SseStream(self.port, "/v1/completions", body)
        self.addCleanup(long.close)
        self.assertEqual(long.status, 200)
        first = long.next_event()
        self.assertIsInstance(first, dict)
        busy = self.running_node(c.decode)
        busy.terminate()
        wait_for(lambda: busy.health()["draining"], SETTLE_S, "the node to say it is draining")
        ref = hack_run(PROMPT, max_tokens=8)["text"]
        for i in range(4):
            status, out = self.complete()
            self.assertEqual(status, 200, f"request {i} during the drain: {out[:300]!r}")
            self.assertEqual(json.loads(out)["choices"][0]["text"], ref)
        events = [first] + long.read_all()
        self.assertTrue(long.done)
        text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
        finish = [e["choices"][0]["finish_reason"] for e in events if e.get("choices") and e["choices"][0]["finish_reason"]]
        self.assertEqual(finish, ["length"])
        self.assertTrue(text)
        usage = [e["usage"] for e in events if e.get("usage")]
        self.assertEqual(usage[-1]["completion_tokens"], 300)
        self.assertEqual(busy.proc.wait(30), 0)

    def test_sigterm_on_an_idle_prefill_node_exits_at_once_and_routing_goes_on(self):
        c = self.start(["--health-interval", "0.1"])
        c.prefill[0].terminate()
        self.assertEqual(c.prefill[0].proc.wait(10), 0)
        ref = hack_run(PROMPT, max_tokens=8)["text"]
        for i in range(4):
            status, out = self.complete()
            self.assertEqual(status, 200, f"request {i}: {out[:300]!r}")
            self.assertEqual(json.loads(out)["choices"][0]["text"], ref)

    def test_killed_decode_node_is_avoided(self):
        c = self.start(["--health-interval", "0.2"])
        ref = hack_run(PROMPT, max_tokens=8)["text"]
        c.decode[0].kill()
        # At once (the router may not have noticed yet: retries cover it) and after it has.
        for i in range(8):
            status, body = self.complete()
            self.assertEqual(status, 200, f"request {i}: {body[:300]!r}")
            self.assertEqual(json.loads(body)["choices"][0]["text"], ref)
        wait_for(lambda: json.loads(raw_request(self.port, "GET", "/health")[2])["decode_nodes_healthy"] == 1,
                 SETTLE_S, "the router to drop the killed decode node")
        for i in range(4):
            status, body = self.complete(stream=False)
            self.assertEqual(status, 200, f"request {i}: {body[:300]!r}")
        # Streamed requests too.
        s = SseStream(self.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                     "stream": True})
        self.assertEqual("".join(e["choices"][0]["text"] for e in s.read_all()), ref)
        self.assertTrue(s.done)
        s.close()

    def test_request_is_retried_on_other_nodes(self):
        # Health polls effectively off: the router believes the killed node healthy and sends
        # requests to it; each must fail over (before any token) and complete on the others.
        ref = hack_run(PROMPT, max_tokens=8)["text"]
        for pool, index in (("decode", 1), ("prefill", 0)):
            with self.subTest(victim=f"{pool}{index}"):
                c = self.start(["--health-interval", "1000"])
                getattr(c, pool)[index].kill()
                for i in range(4):  # shortest queue, then round robin: at least one on the dead node
                    status, body = self.complete()
                    self.assertEqual(status, 200, f"request {i}: {body[:300]!r}")
                    self.assertEqual(json.loads(body)["choices"][0]["text"], ref)
                # Streamed: the retry happens before the first token, so the client sees one clean stream.
                for i in range(2):
                    s = SseStream(self.port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                                 "stream": True})
                    self.assertEqual("".join(e["choices"][0]["text"] for e in s.read_all()), ref)
                    self.assertTrue(s.done)
                    s.close()
                self.assertIn("failed before any token", c.router.log_text(), "no request was retried")
                c.stop()

    def test_backpressure_429_with_retry_after(self):
        c = self.start(["--max-decode-queue-tokens", "64", "--health-interval", "0.2"])
        streams = []
        for _ in range(2):  # one long request per decode node
            s = SseStream(self.port, "/v1/completions", LONG)
            self.addCleanup(s.close)
            self.assertEqual(s.status, 200)
            self.assertIsInstance(s.next_event(), dict)
            streams.append(s)
        self.assertEqual(sorted(d.health()["running"] for d in c.decode), [1, 1])
        status, headers, body = raw_request(self.port, "POST", "/v1/completions",
                                            {"prompt": PROMPT, "max_tokens": 4})
        self.assertEqual(status, 429, body)
        self.assertIn("retry-after", headers)
        self.assertGreater(int(headers["retry-after"]), 0)
        err = self.assert_error_body(body, status)
        self.assertEqual(err["type"], "rate_limit_error")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0)
        with self.assertRaises(openai.RateLimitError):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2)
        for s in streams:
            s.close()
        self.assert_nodes_idle()
        # Load gone: served again (after the next health poll refreshes the nodes' reports).
        wait_for(lambda: self.complete(max_tokens=2)[0] == 200, SETTLE_S, "a request to succeed after the load")

    def test_decode_node_dying_mid_stream_ends_the_stream_with_an_error(self):
        # Migration off (chaos_test.py covers streams that continue elsewhere): the error path.
        c = self.start(["--health-interval", "0.2", "--max-migrations", "0"])
        s = SseStream(self.port, "/v1/completions", LONG)
        self.addCleanup(s.close)
        for _ in range(3):
            self.assertIsInstance(s.next_event(), dict)
        self.running_node(c.decode).kill()
        t0 = time.monotonic()
        events = s.read_all()  # must end, not hang
        self.assertLess(time.monotonic() - t0, SETTLE_S)
        self.assertTrue(events, "no event after the node died")
        self.assertIn("error", events[-1], events[-1])
        self.assert_error_body(json.dumps(events[-1]))
        self.assertTrue(s.done, "the stream did not end with [DONE]")
        status, body = self.complete()
        self.assertEqual(status, 200, body)

    def test_no_healthy_decode_node_is_503(self):
        c = self.start(["--health-interval", "0.2"])
        for d in c.decode:
            d.kill()
        wait_for(lambda: raw_request(self.port, "GET", "/health")[0] == 503, SETTLE_S, "router /health 503")
        status, _, body = raw_request(self.port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
        self.assertEqual(status, 503, body)
        self.assertEqual(self.assert_error_body(body, status)["type"], "service_unavailable")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0)
        with self.assertRaises(openai.InternalServerError) as cm:
            client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        self.assertEqual(cm.exception.status_code, 503)

    def test_client_disconnect_cancels_on_the_nodes(self):
        c = self.start()
        before = {d.name: d.metrics().get("hack:generation_tokens_total", 0) for d in c.decode}
        for endpoint, body in (("/v1/completions", LONG),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Speak."}],
                                                         "max_tokens": LONG["max_tokens"], "temperature": 0,
                                                         "ignore_eos": True, "stream": True, "n": 2})):
            with self.subTest(endpoint=endpoint):
                s = SseStream(self.port, endpoint, body)
                self.addCleanup(s.close)
                for _ in range(5):
                    self.assertIsInstance(s.next_event(), dict)
                self.assertGreaterEqual(sum(d.health()["running"] for d in c.decode), 1)
                s.close()
                self.assert_nodes_idle()
        # Non-stream: the client gives up waiting for the whole body.
        with self.subTest(endpoint="non-stream"):
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            conn.request("POST", "/v1/completions", body=json.dumps({**LONG, "stream": False}),
                         headers={"Content-Type": "application/json"})
            wait_for(lambda: sum(d.health()["running"] for d in c.decode) == 1, SETTLE_S, "the request to run")
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
            self.assert_nodes_idle()
        # The nodes stopped generating early: far fewer tokens than the requests asked for
        # (4 sequences of max_tokens; a full one takes ~1.5 s, a cancel a few ms).
        generated = sum(d.metrics().get("hack:generation_tokens_total", 0) - before[d.name] for d in c.decode)
        self.assertLess(generated, LONG["max_tokens"], "the nodes kept generating for a closed client")
        # The router lets go of a request after its nodes have: its gauges drain a moment later.
        def router_idle():
            m = c.router.metrics()
            return m.get("hack:num_requests_running") == 0 and m.get("hack:num_requests_waiting") == 0
        wait_for(router_idle, SETTLE_S, "the router's running and waiting gauges back to 0")
        status, body = self.complete(max_tokens=3)
        self.assertEqual(status, 200, body)


if __name__ == "__main__":
    unittest.main()
