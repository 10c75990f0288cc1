#!/usr/bin/env python3
"""hack-load: a load sweep against an OpenAI-compatible server (hack-router, vLLM, llama.cpp's
server), in the manner of `vllm bench serve` and guidellm: one run per request rate (Poisson
arrivals, optional gamma burstiness) or per concurrency, each reporting TTFT, TPOT, ITL and
E2E latency (mean, median, p90, p99), request and token throughput and goodput under SLOs,
written as JSON with `vllm bench serve`'s key names (so its plotting scripts read it) and as
PNG plots.

Datasets (token-exact prompts as random ids on the completions endpoint, so no tokenizer is
needed and every server sees the same lengths):
  random     input/output lengths uniform in [L·(1−r), L·(1+r)] (--input-len, --output-len,
             --range-ratio r), as vLLM's random dataset
  sharegpt   lengths drawn from a ShareGPT-shaped log-normal (medians 220 in / 180 out
             tokens, clipped to --max-input-len / --max-output-len), for a realistic mix
             without the file; --sharegpt-file FILE.json takes the real conversations'
             first human turn and first reply lengths instead (prompts sent as text, chat)

  python3 bench/load/hack_load.py --base-url http://127.0.0.1:8000/v1 --rates 0.5,1,2 \\
      -n 40 --dataset random --input-len 128 --output-len 32 --out-dir bench/load/out
  python3 bench/load/hack_load.py --concurrency-sweep 1,2,4 ...   (closed loop per point)

Each request streams with ignore_eos (so it produces its output length) and temperature 0.
Uses hack_bench.py's request loop (bench/hack_bench.py: timing definitions there).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import hack_bench  # noqa: E402  (one_request, percentiles: the timing definitions live there)
import openai  # noqa: E402


def lengths(args, n: int) -> list[tuple[int, int]]:
    """(input tokens, output tokens) per request."""
    rng = random.Random(args.seed)
    out = []
    if args.dataset == "random":
        for _ in range(n):
            lo_in, hi_in = max(1, int(args.input_len * (1 - args.range_ratio))), int(args.input_len * (1 + args.range_ratio))
            lo_out, hi_out = max(1, int(args.output_len * (1 - args.range_ratio))), int(args.output_len * (1 + args.range_ratio))
            out.append((rng.randint(lo_in, max(lo_in, hi_in)), rng.randint(lo_out, max(lo_out, hi_out))))
    elif args.sharegpt_file:
        with open(args.sharegpt_file) as f:
            convs = [c["conversations"] for c in json.load(f) if len(c.get("conversations", [])) >= 2]
        rng.shuffle(convs)
        # ~0.75 words per token: the lengths only; the prompts stay random ids of that length.
        for c in convs[:n]:
            out.append((min(args.max_input_len, max(4, int(len(c[0]["value"].split()) / 0.75))),
                        min(args.max_output_len, max(1, int(len(c[1]["value"].split()) / 0.75)))))
    else:  # ShareGPT-shaped: log-normal around the medians of the ShareGPT_V3 set's token counts
        for _ in range(n):
            out.append((min(args.max_input_len, max(4, int(rng.lognormvariate(math.log(220), 1.0)))),
                        min(args.max_output_len, max(1, int(rng.lognormvariate(math.log(180), 0.9))))))
    if len(out) < n:
        raise SystemExit(f"hack-load: the dataset gave {len(out)} requests, {n} asked for")
    return out


def arrivals(rate: float, burstiness: float, n: int, rng: random.Random) -> list[float]:
    """Inter-arrival gaps: gamma with shape `burstiness` and mean 1/rate (1 = Poisson)."""
    if rate <= 0:
        return [0.0] * n
    return [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(n)]


async def run_point(args, rate: float, concurrency: int) -> dict:
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=args.timeout)
    sizes = lengths(args, args.num_requests + args.warmup)
    rng = random.Random(args.seed + 1)
    lo, hi = args.id_range
    prompts = [[rng.randrange(lo, hi) for _ in range(i)] for i, _ in sizes]
    sem = asyncio.Semaphore(concurrency)

    def request_args(max_tokens: int):
        a = copy.copy(args)
        a.endpoint, a.max_tokens, a.temperature, a.ignore_eos = "completions", max_tokens, 0.0, True
        return a

    async def one(i: int, t_run: float, t_arrival: float | None):
        async with sem:
            return await hack_bench.one_request(client, request_args(sizes[i][1]), prompts[i], t_run, t_arrival)

    if args.warmup:
        await asyncio.gather(*(one(i, time.perf_counter(), None) for i in range(args.warmup)))
    gaps = arrivals(rate, args.burstiness, args.num_requests, random.Random(args.seed + 2))
    t_run = time.perf_counter()
    tasks = []
    for k in range(args.num_requests):
        if k > 0 and rate > 0:
            await asyncio.sleep(gaps[k])
        tasks.append(asyncio.create_task(one(args.warmup + k, t_run, time.perf_counter() if rate > 0 else None)))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - t_run
    await client.close()
    return summarize(args, rate, concurrency, duration, results, sizes[args.warmup:])


def stats(name: str, values_s: list[float]) -> dict:
    """vLLM's keys: mean_/median_/std_/p90_/p99_<name>_ms."""
    p = hack_bench.percentiles(values_s)
    if not p["n"]:
        return {f"{k}_{name}_ms": None for k in ("mean", "median", "std", "p90", "p99")}
    return {f"mean_{name}_ms": p["mean"], f"median_{name}_ms": p["p50"],
            f"std_{name}_ms": statistics.pstdev(v * 1e3 for v in values_s), f"p90_{name}_ms": p["p90"],
            f"p99_{name}_ms": p["p99"]}


