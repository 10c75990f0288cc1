"""Migration of interrupted streams and a short chaos run (issue 17), with real processes:
2 prefill + 2 decode nodes on hack-tiny and the official `openai` client.

Tolerance of a continued stream: the continuation's KV of the tokens generated before the
failure is recomputed by one prefill pass instead of the token-by-token decode steps that
first produced it. With --kv fp both paths compute the same K/V per position (same weights,
fp32 accumulation, rows independent of the batch), so greedy and seeded streams are expected
to continue exactly: these tests require equal text (seeded streams with top_p, see
test_killed_decode_seeded_fp_same_text for why the untruncated tail is excluded). With --kv hack the prompt+generated
blocks are quantized as a whole by prefill, whereas the first decode node kept its open
block in bf16 and quantized blocks as they closed, so later logits may differ in rounding and
a near-tie argmax can flip: there the test requires continuity only (every token relayed once:
text == the concatenated logprob tokens, completion_tokens == max_tokens), not equality.
"""

import json
import os
import signal
import sys
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "chaos"))

import openai  # noqa: E402

import chaos  # noqa: E402
import cluster  # noqa: E402

MODEL = os.path.basename(os.path.normpath(cluster.MODEL_DIR))
ROUTER = ["--health-interval", "0.2", "--stall-timeout-s", "1.5", "--max-migrations", "2"]
DECODE = ["--enable-test-hooks", "--test-step-delay-ms", "25"]
MAX_TOKENS = 80


