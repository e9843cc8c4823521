"""Calibration (DESIGN "Learning the cluster's GPUs"): per GPU product, by how much the ranking
model's memory time and compute time must be scaled to match what really ran on this cluster, and
per workload its re-fitted shares; ``calibration.json`` in and out, and when a new fit is worth
writing. The fit itself is ``calibration_fit.py``; docs/ranking.md "Calibration" gives the model."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kratos_admit.domain.catalog import Catalog, GpuProduct
from kratos_admit.domain.profile import WorkloadProfile

CONFIGMAP_NAME = "kratos-gpu-calibration"
CONFIGMAP_KEY = "calibration.json"
DIGITS = 4  # factors are stored rounded, so a refit from the same runs writes the same bytes
HUBER_DELTA = 0.1  # in log-time: samples within about 10 % of the fit count as in a mean
# a run measures a figure only when that resource clearly bounds it (its model term at least this
# many times the other); a run near the balance point could be explained by either. The fit reads
# samples by it, and exploration sends a Job only where its run would be so bound.
DOMINANT = 2.0
# what a prior is worth, in runs: the profile's shares in the re-fit of a workload's shares, and
# the model's prediction for a product the workload ran on fewer than minObservedRuns times
PRIOR_RUNS = 1.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One workload's observed mean on one product, with what its profile says about the workload."""

    workload: str  # namespace/name: one workload
    product: str  # catalog product (a MIG slice keeps its own name)
    runs: int
    seconds: float
    sm: float  # SM and memory throughput shares on ``profiled``
    mem: float
    profiled: str  # catalog product the profile was measured on


@dataclass(frozen=True, slots=True)
class FactorSupport:
    factor: float = 1.0
    runs: int = 0
    workloads: int = 0

    def qualifies(self, min_runs: int) -> bool:
        return self.runs >= min_runs and self.workloads >= 2


@dataclass(frozen=True, slots=True)
class ProductCalibration:
    product: str
    memory: FactorSupport
    compute: FactorSupport
    updated_at: str = ""

    @property
    def runs(self) -> int:
        """The runs behind the weaker factor: a product is as well known as its least-known resource."""
        return min(self.memory.runs, self.compute.runs)

    @property
    def workloads(self) -> int:
        return min(self.memory.workloads, self.compute.workloads)

    def qualifies(self, min_runs: int) -> bool:
        """Both factors rest on ``min_runs`` runs from at least two workloads (DESIGN)."""
        return self.memory.qualifies(min_runs) and self.compute.qualifies(min_runs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "memoryTimeFactor": round(self.memory.factor, DIGITS),
            "computeTimeFactor": round(self.compute.factor, DIGITS),
            "runs": self.runs,
            "workloads": self.workloads,
            "memoryRuns": self.memory.runs,
            "memoryWorkloads": self.memory.workloads,
            "computeRuns": self.compute.runs,
            "computeWorkloads": self.compute.workloads,
            "updatedAt": self.updated_at,
        }

    def same_fit(self, other: ProductCalibration) -> bool:
        return self.as_dict() | {"updatedAt": ""} == other.as_dict() | {"updatedAt": ""}


@dataclass(frozen=True, slots=True)
class WorkloadShares:
    """A workload's SM and memory shares re-fitted from its runs on two or more products, as fractions
    of the figures of the product it was profiled on that the fit used (``fp32_tflops``,
    ``bandwidth_gbs``: the catalog's divided by that product's factors), so a prediction from them
    no longer rests on the catalog's figures for where the profile happened to be measured."""

    workload: str  # namespace/name
    profiled: str
    sm: float
    mem: float
    fp32_tflops: float
    bandwidth_gbs: float
    runs: int
    products: int
    updated_at: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "product": self.profiled,
            "smThroughput": round(self.sm * 100, DIGITS),
            "memoryThroughput": round(self.mem * 100, DIGITS),
            "fp32Tflops": self.fp32_tflops,
            "bandwidthGBs": self.bandwidth_gbs,
            "runs": self.runs,
            "products": self.products,
            "updatedAt": self.updated_at,
        }

    def same_fit(self, other: WorkloadShares) -> bool:
        return self.as_dict() | {"updatedAt": ""} == other.as_dict() | {"updatedAt": ""}


