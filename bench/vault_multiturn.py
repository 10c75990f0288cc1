#!/usr/bin/env python3
"""Prefix-cache hit rate on a multi-turn chat workload, real processes (tests/e2e/cluster.py):
hack-vault + 2 hack-prefill + 1 hack-decode + hack-router, SmolLM2-135M-Instruct by default.

C conversations share one long system prompt; each runs T turns through
/v1/chat/completions (the client sends the whole history as text each turn, as chat clients
do). Per request, the prefill nodes' metrics give the blocks restored (local or vault) and the
full blocks of the prompt that could have been; the hit rate is restored / restorable.

    python3 bench/vault_multiturn.py [--model models/smollm2-135m-instruct] [--conversations 4] [--turns 4]
"""

import argparse
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))

SYSTEM = ("You are a careful assistant for a library of old texts. " * 6 +
          "Rules: answer briefly; quote the text when asked; never invent verses; say when you do not know. " * 8)
QUESTIONS = ["Who wrote the first book?", "Summarise it in one sentence.", "What comes next?",
             "Name one person in it.", "Why does it matter?", "Give a short quote."]


def chat(port, model, messages, max_tokens):
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    return out["choices"][0]["message"]["content"], out["usage"]["prompt_tokens"]


def restored(nodes):
    total = 0.0
    for n in nodes:
        m = n.metrics()
        total += sum(m.get(f'hack:prefix_cache_hits_total{{tier="{t}"}}', 0.0) for t in ("local", "vault"))
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/smollm2-135m-instruct")
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ["HACK_MODEL"] = os.path.abspath(args.model)
    import cluster
    model = os.path.basename(os.path.abspath(args.model))
    with cluster.Cluster(prefill=2, decode=1, vault=True, threads=args.threads,
                         node_flags=["--prefill-chunk", "64"]) as c:
        histories = [[{"role": "system", "content": SYSTEM}] for _ in range(args.conversations)]
        hit_blocks = possible = 0
        t0 = time.monotonic()
        for turn in range(args.turns):
            turn_hits = turn_possible = 0
            for i, h in enumerate(histories):
                h.append({"role": "user", "content": QUESTIONS[(i + turn) % len(QUESTIONS)]})
                before = restored(c.prefill)
                answer, prompt_tokens = chat(c.router.port, model, h, args.max_tokens)
                got = restored(c.prefill) - before
                can = (prompt_tokens - 1) // 64
                turn_hits += got
                turn_possible += can
                h.append({"role": "assistant", "content": answer})
            print(f"turn {turn + 1}: {turn_hits:.0f} of {turn_possible} restorable blocks restored "
                  f"({100 * turn_hits / max(turn_possible, 1):.0f} %)", flush=True)
            hit_blocks += turn_hits
            possible += turn_possible
        print(f"{model}: {args.conversations} conversations x {args.turns} turns, hit rate "
              f"{100 * hit_blocks / max(possible, 1):.1f} % of restorable blocks ({hit_blocks:.0f}/{possible}); "
              f"{time.monotonic() - t0:.1f} s; vault holds {c.vault.health()['store']['blocks']} blocks")


if __name__ == "__main__":
    main()
