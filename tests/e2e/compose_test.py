"""deploy/docker-compose.yml for real, with podman + podman-compose: builds the CPU image's
`runtime-host` target from the host's CPU-only binaries (deploy/docker/stage-runtime.sh;
compiling hackserve again inside the image would cost CI ~20 min on 2 cores — the full
multi-stage build is verified by hand, see README "Containers") and checks it holds no CUDA
library and stays within its 300 MB bound, brings the cluster up with the host's model
directory mounted read-only, sends chat requests through the router with the official
`openai` client, SIGKILLs the decode container's daemon and sees the restart policy bring it
back, and tears everything down. Helpers shared with two_networks_test.py: podman_harness.py.

Exits 77 (ctest SKIP_RETURN_CODE) with the reason when podman, podman-compose or a working
container runtime is missing. Settings (environment): HACK_BIN_DIR (build/bin; tests/CMakeLists.txt
points it at a CPU-only tree when the build has CUDA), HACK_MODEL_DIR
(models/smollm2-135m-instruct), KEEP=1 (leave the cluster up on failure).
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

from podman_harness import MODEL_DIR, ROOT, SKIP, ENV, run, skip_reason, free_port, http_ok, wait_for, \
    build_cpu_image

COMPOSE_FILE = os.path.join(ROOT, "deploy", "docker-compose.yml")
PROJECT = f"hacktest{os.getpid()}"
IMAGE = f"localhost/hackserve:compose-test-{os.getpid()}"


class ComposeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="hack-compose-")
        cls.port = free_port()
        cls.secret = os.path.join(cls.tmp, "cluster_secret")
        with open(cls.secret, "w") as f:
            f.write(os.urandom(16).hex() + "\n")
        os.chmod(cls.secret, 0o644)  # read by uid 10001 in the containers; the directory is private
        os.chmod(cls.tmp, 0o700)
        # The model is the host's, mounted read-only (the image carries none).
        ENV.update(HACK_IMAGE=IMAGE, HACK_PORT=str(cls.port), HACK_SECRET_FILE=cls.secret,
                   HACK_MODELS_DIR=os.path.dirname(MODEL_DIR), HACK_MODEL=os.path.basename(MODEL_DIR))
        build_cpu_image(IMAGE, cls.tmp)
        cls.compose = ["podman-compose", "-p", PROJECT, "-f", COMPOSE_FILE]
        cls.volumes_before = set(run(["podman", "volume", "ls", "-q"]).stdout.split())
        up = run(cls.compose + ["up", "-d"], check=False, timeout=900)
        print(f"compose_test: up -d in {up.seconds:.0f} s (exit {up.returncode})", flush=True)
        if up.returncode != 0:
            cls.tearDownClass()
            raise AssertionError(f"podman-compose up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}")
        try:
            wait_for("the router's /health", lambda: http_ok(f"http://127.0.0.1:{cls.port}/health"), 300)
        except AssertionError:
            print(cls.logs(), flush=True)
            cls.tearDownClass()
            raise

    @classmethod
    def logs(cls):
        out = []
        for service in ("vault", "prefill", "decode", "router"):
            p = run(["podman", "logs", "--tail", "30", cls.container(service)], check=False)
            out.append(f"--- {service}\n{p.stdout}{p.stderr}")
        return "\n".join(out)

    @classmethod
    def container(cls, service):
        # podman-compose 1.0.x names containers PROJECT_SERVICE_1.
        return f"{PROJECT}_{service}_1"

    @classmethod
    def tearDownClass(cls):
        if os.environ.get("KEEP") == "1":
            print(f"compose_test: KEEP=1, cluster {PROJECT} left up", flush=True)
            return
        run(cls.compose + ["down", "-v"], check=False, timeout=300)
        # podman-compose 1.0.3's `down` leaves the project's network behind.
        run(["podman", "network", "rm", "-f", f"{PROJECT}_hacknet"], check=False)
        run(["podman", "rmi", "-f", IMAGE], check=False)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def chat(self, text):
        import openai

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": text}],
                                           max_tokens=16, temperature=0)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertTrue(r.choices[0].message.content.strip(), r)
        self.assertGreater(r.usage.completion_tokens, 0)
        return r

    def inspect(self, service):
        p = run(["podman", "inspect", self.container(service)])
        return json.loads(p.stdout)[0]

    def test_4_nothing_left_after_down(self):
        """Runs last (tests run in name order): the teardown the class does, checked."""
        if os.environ.get("KEEP") == "1":
            self.skipTest("KEEP=1 leaves the cluster up")
        type(self).tearDownClass()
        type(self).tearDownClass = classmethod(lambda cls: None)
        left = run(["podman", "ps", "-a", "--filter", f"name={PROJECT}", "-q"]).stdout.split()
        self.assertEqual(left, [], "containers left after down")
        volumes = set(run(["podman", "volume", "ls", "-q"]).stdout.split()) - self.volumes_before
        self.assertEqual(volumes, set(), "volumes (named or anonymous) left after down -v")
        self.assertFalse(run(["podman", "network", "exists", f"{PROJECT}_hacknet"], check=False).returncode == 0,
                         "network left after down")

    def test_1_runs_as_configured(self):
        for service in ("vault", "prefill", "decode", "router"):
            c = self.inspect(service)
            self.assertTrue(c["State"]["Running"], service)
            self.assertEqual(c["Config"]["User"], "10001:10001", service)
            self.assertTrue(c["HostConfig"]["ReadonlyRootfs"], service)
            self.assertEqual(c["HostConfig"]["RestartPolicy"]["Name"], "on-failure", service)
            # The compose health check itself (hack-probe in the image) passes. podman schedules
            # health checks with systemd timers, which machines without systemd lack, so run it.
            run(["podman", "healthcheck", "run", self.container(service)])
        # The decode node advertises its container name, not the 0.0.0.0 it binds.
        health = run(["podman", "exec", self.container("router"), "hack-probe", "--url", "http://decode:8300/health"])
        self.assertIn("200", health.stdout)

    def test_2_chat_through_router(self):
        answers = [self.chat(q).choices[0].message.content for q in ("What is the capital of France?", "Say hello.")]
        again = self.chat("What is the capital of France?").choices[0].message.content
        self.assertEqual(again, answers[0], "greedy decoding of the same prompt must repeat itself")

    def test_3_killed_decode_is_restarted(self):
        before = self.inspect("decode")
        pid = before["State"]["Pid"]
        self.assertGreater(pid, 0)
        os.kill(pid, 9)  # a crash, as the restart policy sees it (podman kill / stop would not restart)
        wait_for("decode to be restarted", lambda: (lambda c: c["State"]["Running"] and c["State"]["Pid"] != pid)(
            self.inspect("decode")), 120)
        after = self.inspect("decode")
        self.assertGreater(after.get("RestartCount", 0), before.get("RestartCount", 0))
        # Back in service: the router sees it healthy again and a request goes through it.
        wait_for("the restarted decode to answer", lambda: self.try_chat(), 180)

    def try_chat(self):
        try:
            self.chat("Count to three.")
            return True
        except Exception:
            return False


if __name__ == "__main__":
    reason = skip_reason(("podman", "podman-compose"))
    if reason:
        print(f"SKIP: {reason}")
        sys.exit(SKIP)
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)
