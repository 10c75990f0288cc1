#!/usr/bin/env python3
"""hack-bench: load harness for an OpenAI-compatible endpoint (hack-router, or any other).

Sends N streaming requests, at most C at a time, either as fast as the concurrency allows
(closed loop) or arriving as a Poisson process of --rate requests/s (open loop, still capped
at C in flight). Prompts are synthetic and distinct per request (no shared prefix):

  ids   a list of L random token ids (completions endpoint; exact length, no tokenizer
        needed; ids drawn from --id-range, clear of the model's special tokens)
  text  random words; a probe request first measures tokens per word on the server's
        tokenizer (usage.prompt_tokens) so prompts come out at about L tokens
        (completions or chat; chat adds the template's tokens)

Every request streams with max_tokens M, greedy by default, EOS ignored by default (vLLM's
`ignore_eos`, so every request produces M tokens) and stream_options.include_usage, so
token counts come from the server. Per request it records:

  TTFT  send -> first chunk carrying text (chat's role-only chunk is not a token)
  ITL   gaps between consecutive content chunks (one chunk per token unless the server
        merges text, e.g. held back for stop strings or split UTF-8)
  TPOT  (last content chunk - first) / (completion tokens - 1)
  JCT   send -> end of stream (job completion time)

With --rate, TTFT and JCT count from each request's arrival, so time spent waiting for a
free slot under the -c cap is included. Reports p50 / p90 / p99 / mean of each, throughput
(completed requests/s, output and prompt tokens/s over the run's wall time), and errors by
message. With --node-health it
also reads kv_bytes_transferred from the nodes' GET /health before and after the run and
reports KV bytes per request (the delta of each node over the completed requests).

  python3 bench/hack_bench.py --base-url http://127.0.0.1:8000/v1 -n 200 -c 8 \\
      --prompt-tokens 512 --max-tokens 64 [--rate 4] [--json out.json]

Uses Python's standard library and the official `openai` package (AsyncOpenAI).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field

import openai

WORDS = (
    "the of and to in that he shall unto for his a lord they be is him not them it with all thou thy "
    "was which my me said but ye their have will thee from as are when this out were upon man by you "
    "israel king son up there hath then people came had house into on her come one we children s "
    "before your also day land men go against made no let even if hand so saith do went at brought "
    "us father say our these God every now sons after because or hast should away over may things "
    "make words brother water light evening morning river mountain stone bread wine field city gate"
).split()


@dataclass
class Result:
    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float = 0.0
    jct_s: float = 0.0
    tpot_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    start_s: float = 0.0  # since the run's start


def percentiles(values: list[float], scale: float = 1e3) -> dict:
    if not values:
        return {"n": 0}
    v = sorted(x * scale for x in values)

    def pct(p: float) -> float:
        r = p / 100 * (len(v) - 1)
        lo, hi = math.floor(r), math.ceil(r)
        return v[lo] + (v[hi] - v[lo]) * (r - lo)

    return {"n": len(v), "p50": pct(50), "p90": pct(90), "p99": pct(99), "mean": sum(v) / len(v), "max": v[-1]}


def make_prompts(args, n: int, words_per_token: float) -> list:
    rng = random.Random(args.seed)
    lo, hi = args.id_range
    prompts = []
    for _ in range(n):
        if args.prompt_mode == "ids":
            prompts.append([rng.randrange(lo, hi) for _ in range(args.prompt_tokens)])
        else:
            count = max(1, round(args.prompt_tokens * words_per_token))
            prompts.append(" ".join(rng.choice(WORDS) for _ in range(count)))
    return prompts


def request_kwargs(args, prompt, max_tokens: int, stream: bool) -> dict:
    kw = dict(model=args.model, max_tokens=max_tokens, temperature=args.temperature, stream=stream)
    if stream:
        kw["stream_options"] = {"include_usage": True}
    extra = {}
    if args.ignore_eos:
        extra["ignore_eos"] = True
    if extra:
        kw["extra_body"] = extra
    if args.endpoint == "chat":
        kw["messages"] = [{"role": "user", "content": prompt}]
    else:
        kw["prompt"] = prompt
    return kw


async def one_request(client, args, prompt, t_run: float, t_arrival: float | None = None) -> Result:
    """t_arrival: open-loop arrival time (TTFT and JCT then include waiting for a free slot)."""
    res = Result()
    t0 = time.perf_counter() if t_arrival is None else t_arrival
    res.start_s = t0 - t_run
    api = client.chat.completions if args.endpoint == "chat" else client.completions
    first = last = any_chunk = None
    try:
        stream = await api.create(**request_kwargs(args, prompt, args.max_tokens, True))
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                res.prompt_tokens = chunk.usage.prompt_tokens
                res.completion_tokens = chunk.usage.completion_tokens
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            text = (c.delta.content if args.endpoint == "chat" else c.text) or ""
            if any_chunk is None:
                any_chunk = now
            if text:  # chat's first chunk carries only the role: not a token
                if first is None:
                    first = now
                if last is not None:
                    res.itl_s.append(now - last)
                last = now
        t1 = time.perf_counter()
        if first is None:  # tokens that decoded to no text (e.g. special tokens)
            first = any_chunk
    except openai.APIStatusError as e:
        res.error = f"HTTP {e.status_code}: {str(e)[:160]}"
        return res
    except Exception as e:  # connection errors, timeouts, error chunks
        res.error = f"{type(e).__name__}: {str(e)[:160]}"
        return res
    if first is None:
        res.error = "stream ended without a token"
        return res
    res.ok = True
    res.ttft_s = first - t0
    res.jct_s = t1 - t0
    if res.completion_tokens > 1 and last is not None:
        res.tpot_s = (last - first) / (res.completion_tokens - 1)
    if args.ignore_eos and res.completion_tokens not in (0, args.max_tokens):
        res.ok = False
        res.error = f"{res.completion_tokens} completion tokens, expected {args.max_tokens}"
    return res


def read_health(urls: list[str]) -> dict:
    out = {}
    for u in urls:
        with urllib.request.urlopen(u, timeout=5) as r:
            out[u] = json.load(r).get("kv_bytes_transferred", 0)
    return out


async def calibrate_words_per_token(client, args) -> float:
    """Tokens of a known word count on the server's tokenizer (usage.prompt_tokens)."""
    n = 400
    rng = random.Random(args.seed + 1)
    text = " ".join(rng.choice(WORDS) for _ in range(n))
    api = client.chat.completions if args.endpoint == "chat" else client.completions
    r = await api.create(**request_kwargs(args, text, 1, False))
    overhead = 0
    if args.endpoint == "chat":  # template tokens around an empty-ish message
        r0 = await api.create(**request_kwargs(args, "a", 1, False))
        overhead = max(0, r0.usage.prompt_tokens - 1)
    return n / max(1, r.usage.prompt_tokens - overhead)


