"""The profiling Pod KRATOS writes, run for real by the local kubelet (tests/local_kubelet.py): its
init container copies for real, its runner runs a real workload under a stand-in ncu that writes a
real export, and the controller turns what the runner wrote to /dev/termination-log into a Ready
profile and an execution Job that runs the user's original command."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from kratos_admit.cli.main import main as kratos_admit
from kratos_admit.domain.signing import load_signing_key
from tests.harness import DATA, EXAMPLES, REPO, STAND_IN_NCU, controller_outcome
from tests.local_kubelet import Image, available, run_pod

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))

SIGNING_KEY = "e" * 64
KRATOS_IMAGE = "kratos-nsight-compute-poc:latest"
STAND_IN_NCU_PATH = "opt/nvidia/nsight-compute/2024.3.2/ncu"  # where the runner looks for ncu (find_ncu)
RAW_EXPORT = DATA / "ncu" / "a100-two-rank-gemm-raw-page.csv"  # 8 GEMM kernels on an A100, compute-bound


def review(manifest: Path, key: Path) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    status = kratos_admit(
        ["review", "-f", str(manifest), "--signing-key", str(key), "-o", "json"], stdout=out, stderr=err
    )
    assert status == 0, err.getvalue()
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def layer(root: Path, files: dict[str, str], *, executable: tuple[str, ...] = ()) -> Path:
    """An image's own layer: ``files`` (path -> text) under ``root``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755 if name in executable else 0o644)
    return root


def kratos_staged_image(tmp_path: Path) -> Image:
    """The Nsight Compute image of the staged form as runner/Dockerfile builds it: python3, the runner
    under /opt/kratos (PYTHONPATH), and ncu, here the stand-in playing back a recorded A100 export."""
    root = layer(
        tmp_path / "kratos-image",
        {
            STAND_IN_NCU_PATH: STAND_IN_NCU.format(python="/usr/bin/python3"),
            "opt/fake-ncu/export.csv": RAW_EXPORT.read_text(),
        },
        executable=(STAND_IN_NCU_PATH,),
    )
    shutil.copytree(REPO / "runner" / "kratos_runner", root / "opt" / "kratos" / "kratos_runner")
    return Image(
        KRATOS_IMAGE,
        files=root,
        env={
            "PATH": "/usr/local/cuda/bin:/usr/bin:/bin",
            "PYTHONPATH": "/opt/kratos",
            "PYTHONDONTWRITEBYTECODE": "1",
            "FAKE_NCU_EXPORT": "/opt/fake-ncu/export.csv",
            "FAKE_NCU_LOG": "/tmp/ncu-calls.log",
        },
        workdir="/kratos",
    )


async def ready_profile_and_execution_container(
    job: dict[str, Any], termination_message: str, key: Path, bound_type: str
) -> dict[str, Any]:
    """The controller's outcome of the run: a Ready profile of ``bound_type``, and the one execution
    Job's container."""
    profile, executions = await controller_outcome(
        job, termination_message, signing_key=load_signing_key(key)
    )
    assert profile is not None and profile["status"]["phase"] == "Ready"
    assert profile["status"]["boundType"] == bound_type
    [execution] = executions
    container: dict[str, Any] = execution["spec"]["template"]["spec"]["containers"][0]
    return container


