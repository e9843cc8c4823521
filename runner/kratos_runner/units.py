"""The unit that does each kernel's work, and the time shares of a profile.

A kernel's time belongs to the busiest of its units, each as a percent of its peak sustained over the
kernel's elapsed time: ``tensor`` (FP16/BF16/TF32/FP8/INT8 on the tensor cores), ``fp64`` (the FP64
pipe, or FP64 on the tensor cores), ``fp32`` (the FMA pipe: FP32 and FP16 on the CUDA cores) and
``memory`` (DRAM throughput). When none reaches the speed-of-light threshold (60 %), its time is
``latency``. Where the export has no pipe metrics (an older ncu, a details page), each kernel's unit
comes from its speed-of-light figures instead: ``fp32`` when the SM is the busier, ``memory`` when
memory is, ``latency`` when both are under the threshold; the summary names which source it used.
"""

from __future__ import annotations

from typing import Sequence

from kratos_runner.parse import Kernel

UNITS = ("tensor", "fp32", "fp64", "memory", "latency")
SOL_THRESHOLD = 60.0  # Nsight Compute's SOLBottleneck threshold, percent of peak
FROM_PIPES = "pipes"  # timeSharesFrom: the pipe metrics of the basic set
FROM_SPEED_OF_LIGHT = "speed-of-light"  # timeSharesFrom: smThroughput/memoryThroughput only
FROM_BOTH = "pipes-and-speed-of-light"  # some kernels had pipe metrics, some did not


def pipe_figures(kernel: Kernel) -> dict[str, float] | None:
    """tensor/fp64/fp32/memory activity of a kernel in percent, None without the FMA pipe metric
    (the mark of an export with pipe metrics)."""
    metrics = kernel.metrics
    if "fma" not in metrics:
        return None
    if "tensor" in metrics:
        tensor = metrics["tensor"]
    else:  # older ncu: all tensor work, less FP64 on the tensor cores
        tensor = max(0.0, metrics.get("tensorAll", 0.0) - metrics.get("dmma", 0.0))
    return {
        "tensor": tensor,
        "fp64": max(metrics.get("fp64", 0.0), metrics.get("dmma", 0.0)),
        "fp32": metrics["fma"],
        "memory": metrics.get("dram", 0.0),
    }


def kernel_unit(kernel: Kernel) -> tuple[str | None, str]:
    """(the unit that binds the kernel, the source it was read from); (None, "") with no figures."""
    figures = pipe_figures(kernel)
    if figures is not None:
        unit, busiest = max(figures.items(), key=lambda item: item[1])  # first of equals: tensor first
        return (unit if busiest >= SOL_THRESHOLD else "latency"), FROM_PIPES
    sm, mem = kernel.metrics.get("sm"), kernel.metrics.get("mem")
    if sm is None or mem is None:
        return None, ""
    if sm < SOL_THRESHOLD and mem < SOL_THRESHOLD:
        return "latency", FROM_SPEED_OF_LIGHT
    return ("fp32" if sm >= mem else "memory"), FROM_SPEED_OF_LIGHT


def round_shares(fractions: dict[str, float]) -> dict[str, str]:
    """Fractions as strings with two decimals that sum to exactly 1.00 (largest remainder: the
    hundredths lost to rounding down go to the units that lost the most)."""
    total = sum(fractions.values())
    exact = {unit: 100.0 * fractions.get(unit, 0.0) / total for unit in UNITS}
    hundredths = {unit: int(value) for unit, value in exact.items()}
    left = 100 - sum(hundredths.values())
    for unit in sorted(UNITS, key=lambda u: (-(exact[u] - hundredths[u]), UNITS.index(u)))[:left]:
        hundredths[unit] += 1
    return {unit: f"{hundredths[unit] / 100:.2f}" for unit in UNITS}


def time_shares(kernels: Sequence[Kernel], weights: Sequence[float]) -> tuple[dict[str, str], str]:
    """The shares of the weighted time by unit, and where they came from; ({}, "") when no kernel
    has both a unit and a positive weight."""
    totals = dict.fromkeys(UNITS, 0.0)
    sources: list[str] = []
    for kernel, weight in zip(kernels, weights):
        unit, source = kernel_unit(kernel)
        if unit is None or weight <= 0:
            continue
        totals[unit] += weight
        sources.append(source)
    if not sources or sum(totals.values()) <= 0:
        return {}, ""
    if all(s == FROM_PIPES for s in sources):
        origin = FROM_PIPES
    elif all(s == FROM_SPEED_OF_LIGHT for s in sources):
        origin = FROM_SPEED_OF_LIGHT
    else:
        origin = FROM_BOTH
    return round_shares(totals), origin
