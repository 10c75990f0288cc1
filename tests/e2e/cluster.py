"""A local hackserve cluster for end-to-end tests: N hack-prefill + M hack-decode nodes and
one or more hack-router processes on loopback, every port chosen by the kernel (--port 0).

Standard library only. Every daemon is started from the calling thread with
PR_SET_PDEATHSIG=SIGKILL, so it dies with the test process even when that is killed -9 (a
ctest timeout); Cluster.stop() (tearDown), atexit and SIGTERM stop them in order before that.

    with Cluster(prefill=2, decode=2) as c:
        router = c.router                      # started with Cluster(router_flags=...)
        other = c.add_router(["--api-key", "k"])
        c.decode[0].health()["running"]
        c.decode[0].kill()                     # SIGKILL, for failure tests

Environment: HACK_BUILD_DIR (default <repo>/build), HACK_MODEL (default
<repo>/models/hack-tiny), HACK_TEST_KEEP_LOGS=1 keeps the log directory.
"""

import atexit
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD_DIR = os.path.abspath(os.environ.get("HACK_BUILD_DIR") or os.path.join(SOURCE_DIR, "build"))
BIN_DIR = os.path.join(BUILD_DIR, "bin")
MODEL_DIR = os.path.abspath(os.environ.get("HACK_MODEL") or os.path.join(SOURCE_DIR, "models", "hack-tiny"))

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0

_READY = {
    "hack-prefill": re.compile(r"^hack-prefill ready: http (\d+)\s*$"),
    "hack-decode": re.compile(r"^hack-decode ready: http (\d+) ucx (\S+)\s*$"),
    "hack-router": re.compile(r"^hack-router ready: http (\d+)\s*$"),
    "hack-vault": re.compile(r"^hack-vault ready: http (\d+) ucx (\d+)\s*$"),
}

_live = set()  # every Daemon not yet reaped, for atexit
_live_lock = threading.Lock()


def binary(name):
    """Path of build/bin/<name>; raises FileNotFoundError naming the build dir if missing."""
    path = os.path.join(BIN_DIR, name)
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{path} is not built (cmake --build {BUILD_DIR} --target {name}; "
                                f"HACK_BUILD_DIR selects another build dir)")
    return path


try:  # looked up here, not in the forked child (no dlopen between fork and exec)
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: atexit and tearDown still stop the daemons
    _prctl = None


def _die_with_parent():
    # Runs in the child between fork and exec: SIGKILL it when the thread that forked it exits.
    PR_SET_PDEATHSIG = 1
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def http_get(port, path, timeout=5.0, headers=None):
    """(status, body bytes, headers) of GET http://127.0.0.1:port/path; never raises on a status."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


class Daemon:
    """One daemon process: started, its ready line parsed, stopped."""

    def __init__(self, name, argv, log_dir, env):
        self.name = name
        self.argv = argv
        self.log_path = os.path.join(log_dir, name + ".log")
        self.port = None
        self.ucx_address = None
        self._log = open(self.log_path, "wb")
        self._lines = []
        self._ready = threading.Event()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log,
                                     env=env, preexec_fn=_die_with_parent, close_fds=True)
        with _live_lock:
            _live.add(self)
        # Drains stdout for the process's whole life (a full pipe would block the daemon).
        self._reader = threading.Thread(target=self._read_stdout, name=f"stdout-{name}", daemon=True)
        self._reader.start()

    def _read_stdout(self):
        kind = os.path.basename(self.argv[0])
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace")
            self._lines.append(line)
            m = _READY[kind].match(line)
            if m and not self._ready.is_set():
                self.port = int(m.group(1))
                if kind == "hack-decode":
                    self.ucx_address = m.group(2)
                elif kind == "hack-vault":
                    self.ucx_address = f"127.0.0.1:{m.group(2)}"
                self._ready.set()
        self._ready.set()  # EOF: wake wait_ready, which then sees no port

    def wait_ready(self, timeout=READY_TIMEOUT_S):
        """Blocks until the ready line; raises RuntimeError with the log tail otherwise."""
        if not self._ready.wait(timeout) or self.port is None:
            code = self.proc.poll()
            raise RuntimeError(f"{self.name} did not print its ready line within {timeout} s "
                               f"(exit status {code}); stdout {self._lines!r}; log tail:\n{self.log_tail()}")
        return self

    def log_tail(self, lines=30):
        try:
            with open(self.log_path, "rb") as f:
                return b"".join(f.readlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            return ""

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def alive(self):
        return self.proc.poll() is None

    def wait_data_plane_ready(self, timeout=READY_TIMEOUT_S):
        """Blocks until a decode node's /health says "ready" (its UCX self-probe passed)."""
        deadline = time.monotonic() + timeout
        while not self.health().get("ready", True):
            if time.monotonic() > deadline or not self.alive():
                raise RuntimeError(f"{self.name} not ready within {timeout} s; log tail:\n{self.log_tail()}")
            time.sleep(0.05)

    def health(self, timeout=5.0):
        """GET /health as a dict (nodes: queue_tokens, running, waiting, kv_sequences, ...)."""
        status, body, _ = http_get(self.port, "/health", timeout)
        if status != 200:
            raise RuntimeError(f"{self.name} /health: HTTP {status}: {body[:200]!r}")
        return json.loads(body)

    def metrics(self, timeout=5.0):
        """GET /metrics as {series (name with labels): value}."""
        status, body, _ = http_get(self.port, "/metrics", timeout)
        if status != 200:
            raise RuntimeError(f"{self.name} /metrics: HTTP {status}")
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def kill(self):
        """SIGKILL, no shutdown (a crashed node)."""
        if self.alive():
            self.proc.kill()
        self._reap(STOP_TIMEOUT_S)

    def terminate(self):
        if self.alive():
            self.proc.terminate()

    def _reap(self, timeout):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            sys.stderr.write(f"cluster: {self.name} (pid {self.proc.pid}) did not stop in {timeout} s; killing it\n")
            self.proc.kill()
            self.proc.wait()
        self._reader.join(2.0)
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()
        with _live_lock:
            _live.discard(self)

    def stop(self, timeout=STOP_TIMEOUT_S):
        self.terminate()
        self._reap(timeout)


