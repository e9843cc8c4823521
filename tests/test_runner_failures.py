"""Every way the real Nsight Compute fails, named (issue 31): a table of the real program's words.

Where each text comes from, all Debian's ``nsight-compute`` 2022.3.0.22~11.8.0-5~deb12u1 (ncu
2022.3.0.0, build 31729285), on a machine with no GPU and no driver:
- runs of the real ``ncu`` in the runner image, kept verbatim in ``tests/data/ncu-2022.3/``:
  ``no-driver.txt`` (``ncu --set default /bin/true``), ``missing-program.txt`` (a staged path that is
  not there), ``unknown-option-value.txt`` (``--replay-mode sideways``),
  ``static-program-no-kernels.txt`` (``ncu --set default`` of a statically linked program, Debian's
  ``catatonit --version``, which ncu cannot inject into and which launches no kernel);
- the program's own strings, where a run needs a GPU this machine has not (``strings`` of
  ``target/linux-desktop-glibc_2_11_3-x64/libcuda-injection.so`` and ``ncu``), printed as ncu prints
  its errors, after ``==ERROR==``, with the format's ``%u``/``%s`` filled in;
- ``no CUDA-capable device is detected``: the CUDA driver API's text for CUDA_ERROR_NO_DEVICE, which
  ncu and the workload pass through (not reproducible without a driver).
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from kratos_runner.cli import main
from kratos_runner.failures import CLASSES, classify
from tests.harness import DATA, STAND_IN_NCU, executable

REAL = DATA / "ncu-2022.3"
STRINGS = {
    "counters-in-use": "==ERROR== Profiling failed because a driver resource was unavailable. Ensure that no other tool (like DCGM) is concurrently collecting profiling data. See https://docs.nvidia.com/nsight-compute/ProfilingGuide/index.html#faq for more details.\n==WARNING== No kernels were profiled.\n",
    "out-of-memory": "==ERROR== Insufficient free memory for profiling on the device. Consider the following options to reduce how much free memory is required: Set --cache-control none. Use --replay-mode application. Collect fewer metrics. Avoid collecting source-level metrics together with HW performance metrics.\n",
    "counter-permission": "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters on the target device 0. For instructions on enabling permissions and to get more information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n",
    "lock-file": "==ERROR== Failed to open/create lock file /tmp/nsight-compute-lock. Please check that this process has write permissions on this file. See https://docs.nvidia.com/nsight-compute/ProfilingGuide/index.html#faq for more details.\n",
    "no-device": "[Vector addition of 50000 elements]\nFailed to allocate device vector A (error code no CUDA-capable device is detected)!\n==WARNING== No kernels were profiled.\n",
    "no-kernels": "cpu only: done\n==WARNING== No kernels were profiled.\n",
    # ncu's own error, then its consequence (issue 37): the lock file of the real 2022.3 strings, and
    # the line the real no-driver run printed after its driver error
    "error-then-no-kernels": "==ERROR== Failed to open/create lock file /tmp/nsight-compute-lock. Please check that this process has write permissions on this file.\n==WARNING== No kernels were profiled.\n",
    "application-error": "[CUDA samples]\n==ERROR== The application returned an error code (1).\n==WARNING== No kernels were profiled.\n",
}  # fmt: skip
# (source, expected class, words the reason must hold)
TABLE = [
    pytest.param((REAL / "no-driver.txt").read_text(), "no-gpu", "NVIDIA driver", id="run-no-driver"),
    pytest.param((REAL / "missing-program.txt").read_text(), "cannot-start", "does not exist", id="run-missing-program"),
    pytest.param((REAL / "unknown-option-value.txt").read_text(), "ncu-error", "the argument for option '--replay-mode' is invalid", id="run-bad-option"),
    pytest.param(STRINGS["counters-in-use"], "counters-in-use", "profilingProducts", id="strings-dcgm"),
    pytest.param(STRINGS["out-of-memory"], "out-of-memory", "--cache-control none", id="strings-memory"),
    pytest.param(STRINGS["counter-permission"], "counter-permission", "NVreg_RestrictProfilingToAdminUsers=0", id="strings-permission"),
    pytest.param(STRINGS["lock-file"], "ncu-error", "Failed to open/create lock file /tmp/nsight-compute-lock", id="strings-lock-file"),
    pytest.param(STRINGS["no-device"], "no-gpu", "no CUDA-capable device is detected", id="driver-no-device"),
    pytest.param((REAL / "static-program-no-kernels.txt").read_text(), "no-kernels", "launched none", id="run-no-kernels"),
    pytest.param(STRINGS["no-kernels"], "no-kernels", "launched none", id="no-kernels"),
    pytest.param(STRINGS["error-then-no-kernels"], "ncu-error", "ncu failed: Failed to open/create lock file", id="ncu-error-wins-over-no-kernels"),
    pytest.param(STRINGS["application-error"], "ncu-error", "ncu failed: The application returned an error code (1).", id="application-error-wins"),
]  # fmt: skip


@pytest.mark.parametrize(("output", "expected", "words"), TABLE)
def test_every_failure_of_the_real_program_is_named_with_what_to_do(output: str, expected: str, words: str):
    failure, reason = classify(output)
    assert failure == expected and words in reason, reason
    assert "\n" not in reason


def test_every_class_is_in_the_table():
    assert {p.values[1] for p in TABLE} == set(CLASSES)


def test_unknown_output_quotes_the_first_error_line_and_nothing_is_quoted_unbounded():
    failure, reason = classify("noise\n==ERROR== first thing\n==ERROR== second thing\n")
    assert (failure, reason) == ("ncu-error", "ncu failed: first thing")
    assert classify("") == ("ncu-error", "ncu failed: it printed nothing")
    assert len(classify("==ERROR== " + "x" * 5000)[1]) < 400


@pytest.mark.parametrize(
    "name",
    ["no-driver.txt", "missing-program.txt", "unknown-option-value.txt", "static-program-no-kernels.txt"],
)
def test_the_runner_writes_the_class_into_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
):
    """The real runs' words, played back by the stand-in ncu, end in the summary's failure."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "ncu", STAND_IN_NCU.format(python=sys.executable))
    executable(tmp_path / "vectorAdd", "#!/bin/sh\nexit 0\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("FAKE_NCU_LOG", str(tmp_path / "ncu-calls.log"))
    monkeypatch.setenv("FAKE_NCU_OUTPUT", str(REAL / name))
    monkeypatch.setenv("KRATOS_TERMINATION_LOG", str(tmp_path / "termination-log"))
    status = main(["--", str(tmp_path / "vectorAdd")], stdout=io.StringIO(), stderr=io.StringIO())
    summary = json.loads((tmp_path / "termination-log").read_text())
    assert summary["failure"] == classify((REAL / name).read_text())[0] and summary["kernels"] == 0
    assert summary["reason"] == classify((REAL / name).read_text())[1]
    assert status == 1 and summary["boundType"] == "unknown"


def test_the_profile_and_the_crd_know_every_class_the_runner_names():
    """The runner is stdlib-only and cannot import the domain: this keeps the two lists in step."""
    import yaml

    from kratos_admit.domain.profile import FAILURE_CLASSES, RUNNER_FAILURE_CLASSES, condition_reason
    from tests.harness import REPO

    assert RUNNER_FAILURE_CLASSES == CLASSES
    assert (*CLASSES, "image-pull", "killed") == FAILURE_CLASSES, "and the two the controller names"
    crd = yaml.safe_load((REPO / "webhook-config" / "crd-workloadprofiles.yaml").read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert tuple(status["failure"]["enum"]) == FAILURE_CLASSES
    assert [condition_reason(c) for c in FAILURE_CLASSES] == [
        "NoGpu", "CounterPermission", "CountersInUse", "OutOfMemory", "CannotStart", "NoKernels", "NcuError",
        "ImagePull", "Killed",
    ]  # fmt: skip
    assert condition_reason(None) == "ProfilingFailed"
