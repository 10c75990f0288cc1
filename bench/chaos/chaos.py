"""Chaos run: Poisson load of streaming requests (official `openai` client) against a local
cluster while daemons are SIGKILLed, SIGSTOPped (then SIGCONT or SIGKILL) and restarted —
nodes of every role and the router. The client retries a request idempotently (same body,
same seed, partial text discarded) only when the router itself is unreachable (a router
restart fails its in-flight requests); an error the router answers is a failure.

Afterwards: every request has ended (hung = still running past its deadline), failures are
counted by cause, and every surviving node's KV accounting is back to zero (/health
kv_sequences, running, waiting). Greedy requests are also checked against the first
uninterrupted answer to the same (prompt, max_tokens): with --kv fp a migrated stream must
give the same text (mismatches are counted).

    python3 bench/chaos/chaos.py --minutes 10          # long run (bench/RESULTS.md)
    tests/e2e/chaos_test.py runs run_chaos() for ~30 s.

At most one node per role is down at a time, so a spare of the failed role always exists:
the target is 0 failed and 0 hung requests.
"""

import argparse
import collections
import json
import os
import random
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "e2e"))

import cluster  # noqa: E402

PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "List three colours:",
    "def fibonacci(n):",
    "In the beginning there was",
    "A short poem about the sea:",
]


def restart_argv(d):
    """The daemon's argv pinned to its old ports, so the router (and prefill nodes) find it."""
    argv = list(d.argv)
    def pin(flag, value):
        if flag in argv:
            argv[argv.index(flag) + 1] = str(value)
        else:
            argv.extend([flag, str(value)])
    pin("--port", d.port)
    if d.ucx_address and os.path.basename(argv[0]) == "hack-decode":
        pin("--ucx-port", d.ucx_address.rsplit(":", 1)[1])
    return argv


class Chaos:
    """Owns the cluster's daemons by role and restarts them in place."""

    def __init__(self, c, rng, log):
        self.c = c
        self.rng = rng
        self.log = log
        self.lock = threading.Lock()
        self.down = set()  # roles with a node down now
        self.actions = collections.Counter()
        self.restart_failures = 0
        self.spawned = 0

    def roles(self):
        return {"prefill": self.c.prefill, "decode": self.c.decode, "router": self.c.routers}

    def restart(self, role, i):
        old = self.roles()[role][i]
        if old.alive():
            old.kill()
        else:
            old._reap(2)
        for attempt in range(20):  # the port may linger briefly after a SIGKILL
            self.spawned += 1
            d = cluster.Daemon(f"{old.name.split('-')[0]}-{self.spawned}", restart_argv(old),
                               self.c.log_dir, self.c.env)
            try:
                d.wait_ready(30)
                self.roles()[role][i] = d
                self.actions["restarts"] += 1
                return
            except RuntimeError:
                d.kill()
                time.sleep(0.5)
        self.restart_failures += 1
        self.log(f"chaos: could not restart {old.name}")

    def wait_healthy(self, role, timeout_s):
        if role == "router":
            time.sleep(0.5)
            return
        want = len(self.roles()[role])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                _, body, _ = cluster.http_get(self.c.routers[0].port, "/health", 2.0)
                if json.loads(body).get(f"{role}_nodes_healthy") == want:
                    return
            except Exception:
                pass
            time.sleep(0.1)
        self.log(f"chaos: {role} nodes not all healthy after {timeout_s} s")

    def act(self, stop_event, stop_probability=0.3):
        role = self.rng.choice(["prefill", "decode", "decode", "router"])
        with self.lock:
            if role in self.down:
                return
            self.down.add(role)
        try:
            nodes = self.roles()[role]
            i = self.rng.randrange(len(nodes))
            d = nodes[i]
            kind = self.rng.choice(["kill", "stop", "term"]) if role != "router" else self.rng.choice(["kill", "stop"])
            self.actions[f"{kind}:{role}"] += 1
            self.log(f"chaos: {kind} {d.name} (pid {d.proc.pid})")
            if kind == "kill":
                d.proc.send_signal(signal.SIGKILL)
                stop_event.wait(self.rng.uniform(1.0, 3.0))
                self.restart(role, i)
            elif kind == "term":  # drain: finishes what it runs, then exits
                d.proc.send_signal(signal.SIGTERM)
                try:
                    d.proc.wait(30)
                except Exception:
                    pass
                self.restart(role, i)
            else:
                d.proc.send_signal(signal.SIGSTOP)
                stop_event.wait(self.rng.uniform(1.0, 4.0))
                if self.rng.random() < stop_probability:
                    d.proc.send_signal(signal.SIGKILL)
                    self.restart(role, i)
                else:
                    d.proc.send_signal(signal.SIGCONT)
            # A spare must exist for every failure: the next node of this role goes only once the
            # router sees every node of the role healthy again.
            self.wait_healthy(role, 20.0)
        finally:
            with self.lock:
                self.down.discard(role)


