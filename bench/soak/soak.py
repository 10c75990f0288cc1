"""Soak: mixed load against a local cluster for --minutes, watching for leaks.

Load (Poisson arrivals, official `openai` client and raw HTTP): short and long prompts,
streams cancelled by the client after a few chunks, non-stream requests whose connection is
dropped mid-way, n > 1, stop strings, chat and completions. Every --sample-s seconds, for
every daemon: RSS, open file descriptors and threads (/proc/<pid>), and each node's KV
accounting (/health kv_sequences, kv_bytes_used). Reported: RSS slope per daemon after the
warm-up (least squares, KiB/min; also of each latency window's smallest sample, the floor a
leak would lift while idle trims make RSS swing with the load), fd and thread counts first vs last, p50/p99 latency per
time window, KV after the load (must be zero), errors by cause.

    python3 bench/soak/soak.py --minutes 30 --out soak.json
"""

import argparse
import collections
import http.client
import json
import os
import random
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "e2e"))

import cluster  # noqa: E402

SHORT = ["Hello", "The capital of France is", "def add(a, b):", "Colours:"]
LONG = " ".join(["The quick brown fox jumps over the lazy dog while the cat watches from the fence."] * 25)


def proc_stats(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["rss_kib"] = int(line.split()[1])
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def slope_per_min(points):
    """Least-squares slope of (t_s, y) in y per minute."""
    n = len(points)
    if n < 3:
        return None
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return 60.0 * sum((t - mt) * (y - my) for t, y in points) / den if den else None


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else None


class Soak:
    def __init__(self, c, rng, model):
        import openai
        self.openai = openai
        self.c = c
        self.rng = rng
        self.model = model
        self.lock = threading.Lock()
        self.lat = []  # (t_end, seconds, kind)
        self.outcomes = collections.Counter()
        self.errors = collections.Counter()
        self.threads = []

    def client(self):
        return self.openai.OpenAI(base_url=f"http://127.0.0.1:{self.c.router.port}/v1", api_key="none",
                                  max_retries=0, timeout=120)

    def run_one(self, kind):
        t0 = time.monotonic()
        try:
            prompt = LONG if kind == "long" else self.rng.choice(SHORT)
            cl = self.client()
            if kind == "cancel":
                s = cl.completions.create(model=self.model, prompt=prompt, max_tokens=64, extra_body={"ignore_eos": True}, stream=True)
                for i, _ in enumerate(s):
                    if i >= 3:
                        break
                s.close()
            elif kind == "disconnect":
                conn = http.client.HTTPConnection("127.0.0.1", self.c.router.port, timeout=30)
                conn.request("POST", "/v1/completions", body=json.dumps(
                    {"model": self.model, "prompt": prompt, "max_tokens": 64, "ignore_eos": True}),
                    headers={"Content-Type": "application/json"})
                time.sleep(0.05)
                conn.sock.shutdown(socket.SHUT_RDWR)
                conn.close()
            elif kind == "n3":
                r = cl.completions.create(model=self.model, prompt=prompt, max_tokens=16, n=3, temperature=0.8)
                assert len(r.choices) == 3
            elif kind == "stop":
                s = cl.chat.completions.create(model=self.model, messages=[{"role": "user", "content": prompt}],
                                               max_tokens=32, stop=["e", "\n"], stream=True)
                for _ in s:
                    pass
            else:  # short / long streams
                s = cl.completions.create(model=self.model, prompt=prompt, max_tokens=self.rng.choice([8, 32, 64]),
                                          stream=True, stream_options={"include_usage": True})
                for _ in s:
                    pass
            with self.lock:
                self.outcomes["ok"] += 1
                self.lat.append((time.monotonic(), time.monotonic() - t0, kind))
        except Exception as e:
            with self.lock:
                self.outcomes["error"] += 1
                self.errors[f"{kind}: {type(e).__name__}: {str(e)[:80]}"] += 1

    def submit(self):
        kind = self.rng.choices(["short", "long", "cancel", "disconnect", "n3", "stop"], [40, 15, 10, 10, 10, 15])[0]
        t = threading.Thread(target=self.run_one, args=(kind,), daemon=True)
        t.start()
        self.threads.append(t)
        self.threads = [x for x in self.threads if x.is_alive()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="load duration (default 30)")
    ap.add_argument("--rate", type=float, default=4.0, help="Poisson arrival rate, requests/s (default 4)")
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between resource samples (default 10)")
    ap.add_argument("--window-s", type=float, default=120.0, help="latency window (default 120)")
    ap.add_argument("--warmup-min", type=float, default=2.0, help="minutes left out of the RSS slope (default 2)")
    ap.add_argument("--kv", default="hack", help="KV format (default hack)")
    ap.add_argument("--seed", type=int, default=1, help="load seed (default 1)")
    ap.add_argument("--out", default="", help="write the JSON report here too")
    args = ap.parse_args()

    with cluster.Cluster(prefill=2, decode=2, kv=args.kv, router_flags=["--health-interval", "0.5"]) as c:
        model = os.path.basename(os.path.normpath(cluster.MODEL_DIR))
        soak = Soak(c, random.Random(args.seed), model)
        samples = collections.defaultdict(list)  # daemon → [(t, stats)]
        kv_samples = []
        stop = threading.Event()
        t0 = time.monotonic()

        def sampler():
            while not stop.is_set():
                t = time.monotonic() - t0
                for d in c.daemons():
                    try:
                        samples[d.name].append((t, proc_stats(d.proc.pid)))
                    except OSError:
                        pass
                kv = {}
                for d in c.prefill + c.decode:
                    try:
                        h = d.health()
                        kv[d.name] = (h.get("kv_sequences", 0), h.get("kv_bytes_used", 0))
                    except Exception as e:
                        kv[d.name] = str(e)
                kv_samples.append((t, kv))
                stop.wait(args.sample_s)

        ts = threading.Thread(target=sampler, daemon=True)
        ts.start()
        rng = random.Random(args.seed + 1)
        next_print = 60
        while time.monotonic() - t0 < args.minutes * 60:
            time.sleep(rng.expovariate(args.rate))
            soak.submit()
            if time.monotonic() - t0 > next_print:
                next_print += 60
                with soak.lock:
                    print(f"{time.strftime('%H:%M:%S')} t={time.monotonic() - t0:.0f}s {dict(soak.outcomes)}", flush=True)
        for t in soak.threads:
            t.join(180)
        hung = sum(t.is_alive() for t in soak.threads)
        busy = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            busy = {}
            for d in c.prefill + c.decode:
                h = d.health()
                if h.get("kv_sequences") or h.get("kv_bytes_used") or h.get("running") or h.get("waiting"):
                    busy[d.name] = {k: h.get(k) for k in ("kv_sequences", "kv_bytes_used", "running", "waiting")}
            if not busy:
                break
            time.sleep(0.5)
        stop.set()
        ts.join(30)
        for d in c.daemons():  # the idle end state
            samples[d.name].append((time.monotonic() - t0, proc_stats(d.proc.pid)))

        warm = args.warmup_min * 60
        per_daemon = {}
        for name, pts in samples.items():
            after = [(t, s["rss_kib"]) for t, s in pts if t >= warm]
            half = [(t, y) for t, y in after if t >= (warm + pts[-1][0]) / 2]
            # The floor: each window's smallest sample. A decode node gives memory back when idle
            # (--idle-trim-s), so its RSS swings with the load; a leak would lift the floor.
            floors = collections.defaultdict(list)
            for t, y in after:
                floors[int((t - warm) // args.window_s)].append((t, y))
            floor = [min(v, key=lambda p: p[1]) for _, v in sorted(floors.items())]
            per_daemon[name] = {
                "rss_kib_min_max_after_warmup": (min(y for _, y in after), max(y for _, y in after)) if after else None,
                "rss_floor_kib_per_window": [y for _, y in floor],
                "rss_floor_slope_kib_per_min": round(slope_per_min(floor), 1) if slope_per_min(floor) is not None else None,
                "rss_slope_second_half_kib_per_min": round(slope_per_min(half), 1) if slope_per_min(half) is not None else None,
                "rss_kib_series": [(round(t), s["rss_kib"]) for t, s in pts][::6],
                "rss_kib_first_after_warmup": after[0][1] if after else None,
                "rss_kib_last": pts[-1][1]["rss_kib"],
                "rss_slope_kib_per_min": round(slope_per_min(after), 1) if slope_per_min(after) is not None else None,
                "fds_first_last": (pts[0][1]["fds"], pts[-1][1]["fds"]),
                "fds_max": max(s["fds"] for _, s in pts),
                "threads_first_last": (pts[0][1]["threads"], pts[-1][1]["threads"]),
                "threads_max": max(s["threads"] for _, s in pts),
            }
        windows = collections.defaultdict(list)
        for t_end, s, kind in soak.lat:
            windows[int((t_end - t0) // args.window_s)].append(s)
        report = {
            "minutes": round((time.monotonic() - t0) / 60, 1),
            "rate_per_s": args.rate,
            "outcomes": dict(soak.outcomes),
            "errors_by_cause": dict(soak.errors.most_common(10)),
            "hung": hung,
            "kv_not_zero_after_load": busy,
            "kv_max_sequences_during": max((sum(v[0] for v in kv.values() if isinstance(v, tuple)) for _, kv in kv_samples),
                                           default=0),
            "daemons": per_daemon,
            "latency_windows": [{"from_s": int(w * args.window_s), "n": len(xs), "p50_s": round(pct(xs, 0.5), 3),
                                 "p99_s": round(pct(xs, 0.99), 3)} for w, xs in sorted(windows.items())],
        }
        text = json.dumps(report, indent=2)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")


if __name__ == "__main__":
    main()
