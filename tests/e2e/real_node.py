"""What the real-node tiers share (issues 30, 36, 37): the user's working copy of the repository, a
shell as the user has one, the images built with docs/install.md's commands and loaded into the
node, the README's install steps run as written, the documented uninstall, waiting, and the API
server's own webhook latency histogram.

The node is a real kubelet with containerd and runc and fake GPUs; ``KRATOS_E2E_REAL_NODE`` names a
local Debian 12 image with python3 and python3-venv to build from (e.g.
``localhost/debian-python:bookworm``); podman builds the images and ``CONTAINERD_ADDRESS`` names the
node's containerd, into which they are loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from kratos_admit.domain import vocabulary as v
from tests.e2e.real_cluster import admin_kubeconfig, kubectl, own_environment
from tests.harness import REPO

Obj = dict[str, Any]

BASE = os.environ.get("KRATOS_E2E_REAL_NODE", "")
NAMESPACE = "kratos-system"
USERS = "team-a"  # the README's namespace
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
TAGS = ("0.1.0", "0.1.1")  # the README's tag, and the upgrade's
VECTOR_ADD_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"  # examples/vector-add-job.yaml's
TRAIN_IMAGE = "localhost/train:py"


def why_not() -> str | None:
    if admin_kubeconfig() is None:
        return (
            "end-to-end suite: set KRATOS_E2E_KUBECONFIG to an admin kubeconfig of a real cluster to run it"
        )
    if not BASE:
        return "real-node tier: set KRATOS_E2E_REAL_NODE to a local Debian 12 python3 image to build from"
    if shutil.which("podman") is None or not os.environ.get("CONTAINERD_ADDRESS"):
        return "real-node tier: needs podman and CONTAINERD_ADDRESS (the node's containerd)"
    return None


@dataclass
class Tier:
    """What the tests of this tier hand on to each other, in order."""

    work: Path  # the user's working directory: a copy of the repository's install files
    env: dict[str, str]
    figures: dict[str, Any] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)

    def need(self, step: str) -> None:
        if step not in self.done:
            pytest.fail(f"the earlier step {step!r} did not pass: this tier runs in order")


def sh(
    script: str, tier: Tier, *, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """A user's shell: bash in the working directory, -e, and what it printed."""
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tier.work, env=tier.env,
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if check:
        assert done.returncode == 0, (
            f"{script}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done


def shell_block(page: str, after: str) -> str:
    """The first ```sh block of ``page`` after the text ``after``."""
    text = (REPO / page).read_text()
    found = re.search(r"```sh\n(.*?)```", text[text.index(after) :], re.S)
    assert found, f"{page}: no sh block after {after!r}"
    return found.group(1)


def readme_steps() -> dict[int, str]:
    """The README's install block, by its numbered comments (``# 1. images`` ...)."""
    block = shell_block("README.md", "## Install on a cluster")
    steps: dict[int, str] = {}
    current = 0
    for line in block.splitlines(keepends=True):
        numbered = re.match(r"# (\d)\. ", line)
        if numbered:
            current = int(numbered.group(1))
        steps[current] = steps.get(current, "") + line
    return steps


def pods(namespace: str, selector: str) -> list[Obj]:
    """The Pods that run on (a Pod of a rollout's old ReplicaSet may still be terminating)."""
    listed = json.loads(kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json"))
    return [pod for pod in listed["items"] if "deletionTimestamp" not in pod["metadata"]]


def until(check: Any, *, timeout: float, what: str, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(every)


def load(tier: Tier, *images: str) -> None:
    """Into the node's containerd, as its own images (nothing is pulled: there is no registry)."""
    for image in images:
        sh(f"podman save {image} | ctr -n k8s.io images import - > /dev/null", tier)


def train_job(name: str, namespace: str, seconds: int = 0) -> Obj:
    """A ``python train.py`` Job in the Debian Python image built in test 1 (profiled in-image)."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {v.WORKLOAD_LABEL: name.split("-", maxsplit=1)[0]}},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [{
            "name": "train", "image": TRAIN_IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["python", "train.py", "--epochs", "1", "--seconds", str(seconds)], "workingDir": "/workspace",
            "resources": {"limits": {"nvidia.com/gpu": 1}},
        }]}}},
    }  # fmt: skip


def finished_in(namespace: str, name: str) -> bool:
    found = kubectl("-n", namespace, "get", "job", name, "-o", "json", "--ignore-not-found")
    conditions = json.loads(found)["status"].get("conditions", []) if found.strip() else []
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions)


def running_pod(namespace: str, job: str) -> Obj | None:
    running = [p for p in pods(namespace, f"job-name={job}") if p["status"].get("phase") == "Running"]
    return running[0] if running else None


def profile_status(namespace: str, workload: str) -> Obj:
    found = kubectl(
        "-n", namespace, "get", "workloadprofile", f"{workload}-profile", "-o", "json", "--ignore-not-found"
    )
    status: Obj = json.loads(found).get("status", {}) if found.strip() else {}
    return status


class SteadyCreates:
    """Server-side dry-run creates of the example Job in an opted-in namespace of its own, 4 a second
    (admitted exactly like real ones, sideEffects None), in a thread, while a ``with`` block runs."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.failures: list[str] = []
        self.answered = 0
        self.stop = threading.Event()
        probe = yaml.safe_load((REPO / "examples" / "vector-add-job.yaml").read_text())
        probe["metadata"]["namespace"] = namespace
        self.text = yaml.safe_dump(probe)
        self.worker = threading.Thread(target=self._creates)

    def _creates(self) -> None:
        while not self.stop.is_set():
            try:
                done = subprocess.run(
                    ["kubectl", "--kubeconfig", str(admin_kubeconfig()), "create", "--dry-run=server", "-o", "name", "-f", "-"],
                    input=self.text, capture_output=True, text=True, timeout=30, check=False,
                )  # fmt: skip
            except subprocess.TimeoutExpired:  # a failure too, not the end of the thread
                self.failures.append("kubectl create --dry-run=server: no answer within 30 s")
            else:
                if done.returncode != 0:
                    self.failures.append(done.stderr.strip())
            self.answered += 1
            self.stop.wait(0.25)

    def __enter__(self) -> SteadyCreates:
        kubectl("delete", "namespace", self.namespace, "--ignore-not-found", "--timeout=120s")
        kubectl("create", "namespace", self.namespace)
        kubectl("label", "namespace", self.namespace, f"{v.NAMESPACE_LABEL}=enabled")
        self.worker.start()
        time.sleep(3)
        return self

    def __exit__(self, *_: object) -> None:
        time.sleep(3)
        self.stop.set()
        self.worker.join(60)
        kubectl("delete", "namespace", self.namespace, "--wait=false")


def metric_histogram(webhook: str = "mutate.gpu.scheduler.io") -> dict[float, float]:
    """apiserver_admission_webhook_admission_duration_seconds of a webhook (KRATOS's mutating one by
    default), summed over its labels: cumulative count per bucket bound, and ``sum`` under -1."""
    buckets: dict[float, float] = {}
    for line in kubectl("get", "--raw", "/metrics").splitlines():
        if (
            line.startswith("apiserver_admission_webhook_admission_duration_seconds_sum{")
            and f'name="{webhook}"' in line
        ):
            buckets[-1.0] = buckets.get(-1.0, 0.0) + float(line.rsplit(" ", 1)[1])
        if (
            line.startswith("apiserver_admission_webhook_admission_duration_seconds_bucket{")
            and f'name="{webhook}"' in line
        ):
            bound = re.search(r'le="([^"]+)"', line)
            if bound:
                key = float("inf") if bound.group(1) == "+Inf" else float(bound.group(1))
                buckets[key] = buckets.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def pod_metric(namespace: str, selector: str, prefix: str) -> float:
    """The samples of the Pods' own ``/metrics`` (port 9090, read from inside each Pod, as a scraper
    on the Pod network reads it) whose line starts with ``prefix``, summed over the Pods."""
    total = 0.0
    script = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9090/metrics').read().decode())"
    for pod in pods(namespace, selector):
        text = kubectl("-n", namespace, "exec", pod["metadata"]["name"], "--", "python3", "-c", script)
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))
    return total


def quantiles(before: dict[float, float], after: dict[float, float]) -> tuple[float, float]:
    """p50 and p99 (the upper bound of the bucket that holds them) of the calls between two reads."""
    diff = sorted((bound, after[bound] - before.get(bound, 0.0)) for bound in after if bound >= 0)
    total = diff[-1][1] if diff else 0.0
    if total <= 0:
        return float("nan"), float("nan")
    p50, p99 = (next(b for b, c in diff if c >= q * total) for q in (0.5, 0.99))
    return p50, p99


def mean_seconds(before: dict[float, float], after: dict[float, float]) -> float:
    """The mean duration of the calls between two reads of ``metric_histogram``."""
    calls = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    return (after.get(-1.0, 0.0) - before.get(-1.0, 0.0)) / calls if calls else float("nan")


def working_copy(tmp_path_factory: pytest.TempPathFactory) -> Tier:
    """The user's working directory: a copy of the repository's install and build files, and the
    suite's own virtual environment as the README's ``.venv``."""
    work = tmp_path_factory.mktemp("user")
    for name in ("webhook-config", "examples", "runner"):
        shutil.copytree(
            REPO / name, work / name, ignore=shutil.ignore_patterns("__pycache__", "dist", "build")
        )
    for name in ("Dockerfile", "pyproject.toml", "README.md", ".dockerignore"):
        shutil.copy(REPO / name, work / name)
    for name in ("kratos_admit", "profiler-controller"):
        shutil.copytree(REPO / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return Tier(work, {**own_environment(), "KUBECONFIG": str(admin_kubeconfig())})  # as a user's shell


ADMIT_IMAGE, RUNNER_IMAGE = (
    f"localhost/kratos-admit:{TAGS[0]}",
    f"localhost/kratos-nsight-compute-poc:{TAGS[0]}",
)


def build_images(tier: Tier) -> None:
    """KRATOS's two images, built with docs/install.md's commands (podman's layer cache makes a second
    build quick), a second tag for upgrades, and the users' images: the example's CUDA sample path with
    a real executable, and a Debian Python image with train.py; all loaded into the node."""
    block = shell_block("docs/install.md", "## Building the images")
    assert "BASE=localhost/debian-python:bookworm" in block
    block = block.replace("BASE=localhost/debian-python:bookworm", f"BASE={BASE}")
    mount = f"-v {CA_BUNDLE}:{CA_BUNDLE}:ro " if Path(CA_BUNDLE).exists() else ""
    for line in [line for line in block.splitlines() if line.startswith("podman build")]:
        started = time.monotonic()
        sh(
            block.splitlines()[0] + "\n" + line.replace("podman build ", f"podman build -q {mount}", 1),
            tier,
            timeout=900,
        )
        image = line.split()[3]
        tier.figures[f"build {image}"] = round(time.monotonic() - started, 1)
    user = tier.work / "user-images"
    (user / "vector-add").mkdir(parents=True, exist_ok=True)
    (user / "vector-add" / "vectorAdd.c").write_text(
        '#include <stdio.h>\nint main(void) { puts("[Vector addition of 50000 elements]"); puts("Test PASSED"); return 0; }\n'
    )
    sh(f"cc -O2 -o {user}/vector-add/vectorAdd {user}/vector-add/vectorAdd.c", tier)
    (user / "vector-add" / "Containerfile").write_text(
        f"FROM {BASE}\nCOPY vectorAdd /cuda-samples/vectorAdd\n"
    )
    (user / "train").mkdir(exist_ok=True)
    (user / "train" / "train.py").write_text(
        "import sys, time\nprint('training', ' '.join(sys.argv[1:]), flush=True)\n"
        "time.sleep(float(dict(zip(sys.argv[1::2], sys.argv[2::2])).get('--seconds', 0)))\nprint('epoch 1 done')\n"
    )
    (user / "train" / "Containerfile").write_text(
        f"FROM {BASE}\nRUN ln -s /usr/bin/python3 /usr/local/bin/python\nWORKDIR /workspace\nCOPY train.py /workspace/train.py\n"
    )
    sh(
        f"podman build -q -t {VECTOR_ADD_IMAGE} {user}/vector-add && podman build -q -t {TRAIN_IMAGE} {user}/train",
        tier,
    )
    sh(f"podman tag {ADMIT_IMAGE} localhost/kratos-admit:{TAGS[1]}", tier)
    started = time.monotonic()
    load(tier, ADMIT_IMAGE, f"localhost/kratos-admit:{TAGS[1]}", RUNNER_IMAGE, VECTOR_ADD_IMAGE, TRAIN_IMAGE)
    tier.figures["load 5 images"] = round(time.monotonic() - started, 1)
    listed = sh("ctr -n k8s.io images ls -q", tier).stdout
    for image in (ADMIT_IMAGE, RUNNER_IMAGE, VECTOR_ADD_IMAGE, TRAIN_IMAGE):
        assert image in listed


def readme_install(tier: Tier) -> None:
    """The README's install, steps 2 and 3, run as written (a fresh kratos-system), then both
    Deployments rolled out."""
    steps = readme_steps()
    kubectl("delete", "namespace", NAMESPACE, USERS, "--ignore-not-found", "--timeout=120s", check=False)
    for number in (2, 3):
        started = time.monotonic()
        sh(steps[number].replace("REGISTRY", "localhost"), tier, timeout=300)
        tier.figures[f"README step {number}"] = round(time.monotonic() - started, 1)


def documented_uninstall(tier: Tier) -> None:
    """docs/operations.md "Uninstall", each command exiting 0, then nothing of KRATOS left."""
    block = shell_block("docs/operations.md", "## Uninstall")
    for line in [line.split("#", 1)[0].strip() for line in block.splitlines()]:
        if line:
            done = sh(line, tier, check=False, timeout=300)
            assert done.returncode == 0, f"{line}: exit {done.returncode}: {done.stderr.strip()}"
    leftovers = kubectl(
        "get", "mutatingwebhookconfigurations,validatingwebhookconfigurations,crd", "-o", "name"
    )
    assert "kratos" not in leftovers and "workloadprofiles" not in leftovers


def helm_config() -> helm.Config:
    return helm.Config(kubeconfig_path=str(admin_kubeconfig()), namespace=NAMESPACE)


def chart_values(tag: str, **more: Any) -> Obj:
    return {
        "image": {"repository": "localhost/kratos-admit", "tag": tag},
        "runnerImage": {"repository": "localhost/kratos-nsight-compute-poc", "tag": TAGS[0]},
        **more,
    }
