"""Tool calls and prompt logprobs end to end on SmolLM2-135M-Instruct, with the official
`openai` client against a local cluster (1 prefill + 1 decode node, cluster.py).

- A tool-calling conversation round-trips: SmolLM2's template knows no tools, so the router
  renders them (and the history's calls and results) in Hermes form; the conversation holds
  three earlier calls of the same tool, and greedy decoding makes the 135M model repeat the
  <tool_call> pattern (deterministic: greedy ids on the CPU backend are bit-reproducible).
  The call is parsed (whole and streamed, the same), its result is sent back as a `tool`
  message, and a final text answer comes.
- tool_choice "required" / a named function: grammar-constrained decoding forces valid calls
  (arguments validated with `jsonschema`) where the model would have answered in text.
- echo + logprobs on /v1/completions equal hack-run's teacher-forced prompt logprobs.

    cd tests/e2e && HACK_BUILD_DIR=../../build python3 -m unittest -v tools_api_test
"""

import json
import os
import subprocess
import unittest

import jsonschema

try:
    import openai
except ImportError as e:  # a failure, not a skip: CI must have it
    raise ImportError("the `openai` Python package is missing: pip install -r scripts/requirements-test.txt") from e

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
os.environ.setdefault("HACK_MODEL", os.path.join(SOURCE_DIR, "models", "smollm2-135m-instruct"))
import cluster  # noqa: E402  (reads HACK_MODEL)

MODEL = os.path.basename(cluster.MODEL_DIR.rstrip("/"))

# |cluster − hack-run| per prompt logprob. Both run the same CPU kernels on one thread over
# the same prompt in the same 512-token prefill chunks, and the prefill node's all-position
# logits come from the same forward as its KV: the values were bit-equal when this was written
# (worst 0.0). 1e-4 leaves room for a change that reorders a sum, not for a wrong position.
LOGPROB_ATOL = 1e-4

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
                       "required": ["zone"]},
    },
}


def hack_run_prompt_logprobs(prompt, top):
    argv = [cluster.binary("hack-run"), "--model", cluster.MODEL_DIR, "--kv", "hack", "--threads", "1",
            "--temperature", "0", "--max-tokens", "1", "--json", "--prompt", prompt, "--prompt-logprobs", str(top)]
    out = subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return json.loads(out.stdout)


def hack_run_greedy_ids(prompt_ids, max_tokens):
    argv = [cluster.binary("hack-run"), "--model", cluster.MODEL_DIR, "--kv", "hack", "--threads", "1",
            "--temperature", "0", "--max-tokens", str(max_tokens), "--json",
            "--prompt-ids", ",".join(map(str, prompt_ids))]
    return json.loads(subprocess.run(argv, check=True, capture_output=True, timeout=60).stdout)["ids"]


