"""MPCache static eviction with real processes (tests/e2e/cluster.py, hack-tiny): a cluster whose
prefill node runs --kv-keep-ratio answers exactly as hack-run with the same flags (ids and
logprobs), for --kv hack and --kv fp, with a decode node that has no keep flags of its own (it
learns the position from the prompt's length); the eviction really changes the computation; the
KV bytes the prefill node ships fall with the ratio; a bad keep flag stops hack-run with a
message naming it.
"""

import subprocess
import unittest

import cluster
import vault_test
# The ~400-token prompt (16-token pages) and helpers the selection test drives hack-tiny with.
from select_test import BLOCK, complete, hack_run


class EvictClusterTest(unittest.TestCase):
    def test_cluster_equals_hack_run(self):
        n = 12
        keep = ["--kv-keep-ratio", "0.3", "--kv-keep-recent", "16"]
        for kv in ("hack", "fp"):
            with self.subTest(kv=kv):
                plain = hack_run([], n, kv)
                expected = hack_run(keep, n, kv)
                # The eviction changed the computation (else this would not show it is applied).
                diff = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(expected["logprobs"], plain["logprobs"]))
                self.assertGreater(diff, 1e-3)
                with cluster.Cluster(kv=kv, node_flags=BLOCK, prefill_flags=keep) as c:
                    got = complete(c.router, n)
                    formats = {d.health()["kv_format"] for d in c.prefill + c.decode}
                    self.assertEqual(len(formats), 1)
                lp = got["choices"][0]["logprobs"]
                self.assertEqual(got["choices"][0]["text"], expected["text"])
                self.assertEqual(len(lp["token_logprobs"]), n)
                for i, (val, ref) in enumerate(zip(lp["token_logprobs"], expected["logprobs"])):
                    self.assertAlmostEqual(val, ref["logprob"], delta=1e-6, msg=f"token {i}")

    def test_bytes_shipped_fall_with_the_ratio(self):
        shipped = {}
        for ratio in ("0", "0.5", "0.2"):
            with cluster.Cluster(node_flags=[*BLOCK, "--kv-keep-ratio", ratio]) as c:
                complete(c.router, 2)
                shipped[ratio] = c.prefill[0].health()["kv_bytes_transferred"]
        print(f"KV bytes shipped by the prefill node per --kv-keep-ratio: {shipped}")
        self.assertGreater(shipped["0"], 0)
        self.assertLess(shipped["0.5"], 0.7 * shipped["0"])
        self.assertLess(shipped["0.2"], 0.6 * shipped["0.5"])

    def test_vault_gets_the_whole_prompt_before_eviction(self):
        # The pruning prefill node stores its prompt's full blocks in the vault; a later prompt
        # restores them and its first token (the prefill's, before any eviction shows) is the
        # uncached one's: the stored blocks are the whole prompt, not the pruned pages.
        keep = ["--kv-keep-ratio", "0.2"]
        with cluster.Cluster(vault=True, node_flags=vault_test.CHUNK,
                             prefill_flags=[*keep, "--prefix-cache-bytes", "0", "--vault-codec", "exact"]) as c:
            vault_test.complete(c.router, vault_test.PREFIX + "first", max_tokens=2)
            vault_test.wait_for(lambda: c.vault.health()["store"]["blocks"] >= 7, "blocks in the vault")
            prompt = vault_test.PREFIX + "second"
            got = vault_test.complete(c.router, prompt, max_tokens=1, logprobs=1)
            self.assertGreaterEqual(vault_test.hits(c.prefill[0], "vault"), 7)
        ref = vault_test.hack_run_json(prompt, max_tokens=1)
        self.assertEqual(got["choices"][0]["text"], ref["text"])

    def test_bad_flag_is_refused(self):
        for flags, name in ((["--kv-keep-ratio", "2"], "--kv-keep-ratio"),
                            (["--kv-keep-ratio", "0.5", "--kv-keep-tokens", "9"], "not both"),
                            (["--kv-keep-scope", "head"], "--kv-keep-scope")):
            argv = [cluster.binary("hack-run"), "--model", cluster.MODEL_DIR, "--prompt", "hi", *flags]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(name, r.stderr)


if __name__ == "__main__":
    unittest.main()
