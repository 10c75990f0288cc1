#!/usr/bin/env python3
"""Encode / decode goldens for hack::Tokenizer, from Hugging Face `tokenizers`.

    python3 scripts/make_tokenizer_goldens.py [--count N] [--seed S] [--out DIR] NAME=SOURCE ...

SOURCE is `shared:<path>` (under tests/fixtures/shared, the in-repository copy of ../shared/fixtures) or
`repo:<path>` (inside the repository), a directory with tokenizer.json and
tokenizer_config.json. With no NAME=SOURCE arguments the default set is written:

    qwen3=shared:tokenizers/qwen3  mistral=shared:tokenizers/mistral
    kjv-bpe=repo:tests/fixtures/tokenizers/kjv-bpe  (when it exists)
    plus the variants below (fewer strings each)

Variants are real tokenizers with parts of tokenizer.json replaced, to cover components
the fixture tokenizers do not use (Metaspace, Digits, Split behaviours, NFKC, Replace
regex, ignore_merges, added tokens with lstrip / rstrip / single_word / normalized). The
golden file stores the patch; the C++ test applies it to the same base file.

With --verify-code-points BIN (a built hack-tokenize), nothing is written: every Unicode
scalar value c is put into one string "x{c}y {c}{c}1{c} a{c}\u0301'{c}s\n{c} " and the
ids of HF tokenizers and of `BIN --batch` are compared for each tokenizer directory
(1.1M strings each; this is how the Unicode tables of src/tokenizer were validated).

Output: tests/fixtures/tokenizers/goldens/<NAME>.json

    {"name", "source", "patch" (variants only), "tokenizers_version", "seed",
     "special_prefix": [...], "special_suffix": [...],   # encode(text, True) ==
                                                          #   prefix + ids + suffix
     "encode": [{"text", "ids", "lossy": true (only where decode(ids) != text),
                 "ids_special": [...] (only where the rule above does not hold)}],
     "decode": [{"ids" or "case", "text", "text_skip"}]}   # decode(ids, False / True); "case": the
                                                          # ids (with special tokens) of encode[case]

"With special tokens" follows transformers: when tokenizer_config.json sets add_bos_token
/ add_eos_token (or tokenizer.json has no post-processor) the post-processor becomes
TemplateProcessing "[bos] $A [eos]" as the flags say (TokenizersBackend in transformers
5). Strings are seeded and limited to characters assigned in Unicode 14 (PCRE2 10.42's
tables), so goldens do not depend on how each library treats newer characters.
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import unicodedata
from pathlib import Path

from tokenizers import Tokenizer, __version__ as tokenizers_version
from tokenizers import processors

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO / "tests" / "fixtures" / "shared"


def resolve(source: str) -> Path:
    kind, _, rel = source.partition(":")
    if kind == "shared":
        return SHARED / rel
    if kind == "repo":
        return REPO / rel
    raise SystemExit(f"bad source {source!r}: expected shared:<path> or repo:<path>")


# ---- variants ------------------------------------------------------------------------

def extra_tokens(base: dict, specs: list[dict]) -> list[dict]:
    """Added tokens appended after the base vocabulary."""
    next_id = max([*base["model"]["vocab"].values(), *(t["id"] for t in base.get("added_tokens", []))]) + 1
    out = []
    for i, s in enumerate(specs):
        t = {"id": next_id + i, "content": s["content"], "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": False}
        t.update(s)
        out.append(t)
    return out


LLAMA_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}

ADDED_FLAG_TOKENS = [
    {"content": "<tool>", "lstrip": True, "special": True},
    {"content": "</tool>", "rstrip": True, "special": True},
    {"content": "<pad>", "lstrip": True, "rstrip": True, "special": True},
    {"content": "cat", "single_word": True},
    {"content": "dog", "normalized": True},
    {"content": "hello world", "normalized": True},
    {"content": "<tool_call>", "special": True},
]


def variant_patches(base_name: str, base: dict) -> dict[str, dict]:
    """name -> patch for one base tokenizer. A patch replaces top-level keys of
    tokenizer.json; "added_tokens_extra" is appended to added_tokens; "model_extra"
    updates keys of "model"; "config_patch" sets keys of tokenizer_config.json (null
    deletes the key)."""
    v = {}
    if base_name == "mistral":
        v["mistral-metaspace"] = {
            "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
            "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
            "added_tokens_extra": extra_tokens(base, ADDED_FLAG_TOKENS),
        }
        v["mistral-split"] = {
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "NFKC"},
                {"type": "Replace", "pattern": {"Regex": "\\s*\\r\\n"}, "content": "\n"},
                {"type": "Strip", "strip_left": False, "strip_right": True}]},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "Split", "pattern": {"Regex": "[.,;:!?]+"}, "behavior": "MergedWithPrevious",
                 "invert": False},
                {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}]},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
                {"type": "ByteFallback"}, {"type": "Fuse"}]},
            "added_tokens_extra": extra_tokens(base, ADDED_FLAG_TOKENS),
            "config_patch": {"add_eos_token": True},
        }
    if base_name == "qwen3":
        v["qwen3-llama3"] = {
            # Llama 3's shape: ignore_merges, \p{N}{1,3}, ByteLevel without prefix space.
            "model_extra": {"ignore_merges": True},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex":
                    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
                    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        }
        v["qwen3-gpt2"] = {
            "normalizer": {"type": "NFKC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"String": "\n"}, "behavior": "MergedWithNext", "invert": False},
                {"type": "Split", "pattern": {"Regex": "\\p{N}+"}, "behavior": "Contiguous", "invert": True},
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]},
            "post_processor": {"type": "RobertaProcessing", "sep": ["<|im_end|>", 151645],
                               "cls": ["<|im_start|>", 151644], "trim_offsets": True, "add_prefix_space": True},
            "added_tokens_extra": extra_tokens(base, ADDED_FLAG_TOKENS),
            "config_patch": {"add_bos_token": None, "add_eos_token": None},
        }
        v["qwen3-removed"] = {
            "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"},
                                                               {"type": "Lowercase"}]},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed", "invert": False},
                {"type": "Punctuation", "behavior": "Isolated"},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            "post_processor": None,
        }
    return v


def apply_patch(base: dict, patch: dict) -> dict:
    tok = copy.deepcopy(base)
    for key, value in patch.items():
        if key == "config_patch":
            continue
        if key == "added_tokens_extra":
            tok["added_tokens"] = tok.get("added_tokens", []) + value
        elif key == "model_extra":
            tok["model"].update(value)
        else:
            tok[key] = value
    return tok


def load_hf(tokenizer_json: dict, config: dict) -> Tokenizer:
    tok = Tokenizer.from_str(json.dumps(tokenizer_json))
    # transformers' rule for the post-processor (see the module docstring).
    if "add_bos_token" in config or "add_eos_token" in config or tokenizer_json.get("post_processor") is None:
        def text(key):
            v = config.get(key)
            return v.get("content") if isinstance(v, dict) else v
        bos, eos = text("bos_token"), text("eos_token")
        add_bos = bool(config.get("add_bos_token")) and bos is not None and tok.token_to_id(bos) is not None
        add_eos = bool(config.get("add_eos_token")) and eos is not None and tok.token_to_id(eos) is not None
        single = (f"{bos}:0 " if add_bos else "") + "$A:0" + (f" {eos}:0" if add_eos else "")
        specials = ([(bos, tok.token_to_id(bos))] if add_bos else []) + ([(eos, tok.token_to_id(eos))] if add_eos else [])
        tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)
    return tok


# ---- string generation ---------------------------------------------------------------

def assigned_chars(ranges) -> list[str]:
    out = []
    for lo, hi in ranges:
        for cp in range(lo, hi + 1):
            c = chr(cp)
            if unicodedata.category(c) not in ("Cn", "Cs"):
                out.append(c)
    return out


SCRIPTS = {
    "latin": assigned_chars([(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F), (0x1E00, 0x1EFF)]),
    "greek": assigned_chars([(0x370, 0x3FF)]),
    "cyrillic": assigned_chars([(0x400, 0x4FF)]),
    "armenian_hebrew": assigned_chars([(0x531, 0x58A), (0x5D0, 0x5EA)]),
    "arabic": assigned_chars([(0x600, 0x6FF)]),
    "devanagari": assigned_chars([(0x900, 0x97F)]),
    "thai": assigned_chars([(0xE01, 0xE5B)]),
    "hangul": assigned_chars([(0xAC00, 0xD7A3), (0x1100, 0x11FF)]),
    "kana": assigned_chars([(0x3041, 0x30FF)]),
    "cjk": assigned_chars([(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF)]),
    "symbols": assigned_chars([(0x2000, 0x2BFF), (0x3000, 0x303F), (0xFF01, 0xFF5E)]),
    "emoji": assigned_chars([(0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF),
                             (0x2600, 0x27BF)]),
    "combining": assigned_chars([(0x300, 0x36F), (0x1AB0, 0x1ABE), (0x20D0, 0x20F0)]),
    "math_alnum": assigned_chars([(0x1D400, 0x1D7FF)]),
    "other_bmp": assigned_chars([(0xA0, 0xFFFD)]),
    "other_smp": assigned_chars([(0x10000, 0x1FFFF)]),
}
UNICODE_SPACES = ["\u00a0", "\u1680", "\u2000", "\u2003", "\u2007", "\u2009", "\u200a", "\u2028", "\u2029",
                  "\u202f", "\u205f", "\u3000", "\u0085", "\u180e", "\u200b", "\ufeff", "\x0b", "\x0c"]
CONTROL = [chr(c) for c in list(range(0, 32)) + [0x7F] + list(range(0x80, 0xA0))] + [
    "\u200c", "\u200d", "\u200e", "\u200f", "\u202a", "\u202e", "\u2066", "\u2069", "\ufeff", "\ufffd"]
EMOJI_SEQUENCES = [
    "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🇺🇸", "🇯🇵🇫🇷", "👍🏿", "❤️", "1️⃣", "#️⃣", "🧑‍🤝‍🧑", "😀😃😄", "🤖🚀", "✌🏻",
    "👁️‍🗨️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "☺️", "🫠", "⚽️", "🙇‍♀️"]
WORDS = ("the of and to in is was for on that with as by at from this be are have it not or an which but they "
         "all were when we there can been one has more their if will would about what so out up into than them "
         "some could time these two may then do first any my now such like our over man me even most made after "
         "also did many before must through back years where much your way well down should because each just "
         "those people how too little state good very make world still own see men work long get here between "
         "both life being under never day same another know while last might us great old year off come since "
         "against go came right used take three I you he she don't can't won't it's I'm they'll we've you'd "
         "HELLO World MiXeD CamelCase snake_case kebab-case SCREAMING_CASE iPhone eBay McDonald's O'Neil naïve "
         "café résumé coöperate façade Zürich São Paulo Ångström").split()
CODE_SNIPPETS = [
    "def f(x):\n    return x**2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <vector>\nint main() { std::vector<int> v{1,2,3}; return v.size(); }\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<div class=\"box\"><a href='https://example.com/a?b=c&d=e'>link</a></div>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "    if x != None and y == 0:\n        raise ValueError(f\"bad {x!r}\")\n",
    "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", vec![1u8; 4]); Ok(()) }",
    "const add = (a, b) => a + b; // arrow\nexport default add;\r\n",
    "$ ls -la /usr/bin | grep -E '^-rwx' | wc -l\n",
    "x=1;y=2;z=x+y\n\n\n\tprint(z)",
    "\tkey:\n\t\t- value1\n\t\t- value2\n",
    "a <<= 2; b >>= 3; c &&= d || e; f ??= g;",
    "// TODO: fix\n/* block\n   comment */\n",
    "    \n    \n",
    "```python\nimport numpy as np\nnp.zeros((3, 4), dtype=np.float32)\n```",
]


class Generator:
    def __init__(self, seed: int, prose_lines: list[str], specials: list[str]):
        self.r = random.Random(seed)
        self.prose = prose_lines
        self.specials = specials

    def chars(self, script: str, n: int) -> str:
        return "".join(self.r.choice(SCRIPTS[script]) for _ in range(n))

    def words(self, n: int) -> str:
        return " ".join(self.r.choice(WORDS) for _ in range(n))

    def number(self) -> str:
        r = self.r
        k = r.randrange(7)
        if k == 0:
            return str(r.randrange(10 ** r.randrange(1, 25)))
        if k == 1:
            return f"{r.uniform(-1e6, 1e6):.{r.randrange(0, 8)}f}"
        if k == 2:
            return f"{r.randrange(1900, 2100)}-{r.randrange(1, 13):02d}-{r.randrange(1, 29):02d}"
        if k == 3:
            return f"+1 ({r.randrange(100, 999)}) {r.randrange(100, 999)}-{r.randrange(1000, 9999)}"
        if k == 4:
            return f"{r.randrange(10**6):,}"
        if k == 5:
            return "".join(r.choice("0123456789") for _ in range(r.randrange(30, 120)))
        return r.choice(["٣٤٥", "१२३", "๑๒๓", "①②③", "½¾", "²³", "Ⅻ", "1e-9", "0x1F", "3.14159"])

    def whitespace(self) -> str:
        r = self.r
        pool = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "\r", " \n ", "\t\t", "    "] + UNICODE_SPACES
        return "".join(r.choice(pool) for _ in range(r.randrange(1, 8)))

    def special_lookalike(self) -> str:
        r = self.r
        s = r.choice(self.specials) if self.specials else "<s>"
        k = r.randrange(6)
        if k == 0:
            return s
        if k == 1:
            return s[: r.randrange(1, max(2, len(s)))]
        if k == 2:
            return s[r.randrange(1, max(2, len(s))):]
        if k == 3:
            return s.upper() if s.lower() == s else s.lower()
        if k == 4:
            return " " + s + " "
        return r.choice(["<|im_start", "<|im_end|", "|>", "<s>", "</s>", "<unk>", "<0x41>", "<0xE2><0x82>",
                         "[INST]", "[/INST]", "<|endoftext|>", "<<SYS>>", "<|", "<think>", "</think>",
                         "<tool>", "</tool>", "<pad>", "cat", "dog", "hello world", "concatenate", "dogma",
                         "hotdog", "<tool_call>"])

    def combining(self) -> str:
        r = self.r
        base = r.choice("aeiouAEIOUnNcCsSzZ")
        marks = "".join(r.choice(SCRIPTS["combining"]) for _ in range(r.randrange(1, 4)))
        s = base + marks
        return unicodedata.normalize(r.choice(["NFC", "NFD", "NFKC", "NFKD"]), s) if r.random() < 0.5 else s

    def fragment(self) -> str:
        r = self.r
        k = r.randrange(20)
        if k < 4:
            return self.words(r.randrange(1, 12))
        if k == 4:
            return r.choice(self.prose)
        if k == 5:
            return r.choice(CODE_SNIPPETS)
        if k == 6:
            return self.number()
        if k == 7:
            return self.whitespace()
        if k == 8:
            return r.choice(EMOJI_SEQUENCES) * r.randrange(1, 3)
        if k == 9:
            return self.chars(r.choice(["cjk", "kana", "hangul"]), r.randrange(1, 15))
        if k == 10:
            return self.chars(r.choice(["arabic", "armenian_hebrew", "cyrillic", "greek", "devanagari", "thai"]),
                              r.randrange(1, 15))
        if k == 11:
            return self.combining()
        if k == 12:
            return "".join(r.choice(CONTROL) for _ in range(r.randrange(1, 4)))
        if k == 13:
            return self.special_lookalike()
        if k == 14:
            return r.choice(["'s", "'S", "'LL", "'Ve", "'d", "'ſ", "'K", "' s", "''", "'re'"])
        if k == 15:
            return self.chars(r.choice(["symbols", "emoji", "math_alnum", "other_bmp", "other_smp", "latin"]),
                              r.randrange(1, 10))
        if k == 16:
            return r.choice(["https://", "www.", "user@example.com", "C:\\Users\\x", "/usr/local/bin", "#tag",
                             "@mention", "a.b.c", "--flag=value", "%20", "&amp;", "\\n", "\\u00e9"])
        if k == 17:
            return self.chars("latin", r.randrange(1, 6)) + self.chars("combining", 1)
        if k == 18:
            return r.choice(["!", "?", "...", "—", "–", "«", "»", "“", "”", "‘", "’", "、", "。", "！", "¿", "¡"])
        return self.words(1).upper()

    def separator(self) -> str:
        r = self.r
        return r.choices(["", " ", "\n", "  ", "\t", "\r\n", ", "], weights=[4, 10, 3, 1, 1, 1, 2])[0]

    def long_string(self) -> str:
        r = self.r
        k = r.randrange(5)
        if k == 0:
            return r.choice(["a", "b", " ", "ab", "\n"]) * r.randrange(100, 1000)
        if k == 1:
            return "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randrange(100, 400)))
        if k == 2:
            return " " * r.randrange(50, 300) + "x" + "\n" * r.randrange(10, 60)
        if k == 3:
            return "".join(r.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
                           for _ in range(r.randrange(100, 300))) + "=="
        return self.chars("cjk", r.randrange(50, 150))

    def string(self) -> str:
        r = self.r
        k = r.random()
        if k < 0.01:
            return ""
        if k < 0.025:
            return self.long_string()
        if k < 0.06:
            return r.choice(self.prose)
        n = r.choices([1, 2, 3, 4, 6, 8], weights=[5, 4, 3, 2, 1, 1])[0]
        parts = []
        for _ in range(n):
            parts.append(self.fragment())
            parts.append(self.separator())
        s = "".join(parts)
        if r.random() < 0.1:
            s = " " + s
        if r.random() < 0.1:
            s = s + r.choice([" ", "\n", "  ", "\t"])
        return s


FIXED_STRINGS = [
    "", " ", "  ", "\n", "\r\n", "\t", "a", "Hello, world!", "Hello world", " Hello", "Hello ",
    "I'm can't won't they'll we've", "The year 2026 has 365 days; 1234567890 digits.",
    "naïve café résumé", "nai\u0308ve cafe\u0301 re\u0301sume\u0301", "日本語のテキストと中文文本",
    "emoji 🤖🚀 and flags 🇺🇸", "\u0000\u0001 control", "Ünïcödé ÄÖÜ ß", "Привет, мир", "مرحبا بالعالم",
    "こんにちは世界", "<|endoftext|> literal special?", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start", "<s>", "</s>", "<s> <s>", "a<s>b", "<unk>", "[INST] hi [/INST]", "  leading and trailing spaces  ",
    "      many      spaces      ", "\r\n windows line", "x" * 3000, "ﬁ ﬂ ﬃ ㎏ ℌ Ⅳ ①", "한국어 텍스트", "हिन्दी पाठ",
    "\u00a0nbsp\u00a0", "\u3000ideographic\u3000", "a\u180eb", "a\u0085b", "a\u2028b", "\ufeffbom",
    "<tool> x </tool>  y", "  <pad>  ", "cat concatenate cat's dog hotdog", "hello world", "hello  world",
    "'S 'LL 'ſ 'K", "1,234,567.89", "٣٤٥ १२३", "\t\t\tindented", "line\n\n\n\nbreaks", "trailing   ",
]


def make_cases(tok: Tokenizer, strings: list[str], prefix: list[int], suffix: list[int]) -> list[dict]:
    cases = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False).ids
        ids_special = tok.encode(s, add_special_tokens=True).ids
        case = {"text": s, "ids": ids}
        if tok.decode(ids, skip_special_tokens=False) != s:
            case["lossy"] = True
        if ids_special != prefix + ids + suffix:
            case["ids_special"] = ids_special
        cases.append(case)
    return cases


def make_decode_cases(tok: Tokenizer, r: random.Random, encode_cases: list[dict], prefix: list[int],
                      suffix: list[int], vocab_size: int,
                      special_ids: list[int], byte_ids: list[int], n_from_encode: int, n_random: int) -> list[dict]:
    out = []
    picks = r.sample(range(len(encode_cases)), min(n_from_encode, len(encode_cases)))
    for i in sorted(picks):
        out.append({"case": i})  # the case's ids with special tokens
    for _ in range(n_random):
        n = r.randrange(1, 40)
        ids = []
        for _ in range(n):
            k = r.random()
            if k < 0.5 or not (special_ids or byte_ids):
                ids.append(r.randrange(vocab_size))
            elif k < 0.65 and special_ids:
                ids.append(r.choice(special_ids))
            elif k < 0.95 and byte_ids:
                ids.append(r.choice(byte_ids))
            else:
                ids.append(r.randrange(vocab_size, vocab_size + 100))  # no such token: skipped
        out.append({"ids": ids})
    for d in out:
        if "case" in d:
            c = encode_cases[d["case"]]
            ids = c.get("ids_special") or prefix + c["ids"] + suffix
        else:
            ids = d["ids"]
        d["text"] = tok.decode(ids, skip_special_tokens=False)
        d["text_skip"] = tok.decode(ids, skip_special_tokens=True)
    return out


def write_goldens(name: str, source: str, patch: dict | None, count: int, n_decode: int, n_random_decode: int,
                  seed: int, out_dir: Path, prose: list[str]) -> None:
    root = resolve(source)
    base = json.loads((root / "tokenizer.json").read_text(encoding="utf-8"))
    config_path = root / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
    tok_json = apply_patch(base, patch) if patch else base
    for key, value in (patch or {}).get("config_patch", {}).items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    tok = load_hf(tok_json, config)
    if patch and "added_tokens_extra" in patch:
        # HF assigns added-token ids itself (vocab id if present, else the next free one);
        # record those so the patch reads true.
        patch = copy.deepcopy(patch)
        for t in patch["added_tokens_extra"]:
            t["id"] = tok.token_to_id(t["content"])

    special_ids = sorted({t["id"] for t in tok_json.get("added_tokens", []) if t.get("special")})
    specials = [t["content"] for t in tok_json.get("added_tokens", [])]
    vocab = tok.get_vocab(with_added_tokens=True)
    vocab_size = max(vocab.values()) + 1
    byte_ids = sorted(i for t, i in vocab.items() if len(t) == 6 and t.startswith("<0x") and t.endswith(">"))
    if not byte_ids:
        # Byte-level vocabularies: the single-byte characters of bytes 0x80..0xFF split UTF-8.
        byte_ids = sorted(i for t, i in vocab.items() if len(t) == 1 and 0xA1 <= ord(t) <= 0x143)

    probe = tok.encode("", add_special_tokens=True).ids
    empty = tok.encode("", add_special_tokens=False).ids
    assert empty == [], empty
    # prefix / suffix of the template: split the empty string's special ids around "x".
    x_plain = tok.encode("x", add_special_tokens=False).ids
    x_special = tok.encode("x", add_special_tokens=True).ids
    at = next(i for i in range(len(x_special) - len(x_plain) + 1) if x_special[i:i + len(x_plain)] == x_plain)
    prefix, suffix = x_special[:at], x_special[at + len(x_plain):]
    assert probe == prefix + suffix, (probe, prefix, suffix)

    gen = Generator(seed, prose, specials)
    strings = list(FIXED_STRINGS)
    seen = set(strings)
    while len(strings) < count:
        s = gen.string()
        if s not in seen:
            seen.add(s)
            strings.append(s)
    cases = make_cases(tok, strings, prefix, suffix)
    decode_cases = make_decode_cases(tok, random.Random(seed + 1), cases, prefix, suffix, vocab_size, special_ids,
                                     byte_ids,
                                     n_decode, n_random_decode)
    doc = {"name": name, "source": source, "tokenizers_version": tokenizers_version, "seed": seed,
           "generator": "scripts/make_tokenizer_goldens.py"}
    if patch:
        doc["patch"] = patch
    doc.update({"special_prefix": prefix, "special_suffix": suffix, "encode": cases, "decode": decode_cases})
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    lossless = sum(not c.get("lossy") for c in cases)
    print(f"{path}: {len(cases)} encode cases ({lossless} lossless), {len(decode_cases)} decode "
          f"cases, {path.stat().st_size / 1e6:.2f} MB", file=sys.stderr)


def verify_code_points(binary: str, name: str, source: str) -> int:
    """Encodes one string per Unicode scalar value with HF and with `binary --batch`."""
    import subprocess
    root = resolve(source)
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    texts = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        texts.append(f"x{c}y {c}{c}1{c} a{c}\u0301'{c}s\n{c} ")
    hf = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    run = subprocess.run([binary, "--tokenizer", str(root), "--batch"], input=json.dumps(texts).encode(),
                         capture_output=True, check=True)
    ours = json.loads(run.stdout)
    bad = [(t, h, o) for t, h, o in zip(texts, hf, ours) if h != o]
    print(f"{name}: {len(texts)} strings, {len(bad)} differ", file=sys.stderr)
    for t, h, o in bad[:10]:
        print(f"  {t!r}: HF {h} ours {o}", file=sys.stderr)
    return len(bad)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tokenizers", nargs="*", help="NAME=SOURCE (shared:<path> or repo:<path>)")
    ap.add_argument("--count", type=int, default=10000, help="encode strings per tokenizer")
    ap.add_argument("--variant-count", type=int, default=2500, help="encode strings per variant")
    ap.add_argument("--decode", type=int, default=1000, help="decode cases taken from the encode cases")
    ap.add_argument("--random-decode", type=int, default=1000, help="decode cases of random id sequences")
    ap.add_argument("--seed", type=int, default=20260101)
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--verify-code-points", metavar="BIN", help="compare with hack-tokenize on every code point")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "tokenizers" / "goldens")
    args = ap.parse_args()

    specs = [t.split("=", 1) for t in args.tokenizers]
    if not specs:
        specs = [["qwen3", "shared:tokenizers/qwen3"], ["mistral", "shared:tokenizers/mistral"]]
        if (REPO / "tests/fixtures/tokenizers/kjv-bpe/tokenizer.json").exists():
            specs.append(["kjv-bpe", "repo:tests/fixtures/tokenizers/kjv-bpe"])
    prose_path = REPO / "tests/fixtures/tokenizers/kjv-bpe/heldout.txt"
    prose = [l for l in prose_path.read_text(encoding="utf-8").splitlines() if l.strip()] if prose_path.exists() \
        else [" ".join(WORDS[i:i + 12]) for i in range(0, len(WORDS), 12)]

    if args.verify_code_points:
        sys.exit(1 if sum(verify_code_points(args.verify_code_points, n, s) for n, s in specs) else 0)
    for index, (name, source) in enumerate(specs):
        seed = args.seed + 1000 * index
        write_goldens(name, source, None, args.count, args.decode, args.random_decode, seed, args.out, prose)
        if args.no_variants:
            continue
        base = json.loads((resolve(source) / "tokenizer.json").read_text(encoding="utf-8"))
        for vi, (vname, patch) in enumerate(variant_patches(name, base).items()):
            write_goldens(vname, source, patch, args.variant_count, args.decode // 4, args.random_decode // 4,
                          seed + 100 + vi, args.out, prose)


if __name__ == "__main__":
    main()
