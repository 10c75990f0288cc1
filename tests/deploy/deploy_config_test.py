"""Static checks of deploy/: what `docker compose config` would catch (every compose file
parses, alone and with the GPU overlay, and refers only to declared services, networks,
volumes and secrets) and what it would not: every flag a compose command passes exists in
that daemon's --help, health checks probe the port the daemon listens on, the router and
Prometheus point at real services and ports, every Grafana query names a metric that
src/ registers, the systemd units pass `systemd-analyze verify`, and the image staging script
keeps CUDA libraries out.
Settings (environment): HACK_BUILD_DIR (build) for the daemons' --help."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
BIN = os.path.join(os.environ.get("HACK_BUILD_DIR", os.path.join(ROOT, "build")), "bin")
DOCKER_COMPOSE = shutil.which("docker") is not None and subprocess.run(
    ["docker", "compose", "version"], capture_output=True).returncode == 0
DAEMONS = {"router": "hack-router", "prefill": "hack-prefill", "decode": "hack-decode", "vault": "hack-vault"}


def load(name):
    with open(os.path.join(DEPLOY, name)) as f:
        return yaml.safe_load(f)


def merged(base, overlay):
    """Compose's merge of an override file: mappings merge key by key, the rest is replaced."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = dict(base)
        for k, v in overlay.items():
            out[k] = merged(base[k], v) if k in base else v
        return out
    return overlay


def flag_value(command, flag):
    return command[command.index(flag) + 1]


class ComposeFileTest(unittest.TestCase):
    def check_references(self, doc, where):
        services = doc["services"]
        for name, s in services.items():
            self.assertIn("image", s, f"{where}: {name}")
            for net in s.get("networks", []):
                self.assertIn(net, doc.get("networks", {}), f"{where}: {name} uses undeclared network {net}")
            for v in s.get("volumes", []):
                # A bind mount's host path may be a setting with a default: check the default.
                source = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", v).split(":")[0]
                if not source.startswith((".", "/")):
                    self.assertIn(source, doc.get("volumes", {}), f"{where}: {name} uses undeclared volume {source}")
                else:
                    self.assertTrue(os.path.exists(os.path.join(DEPLOY, source)), f"{where}: {name} mounts missing {source}")
            for sec in s.get("secrets", []):
                self.assertIn(sec, doc.get("secrets", {}), f"{where}: {name} uses undeclared secret {sec}")
            deps = s.get("depends_on", {})
            for dep in deps:
                self.assertIn(dep, services, f"{where}: {name} depends on unknown service {dep}")
                if isinstance(deps, dict):
                    self.assertIn(deps[dep]["condition"],
                                  ("service_started", "service_healthy", "service_completed_successfully"))
                    if deps[dep]["condition"] == "service_healthy":
                        self.assertIn("healthcheck", services[dep], f"{where}: {name} waits for {dep}'s health")
            self.assertIn(s.get("restart", "no"), ("no", "always", "on-failure", "unless-stopped"), f"{where}: {name}")

    def test_base_file(self):
        doc = load("docker-compose.yml")
        self.check_references(doc, "docker-compose.yml")
        services = doc["services"]
        for service, binary in DAEMONS.items():
            s = services[service]
            command = s["command"]
            self.assertEqual(command[0], binary)
            # Hardening every daemon container gets.
            self.assertEqual(s["user"], "10001:10001", service)
            self.assertTrue(s["read_only"], service)
            self.assertEqual(s["restart"], "on-failure", service)
            self.assertIn("ALL", s["cap_drop"], service)
            self.assertIn("cluster_secret", s["secrets"])
            self.assertEqual(flag_value(command, "--secret-file"), "/run/secrets/cluster_secret")
            # The health check probes the port the daemon listens on, and waits out a model load.
            hc = s["healthcheck"]
            self.assertEqual(hc["test"][:2], ["CMD", "hack-probe"])
            self.assertEqual(flag_value(hc["test"], "--url"), f"http://127.0.0.1:{flag_value(command, '--port')}/health")
            self.assertIn("start_period", hc)
            self.assertEqual(flag_value(command, "--host"), "0.0.0.0")
        # The router reaches the nodes by service name and their --port; decode advertises its name.
        router = services["router"]["command"]
        self.assertEqual(flag_value(router, "--prefill"), f"prefill:{flag_value(services['prefill']['command'], '--port')}")
        self.assertEqual(flag_value(router, "--decode"), f"decode:{flag_value(services['decode']['command'], '--port')}")
        self.assertEqual(flag_value(services["decode"]["command"], "--advertise-host"), "decode")
        vault_ucx = flag_value(services["vault"]["command"], "--ucx-port")
        for node in ("prefill", "decode"):
            self.assertEqual(flag_value(services[node]["command"], "--vault"), f"vault:{vault_ucx}")
        # Monitoring stays out of a plain `up`.
        for name in ("prometheus", "grafana"):
            self.assertEqual(services[name]["profiles"], ["monitoring"])

    def test_gpu_overlay(self):
        doc = merged(load("docker-compose.yml"), load("docker-compose.gpu.yml"))
        self.check_references(doc, "docker-compose.yml + docker-compose.gpu.yml")
        for node in ("prefill", "decode"):
            s = doc["services"][node]
            self.assertEqual(s["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"], ["gpu"])
            self.assertEqual(s["ulimits"]["memlock"], {"soft": -1, "hard": -1})
            self.assertEqual(s["environment"]["UCX_NET_DEVICES"], "all")  # the overlay wins over the base
            self.assertIn("UCX_WARN_UNUSED_ENV_VARS", s["environment"])  # and the base's other keys stay

    @unittest.skipUnless(os.access(os.path.join(BIN, "hack-decode"), os.X_OK), f"no daemons built in {BIN}")
    def test_every_flag_exists(self):
        services = load("docker-compose.yml")["services"]
        for service, binary in DAEMONS.items():
            help_text = subprocess.run([os.path.join(BIN, binary), "--help"], capture_output=True, text=True).stdout
            for arg in services[service]["command"][1:]:
                if arg.startswith("--"):
                    self.assertRegex(help_text, rf"(?m)^\s*{re.escape(arg)}\b", f"{binary} has no flag {arg}")

    @unittest.skipUnless(DOCKER_COMPOSE, "no `docker compose` here: its config check not run")
    def test_docker_compose_config(self):
        env = dict(os.environ, HACK_SECRET_FILE="/dev/null")
        for files in (["docker-compose.yml"], ["docker-compose.yml", "docker-compose.gpu.yml"]):
            args = [a for f in files for a in ("-f", os.path.join(DEPLOY, f))]
            p = subprocess.run(["docker", "compose", *args, "config", "-q"], capture_output=True, text=True, env=env)
            self.assertEqual(p.returncode, 0, p.stderr)


