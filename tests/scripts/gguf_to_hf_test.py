"""scripts/gguf_to_hf.py on small GGUF files written here with the `gguf` package's own writer
and quantizers: every supported tensor type against gguf's own dequantizer, the q/k row
permutation undone (llama) or left alone (qwen2), tied and untied embeddings, qwen2's q/k/v
biases, NFC normalizer and regex split, and the refusals (architecture, tensor type, tokenizer).
SmolLM2 itself only has F32, Q8_0 and Q4_1 tensors and Qwen2.5-Coder F32, Q4_K and Q6_K
(tests/e2e/{smollm2,qwen}_golden_test.cpp cover them end to end); this covers F16, BF16, Q4_0
and Q5_K as well.

    python3 -m unittest -v gguf_to_hf_test     (in tests/scripts; needs numpy + gguf)
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import tempfile
import unittest
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFWriter, quants

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gguf_to_hf", ROOT / "scripts" / "gguf_to_hf.py")
g2h = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g2h)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 4, 2, 16, 96
# qwen2: rows of 256 values, the K-quants' super-block (a K-quant row must be a multiple of it)
QWEN = {"hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "ffn": 256}
SEED = 7


def byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode(): the 256 single-byte tokens of a byte-level BPE vocab."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute, as llama.cpp applies it to q_proj / k_proj."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# gguf can dequantize the K-quants but not quantize them: their tensors are written as random
# super-blocks with sane f16 scales, and the reference is gguf.quants.dequantize of those bytes.
# Byte offsets of the f16 scales in a block (ggml-common.h): Q4_K/Q5_K start with d, dmin;
# Q6_K ends with d (after ql[128], qh[64], scales[16]).
K_QUANT_F16_OFFSETS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def random_k_quant(rng: np.random.Generator, shape: tuple[int, ...], t: Q) -> np.ndarray:
    block_values, block_bytes = GGML_QUANT_SIZES[t]
    assert shape[-1] % block_values == 0, shape
    raw = rng.integers(0, 256, size=(*shape[:-1], shape[-1] // block_values * block_bytes), dtype=np.uint8)
    blocks = raw.reshape(-1, block_bytes)
    for off in K_QUANT_F16_OFFSETS[t]:
        blocks[:, off:off + 2] = np.array(rng.uniform(0.005, 0.02, size=blocks.shape[0]),
                                          dtype="<f2").view(np.uint8).reshape(-1, 2)
    return raw


def read_safetensors_bf16(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "BF16", e
        a, b = e["data_offsets"]
        bits = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<u2").astype(np.uint32) << 16
        out[name] = bits.view(np.float32).reshape(e["shape"])
    return out


class GgufToHfTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.rng = np.random.default_rng(SEED)

    def write_gguf(self, arch="llama", types=None, extra_tensor=None, tokenizer_model="gpt2", pre="smollm",
                   dims=None, biases=False, untied=False, rope_theta=10000.0):
        """A one-layer model of `arch` (llama layout; `biases` adds qwen2's q/k/v biases,
        `untied` an output.weight). `types` maps a GGUF tensor name to the type to store it in.
        Returns the path, the HF-layout float32 weights that went in (before quantization) and
        the values gguf's own dequantizer reads back from the file."""
        types = types or {}
        d = dims or {"hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "ffn": FFN}
        hidden, heads, kv_heads, head_dim, ffn = d["hidden"], d["heads"], d["kv_heads"], d["head_dim"], d["ffn"]
        vocab = byte_alphabet() + ["Ġt", "<|end|>", "<tool_call>"]
        hf = {
            "token_embd.weight": self.rng.standard_normal((len(vocab), hidden)).astype(np.float32),
            "blk.0.attn_q.weight": self.rng.standard_normal((heads * head_dim, hidden)).astype(np.float32),
            "blk.0.attn_k.weight": self.rng.standard_normal((kv_heads * head_dim, hidden)).astype(np.float32),
            "blk.0.attn_v.weight": self.rng.standard_normal((kv_heads * head_dim, hidden)).astype(np.float32),
            "blk.0.attn_output.weight": self.rng.standard_normal((hidden, heads * head_dim)).astype(np.float32),
            "blk.0.ffn_gate.weight": self.rng.standard_normal((ffn, hidden)).astype(np.float32),
            "blk.0.ffn_up.weight": self.rng.standard_normal((ffn, hidden)).astype(np.float32),
            "blk.0.ffn_down.weight": self.rng.standard_normal((hidden, ffn)).astype(np.float32),
            "blk.0.attn_norm.weight": self.rng.standard_normal(hidden).astype(np.float32),
            "blk.0.ffn_norm.weight": self.rng.standard_normal(hidden).astype(np.float32),
            "output_norm.weight": self.rng.standard_normal(hidden).astype(np.float32),
        }
        if biases:
            hf["blk.0.attn_q.bias"] = self.rng.standard_normal(heads * head_dim).astype(np.float32)
            hf["blk.0.attn_k.bias"] = self.rng.standard_normal(kv_heads * head_dim).astype(np.float32)
            hf["blk.0.attn_v.bias"] = self.rng.standard_normal(kv_heads * head_dim).astype(np.float32)
        if untied:
            hf["output.weight"] = self.rng.standard_normal((len(vocab), hidden)).astype(np.float32)
        path = self.tmp / "model.gguf"
        w = GGUFWriter(str(path), arch)
        w.add_block_count(1)
        w.add_context_length(256)
        w.add_embedding_length(hidden)
        w.add_feed_forward_length(ffn)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(rope_theta)
        w.add_vocab_size(len(vocab))
        w.add_tokenizer_model(tokenizer_model)
        w.add_tokenizer_pre(pre)
        w.add_token_list(vocab)
        w.add_token_types([1] * (len(vocab) - 2) + [3, 4])  # <|end|> control, <tool_call> user-defined
        w.add_token_merges(["Ġ t"])
        w.add_bos_token_id(len(vocab) - 2)
        w.add_eos_token_id(len(vocab) - 2)
        w.add_chat_template("{{ messages[0]['content'] }}")
        stored = {}
        for name, a in hf.items():
            if arch == "llama" and name.endswith("attn_q.weight"):  # qwen2 is written unpermuted
                a = permute(a, heads)
            elif arch == "llama" and name.endswith("attn_k.weight"):
                a = permute(a, kv_heads)
            t = types.get(name, Q.F32)
            if t == Q.F32:
                w.add_tensor(name, a)
                stored[name] = a
            elif t == Q.F16:
                w.add_tensor(name, a.astype(np.float16))
                stored[name] = a.astype(np.float16).astype(np.float32)
            elif t in K_QUANT_F16_OFFSETS:
                q = random_k_quant(self.rng, a.shape, t)
                w.add_tensor(name, q, raw_dtype=t)
                stored[name] = quants.dequantize(q, t).reshape(a.shape)
            else:
                q = quants.quantize(a, t)
                w.add_tensor(name, q, raw_dtype=t)
                stored[name] = quants.dequantize(q, t).reshape(a.shape)
        if extra_tensor:
            name, raw, t = extra_tensor
            w.add_tensor(name, raw, raw_dtype=t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path, hf, stored

    def convert(self, path):
        out = self.tmp / "hf"
        g2h.convert(path, out)
        return out

    def test_every_supported_type_matches_gguf_dequantize_and_q_k_are_unpermuted(self):
        types = {"token_embd.weight": Q.Q8_0, "blk.0.attn_q.weight": Q.Q4_0, "blk.0.attn_k.weight": Q.Q4_1,
                 "blk.0.attn_v.weight": Q.F16, "blk.0.attn_output.weight": Q.BF16, "blk.0.ffn_gate.weight": Q.Q8_0,
                 "blk.0.ffn_up.weight": Q.Q4_1, "blk.0.ffn_down.weight": Q.Q4_0}
        path, hf, stored = self.write_gguf(types=types)
        out = self.convert(path)
        ours = read_safetensors_bf16(out / "model.safetensors")
        self.assertNotIn("lm_head.weight", ours)
        config = json.loads((out / "config.json").read_text())
        self.assertTrue(config["tie_word_embeddings"])
        self.assertEqual((config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]),
                         (HEADS, KV_HEADS, HEAD_DIM))
        for name, ref in stored.items():
            hf_name = g2h.hf_tensor_name(name)
            if name.endswith("attn_q.weight"):
                ref = g2h.unpermute_rope_rows(ref, HEADS)
            elif name.endswith("attn_k.weight"):
                ref = g2h.unpermute_rope_rows(ref, KV_HEADS)
            with self.subTest(tensor=name, type=types.get(name, Q.F32).name):
                self.assertEqual(ours[hf_name].shape, ref.shape)
                # exactly gguf's dequantized value rounded to bf16 (8 significant bits: ≤ 2^-8 relative)
                rounded = (g2h.to_bf16_bits(ref).astype(np.uint32) << 16).view(np.float32)
                np.testing.assert_array_equal(ours[hf_name], rounded)
                np.testing.assert_allclose(ours[hf_name], ref, rtol=2.0 ** -8, atol=0)
        # q/k come out in the HF row order that went in (up to Q4 error): the rows line up
        # with the original and not with llama.cpp's permuted order
        for name, heads in (("blk.0.attn_q.weight", HEADS), ("blk.0.attn_k.weight", KV_HEADS)):
            got, orig = ours[g2h.hf_tensor_name(name)], hf[name]
            aligned = np.corrcoef(got.ravel(), orig.ravel())[0, 1]
            misaligned = np.corrcoef(got.ravel(), permute(orig, heads).ravel())[0, 1]
            self.assertGreater(aligned, 0.95, name)
            self.assertLess(misaligned, 0.5, name)

    def test_permutation_inverse_is_exact(self):
        w = self.rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32)
        np.testing.assert_array_equal(g2h.unpermute_rope_rows(permute(w, KV_HEADS), KV_HEADS), w)

    def test_bf16_rounds_to_nearest_even(self):
        x = np.array([1.0, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -2.5, np.inf, np.nan], dtype=np.float32)
        bits = g2h.to_bf16_bits(x)
        self.assertEqual(bits[:5].tolist(), [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80])  # ties go to even
        self.assertEqual(bits[5] & 0x7FC0, 0x7FC0)

    def test_tokenizer_files(self):
        path, _, _ = self.write_gguf()
        out = self.convert(path)
        tok = json.loads((out / "tokenizer.json").read_text())
        self.assertEqual(tok["pre_tokenizer"]["pretokenizers"][0], {"type": "Digits", "individual_digits": True})
        self.assertEqual(tok["model"]["merges"], [["Ġ", "t"]])
        self.assertEqual([(a["content"], a["special"]) for a in tok["added_tokens"]],
                         [("<|end|>", True), ("<tool_call>", False)])  # control vs user-defined
        self.assertIsNone(tok["normalizer"])
        cfg = json.loads((out / "tokenizer_config.json").read_text())
        self.assertEqual(cfg["chat_template"], "{{ messages[0]['content'] }}")
        self.assertEqual((cfg["bos_token"], cfg["eos_token"], cfg["add_bos_token"]), ("<|end|>", "<|end|>", False))

    def test_qwen2_biases_untied_output_k_quants_and_rows_not_permuted(self):
        types = {"token_embd.weight": Q.Q4_K, "output.weight": Q.Q6_K, "blk.0.attn_q.weight": Q.Q4_K,
                 "blk.0.attn_k.weight": Q.Q5_K, "blk.0.attn_v.weight": Q.Q6_K, "blk.0.attn_output.weight": Q.Q4_K,
                 "blk.0.ffn_gate.weight": Q.Q8_0, "blk.0.ffn_up.weight": Q.Q4_K, "blk.0.ffn_down.weight": Q.Q6_K}
        path, hf, stored = self.write_gguf(arch="qwen2", types=types, pre="qwen2", dims=QWEN, biases=True,
                                           untied=True, rope_theta=1e6)
        out = self.convert(path)
        ours = read_safetensors_bf16(out / "model.safetensors")
        config = json.loads((out / "config.json").read_text())
        self.assertEqual((config["architectures"], config["model_type"]), (["Qwen2ForCausalLM"], "qwen2"))
        self.assertEqual((config["rope_theta"], config["tie_word_embeddings"], config["use_sliding_window"]),
                         (1e6, False, False))
        self.assertEqual((config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]),
                         (QWEN["heads"], QWEN["kv_heads"], QWEN["head_dim"]))
        self.assertIn("lm_head.weight", ours)
        for p in ("q", "k", "v"):
            self.assertIn(f"model.layers.0.self_attn.{p}_proj.bias", ours)
        self.assertEqual(len(ours), len(stored))
        for name, ref in stored.items():  # no un-permutation: exactly gguf's values rounded to bf16
            with self.subTest(tensor=name, type=types.get(name, Q.F32).name):
                got = ours[g2h.hf_tensor_name(name, biases=True)]
                np.testing.assert_array_equal(got, (g2h.to_bf16_bits(ref).astype(np.uint32) << 16).view(np.float32))
        # the Q8_0 tensor (quantized from known values) comes back in the row order written
        got, orig = ours[g2h.hf_tensor_name("blk.0.ffn_gate.weight")], hf["blk.0.ffn_gate.weight"]
        self.assertGreater(np.corrcoef(got.ravel(), orig.ravel())[0, 1], 0.99)
        # q/k were not un-permuted: permuting them as llama would no longer gives gguf's values
        q = ours[g2h.hf_tensor_name("blk.0.attn_q.weight")]
        self.assertFalse(np.array_equal(g2h.unpermute_rope_rows(q, QWEN["heads"]), q))

    def test_qwen2_tokenizer_is_nfc_then_regex_split_then_byte_level(self):
        path, _, _ = self.write_gguf(arch="qwen2", pre="qwen2", dims=QWEN, biases=True)
        out = self.convert(path)
        tok = json.loads((out / "tokenizer.json").read_text())
        self.assertEqual(tok["normalizer"], {"type": "NFC"})
        split, byte_level = tok["pre_tokenizer"]["pretokenizers"]
        self.assertEqual((split["type"], split["behavior"], split["invert"]), ("Split", "Isolated", False))
        self.assertIn(r"\p{N}|", split["pattern"]["Regex"])  # one digit at a time, as Qwen2's tokenizer.json
        self.assertEqual((byte_level["type"], byte_level["use_regex"]), ("ByteLevel", False))
        self.assertEqual(json.loads((out / "tokenizer_config.json").read_text())["model_max_length"], 256)

    def test_qwen2_without_biases_is_refused(self):
        path, _, _ = self.write_gguf(arch="qwen2", pre="qwen2", dims=QWEN, biases=False)
        with self.assertRaisesRegex(g2h.ConversionError, "missing tensors: blk.0.attn_k.bias"):
            self.convert(path)

    def test_refuses_other_architectures(self):
        path, _, _ = self.write_gguf(arch="phi3")
        with self.assertRaisesRegex(g2h.ConversionError, "architecture 'phi3' is not supported \\(only 'llama', 'qwen2'\\)"):
            self.convert(path)

    def test_refuses_unknown_tensor_types(self):
        raw = np.zeros((1, 84), dtype=np.uint8)  # one Q2_K block: 256 weights in 84 bytes
        path, _, _ = self.write_gguf(extra_tensor=("blk.0.extra.weight", raw, Q.Q2_K))
        with self.assertRaisesRegex(g2h.ConversionError, "Q2_K"):
            self.convert(path)

    def test_refuses_other_tokenizers(self):
        path, _, _ = self.write_gguf(pre="llama-bpe")
        with self.assertRaisesRegex(g2h.ConversionError, "'llama-bpe'"):
            self.convert(path)
        path, _, _ = self.write_gguf(tokenizer_model="llama")
        with self.assertRaisesRegex(g2h.ConversionError, "tokenizer model 'llama'"):
            self.convert(path)


if __name__ == "__main__":
    unittest.main()