class Cluster:
    """prefill + decode nodes and a router (router_flags: extra hack-router flags; router=False
    starts none; node_flags go to every node, decode_flags to decode nodes only, prefill_flags to
    prefill nodes only). vault=True starts a hack-vault first (vault_flags) and points every
    node at it (prefill restores and stores prompts, decode stores finished conversations). Raises RuntimeError (with the failing daemon's log) when a daemon does not
    come up; everything started so far is stopped first."""

    def __init__(self, prefill=1, decode=1, router_flags=(), node_flags=(), router=True, threads=1, kv="hack",
                 decode_flags=(), prefill_flags=(), vault=False, vault_flags=()):
        self.secret = secrets.token_hex(8)
        self.log_dir = tempfile.mkdtemp(prefix="hack-e2e-")
        # Daemons read the secret from a file (never from argv, where `ps` shows it).
        self.secret_file = os.path.join(self.log_dir, "secret")
        with open(os.open(self.secret_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(self.secret + "\n")
        self.env = dict(os.environ)
        self.env.setdefault("UCX_TLS", "tcp")
        # Loopback only: the e2e suite runs beside e2e_compose, whose podman bridge comes and
        # goes; a daemon that took it as a UCX device lost every connection made over it.
        self.env.setdefault("UCX_NET_DEVICES", "lo")
        self.prefill, self.decode, self.routers = [], [], []
        self.vault = None
        self._vault_flags = list(vault_flags)
        self._stopped = False
        _clusters.add(self)
        node_args = ["--model", MODEL_DIR, "--threads", str(threads), "--kv", kv, "--secret-file", self.secret_file,
                     "--port", "0", *node_flags]
        try:
            vault_args = []
            if vault:
                self.start_vault(ucx_port=0)
                vault_args = ["--vault", self.vault.ucx_address]
            for i in range(prefill):
                self.prefill.append(Daemon(f"prefill{i}", [binary("hack-prefill"), *node_args, *vault_args,
                                                           *prefill_flags], self.log_dir, self.env))
            for i in range(decode):
                self.decode.append(Daemon(f"decode{i}", [binary("hack-decode"), *node_args, "--ucx-port", "0",
                                                         *vault_args, *decode_flags], self.log_dir, self.env))
            for d in self.prefill + self.decode:
                d.wait_ready()
            # A decode node serves only once its UCX listener has passed the self-probe
            # ("ready" in /health); until then routers skip it, and a test that counts on
            # every node (shortest queue, retries) would see one node short.
            for d in self.decode:
                d.wait_data_plane_ready()
            self.router = self.add_router(router_flags) if router else None
        except BaseException:
            self.stop()
            raise

    def add_router(self, flags=(), wait_healthy=True):
        """Another hack-router over the same nodes, with extra `flags`; waits for /health 200."""
        argv = [binary("hack-router"), "--model", MODEL_DIR, "--port", "0", "--secret-file", self.secret_file,
                "--prefill", ",".join(p.address for p in self.prefill),
                "--decode", ",".join(d.address for d in self.decode), *flags]
        r = Daemon(f"router{len(self.routers)}", argv, self.log_dir, self.env)
        self.routers.append(r)
        r.wait_ready()
        if wait_healthy:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while True:
                try:
                    status, body, _ = http_get(r.port, "/health", 2.0)
                except OSError as e:
                    status, body = None, str(e).encode()
                if status == 200:
                    break
                if time.monotonic() > deadline or not r.alive():
                    raise RuntimeError(f"{r.name} /health not 200 within {READY_TIMEOUT_S} s: {status} "
                                       f"{body[:200]!r}; log tail:\n{r.log_tail()}")
                time.sleep(0.05)
        return r

    def start_vault(self, ucx_port=0):
        """(Re)starts hack-vault with the cluster's vault_flags; ucx_port pins its UCX port (a
        restarted vault must come back where the prefill nodes look for it)."""
        argv = [binary("hack-vault"), "--port", "0", "--ucx-port", str(ucx_port), "--secret-file", self.secret_file,
                "--enable-test-hooks", *self._vault_flags]
        self.vault = Daemon(f"vault{len([d for d in os.listdir(self.log_dir) if d.startswith('vault')])}", argv,
                            self.log_dir, self.env)
        self.vault.wait_ready()
        return self.vault

    def daemons(self):
        return self.routers + self.prefill + self.decode + ([self.vault] if self.vault else [])

    def stop(self):
        """Routers first (they cancel open requests on the nodes), then the nodes. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for group in (self.routers, self.prefill + self.decode, [self.vault] if self.vault else []):
            for d in group:
                d.terminate()
            for d in group:
                d._reap(STOP_TIMEOUT_S)
        _clusters.discard(self)
        if os.environ.get("HACK_TEST_KEEP_LOGS"):
            sys.stderr.write(f"cluster: logs kept in {self.log_dir}\n")
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


_clusters = set()


def _stop_everything():
    for c in list(_clusters):
        c.stop()
    with _live_lock:
        left = list(_live)
    for d in left:
        d.kill()


atexit.register(_stop_everything)


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds tearDowns, then atexit


if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _on_sigterm)
