#!/usr/bin/env python3
"""Generate hackserve's test fixtures from the King James Bible.

    python3 scripts/make_fixtures.py [--only tokenizer|tiny|hack-tiny] [--train-minutes M]

Outputs (all paths relative to the repository root):

  tests/fixtures/tokenizers/kjv-bpe/   byte-level BPE tokenizer (Llama-3-style split regex,
                                       vocab 4096 incl. 5 special tokens), heldout.txt,
                                       tokenizer_goldens.json
  tests/fixtures/models/tiny-*/        random-weight f32 models, one per family, with
                                       goldens.json + goldens.safetensors from HF transformers
  models/hack-tiny/                    a small Llama trained on the KJV text (bf16 weights),
                                       training_log.json, README.md, goldens

Everything is seeded. The tokenizer and the tiny models are bit-reproducible on the same
library versions (scripts/requirements-fixtures.txt); hack-tiny stops on a wall-clock
budget, so how many steps it gets depends on the machine (use --train-steps for a fixed
schedule).

Goldens come from Hugging Face transformers (eager attention, float32 compute), never from
hackserve itself. Files written by this script:

  goldens.json         {"prompts": [{"name", "text", "ids", "positions", "greedy", ...}],
                        "tolerance_note", ...}
  goldens.safetensors  logits_<i>: f32 [len(positions), vocab] = logits at those positions of
                        one causal forward over the whole prompt i (ids include bos).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOK_DIR = ROOT / "tests/fixtures/tokenizers/kjv-bpe"
MODELS_DIR = ROOT / "tests/fixtures/models"
HACK_TINY_DIR = ROOT / "models/hack-tiny"

VOCAB_SIZE = 4096
BOS, EOS, IM_START, IM_END, PAD = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|pad|>",
)
SPECIALS = [BOS, EOS, IM_START, IM_END, PAD]  # appended after the BPE vocab: ids 4091..4095

# The pre-tokenizer regex of Llama 3 (tokenizer.json of meta-llama/Meta-Llama-3-8B).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML as Qwen writes it, preceded by bos (the models were trained with bos at position 0;
# apply_chat_template tokenizes with add_special_tokens=False, so the template carries it).
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

HELDOUT_FRACTION = 0.05  # whole books from the end of the canon, by characters
HELDOUT_FILE_CAP_BYTES = 100_000

GREEDY_NEW_TOKENS = 40
GOLDEN_POSITIONS = 16

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path: Path, obj, indent=2, sort_keys=False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False, sort_keys=sort_keys)
        f.write("\n")


# --------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------

_VERSE = re.compile(r"^([1-3]?[A-Za-z]+?)(\d+):(\d+) (.*)$")


def load_kjv() -> list[tuple[str, str]]:
    """Returns [(book abbreviation, text)] in canonical order.

    Text is plain prose: the "Ge1:1 " references are stripped, one verse per line, a blank
    line between chapters.
    """
    raw = subprocess.run(
        ["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True
    ).stdout
    books: list[tuple[str, list[list[str]]]] = []
    last = None
    for line in raw.splitlines():
        if not line.strip():
            continue
        m = _VERSE.match(line)
        if m is None:
            raise RuntimeError(f"unexpected line from bible: {line!r}")
        book, chapter, text = m.group(1), int(m.group(2)), m.group(4).strip()
        if not books or books[-1][0] != book:
            books.append((book, []))
            last = None
        if chapter != last:
            books[-1][1].append([])
            last = chapter
        books[-1][1][-1].append(text)
    if len(books) != 66:
        raise RuntimeError(f"expected 66 books, got {len(books)}")
    return [(name, "\n\n".join("\n".join(ch) for ch in chapters) + "\n") for name, chapters in books]


def split_corpus(books):
    """Held out = whole books from the end, until >= HELDOUT_FRACTION of all characters."""
    total = sum(len(t) for _, t in books)
    held, n = 0, 0
    while held < HELDOUT_FRACTION * total:
        n += 1
        held += len(books[-n][1])
    return books[:-n], books[-n:]


# --------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------


def build_tokenizer(train_books):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIALS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    lines = [line for _, text in train_books for line in text.splitlines(keepends=True)]
    tok.train_from_iterator(lines, trainer, length=len(lines))
    if tok.get_vocab_size() != VOCAB_SIZE - len(SPECIALS):
        raise RuntimeError(f"BPE trainer produced {tok.get_vocab_size()} tokens")
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS}:0 $A:0",
                pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1",
                special_tokens=[(BOS, bos_id)],
            ),
        ]
    )
    assert tok.get_vocab_size() == VOCAB_SIZE
    return tok


def tokenizer_config(tok) -> dict:
    added = {}
    for s in SPECIALS:
        added[str(tok.token_to_id(s))] = {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 1024,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


TOKENIZER_GOLDEN_TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.\n",
    "",
    " ",
    "   leading and trailing spaces   ",
    "Tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "I'll say it's THEY'RE we've I'M you'd",
    "Numbers: 1 12 123 1234 12345 3.14159 2024-05-17",
    "Jesus wept.",
    "naïve café — “quoted” ‘single’ …",
    "日本語のテキスト 中文 한국어",
    "emoji 🙂🙏🏽 and 🇬🇧",
    "code: for (int i = 0; i < n; ++i) { x[i] += 1; }",
    "<|im_start|>user\nhello<|im_end|>\n",
    "text <|end_of_text|> after eos and <|begin_of_text|> again",
    "<|im_start|> not closed <|im_end",
    "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
    "Ｆｕｌｌｗｉｄｔｈ and \u00a0nbsp\u200bzero-width",
]


def write_tokenizer_goldens(tok_dir: Path) -> None:
    """HF `tokenizers` output for awkward strings, for the C++ tokenizer tests."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    cases = []
    for text in TOKENIZER_GOLDEN_TEXTS:
        with_bos = tok.encode(text, add_special_tokens=True)
        no_special = tok.encode(text, add_special_tokens=False)
        assert hf(text)["input_ids"] == with_bos.ids
        cases.append(
            {
                "text": text,
                "ids": with_bos.ids,
                "ids_no_special": no_special.ids,
                "tokens_no_special": no_special.tokens,
                "decoded": tok.decode(with_bos.ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(with_bos.ids, skip_special_tokens=True),
            }
        )
    chats = [
        ([{"role": "user", "content": "Who made the heaven and the earth?"}], True),
        (
            [
                {"role": "system", "content": "You speak as the King James Bible."},
                {"role": "user", "content": "What is love?"},
                {"role": "assistant", "content": "Love suffereth long, and is kind."},
                {"role": "user", "content": "And?"},
            ],
            True,
        ),
        ([{"role": "user", "content": "hi"}], False),
    ]
    chat_cases = []
    for messages, gen in chats:
        text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        chat_cases.append({"messages": messages, "add_generation_prompt": gen, "text": text, "ids": list(ids)})
    write_json(
        tok_dir / "tokenizer_goldens.json",
        {
            "note": "From HF tokenizers/transformers. 'ids' = encode(text, add_special_tokens=True) "
            "(bos prepended by the TemplateProcessing post-processor); special tokens that occur in "
            "the text are matched as added tokens. Chat 'ids' = apply_chat_template(tokenize=True), "
            "which does not add bos again (the template emits it).",
            "bos_id": tok.token_to_id(BOS),
            "eos_id": tok.token_to_id(EOS),
            "cases": cases,
            "chat": chat_cases,
        },
    )


def make_tokenizer(books) -> None:
    train_books, held_books = split_corpus(books)
    log(
        f"tokenizer: training on {len(train_books)} books, holding out "
        f"{', '.join(b for b, _ in held_books)}"
    )
    tok = build_tokenizer(train_books)
    TOK_DIR.mkdir(parents=True, exist_ok=True)
    tok.save(str(TOK_DIR / "tokenizer.json"))
    write_json(TOK_DIR / "tokenizer_config.json", tokenizer_config(tok))
    held = "".join(t for _, t in held_books)
    cut = held[:HELDOUT_FILE_CAP_BYTES]
    cut = cut[: cut.rfind("\n") + 1]
    (TOK_DIR / "heldout.txt").write_text(cut, encoding="utf-8")
    write_json(
        TOK_DIR / "corpus.json",
        {
            "source": "King James Bible, `bible -f Gen1:1-Rev22:21` (Debian bible-kjv); verse "
            "references stripped, one verse per line, blank line between chapters",
            "train_books": [b for b, _ in train_books],
            "heldout_books": [b for b, _ in held_books],
            "heldout_txt": f"first {len(cut)} characters of the held-out books, cut at a line end",
        },
    )
    write_tokenizer_goldens(TOK_DIR)
    log(f"tokenizer: vocab {tok.get_vocab_size()}, heldout.txt {len(cut)} bytes")


def load_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOK_DIR / "tokenizer.json"))