class Load:
    """Poisson arrivals; each request runs on its own thread with a deadline."""

    def __init__(self, port_fn, rng, deadline_s, seeded_fraction=0.5):
        import openai
        self.openai = openai
        self.port_fn = port_fn
        self.rng = rng
        self.deadline_s = deadline_s
        self.seeded_fraction = seeded_fraction
        self.lock = threading.Lock()
        self.threads = []
        self.outcomes = collections.Counter()
        self.failures = collections.Counter()
        self.retries = collections.Counter()
        self.references = {}
        self.mismatches = 0
        self.latencies = []

    def client(self):
        return self.openai.OpenAI(base_url=f"http://127.0.0.1:{self.port_fn()}/v1", api_key="none", max_retries=0,
                                  timeout=self.openai.Timeout(20.0, connect=2.0))

    def one(self, body):
        t0 = time.monotonic()
        key = (body["prompt"], body["max_tokens"], body.get("seed"), body["temperature"], body.get("top_p"))
        while True:
            if time.monotonic() - t0 > self.deadline_s:
                self.record("failed", "deadline (retries exhausted)")
                return
            text, finish, usage = "", None, None
            try:
                stream = self.client().completions.create(model=cluster_model(), stream=True,
                                                          stream_options={"include_usage": True}, **body)
                for chunk in stream:
                    if chunk.choices:
                        text += chunk.choices[0].text
                        finish = chunk.choices[0].finish_reason or finish
                    if chunk.usage:
                        usage = chunk.usage
            except (self.openai.APIConnectionError, self.openai.APITimeoutError) as e:
                # The router is gone (restart) or hung (SIGSTOP): retry the same request.
                with self.lock:
                    self.retries[type(e).__name__] += 1
                time.sleep(0.3)
                continue
            except self.openai.APIError as e:
                msg = str(getattr(e, "message", e))
                if "generation failed" not in msg and ("Connection" in msg or "incomplete" in msg.lower()):
                    with self.lock:
                        self.retries["stream_cut"] += 1
                    time.sleep(0.3)
                    continue
                self.record("failed", msg[:120])
                return
            except Exception as e:  # a stream cut mid-body by a killed router (httpx errors)
                with self.lock:
                    self.retries[type(e).__name__] += 1
                time.sleep(0.3)
                continue
            if usage is None or finish is None:
                self.record("failed", "stream ended without usage or finish_reason")
                return
            if usage.completion_tokens != body["max_tokens"] and finish == "length":
                self.record("failed", f"length finish after {usage.completion_tokens} of {body['max_tokens']} tokens")
                return
            with self.lock:
                self.latencies.append((time.monotonic(), time.monotonic() - t0))
                if body["temperature"] == 0 or body.get("seed") is not None:
                    ref = self.references.setdefault(key, text)
                    if ref != text:
                        self.mismatches += 1
            self.record("ok", None)
            return

    def record(self, outcome, cause):
        with self.lock:
            self.outcomes[outcome] += 1
            if cause:
                self.failures[cause] += 1

    def submit(self, body):
        t = threading.Thread(target=self.one, args=(body,), daemon=True)
        t.start()
        with self.lock:
            self.threads.append((t, time.monotonic()))

    def body(self):
        seeded = self.rng.random() < self.seeded_fraction
        b = {"prompt": self.rng.choice(PROMPTS), "max_tokens": self.rng.choice([16, 32, 64]),
             "temperature": 0.8 if seeded else 0.0, "extra_body": {"ignore_eos": True}}
        if seeded:
            b["seed"] = self.rng.randrange(4)
            b["top_p"] = 0.9  # see chaos_test.py: the untruncated tail flips on recomputed-KV numerics
        return b

    def hung(self, grace_s):
        """Threads still running past their deadline + grace."""
        now = time.monotonic()
        out = 0
        for t, start in self.threads:
            t.join(max(0.0, start + self.deadline_s + grace_s - now))
            if t.is_alive():
                out += 1
        return out


_MODEL = {"name": None}


def cluster_model():
    return _MODEL["name"]


