"""Every way Nsight Compute's ``ncu`` fails, named by the words the real program prints, with what to do.

The summary's ``failure`` (absent on success) is one of these classes, and its ``reason`` says what to
do. The texts are Nsight Compute's own; where each was taken from (and which version) is recorded in
``tests/test_runner_failures.py``:

| class | the real program's words |
|---|---|
| ``no-gpu`` | ``Nsight Compute failed to connect to the CUDA driver`` (no driver in the container), the CUDA driver's ``no CUDA-capable device is detected`` |
| ``counter-permission`` | ``ERR_NVGPUCTRPERM``, ``does not have permission to access NVIDIA GPU Performance Counters`` |
| ``counters-in-use`` | ``Profiling failed because a driver resource was unavailable. Ensure that no other tool (like DCGM) is concurrently collecting profiling data.`` |
| ``out-of-memory`` | ``Insufficient free memory for profiling on the device`` |
| ``cannot-start`` | ``'EXE' does not exist or is not an executable`` (and the runner's own checks before ncu runs) |
| ``no-kernels`` | ``No kernels were profiled`` with none of the above, and no ``==ERROR==`` line of ncu's own |
| ``ncu-error`` | anything else that profiled nothing: its first ``==ERROR==`` line quoted (or its first line that is not ``==PROF==``) |

The first class whose words appear wins, in the order above, so a run without a driver, which also
says ``No kernels were profiled``, is ``no-gpu``; but an ``==ERROR==`` line that names none of the
causes before ``no-kernels`` wins over ``No kernels were profiled`` (``ncu-error``, quoting it): the
kernels are missing because of that error, and "launched none" would send the person the wrong way.
"""

from __future__ import annotations

import re

PERMISSION_HELP = (
    "ncu has no permission to read the GPU performance counters (ERR_NVGPUCTRPERM): either load the "
    "NVIDIA driver on the node with NVreg_RestrictProfilingToAdminUsers=0, or give the profiling-runner "
    "container CAP_SYS_ADMIN or CAP_PERFMON (profilingCapabilities: [PERFMON] in the KRATOS config)"
)
_HELP = {
    "no-gpu": (
        "ncu found no GPU to profile ({quote}): the profiling Pod ran without an NVIDIA driver or device. "
        "Check that the node has the driver and the NVIDIA container toolkit, that the Pod's runtimeClassName "
        "(nvidia) selects it, and that the Pod was given nvidia.com/gpu"
    ),
    "counter-permission": PERMISSION_HELP,
    "counters-in-use": (
        "another profiler holds this GPU's performance counters ({quote}). On GPUs before Hopper, DCGM "
        "collecting its profiling metrics (dcgm-exporter with DCGM_FI_PROF_* counters, or KRATOS's telemetry "
        "component) locks them machine-wide: profile on nodes whose exporter leaves those counters out "
        "(profilingProducts), pause DCGM's profiling on the node (dcgmi profile --pause) while profiling, or "
        "learn from telemetry alone; the workload is not at fault"
    ),
    "out-of-memory": (
        "not enough free GPU memory to profile ({quote}): the workload leaves too little device memory for "
        "ncu's replay. Profile a smaller run of it, or pass ncu --cache-control none or --replay-mode "
        "application (--ncu-arg)"
    ),
    "cannot-start": "ncu could not start the workload ({quote}): check the command's path in the image",
    "no-kernels": (
        "the program ran but no CUDA kernel was profiled: it launched none (does it use the GPU?), or all "
        "of them ran within --launch-skip (gpu.scheduler.io/profile-skip-kernels)"
    ),
    "ncu-error": "ncu failed: {quote}",
}
_WORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("no-gpu", re.compile(r"failed to connect to the CUDA driver|no CUDA-capable device is detected", re.I)),
    (
        "counter-permission",
        re.compile(r"ERR_NVGPUCTRPERM|does not have permission to access NVIDIA GPU Performance Counters"),
    ),
    ("counters-in-use", re.compile(r"a driver resource was unavailable", re.I)),
    ("out-of-memory", re.compile(r"Insufficient free memory for profiling", re.I)),
    ("cannot-start", re.compile(r"does not exist or is not an executable")),
    ("no-kernels", re.compile(r"No kernels were profiled")),
)
_ERROR_LINE = re.compile(r"^==ERROR==\s*(.+?)\s*$", re.M)
QUOTE_LIMIT = 300
CLASSES = tuple(_HELP)


def _line_with(output: str, pattern: re.Pattern[str]) -> str:
    for line in output.splitlines():
        if pattern.search(line):
            return line.replace("==ERROR==", "").replace("==WARNING==", "").strip()[:QUOTE_LIMIT]
    return ""


def classify(output: str) -> tuple[str, str]:
    """(failure class, reason) of a run of ncu that profiled nothing, from everything it printed. An
    ``==ERROR==`` line that names none of the known causes is ncu's own error and wins over ``No
    kernels were profiled``, which is then only its consequence."""
    error = _ERROR_LINE.search(output)
    for name, pattern in _WORDS:
        if name == "no-kernels" and error is not None:
            break
        if pattern.search(output):
            return name, _HELP[name].format(quote=_line_with(output, pattern))
    first = (
        error.group(1) if error else next((line.strip() for line in output.splitlines() if line.strip()), "")
    )
    return "ncu-error", _HELP["ncu-error"].format(quote=(first or "it printed nothing")[:QUOTE_LIMIT])
