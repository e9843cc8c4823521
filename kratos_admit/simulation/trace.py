"""simulate's inputs and outputs (DESIGN "Simulation"): the trace's Jobs, each product's true figures,
and what each policy measured; pure values, read from files by ``inputs.py``, replayed by ``replay.py``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.vocabulary import Unit
from kratos_admit.model.catalog import Catalog, GpuProduct
from kratos_admit.model.ranking import LINK, SCALED_UNITS, relative_time_by_units, unit_figures

Policy = Literal[
    "default",
    "kratos-static",
    "kratos-no-exploration",
    "kratos",
    "kratos-eft",
    "kratos-cap",
    "oracle",
    "oracle-wait",
]
POLICIES: tuple[Policy, ...] = (
    "default",
    "kratos-static",
    "kratos-no-exploration",
    "kratos",
    "oracle",
    "oracle-wait",
)
# the policies that see the truth, not what admission predicts: no admission runs for them
ORACLES: frozenset[Policy] = frozenset({"oracle", "oracle-wait"})
# told after each moment of a run: the policy, its Jobs finished, the trace's Jobs
Progress = Callable[[Policy, int, int], None]
# the policies that learn as the trace runs (observations, calibration); kratos also explores
LEARNING: frozenset[Policy] = frozenset({"kratos", "kratos-no-exploration", "kratos-eft", "kratos-cap"})
# asked for by name only (bench/wait_or_run_slow.py), in the model only (simulation/waiting.py):
# kratos-eft, a load-aware rule not built; kratos-cap, the fixed cap without the escape (kratos before it)
MODEL_ONLY: frozenset[Policy] = frozenset({"kratos-eft", "kratos-cap"})
# the policies whose waiting Jobs escape onto a kept-off product as the controller lets them
# (decisions/escape.py): KRATOS's own, through the admission engine
ESCAPING: frozenset[Policy] = frozenset({"kratos", "kratos-static", "kratos-no-exploration"})
# the policies that keep the predicted ends of what runs (simulation/waiting.py)
LOAD_AWARE: frozenset[Policy] = ESCAPING | {"kratos-eft"}
# the figure a workload's runs exercise: that of its largest unit (bandwidth: memory's)
Figure = Literal["tensor", "fp32", "fp64", "bandwidth"]
FIGURES: tuple[Figure, ...] = ("tensor", "fp32", "fp64", "bandwidth")
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
    # where its GPU time goes on reference_product, by unit (normalised to sum 1), as a profile's
    # status.timeShares; None for a trace written before the units model (``metrics`` alone)
    time_shares: Mapping[Unit, float] | None = None
    pods: int = 1  # Pods of its gang, each on ``gpus`` GPUs; all start together on one product

    @property
    def total_gpus(self) -> int:
        """The GPUs it runs on together: what sets the link its interconnect time moves over."""
        return self.gpus * self.pods

    @property
    def gang(self) -> bool:
        """A gang (DESIGN "Distributed training"): on more than one GPU, never profiled."""
        return self.total_gpus > 1

    @property
    def shares(self) -> tuple[float, float]:
        """(SM, memory) throughput as fractions of peak on the reference product."""
        return float(self.metrics["smThroughput"]) / 100, float(self.metrics["memoryThroughput"]) / 100

    @property
    def runtime_shares(self) -> Shares:
        """What its true runtime is modelled from: its time shares by unit, or (a trace written before
        the units model) its SM and memory throughputs."""
        return self.time_shares if self.time_shares is not None else self.shares


@dataclass(frozen=True, slots=True)
class Trace:
    jobs: tuple[TraceJob, ...]
    profiling_seconds: float = DEFAULT_PROFILING_SECONDS


@dataclass(frozen=True, slots=True)
class Figures:
    """A product's sustained FP32 throughput and memory bandwidth, and its tensor and FP64 throughput
    where the truth gives them (None: the catalog's)."""

    fp32_tflops: float
    bandwidth_gbs: float
    tensor_tflops: float | None = None
    fp64_tflops: float | None = None
    nvlink_gbs: float | None = None  # a GPU's NVLink, both ways (None: the catalog's)
    pcie_gbs: float | None = None  # its PCIe x16 link, both ways (None: the catalog's)


# a Job's shares: by unit (the units model), or (SM, memory) throughputs (a trace from before it)
Shares = Mapping[Unit, float] | tuple[float, float]


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
                update = {
                    "measured_fp32_tflops": figures.fp32_tflops,
                    "measured_bandwidth_gbs": figures.bandwidth_gbs,
                    "measured_tensor_tflops": figures.tensor_tflops,
                    "measured_fp64_tflops": figures.fp64_tflops,
                    "nvlink_gbs": figures.nvlink_gbs,
                    "pcie_gbs": figures.pcie_gbs,
                }
                entry = entry.model_copy(update={k: x for k, x in update.items() if x is not None})
            found = self._products[label] = entry
        return found

    def relative_time(self, shares: Shares, *, reference: str, product: str, gpus: int = 1) -> float:
        """Runtime on ``product`` over runtime on ``reference``: the ranking's units model (each unit's
        share times the reference's figure over the product's, the interconnect's by the link ``gpus``
        GPUs get, plus latency) for shares by unit; the roofline the ranking used before it (the larger
        of the FP32 and bandwidth terms, plus the idle share) for (SM, memory) throughputs, so a trace
        written then keeps its runtimes."""
        if isinstance(shares, tuple):
            sm, mem = shares
            there, here = self.product(reference), self.product(product)
            compute = sm * there.sustained_fp32_tflops / here.sustained_fp32_tflops
            memory = mem * there.sustained_bandwidth_gbs / here.sustained_bandwidth_gbs
            return max(compute, memory) + (1 - max(sm, mem))
        return relative_time_by_units(
            shares,
            reference=unit_figures(self.product(reference), gpus),
            product=unit_figures(self.product(product), gpus),
        )

    def measured_on(self, job: TraceJob, product: str) -> dict[str, str]:
        """The profile metrics a profiling run of ``job`` on ``product`` reports: each busy share
        rescaled to that product's runtime, so the model read from there predicts the same truth."""
        sm, mem = job.shares
        reference, here = self.product(job.reference_product), self.product(product)
        relative = self.relative_time(
            job.runtime_shares, reference=job.reference_product, product=product, gpus=job.total_gpus
        )
        sm_here = sm * reference.sustained_fp32_tflops / here.sustained_fp32_tflops / relative
        mem_here = mem * reference.sustained_bandwidth_gbs / here.sustained_bandwidth_gbs / relative
        metrics = dict(job.metrics)
        metrics["smThroughput"] = f"{min(sm_here, 1.0) * 100:.2f}"
        metrics["memoryThroughput"] = f"{min(mem_here, 1.0) * 100:.2f}"
        return metrics

    def time_shares_on(self, job: TraceJob, product: str) -> dict[Unit, float] | None:
        """The time shares a profiling run of ``job`` on ``product`` reports (None for a Job without
        them): each unit's time there over the whole run's there, so the units model read from there
        predicts the same truth."""
        if job.time_shares is None:
            return None
        gpus = job.total_gpus
        relative = self.relative_time(
            job.time_shares, reference=job.reference_product, product=product, gpus=gpus
        )
        there = unit_figures(self.product(job.reference_product), gpus)
        here = unit_figures(self.product(product), gpus)
        shares: dict[Unit, float] = {
            unit: job.time_shares.get(unit, 0.0) * there[unit] / here[unit] / relative
            for unit in SCALED_UNITS
        }
        if LINK in job.time_shares:  # measured: scaled by the links where both have one
            scale = there[LINK] / here[LINK] if LINK in there and LINK in here else 1.0
            shares[LINK] = job.time_shares[LINK] * scale / relative
        shares["latency"] = job.time_shares.get("latency", 0.0) / relative
        return shares


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
    gangs: tuple[bool, ...] = ()  # whether each Job is a gang, in trace order (empty: none is)

    def mean_jct_of(self, gang: bool) -> float | None:
        """The mean JCT of the gangs (True) or of the single-GPU Jobs; None when the trace has none."""
        found = [
            t for t, g in zip(self.jct, self.gangs or (False,) * len(self.jct), strict=True) if g == gang
        ]
        return sum(found) / len(found) if found else None

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

    def apart(self) -> dict[str, float | None]:
        """The mean JCT of the gangs and of the single-GPU Jobs apart (None: the trace has none)."""
        return {
            key: None if (mean := self.mean_jct_of(gang)) is None else round(mean, 1)
            for key, gang in (("gangs", True), ("singleGpu", False))
        }


@dataclass(frozen=True, slots=True)
class ProductKnowledge:
    """What ``kratos`` knew of one product after the trace: the Jobs that ran there, whether the
    ranking reads any of its figures from calibration (else the catalog's), and its prediction error."""

    runs: int
    calibrated: bool
    prediction_error: float | None
    # the worst error over the workloads whose runs exercise each figure (their largest unit; by
    # throughputs, compute-bound ones FP32 and memory-bound ones bandwidth): how well that figure is
    # known there; absent where no such workload ranks it
    figure_errors: Mapping[Figure, float] = field(default_factory=dict)
    explored: int = 0  # Jobs kratos sent here to explore a figure

    def as_dict(self) -> dict[str, Any]:
        error = None if self.prediction_error is None else round(self.prediction_error, 4)
        return {"runs": self.runs, "calibrated": self.calibrated, "predictionError": error}

    def figures_dict(self) -> dict[str, float]:
        return {f: round(e, 4) for f, e in sorted(self.figure_errors.items())}


def figure_of(job: TraceJob) -> Figure | None:
    """The figure a workload's runs exercise, as the ranking's exploration reads its profile: that of
    its largest unit by time share (bandwidth for memory; none when latency is the largest); for a
    Job without time shares, by its bound type on the reference product: FP32 for compute-bound,
    bandwidth for memory-bound."""
    if job.time_shares is not None:
        unit = max(v.UNITS, key=lambda u: job.time_shares.get(u, 0.0) if job.time_shares else 0.0)
        if unit == "memory":
            return "bandwidth"
        return unit if unit in ("tensor", "fp32", "fp64") else None  # latency, interconnect: no figure
    bound = bound_type(job.shares[0] * 100, job.shares[1] * 100)
    return "fp32" if bound == "compute" else "bandwidth" if bound == "memory" else None


def time_shares_status(shares: Mapping[Unit, float]) -> dict[str, str]:
    """Time shares as a profile's ``status.timeShares`` writes them: fractions as strings (the
    interconnect only where it was measured)."""
    return {
        unit: f"{shares.get(unit, 0.0):.4f}" for unit in v.UNITS if unit != "interconnect" or unit in shares
    }


def job_manifest(job: TraceJob, name: str | None = None) -> dict[str, Any]:
    """The Job a user would submit for one trace entry: the workload label, its GPUs, an absolute
    command (so the first one can be profiled); a gang of several Pods an Indexed Job of them."""
    labels = {v.WORKLOAD_LABEL: job.workload}
    several = (
        {"completionMode": "Indexed", "parallelism": job.pods, "completions": job.pods}
        if job.pods > 1
        else {}
    )  # a gang of Pods, as the Kubernetes docs' "Job with Pod-to-Pod Communication" writes one
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name or job.name, "namespace": NAMESPACE, "labels": dict(labels)},
        "spec": {
            **several,
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
            },
        },
    }


class SimulationError(ValueError):
    """The trace cannot run on the cluster; the message says which Job and why."""