class MonitoringTest(unittest.TestCase):
    def registered_metrics(self):
        names = set()
        for base, _, files in os.walk(os.path.join(ROOT, "src")):
            for f in files:
                if f.endswith(".cpp"):
                    with open(os.path.join(base, f)) as fh:
                        names.update(re.findall(r'"(hack:[a-z0-9_]+)"', fh.read()))
        self.assertGreater(len(names), 10, "the metric scan found too little: did metrics.cpp move?")
        return names

    def test_dashboard_queries_real_metrics_in_request_path_order(self):
        with open(os.path.join(DEPLOY, "monitoring", "grafana", "dashboards", "hackserve.json")) as f:
            dash = json.load(f)
        known = self.registered_metrics()
        jobs = {c["job_name"] for c in load("monitoring/prometheus.yml")["scrape_configs"]}
        rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
        order = ["Router", "Prefill", "KV transfer", "Decode", "Vault"]
        self.assertEqual([next(o for o in order if r.startswith(o)) for r in rows], order)
        queried = set()
        for panel in dash["panels"]:
            for t in panel.get("targets", []):
                for name in re.findall(r"hack:[a-z0-9_]+", t["expr"]):
                    base = re.sub(r"_(bucket|sum|count)$", "", name)
                    self.assertIn(base, known, f"panel '{panel['title']}' queries {name}, which nothing registers")
                    queried.add(base)
                for job in re.findall(r'job="([a-z]+)"', t["expr"]):
                    self.assertIn(job, jobs, f"panel '{panel['title']}' queries unknown job {job}")
        for must in ("hack:time_to_first_token_seconds", "hack:inter_token_latency_seconds",
                     "hack:e2e_request_latency_seconds", "hack:kv_cache_usage_ratio",
                     "hack:kv_bytes_transferred_total", "hack:vault_hits_total", "hack:num_requests_waiting"):
            self.assertIn(must, queried)

    def test_prometheus_targets_are_services_and_ports(self):
        services = load("docker-compose.yml")["services"]
        for c in load("monitoring/prometheus.yml")["scrape_configs"]:
            host, port = c["static_configs"][0]["targets"][0].split(":")
            self.assertEqual(host, c["job_name"])
            self.assertEqual(flag_value(services[host]["command"], "--port"), port)

    def test_dashboard_is_generated(self):
        """The committed JSON is what make_dashboard.py writes (edit the script, not the JSON)."""
        import importlib.util

        spec = importlib.util.spec_from_file_location("make_dashboard", os.path.join(DEPLOY, "monitoring", "make_dashboard.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        with open(os.path.join(DEPLOY, "monitoring", "grafana", "dashboards", "hackserve.json")) as f:
            self.assertEqual(json.load(f), mod.dashboard())


def links_cuda(binary):
    p = subprocess.run(["ldd", binary], capture_output=True, text=True)
    return re.search(r"^\s*libcudart\.so", p.stdout, re.M) is not None


class StageRuntimeTest(unittest.TestCase):
    """docker/stage-runtime.sh keeps CUDA libraries out of every image it stages."""
    STAGE = os.path.join(DEPLOY, "docker", "stage-runtime.sh")

    def test_usage(self):
        p = subprocess.run([self.STAGE, BIN], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("usage:", p.stderr)

    @unittest.skipUnless(os.access(os.path.join(BIN, "hack-decode"), os.X_OK) and links_cuda(os.path.join(BIN, "hack-decode")),
                         f"the daemons in {BIN} are not a CUDA build")
    def test_cuda_build_refused_for_the_cpu_image_and_its_libraries_never_staged(self):
        with tempfile.TemporaryDirectory() as tmp:
            cpu = subprocess.run([self.STAGE, BIN, os.path.join(tmp, "cpu")], capture_output=True, text=True)
            self.assertEqual(cpu.returncode, 1, cpu.stderr)
            # The first binary that links any CUDA library is named with them: in a CUDA build the
            # router links libcudart (core's device Buffer, backend/cuda/device_memory_cuda.cpp),
            # the nodes libcublas too.
            self.assertRegex(cpu.stderr, r"links CUDA libraries \(lib(cu|nv)")
            self.assertIn("build-cpu-binaries.sh", cpu.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "cpu")), "refused, yet staged something")
            cuda = subprocess.run([self.STAGE, "--cuda", BIN, os.path.join(tmp, "cuda")], capture_output=True, text=True)
            self.assertEqual(cuda.returncode, 0, cuda.stderr)
            staged = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(tmp, "cuda")) for f in files]
            self.assertIn(os.path.join(tmp, "cuda", "usr", "local", "bin", "hack-decode"), staged)
            self.assertEqual([f for f in staged if re.match(r"lib(cu|nv|nccl)", os.path.basename(f))], [])


class SystemdTest(unittest.TestCase):
    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze is not installed")
    def test_units_verify(self):
        units = sorted(f for f in os.listdir(os.path.join(DEPLOY, "systemd")) if f.endswith(".service"))
        self.assertEqual(len(units), 4)
        # verify needs ExecStart's binary to exist: point the units at stand-ins in a temp root.
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for u in units:
                with open(os.path.join(DEPLOY, "systemd", u)) as f:
                    text = f.read().replace("/usr/local/bin/", tmp + "/")
                for binary in re.findall(re.escape(tmp) + r"/([a-z-]+)", text):
                    stub = os.path.join(tmp, binary)
                    with open(stub, "w") as f:
                        f.write("#!/bin/sh\n")
                    os.chmod(stub, 0o755)
                paths.append(os.path.join(tmp, u))
                with open(paths[-1], "w") as f:
                    f.write(text)
            p = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True, text=True)
            # Lines about the host's own units (not ours) are not this test's business.
            ours = [l for l in (p.stdout + p.stderr).splitlines() if any(u in l for u in units)]
            self.assertEqual(ours, [], "\n".join(ours))


if __name__ == "__main__":
    unittest.main()