@dataclass(frozen=True, eq=False)
class Calibration:
    """Factors by catalog product, and re-fitted shares by workload. Hashed and compared by
    identity: the ranking caches on it, and a store hands out the same object until the calibration
    changes."""

    products: Mapping[str, ProductCalibration] = field(default_factory=dict)
    workloads: Mapping[str, WorkloadShares] = field(default_factory=dict)

    def get(self, product: str) -> ProductCalibration | None:
        return self.products.get(product)

    def shares_of(self, namespace: str, workload: str) -> WorkloadShares | None:
        """The workload's re-fitted shares, or None while it has run on fewer than two products."""
        return self.workloads.get(f"{namespace}/{workload}")

    def calibrated(self, entry: GpuProduct, min_runs: int) -> tuple[GpuProduct, bool]:
        """``entry`` with each sustained figure divided by its factor where that factor qualifies
        (``minCalibrationRuns`` runs from at least two workloads), and whether any did. A memory
        factor measured by many memory-bound runs is used even while no compute-bound run has
        reached the product: a figure is as well known as its own runs make it."""
        found = self.products.get(entry.product)
        if found is None:
            return entry, False
        update = {}
        if found.memory.qualifies(min_runs):
            update["measured_bandwidth_gbs"] = entry.sustained_bandwidth_gbs / found.memory.factor
        if found.compute.qualifies(min_runs):
            update["measured_fp32_tflops"] = entry.sustained_fp32_tflops / found.compute.factor
        if not update:
            return entry, False
        return entry.model_copy(update=update), True

    def to_json(self) -> str:
        document: dict[str, Any] = {
            "products": {name: p.as_dict() for name, p in sorted(self.products.items())}
        }
        if self.workloads:
            document["workloads"] = {name: w.as_dict() for name, w in sorted(self.workloads.items())}
        return json.dumps(document, indent=2, sort_keys=True)


NO_CALIBRATION = Calibration()


class CalibrationError(ValueError):
    """A calibration.json that cannot be read; the message says where."""


def parse_calibration(text: str) -> Calibration:
    try:
        data = json.loads(text)
        products = {}
        for name, p in dict(data["products"]).items():
            products[str(name)] = ProductCalibration(
                product=str(name),
                memory=FactorSupport(
                    float(p["memoryTimeFactor"]),
                    int(p.get("memoryRuns", 0)),
                    int(p.get("memoryWorkloads", 0)),
                ),
                compute=FactorSupport(
                    float(p["computeTimeFactor"]),
                    int(p.get("computeRuns", 0)),
                    int(p.get("computeWorkloads", 0)),
                ),
                updated_at=str(p.get("updatedAt", "")),
            )
        workloads = {}
        for name, w in dict(data.get("workloads", {})).items():
            workloads[str(name)] = WorkloadShares(
                workload=str(name),
                profiled=str(w["product"]),
                sm=float(w["smThroughput"]) / 100,
                mem=float(w["memoryThroughput"]) / 100,
                fp32_tflops=float(w["fp32Tflops"]),
                bandwidth_gbs=float(w["bandwidthGBs"]),
                runs=int(w.get("runs", 0)),
                products=int(w.get("products", 0)),
                updated_at=str(w.get("updatedAt", "")),
            )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CalibrationError(
            f"{CONFIGMAP_KEY}: not a KRATOS calibration ({type(exc).__name__}: {exc})"
        ) from None
    for name, p in products.items():
        if not (p.memory.factor > 0 and p.compute.factor > 0):
            raise CalibrationError(f"{CONFIGMAP_KEY}: products.{name}: factors must be positive")
    for name, w in workloads.items():
        if not (0 < w.sm <= 1 and 0 < w.mem <= 1 and w.fp32_tflops > 0 and w.bandwidth_gbs > 0):
            raise CalibrationError(
                f"{CONFIGMAP_KEY}: workloads.{name}: shares must be in (0, 100] and figures positive"
            )
    return Calibration(products, workloads)