def copy_tokenizer(dst: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOK_DIR / name, dst / name)


# --------------------------------------------------------------------------------------
# HF models: save, reload, goldens
# --------------------------------------------------------------------------------------


def special_ids(tok) -> dict:
    return {s: tok.token_to_id(s) for s in SPECIALS}


def generation_config(tok) -> dict:
    ids = special_ids(tok)
    return {
        "bos_token_id": ids[BOS],
        "eos_token_id": [ids[EOS], ids[IM_END]],
        "pad_token_id": ids[PAD],
        "do_sample": False,
        "transformers_version": __import__("transformers").__version__,
    }


def save_model_dir(model, out_dir: Path, config: dict, tok, max_shard_size=None, dtype=None) -> None:
    """save_pretrained, then replace config.json by the hub-style `config` we want to ship
    (transformers 5 would write `rope_parameters`; checkpoints in the wild carry
    `rope_theta` + `rope_scaling`), copy the tokenizer, write generation_config.json."""
    import torch

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    if dtype is not None:
        model = model.to(dtype)
    kwargs = {}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(str(out_dir), safe_serialization=True, **kwargs)
    for extra in ["generation_config.json"]:
        p = out_dir / extra
        if p.exists():
            p.unlink()
    write_json(out_dir / "config.json", config, sort_keys=True)
    write_json(out_dir / "generation_config.json", generation_config(tok), sort_keys=True)
    copy_tokenizer(out_dir)
    if dtype is not None:
        model.to(torch.float32)


