"""Calibration (DESIGN "Learning the cluster's GPUs"): per GPU product, by how much the ranking
model's memory time and compute time must be scaled to match what really ran on this cluster.

Pure: ``fit_calibration(samples, catalog) -> Calibration``. docs/ranking.md "Calibration" gives the
model and the estimator. In short: a product P's calibrated sustained figures are the catalog's
divided by its factors (``memoryTimeFactor`` 1.25: memory-bound work takes 25 % longer there than
the catalog says). Each (workload, product) observation is one sample: its mean seconds, its run
count, and the workload's profile (SM and memory shares on the product it was profiled on). The fit
alternates two robust steps: each workload's runtime scale is a robust mean (Huber's, in log-time)
of its samples' observed/modelled times, and each product's factor is the robust mean of what its
samples imply for the term that bounds them (memory or compute). A run on a throttled node or
beside a noisy neighbour inflates one sample's mean; the Huber weights let it move a factor by only
a few percent, where a least-squares fit would be pulled by its whole share. Observations fix only
ratios between products, so the factors are anchored to a geometric mean of 1; a factor that
nothing measured stays at 1, the catalog's figure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kratos_admit.domain.catalog import Catalog, GpuProduct
from kratos_admit.domain.profile import WorkloadProfile

CONFIGMAP_NAME = "kratos-gpu-calibration"
CONFIGMAP_KEY = "calibration.json"
ROUNDS = 200
DIGITS = 4
# a sample says something about a factor only when that resource clearly bounds it (its model term
# at least this many times the other); a sample near the balance point could be explained by either
DOMINANT = 2.0
HUBER_DELTA = 0.1  # in log-time: samples within about 10 % of the fit count as in a mean  # factors are stored rounded, so a refit from the same runs writes the same bytes


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


@dataclass(frozen=True, eq=False)
class Calibration:
    """Factors by catalog product. Hashed and compared by identity: the ranking caches on it, and a
    store hands out the same object until the calibration changes."""

    products: Mapping[str, ProductCalibration] = field(default_factory=dict)

    def get(self, product: str) -> ProductCalibration | None:
        return self.products.get(product)

    def calibrated(self, entry: GpuProduct, min_runs: int) -> tuple[GpuProduct, bool]:
        """``entry`` with its sustained figures divided by its factors once they qualify, and whether they did."""
        found = self.products.get(entry.product)
        if found is None or not found.qualifies(min_runs):
            return entry, False
        update = {
            "measured_bandwidth_gbs": entry.sustained_bandwidth_gbs / found.memory.factor,
            "measured_fp32_tflops": entry.sustained_fp32_tflops / found.compute.factor,
        }
        return entry.model_copy(update=update), True

    def to_json(self) -> str:
        return json.dumps(
            {"products": {name: p.as_dict() for name, p in sorted(self.products.items())}},
            indent=2,
            sort_keys=True,
        )


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
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CalibrationError(
            f"{CONFIGMAP_KEY}: not a KRATOS calibration ({type(exc).__name__}: {exc})"
        ) from None
    for name, p in products.items():
        if not (p.memory.factor > 0 and p.compute.factor > 0):
            raise CalibrationError(f"{CONFIGMAP_KEY}: products.{name}: factors must be positive")
    return Calibration(products)


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


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value below and above which half the weight lies (the mean of the two middle values on a tie)."""
    pairs = sorted(zip(values, weights, strict=True))
    half = sum(w for _, w in pairs) / 2
    running = 0.0
    for i, (value, weight) in enumerate(pairs):
        running += weight
        if math.isclose(running, half) and i + 1 < len(pairs):
            return (value + pairs[i + 1][0]) / 2
        if running > half:
            return value
    return pairs[-1][0]


def huber_location(values: Sequence[float], weights: Sequence[float], *, delta: float = HUBER_DELTA) -> float:
    """Huber's M-estimate of location (iteratively reweighted, from the weighted median): values
    within ``delta`` of it count fully, as in a mean; one farther out counts delta/distance of its
    weight, so an outlier moves it by at most about delta times its share of the weight."""
    centre = weighted_median(values, weights)
    for _ in range(20):
        w = [
            wt * min(1.0, delta / max(abs(x - centre), 1e-12)) for x, wt in zip(values, weights, strict=True)
        ]
        updated = sum(x * wi for x, wi in zip(values, w, strict=True)) / sum(w)
        if abs(updated - centre) < 1e-9:
            return updated
        centre = updated
    return centre


def _terms(
    s: Sample, catalog: Catalog, memory: Mapping[str, float], compute: Mapping[str, float]
) -> tuple[float, float, float]:
    """(memory term, compute term, idle share) of the sample's runtime relative to its profiled product."""
    here, there = catalog.placement(s.product), catalog.placement(s.profiled)
    assert here is not None and there is not None, "samples_of keeps catalog products only"
    memory_term = (
        s.mem
        * there.sustained_bandwidth_gbs
        / here.sustained_bandwidth_gbs
        * memory[s.product]
        / memory[s.profiled]
    )
    compute_term = (
        s.sm
        * there.sustained_fp32_tflops
        / here.sustained_fp32_tflops
        * compute[s.product]
        / compute[s.profiled]
    )
    return memory_term, compute_term, 1 - max(s.sm, s.mem)