async def run(args) -> dict:
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=args.timeout)
    if not args.model:
        models = await client.models.list()
        args.model = models.data[0].id
    words_per_token = 1.0
    if args.prompt_mode == "text":
        words_per_token = await calibrate_words_per_token(client, args)
    prompts = make_prompts(args, args.num_requests + args.warmup, words_per_token)

    sem = asyncio.Semaphore(args.concurrency)

    async def guarded(p, t_run):
        t_arrival = time.perf_counter() if args.rate else None
        async with sem:
            return await one_request(client, args, p, t_run, t_arrival)

    if args.warmup:
        await asyncio.gather(*(guarded(p, time.perf_counter()) for p in prompts[: args.warmup]))
    prompts = prompts[args.warmup :]

    health_before = read_health(args.node_health) if args.node_health else {}
    rng = random.Random(args.seed + 2)
    t_run = time.perf_counter()
    tasks = []
    for i, p in enumerate(prompts):
        if args.rate and i > 0:
            await asyncio.sleep(rng.expovariate(args.rate))
        tasks.append(asyncio.create_task(guarded(p, t_run)))
    results: list[Result] = await asyncio.gather(*tasks)
    wall = time.perf_counter() - t_run
    health_after = read_health(args.node_health) if args.node_health else {}
    await client.close()

    ok = [r for r in results if r.ok]
    errors = Counter(r.error for r in results if not r.ok)
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    summary = {
        "config": {
            "base_url": args.base_url,
            "model": args.model,
            "endpoint": args.endpoint,
            "num_requests": args.num_requests,
            "concurrency": args.concurrency,
            "rate": args.rate or None,
            "prompt_mode": args.prompt_mode,
            "prompt_tokens_target": args.prompt_tokens,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "ignore_eos": args.ignore_eos,
            "seed": args.seed,
            "label": args.label,
        },
        "completed": len(ok),
        "errors": sum(errors.values()),
        "error_messages": dict(errors.most_common(5)),
        "wall_s": wall,
        "requests_per_s": len(ok) / wall,
        "output_tokens_per_s": out_tokens / wall,
        "prompt_tokens_per_s": in_tokens / wall,
        "prompt_tokens_mean": in_tokens / len(ok) if ok else 0,
        "completion_tokens_mean": out_tokens / len(ok) if ok else 0,
        "ttft_ms": percentiles([r.ttft_s for r in ok]),
        "tpot_ms": percentiles([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl_ms": percentiles([x for r in ok for x in r.itl_s]),
        "jct_ms": percentiles([r.jct_s for r in ok]),
    }
    if args.node_health:
        deltas = {u: health_after[u] - health_before[u] for u in args.node_health}
        summary["kv_bytes"] = {
            u: {"total": d, "per_request": d / len(ok) if ok else 0} for u, d in deltas.items()
        }
    if args.per_request:
        summary["requests"] = [asdict(r) for r in results]
    return summary


def print_report(s: dict) -> None:
    c = s["config"]
    load = f"rate {c['rate']}/s (Poisson), at most {c['concurrency']} in flight" if c["rate"] else f"concurrency {c['concurrency']}"
    print(f"hack-bench{' [' + c['label'] + ']' if c['label'] else ''}: {c['base_url']} model {c['model']} "
          f"({c['endpoint']}), {c['num_requests']} requests, {load}")
    print(f"  prompt {c['prompt_mode']} ~{c['prompt_tokens_target']} tokens (mean {s['prompt_tokens_mean']:.0f}), "
          f"max_tokens {c['max_tokens']} (mean {s['completion_tokens_mean']:.1f}), temperature {c['temperature']}, "
          f"ignore_eos {c['ignore_eos']}")
    print(f"  completed {s['completed']}, errors {s['errors']}, wall {s['wall_s']:.2f} s")
    for msg, n in s["error_messages"].items():
        print(f"    {n} x {msg}")
    print(f"  throughput: {s['requests_per_s']:.2f} req/s, {s['output_tokens_per_s']:.1f} output tok/s, "
          f"{s['prompt_tokens_per_s']:.0f} prompt tok/s")
    print()
    print("| ms | p50 | p90 | p99 | mean | max | n |")
    print("|---|---|---|---|---|---|---|")
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"), ("jct_ms", "JCT")):
        p = s[key]
        if p["n"]:
            print(f"| {name} | {p['p50']:.2f} | {p['p90']:.2f} | {p['p99']:.2f} | {p['mean']:.2f} | {p['max']:.2f} | {p['n']} |")
        else:
            print(f"| {name} | – | – | – | – | – | 0 |")
    for u, kv in s.get("kv_bytes", {}).items():
        print(f"  KV bytes sent ({u}): {kv['total']} total, {kv['per_request']:.0f} per request")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="OpenAI API base URL")
    p.add_argument("--api-key", default="EMPTY", help="Bearer key (the router's --api-key, if any)")
    p.add_argument("--model", default="", help="model name; default: the first of /v1/models")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("-n", "--num-requests", type=int, default=100, help="measured requests")
    p.add_argument("-c", "--concurrency", type=int, default=8, help="requests in flight at most")
    p.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: closed loop)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length L in tokens (about, for text)")
    p.add_argument("--prompt-mode", choices=("ids", "text"), default="ids")
    p.add_argument("--id-range", default="100:4000", help="LO:HI, token ids of --prompt-mode ids are in [LO, HI)")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens M per request")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let requests end at EOS (default: ignore_eos, every request makes M tokens)")
    p.add_argument("--warmup", type=int, default=0, help="unmeasured requests first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600, help="per-request timeout, seconds")
    p.add_argument("--node-health", action="append", default=[], metavar="URL",
                   help="a node's /health URL (repeatable): report its kv_bytes_transferred per request")
    p.add_argument("--label", default="", help="free text carried into the report")
    p.add_argument("--json", metavar="PATH", help="also write the summary as JSON ('-': to stdout instead of the table)")
    p.add_argument("--per-request", action="store_true", help="include every request's timings in the JSON")
    args = p.parse_args(argv)
    lo, hi = (int(x) for x in args.id_range.split(":"))
    if not 0 <= lo < hi:
        p.error("--id-range must be LO:HI with 0 <= LO < HI")
    args.id_range = (lo, hi)
    if args.prompt_mode == "ids" and args.endpoint == "chat":
        p.error("--prompt-mode ids needs --endpoint completions")
    if args.num_requests < 1 or args.concurrency < 1 or args.max_tokens < 1 or args.prompt_tokens < 1:
        p.error("-n, -c, --max-tokens and --prompt-tokens must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    summary = asyncio.run(run(args))
    if args.json == "-":
        json.dump(summary, sys.stdout, indent=2)
        print()
    else:
        print_report(summary)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2)
    return 0 if summary["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