async def test_the_staged_form_runs_for_real_and_ends_in_a_ready_profile_and_the_original_command(
    tmp_path: Path,
):
    key = tmp_path / "signing.key"
    key.write_text(SIGNING_KEY)
    profiling = review(EXAMPLES / "new-workload-job.yaml", key)
    assert profiling["action"] == "profiling"
    job = profiling["object"]
    pod_spec = job["spec"]["template"]["spec"]
    user_image = pod_spec["initContainers"][-1]["image"]
    # the user's image: the CUDA program at the path its Job names, as a script that announces its kernels
    workload = "#!/bin/sh\nfor i in 1 2; do echo kernel; done\necho 'matrixMul: Result = PASS'\n"
    images = {
        user_image: Image(
            user_image,
            files=layer(
                tmp_path / "user-image", {"opt/app/matrixMul": workload}, executable=("opt/app/matrixMul",)
            ),
        ),
        KRATOS_IMAGE: kratos_staged_image(tmp_path),
    }

    stage, runner = run_pod(pod_spec, images, tmp_path / "pod")

    assert (stage.name, stage.exit_code) == ("stage-workload", 0), stage.log
    assert (tmp_path / "pod" / "volumes" / "kratos-stage" / "matrixMul").read_text() == workload, (
        "copied for real"
    )
    assert (runner.name, runner.exit_code) == ("profiling-runner", 0), runner.log
    assert "matrixMul: Result = PASS" in runner.log, "the staged workload itself ran"
    summary = json.loads(runner.termination_message)
    assert summary["kernels"] == 2, "the two kernels the workload launched were profiled"
    assert summary["boundType"] == "compute" and summary["gpu"]["computeCapability"] == "8.0"
    calls = (tmp_path / "pod" / "roots" / "profiling-runner" / "tmp" / "ncu-calls.log").read_text()
    assert "'/kratos/stage/matrixMul', '-wA=2048'" in calls, "ncu ran the staged copy with the user's args"

    container = await ready_profile_and_execution_container(job, runner.termination_message, key, "compute")
    original = yaml.safe_load((EXAMPLES / "new-workload-job.yaml").read_text())["spec"]["template"]["spec"]
    assert container["command"] == original["containers"][0]["command"], "the user's original command"
    assert "args" not in container
    assert container["image"] == user_image


def test_a_missing_executable_fails_the_init_container_with_its_message(tmp_path: Path):
    key = tmp_path / "signing.key"
    key.write_text(SIGNING_KEY)
    pod_spec = review(EXAMPLES / "new-workload-job.yaml", key)["object"]["spec"]["template"]["spec"]
    user_image = pod_spec["initContainers"][-1]["image"]
    images = {user_image: Image(user_image), KRATOS_IMAGE: kratos_staged_image(tmp_path)}

    runs = run_pod(pod_spec, images, tmp_path / "pod")

    assert [r.name for r in runs] == ["stage-workload"], (
        "the runner never starts after a failed init container"
    )
    assert runs[0].exit_code == 66
    assert "executable /opt/app/matrixMul does not exist in this image" in runs[0].log


TRAIN_PY = '''"""A few steps of a training loop: real Python, in the workload's own image and working directory."""
import argparse, json, os
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
args = parser.parse_args()
weights = [0.0] * 256
for step in range(args.steps):
    print("kernel", flush=True)  # one GPU kernel launch a step, as the stand-in ncu counts them
    weights = [w + 0.01 * (i % 7 - 3) for i, w in enumerate(weights)]
    print(f"step {step} loss {sum(w * w for w in weights):.4f}", flush=True)
with open(os.path.join(os.environ["OUT_DIR"], "trained.json"), "w") as out:
    json.dump({"steps": args.steps, "cwd": os.getcwd(), "uid": os.getuid()}, out)
'''

TRAINING_JOB = """
apiVersion: batch/v1
kind: Job
metadata: {name: tiny-train, namespace: team-a, labels: {gpu.scheduler.io/workload: tiny-train}}
spec:
  template:
    spec:
      restartPolicy: Never
      securityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: train
        image: registry.example.com/team-a/tiny-train:1
        command: [python3, train.py, --steps, "3"]
        workingDir: /workspace
        env: [{name: OUT_DIR, value: /scratch}]
        volumeMounts: [{name: scratch, mountPath: /scratch}]
        resources: {limits: {nvidia.com/gpu: 1}}
        securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
      volumes: [{name: scratch, emptyDir: {}}]
"""

# The stand-in ncu as the in-image form meets it: Nsight Compute's tree copied into /kratos/tools, the
# real program under target/ and nsight-compute/ncu a relative link to it (runner/Dockerfile's layout);
# it runs in the workload's own image (which has python3) and finds its recorded export beside itself.
STAND_IN_TARGET = "opt/kratos/tools/nsight-compute/target/linux-desktop-glibc_2_11_3-x64"
STAND_IN_WRAPPER = """#!/usr/bin/python3
import os
here = os.path.dirname(os.path.realpath(__file__))
os.environ.setdefault("FAKE_NCU_EXPORT", os.path.join(here, "export.csv"))
os.environ.setdefault("FAKE_NCU_LOG", "/tmp/ncu-calls.log")
exec(compile(open(os.path.join(here, "stand_in_ncu.py")).read(), "ncu", "exec"))
"""


