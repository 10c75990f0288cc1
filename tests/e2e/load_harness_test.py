"""bench/load/hack_load.py against a real cluster (hack-tiny, 1P1D) for a few seconds: a rate
sweep and a concurrency sweep complete without failures, results.json carries every key
`vllm bench serve` writes that the harness documents, per-request lists line up with the
requests sent, and every plot is a non-empty PNG whose x values are the swept ones."""
import json
import os
import sys
import tempfile
import unittest

from cluster import Cluster

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "load"))
import hack_load  # noqa: E402

VLLM_KEYS = ["date", "backend", "model_id", "request_rate", "burstiness", "max_concurrency", "num_prompts",
             "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
             "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts",
             "itls", "errors"] + [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
                                  for s in ("mean", "median", "std", "p90", "p99")]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class LoadHarnessTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(prefill=1, decode=1)
        cls.base_url = f"http://127.0.0.1:{cls.cluster.router.port}/v1"

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def sweep(self, *flags):
        out = tempfile.mkdtemp(prefix="hack-load-")
        # hack-tiny's vocabulary is 4096 ids; prompts stay clear of its special tokens.
        rc = hack_load.main(["--base-url", self.base_url, "-n", "6", "--warmup", "1", "--input-len", "24",
                             "--output-len", "4", "--range-ratio", "0.5", "--id-range", "10:4000",
                             "--slo-ttft-ms", "60000", "--out-dir", out, *flags])
        self.assertEqual(rc, 0)
        with open(os.path.join(out, "results.json")) as f:
            return out, json.load(f)

    def check_pngs(self, out, names):
        for name in names:
            with open(os.path.join(out, name), "rb") as f:
                data = f.read()
            self.assertTrue(data.startswith(PNG_MAGIC), name)
            self.assertGreater(len(data), 10_000, f"{name} is too small to hold a plot")

    def test_rate_sweep(self):
        out, r = self.sweep("--rates", "2,8")
        self.assertEqual(r["sweep"], "rate")
        self.assertEqual([p["request_rate"] for p in r["points"]], [2.0, 8.0])
        for p in r["points"]:
            for k in VLLM_KEYS:
                self.assertIn(k, p)
            self.assertEqual((p["completed"], p["failed"]), (6, 0))
            self.assertEqual(len(p["ttfts"]), 6)
            # ignore_eos: every request produced exactly the output length it asked for.
            self.assertEqual(p["output_lens"], p["requested_output_lens"])
            self.assertEqual(p["input_lens"], p["requested_input_lens"])
            self.assertGreater(len(set(p["input_lens"])), 1, "--range-ratio 0.5 must vary the lengths")
            self.assertLessEqual(p["median_ttft_ms"], p["p99_ttft_ms"])
            self.assertLessEqual(p["request_goodput"], p["request_throughput"] + 1e-9)
            self.assertGreater(p["output_throughput"], 0)
        self.check_pngs(out, ["latency_vs_rate.png", "throughput_vs_rate.png", "ttft_vs_input_len.png", "timeline.png"])

    def test_concurrency_sweep(self):
        out, r = self.sweep("--concurrency-sweep", "1,3", "--dataset", "sharegpt", "--max-input-len", "48",
                            "--max-output-len", "6")
        self.assertEqual([p["max_concurrency"] for p in r["points"]], [1, 3])
        self.assertEqual([p["request_rate"] for p in r["points"]], ["inf", "inf"])
        for p in r["points"]:
            self.assertEqual(p["failed"], 0, p["errors"])
            self.assertTrue(all(n <= 48 for n in p["input_lens"]))
        self.check_pngs(out, ["latency_vs_concurrency.png", "throughput_vs_concurrency.png"])


if __name__ == "__main__":
    unittest.main()
