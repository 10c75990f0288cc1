"""The cluster as four containers on two podman networks that only the router and the UCX ports
join, so that nothing in it can lean on one host (a shared loopback, shared memory, one boot):
a chat request through the router must give what hack-run gives for the same greedy request.

Topology (every container its own network namespace; both networks `--internal`: no default
route, no NAT, so a container reaches only its own subnet and the routes below):

      network A                                            network B
    ┌────────────────────────────────┐                 ┌──────────────────────┐
    │ prefill .10 ─┐                 │                 │                      │
    │ vault   .11  ├─ router .12 ────┼─ (HTTP to each) ┼─ router .12          │
    │              │                 │                 │ decode  .10          │
    │              └─ gateway .250 ══╪═ UCX ports only ╪═ gateway .250        │
    └────────────────────────────────┘                 └──────────────────────┘

- The router sits on both networks and speaks HTTP to prefill (A) and decode (B). No node has a
  route through it, so it forwards nothing.
- KV must cross: prefill (A) → decode (B) over UCX, and decode (B) → vault (A). It crosses at a
  gateway: a network namespace this test makes, with a leg on each bridge, forwarding and an
  iptables filter that drops every new TCP connection between A and B except to the UCX ports —
  the listeners (decode --ucx-port 8310, vault --ucx-port 8401) and the ports of UCX's tcp
  transport, pinned to UCX_TCP_PORT_RANGE on every UCX daemon. Prefill and vault route B through
  it, decode routes A through it (added with nsenter before the daemon starts; the containers
  have no NET_ADMIN).
- Every daemon binds its own network address (--host, as deploy/MULTIHOST.md says for hosts),
  and is given its peers' addresses, never a name or 127.0.0.1.

What the test checks: the filter holds (from decode, prefill's HTTP port is unreachable and so
is decode's from prefill, while decode's UCX listener is reachable from prefill: the control);
the router's chat answer over this cluster equals hack-run's (one process in a container with no
network, the same image and model); the KV went by host:port, not by a same-host UCX address
(prefill's hack:kv_connects_total{by="listener"}), through the gateway (its accept counters on
decode's UCX ports grew).

The test (on the host) talks to the router and the nodes' /metrics over bridge A's host address
and enters the containers' namespaces with nsenter: traffic only to these namespaces.
Exits 77 when podman, a working container runtime, root (nsenter, ip netns) or iptables is
missing. Helpers shared with compose_test.py: podman_harness.py. Settings (environment):
HACK_BIN_DIR, HACK_MODEL_DIR (podman_harness.py), KEEP=1 (leave everything up).
"""
import ipaddress
import json
import os
import re
import shutil
import sys
import tempfile
import unittest
import urllib.request

from podman_harness import MODEL_DIR, SKIP, run, skip_reason, http_ok, wait_for, build_cpu_image

PID = os.getpid()
IMAGE = f"localhost/hackserve:two-networks-test-{PID}"
NET_A = f"hack2net-a-{PID}"
NET_B = f"hack2net-b-{PID}"
GATEWAY_NS = f"hack2net-gw-{PID}"
PREFILL, VAULT, ROUTER, DECODE = (f"hack2net-{PID}-{s}" for s in ("prefill", "vault", "router", "decode"))
CONTAINERS = (VAULT, PREFILL, DECODE, ROUTER)
UCX_TCP_PORTS = (31000, 31063)  # UCX_TCP_PORT_RANGE of every UCX daemon: what the gateway lets through
DECODE_UCX_PORT, VAULT_UCX_PORT = 8310, 8401
MODEL = "/models/" + os.path.basename(MODEL_DIR)


def ns(container_pid, *cmd, check=True, timeout=30):
    """CMD run on the host's binaries inside the network namespace of the process CONTAINER_PID."""
    return run(["nsenter", "-t", str(container_pid), "-n", *cmd], check=check, timeout=timeout)


def gw(*cmd, check=True):
    return run(["ip", "netns", "exec", GATEWAY_NS, *cmd], check=check)


def tcp_connects(container_pid, host, port):
    """Whether a TCP connection from inside the namespace to HOST:PORT is accepted within 3 s."""
    probe = ("import socket, sys\n"
             "try:\n"
             f"    socket.create_connection(({host!r}, {port}), timeout=3).close()\n"
             "except OSError:\n"
             "    sys.exit(1)\n")
    return ns(container_pid, sys.executable, "-c", probe, check=False).returncode == 0