def reload_model(out_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def golden_positions(n: int, count: int = GOLDEN_POSITIONS) -> list[int]:
    if n <= count:
        return list(range(n))
    return sorted(set(int(round(x)) for x in np.linspace(0, n - 1, count)))


def golden_prompts(tok) -> list[dict]:
    """Prompts shared by every model: short text, bos only, chat, medium, long (> 300)."""
    held = (TOK_DIR / "heldout.txt").read_text(encoding="utf-8")
    bos = tok.token_to_id(BOS)
    prompts = []

    def add(name, text, ids=None):
        if ids is None:
            ids = tok.encode(text, add_special_tokens=True).ids
        prompts.append({"name": name, "text": text, "ids": ids, "positions": golden_positions(len(ids))})

    add("short", "In the beginning God created the heaven and the earth.")
    add("bos_only", "", [bos])
    chat = f"{BOS}{IM_START}user\nWho is like unto the Lord?{IM_END}\n{IM_START}assistant\n"
    add("chat", chat, tok.encode(chat, add_special_tokens=False).ids)
    ids = tok.encode(held, add_special_tokens=False).ids
    medium = tok.decode(ids[:96])
    add("medium", medium)
    long_text = tok.decode(ids[2000:2420])
    add("long", long_text)
    for p in prompts:
        if p["name"] != "chat" and p["name"] != "bos_only":
            assert p["ids"][0] == bos
    assert len(prompts[-1]["ids"]) > 300
    return prompts


def greedy_reference(model, ids: list[int], n: int):
    """Plain argmax loop over full forwards: no logits processors. Returns (tokens, min margin
    between the best and second-best logit along the path)."""
    import torch

    seq = list(ids)
    out, margin = [], float("inf")
    with torch.no_grad():
        past = None
        inp = torch.tensor([seq])
        for _ in range(n):
            res = model(inp, past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits = res.logits[0, -1].float()
            top = torch.topk(logits, 2)
            margin = min(margin, float(top.values[0] - top.values[1]))
            t = int(top.indices[0])
            out.append(t)
            inp = torch.tensor([[t]])
    return out, margin


def write_goldens(model, tok, out_dir: Path, extra_note: str = "") -> dict:
    import torch
    from safetensors.torch import save_file

    prompts = golden_prompts(tok)
    ids_map = special_ids(tok)
    tensors = {}
    entries = []
    with torch.no_grad():
        for i, p in enumerate(prompts):
            ids = torch.tensor([p["ids"]])
            logits = model(ids, use_cache=False).logits[0].float()  # [T, vocab]
            tensors[f"logits_{i}"] = logits[p["positions"]].contiguous()
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=GREEDY_NEW_TOKENS,
                min_new_tokens=GREEDY_NEW_TOKENS,
                pad_token_id=ids_map[PAD],
                eos_token_id=[ids_map[EOS], ids_map[IM_END]],
                num_beams=1,
                repetition_penalty=None,
                temperature=None,
                top_p=None,
                top_k=None,
            )
            greedy = gen[0, ids.shape[1] :].tolist()
            plain, margin = greedy_reference(model, p["ids"], GREEDY_NEW_TOKENS)
            entries.append(
                {
                    "name": p["name"],
                    "text": p["text"],
                    "ids": p["ids"],
                    "positions": p["positions"],
                    "greedy": greedy,
                    "greedy_text": tok.decode(greedy, skip_special_tokens=False),
                    "greedy_equals_plain_argmax": greedy == plain,
                    "greedy_min_top2_margin": round(margin, 6),
                }
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "goldens.safetensors"), metadata={"format": "pt"})
    note = (
        "Logits from HF transformers "
        f"{__import__('transformers').__version__} (torch {torch.__version__}), eager attention, "
        "float32 compute, one causal forward over the whole prompt (no KV cache); "
        "goldens.safetensors logits_<i> is f32 [len(positions), vocab] for prompt i. "
        "Suggested check for an fp32 CPU implementation: |a-b| <= 1e-3 + 1e-3*|b| on logits "
        "(reduction order differs); bf16/quantized paths should compare by top-1 agreement and KL. "
        "'greedy' = generate(do_sample=False, max_new_tokens=40, min_new_tokens=40): the eos ids "
        "are masked out until 40 tokens, so it equals a plain argmax loop only where "
        "'greedy_equals_plain_argmax' is true; 'greedy_min_top2_margin' is the smallest "
        "top1-top2 logit gap along the path (near-ties can legitimately flip)."
    )
    if extra_note:
        note += " " + extra_note
    doc = {
        "model": out_dir.name,
        "vocab_size": VOCAB_SIZE,
        "bos_id": ids_map[BOS],
        "eos_ids": [ids_map[EOS], ids_map[IM_END]],
        "tolerance_note": note,
        "prompts": entries,
    }
    write_json(out_dir / "goldens.json", doc, indent=1)
    return doc


