"""The runner end to end with a stand-in ``ncu`` on PATH (a small script that plays back a recorded export:
the project's own --page raw CSV, and the real one from ../shared/fixtures when it sits beside the clone)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kratos_runner.cli import main
from kratos_runner.launch import cannot_start, child_environment, loader_failure
from tests.builders import EM_AARCH64, EM_X86_64, elf_program
from tests.harness import (
    DATA,
    REPO,
    STAND_IN_NCU,
    T4_REPORT,
    executable,
    program_missing_a_library,
    python38,
    require_fixtures,
)

RAW_EXPORT = DATA / "ncu" / "a100-two-rank-gemm-raw-page.csv"  # 8 kernels, compute-bound, A100 (CC 8.0)
WORKLOAD = '#!/bin/sh\necho "workload ran with: $*"\nexit 3\n'


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
    status, out, err = run(["--launch-count", "50", "--", str(bench / "vectorAdd")])
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


# --- a workload that cannot start -----------------------------------------------------------------------

IN_IMAGE_FIX = "gpu.scheduler.io/profiling-form: in-image"
# this machine's ELF e_machine, and another one's
MACHINES = {"x86_64": (EM_X86_64, EM_AARCH64), "aarch64": (EM_AARCH64, EM_X86_64)}.get(os.uname().machine)


def _unstartable(kind: str, directory: Path) -> Path:
    """A staged executable of the given kind that the kernel or the dynamic loader refuses here."""
    path = directory / kind
    if kind == "not-found":
        return path
    if kind == "permission-denied":
        path.write_text("#!/bin/sh\necho kernel\n")
        return path
    if kind == "exec-format":
        return executable(path, "echo kernel\n")  # executable bit, but no #! line and no ELF header
    if kind == "script-without-interpreter":
        return executable(path, f"#!{directory}/no-such-shell -e\necho kernel\n")
    if kind == "env-names-a-missing-interpreter":
        return executable(path, "#!/usr/bin/env kratos-no-such-python3\nprint('kernel')\n")
    if kind == "directory":
        path.mkdir()
        return path
    if MACHINES is None:
        pytest.skip(f"no ELF machine table for {os.uname().machine}")
    native, foreign = MACHINES
    if kind == "other-machine":
        return executable(path, elf_program(foreign, "/lib/ld-linux.so.2"))
    if kind == "missing-dynamic-loader":
        return executable(path, elf_program(native, f"{directory}/ld-musl-x86_64.so.1"))
    if kind == "object-file":
        return executable(path, elf_program(native, elf_type=1))
    assert kind == "missing-shared-library"
    return program_missing_a_library(path)


# kind, the runner's status, what the reason says, whether ncu ran (the loader only refuses at run time)
CANNOT_START = [
    pytest.param("not-found", (127, "is missing (not found)", False), id="not-found"),
    pytest.param("permission-denied", (126, "is not executable (permission denied)", False), id="permission-denied"),
    pytest.param("exec-format", (126, "neither an ELF program nor a #! script (exec format error)", False), id="exec-format"),
    pytest.param("directory", (126, "is a directory", False), id="directory"),
    pytest.param("script-without-interpreter", (127, "no-such-shell, which this image does not have", False), id="script-without-interpreter"),
    pytest.param("env-names-a-missing-interpreter", (127, "script for kratos-no-such-python3, which is not on PATH", False), id="env-interpreter-missing"),
    pytest.param("other-machine", (126, "(exec format error)", False), id="other-machine"),
    pytest.param("object-file", (126, "not a program (exec format error)", False), id="object-file"),
    pytest.param("missing-dynamic-loader", (127, "needs the dynamic loader", False), id="missing-dynamic-loader"),
    pytest.param("missing-shared-library", (127, "shared library libq.so.6 is missing (cannot open shared object file", True), id="missing-shared-library"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "expected"), CANNOT_START)
def test_a_staged_executable_that_cannot_start_is_named_with_the_in_image_form_as_the_fix(
    bench: Path, monkeypatch: pytest.MonkeyPatch, kind: str, expected: tuple[int, str, bool]
):
    status, says, ncu_ran = expected
    stage = bench / "stage"
    stage.mkdir()
    monkeypatch.setenv("KRATOS_STAGE_DIR", str(stage))
    exe = _unstartable(kind, stage)
    code, out, _ = run(["--launch-count", "5", "--", str(exe), "--epochs", "90"])
    summary = json.loads((bench / "termination-log").read_text())
    assert code == status == summary["exitCode"]
    assert (summary["boundType"], summary["kernels"]) == ("unknown", 0)
    assert says in summary["reason"] and str(exe) in summary["reason"], summary["reason"]
    assert IN_IMAGE_FIX in summary["reason"], "the reason names the annotation that fixes it"
    assert len(encode(summary)) <= 4096
    calls = (bench / "ncu-calls.log").read_text() if (bench / "ncu-calls.log").exists() else ""
    assert ("--export" in calls) is ncu_ran, "what execve would refuse is found before ncu runs"
    if ncu_ran:
        assert "error while loading shared libraries: libq.so.6" in out, "the loader's own line in the log"


def encode(summary: dict[str, object]) -> bytes:
    return json.dumps(summary, separators=(",", ":")).encode()


def test_outside_the_stage_directory_the_reason_does_not_send_the_user_to_the_in_image_form(
    bench: Path, monkeypatch: pytest.MonkeyPatch
):
    """In the in-image form the command is the user's own, in the user's own image: a missing program
    there is the user's to fix, and the in-image form is no remedy for it."""
    monkeypatch.setenv("KRATOS_STAGE_DIR", str(bench / "stage"))
    code, _, _ = run(["--", "kratos-no-such-trainer", "train.py"])
    summary = json.loads((bench / "termination-log").read_text())
    assert code == 127 and "kratos-no-such-trainer not found on PATH" in summary["reason"]
    assert IN_IMAGE_FIX not in summary["reason"]
    library = program_missing_a_library(bench / "app")
    code, _, _ = run(["--", str(library)])
    summary = json.loads((bench / "termination-log").read_text())
    assert code == 127 and "libq.so.6 is missing" in summary["reason"]
    assert IN_IMAGE_FIX not in summary["reason"]


