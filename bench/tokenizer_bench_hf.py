#!/usr/bin/env python3
"""HF tokenizers' single-thread encode throughput on bench/tokenizer_bench's corpus: the
bound hack's tokenizer_bench is compared with.

    TOKENIZERS_PARALLELISM=false python3 bench/tokenizer_bench_hf.py [--tokenizer DIR]... [--corpus FILE]
        [--chunk-bytes N] [--repeat N]

Builds the same corpus the same way (or reads --corpus, e.g. one written by
`tokenizer_bench --corpus-out FILE`) and prints its FNV-1a hash: compare it with the C++
bench's. Each document is one Tokenizer.encode(doc, add_special_tokens=False) call (not
encode_batch), so a single thread does the work.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")
from tokenizers import Tokenizer, __version__ as tokenizers_version  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def build_corpus() -> bytes:
    try:
        corpus = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        corpus = b""
    if len(corpus) < 1_000_000:
        print("tokenizer_bench_hf: `bible` not available; using kjv-bpe/heldout.txt", file=sys.stderr)
        corpus = (REPO / "tests/fixtures/tokenizers/kjv-bpe/heldout.txt").read_bytes()
    parts = [corpus]
    for name in ("qwen3", "mistral", "kjv-bpe"):
        golden = json.loads((REPO / f"tests/fixtures/tokenizers/goldens/{name}.json").read_text(encoding="utf-8"))
        parts.extend(c["text"].encode("utf-8") + b"\n" for c in golden["encode"])
    return b"".join(parts)


def split_documents(corpus: bytes, chunk_bytes: int) -> list[bytes]:
    docs, start = [], 0
    while start < len(corpus):
        end = start + chunk_bytes
        if end >= len(corpus):
            end = len(corpus)
        else:
            nl = corpus.find(b"\n", end)
            end = len(corpus) if nl < 0 else nl + 1
        docs.append(corpus[start:end])
        start = end
    return docs


def fnv1a(data: bytes) -> int:
    h = 1469598103934665603
    for c in data:
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", action="append", default=[])
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--chunk-bytes", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    dirs = args.tokenizer or [str(REPO / "tests/fixtures/shared/tokenizers/qwen3"),
                              str(REPO / "tests/fixtures/shared/tokenizers/mistral"),
                              str(REPO / "tests/fixtures/tokenizers/kjv-bpe")]
    corpus = args.corpus.read_bytes() if args.corpus else build_corpus()
    # The C++ bench cuts at byte offsets; both cut after '\n', so documents are valid UTF-8.
    docs = [d.decode("utf-8") for d in split_documents(corpus, args.chunk_bytes)]
    print(f"cpu: {cpu_model()} (1 thread), tokenizers {tokenizers_version}\n"
          f"corpus: {len(corpus) / 1e6:.2f} MB, {len(docs)} documents of ~{args.chunk_bytes} bytes, "
          f"fnv1a {fnv1a(corpus):016x}")
    for d in dirs:
        t0 = time.perf_counter()
        tok = Tokenizer.from_file(str(Path(d) / "tokenizer.json"))
        load_s = time.perf_counter() - t0
        best, tokens = float("inf"), 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            tokens = sum(len(tok.encode(doc, add_special_tokens=False).ids) for doc in docs)
            best = min(best, time.perf_counter() - t0)
        print(f"{d}: load {load_s:.2f} s | encode {len(corpus) / best / 1e6:.2f} MB/s, {tokens / best:.0f} tokens/s "
              f"({tokens} tokens, {len(corpus) / tokens:.2f} bytes/token, best of {args.repeat})")


if __name__ == "__main__":
    main()
