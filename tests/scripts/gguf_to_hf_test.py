"""scripts/gguf_to_hf.py on small GGUF files written here with the `gguf` package's own writer
and quantizers: every supported tensor type against gguf's own dequantizer, the q/k row
permutation undone, tied embeddings, and the refusals (architecture, tensor type, tokenizer).
SmolLM2 itself only has F32, Q8_0 and Q4_1 tensors (tests/e2e/smollm2_golden_test.cpp covers
it end to end); this covers F16, BF16 and Q4_0 as well.

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
from gguf import GGMLQuantizationType as Q, GGUFWriter, quants

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gguf_to_hf", ROOT / "scripts" / "gguf_to_hf.py")
g2h = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g2h)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 4, 2, 16, 96
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

    def write_gguf(self, arch="llama", types=None, extra_tensor=None, tokenizer_model="gpt2", pre="smollm"):
        """A one-layer llama. `types` maps a GGUF tensor name to the type to store it in.
        Returns the HF-layout float32 weights that went in (before quantization)."""
        types = types or {}
        vocab = byte_alphabet() + ["Ġt", "<|end|>"]
        hf = {
            "token_embd.weight": self.rng.standard_normal((len(vocab), HIDDEN)).astype(np.float32),
            "blk.0.attn_q.weight": self.rng.standard_normal((HEADS * HEAD_DIM, HIDDEN)).astype(np.float32),
            "blk.0.attn_k.weight": self.rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32),
            "blk.0.attn_v.weight": self.rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32),
            "blk.0.attn_output.weight": self.rng.standard_normal((HIDDEN, HEADS * HEAD_DIM)).astype(np.float32),
            "blk.0.ffn_gate.weight": self.rng.standard_normal((FFN, HIDDEN)).astype(np.float32),
            "blk.0.ffn_up.weight": self.rng.standard_normal((FFN, HIDDEN)).astype(np.float32),
            "blk.0.ffn_down.weight": self.rng.standard_normal((HIDDEN, FFN)).astype(np.float32),
            "blk.0.attn_norm.weight": self.rng.standard_normal(HIDDEN).astype(np.float32),
            "blk.0.ffn_norm.weight": self.rng.standard_normal(HIDDEN).astype(np.float32),
            "output_norm.weight": self.rng.standard_normal(HIDDEN).astype(np.float32),
        }
        path = self.tmp / "model.gguf"
        w = GGUFWriter(str(path), arch)
        w.add_block_count(1)
        w.add_context_length(256)
        w.add_embedding_length(HIDDEN)
        w.add_feed_forward_length(FFN)
        w.add_head_count(HEADS)
        w.add_head_count_kv(KV_HEADS)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        w.add_vocab_size(len(vocab))
        w.add_tokenizer_model(tokenizer_model)
        w.add_tokenizer_pre(pre)
        w.add_token_list(vocab)
        w.add_token_types([1] * (len(vocab) - 1) + [3])
        w.add_token_merges(["Ġ t"])
        w.add_bos_token_id(len(vocab) - 1)
        w.add_eos_token_id(len(vocab) - 1)
        w.add_chat_template("{{ messages[0]['content'] }}")
        stored = {}
        for name, a in hf.items():
            if name.endswith("attn_q.weight"):
                a = permute(a, HEADS)
            elif name.endswith("attn_k.weight"):
                a = permute(a, KV_HEADS)
            t = types.get(name, Q.F32)
            if t == Q.F32:
                w.add_tensor(name, a)
                stored[name] = a
            elif t == Q.F16:
                w.add_tensor(name, a.astype(np.float16))
                stored[name] = a.astype(np.float16).astype(np.float32)
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
        self.assertEqual(tok["added_tokens"][0]["content"], "<|end|>")
        self.assertTrue(tok["added_tokens"][0]["special"])
        cfg = json.loads((out / "tokenizer_config.json").read_text())
        self.assertEqual(cfg["chat_template"], "{{ messages[0]['content'] }}")
        self.assertEqual((cfg["bos_token"], cfg["eos_token"], cfg["add_bos_token"]), ("<|end|>", "<|end|>", False))

    def test_refuses_other_architectures(self):
        path, _, _ = self.write_gguf(arch="qwen2")
        with self.assertRaisesRegex(g2h.ConversionError, "architecture 'qwen2'"):
            self.convert(path)

    def test_refuses_unknown_tensor_types(self):
        raw = np.zeros((1, 176), dtype=np.uint8)  # one Q5_K block: 256 weights in 176 bytes
        path, _, _ = self.write_gguf(extra_tensor=("blk.0.extra.weight", raw, Q.Q5_K))
        with self.assertRaisesRegex(g2h.ConversionError, "Q5_K"):
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