def test_a_command_without_a_slash_is_found_on_path_as_the_users_container_would(
    bench: Path, monkeypatch: pytest.MonkeyPatch
):
    """The in-image form runs the user's command as written (``python``, ``torchrun``): it is looked
    up on PATH, and handed to ncu unchanged."""
    monkeypatch.setenv("PATH", f"{bench}{os.pathsep}{os.environ['PATH']}")
    code, _, _ = run(["--launch-count", "50", "--", "vectorAdd", "--n", "8"])
    assert code == 3
    profile_call = next(c for c in _calls(bench) if "--export" in c)
    assert profile_call[-3:] == ["vectorAdd", "--n", "8"]


def _calls(bench: Path) -> list[list[str]]:
    return [eval(line) for line in (bench / "ncu-calls.log").read_text().splitlines()]  # our own repr() lines


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param([], "all", id="default-follows-child-processes"),
        pytest.param(["--target-processes", "all"], "all", id="all-as-the-in-image-form-writes-it"),
        pytest.param(["--target-processes", "application-only"], "application-only", id="root-process-only"),
    ],
)
def test_target_processes_is_passed_to_ncu(bench: Path, argv: list[str], expected: str):
    code, _, _ = run([*argv, "--launch-count", "50", "--", str(bench / "vectorAdd")])
    assert code == 3
    profile_call = next(c for c in _calls(bench) if "--export" in c)
    assert profile_call[profile_call.index("--target-processes") + 1] == expected