def summarize(args, rate, concurrency, duration, results, sizes) -> dict:
    ok = [r for r in results if r.ok]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]

    def good(r) -> bool:
        return ((not args.slo_ttft_ms or r.ttft_s * 1e3 <= args.slo_ttft_ms)
                and (not args.slo_tpot_ms or (r.tpot_s or 0) * 1e3 <= args.slo_tpot_ms)
                and (not args.slo_e2e_ms or r.jct_s * 1e3 <= args.slo_e2e_ms))

    total_in = sum(r.prompt_tokens for r in ok)
    total_out = sum(r.completion_tokens for r in ok)
    s = {
        # vLLM bench serve's keys
        "date": time.strftime("%Y%m%d-%H%M%S"),
        "backend": "openai",
        "model_id": args.model,
        "request_rate": rate if rate > 0 else "inf",
        "burstiness": args.burstiness,
        "max_concurrency": concurrency,
        "num_prompts": args.num_requests,
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": sum(good(r) for r in ok) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        **stats("ttft", [r.ttft_s for r in ok]),
        **stats("tpot", tpot),
        **stats("itl", [x for r in ok for x in r.itl_s]),
        **stats("e2el", [r.jct_s for r in ok]),
        "input_lens": [r.prompt_tokens for r in results],
        "output_lens": [r.completion_tokens for r in results],
        "ttfts": [r.ttft_s for r in results],
        "itls": [r.itl_s for r in results],
        "errors": [r.error for r in results],
        # ours
        "dataset": args.dataset,
        "requested_input_lens": [i for i, _ in sizes],
        "requested_output_lens": [o for _, o in sizes],
        "start_s": [r.start_s for r in results],
        "e2els": [r.jct_s for r in results],
        "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms, "e2e_ms": args.slo_e2e_ms},
        "label": args.label,
    }
    return s