# --------------------------------------------------------------------------------------
# Tiny random-weight models
# --------------------------------------------------------------------------------------


def tiny_specs(tok) -> list[dict]:
    ids = special_ids(tok)
    common = {
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "initializer_range": 0.05,
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
        "use_cache": True,
        "torch_dtype": "float32",
        "transformers_version": __import__("transformers").__version__,
    }
    llama = {
        **common,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 128,
        "intermediate_size": 256,
        "head_dim": 32,
        "rms_norm_eps": 1e-5,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
    }
    return [
        {
            # llama3 scaling with original 256, theta 500000, head_dim 32: wavelengths < 64 are
            # kept, > 256 divided by 8, the ones between (pairs 3 and 4) interpolated smoothly.
            "name": "tiny-llama",
            "cls": "LlamaForCausalLM",
            "config": {
                **llama,
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 256,
                },
                "tie_word_embeddings": True,
            },
            "seed": 1001,
        },
        {
            "name": "tiny-llama-linear",
            "cls": "LlamaForCausalLM",
            "config": {
                **llama,
                "rope_theta": 10000.0,
                "rope_scaling": {"type": "linear", "factor": 2.0},
                "tie_word_embeddings": False,
            },
            "seed": 1002,
            "max_shard_size": "2MB",
        },
        {
            "name": "tiny-mistral",
            "cls": "MistralForCausalLM",
            "config": {
                **common,
                "model_type": "mistral",
                "architectures": ["MistralForCausalLM"],
                "hidden_size": 128,
                "intermediate_size": 256,
                "head_dim": 32,
                "rms_norm_eps": 1e-5,
                "rope_theta": 1000000.0,
                "sliding_window": None,
                "attention_dropout": 0.0,
                "tie_word_embeddings": False,
            },
            "seed": 1003,
        },
        {
            "name": "tiny-qwen2",
            "cls": "Qwen2ForCausalLM",
            "config": {
                **common,
                "model_type": "qwen2",
                "architectures": ["Qwen2ForCausalLM"],
                "hidden_size": 128,
                "intermediate_size": 256,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0,
                "use_sliding_window": False,
                "sliding_window": None,
                "max_window_layers": 2,
                "attention_dropout": 0.0,
                "tie_word_embeddings": True,
            },
            "seed": 1004,
        },
        {
            # head_dim 32 != hidden 96 / 4 heads: q_proj is [128, 96], o_proj [96, 128].
            "name": "tiny-qwen3",
            "cls": "Qwen3ForCausalLM",
            "config": {
                **common,
                "model_type": "qwen3",
                "architectures": ["Qwen3ForCausalLM"],
                "hidden_size": 96,
                "intermediate_size": 192,
                "head_dim": 32,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0,
                "attention_bias": False,
                "use_sliding_window": False,
                "sliding_window": None,
                "max_window_layers": 2,
                "attention_dropout": 0.0,
                "tie_word_embeddings": True,
            },
            "seed": 1005,
        },
    ]


