#!/usr/bin/env python3
"""TTFT with and without prefix caching, real processes (tests/e2e/cluster.py): hack-vault,
one hack-prefill, one hack-decode, hack-router on loopback.

For each prefix length L: a fresh random L-token prefix (token ids, so L is exact) plus a
16-token suffix is sent cold; then the same prefix with another suffix is a hit (its last
partial block and the suffix are computed), and the cold prompt itself again is a repeat
(fully cached with the prefill node's tail cache: only its last token is computed; its first
token must equal the cold one's), and the cold prompt with 20 more tokens is an extension (a
conversation's next turn: with the tail cache only the 20 new tokens and the cold prompt's
last one are computed). Run twice:
with the prefill node's local cache (hit tier "local") and with --prefix-cache-bytes 0 (every
hit comes from the vault over UCX). TTFT here = latency of a max_tokens=1 completion (router →
prefill → first token; the decode node only admits). Medians of --repeats.

    python3 bench/vault_ttft.py --model models/smollm2-135m-instruct --lengths 1024,4096,8000
    python3 bench/vault_ttft.py --model models/hack-tiny --lengths 256,512,960

Prints one line per (tier, L) with cold and hit TTFT, the speedup, and the blocks the prefill
node restored (from its metrics, so a "hit" that did not restore is visible).
"""

import argparse
import json
import os
import random
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))


MODEL_NAME = None  # the served name: the model directory's name


def complete(port, ids):
    body = json.dumps({"model": MODEL_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        body = json.loads(r.read())
    return time.perf_counter() - t0, body["choices"][0]["text"]


def restored(node):
    m = node.metrics()
    out = {t: m.get(f'hack:prefix_cache_hits_total{{tier="{t}"}}', 0.0) for t in ("local", "vault")}
    out["restore_s"] = m.get("hack:vault_restore_seconds_sum", 0.0)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--lengths", default="1024,4096,8000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--codec", default="int8-head")
    ap.add_argument("--kv", default="hack")
    ap.add_argument("--prefill-flags", default="", help="extra hack-prefill flags, space-separated")
    ap.add_argument("--tiers", default="local,vault", help="which hit tiers to run: local, vault or both")
    ap.add_argument("--local-bytes", default="4G", help="--prefix-cache-bytes of the local tier's run")
    args = ap.parse_args()
    os.environ["HACK_MODEL"] = os.path.abspath(args.model)
    global MODEL_NAME
    MODEL_NAME = os.path.basename(os.path.abspath(args.model))
    import cluster  # reads HACK_MODEL

    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    rng = random.Random(7)
    lengths = [int(x) for x in args.lengths.split(",")]
    tiers = args.tiers.split(",")
    for tier, flags in (("local", ["--prefix-cache-bytes", args.local_bytes]), ("vault", ["--prefix-cache-bytes", "0"])):
        if tier not in tiers:
            continue
        with cluster.Cluster(vault=True, threads=args.threads, kv=args.kv, vault_flags=["--max-bytes", "8G"],
                             prefill_flags=[*flags, "--vault-codec", args.codec, "--vault-timeout", "30",
                                            *args.prefill_flags.split()]) as c:
            complete(c.router.port, [rng.randrange(100, vocab - 100) for _ in range(64)])  # warm up
            for n in lengths:
                cold, hit, repeat, extend, blocks, restore, same = [], [], [], [], [], [], 0
                for _ in range(args.repeats):
                    prefix = [rng.randrange(100, vocab - 100) for _ in range(n)]
                    prompt = prefix + [rng.randrange(100, vocab - 100) for _ in range(16)]
                    t_cold, text_cold = complete(c.router.port, prompt)
                    cold.append(t_cold)
                    if tier == "vault":
                        time.sleep(0.2)  # the stores are fire-and-forget: let them land
                    before = restored(c.prefill[0])
                    hit.append(complete(c.router.port, prefix + [rng.randrange(100, vocab - 100) for _ in range(16)])[0])
                    after = restored(c.prefill[0])
                    blocks.append(after[tier] - before[tier])
                    restore.append(after["restore_s"] - before["restore_s"])
                    t_repeat, text_repeat = complete(c.router.port, prompt)
                    repeat.append(t_repeat)
                    same += text_repeat == text_cold
                    extend.append(complete(c.router.port, prompt + [rng.randrange(100, vocab - 100) for _ in range(20)])[0])
                mc, mh, mr = statistics.median(cold), statistics.median(hit), statistics.median(repeat)
                me = statistics.median(extend)
                print(f"{os.path.basename(args.model.rstrip('/'))} kv={args.kv} codec={args.codec} tier={tier} "
                      f"prefix={n}: cold TTFT {mc * 1e3:.0f} ms, hit TTFT {mh * 1e3:.0f} ms, "
                      f"{mc / mh:.1f}x, blocks restored per hit {statistics.median(blocks):.0f} "
                      f"in {statistics.median(restore) * 1e3:.0f} ms (lookup, promote, applied to the cache) "
                      f"(of {n // 64}); repeat of the cold prompt {mr * 1e3:.0f} ms, {mc / mr:.1f}x, first token "
                      f"as cold in {same} of {len(repeat)}; extension by 20 tokens {me * 1e3:.0f} ms, "
                      f"{mc / me:.1f}x; runs cold {[round(x * 1e3) for x in cold]} "
                      f"hit {[round(x * 1e3) for x in hit]} repeat {[round(x * 1e3) for x in repeat]} "
                      f"extension {[round(x * 1e3) for x in extend]}",
                      flush=True)


if __name__ == "__main__":
    main()
