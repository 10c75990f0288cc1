"""FDC with real processes (tests/e2e/cluster.py, hack-tiny): hack-calibrate --fdc writes an
artifact, a cluster whose nodes all run --fdc answers exactly as hack-run --fdc does (HACK and
fp pages), nodes report the artifact in their KV format, a router never pairs a prefill node
with a decode node of another KV format, and a bad artifact is refused with a clear error.
"""

import json
import os
import shutil
import subprocess
import tempfile
import unittest
import urllib.error
import urllib.request

import cluster

PROMPT = "In the beginning God created the heaven and the earth. And the earth was without form, and void; and"


def complete(router, prompt, max_tokens=16):
    body = {"model": "hack-tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{router.port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def hack_run(kv, extra, max_tokens=16):
    argv = [cluster.binary("hack-run"), "--model", cluster.MODEL_DIR, "--kv", kv, "--threads", "1",
            "--temperature", "0", "--max-tokens", str(max_tokens), "--json", "--prompt", PROMPT, *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


class FdcClusterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="hack-fdc-")
        cls.artifact = os.path.join(cls.dir, "fdc.safetensors")
        # r = 0.3 cuts Q/K and V dims of hack-tiny's heads (64 → 32..48).
        subprocess.run([cluster.binary("hack-calibrate"), "--fdc", "--model", cluster.MODEL_DIR, "--fdc-rate", "0.3",
                        "--calib-tokens", "2048", "--calib-seq-len", "512", "--threads", "1", "--output",
                        cls.artifact], check=True, capture_output=True, timeout=300)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_cluster_equals_hack_run(self):
        fdc = ["--fdc", self.artifact]
        for kv in ("hack", "fp"):
            with self.subTest(kv=kv):
                expected = hack_run(kv, fdc)
                self.assertEqual(expected.returncode, 0, expected.stderr)
                plain = hack_run(kv, [])
                self.assertEqual(plain.returncode, 0, plain.stderr)
                with cluster.Cluster(kv=kv, node_flags=fdc) as c:
                    formats = {n.health()["kv_format"] for n in c.prefill + c.decode}
                    self.assertEqual(len(formats), 1)
                    self.assertIn("fdc=", formats.pop())
                    got = complete(c.router, PROMPT)
                self.assertEqual(got["choices"][0]["text"], json.loads(expected.stdout)["text"])
                # FDC changed the computation (else this test would not show it is applied).
                self.assertNotEqual(json.loads(expected.stdout)["ids"], json.loads(plain.stdout)["ids"])

    def test_router_pairs_only_nodes_of_one_kv_format(self):
        with cluster.Cluster(prefill_flags=["--fdc", self.artifact]) as c:
            self.assertNotEqual(c.prefill[0].health()["kv_format"], c.decode[0].health()["kv_format"])
            with self.assertRaises(urllib.error.HTTPError) as err:
                complete(c.router, PROMPT)
            self.assertEqual(err.exception.code, 503)
            message = json.loads(err.exception.read())["error"]["message"]
            self.assertIn("KV format", message)
            # Both nodes still serve (nothing was sent between them).
            self.assertTrue(c.prefill[0].alive() and c.decode[0].alive())

    def test_bad_artifacts_are_refused(self):
        garbage = os.path.join(self.dir, "garbage.safetensors")
        with open(garbage, "wb") as f:
            f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}       ")
        for path in (garbage, os.path.join(self.dir, "missing")):
            with self.subTest(path=path):
                r = hack_run("hack", ["--fdc", path])
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(path, r.stderr)  # the error names the file


if __name__ == "__main__":
    unittest.main()