def plot(points: list[dict], sweep: str, out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p["request_rate"] if sweep == "rate" else p["max_concurrency"] for p in points]
    xlabel = "request rate (req/s, Poisson)" if sweep == "rate" else "max concurrency (closed loop)"
    paths = []

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (key, title) in zip(axes, (("ttft", "TTFT"), ("itl", "ITL"), ("e2el", "E2E latency"))):
        for q, style in (("median", "o-"), ("p90", "s--"), ("p99", "^:")):
            ax.plot(xs, [p[f"{q}_{key}_ms"] for p in points], style, label=q)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(out_dir, f"latency_vs_{sweep}.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.plot(xs, [p["output_throughput"] for p in points], "o-", label="output tokens/s")
    ax.plot(xs, [p["total_token_throughput"] for p in points], "s--", label="total tokens/s")
    ax2 = ax.twinx()
    ax2.plot(xs, [p["request_throughput"] for p in points], "^-", color="tab:green", label="requests/s")
    ax2.plot(xs, [p["request_goodput"] for p in points], "v:", color="tab:red", label="goodput (req/s in SLO)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("tokens/s")
    ax2.set_ylabel("requests/s")
    ax.grid(alpha=0.3)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    ax.set_title("Throughput")
    fig.tight_layout()
    paths.append(os.path.join(out_dir, f"throughput_vs_{sweep}.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for p, x in zip(points, xs):
        pairs = [(i, t * 1e3) for i, t, e in zip(p["input_lens"], p["ttfts"], p["errors"]) if not e]
        ax.scatter([a for a, _ in pairs], [b for _, b in pairs], s=10, label=f"{x}")
    ax.set_xlabel("input tokens")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title(f"TTFT vs input length (per {sweep})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "ttft_vs_input_len.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    p = points[-1]  # the heaviest point: where queueing shows
    fig, ax = plt.subplots(figsize=(8, 4.5))
    order = sorted(range(len(p["start_s"])), key=lambda i: p["start_s"][i])
    for row, i in enumerate(order):
        if p["errors"][i]:
            continue
        t0, ttft, e2e = p["start_s"][i], p["ttfts"][i], p["e2els"][i]
        ax.plot([t0, t0 + ttft], [row, row], color="tab:orange", lw=2)
        ax.plot([t0 + ttft, t0 + e2e], [row, row], color="tab:blue", lw=2)
    ax.set_xlabel("seconds since the run's start")
    ax.set_ylabel("request (by arrival)")
    ax.set_title(f"Request timeline at {sweep} {xs[-1]}: orange = waiting for the first token, blue = decoding")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "timeline.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", default="EMPTY")
    p.add_argument("--model", default="", help="default: the first of /v1/models")
    sweep = p.add_mutually_exclusive_group(required=True)
    sweep.add_argument("--rates", help="comma list of Poisson request rates (req/s), one run each")
    sweep.add_argument("--concurrency-sweep", help="comma list of concurrencies, closed loop, one run each")
    p.add_argument("--max-concurrency", type=int, default=64, help="in-flight cap during a rate sweep")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of inter-arrival gaps (1 = Poisson; <1 burstier)")
    p.add_argument("-n", "--num-requests", type=int, default=40, help="measured requests per point")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests before each point")
    p.add_argument("--dataset", choices=("random", "sharegpt"), default="random")
    p.add_argument("--sharegpt-file", help="ShareGPT-format JSON (lengths of first turn and reply)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--range-ratio", type=float, default=0.0, help="random: lengths uniform in L·(1±r)")
    p.add_argument("--max-input-len", type=int, default=1024, help="sharegpt: clip")
    p.add_argument("--max-output-len", type=int, default=256, help="sharegpt: clip")
    p.add_argument("--id-range", default="100:4000", help="LO:HI of the prompts' random token ids")
    p.add_argument("--slo-ttft-ms", type=float, default=0, help="goodput SLO on TTFT (0 = none)")
    p.add_argument("--slo-tpot-ms", type=float, default=0, help="goodput SLO on TPOT (0 = none)")
    p.add_argument("--slo-e2e-ms", type=float, default=0, help="goodput SLO on E2E latency (0 = none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--label", default="")
    p.add_argument("--out-dir", default="bench/load/out", help="results.json and the PNG plots go here")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    lo, hi = (int(x) for x in args.id_range.split(":"))
    args.id_range = (lo, hi)
    if not 0 <= args.range_ratio < 1:
        p.error("--range-ratio must be in [0, 1)")
    if args.dataset == "random" and (args.input_len < 1 or args.output_len < 1):
        p.error("--input-len and --output-len must be at least 1")
    return args


async def resolve_model(args):
    if not args.model:
        client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
        args.model = (await client.models.list()).data[0].id
        await client.close()


def main(argv=None) -> int:
    args = parse_args(argv)
    asyncio.run(resolve_model(args))
    if args.rates:
        sweep, values = "rate", [float(x) for x in args.rates.split(",")]
        runs = [(v, args.max_concurrency) for v in values]
    else:
        sweep, values = "concurrency", [int(x) for x in args.concurrency_sweep.split(",")]
        runs = [(0.0, v) for v in values]
    os.makedirs(args.out_dir, exist_ok=True)
    points = []
    print(f"hack-load: {args.base_url} model {args.model}, dataset {args.dataset}, {args.num_requests} requests per point")
    print("| rate | conc | ok | fail | req/s | goodput | out tok/s | TTFT p50/p90/p99 ms | ITL p50/p90/p99 ms | E2E p50/p90/p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rate, conc in runs:
        s = asyncio.run(run_point(args, rate, conc))
        points.append(s)

        def trio(k):
            return "/".join("–" if s[f"{q}_{k}_ms"] is None else f"{s[f'{q}_{k}_ms']:.0f}" for q in ("median", "p90", "p99"))

        print(f"| {s['request_rate']} | {conc} | {s['completed']} | {s['failed']} | {s['request_throughput']:.2f} | "
              f"{s['request_goodput']:.2f} | {s['output_throughput']:.1f} | {trio('ttft')} | {trio('itl')} | {trio('e2el')} |",
              flush=True)
    path = os.path.join(args.out_dir, "results.json")
    with open(path, "w") as f:
        json.dump({"sweep": sweep, "points": points}, f, indent=1)
    print(f"hack-load: wrote {path}")
    if not args.no_plots:
        for png in plot(points, sweep, args.out_dir):
            print(f"hack-load: wrote {png}")
    return 0 if all(p["failed"] == 0 for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
