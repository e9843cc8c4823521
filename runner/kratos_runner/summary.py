"""From parsed kernels to the one summary KRATOS stores: weighted figures and the bound type."""

from __future__ import annotations

import json
from typing import Sequence

from kratos_runner.parse import Kernel, Report
from kratos_runner.units import time_shares

MAX_SUMMARY_BYTES = 4096
SOL_THRESHOLD = 60.0  # Nsight Compute's SOLBottleneck rule: below 60 % of peak is latency-bound
SOL_GAP = 10.0  # a gap of 10 points or more names the bound unit

_METRIC_KEYS = (
    ("occupancy", "achievedOccupancy"),
    ("sm", "smThroughput"),
    ("mem", "memoryThroughput"),
    ("l2", "l2Throughput"),
    ("dram", "dramThroughput"),
)


def time_weights(kernels: Sequence[Kernel]) -> list[float]:
    """Each kernel's weight by its GPU time. Kernels without a duration weigh 1 when no kernel has one
    (a ``--metrics`` run without gpu__time_duration); when some have durations, the ones without weigh 0."""
    if not any(k.metrics.get("duration") for k in kernels):
        return [1.0] * len(kernels)
    return [k.metrics.get("duration") or 0.0 for k in kernels]


def weighted_mean(
    kernels: Sequence[Kernel], metric: str, weights: Sequence[float] | None = None
) -> float | None:
    """Mean over the kernels that report ``metric``, weighted by ``weights`` (default: each one's GPU
    time, as ``time_weights`` gives it); None when no kernel with a positive weight reports it."""
    weights = time_weights(kernels) if weights is None else weights
    pairs = [(k.metrics[metric], w) for k, w in zip(kernels, weights) if metric in k.metrics and w > 0]
    total = sum(w for _, w in pairs)
    return sum(value * w for value, w in pairs) / total if pairs and total > 0 else None


def classify(sm: float | None, mem: float | None) -> tuple[str, str]:
    """Nsight Compute's SpeedOfLight rule: (bound type, reason when unknown)."""
    if sm is None or mem is None:
        missing = " and ".join(
            name
            for name, value in (("sm__throughput", sm), ("gpu__compute_memory_throughput", mem))
            if value is None
        )
        return "unknown", f"no usable {missing} figures (SpeedOfLight section) in the report"
    if sm < SOL_THRESHOLD and mem < SOL_THRESHOLD:
        return "latency", ""
    if abs(sm - mem) >= SOL_GAP:
        return ("compute" if sm > mem else "memory"), ""
    return "balanced", ""


def _gpu(kernels: list[Kernel]) -> dict[str, str]:
    gpu: dict[str, str] = {}
    for kernel in kernels:
        if kernel.device_name and "product" not in gpu:
            gpu["product"] = "-".join(kernel.device_name.split())  # GPU Feature Discovery's form
        if kernel.compute_capability and "computeCapability" not in gpu:
            gpu["computeCapability"] = kernel.compute_capability
    return gpu


def _empty_reason(report: Report) -> str:
    if report.errors:
        return "ncu reported: " + "; ".join(report.errors[:3])
    if report.report_files:
        file = report.report_files[-1]
        return f"no result tables in this output; the report went to {file} (export it with ncu --import {file} --csv --page raw)"
    return "no profiled kernel in the report (did the workload launch any CUDA kernel?)"


def summarise(
    report: Report,
    *,
    exit_code: int = 0,
    ncu_version: str = "",
    reason: str = "",
    weights: Sequence[float] | None = None,
) -> dict[str, object]:
    """The summary of a report. ``weights`` (one per kernel, in order) weigh the figures and the time
    shares; by default each kernel's own GPU time (a steady-state profile passes the first pass's)."""
    kernels = report.kernels
    weights = time_weights(kernels) if weights is None else list(weights)
    figures = {name: weighted_mean(kernels, name, weights) for name, _ in _METRIC_KEYS}
    shares, shares_from = time_shares(kernels, weights)
    bound, why = classify(figures["sm"], figures["mem"])
    if not kernels:
        why = _empty_reason(report)
    elif bound == "unknown" and report.errors:
        why = why + "; ncu reported: " + "; ".join(report.errors[:3])
    metrics = {key: f"{figures[name]:.2f}" for name, key in _METRIC_KEYS if figures[name] is not None}
    metrics["kernelCount"] = str(len(kernels))
    durations = [k.metrics["duration"] for k in kernels if "duration" in k.metrics]
    if durations:
        metrics["gpuTimeNs"] = str(round(sum(durations)))
    # an explicit reason for an empty report (ncu missing, permission denied) says it all
    explained_empty = bool(reason) and not kernels
    reasons = [r for r in (reason, why if bound == "unknown" and not explained_empty else "") if r]
    summary: dict[str, object] = {
        "boundType": bound,
        "metrics": metrics,
        "gpu": _gpu(kernels),
        "kernels": len(kernels),
        "exitCode": exit_code,
        "ncuVersion": ncu_version,
        "reason": "; ".join(reasons),
    }
    if shares:
        summary["timeShares"] = shares
        summary["timeSharesFrom"] = shares_from
    return summary


def encode_summary(summary: dict[str, object], limit: int = MAX_SUMMARY_BYTES) -> str:
    """Compact JSON within ``limit`` bytes (the termination-log cap), trimmed the same way every time:
    first the reason is shortened, then the GPU product name, then optional metrics, then the
    steady-state details (its coverage stays); ``timeShares`` is never dropped."""
    data = dict(summary)
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) <= limit:
        return text
    reason = str(data.get("reason", ""))
    overflow = len(text.encode()) - limit
    data["reason"] = reason[: max(0, len(reason) - overflow - 3)] + "..." if reason else ""
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    for drop in ("gpu", "l2Throughput", "dramThroughput", "achievedOccupancy", "ncuVersion", "steadyState"):
        if len(text.encode()) <= limit:
            break
        if drop in data:
            data[drop] = {} if drop in ("gpu", "steadyState") else ""
        else:
            current = data.get("metrics")
            metrics = dict(current) if isinstance(current, dict) else {}
            metrics.pop(drop, None)
            data["metrics"] = metrics
        text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    return (
        text
        if len(text.encode()) <= limit
        else json.dumps(
            {
                "boundType": data["boundType"],
                "exitCode": data["exitCode"],
                "reason": "summary too large",
                **{key: data[key] for key in ("timeShares", "timeSharesFrom", "coverage") if key in data},
            },
            separators=(",", ":"),
        )
    )
