"""What the container tests (compose_test.py, two_networks_test.py) share: podman with this
project's settings (deploy/docker/containers.conf: runc, no default ulimits), the skip check,
and the CPU image packed from host-built binaries (the Dockerfile's `runtime-host` target).

Settings (environment): HACK_BIN_DIR (build/bin; CPU-only binaries, see
deploy/docker/build-cpu-binaries.sh), HACK_MODEL_DIR (models/smollm2-135m-instruct).
"""
import os
import shutil
import socket
import subprocess
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCKER = os.path.join(ROOT, "deploy", "docker")
BIN_DIR = os.environ.get("HACK_BIN_DIR", os.path.join(ROOT, "build", "bin"))
MODEL_DIR = os.path.abspath(os.environ.get("HACK_MODEL_DIR", os.path.join(ROOT, "models", "smollm2-135m-instruct")))
SKIP = 77
# The CPU image's bound (issue 36): what the runtime needs, no CUDA library, no model.
IMAGE_MAX_BYTES = 300_000_000
ENV = dict(os.environ, CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", os.path.join(DOCKER, "containers.conf")))


def run(cmd, timeout=600, check=True, **kw):
    """subprocess.run with ENV, output captured as text and .seconds set; raises with the
    output's tail when check and the command fails."""
    started = time.monotonic()
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    p.seconds = time.monotonic() - started
    return p


def skip_reason(tools=("podman",)):
    """Why the container tests cannot run here (None when they can): a missing tool, no
    debian:12 base image and no way to make one, or a podman that cannot start a container."""
    for tool in tools:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/install-deps.sh installs it)"
    if not os.access(os.path.join(BIN_DIR, "hack-probe"), os.X_OK):
        return None  # not a runtime problem: the test fails loudly when it stages the binaries
    made = run([os.path.join(DOCKER, "make-base-image.sh")], check=False, timeout=900)
    if made.returncode != 0:
        return f"cannot make the debian:12 base image: {made.stderr.strip()[-500:]}"
    probe = run(["podman", "run", "--rm", "debian:12", "true"], check=False, timeout=120)
    if probe.returncode != 0:
        return f"podman cannot run a container here: {probe.stderr.strip()[-500:]}"
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def wait_for(what, predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def cuda_files(image):
    """Paths in IMAGE of CUDA libraries (the runtime, cuBLAS, the driver, NCCL), by name."""
    p = run(["podman", "run", "--rm", "--network", "none", "--user", "0", image, "find", "/", "-xdev",
             "(", "-name", "libcu*.so*", "-o", "-name", "libnv*.so*", "-o", "-name", "libnccl*.so*", ")", "-print"])
    return p.stdout.split()


def build_cpu_image(tag, work_dir):
    """Packs the CPU image TAG from BIN_DIR (stage-runtime.sh into WORK_DIR/context, then the
    Dockerfile's `runtime-host` target) and returns its size in bytes. Fails when the image
    holds a CUDA library or exceeds IMAGE_MAX_BYTES."""
    context = os.path.join(work_dir, "context")
    run([os.path.join(DOCKER, "stage-runtime.sh"), BIN_DIR, os.path.join(context, "rootfs")])
    built = run(["podman", "build", "--format", "docker", "--target", "runtime-host", "-f",
                 os.path.join(DOCKER, "Dockerfile"), "-t", tag, context], timeout=900)
    size = int(run(["podman", "image", "inspect", "-f", "{{.Size}}", tag]).stdout.strip())
    print(f"podman_harness: image {tag} built in {built.seconds:.0f} s, {size / 1e6:.0f} MB", flush=True)
    cuda = cuda_files(tag)
    if cuda:
        raise AssertionError(f"the CPU image {tag} carries CUDA libraries: {cuda}")
    if size > IMAGE_MAX_BYTES:
        raise AssertionError(f"the CPU image {tag} is {size / 1e6:.0f} MB, over its {IMAGE_MAX_BYTES / 1e6:.0f} MB "
                             f"bound: `podman history {tag}` shows its layers")
    return size
