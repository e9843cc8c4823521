"""The runner built as one self-contained executable (runner/build_onefile.py, PyInstaller --onefile),
run as the in-image form runs it: under ``env -i``, with no PATH and so no Python to find.

The stand-in ``ncu`` is the harness's Python script, started through its ``#!`` line, which names an
interpreter by absolute path (the kernel needs no PATH for that): what is shown is that the RUNNER
needs no Python, which the real ncu (an ELF program) does not either. The workloads are ``/bin/sh``
scripts named by absolute path for the same reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import (
    DATA,
    STAND_IN_NCU,
    T4_REPORT,
    executable,
    program_missing_a_library,
)

pytest.importorskip(
    "PyInstaller",
    reason="PyInstaller is not installed (pip install -e '.[test]' brings it): the one-file runner cannot be built",
)

RAW_EXPORT = DATA / "ncu" / "a100-two-rank-gemm-raw-page.csv"
MAX_BYTES = (
    10 * 1024 * 1024
)  # measured 4.5 MiB (docs/profiling-forms.md); the in-image form copies it per pod
SHOWS_ITS_ENVIRONMENT = (
    "#!/bin/sh\n"
    'echo "workload LD_LIBRARY_PATH=${LD_LIBRARY_PATH-unset}"\n'
    'echo "workload PYI=$(env | grep -c "^_PYI_")"\n'
    "exit 3\n"
)


@pytest.fixture
def runner(onefile_runner: Path) -> Path:
    return onefile_runner


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    executable(tmp_path / "ncu", STAND_IN_NCU.format(python=sys.executable))
    executable(tmp_path / "train", SHOWS_ITS_ENVIRONMENT)
    (tmp_path / "stage").mkdir()
    return tmp_path


def run_bare(runner: Path, tools: Path, argv: list[str], **extra: str) -> tuple[int, str, dict[str, object]]:
    """``env -i`` with only what the stand-in ncu and the termination log need, plus ``extra``."""
    env = {
        "FAKE_NCU_LOG": str(tools / "ncu-calls.log"),
        "FAKE_NCU_EXPORT": str(RAW_EXPORT),
        "KRATOS_TERMINATION_LOG": str(tools / "termination-log"),
        "KRATOS_STAGE_DIR": str(tools / "stage"),
        **extra,
    }
    command = ["env", "-i", *(f"{k}={val}" for k, val in env.items()), str(runner), *argv]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    summary = (
        json.loads((tools / "termination-log").read_text()) if (tools / "termination-log").exists() else {}
    )
    return done.returncode, done.stdout, summary


def test_the_one_file_runner_is_a_single_elf_program_of_modest_size(runner: Path):
    assert runner.read_bytes()[:4] == b"\x7fELF"
    assert os.access(runner, os.X_OK)
    assert runner.stat().st_size < MAX_BYTES


def test_with_no_path_and_no_python_it_profiles_as_the_in_image_form_writes_it(runner: Path, tools: Path):
    argv = ["--ncu", str(tools / "ncu"), "--target-processes", "all", "--launch-count", "50", "--",
            str(tools / "train"), "--epochs", "90"]  # fmt: skip
    code, out, summary = run_bare(runner, tools, argv)
    assert code == 3, out
    assert (summary["boundType"], summary["kernels"], summary["exitCode"]) == ("compute", 8, 3)
    assert summary["ncuVersion"] == "2024.3.2.0"
    assert json.loads(out.strip().splitlines()[-1]) == summary
    calls = [eval(line) for line in (tools / "ncu-calls.log").read_text().splitlines()]  # our own repr()
    profile_call = next(c for c in calls if "--export" in c)
    assert profile_call[profile_call.index("--target-processes") + 1] == "all"
    assert profile_call[-3:] == [str(tools / "train"), "--epochs", "90"], "the user's command unchanged"


@pytest.mark.parametrize(
    ("extra", "seen"),
    [
        pytest.param({}, "unset", id="no-library-path"),
        pytest.param({"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}, "/usr/local/nvidia/lib64", id="the-users-library-path"),
    ],
)  # fmt: skip
def test_the_workload_gets_the_containers_environment_not_the_bootloaders(
    runner: Path, tools: Path, extra: dict[str, str], seen: str
):
    argv = ["--ncu", str(tools / "ncu"), "--launch-count", "50", "--", str(tools / "train")]
    code, out, _ = run_bare(runner, tools, argv, **extra)
    assert code == 3
    assert f"workload LD_LIBRARY_PATH={seen}\n" in out
    assert "workload PYI=0\n" in out


def test_a_staged_program_missing_a_library_names_the_in_image_form(runner: Path, tools: Path):
    staged = program_missing_a_library(tools / "stage" / "vectorAdd")
    code, out, summary = run_bare(runner, tools, ["--ncu", str(tools / "ncu"), "--", str(staged)])
    assert code == 127 and summary["kernels"] == 0
    assert "shared library libq.so.6 is missing" in str(summary["reason"])
    assert "gpu.scheduler.io/profiling-form: in-image" in str(summary["reason"])
    assert "error while loading shared libraries" in out


def test_parse_and_help_work_from_the_one_file(runner: Path, tools: Path):
    code, out, _ = run_bare(runner, tools, ["parse", str(T4_REPORT)])
    assert code == 0 and json.loads(out)["boundType"] == "memory"
    code, out, _ = run_bare(runner, tools, ["--help"])
    assert code == 0 and out.startswith("usage: kratos-runner ") and "--target-processes" in out