def wait_for(pred, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class MigrationTest(unittest.TestCase):

    def start(self, kv):
        c = cluster.Cluster(prefill=2, decode=2, kv=kv, router_flags=ROUTER, decode_flags=DECODE)
        self.addCleanup(c.stop)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{c.router.port}/v1", api_key="none", max_retries=0,
                               timeout=60)
        return c, client

    def body(self, **kw):
        return {"model": MODEL, "prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True},
                "temperature": 0, "logprobs": 0, **kw}

    def stream(self, client, body, fault=None, after_chunks=15):
        """(text, logprob-token text, finish_reason, completion_tokens); `fault(text_so_far)` runs
        once after `after_chunks` chunks."""
        text, tokens, finish, usage = "", "", None, None
        n = 0
        for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **body):
            if chunk.choices:
                ch = chunk.choices[0]
                text += ch.text
                if ch.logprobs and ch.logprobs.tokens:
                    tokens += "".join(ch.logprobs.tokens)
                finish = ch.finish_reason or finish
                n += 1
                if fault and n == after_chunks:
                    fault(text)
                    fault = None
            if chunk.usage:
                usage = chunk.usage
        self.assertIsNone(fault, "the stream ended before the fault was injected")
        return text, tokens, finish, usage.completion_tokens

    def running_decode(self, c):
        for d in c.decode:
            if d.health()["running"] > 0:
                return d
        self.fail("no decode node is running the request")

    def migrations(self, c):
        m = c.router.metrics()
        return {k: v for k, v in m.items() if k.startswith("hack:request_migrations_total")}

    def assert_idle(self, c):
        busy = chaos.nodes_idle(c, 15)
        self.assertEqual(busy, {}, "nodes still hold KV or requests")

    def check_kill(self, kv, exact, **sampling):
        c, client = self.start(kv)
        body = self.body(**sampling)
        ref_text, ref_tokens, ref_finish, ref_n = self.stream(client, body)
        self.assertEqual(ref_n, MAX_TOKENS)
        killed = []
        text, tokens, finish, n = self.stream(client, body, fault=lambda so_far: killed.append(
            (so_far, self.running_decode(c).kill())))
        self.assertTrue(killed)
        before = killed[0][0]
        self.assertTrue(text.startswith(before), "text sent before the kill changed")
        self.assertEqual((finish, n), ("length", MAX_TOKENS), "finish reason / usage differ from an uninterrupted run")
        self.assertEqual(text, tokens, "text is not the concatenation of the tokens relayed (duplicated or lost text)")
        if exact:
            self.assertEqual(text, ref_text, f"migrated stream differs from the uninterrupted run (seed {sampling})")
            self.assertEqual(tokens, ref_tokens)
        self.assertGreaterEqual(sum(self.migrations(c).values()), 1, "the request was not counted as migrated")
        self.assert_idle(c)

    def test_killed_decode_greedy_fp_same_text(self):
        self.check_kill("fp", exact=True)

    def test_killed_decode_seeded_fp_same_text(self):
        # The draw for step i is u(seed, i) on both node pairs, but the logits after a migration come
        # from recomputed KV (logprobs differ by ~1e-5 here): a draw flips when u falls within that
        # of a CDF boundary. In the untruncated tail, tokens of p ~ 1e-5 sit that close (seen: an
        # untruncated T=0.9 stream diverged on a p = 7e-5 tail token); top_p keeps the boundaries
        # far apart, so the flip chance per token is ~1e-4 and the stream must continue exactly.
        self.check_kill("fp", exact=True, temperature=0.8, top_p=0.9, seed=1234)

    def test_killed_decode_hack_kv_continues(self):
        self.check_kill("hack", exact=False)

    def test_stopped_decode_migrates_after_stall_timeout(self):
        c, client = self.start("fp")
        body = self.body()
        ref_text, _, _, _ = self.stream(client, body)
        stopped = []

        def stop(_):
            d = self.running_decode(c)
            d.proc.send_signal(signal.SIGSTOP)
            stopped.append((d, time.monotonic()))

        t0 = time.monotonic()
        text, tokens, finish, n = self.stream(client, body, fault=stop)
        d, t_stop = stopped[0]
        try:
            self.assertEqual(text, ref_text)
            self.assertEqual((finish, n), ("length", MAX_TOKENS))
            self.assertEqual(self.migrations(c).get('hack:request_migrations_total{cause="stalled"}', 0), 1,
                             self.migrations(c))
        finally:
            d.proc.send_signal(signal.SIGCONT)
        # The resumed node sees the router's closed connection and frees the request.
        self.assert_idle(c)
        self.assertLess(time.monotonic() - t0, 60)

    def test_migrations_are_bounded(self):
        c = cluster.Cluster(prefill=2, decode=2, kv="fp", router_flags=[*ROUTER[:4], "--max-migrations", "0"],
                            decode_flags=DECODE)
        self.addCleanup(c.stop)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{c.router.port}/v1", api_key="none", max_retries=0)
        with self.assertRaises(openai.APIError) as cm:
            self.stream(client, self.body(), fault=lambda _: self.running_decode(c).kill())
        self.assertIn("0 migrations", str(cm.exception))


