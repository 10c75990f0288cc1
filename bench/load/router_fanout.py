#!/usr/bin/env python3
"""router_fanout: N concurrent streaming clients through one hack-router (issue 35's "1,000
concurrent streaming clients"): every stream must complete; the router's thread count and RSS
are sampled from /proc every 50 ms (peak reported), and the clients' inter-token latency and
TTFT percentiles are reported. With --rate, clients arrive open-loop (Poisson) for --duration
seconds instead (the overload check: how many get 429 with Retry-After, how fast, and the
TTFT of those admitted).

Starts its own 1P1D cluster (tests/e2e/cluster.py: hack-tiny unless HACK_MODEL, binaries from
HACK_BUILD_DIR or build/), or measures a running router with --url and --router-pid.
Clients are raw asyncio HTTP/1.1 connections (standard library only, so 1,000 of them cost
the client little CPU): POST /v1/completions with stream, ignore_eos, token-id prompts.

  python3 bench/load/router_fanout.py --clients 1000 --prompt-tokens 32 --max-tokens 16
  HACK_MODEL=models/smollm2-135m-instruct python3 bench/load/router_fanout.py --rate 20 --duration 30 \
      --router-flag=--max-queue-tokens=512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "e2e"))


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))]


class ProcSampler(threading.Thread):
    """Peak Threads and VmRSS of one process, from /proc/PID/status."""

    def __init__(self, pid, period_s=0.05):
        super().__init__(daemon=True)
        self.pid, self.period_s = pid, period_s
        self.peak_threads = self.peak_rss_kb = 0
        self.start_threads = self.start_rss_kb = None
        self._halt = threading.Event()

    def sample(self):
        threads = rss = 0
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    threads = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        return threads, rss

    def run(self):
        while not self._halt.is_set():
            try:
                t, r = self.sample()
            except OSError:
                return
            if self.start_threads is None:
                self.start_threads, self.start_rss_kb = t, r
            self.peak_threads = max(self.peak_threads, t)
            self.peak_rss_kb = max(self.peak_rss_kb, r)
            time.sleep(self.period_s)

    def stop(self):
        self._halt.set()
        self.join()


class Stream:
    def __init__(self):
        self.ok = False
        self.error = ""
        self.status = 0
        self.retry_after = False  # a refusal carried Retry-After
        self.answer_s = None      # request sent -> status line (a refusal's latency)
        self.ttft_s = None
        self.itl = []
        self.chunks = 0


async def one_stream(host, port, body: bytes, timeout_s: float, abort_after: int = 0) -> Stream:
    """abort_after > 0: the client hangs up after that many chunks (an abort storm); the
    stream then counts as ok."""
    res = Stream()
    r = await _one_stream(host, port, body, timeout_s, abort_after, res)
    res.ok, res.error, res.ttft_s, res.itl, res.chunks = r
    return res


async def _one_stream(host, port, body, timeout_s, abort_after, res):
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except Exception as e:  # noqa: BLE001 - any connect failure is this stream's error
        return False, f"connect: {type(e).__name__}: {e}", None, [], 0
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (host.encode(), port, len(body)) + body)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
        status = int(head.split(b" ", 2)[1])
        res.status = status
        res.answer_s = time.perf_counter() - t0
        if status != 200:
            res.retry_after = b"\r\nretry-after:" in head.lower()
            rest = await asyncio.wait_for(reader.read(), timeout_s)
            return False, f"HTTP {status}: {rest[:200]!r}", None, [], 0
        first = last = None
        itl = []
        tokens = 0
        done = False
        buf = b""
        while not done:
            chunk = await asyncio.wait_for(reader.read(65536), timeout_s)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    line = line.strip()
                    # chunked framing: size lines and the final 0 are not data lines
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    msg = json.loads(data)
                    if "error" in msg:
                        return False, f"error event: {msg['error']}", None, itl, tokens
                    if msg.get("choices"):
                        now = time.perf_counter()
                        tokens += 1
                        if first is None:
                            first = now
                        else:
                            itl.append(now - last)
                        last = now
                        if abort_after and tokens >= abort_after:
                            writer.transport.abort()  # RST, as a killed client
                            return True, "", first - t0, itl, tokens
        if not done:
            return False, "stream ended without [DONE]", None, itl, tokens
        return True, "", (first - t0) if first else None, itl, tokens
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}", None, [], 0
    finally:
        writer.close()


async def run_clients(args, host, port):
    rng = random.Random(args.seed)
    bodies = []
    n = args.clients if not args.rate else int(args.rate * args.duration)
    for _ in range(n):
        prompt = [rng.randrange(100, 400) for _ in range(args.prompt_tokens)]
        bodies.append(json.dumps({"model": args.model, "prompt": prompt, "max_tokens": args.max_tokens,
                                  "temperature": 0, "ignore_eos": True, "stream": True}).encode())
    t0 = time.perf_counter()
    if not args.rate:
        results = await asyncio.gather(*(one_stream(host, port, b, args.timeout, args.abort_after) for b in bodies))
        return results, time.perf_counter() - t0
    tasks = []  # open loop: Poisson arrivals, nobody waits for an answer before the next comes
    t_next = t0
    for b in bodies:
        t_next += rng.expovariate(args.rate)
        await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one_stream(host, port, b, args.timeout, args.abort_after)))
    results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - t0


def model_id(host, port):
    import urllib.request
    with urllib.request.urlopen(f"http://{host}:{port}/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=256, help="the started decode node's --max-batch")
    p.add_argument("--router-flag", action="append", default=[], help="extra hack-router flag (repeatable)")
    p.add_argument("--url", help="http://host:port of a running router (else a cluster is started)")
    p.add_argument("--router-pid", type=int, help="with --url: the router's pid, for threads and RSS")
    p.add_argument("--rate", type=float, default=0, help="open loop: clients per second (Poisson), for --duration")
    p.add_argument("--duration", type=float, default=30)
    p.add_argument("--abort-after", type=int, default=0,
                   help="every client hangs up after this many chunks (abort storm); then the nodes' "
                        "running requests and KV bytes are polled until 0")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.clients + 256)), hard))

    cluster = None
    if args.url:
        host, port = args.url.split("//")[-1].rstrip("/").split(":")
        port = int(port)
        pid = args.router_pid
    else:
        from cluster import Cluster
        cluster = Cluster(prefill=1, decode=1, decode_flags=["--max-batch", str(args.max_batch)],
                          router_flags=args.router_flag)
        host, port = "127.0.0.1", cluster.router.port
        pid = cluster.router.proc.pid
    try:
        args.model = model_id(host, port)
        sampler = ProcSampler(pid) if pid else None
        if sampler:
            sampler.start()
        results, wall = asyncio.run(run_clients(args, host, port))
        if sampler:
            sampler.stop()
        ok = [r for r in results if r.ok]
        refused = [r for r in results if r.status == 429]
        errors = [r.error for r in results if not r.ok and r.status != 429]
        itl = [x for r in ok for x in r.itl]
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        out = {
            "clients": len(results), "completed": len(ok), "refused_429": len(refused), "failed": len(errors),
            "chunks": sum(r.chunks for r in ok), "wall_s": round(wall, 3),
            "itl_ms": {k: round(1000 * pct(itl, q), 2) for k, q in (("p50", 50), ("p90", 90), ("p99", 99))},
            "ttft_ms": {k: round(1000 * pct(ttft, q), 1) for k, q in (("p50", 50), ("p99", 99), ("max", 100))},
        }
        if args.rate:
            out["rate"] = args.rate
            out["refused_with_retry_after"] = sum(r.retry_after for r in refused)
            rej = [r.answer_s for r in refused]
            out["refusal_ms"] = {k: round(1000 * pct(rej, q), 1) for k, q in (("p50", 50), ("p99", 99), ("max", 100))}
        if sampler:
            out["router_threads"] = {"idle": sampler.start_threads, "peak": sampler.peak_threads}
            out["router_rss_mb"] = {"idle": round(sampler.start_rss_kb / 1024, 1),
                                    "peak": round(sampler.peak_rss_kb / 1024, 1)}
        if cluster:
            t_end = time.perf_counter()
            keys = ("running", "waiting", "kv_bytes_used")
            while True:  # after an abort storm the nodes free what the clients left
                hs = [d.health() for d in cluster.decode + cluster.prefill]
                idle = all(not h.get(k) for h in hs for k in keys)
                if idle or time.perf_counter() - t_end > 60:
                    break
                time.sleep(0.1)
            out["nodes_idle_after_s"] = round(time.perf_counter() - t_end, 2) if idle else None
            out["decode_after"] = {k: hs[0].get(k) for k in keys if k in hs[0]}
            out["prefill_after"] = {k: hs[-1].get(k) for k in keys if k in hs[-1]}
        if errors:
            out["first_errors"] = sorted(set(errors))[:5]
        print(json.dumps(out, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
        return 0 if not errors else 1
    finally:
        if cluster:
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