def test_an_unknown_target_processes_value_is_a_usage_error(bench: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exited:
        run(["--target-processes", "children", "--", str(bench / "vectorAdd")])
    assert exited.value.code == 2
    assert "--target-processes: invalid choice: 'children'" in capsys.readouterr().err


def test_an_ncu_that_cannot_start_here_is_named(bench: Path):
    """Nsight Compute's top-level ``ncu`` is a shell script: in an image without that shell the runner
    says so instead of failing on an empty report."""
    ncu = executable(bench / "ncu-wrapper", f'#!{bench}/no-such-sh\nexec ncu "$@"\n')
    code, _, _ = run(["--ncu", str(ncu), "--", str(bench / "vectorAdd")])
    summary = json.loads((bench / "termination-log").read_text())
    assert code == 127
    assert summary["reason"].startswith(f"cannot start ncu: ncu {ncu} is a script for {bench}/no-such-sh")
    assert IN_IMAGE_FIX not in summary["reason"]


def test_an_ncu_path_that_does_not_exist_is_named(bench: Path):
    code, _, _ = run(["--ncu", str(bench / "tools" / "ncu"), "--", str(bench / "vectorAdd")])
    summary = json.loads((bench / "termination-log").read_text())
    assert code == 127 and f"ncu not found at {bench / 'tools' / 'ncu'}" in summary["reason"]


def test_a_program_this_machine_runs_passes_the_start_checks():
    assert cannot_start(sys.executable) == ("", 0)
    assert cannot_start(os.path.realpath(sys.executable)) == ("", 0), "a real ELF program with its loader"


# output, what loader_failure makes of it ("" when the workload started)
LOADER_OUTPUTS = [
    pytest.param("/kratos/stage/app: error while loading shared libraries: libtorch_cuda.so: cannot open shared object file: No such file or directory\n",
                 "shared library libtorch_cuda.so is missing (cannot open shared object file: No such file or directory)", id="missing-library"),
    pytest.param("/kratos/stage/app: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' not found (required by /kratos/stage/app)\n",
                 "/kratos/stage/app could not start: it needs GLIBC_2.38", id="glibc-too-old"),
    pytest.param("==PROF== Connected to process 7\ntraining: No such file or directory\n", "", id="the-workloads-own-error"),
]  # fmt: skip


@pytest.mark.parametrize(("output", "says"), LOADER_OUTPUTS)
def test_the_dynamic_loaders_refusal_is_read_from_the_output(output: str, says: str):
    found = loader_failure(output)
    assert (says in found) if says else found == ""


@pytest.mark.parametrize(
    "report",
    [
        pytest.param(DATA / "ncu" / "ada-failed-launch-nan-text.txt", id="project-failed-kernel-launch"),
        pytest.param("dd2360-sm89-failed-launch-full-text.txt", id="outside-failed-kernel-launch"),
    ],
)
def test_a_kernel_launch_failure_is_not_mistaken_for_a_program_that_could_not_start(report: Path | str):
    """ncu's ``==ERROR== LaunchFailed`` is a CUDA kernel that failed under profiling: the program ran,
    and the in-image form would not change that."""
    path = report if isinstance(report, Path) else require_fixtures() / "ncu" / report
    assert loader_failure(path.read_text(encoding="utf-8")) == ""


# what the runner's environment holds, and what ncu and the workload get
ENVIRONMENTS = [
    pytest.param({"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}, False,
                 {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}, id="python3-m-kratos_runner-untouched"),
    pytest.param({"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/tmp/_MEI1:/usr/local/nvidia/lib64",
                  "LD_LIBRARY_PATH_ORIG": "/usr/local/nvidia/lib64", "_PYI_APPLICATION_HOME_DIR": "/tmp/_MEI1",
                  "_PYI_PARENT_PROCESS_LEVEL": "1"}, True,
                 {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}, id="one-file-users-library-path-restored"),
    pytest.param({"LD_LIBRARY_PATH": "/tmp/_MEI1", "_PYI_ARCHIVE_FILE": "/kratos/tools/kratos-runner"}, True,
                 {}, id="one-file-no-library-path-of-its-own"),
]  # fmt: skip


@pytest.mark.parametrize(("environ", "frozen", "expected"), ENVIRONMENTS)
def test_ncu_and_the_workload_get_the_users_environment_not_the_bootloaders(environ, frozen, expected):
    assert child_environment(environ, frozen) == expected


def test_the_runner_runs_on_python_3_8_as_the_staged_form_does(bench: Path, monkeypatch: pytest.MonkeyPatch):
    python = python38()
    stage = bench / "stage"
    stage.mkdir()
    monkeypatch.setenv("KRATOS_STAGE_DIR", str(stage))
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    ran = subprocess.run(
        [python, "-m", "kratos_runner", "--target-processes", "all", "--launch-count", "50", "--", str(bench / "vectorAdd")],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ran.returncode == 3, ran.stderr
    assert json.loads((bench / "termination-log").read_text())["boundType"] == "compute"
    program_missing_a_library(stage / "app")
    ran = subprocess.run([python, "-m", "kratos_runner", "--", str(stage / "app")], env=env, capture_output=True,
                         text=True, check=False)  # fmt: skip
    summary = json.loads((bench / "termination-log").read_text())
    assert ran.returncode == 127 and "Traceback" not in ran.stderr
    assert "libq.so.6 is missing" in summary["reason"] and IN_IMAGE_FIX in summary["reason"]


SETS_2022_3 = DATA / "ncu-2022.3" / "list-sets.txt"  # `ncu --list-sets` of Debian's nsight-compute 2022.3


def test_the_section_sets_of_ncu_2022_3_are_read_from_its_own_table():
    from kratos_runner.cli import parse_section_sets

    sets = parse_section_sets(SETS_2022_3.read_text())
    assert sets == {"default": True, "detailed": False, "full": False, "roofline": False, "source": False}


@pytest.mark.parametrize(
    ("requested", "chosen", "note"),
    [
        ("basic", "default", "this ncu has no section set 'basic'; using its equivalent 'default'"),
        ("full", "full", ""),
        (
            "pmsampling",
            "default",
            "this ncu has no section set 'pmsampling'; using its default set 'default'",
        ),
    ],
)
def test_a_set_ncu_2022_3_lacks_is_served_by_one_it_has_and_the_summary_names_it(
    bench: Path, monkeypatch: pytest.MonkeyPatch, requested: str, chosen: str, note: str
):
    """Issue 33: `--set basic` on ncu 2022.3 collects nothing ("No metrics to collect found in
    sections."); the runner asks only for a set the list has, and says which."""
    monkeypatch.setenv("FAKE_NCU_SETS", str(SETS_2022_3))
    status, _, err = run(["--set", requested, "--launch-count", "50", "--", str(bench / "vectorAdd")])
    assert status == 3
    summary = json.loads((bench / "termination-log").read_text())
    assert summary["ncuSet"] == chosen and summary["boundType"] == "compute"
    assert (note in err) if note else "section set" not in err
    calls = [eval(line) for line in (bench / "ncu-calls.log").read_text().splitlines()]
    assert ["--list-sets"] in calls
    assert next(c for c in calls if "--export" in c)[:2] == ["--set", chosen]


def test_a_later_ncu_keeps_the_requested_set_and_an_unreadable_list_changes_nothing():
    from kratos_runner.cli import choose_set, parse_section_sets

    assert choose_set("basic", {"basic": True, "full": False}) == ("basic", "")
    assert choose_set("basic", None) == ("basic", "")
    assert parse_section_sets("==ERROR== something else\n") is None