def two_networks_skip_reason():
    if os.geteuid() != 0:
        return "needs root: it enters the containers' network namespaces and makes one (nsenter, ip netns)"
    for tool in ("nsenter", "ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return skip_reason(("podman",))


class TwoNetworksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="hack-2net-")
        os.chmod(cls.tmp, 0o711)  # the secret in it is read by uid 10001 in the containers
        cls.secret = os.path.join(cls.tmp, "cluster_secret")
        with open(cls.secret, "w") as f:
            f.write(os.urandom(16).hex() + "\n")
        os.chmod(cls.secret, 0o644)
        try:
            build_cpu_image(IMAGE, cls.tmp)
            cls.make_networks()
            cls.start_cluster()
            wait_for("the router's /health (a prefill and a decode node ready)",
                     lambda: http_ok(f"http://{cls.ip['router_a']}:8000/health"), 300)
        except BaseException:
            print(cls.logs(), flush=True)
            cls.tearDownClass()
            raise

    @classmethod
    def make_networks(cls):
        cls.subnet, cls.bridge, cls.ip = {}, {}, {}
        for side, name in (("a", NET_A), ("b", NET_B)):
            run(["podman", "network", "create", "--internal", name])
            info = json.loads(run(["podman", "network", "inspect", name]).stdout)[0]
            cls.subnet[side] = ipaddress.ip_network(info["subnets"][0]["subnet"])
            cls.bridge[side] = info["network_interface"]
            hosts = list(cls.subnet[side].hosts())
            cls.ip[f"gateway_{side}"] = str(hosts[249])  # .250: podman hands out addresses from .2 up
            cls.ip[f"router_{side}"] = str(hosts[11])
        a, b = (list(cls.subnet[s].hosts()) for s in ("a", "b"))
        cls.ip.update(prefill=str(a[9]), vault=str(a[10]), decode=str(b[9]))

    @classmethod
    def make_gateway(cls):
        """A namespace with a veth leg on each bridge, forwarding through a filter. The bridges
        exist once a container is on them (netavark makes them then): after the router starts."""
        run(["ip", "netns", "add", GATEWAY_NS])
        for side in ("a", "b"):
            outside, inside = f"h2n{side}{PID % 100000}", f"gw{side}"
            run(["ip", "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", GATEWAY_NS])
            run(["ip", "link", "set", outside, "master", cls.bridge[side], "up"])
            gw("ip", "addr", "add", f"{cls.ip['gateway_' + side]}/{cls.subnet[side].prefixlen}", "dev", inside)
            gw("ip", "link", "set", inside, "up")
        gw("sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        lo, hi = UCX_TCP_PORTS
        a_net = str(cls.subnet["a"])
        # The port rules come first and count every packet of their direction (the KV crossing);
        # replies are ESTABLISHED; any other new connection between A and B is dropped.
        rules = [
            ["-P", "FORWARD", "DROP"],
            # A -> B: prefill (and vault) to decode's UCX listener and UCX tcp transport ports.
            ["-A", "FORWARD", "-p", "tcp", "-s", a_net, "-d", cls.ip["decode"], "--dport", str(DECODE_UCX_PORT),
             "-m", "comment", "--comment", "a-to-decode-listener", "-j", "ACCEPT"],
            ["-A", "FORWARD", "-p", "tcp", "-s", a_net, "-d", cls.ip["decode"], "--dport", f"{lo}:{hi}",
             "-m", "comment", "--comment", "a-to-decode-ucx-tcp", "-j", "ACCEPT"],
            # B -> A: decode to the vault's UCX listener and UCX tcp transport ports on A.
            ["-A", "FORWARD", "-p", "tcp", "-s", cls.ip["decode"], "-d", cls.ip["vault"], "--dport", str(VAULT_UCX_PORT),
             "-m", "comment", "--comment", "decode-to-vault-listener", "-j", "ACCEPT"],
            ["-A", "FORWARD", "-p", "tcp", "-s", cls.ip["decode"], "-d", a_net, "--dport", f"{lo}:{hi}",
             "-m", "comment", "--comment", "decode-to-a-ucx-tcp", "-j", "ACCEPT"],
            ["-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
             "-m", "comment", "--comment", "replies", "-j", "ACCEPT"],
            ["-A", "FORWARD", "-m", "comment", "--comment", "dropped", "-j", "DROP"],
        ]
        for rule in rules:
            gw("iptables", "-w", *rule)

    @classmethod
    def container(cls, name, networks, command, routes=()):
        """A daemon's container with compose's hardening. NETWORKS: (network, address) pairs;
        ROUTES: (subnet, via) added to its namespace before the daemon runs (podman init makes
        the namespace, start runs the command). Returns the container's pid on the host."""
        argv = ["podman", "create", "--name", name, "--user", "10001:10001", "--read-only", "--tmpfs", "/tmp",
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "-v", f"{cls.secret}:/run/secrets/cluster_secret:ro",
                "-v", f"{os.path.dirname(MODEL_DIR)}:/models:ro",
                "-e", "UCX_TLS=tcp", "-e", "UCX_NET_DEVICES=eth0", "-e", "UCX_WARN_UNUSED_ENV_VARS=n",
                "-e", f"UCX_TCP_PORT_RANGE={UCX_TCP_PORTS[0]}-{UCX_TCP_PORTS[1]}"]
        for i, (network, address) in enumerate(networks):
            argv += ["--network", f"{network}:ip={address},interface_name=eth{i}"]
        run(argv + [IMAGE] + command, timeout=120)
        run(["podman", "init", name], timeout=120)
        pid = int(run(["podman", "inspect", "-f", "{{.State.Pid}}", name]).stdout)
        for subnet, via in routes:
            ns(pid, "ip", "route", "add", str(subnet), "via", via)
        run(["podman", "start", name], timeout=120)
        return pid

    @classmethod
    def start_cluster(cls):
        secret = ["--secret-file", "/run/secrets/cluster_secret", "--json-logs"]
        node = ["--model", MODEL, "--threads", "1"]
        vault_at = f"{cls.ip['vault']}:{VAULT_UCX_PORT}"
        # The only ways across: B through the gateway for prefill and vault, A for decode.
        via_a, via_b = [(cls.subnet["b"], cls.ip["gateway_a"])], [(cls.subnet["a"], cls.ip["gateway_b"])]
        cls.pid = {}
        cls.pid["router"] = cls.container(ROUTER, [(NET_A, cls.ip["router_a"]), (NET_B, cls.ip["router_b"])], [
            "hack-router", "--host", "0.0.0.0", "--port", "8000", "--model", MODEL,
            "--prefill", f"{cls.ip['prefill']}:8200", "--decode", f"{cls.ip['decode']}:8300", *secret])
        cls.make_gateway()
        cls.pid["vault"] = cls.container(VAULT, [(NET_A, cls.ip["vault"])], [
            "hack-vault", "--host", cls.ip["vault"], "--port", "8400", "--ucx-port", str(VAULT_UCX_PORT),
            "--max-bytes", "256M", *secret], routes=via_a)
        cls.pid["prefill"] = cls.container(PREFILL, [(NET_A, cls.ip["prefill"])], [
            "hack-prefill", "--host", cls.ip["prefill"], "--port", "8200", *node, "--vault", vault_at, *secret],
            routes=via_a)
        cls.pid["decode"] = cls.container(DECODE, [(NET_B, cls.ip["decode"])], [
            "hack-decode", "--host", cls.ip["decode"], "--port", "8300", "--ucx-port", str(DECODE_UCX_PORT),
            *node, "--vault", vault_at, *secret], routes=via_b)

    @classmethod
    def logs(cls):
        out = []
        for name in CONTAINERS:
            p = run(["podman", "logs", "--tail", "30", name], check=False)
            out.append(f"--- {name}\n{p.stdout}{p.stderr}")
        return "\n".join(out)

    @classmethod
    def tearDownClass(cls):
        if os.environ.get("KEEP") == "1":
            print(f"two_networks_test: KEEP=1, containers {CONTAINERS}, networks {NET_A} {NET_B}, "
                  f"namespace {GATEWAY_NS} left up", flush=True)
            return
        run(["podman", "rm", "-f", "-t", "5", *CONTAINERS], check=False, timeout=300)
        run(["ip", "netns", "delete", GATEWAY_NS], check=False)  # its veth legs go with it
        run(["podman", "network", "rm", "-f", NET_A, NET_B], check=False)
        run(["podman", "rmi", "-f", IMAGE], check=False)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def gateway_packets(self):
        """{comment: packets} of the gateway's FORWARD rules."""
        listing = gw("iptables", "-w", "-L", "FORWARD", "-v", "-x", "-n").stdout
        return {m.group(2): int(m.group(1)) for m in re.finditer(r"^\s*(\d+)\s+\d+\s.*/\* (\S+) \*/", listing, re.M)}

    def metric(self, url, name, labels):
        """The sum of the samples of Prometheus metric NAME at URL whose labels include LABELS."""
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def hack_run(self, messages, max_tokens):
        """hack-run --json from the same image in a container with no network: the reference.
        Same KV format and thread count as the nodes, so greedy ids must match exactly."""
        chat = os.path.join(self.tmp, "chat.json")
        with open(chat, "w") as f:
            json.dump(messages, f)
        os.chmod(chat, 0o644)
        p = run(["podman", "run", "--rm", "--network", "none", "--read-only", "--user", "10001:10001",
                 "-v", f"{os.path.dirname(MODEL_DIR)}:/models:ro", "-v", f"{chat}:/chat.json:ro", IMAGE,
                 "hack-run", "--model", MODEL, "--kv", "hack", "--threads", "1", "--temperature", "0",
                 "--top-p", "1", "--top-k", "0", "--min-p", "0", "--max-tokens", str(max_tokens),
                 "--chat-file", "/chat.json", "--json"], timeout=300)
        return json.loads(p.stdout)

    def test_1_only_the_ucx_ports_cross(self):
        # Control: the filter lets prefill reach decode's UCX listener across the gateway ...
        self.assertTrue(tcp_connects(self.pid["prefill"], self.ip["decode"], DECODE_UCX_PORT))
        # ... and nothing else: no HTTP between the nodes across the networks, either way.
        self.assertFalse(tcp_connects(self.pid["decode"], self.ip["prefill"], 8200), "decode reached prefill's HTTP")
        self.assertFalse(tcp_connects(self.pid["prefill"], self.ip["decode"], 8300), "prefill reached decode's HTTP")
        self.assertFalse(tcp_connects(self.pid["decode"], self.ip["vault"], 8400), "decode reached the vault's HTTP")
        self.assertGreater(self.gateway_packets()["dropped"], 0)
        # The router joins the networks but routes nothing: no node has a route through it.
        for name in ("prefill", "vault", "decode"):
            routes = ns(self.pid[name], "ip", "-4", "route").stdout
            self.assertNotIn(self.ip["router_a"], routes, name)
            self.assertNotIn(self.ip["router_b"], routes, name)
            self.assertNotIn("default", routes, name)

    def test_2_chat_through_the_router_equals_hack_run(self):
        import openai

        # Short enough that prefill stores no full block in the vault, long enough with the answer
        # (64 tokens) that decode stores the conversation's first 64-token block there.
        messages = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]
        max_tokens = 64
        ref = self.hack_run(messages, max_tokens)
        before = self.gateway_packets()
        client = openai.OpenAI(base_url=f"http://{self.ip['router_a']}:8000/v1", api_key="unused", max_retries=0,
                               timeout=180)
        r = client.chat.completions.create(model=os.path.basename(MODEL_DIR), messages=messages,
                                           max_tokens=max_tokens, temperature=0)
        self.assertTrue(ref["text"].strip(), ref)
        self.assertEqual(r.choices[0].message.content, ref["text"])
        self.assertEqual(r.choices[0].finish_reason, ref["finish_reason"])
        self.assertEqual(r.usage.completion_tokens, len(ref["ids"]))
        # The KV went to decode by host:port (a same-host UCX address is impossible here) ...
        metrics = f"http://{self.ip['prefill']}:8200/metrics"
        self.assertGreaterEqual(self.metric(metrics, "hack:kv_connects_total", {"by": "listener"}), 1)
        self.assertEqual(self.metric(metrics, "hack:kv_connects_total", {"by": "address"}), 0)
        # ... through the gateway: packets to decode's UCX ports crossed it during the request.
        after = self.gateway_packets()
        crossed = {k: after[k] - before[k] for k in after}
        print(f"two_networks_test: gateway packets during the request, by rule: {crossed}", flush=True)
        self.assertGreater(crossed["a-to-decode-listener"] + crossed["a-to-decode-ucx-tcp"], 0)
        self.assertGreater(r.usage.prompt_tokens, 0)
        self.assertLess(r.usage.prompt_tokens, 64, "prefill would store a block of its own")
        self.assertGreaterEqual(r.usage.prompt_tokens + r.usage.completion_tokens, 64, "decode would store none")
        # Decode stores the finished conversation in the vault (A) from B, across the gateway too.
        vault = f"http://{self.ip['vault']}:8400/metrics"
        wait_for("the conversation's block in the vault", lambda: self.metric(vault, "hack:vault_blocks", {}) >= 1, 60)
        after = self.gateway_packets()
        self.assertGreater(after["decode-to-vault-listener"] + after["decode-to-a-ucx-tcp"], 0, after)
        print(f"two_networks_test: gateway packets since the start, by rule: {after}", flush=True)

    def test_3_nothing_left_after_teardown(self):
        """Runs last (tests run in name order): the teardown the class does, checked."""
        if os.environ.get("KEEP") == "1":
            self.skipTest("KEEP=1 leaves everything up")
        type(self).tearDownClass()
        type(self).tearDownClass = classmethod(lambda cls: None)
        for name in CONTAINERS:
            self.assertNotEqual(run(["podman", "container", "exists", name], check=False).returncode, 0, name)
        for name in (NET_A, NET_B):
            self.assertNotEqual(run(["podman", "network", "exists", name], check=False).returncode, 0, name)
        self.assertNotIn(GATEWAY_NS, run(["ip", "netns", "list"]).stdout)

if __name__ == "__main__":
    reason = two_networks_skip_reason()
    if reason:
        print(f"SKIP: {reason}")
        sys.exit(SKIP)
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)