class DecodeRestartTest(unittest.TestCase):
    """A decode node restarted in place (same HTTP and UCX ports) while a prefill node still
    holds an endpoint to the old process: the next requests all succeed, first time. The
    prefill node's UCX progress thread is held (test hook) across the restart, as when it is
    descheduled, so the old connection's end is still unread when the first request's KV goes
    out on the stale endpoint. That send fails; the prefill node closes the endpoint and sends
    the job again on a fresh one (--send-retries) — the router must not need a retry of its
    own (hack:request_retries_total stays 0), and the restarted node reports ready only after
    its UCX listener passed its self-probe."""

    def test_decode_restarted_on_its_port_gets_the_next_requests(self):
        # The restarted node's listener binds the port the old connection still holds.
        os.environ.setdefault("UCX_TCP_CM_REUSEADDR", "y")
        # --kv-connect listener: by host:port, as to a decode node on another host. On one host the
        # prefill node connects by the decode node's worker address, which a restarted process
        # changes, so it dials the new process and never meets a stale endpoint.
        c = cluster.Cluster(prefill=1, decode=1, kv="fp", router_flags=["--health-interval", "0.2"],
                            prefill_flags=["--enable-test-hooks", "--kv-connect", "listener"])
        self.addCleanup(c.stop)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{c.router.port}/v1", api_key="none", max_retries=0,
                               timeout=60)
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
        ref = client.completions.create(**body).choices[0].text  # the prefill node now holds an endpoint to decode0

        req = urllib.request.Request(f"http://127.0.0.1:{c.prefill[0].port}/internal/test/hold-ucx",
                                     data=json.dumps({"seconds": 8}).encode(),
                                     headers={"X-Hack-Secret": c.secret})
        t_hold = time.monotonic()
        urllib.request.urlopen(req, timeout=10).read()
        chaos.Chaos(c, None, lambda m: None).restart("decode", 0)  # SIGKILL, then the same ports
        wait_for(lambda: c.decode[0].health()["ready"], 20, "the restarted decode node to be ready")
        wait_for(lambda: json.loads(cluster.http_get(c.router.port, "/health")[1])["decode_nodes_healthy"] == 1, 20,
                 "the router to route to the restarted decode node")
        self.assertLess(time.monotonic() - t_hold, 8, "the restart took longer than the hold; nothing was tested")

        texts = [client.completions.create(**body).choices[0].text for _ in range(5)]
        self.assertEqual(texts, [ref] * 5)
        retries = {k: v for k, v in c.router.metrics().items() if k.startswith("hack:request_retries_total")}
        self.assertEqual(sum(retries.values()), 0, f"the router had to retry: {retries}")
        self.assertGreaterEqual(c.prefill[0].metrics().get("hack:kv_send_retries_total", 0), 1,
                                "the first request never met the stale endpoint")
        self.assertIn("closing decode endpoint", c.prefill[0].log_text())


    def test_restart_on_a_new_ucx_port_is_reached_through_the_accepted_event(self):
        """The router learns decode UCX addresses from its health polls, which here are 10
        minutes apart; a decode node restarted on its HTTP port with a new UCX port must still
        get its KV at once, because its "accepted" event names the listener of the process that
        admitted the request."""
        c = cluster.Cluster(prefill=1, decode=1, kv="fp", router=False)
        self.addCleanup(c.stop)
        wait_for(lambda: c.decode[0].health()["ready"], 20, "decode0 to be ready")
        router = c.add_router(["--health-interval", "600"])  # one poll, at start: decode0 is ready
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{router.port}/v1", api_key="none", max_retries=0,
                               timeout=60)
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
        ref = client.completions.create(**body).choices[0].text

        old = c.decode[0]
        old.kill()
        argv = list(old.argv)
        argv[argv.index("--port") + 1] = str(old.port)  # same HTTP port; --ucx-port stays 0: a new one
        new = cluster.Daemon("decode0-new-ucx", argv, c.log_dir, c.env).wait_ready()
        c.decode[0] = new
        self.assertNotEqual(new.ucx_address, old.ucx_address)
        wait_for(lambda: new.health()["ready"], 20, "the restarted decode node to be ready")

        self.assertEqual(client.completions.create(**body).choices[0].text, ref)
        retries = {k: v for k, v in router.metrics().items() if k.startswith("hack:request_retries_total")}
        self.assertEqual(sum(retries.values()), 0, f"the router had to retry: {retries}")


class ChaosTest(unittest.TestCase):

    def test_short_chaos_run(self):
        report = chaos.run_chaos(seconds=40, rate_per_s=2.0, seed=int(os.environ.get("HACK_CHAOS_SEED", "1")),
                                 chaos_interval_s=(0.5, 1.5), deadline_s=60, log=lambda m: sys.stderr.write(m + "\n"))
        sys.stderr.write(json.dumps(report, indent=2) + "\n")
        self.assertEqual(report["hung"], 0, report)
        self.assertEqual(report["failures_by_cause"], {}, report)
        self.assertEqual(report["nodes_not_idle"], {}, report)
        self.assertGreater(report["outcomes"].get("ok", 0), 10, report)
        self.assertEqual(report["restart_failures"], 0, report)
        self.assertGreaterEqual(sum(v for k, v in report["chaos_actions"].items() if k != "restarts"), 4, report)


if __name__ == "__main__":
    unittest.main()