def nodes_idle(c, timeout_s=20.0):
    """{node: health} of surviving nodes that still hold KV or requests after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = {}
        for d in c.prefill + c.decode:
            if not d.alive():
                continue
            try:
                h = d.health()
            except Exception as e:
                busy[d.name] = str(e)
                continue
            if h.get("kv_sequences", 0) or h.get("running", 0) or h.get("waiting", 0) or h.get("kv_bytes_used", 0):
                busy[d.name] = {k: h.get(k) for k in ("kv_sequences", "kv_bytes_used", "running", "waiting")}
        if not busy or time.monotonic() > deadline:
            return busy
        time.sleep(0.25)


def run_chaos(seconds, rate_per_s=2.0, seed=1, prefill=2, decode=2, kv="fp", chaos_interval_s=(2.0, 5.0),
              deadline_s=90.0, log=print, step_delay_ms=10):
    rng = random.Random(seed)
    # A decode node restarted in place listens on its old UCX port, still in TIME_WAIT from the
    # killed process: UCX 1.13's TCP connection manager needs SO_REUSEADDR for that.
    os.environ.setdefault("UCX_TCP_CM_REUSEADDR", "y")
    router_flags = ["--health-interval", "0.25", "--stall-timeout-s", "2", "--max-migrations", "3",
                    "--request-timeout", "30"]
    with cluster.Cluster(prefill=prefill, decode=decode, kv=kv, router_flags=router_flags,
                         decode_flags=["--enable-test-hooks", "--test-step-delay-ms", str(step_delay_ms)]) as c:
        _MODEL["name"] = os.path.basename(os.path.normpath(cluster.MODEL_DIR))
        chaos = Chaos(c, random.Random(seed + 1), log)
        load = Load(lambda: c.routers[0].port, random.Random(seed + 2), deadline_s)
        stop = threading.Event()
        acted = threading.Event()  # the chaos loop has stopped acting
        done = threading.Event()   # the report is taken

        def chaos_loop():
            # Daemons restarted here die with this thread (cluster.py's PR_SET_PDEATHSIG is per
            # thread), so it outlives the report.
            while not stop.is_set():
                if stop.wait(chaos.rng.uniform(*chaos_interval_s)):
                    break
                chaos.act(stop)
            acted.set()
            done.wait()

        t_chaos = threading.Thread(target=chaos_loop, daemon=True)
        t0 = time.monotonic()
        t_chaos.start()
        requests = 0
        while time.monotonic() - t0 < seconds:
            time.sleep(rng.expovariate(rate_per_s))
            load.submit(load.body())
            requests += 1
        stop.set()
        acted.wait(60)
        hung = load.hung(grace_s=10.0)
        # Any node left stopped by an interrupted action gets its SIGCONT.
        for d in c.daemons():
            if d.alive():
                d.proc.send_signal(signal.SIGCONT)
        busy = nodes_idle(c)
        router_metrics = {}
        try:
            router_metrics = {k: v for k, v in c.routers[0].metrics().items()
                              if k.startswith(("hack:request_migrations_total", "hack:request_retries_total",
                                               "hack:request_errors_total"))}
        except Exception as e:
            router_metrics = {"error": str(e)}
        done.set()
        t_chaos.join(10)
        lat = sorted(x for _, x in load.latencies)
        report = {
            "seconds": round(time.monotonic() - t0, 1),
            "requests": requests,
            "outcomes": dict(load.outcomes),
            "failures_by_cause": dict(load.failures),
            "client_retries": dict(load.retries),
            "hung": hung,
            "greedy_or_seeded_mismatches": load.mismatches,
            "chaos_actions": dict(chaos.actions),
            "restart_failures": chaos.restart_failures,
            "nodes_not_idle": busy,
            "router_metrics_since_last_restart": router_metrics,
            "latency_p50_s": lat[len(lat) // 2] if lat else None,
            "latency_p99_s": lat[int(len(lat) * 0.99)] if lat else None,
        }
        return report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to run the load (default 10)")
    ap.add_argument("--rate", type=float, default=2.0, help="Poisson arrival rate, requests/s (default 2)")
    ap.add_argument("--seed", type=int, default=1, help="seed of load and chaos (default 1)")
    ap.add_argument("--prefill", type=int, default=2, help="prefill nodes (default 2)")
    ap.add_argument("--decode", type=int, default=2, help="decode nodes (default 2)")
    ap.add_argument("--kv", default="fp", help="KV format of the nodes (default fp)")
    args = ap.parse_args()
    report = run_chaos(args.minutes * 60, args.rate, args.seed, args.prefill, args.decode, args.kv,
                       log=lambda m: print(f"{time.strftime('%H:%M:%S')} {m}", flush=True))
    print(json.dumps(report, indent=2))
    ok = report["hung"] == 0 and not report["failures_by_cause"] and not report["nodes_not_idle"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
