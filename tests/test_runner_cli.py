"""The runner end to end with a stand-in ``ncu`` on PATH (a small script that plays back a recorded export:
the project's own --page raw CSV, and the real one from ../shared/fixtures when it sits beside the clone)."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kratos_runner.cli import main
from tests.harness import DATA, REPO, STAND_IN_NCU, T4_REPORT, require_fixtures

RAW_EXPORT = DATA / "ncu" / "a100-two-rank-gemm-raw-page.csv"  # 8 kernels, compute-bound, A100 (CC 8.0)
WORKLOAD = '#!/bin/sh\necho "workload ran with: $*"\nexit 3\n'


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "ncu", STAND_IN_NCU.format(python=sys.executable))
    executable(tmp_path / "vectorAdd", WORKLOAD)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("FAKE_NCU_LOG", str(tmp_path / "ncu-calls.log"))
    monkeypatch.setenv("FAKE_NCU_EXPORT", str(RAW_EXPORT))
    monkeypatch.setenv("KRATOS_TERMINATION_LOG", str(tmp_path / "termination-log"))
    return tmp_path


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(argv, stdout=out, stderr=err), out.getvalue(), err.getvalue()


# the export played back (None: the project's own), and what its summary must say: (bound, kernels, gpu)
PLAYED_BACK = [
    pytest.param(None, ("compute", 8, {"product": "NVIDIA-A100-SXM4-80GB", "computeCapability": "8.0"}), id="project-a100-raw-page"),
    pytest.param("deepbench-v100-gemm-raw-page.csv", ("latency", 18, {"product": "Tesla-V100-PCIE-32GB", "computeCapability": "7.0"}), id="outside-v100-raw-page"),
]  # fmt: skip


@pytest.mark.parametrize(("outside_export", "expected"), PLAYED_BACK)
def test_profiles_the_workload_writes_the_summary_and_keeps_its_exit_code(
    bench: Path,
    monkeypatch: pytest.MonkeyPatch,
    outside_export: str | None,
    expected: tuple[str, int, object],
):
    if outside_export is not None:
        monkeypatch.setenv("FAKE_NCU_EXPORT", str(require_fixtures() / "ncu" / outside_export))
    status, out, _ = run(["--launch-count", "50", "--", str(bench / "vectorAdd"), "-n", "1024; touch pwned"])
    assert status == 3, "fewer kernels than asked for: the workload ended by itself, with its own status"
    assert "workload ran with: -n 1024; touch pwned" in out, (
        "arguments passed as a list, never through a shell"
    )
    assert not (bench / "pwned").exists()
    summary = json.loads((bench / "termination-log").read_text())
    assert json.loads(out.strip().splitlines()[-1]) == summary
    bound, kernels, gpu = expected
    assert (summary["boundType"], summary["kernels"], summary["exitCode"]) == (bound, kernels, 3)
    assert (
        summary["ncuVersion"] == "2024.3.2.0"
        and summary["killed"] is False
        and summary["kernelsSkipped"] == 0
    )
    assert summary["gpu"] == gpu
    assert len((bench / "termination-log").read_bytes()) <= 4096
    calls = [
        eval(line) for line in (bench / "ncu-calls.log").read_text().splitlines()
    ]  # our own repr() lines
    profile_call = next(c for c in calls if "--export" in c)
    assert profile_call[:10] == [
        "--set", "basic", "--target-processes", "all", "--launch-skip", "0", "--launch-count", "50", "--kill", "yes",
    ]  # fmt: skip
    assert profile_call[-3:] == [str(bench / "vectorAdd"), "-n", "1024; touch pwned"]
    import_call = next(c for c in calls if "--import" in c)
    assert import_call[2:] == ["--csv", "--page", "raw", "--print-units", "base"]


def test_extra_ncu_arguments_and_set(bench: Path):
    status, _, _ = run(
        ["--set", "full", "--launch-count", "50", "--ncu-arg", "--cache-control", "--ncu-arg", "none", "--",
         str(bench / "vectorAdd")]
    )  # fmt: skip
    assert status == 3
    calls = (bench / "ncu-calls.log").read_text()
    assert "'--set', 'full'" in calls and "'--cache-control', 'none'" in calls


LONG_TRAINING = (
    "#!/bin/sh\n"
    "for epoch in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do echo kernel; sleep 0.05; done\n"
    'touch "$(dirname "$0")/finished"\n'
    "sleep 600\n"
    "exit 0\n"
)


def test_skips_s_kernels_profiles_n_then_ends_the_workload_and_reports_success(bench: Path):
    executable(bench / "train", LONG_TRAINING)
    status, out, _ = run(["--launch-skip", "3", "--launch-count", "4", "--", str(bench / "train")])
    assert status == 0, "a run that profiled its kernels is a success, whatever the killed workload's status"
    summary = json.loads((bench / "termination-log").read_text())
    assert (summary["kernelsSkipped"], summary["kernels"], summary["killed"]) == (3, 4, True)
    assert summary["exitCode"] != 0, "the status the kill left, reported as seen"
    assert summary["boundType"] != "unknown"
    assert not (bench / "finished").exists(), (
        "the workload was ended after its 7th kernel, not run to its end"
    )
    assert "==PROF== Profiling kernel 4" in out and "Profiling kernel 5" not in out


def test_a_workload_that_ends_before_its_kernels_are_profiled_keeps_its_own_status(bench: Path):
    executable(bench / "short", "#!/bin/sh\necho kernel\necho kernel\nexit 3\n")
    status, _, _ = run(["--launch-skip", "1", "--launch-count", "4", "--", str(bench / "short")])
    assert status == 3
    summary = json.loads((bench / "termination-log").read_text())
    assert (summary["kernels"], summary["killed"], summary["exitCode"]) == (1, False, 3)


@pytest.mark.parametrize("argv", [["--launch-skip", "-1"], ["--launch-count", "0"]], ids=["skip", "count"])
def test_bad_counts_are_refused_with_a_reason(bench: Path, argv):
    status, _, err = run([*argv, "--", str(bench / "vectorAdd")])
    assert status == 2 and "must be" in err


def test_permission_error_names_both_fixes(bench: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "perm")
    status, out, _ = run(["--", str(bench / "vectorAdd")])
    assert status == 3
    summary = json.loads((bench / "termination-log").read_text())
    assert summary["boundType"] == "unknown"
    assert "NVreg_RestrictProfilingToAdminUsers=0" in summary["reason"]
    assert "CAP_SYS_ADMIN" in summary["reason"] and "CAP_PERFMON" in summary["reason"]
    assert "ERR_NVGPUCTRPERM" in out  # ncu's own line reaches the Job's log


def test_missing_ncu_is_explained(bench: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    status, _, _ = run(["--", str(bench / "vectorAdd")])
    summary = json.loads((bench / "termination-log").read_text())
    assert status == 127 and "ncu not found" in summary["reason"]


def test_missing_executable_is_explained(bench: Path):
    status, _, _ = run(["--", str(bench / "not-staged")])
    summary = json.loads((bench / "termination-log").read_text())
    assert status == 127 and "not-staged is missing" in summary["reason"]


def test_no_workload_is_a_usage_error(bench: Path):
    status, _, err = run(["--set", "basic"])
    assert status == 2 and "no workload given" in err


def test_unwritable_termination_log_still_prints_the_summary(bench: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KRATOS_TERMINATION_LOG", str(bench / "no-such-dir" / "log"))
    status, out, err = run(["--", str(bench / "vectorAdd")])
    assert status == 3 and "cannot write the summary" in err
    assert json.loads(out.strip().splitlines()[-1])["kernels"] == 8


def test_parse_subcommand_as_a_process():
    result = subprocess.run(
        [sys.executable, "-m", "kratos_runner", "parse", str(T4_REPORT)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "runner")}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0
    assert json.loads(result.stdout)["boundType"] == "memory"
    missing = subprocess.run(
        [sys.executable, "-m", "kratos_runner", "parse", "/no/such/file.csv"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "runner")}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert missing.returncode == 2 and "No such file" in missing.stderr and "Traceback" not in missing.stderr


def test_ncu_args_may_start_with_a_dash_and_the_workload_args_are_left_alone():
    from kratos_runner.cli import join_ncu_args

    argv = ["--ncu-arg", "--kill", "--ncu-arg", "yes", "--", "/x", "--ncu-arg", "-v"]
    assert join_ncu_args(argv) == ["--ncu-arg=--kill", "--ncu-arg=yes", "--", "/x", "--ncu-arg", "-v"]


@pytest.mark.parametrize("cwd", [REPO, REPO / "runner"], ids=["repository-root", "runner-dir"])
def test_python_m_kratos_runner_works_from_the_repository_root_and_from_runner(cwd: Path, tmp_path: Path):
    """Issue 17: the installed distribution carries kratos_runner, so no PYTHONPATH is needed at the
    root; inside runner/ (as in the Nsight Compute image) the package is found beside it."""
    env = {k: val for k, val in os.environ.items() if k != "PYTHONPATH"}
    helped = subprocess.run([sys.executable, "-m", "kratos_runner", "--help"], cwd=cwd, env=env,
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert helped.returncode == 0 and "--launch-count" in helped.stdout, helped.stderr
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    parsed = subprocess.run([sys.executable, "-m", "kratos_runner", "parse", str(empty)], cwd=cwd, env=env,
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert "Traceback" not in parsed.stderr and json.loads(parsed.stdout)["boundType"] == "unknown"
