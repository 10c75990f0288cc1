"""MPCache page selection with real processes (tests/e2e/cluster.py, hack-tiny): a cluster whose
nodes run --kv-select-* answers exactly as hack-run with the same flags (ids and logprobs), for
both page scores; the selection really changes the computation; the prefill and decode nodes
report one KV format whatever their selection (selection never changes KV bytes); a bad
selection flag stops a node with a message naming it.
"""

import json
import subprocess
import unittest
import urllib.request

import cluster

# ~400 tokens: 25 pages of 16 tokens, so a 10 % budget leaves most pages out.
PROMPT = " ".join(["In the beginning God created the heaven and the earth. And the earth was without form, and void;"
                   " and darkness was upon the face of the deep."] * 12)
BLOCK = ["--hack-block", "16"]
# Selection's floor off: the default one keeps every page of a prompt this short.
NO_FLOOR = ["--kv-select-min-tokens", "0", "--kv-select-min-context", "0"]


def complete(router, max_tokens):
    body = {"model": "hack-tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1}
    req = urllib.request.Request(f"http://127.0.0.1:{router.port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def hack_run(extra, max_tokens, kv="hack"):
    argv = [cluster.binary("hack-run"), "--model", cluster.MODEL_DIR, "--threads", "1", "--temperature", "0",
            "--max-tokens", str(max_tokens), "--logprobs", "1", "--json", "--prompt", PROMPT, "--kv", kv, *BLOCK,
            *extra]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return json.loads(r.stdout)


class SelectClusterTest(unittest.TestCase):
    def test_cluster_equals_hack_run(self):
        n = 12
        plain = hack_run([], n)
        for bound in ("quest", "mpcache"):
            select = ["--kv-select-ratio", "0.1", "--kv-select-bound", bound, "--kv-select-dense", "1", *NO_FLOOR]
            with self.subTest(bound=bound):
                expected = hack_run(select, n)
                # The selection changed the computation (else this would not show it is applied).
                diff = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(expected["logprobs"], plain["logprobs"]))
                self.assertGreater(diff, 1e-3)
                with cluster.Cluster(node_flags=[*BLOCK, *select]) as c:
                    got = complete(c.router, n)
                    formats = {d.health()["kv_format"] for d in c.prefill + c.decode}
                    self.assertEqual(len(formats), 1)
                    self.assertNotIn("select", formats.pop())
                lp = got["choices"][0]["logprobs"]
                self.assertEqual(got["choices"][0]["text"], expected["text"])
                self.assertEqual(len(lp["token_logprobs"]), n)
                for i, (val, ref) in enumerate(zip(lp["token_logprobs"], expected["logprobs"])):
                    self.assertAlmostEqual(val, ref["logprob"], delta=1e-6, msg=f"token {i}")

    def test_decode_node_selecting_pairs_with_plain_prefill_node(self):
        # Selection only acts in decode: a prefill node without it serves a selecting decode node,
        # and the answer is hack-run's with selection on.
        n = 8
        select = ["--kv-select-ratio", "0.1", "--kv-select-dense", "1", *NO_FLOOR]
        expected = hack_run(select, n)
        with cluster.Cluster(prefill_flags=BLOCK, decode_flags=[*BLOCK, *select]) as c:
            got = complete(c.router, n)
        for val, ref in zip(got["choices"][0]["logprobs"]["token_logprobs"], expected["logprobs"]):
            self.assertAlmostEqual(val, ref["logprob"], delta=1e-6)

    def test_bad_flag_is_refused(self):
        argv = [cluster.binary("hack-run"), "--model", cluster.MODEL_DIR, "--prompt", "hi", "--kv-select-ratio", "2"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--kv-select-ratio", r.stderr)


if __name__ == "__main__":
    unittest.main()
