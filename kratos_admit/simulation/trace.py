"""simulate's inputs and outputs (DESIGN "Simulation"): the trace's Jobs, each product's true figures,
and what each policy measured; pure values, read from files by ``inputs.py``, replayed by ``replay.py``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kratos_admit.decisions.ranking import predicted_relative_time
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.catalog import Catalog, GpuProduct

Policy = Literal["default", "kratos-static", "kratos-no-exploration", "kratos", "oracle"]
POLICIES: tuple[Policy, ...] = ("default", "kratos-static", "kratos-no-exploration", "kratos", "oracle")
# the policies that learn as the trace runs (observations, calibration); kratos also explores
LEARNING: frozenset[Policy] = frozenset({"kratos", "kratos-no-exploration"})
Figure = Literal["fp32", "bandwidth"]
NAMESPACE = "simulation"
DEFAULT_PROFILING_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class TraceJob:
    name: str
    workload: str
    arrival: float
    gpus: int
    reference_product: str
    reference_seconds: float
    metrics: Mapping[str, str]  # as in a WorkloadProfile's status, measured on reference_product

    @property
    def shares(self) -> tuple[float, float]:
        """(SM, memory) throughput as fractions of peak on the reference product."""
        return float(self.metrics["smThroughput"]) / 100, float(self.metrics["memoryThroughput"]) / 100


@dataclass(frozen=True, slots=True)
class Trace:
    jobs: tuple[TraceJob, ...]
    profiling_seconds: float = DEFAULT_PROFILING_SECONDS


@dataclass(frozen=True, slots=True)
class Figures:
    """A product's sustained FP32 throughput and memory bandwidth."""

    fp32_tflops: float
    bandwidth_gbs: float


class Truth:
    """What each GPU product really sustains: the truth file's figures, else the catalog's."""

    def __init__(self, catalog: Catalog, figures: Mapping[str, Figures]) -> None:
        self.catalog = catalog
        self._figures = dict(figures)  # by catalog product name
        self._products: dict[str, GpuProduct] = {}

    def product(self, label: str) -> GpuProduct:
        """The catalog entry for a node label, with its sustained figures replaced by the truth."""
        found = self._products.get(label)
        if found is None:
            entry = self.catalog.placement(label)
            if entry is None:
                raise KeyError(label)
            figures = self._figures.get(entry.product)
            if figures is not None:
                entry = entry.model_copy(
                    update={
                        "measured_fp32_tflops": figures.fp32_tflops,
                        "measured_bandwidth_gbs": figures.bandwidth_gbs,
                    }
                )
            found = self._products[label] = entry
        return found

    def relative_time(self, shares: tuple[float, float], *, reference: str, product: str) -> float:
        """Runtime on ``product`` over runtime on ``reference`` (the ranking's roofline model)."""
        sm, mem = shares
        return predicted_relative_time(
            sm, mem, reference=self.product(reference), product=self.product(product)
        )

    def measured_on(self, job: TraceJob, product: str) -> dict[str, str]:
        """The profile metrics a profiling run of ``job`` on ``product`` reports: each busy share
        rescaled to that product's runtime, so the model read from there predicts the same truth."""
        sm, mem = job.shares
        reference, here = self.product(job.reference_product), self.product(product)
        relative = self.relative_time(job.shares, reference=job.reference_product, product=product)
        sm_here = sm * reference.sustained_fp32_tflops / here.sustained_fp32_tflops / relative
        mem_here = mem * reference.sustained_bandwidth_gbs / here.sustained_bandwidth_gbs / relative
        metrics = dict(job.metrics)
        metrics["smThroughput"] = f"{min(sm_here, 1.0) * 100:.2f}"
        metrics["memoryThroughput"] = f"{min(mem_here, 1.0) * 100:.2f}"
        return metrics


def bound_type(sm_percent: float, mem_percent: float) -> v.BoundType:
    """Nsight Compute's speed-of-light rule, as the runner applies it (DESIGN "Runner contract")."""
    if sm_percent < 60 and mem_percent < 60:
        return "latency"
    if abs(sm_percent - mem_percent) < 10:
        return "balanced"
    return "compute" if sm_percent > mem_percent else "memory"


@dataclass(frozen=True, slots=True)
class PolicyResult:
    policy: Policy
    jct: tuple[float, ...]  # each Job's completion time (finish - arrival), in trace order
    makespan: float
    gpu_seconds: float

    @property
    def mean_jct(self) -> float:
        return sum(self.jct) / len(self.jct) if self.jct else 0.0

    @property
    def p95_jct(self) -> float:
        """Nearest rank: the smallest JCT at least 95 % of the Jobs finished within."""
        ordered = sorted(self.jct)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "meanJctSeconds": round(self.mean_jct, 1),
            "p95JctSeconds": round(self.p95_jct, 1),
            "makespanSeconds": round(self.makespan, 1),
            "gpuHours": round(self.gpu_seconds / 3600, 2),
        }


@dataclass(frozen=True, slots=True)
class ProductKnowledge:
    """What ``kratos`` knew of one product after the trace: the Jobs that ran there, whether the
    ranking reads any of its figures from calibration (else the catalog's), and its prediction error."""

    runs: int
    calibrated: bool
    prediction_error: float | None
    # the worst error over the compute-bound workloads (fp32) and the memory-bound ones (bandwidth):
    # how well the figure each kind exercises is known there; absent where no such workload ranks it
    figure_errors: Mapping[Figure, float] = field(default_factory=dict)
    explored: int = 0  # Jobs kratos sent here to explore a figure

    def as_dict(self) -> dict[str, Any]:
        error = None if self.prediction_error is None else round(self.prediction_error, 4)
        return {"runs": self.runs, "calibrated": self.calibrated, "predictionError": error}

    def figures_dict(self) -> dict[str, float]:
        return {f: round(e, 4) for f, e in sorted(self.figure_errors.items())}


def figure_of(shares: tuple[float, float]) -> Figure | None:
    """The figure a workload's runs exercise, by its bound type on the reference product (as the
    ranking's exploration reads a profile's): FP32 for compute-bound, bandwidth for memory-bound."""
    bound = bound_type(shares[0] * 100, shares[1] * 100)
    return "fp32" if bound == "compute" else "bandwidth" if bound == "memory" else None


def job_manifest(job: TraceJob, name: str | None = None) -> dict[str, Any]:
    """The Job a user would submit for one trace entry: the workload label, its GPUs, an absolute
    command (so the first one can be profiled)."""
    labels = {v.WORKLOAD_LABEL: job.workload}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name or job.name, "namespace": NAMESPACE, "labels": dict(labels)},
        "spec": {
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": f"registry.example/{job.workload}:1",
                            "command": [f"/opt/{job.workload}/bin/run"],
                            "resources": {"limits": {v.GPU_RESOURCE: str(job.gpus)}},
                        }
                    ],
                },
            }
        },
    }


class SimulationError(ValueError):
    """The trace cannot run on the cluster; the message says which Job and why."""
