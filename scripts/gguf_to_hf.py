#!/usr/bin/env python3
"""Convert a llama- or qwen2-architecture GGUF file into a Hugging Face model directory.

    python3 scripts/gguf_to_hf.py MODEL.gguf OUT_DIR

Writes config.json (LlamaForCausalLM or Qwen2ForCausalLM), model.safetensors (bf16),
tokenizer.json (byte-level BPE), tokenizer_config.json (with the GGUF's chat template) and
generation_config.json. Needs only numpy and the `gguf` package (its GGUFReader parses the
file; F32/F16/BF16/Q8_0/Q4_0/Q4_1 are dequantized here, the K-quants Q4_K/Q5_K/Q6_K by
gguf.quants.dequantize). Tokenizer model "gpt2" (byte-level BPE) with pre-tokenizer "gpt2",
"smollm" or "qwen2". Any other architecture, tensor type or tokenizer is refused with a
message naming it.

llama.cpp's convert_hf_to_gguf.py permutes the rows of q_proj and k_proj of *llama* models
(LlamaModel.modify_tensors: it interleaves the two RoPE halves of each head, for its
rotate-pairs RoPE); this script undoes that so the output matches the Hugging Face
(rotate-half) layout. Its Qwen2Model does not permute (llama.cpp runs qwen2 with NEOX-style
rotate-half RoPE, LLM_ARCH_QWEN2 -> LLAMA_ROPE_TYPE_NEOX), so qwen2 q/k rows are copied as
they are. Qwen2 also has q/k/v biases (attn_{q,k,v}.bias) and usually its own output.weight.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

try:
    from gguf import GGUFReader, GGUFValueType
except ImportError:  # pragma: no cover - a message a user can act on
    sys.exit("gguf_to_hf: the Python package `gguf` is missing (pip install -r scripts/requirements-test.txt)")


class ConversionError(Exception):
    pass


# GGML type ids (ggml.h, enum ggml_type) of the types dequantized below.
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30
GGML_Q4_K, GGML_Q5_K, GGML_Q6_K = 12, 13, 14  # super-blocks of 256: left to gguf.quants.dequantize
GGML_K_QUANTS = {GGML_Q4_K: "Q4_K", GGML_Q5_K: "Q5_K", GGML_Q6_K: "Q6_K"}
GGML_TYPE_NAMES = {GGML_F32: "F32", GGML_F16: "F16", GGML_Q4_0: "Q4_0", GGML_Q4_1: "Q4_1",
                   GGML_Q8_0: "Q8_0", GGML_BF16: "BF16", **GGML_K_QUANTS}

# llama.cpp token types (llama.h, enum llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# GPT-2's pre-tokenizer regex, which the ByteLevel pre-tokenizer applies with use_regex = true.
# tokenizer.ggml.pre names llama.cpp's pre-tokenizer (llama-vocab.cpp): "gpt2" is that regex
# alone; "smollm" first splits every digit on its own (\p{N}), as SmolLM2's own tokenizer.json
# does with Digits(individual_digits) before ByteLevel.
# "qwen2" is Qwen2's own tokenizer.json (and transformers' Qwen2Converter): its regex split
# (single digits, letters with one leading non-letter, no " ?" before letters), then ByteLevel
# without the GPT-2 regex, after an NFC normalizer (NORMALIZERS).
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {
    "gpt2": BYTE_LEVEL,
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
    "qwen2": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
}
NORMALIZERS = {"qwen2": {"type": "NFC"}}

# The architectures converted, by general.architecture: the Hugging Face class, and whether
# llama.cpp's converter permuted q/k rows (see the module docstring).
ARCHITECTURES = {
    "llama": {"class": "LlamaForCausalLM", "permuted_qk": True, "biases": False},
    "qwen2": {"class": "Qwen2ForCausalLM", "permuted_qk": False, "biases": True},
}


# ---------------------------------------------------------------- GGUF metadata

def field_value(reader: GGUFReader, key: str, default=None):
    """The value of a metadata key: str, int, float, bool, or a list of those."""
    f = reader.fields.get(key)
    if f is None:
        return default
    t = f.types[0]
    if t == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    if t == GGUFValueType.ARRAY:
        if f.types[1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    v = f.parts[f.data[0]].tolist()[0]
    return bool(v) if t == GGUFValueType.BOOL else v


def require(reader: GGUFReader, key: str):
    v = field_value(reader, key)
    if v is None:
        raise ConversionError(f"metadata key {key} is missing")
    return v


# ---------------------------------------------------------------- dequantization

def dequantize(raw: np.ndarray, ggml_type: int, n_elements: int) -> np.ndarray:
    """Flat float32 values of a tensor's raw bytes (ggml block formats, ggml-common.h)."""
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if ggml_type == GGML_F32:
        return raw.view("<f4").astype(np.float32)
    if ggml_type == GGML_F16:
        return raw.view("<f2").astype(np.float32)
    if ggml_type == GGML_BF16:
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if ggml_type == GGML_Q8_0:
        # block: f16 d, int8 q[32]; x = q * d
        b = raw.reshape(-1, 34)
        d = b[:, :2].copy().view("<f2").astype(np.float32)
        q = b[:, 2:].view(np.int8).astype(np.float32)
        return (q * d).reshape(-1)
    if ggml_type in (GGML_Q4_0, GGML_Q4_1):
        # Q4_0 block: f16 d, u8 qs[16];         x = (q - 8) * d
        # Q4_1 block: f16 d, f16 m, u8 qs[16];  x = q * d + m
        # qs[j] holds element j in its low nibble and element j + 16 in its high nibble.
        head = 2 if ggml_type == GGML_Q4_0 else 4
        b = raw.reshape(-1, head + 16)
        d = b[:, 0:2].copy().view("<f2").astype(np.float32)
        qs = b[:, head:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # [blocks][32]
        if ggml_type == GGML_Q4_0:
            return ((q - 8.0) * d).reshape(-1)
        m = b[:, 2:4].copy().view("<f2").astype(np.float32)
        return (q * d + m).reshape(-1)
    if ggml_type in GGML_K_QUANTS:
        from gguf import GGMLQuantizationType, quants
        return quants.dequantize(raw, GGMLQuantizationType(ggml_type)).astype(np.float32).reshape(-1)
    raise ConversionError(f"unsupported tensor type {ggml_type}")


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounding to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf's LlamaModel.permute:
    w.reshape(n_head, 2, d // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)."""
    d = w.shape[0]
    return w.reshape(n_head, d // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------- tensors

def hf_tensor_name(name: str, biases: bool = False) -> str | None:
    """The Hugging Face name of a GGUF tensor; biases (attn_{q,k,v}.bias) only when the
    architecture has them (qwen2)."""
    fixed = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    if name in fixed:
        return fixed[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "bias" and biases:
        per_layer = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj"}
        if parts[2] in per_layer:
            return f"model.layers.{int(parts[1])}.{per_layer[parts[2]]}.bias"
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight":
        per_layer = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                     "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                     "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
                     "ffn_norm": "post_attention_layernorm"}
        if parts[2] in per_layer:
            return f"model.layers.{int(parts[1])}.{per_layer[parts[2]]}.weight"
    return None


class Progress:
    """How far a long step is, on stderr: a bar redrawn in place on a terminal, else a plain
    line at every quarter (logs stay short and readable)."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.tty = what, total, sys.stderr.isatty()
        self.next_quarter = 1

    def update(self, done: int) -> None:
        if self.tty:
            width = 30
            filled = width * done // max(self.total, 1)
            end = "\n" if done >= self.total else ""
            print(f"\r{self.what} [{'#' * filled}{' ' * (width - filled)}] {done}/{self.total}", end=end,
                  file=sys.stderr, flush=True)
        elif done * 4 >= self.next_quarter * self.total:
            self.next_quarter = done * 4 // max(self.total, 1) + 1
            print(f"{self.what}: {done}/{self.total}", file=sys.stderr, flush=True)


def plan_tensors(reader: GGUFReader, arch: str) -> list[tuple[str, tuple[int, ...], object]]:
    """(hf name, numpy shape, reader tensor) for every tensor, in file order; refuses unknown
    types and names before anything is dequantized."""
    plan = []
    for t in reader.tensors:
        ggml_type = int(t.tensor_type)
        if ggml_type not in GGML_TYPE_NAMES:
            raise ConversionError(f"tensor {t.name}: type {t.tensor_type.name} is not supported "
                                  f"(supported: {', '.join(GGML_TYPE_NAMES.values())})")
        hf = hf_tensor_name(t.name, biases=ARCHITECTURES[arch]["biases"])
        if hf is None:
            if t.name == "rope_freqs.weight":
                raise ConversionError("tensor rope_freqs.weight (llama3 rope scaling) is not supported")
            raise ConversionError(f"tensor {t.name} has no Hugging Face {ARCHITECTURES[arch]['class']} counterpart")
        # GGUF lists dims fastest-first (ne0 = row length); numpy wants them the other way.
        plan.append((hf, tuple(int(n) for n in reversed(t.shape.tolist())), t))
    return plan


def convert_tensor(t, shape: tuple[int, ...], n_head: int, n_kv_head: int, permuted_qk: bool) -> np.ndarray:
    """bf16 bits of one tensor in the Hugging Face layout."""
    values = dequantize(t.data, int(t.tensor_type), int(t.n_elements))
    if values.size != int(t.n_elements):
        raise ConversionError(f"tensor {t.name}: {values.size} values, expected {int(t.n_elements)}")
    w = values.reshape(shape)
    if permuted_qk and t.name.endswith("attn_q.weight"):
        w = unpermute_rope_rows(w, n_head)
    elif permuted_qk and t.name.endswith("attn_k.weight"):
        w = unpermute_rope_rows(w, n_kv_head)
    return to_bf16_bits(w)


def write_safetensors(path: Path, shapes: list[tuple[str, tuple[int, ...]]], tensors) -> list[str]:
    """Writes bf16 tensors as safetensors: u64 little-endian header length, JSON header, then
    the raw bytes. `shapes` gives (name, shape) of each in order; `tensors` yields their bf16
    bits (uint16 arrays) in the same order, one at a time, so only one is held in memory."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes:
        n = int(np.prod(shape, dtype=np.int64)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for (name, shape), bits in zip(shapes, tensors, strict=True):
            if bits.size != int(np.prod(shape, dtype=np.int64)):
                raise ConversionError(f"tensor {name}: {bits.size} values for shape {shape}")
            f.write(np.ascontiguousarray(bits, dtype="<u2").tobytes())
    return [name for name, _ in shapes]


# ---------------------------------------------------------------- tokenizer

def build_tokenizer(reader: GGUFReader, arch: str):
    model = require(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ConversionError(f"tokenizer model {model!r} is not supported (only 'gpt2', byte-level BPE)")
    pre = field_value(reader, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ConversionError(f"pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported "
                              f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    if field_value(reader, "tokenizer.ggml.add_space_prefix", False):
        raise ConversionError("tokenizer.ggml.add_space_prefix = true is not supported")
    tokens = require(reader, "tokenizer.ggml.tokens")
    types = field_value(reader, "tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))
    merges = require(reader, "tokenizer.ggml.merges")
    vocab = {}
    for i, tok in enumerate(tokens):
        if tok in vocab:
            raise ConversionError(f"token {tok!r} appears twice (ids {vocab[tok]} and {i})")
        vocab[tok] = i
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep or not a or not b or " " in b:
            raise ConversionError(f"merge {m!r} is not two tokens separated by one space")
        pairs.append([a, b])
    added = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == TOKEN_CONTROL}
             for i in range(len(tokens)) if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]

    def token(key):
        i = field_value(reader, key)
        return None if i is None or not 0 <= i < len(tokens) else tokens[i]

    bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
    add_bos = bool(field_value(reader, "tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(field_value(reader, "tokenizer.ggml.add_eos_token", False)) and eos is not None
    single = ([{"SpecialToken": {"id": bos, "type_id": 0}}] if add_bos else []) + \
        [{"Sequence": {"id": "A", "type_id": 0}}] + \
        ([{"SpecialToken": {"id": eos, "type_id": 0}}] if add_eos else [])
    specials = {t: {"id": t, "ids": [vocab[t]], "tokens": [t]} for t in {bos if add_bos else None, eos if add_eos else None} if t}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": NORMALIZERS.get(pre),
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": {"type": "TemplateProcessing", "single": single,
                           "pair": single + [{"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": specials},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": pairs},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(require(reader, f"{arch}.context_length")),
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
    }
    template = field_value(reader, "tokenizer.chat_template")
    if template is not None:
        config["chat_template"] = template
    return tokenizer, config, len(tokens)


# ---------------------------------------------------------------- config

def build_config(reader: GGUFReader, arch: str, n_vocab_tokens: int, tied: bool) -> dict:
    """config.json of the architecture; its hyperparameters are GGUF keys `<arch>.<name>`."""
    def key(name):
        return f"{arch}.{name}"

    hidden = int(require(reader, key("embedding_length")))
    n_head = int(require(reader, key("attention.head_count")))
    n_kv = int(field_value(reader, key("attention.head_count_kv"), n_head))
    head_dim = int(field_value(reader, key("attention.key_length"), hidden // n_head))
    if int(field_value(reader, key("attention.value_length"), head_dim)) != head_dim:
        raise ConversionError(f"{key('attention.value_length')} differs from key_length: not supported")
    rope_dims = int(field_value(reader, key("rope.dimension_count"), head_dim))
    if rope_dims != head_dim:
        raise ConversionError(f"partial rotary embedding (rope.dimension_count {rope_dims} != head_dim {head_dim}) is not supported")
    scaling = field_value(reader, key("rope.scaling.type"), "none")
    if scaling not in ("none", None):
        raise ConversionError(f"rope scaling {scaling!r} ({key('rope.scaling.type')}) is not supported")
    if field_value(reader, key("expert_count"), 0):
        raise ConversionError(f"mixture-of-experts {arch} ({key('expert_count')}) is not supported")
    context = int(require(reader, key("context_length")))

    def token_id(key):
        v = field_value(reader, key)
        return None if v is None else int(v)

    config = {
        "architectures": [ARCHITECTURES[arch]["class"]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(require(reader, key("feed_forward_length"))),
        "num_hidden_layers": int(require(reader, key("block_count"))),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(require(reader, key("attention.layer_norm_rms_epsilon"))),
        # both transformers' defaults are 10000 (Qwen2.5 GGUFs carry 1e6)
        "rope_theta": float(field_value(reader, key("rope.freq_base"), 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": context,
        "vocab_size": int(field_value(reader, key("vocab_size"), n_vocab_tokens)),
        "tie_word_embeddings": tied,
        "bos_token_id": token_id("tokenizer.ggml.bos_token_id"),
        "eos_token_id": token_id("tokenizer.ggml.eos_token_id"),
        "pad_token_id": token_id("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "bfloat16",
    }
    if arch == "llama":
        config.update({"attention_bias": False, "mlp_bias": False})
    else:  # Qwen2Attention always has q/k/v biases; no sliding window (llama.cpp has none for qwen2)
        config.update({"use_sliding_window": False, "sliding_window": None, "max_window_layers": config["num_hidden_layers"],
                       "attention_dropout": 0.0})
    return config


def convert(gguf_path: Path, out_dir: Path) -> None:
    reader = GGUFReader(str(gguf_path))
    arch = require(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ConversionError(f"architecture {arch!r} is not supported (only {', '.join(map(repr, ARCHITECTURES))})")
    names = {t.name for t in reader.tensors}
    tokenizer, tok_config, n_tokens = build_tokenizer(reader, arch)
    config = build_config(reader, arch, n_tokens, tied="output.weight" not in names)
    if config["vocab_size"] != n_tokens:
        raise ConversionError(f"{arch}.vocab_size {config['vocab_size']} != {n_tokens} tokenizer tokens")
    per_layer = ["attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
                 "ffn_up.weight", "ffn_down.weight", "attn_norm.weight", "ffn_norm.weight"]
    if ARCHITECTURES[arch]["biases"]:
        per_layer += ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
    expected = {"token_embd.weight", "output_norm.weight"} | {
        f"blk.{i}.{p}" for i in range(config["num_hidden_layers"]) for p in per_layer}
    missing = sorted(expected - names)
    if missing:
        raise ConversionError(f"missing tensors: {', '.join(missing[:8])}{' …' if len(missing) > 8 else ''}")

    plan = plan_tensors(reader, arch)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    permuted = ARCHITECTURES[arch]["permuted_qk"]
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress("gguf_to_hf: tensors", len(plan))

    def converted():
        progress.update(0)
        for done, (_, shape, t) in enumerate(plan, 1):
            yield convert_tensor(t, shape, heads, kv_heads, permuted)
            progress.update(done)

    write_safetensors(out_dir / "model.safetensors", [(hf, shape) for hf, shape, _ in plan], converted())

    def dump(name, obj):
        with open(out_dir / name, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=2 if name != "tokenizer.json" else None)
            f.write("\n")

    dump("config.json", config)
    dump("tokenizer.json", tokenizer)
    dump("tokenizer_config.json", tok_config)
    dump("generation_config.json", {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
                                    "pad_token_id": config["pad_token_id"]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path, help="a llama- or qwen2-architecture .gguf file")
    ap.add_argument("out_dir", type=Path, help="where to write the Hugging Face directory")
    args = ap.parse_args()
    try:
        convert(args.gguf, args.out_dir)
    except ConversionError as e:
        print(f"gguf_to_hf: {args.gguf}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