def kratos_tools_image(tmp_path: Path, runner: Path) -> Image:
    """The runner image as runner/Dockerfile builds it, for the in-image form: /opt/kratos/tools with
    the one-file runner and Nsight Compute's command line, and a shell for stage-profiler's copy."""
    root = layer(
        tmp_path / "kratos-tools-image",
        {
            f"{STAND_IN_TARGET}/ncu": STAND_IN_WRAPPER,
            f"{STAND_IN_TARGET}/stand_in_ncu.py": STAND_IN_NCU.format(python="/usr/bin/python3"),
            f"{STAND_IN_TARGET}/export.csv": RAW_EXPORT.read_text(),
        },
        executable=(f"{STAND_IN_TARGET}/ncu",),
    )
    (root / "opt/kratos/tools/nsight-compute/ncu").symlink_to("target/linux-desktop-glibc_2_11_3-x64/ncu")
    shutil.copy2(runner, root / "opt/kratos/tools/kratos-runner")
    return Image(KRATOS_IMAGE, files=root, workdir="/kratos")


async def test_the_in_image_form_profiles_a_python_script_in_its_own_image_and_the_execution_job_runs_it(
    tmp_path: Path, onefile_runner: Path
):
    key = tmp_path / "signing.key"
    key.write_text(SIGNING_KEY)
    manifest = tmp_path / "job.yaml"
    manifest.write_text(TRAINING_JOB)
    profiling = review(manifest, key)
    assert profiling["action"] == "profiling"
    job = profiling["object"]
    pod_spec = job["spec"]["template"]["spec"]
    user_image = "registry.example.com/team-a/tiny-train:1"
    images = {
        # the user's image: python3 and the script in its working directory; no Nsight Compute, no runner
        user_image: Image(user_image, files=layer(tmp_path / "user-image", {"workspace/train.py": TRAIN_PY})),
        KRATOS_IMAGE: kratos_tools_image(tmp_path, onefile_runner),
    }

    stage, runner = run_pod(pod_spec, images, tmp_path / "pod")

    assert (stage.name, stage.exit_code) == ("stage-profiler", 0), stage.log
    tools = tmp_path / "pod" / "volumes" / "kratos-tools"
    assert (tools / "kratos-runner").read_bytes()[:4] == b"\x7fELF", "the one-file runner, copied for real"
    assert (tools / "nsight-compute" / "ncu").is_symlink(), "the link to the real program kept"
    assert (runner.name, runner.exit_code) == ("profiling-runner", 0), runner.log
    assert "step 2 loss" in runner.log, "the user's own script ran, in the user's image"
    summary = json.loads(runner.termination_message)
    assert summary["kernels"] == 3 and summary["boundType"] == "compute", summary
    trained = json.loads((tmp_path / "pod" / "volumes" / "scratch" / "trained.json").read_text())
    assert trained == {"steps": 3, "cwd": "/workspace", "uid": 1000}, (
        "its env, mount, workingDir and user kept"
    )
    calls = (tmp_path / "pod" / "roots" / "profiling-runner" / "tmp" / "ncu-calls.log").read_text()
    assert "'--target-processes', 'all'" in calls and "'python3', 'train.py', '--steps', '3']" in calls

    container = await ready_profile_and_execution_container(job, runner.termination_message, key, "compute")
    original = yaml.safe_load(TRAINING_JOB)["spec"]["template"]["spec"]["containers"][0]
    # exactly as written, plus what the API server fills in on create (the double defaults as it does)
    assert {k: container[k] for k in original} == original, "the execution Job runs the user's container"
    assert set(container) - set(original) <= {
        "imagePullPolicy",
        "terminationMessagePath",
        "terminationMessagePolicy",
    }