def samples_of(
    profiles: Iterable[WorkloadProfile], catalog: Catalog, *, reference_product: str
) -> list[Sample]:
    """Every observation of a Ready profile with throughputs, as a sample (products the catalog does
    not know are left out; ``-SHARED`` variants pool into their product, by running mean)."""
    found: list[Sample] = []
    for profile in profiles:
        status = profile.status
        if status is None or status.phase != "Ready":
            continue
        sm, mem = status.metrics.percent("sm_throughput"), status.metrics.percent("memory_throughput")
        profiled = catalog.placement(status.gpu.product or reference_product)
        if sm is None or mem is None or profiled is None:
            continue
        pooled: dict[str, tuple[int, float]] = {}
        for observation in status.observations:
            entry = catalog.placement(observation.product)
            try:
                seconds = float(observation.mean_seconds)
            except ValueError:
                continue
            if entry is None or observation.runs <= 0 or seconds <= 0:
                continue
            runs, total = pooled.get(entry.product, (0, 0.0))
            pooled[entry.product] = (runs + observation.runs, total + seconds * observation.runs)
        key = f"{profile.metadata.namespace}/{profile.spec.workload}"
        for product, (runs, total) in sorted(pooled.items()):
            found.append(
                Sample(
                    workload=key,
                    product=product,
                    runs=runs,
                    seconds=total / runs,
                    sm=min(max(sm, 0.0), 100.0) / 100,
                    mem=min(max(mem, 0.0), 100.0) / 100,
                    profiled=profiled.product,
                )
            )
    return found


def keep_unchanged_dates(new: Calibration, old: Calibration) -> Calibration:
    """``new`` with each product's (and workload's) ``updatedAt`` kept from ``old`` where its fit did
    not change."""
    products = {}
    for name, p in new.products.items():
        before = old.get(name)
        products[name] = (
            ProductCalibration(p.product, p.memory, p.compute, before.updated_at)
            if before is not None and before.same_fit(p)
            else p
        )
    workloads = {}
    for name, w in new.workloads.items():
        was = old.workloads.get(name)
        workloads[name] = (
            dataclasses.replace(w, updated_at=was.updated_at) if was is not None and was.same_fit(w) else w
        )
    return Calibration(products, workloads)


def factor_noise(support: FactorSupport) -> float:
    """How far a factor moves (in log) from noise alone: the ordinary spread of runs (about
    ``HUBER_DELTA``) over the square root of the runs behind it."""
    return HUBER_DELTA / math.sqrt(max(1, support.runs))


def moved_beyond_noise(new: Calibration, old: Calibration, min_runs: int) -> bool:
    """Whether ``new`` changes what the ranking uses by more than noise: a factor that starts or
    stops qualifying, or a qualified factor that moved by more than its own noise (the larger of
    its old and new noise). Counts, dates and re-fitted shares alone wait for the next write."""
    for name, p in new.products.items():
        before = old.get(name) or ProductCalibration(name, FactorSupport(), FactorSupport())
        for now, was in ((p.memory, before.memory), (p.compute, before.compute)):
            if now.qualifies(min_runs) != was.qualifies(min_runs):
                return True
            if now.qualifies(min_runs) and abs(math.log(now.factor / was.factor)) > max(
                factor_noise(now), factor_noise(was)
            ):
                return True
    return any(
        p.memory.qualifies(min_runs) or p.compute.qualifies(min_runs)
        for n, p in old.products.items()
        if n not in new.products
    )


def same_calibration(a: Calibration, b: Calibration) -> bool:
    return a.to_json() == b.to_json()