def randomize_(model, seed: int, embed_std: float = 0.05, proj_std: float = 0.1) -> None:
    """Deterministic random weights: embeddings/lm_head N(0, embed_std), projections
    N(0, proj_std), norm weights U(0.7, 1.3) except the final norm U(3, 5), biases N(0, 0.1). Parameters are visited in
    name order; tied tensors once. The projections are large next to the embeddings so the
    layers, not the input token, dominate the residual stream (with tied embeddings a weak
    residual makes every step predict its own input token); the large final norm spreads the
    logits (std ~2) so greedy top-1/top-2 gaps are not at float32 noise level."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    seen = set()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if name == "model.norm.weight":
                p.copy_(3.0 + 2.0 * torch.rand(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(0.7 + 0.6 * torch.rand(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(embed_std * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(proj_std * torch.randn(p.shape, generator=gen))


def check_reload(model, reloaded, spec) -> None:
    import torch

    a = model.state_dict()
    b = reloaded.state_dict()
    assert a.keys() == b.keys(), (a.keys() ^ b.keys())
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rp = reloaded.config.rope_parameters
    want = spec["config"].get("rope_scaling") or {}
    want_type = want.get("rope_type", want.get("type", "default"))
    assert rp["rope_type"] == want_type, rp
    assert float(rp["rope_theta"]) == spec["config"]["rope_theta"], rp
    for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if k in want:
            assert rp[k] == want[k], (k, rp)


def make_tiny_models() -> None:
    import torch
    import transformers

    torch.set_num_threads(2)
    tok = load_tokenizer()
    for spec in tiny_specs(tok):
        name = spec["name"]
        out_dir = MODELS_DIR / name
        cfg_dict = {k: v for k, v in spec["config"].items() if k not in ("architectures", "transformers_version", "torch_dtype", "model_type")}
        cfg_cls = getattr(transformers, spec["cls"].replace("ForCausalLM", "Config"))
        rope_scaling = cfg_dict.pop("rope_scaling", None)
        rope = {"rope_type": "default", "rope_theta": cfg_dict.pop("rope_theta")}
        if rope_scaling:
            rope.update({k: v for k, v in rope_scaling.items() if k != "type"})
            rope["rope_type"] = rope_scaling.get("rope_type", rope_scaling.get("type"))
        config = cfg_cls(**cfg_dict, rope_parameters=rope)
        config._attn_implementation = "eager"
        torch.manual_seed(spec["seed"])
        model = getattr(transformers, spec["cls"])(config).eval()
        randomize_(model, spec["seed"])
        save_model_dir(model, out_dir, spec["config"], tok, max_shard_size=spec.get("max_shard_size"))
        reloaded = reload_model(out_dir)
        check_reload(model, reloaded, spec)
        doc = write_goldens(reloaded, tok, out_dir)
        nparams = sum(p.numel() for p in reloaded.parameters())
        size = sum(f.stat().st_size for f in out_dir.iterdir())
        firsts = [p["greedy"][:8] for p in doc["prompts"]]
        log(f"{name}: {nparams} params, dir {size/1e6:.2f} MB, greedy heads {firsts}")
        for p in doc["prompts"]:
            distinct = len(set(p["greedy"]))
            if distinct < 4:
                log(f"  WARNING {name}/{p['name']}: only {distinct} distinct greedy tokens")


# --------------------------------------------------------------------------------------
# hack-tiny: a small Llama trained on the KJV
# --------------------------------------------------------------------------------------

HACK_TINY = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rope_theta": 10000.0,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
}


def hack_tiny_config(tok) -> dict:
    ids = special_ids(tok)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        **HACK_TINY,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "transformers_version": __import__("transformers").__version__,
    }


def corpus_tokens(tok, books) -> np.ndarray:
    """Books concatenated as bos text eos bos text eos ..."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    out = []
    for enc in tok.encode_batch([t for _, t in books], add_special_tokens=False):
        out.append(bos)
        out.extend(enc.ids)
        out.append(eos)
    return np.asarray(out, dtype=np.int64)


def line_starts(tok, books) -> np.ndarray:
    """Indices into corpus_tokens() of tokens that start a line (after a newline)."""
    starts = []
    base = 0
    for enc, (_, text) in zip(tok.encode_batch([t for _, t in books], add_special_tokens=False), books):
        base += 1  # bos
        for j, (s, _) in enumerate(enc.offsets):
            if s == 0 or text[s - 1] == "\n":
                if s < len(text) and text[s] != "\n":
                    starts.append(base + j)
        base += len(enc.ids) + 1
    return np.asarray(starts, dtype=np.int64)


def heldout_windows(tok, ctx: int) -> list[list[int]]:
    """heldout.txt as non-overlapping windows [bos] + ctx-1 tokens (a shorter last window)."""
    ids = tok.encode((TOK_DIR / "heldout.txt").read_text(encoding="utf-8"), add_special_tokens=False).ids
    bos = tok.token_to_id(BOS)
    return [[bos] + ids[i : i + ctx - 1] for i in range(0, len(ids), ctx - 1) if len(ids[i : i + ctx - 1]) > 1]