def conversation(city):
    """Three questions answered by a get_weather call (no results: the 135M model then
    answers a fourth the same way rather than imitating a result), then one for `city`."""
    messages = [{"role": "system", "content": "You are a helpful assistant. Always call a tool to answer."}]
    for i, known in enumerate(("Paris", "Berlin", "Madrid")):
        messages += [
            {"role": "user", "content": f"What is the weather in {known}?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps({"city": known})}}]},
        ]
    messages.append({"role": "user", "content": f"What is the weather in {city}?"})
    return messages


class ToolsApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.isfile(os.path.join(cluster.MODEL_DIR, "model.safetensors")):
            raise RuntimeError(f"{cluster.MODEL_DIR} is missing: run scripts/fetch-models.sh")
        cls.cluster = cluster.Cluster(prefill=1, decode=1)
        cls.client = openai.OpenAI(base_url=f"http://{cls.cluster.router.address}/v1", api_key="none",
                                   max_retries=0, timeout=180)  # 2 shared CI cores

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def test_tool_call_round_trip(self):
        messages = conversation("London")
        r = self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                temperature=0, max_tokens=40)
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls", choice.message)
        calls = choice.message.tool_calls
        self.assertEqual(len(calls), 1, choice.message)
        self.assertTrue(calls[0].id.startswith("call_"))
        self.assertEqual(calls[0].type, "function")
        self.assertEqual(calls[0].function.name, "get_weather")
        args = json.loads(calls[0].function.arguments)
        self.assertIn("city", args)
        self.assertNotIn("<tool_call>", choice.message.content or "")

        # The same request streamed: deltas assemble to the same call (greedy: same tokens).
        stream = self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                     temperature=0, max_tokens=40, stream=True)
        content, streamed, finish = "", {}, None
        for chunk in stream:
            c = chunk.choices[0]
            if c.delta.content:
                content += c.delta.content
            for d in c.delta.tool_calls or []:
                if d.index not in streamed:
                    self.assertTrue(d.id and d.function.name, "a call's first delta names it")
                    streamed[d.index] = {"id": d.id, "name": d.function.name, "arguments": d.function.arguments or ""}
                else:
                    self.assertIsNone(d.id)
                    streamed[d.index]["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(content.strip(), (choice.message.content or "").strip())
        self.assertEqual([(s["name"], s["arguments"]) for s in streamed.values()],
                         [(c.function.name, c.function.arguments) for c in calls])

        # The result goes back as a tool message; the model answers in text.
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0].id, "type": "function",
             "function": {"name": calls[0].function.name, "arguments": calls[0].function.arguments}}]})
        messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "Rainy, 12 C"})
        final = self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                    temperature=0, max_tokens=30)
        self.assertFalse(final.choices[0].message.tool_calls, final.choices[0].message)
        self.assertTrue(final.choices[0].message.content.strip())
        self.assertIn(final.choices[0].finish_reason, ("stop", "length"))

    def test_tool_choice(self):
        messages = conversation("London")
        # none: tools rendered, nothing parsed — the call stays text.
        r = self.client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                tool_choice="none", temperature=0, max_tokens=40)
        self.assertFalse(r.choices[0].message.tool_calls)
        self.assertIn("get_weather", r.choices[0].message.content)
        # required / a named function: the grammar forces calls even where the model would
        # answer in text (a question without a tool in sight), at temperature 1, several seeds.
        plain = [{"role": "user", "content": "Write one sentence about cats."}]
        finished = 0
        for seed in range(3):
            r = self.client.chat.completions.create(model=MODEL, messages=plain, tools=[WEATHER_TOOL, TIME_TOOL],
                                                    tool_choice="required", parallel_tool_calls=False,
                                                    temperature=1, seed=seed, max_tokens=80)
            c = r.choices[0]
            if c.finish_reason == "length":
                continue  # a long city name: cut off, nothing to check
            finished += 1
            self.assertEqual(c.finish_reason, "tool_calls", c)
            self.assertEqual(len(c.message.tool_calls), 1)
            call = c.message.tool_calls[0]
            self.assertIn(call.function.name, ("get_weather", "get_time"))
            args = json.loads(call.function.arguments)
            jsonschema.validate(args, {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[call.function.name]
                                ["function"]["parameters"])
        self.assertGreaterEqual(finished, 2)
        r = self.client.chat.completions.create(model=MODEL, messages=plain, tools=[WEATHER_TOOL, TIME_TOOL],
                                                tool_choice={"type": "function", "function": {"name": "get_time"}},
                                                temperature=0, max_tokens=80)
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "stop")  # as OpenAI reports a named tool_choice
        self.assertEqual([t.function.name for t in c.message.tool_calls], ["get_time"])
        jsonschema.validate(json.loads(c.message.tool_calls[0].function.arguments), TIME_TOOL["function"]["parameters"])
        # Refused: an unknown function, and a forced call together with a response_format.
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model=MODEL, messages=plain, tools=[WEATHER_TOOL],
                                                tool_choice={"type": "function", "function": {"name": "nope"}})
        self.assertIn("no function named 'nope'", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model=MODEL, messages=plain, tools=[WEATHER_TOOL], tool_choice="required",
                                                response_format={"type": "json_object"})
        self.assertIn("only one constraint", str(e.exception))

    def test_echo_logprobs_equal_hack_run(self):
        prompt = "The capital of France is Paris, and the capital of Italy is"
        top = 2
        ref = hack_run_prompt_logprobs(prompt, top)
        r = self.client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=top, max_tokens=2,
                                           temperature=0)
        lp = r.choices[0].logprobs
        n = len(ref["prompt_ids"])
        self.assertEqual(len(lp.tokens), n + 2)
        self.assertIsNone(lp.token_logprobs[0])
        self.assertIsNone(lp.top_logprobs[0])
        self.assertTrue(r.choices[0].text.startswith(prompt))
        worst = 0.0
        for i in range(1, n):
            want = ref["prompt_logprobs"][i]
            got = lp.token_logprobs[i]
            worst = max(worst, abs(got - want["logprob"]))
            self.assertEqual(len(lp.top_logprobs[i]), top)
            got_top = sorted(lp.top_logprobs[i].values(), reverse=True)
            for g, w in zip(got_top, want["top"]):
                self.assertLessEqual(abs(g - w["logprob"]), LOGPROB_ATOL, f"position {i}")
        self.assertLessEqual(worst, LOGPROB_ATOL, f"largest |cluster - hack-run| over {n - 1} prompt logprobs")

        # Streamed: the echoed text, then the prompt's logprobs, then the generated tokens'.
        tokens, logprobs = [], []
        for chunk in self.client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=top,
                                                    max_tokens=2, temperature=0, stream=True):
            if chunk.choices[0].logprobs:
                tokens += chunk.choices[0].logprobs.tokens
                logprobs += chunk.choices[0].logprobs.token_logprobs
        self.assertEqual(tokens, lp.tokens)
        self.assertEqual(logprobs, lp.token_logprobs)

    def test_prompt_as_token_ids_and_stop_token_ids(self):
        ids = hack_run_prompt_logprobs("Hello, my name is", 0)["prompt_ids"]
        r = self.client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
        by_text = self.client.completions.create(model=MODEL, prompt="Hello, my name is", max_tokens=8, temperature=0)
        self.assertEqual(r.choices[0].text, by_text.choices[0].text)
        # stop_token_ids (vLLM's extra): generation ends at the first token of the greedy reply.
        first_id = hack_run_greedy_ids(ids, 1)[0]
        stop = self.client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0,
                                              extra_body={"stop_token_ids": [first_id]})
        self.assertEqual(stop.choices[0].finish_reason, "stop")
        self.assertEqual(stop.usage.completion_tokens, 1)


if __name__ == "__main__":
    unittest.main()
