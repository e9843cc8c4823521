"""The whole KRATOS loop in one test, with only the GPU simulated:

user Job -> `review` rewrites it for profiling -> the profiling-runner command runs for real under a
stand-in ncu that plays back a recorded Nsight Compute report -> the controller (against the API test
double) publishes the WorkloadProfile and creates the execution Job -> `review` of that Job gives hints.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kratos_admit.cli.main import main as kratos_admit
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.signing import load_signing_key
from kratos_runner.cli import main as kratos_runner
from tests.harness import (
    EXAMPLES,
    STAND_IN_NCU,
    T4_REPORT,
    assert_valid_kubernetes,
    controller_outcome,
    executable,
    program_missing_a_library,
)

SIGNING_KEY = "f" * 64


def review(path: Path, profiles: Path, key: Path) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    status = kratos_admit(
        ["review", "-f", str(path), "--profiles", str(profiles), "--nodes", str(EXAMPLES / "nodes.yaml"),
         "--signing-key", str(key), "-o", "json"],
        stdout=out, stderr=err,
    )  # fmt: skip
    assert status == 0, err.getvalue()
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def run_profiling_pod(
    runner: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stage_workload: Callable[[Path], Path],
) -> tuple[int, str, str]:
    """The profiling pod's containers as local processes: ``stage_workload`` plays stage-workload (it
    writes the executable into the stage folder), then the profiling-runner's own command runs under
    the stand-in ncu. Returns the runner's status, its output and its termination message."""
    stage = tmp_path / "stage"
    stage.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "ncu", STAND_IN_NCU.format(python=sys.executable))
    stage_workload(stage / "vectorAdd")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("FAKE_NCU_LOG", str(tmp_path / "ncu.log"))
    monkeypatch.setenv("FAKE_NCU_EXPORT", str(T4_REPORT))
    monkeypatch.setenv("KRATOS_TERMINATION_LOG", str(tmp_path / "termination-log"))
    monkeypatch.setenv("KRATOS_STAGE_DIR", str(stage))  # the pod's /kratos/stage
    command = runner["command"]
    assert command[:3] == ["python3", "-m", "kratos_runner"]
    argv = [str(stage / Path(a).name) if a.startswith(v.STAGE_MOUNT_PATH) else a for a in command[3:]]
    out = io.StringIO()
    status = kratos_runner(argv, stdout=out, stderr=io.StringIO())
    return status, out.getvalue(), (tmp_path / "termination-log").read_text()


def vector_add_profiling_run(tmp_path: Path) -> tuple[Path, Path, dict[str, Any], dict[str, Any]]:
    """The example Job reviewed with no profile: the signing key, the (empty) profiles directory, the
    profiling Job it became and its runner container."""
    key = tmp_path / "signing.key"
    key.write_text(SIGNING_KEY)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    first = review(EXAMPLES / "vector-add-job.yaml", profiles, key)
    assert first["action"] == "profiling"
    profiling_job = first["object"]
    runner = profiling_job["spec"]["template"]["spec"]["containers"][0]
    assert runner["name"] == "profiling-runner"
    return key, profiles, profiling_job, runner


async def test_profile_once_then_every_run_is_placed_by_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # 1. the user's Job is admitted with no profile: rewritten into its profiling form
    key, profiles, profiling_job, runner = vector_add_profiling_run(tmp_path)

    # 2. the profiling pod runs: stage the workload, run the runner's own command under a stand-in ncu
    status, out, termination_message = run_profiling_pod(
        runner,
        tmp_path,
        monkeypatch,
        lambda path: executable(
            path, "#!/bin/sh\necho '[Vector addition of 50000 elements]'\necho 'Test PASSED'\n"
        ),
    )
    assert status == 0
    assert "Test PASSED" in out

    # 3. the Job finishes; the controller publishes the profile and releases the execution Job
    profile, created = await controller_outcome(
        profiling_job, termination_message, signing_key=load_signing_key(key)
    )
    assert profile is not None and profile["status"]["phase"] == "Ready"
    assert profile["status"]["boundType"] == "memory"  # the T4 report: 78.9 % memory vs 29.4 % SM

    # 4. the execution Job is admitted again and now gets hints from the published profile
    (profiles / "vector-add-profile.yaml").write_text(yaml.safe_dump(profile))
    execution = tmp_path / "execution.yaml"
    execution.write_text(yaml.safe_dump(created[0]))
    second = review(execution, profiles, key)
    assert second["allowed"] and second["action"] == "hints"
    hinted = second["object"]
    assert hinted["metadata"]["name"] == "vector-add-execution"
    assert hinted["metadata"]["labels"][v.ROLE_LABEL] == "execution"
    assert hinted["metadata"]["annotations"][v.PROFILE_ANNOTATION].startswith("vector-add-profile@")
    ranked = [
        r["product"] for r in json.loads(hinted["metadata"]["annotations"][v.HINTS_ANNOTATION])["ranked"]
    ]
    assert ranked.index("NVIDIA-A100-SXM4-80GB") < ranked.index("NVIDIA-L40S"), (
        "memory-bound: bandwidth first"
    )
    spec = hinted["spec"]["template"]["spec"]
    assert spec["containers"][0]["command"] == ["/cuda-samples/vectorAdd"], "the user's own workload runs"
    assert spec["runtimeClassName"] == "nvidia"
    assert_valid_kubernetes(hinted)


async def test_a_staged_program_missing_its_libraries_fails_the_profile_and_the_users_job_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Issue 24: the staged form copies one executable into the Nsight Compute image; one that needs a
    shared library of its own image cannot start there. The profile says so and names the in-image
    form; the user's Job runs unchanged as the execution Job, with base hints."""
    key, profiles, profiling_job, runner = vector_add_profiling_run(tmp_path)

    status, out, termination_message = run_profiling_pod(
        runner, tmp_path, monkeypatch, program_missing_a_library
    )
    assert status == 127, "the loader's status, as the runner's: the profiling Job fails (backoffLimit 0)"
    assert "error while loading shared libraries: libq.so.6" in out, "the loader's own line in the Job's log"

    profile, [created] = await controller_outcome(
        profiling_job, termination_message, signing_key=load_signing_key(key), exit_code=status
    )
    assert profile is not None and profile["status"]["phase"] == "Failed"
    message = profile["status"]["message"]
    assert "vectorAdd could not start: shared library libq.so.6 is missing" in message
    assert "gpu.scheduler.io/profiling-form: in-image" in message
    assert created["spec"]["template"]["spec"]["containers"][0]["command"] == ["/cuda-samples/vectorAdd"]

    (profiles / "vector-add-profile.yaml").write_text(yaml.safe_dump(profile))
    execution = tmp_path / "execution.yaml"
    execution.write_text(yaml.safe_dump(created))
    second = review(execution, profiles, key)
    assert second["allowed"] and second["object"]["metadata"]["name"] == "vector-add-execution"
    spec = second["object"]["spec"]["template"]["spec"]
    assert spec["containers"][0]["command"] == ["/cuda-samples/vectorAdd"], "the user's own workload runs"
    assert spec["runtimeClassName"] == "nvidia", "base hints"