def perplexity(model, windows, autocast=False) -> tuple[float, int]:
    import torch

    total, n = 0.0, 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        for w in windows:
            x = torch.tensor([w])
            logits = model(x, use_cache=False).logits[0, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum")
            total += float(loss)
            n += len(w) - 1
    return math.exp(total / n), n


def unigram_perplexity(train_ids: np.ndarray, windows) -> float:
    counts = np.bincount(train_ids, minlength=VOCAB_SIZE).astype(np.float64) + 1.0  # add-one
    logp = np.log(counts / counts.sum())
    targets = np.concatenate([np.asarray(w[1:]) for w in windows])
    return float(np.exp(-logp[targets].mean()))


def lr_at(progress: float, step: int, peak: float, warmup_steps: int, floor: float = 0.1) -> float:
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train_hack_tiny(train_minutes: float, train_steps: int | None, threads: int, autocast: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(1234)
    rng = np.random.default_rng(1234)
    tok = load_tokenizer()
    books = load_kjv()
    train_books, _ = split_corpus(books)
    data = corpus_tokens(tok, train_books)
    starts = line_starts(tok, train_books)
    bos = tok.token_to_id(BOS)
    log(f"hack-tiny: {len(data)} training tokens, {len(starts)} line starts")

    cfg_json = hack_tiny_config(tok)
    cfg = {k: v for k, v in cfg_json.items() if k not in ("architectures", "model_type", "transformers_version", "torch_dtype", "rope_scaling", "rope_theta")}
    config = LlamaConfig(**cfg, rope_parameters={"rope_type": "default", "rope_theta": HACK_TINY["rope_theta"]})
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    model.train()
    nparams = sum(p.numel() for p in model.parameters())
    log(f"hack-tiny: {nparams} parameters")

    use_bf16 = autocast == "bf16"
    if autocast == "auto":
        use_bf16 = bench_autocast(model, threads)
    log(f"hack-tiny: bf16 autocast {'on' if use_bf16 else 'off'}")

    peak_lr, warmup = 2e-3, 60
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=peak_lr, betas=(0.9, 0.95), eps=1e-8,
    )
    tokens_per_step = 8192
    long_from = 0.55  # progress at which sequences switch from 256 to 1024 tokens
    eval_windows = heldout_windows(tok, 256)[:12]
    budget_s = train_minutes * 60.0
    t0 = time.time()
    step, tokens_seen = 0, 0
    history, evals = [], []
    ema = None

    def progress_now():
        if train_steps:
            return step / train_steps
        return (time.time() - t0) / budget_s

    def run_eval():
        model.eval()
        ppl, _ = perplexity(model, eval_windows, autocast=use_bf16)
        model.train()
        return math.log(ppl)

    while True:
        prog = progress_now()
        if prog >= 1.0:
            break
        seq = 256 if prog < long_from else 1024
        batch = tokens_per_step // seq
        lr = lr_at(prog, step, peak_lr, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        # every window: bos, then seq tokens starting at a random line start
        idx = rng.choice(starts[starts < len(data) - seq - 1], size=batch)
        x = np.stack([np.concatenate([[bos], data[i : i + seq]]) for i in idx])
        x = torch.from_numpy(x)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += batch * seq
        lv = loss.item()
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        elapsed = time.time() - t0
        rec = {"step": step, "tokens": tokens_seen, "seq_len": seq, "lr": round(lr, 6), "train_loss": round(lv, 4), "elapsed_s": round(elapsed, 1)}
        if step % 50 == 0:
            rec["eval_loss"] = round(run_eval(), 4)
            evals.append(rec)
        history.append(rec)
        if step % 10 == 0 or "eval_loss" in rec:
            log(f"step {step} seq {seq} lr {lr:.2e} loss {lv:.3f} (ema {ema:.3f}) tokens {tokens_seen} {elapsed:.0f}s" + (f" eval {rec['eval_loss']}" if "eval_loss" in rec else ""))
    train_s = time.time() - t0
    final_eval = run_eval()
    log(f"hack-tiny: done, {step} steps, {tokens_seen} tokens, {train_s:.0f}s, eval loss {final_eval:.3f}")

    model.eval()
    save_model_dir(model, HACK_TINY_DIR, cfg_json, tok, dtype=torch.bfloat16)
    write_json(
        HACK_TINY_DIR / "training_log.json",
        {
            "config": {"tokens_per_step": tokens_per_step, "peak_lr": peak_lr, "warmup_steps": warmup,
                        "schedule": "linear warmup, cosine to 10% over the time budget",
                        "seq_len": f"256 until {long_from:.0%} of the budget, then 1024 (+bos)",
                        "optimizer": "AdamW betas (0.9, 0.95) wd 0.1 (matrices only), clip 1.0",
                        "bf16_autocast": use_bf16, "threads": threads, "train_minutes": train_minutes,
                        "train_steps": train_steps, "seed": 1234},
            "summary": {"steps": step, "tokens": tokens_seen, "train_s": round(train_s, 1),
                        "final_train_loss_ema": round(ema, 4), "final_eval_loss": round(final_eval, 4),
                        "train_tokens_in_corpus": int(len(data)), "epochs": round(tokens_seen / len(data), 3)},
            "steps": history,
        },
        indent=None,
    )
    finish_hack_tiny(tok, train_books, step, tokens_seen, train_s, ema, use_bf16, nparams)


def reevaluate_hack_tiny() -> None:
    """Re-run the post-training steps on the saved checkpoint: rewrite config.json and
    generation_config.json, measure perplexity, write goldens and README (no training)."""
    import torch

    torch.set_num_threads(2)
    tok = load_tokenizer()
    train_books, _ = split_corpus(load_kjv())
    log_doc = json.loads((HACK_TINY_DIR / "training_log.json").read_text())
    summ, conf = log_doc["summary"], log_doc["config"]
    write_json(HACK_TINY_DIR / "config.json", hack_tiny_config(tok), sort_keys=True)
    write_json(HACK_TINY_DIR / "generation_config.json", generation_config(tok), sort_keys=True)
    copy_tokenizer(HACK_TINY_DIR)
    nparams = sum(p.numel() for p in reload_model(HACK_TINY_DIR).parameters())
    finish_hack_tiny(tok, train_books, summ["steps"], summ["tokens"], summ["train_s"],
                     summ["final_train_loss_ema"], conf["bf16_autocast"], nparams)


def bench_autocast(model, threads) -> bool:
    import torch

    x = torch.randint(0, VOCAB_SIZE, (8, 257))
    times = {}
    for on in (False, True):
        ts = []
        for _ in range(3):
            t = time.time()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
                logits = model(x[:, :-1], use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), x[:, 1:].reshape(-1))
            loss.backward()
            ts.append(time.time() - t)
        model.zero_grad(set_to_none=True)
        times[on] = min(ts[1:])
    log(f"hack-tiny: step time f32 {times[False]:.2f}s, bf16 autocast {times[True]:.2f}s (8x256)")
    return times[True] < 0.85 * times[False]


def finish_hack_tiny(tok, train_books, steps, tokens, train_s, ema, use_bf16, nparams) -> None:
    """Reload the saved bf16 checkpoint in f32 (what a loader sees), measure, write goldens and README."""
    model = reload_model(HACK_TINY_DIR)
    data = corpus_tokens(tok, train_books)
    w512 = heldout_windows(tok, 512)
    w1024 = heldout_windows(tok, 1024)
    ppl512, n512 = perplexity(model, w512)
    ppl1024, n1024 = perplexity(model, w1024)
    uni = unigram_perplexity(data, w1024)
    log(f"hack-tiny: held-out ppl ctx512 {ppl512:.2f} ctx1024 {ppl1024:.2f} unigram {uni:.1f}")
    doc = write_goldens(model, tok, HACK_TINY_DIR, extra_note="Weights are bf16 on disk, upcast to f32 for compute.")
    samples = []
    for prompt in ["And God said,", "The LORD is my shepherd;", "In the beginning was the Word,"]:
        ids = tok.encode(prompt, add_special_tokens=True).ids
        out, _ = greedy_reference(model, ids, 48)
        samples.append((prompt, tok.decode(out)))
    evals = [r for r in json.loads((HACK_TINY_DIR / "training_log.json").read_text())["steps"] if "eval_loss" in r]
    weight_bytes = sum(f.stat().st_size for f in HACK_TINY_DIR.glob("*.safetensors") if f.name != "goldens.safetensors")
    cfg = json.loads((HACK_TINY_DIR / "config.json").read_text())
    emb = VOCAB_SIZE * cfg["hidden_size"]
    lines = [
        "# hack-tiny",
        "",
        "A small Llama-architecture model (`LlamaForCausalLM`) trained from scratch on the King James",
        "Bible by `scripts/make_fixtures.py --only hack-tiny` (CPU, PyTorch + HF transformers). It exists so",
        "hackserve has a real model, with real attention patterns and long-context behaviour, that fits",
        "in the repository: quality tests (KV compression vs uncompressed: KL, top-1 agreement,",
        "perplexity) and end-to-end runs use it. It knows nothing but KJV prose.",
        "",
        "## Shape",
        "",
        "| | |",
        "|---|---|",
        f"| layers | {cfg['num_hidden_layers']} |",
        f"| hidden | {cfg['hidden_size']} |",
        f"| heads / kv heads / head_dim | {cfg['num_attention_heads']} / {cfg['num_key_value_heads']} / {cfg['head_dim']} |",
        f"| MLP (SwiGLU) intermediate | {cfg['intermediate_size']} |",
        f"| vocab | {cfg['vocab_size']} (tests/fixtures/tokenizers/kjv-bpe) |",
        f"| RoPE | theta {cfg['rope_theta']:g}, no scaling, max positions {cfg['max_position_embeddings']} |",
        "| embeddings | tied (`lm_head.weight` absent from the checkpoint) |",
        f"| parameters | {nparams:,} ({emb:,} in the embedding) |",
        f"| weights on disk | {weight_bytes:,} bytes, bfloat16 safetensors |",
        "",
        "## Training",
        "",
        f"- {steps} steps, {tokens:,} tokens ({tokens / len(data):.2f} epochs of the {len(data):,}-token training split),",
        f"  {train_s / 60:.1f} minutes on a 2-core CPU, bf16 autocast {'on' if use_bf16 else 'off'}.",
        "- Every sequence is bos followed by text starting at a random line; 256 tokens for the first",
        "  part of the budget, 1024 tokens after that (so positions up to 1024 are trained).",
        "- AdamW (0.9, 0.95), weight decay 0.1, peak LR 2e-3, warmup then cosine to 10 %, clip 1.0.",
        f"- Final train loss (EMA) {ema:.3f}. Per-step log: `training_log.json`.",
        "- Held-out eval loss (first 12 windows of 256 tokens of heldout.txt) during training: "
        + ", ".join(f"step {e['step']}: {e['eval_loss']:.2f}" for e in evals) + ".",
        "",
        "## Quality (held-out: `tests/fixtures/tokenizers/kjv-bpe/heldout.txt`, books never trained on)",
        "",
        "Non-overlapping windows of bos + (ctx-1) tokens, f32 compute from the bf16 checkpoint:",
        "",
        "| | perplexity | tokens scored |",
        "|---|---|---|",
        f"| context 512 | {ppl512:.2f} | {n512} |",
        f"| context 1024 | {ppl1024:.2f} | {n1024} |",
        f"| unigram baseline (add-one counts of the training split) | {uni:.1f} | {n1024} |",
        "",
        "## Greedy samples",
        "",
    ]
    for prompt, text in samples:
        lines += ["```", prompt + text, "```", ""]
    lines += [
        "## Loader notes",
        "",
        "- Weights are bfloat16 (`torch_dtype` bfloat16); tensor names are the standard HF Llama ones",
        "  (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`,",
        "  `model.layers.{i}.mlp.{gate,up,down}_proj.weight`, `model.layers.{i}.{input,post_attention}_layernorm.weight`,",
        "  `model.norm.weight`); `lm_head.weight` is absent (tied: use `model.embed_tokens.weight`).",
        "- RoPE is the HF `rotate_half` convention (pairs i and i + head_dim/2), as in every HF Llama checkpoint.",
        "- Prompts should start with bos (4091): training always had bos at position 0.",
        "",
        "## Files",
        "",
        "- `config.json`, `generation_config.json`, `model.safetensors` (HF format)",
        "- `tokenizer.json`, `tokenizer_config.json` (copies of kjv-bpe)",
        "- `goldens.json`, `goldens.safetensors`: HF logits and greedy continuations (see the",
        "  `tolerance_note` inside)",
        "- `training_log.json`",
        "",
    ]
    (HACK_TINY_DIR / "README.md").write_text("\n".join(lines), encoding="utf-8")
    log(f"hack-tiny: weights {weight_bytes} bytes; samples: {samples}")


# --------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["tokenizer", "tiny", "hack-tiny", "hack-tiny-eval"],
                    help="one stage; hack-tiny-eval redoes hack-tiny's configs, perplexity, goldens "
                    "and README from the saved checkpoint without training")
    ap.add_argument("--train-minutes", type=float, default=25.0, help="hack-tiny wall-clock budget (default 25)")
    ap.add_argument("--train-steps", type=int, default=None, help="fixed step count instead of the time budget")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--autocast", choices=["auto", "bf16", "off"], default="auto",
                    help="bf16 autocast for hack-tiny training (auto: measure, use if faster)")
    args = ap.parse_args()

    if args.only in (None, "tokenizer"):
        make_tokenizer(load_kjv())
    if args.only in (None, "tiny"):
        make_tiny_models()
    if args.only in (None, "hack-tiny"):
        train_hack_tiny(args.train_minutes, args.train_steps, args.threads, args.autocast)
    if args.only == "hack-tiny-eval":
        reevaluate_hack_tiny()
    return 0


if __name__ == "__main__":
    sys.exit(main())