def _references(votes: Mapping[str, list[tuple[float, Sample]]], used: Sequence[Sample]) -> set[str]:
    """The products whose factor the votes are ratios to: the profiled product of each voting
    workload that also ran there (that run set the workload's scale). A workload that never ran on
    the product it was profiled on measures nothing there."""
    ran = {(s.workload, s.product) for s in used}
    return {s.profiled for cast in votes.values() for _, s in cast if (s.workload, s.profiled) in ran}


def _anchor(factors: dict[str, float], voted: set[str], known: set[str]) -> None:
    """Divide the known factors by the geometric mean of those the samples voted on: the same divisor
    for all, so no ratio between them changes, and the calibrated products keep the catalog's figures
    on average. A factor nothing measured (neither voted on nor the reference of a workload's votes)
    is unknown: it stays at the catalog's figure, 1. Rescaling it with the others would let it drift
    without bound, and drag with it the votes of the workloads profiled on its product."""
    mean = math.exp(sum(math.log(factors[p]) for p in voted) / len(voted)) if voted else 1.0
    for p, value in factors.items():
        factors[p] = value / mean if p in known else 1.0


def fit_calibration(samples: Sequence[Sample], catalog: Catalog, *, updated_at: str = "") -> Calibration:
    """The factors per product that best explain the samples (module docstring). Only workloads seen
    on at least two products say anything about products' ratios; the others are left out."""
    products_of: dict[str, set[str]] = {}
    for s in samples:
        products_of.setdefault(s.workload, set()).add(s.product)
    used = [s for s in samples if len(products_of[s.workload]) >= 2]
    names = {s.product for s in used} | {s.profiled for s in used}
    memory = dict.fromkeys(names, 1.0)
    compute = dict.fromkeys(names, 1.0)
    votes: dict[str, dict[str, list[tuple[float, Sample]]]] = {}
    # the factors some round measured (voted on, or the reference of votes): the others stay 1
    known: dict[str, set[str]] = {"memory": set(), "compute": set()}
    for round_ in range(ROUNDS):
        # least squares first (a unique fit, near which the Huber steps then converge), then Huber
        delta = math.inf if round_ < ROUNDS // 2 else HUBER_DELTA
        scale: dict[str, float] = {}
        by_workload: dict[str, list[Sample]] = {}
        for s in used:
            by_workload.setdefault(s.workload, []).append(s)
        for workload, group in by_workload.items():
            # the scale comes from the samples the model reads clearly: the run on the profiled
            # product (which the model predicts exactly), and runs clearly bound by one resource
            logs, weights = [], []
            for s in group:
                m, c, idle = _terms(s, catalog, memory, compute)
                if s.product == s.profiled or max(m, c) >= DOMINANT * min(m, c):
                    logs.append(math.log(s.seconds / (max(m, c) + idle)))
                    weights.append(s.runs)
            if logs:
                scale[workload] = math.exp(huber_location(logs, weights, delta=delta))
        votes = {"memory": {}, "compute": {}}
        for s in used:
            if s.product == s.profiled:
                continue  # the run on its own profiled product sets the scale, not a ratio
            if s.workload not in scale:
                continue
            m, c, idle = _terms(s, catalog, memory, compute)
            busy = s.seconds / scale[s.workload] - idle
            if busy <= 0 or max(m, c) < DOMINANT * min(m, c):
                continue  # which resource bounds it is not clear: it could explain either factor
            kind, term, factors = ("memory", m, memory) if m >= c else ("compute", c, compute)
            votes[kind].setdefault(s.product, []).append((factors[s.product] * busy / term, s))
        moved = 0.0
        for kind, factors in (("memory", memory), ("compute", compute)):
            for product, cast in votes[kind].items():
                new = math.exp(
                    huber_location([math.log(f) for f, _ in cast], [s.runs for _, s in cast], delta=delta)
                )
                moved = max(moved, abs(math.log(new / factors[product])))
                factors[product] = new
            known[kind] |= set(votes[kind]) | _references(votes[kind], used)
            _anchor(factors, set(votes[kind]), known[kind])
        if moved < 1e-7 and delta != math.inf:
            break
    result: dict[str, ProductCalibration] = {}
    for product in sorted(names):
        # a factor rests on the runs that voted for it here, and on this product's own runs of the
        # workloads profiled on it whose votes elsewhere are ratios to it
        here = {s.workload: s for s in used if s.product == product}
        support = {}
        for kind, factors in (("memory", memory), ("compute", compute)):
            mine = [s for _, s in votes[kind].get(product, [])]
            anchored = {
                s.workload
                for voted in votes[kind].values()
                for _, s in voted
                if s.profiled == product and s.workload in here
            }
            runs = sum(s.runs for s in mine) + sum(here[w].runs for w in anchored)
            support[kind] = FactorSupport(
                round(factors[product], DIGITS), runs, len({s.workload for s in mine} | anchored)
            )
        result[product] = ProductCalibration(
            product=product, memory=support["memory"], compute=support["compute"], updated_at=updated_at
        )
    return Calibration(result)


def keep_unchanged_dates(new: Calibration, old: Calibration) -> Calibration:
    """``new`` with each product's ``updatedAt`` kept from ``old`` where its fit did not change."""
    products = {}
    for name, p in new.products.items():
        before = old.get(name)
        products[name] = (
            ProductCalibration(p.product, p.memory, p.compute, before.updated_at)
            if before is not None and before.same_fit(p)
            else p
        )
    return Calibration(products)


def same_calibration(a: Calibration, b: Calibration) -> bool:
    return a.to_json() == b.to_json()
