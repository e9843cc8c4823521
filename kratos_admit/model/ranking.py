"""Rank GPU products by how this workload's time, unit by unit, fits each one (docs/ranking.md).

The model predicts the workload's runtime on product P relative to the GPU it was measured on (M):

    time(P) / time(M) = sum over units u of share[u] * figure_u(M) / figure_u(P)  +  share[latency]

The shares are where its GPU time went, by the unit that bound each kernel (``profile_shares``);
each figure is a *sustained* one (a cited measurement, else datasheet x a documented factor): dense
FP16/BF16 tensor, FP32, FP64 (on FP64 tensor cores where P has them) and DRAM bandwidth; a MIG
slice counts as its share of the GPU. Latency time scales with none of them; interconnect time by the
link a workload on ``gpus`` > 1 GPUs gets on each product (``GpuProduct.link``), else by none.

Calibration (``calibration.py``) replaces a product's catalog figures with the cluster's own once it
rests on ``minCalibrationRuns`` runs from at least two workloads, and a workload that ran on two
products is read with the shares re-fitted from its runs (of the figures the fit gave the product
it was profiled on) instead of its profile's. Measured runtimes beat the model: once at least two
products have ``minObservedRuns`` successful runs each (the profile's ``status.observations``),
those products are ranked by their observed mean times, and every other product by the model
scaled to agree with them. A product the workload ran on fewer times is weighed: the model's
prediction counts as ``PRIOR_RUNS`` runs there, each of its own runs as one (a weighted mean in
log-time), so a run the model's figures disagree with pulls the prediction toward what happened.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.vocabulary import Strategy, Unit
from kratos_admit.model.calibration import (
    NO_CALIBRATION,
    PRIOR_RUNS,
    Calibration,
    WorkloadShares,
)
from kratos_admit.model.catalog import Catalog, GpuProduct
from kratos_admit.model.observed import few_runs, observed_by_product, observed_times

# When a profile has a bound type but no throughputs (an older runner), assume typical shares.
_SHARES_BY_BOUND: dict[str, tuple[float, float]] = {
    "compute": (0.8, 0.3),
    "memory": (0.3, 0.8),
    "balanced": (0.7, 0.7),
    "latency": (0.3, 0.3),
}


# the metric kratos_hints_total's source label
RankingSource = Literal["model", "calibrated", "observed", "none"]


@dataclass(frozen=True, slots=True)
class RankedProduct:
    product: GpuProduct
    labels: tuple[str, ...]  # the node label values this entry stands for
    relative_time: float
    weight: int
    observed: bool = False  # ranked from measured runtimes, not the model
    # the model ran on the cluster's calibrated figures (this product's or the reference's)
    calibrated: bool = False
    weighed_runs: int = 0  # the model weighed with this many runs of its own (fewer than minObservedRuns)
    link: str = ""  # the link a workload on several GPUs gets here (``Link``), "" on one GPU

    @property
    def source(self) -> RankingSource:
        return "observed" if self.observed else "calibrated" if self.calibrated else "model"

    def as_dict(self) -> dict[str, object]:
        found: dict[str, object] = {
            "product": self.product.product,
            "weight": self.weight,
            "relativeTime": round(self.relative_time, 3),
            "source": self.source,
        }
        if self.weighed_runs:
            found["weighedRuns"] = self.weighed_runs  # the workload's own runs the model was weighed with
        if self.link:
            found["link"] = self.link
        return found


def ranking_source(ranked: Sequence[RankedProduct]) -> RankingSource:
    """What a hint's first choice rests on: measured runtimes, the calibrated model or the catalog's
    model; ``none`` for base hints."""
    return ranked[0].source if ranked else "none"


def throughput_shares(profile: WorkloadProfile) -> tuple[float, float] | None:
    """(sm, mem) as fractions of peak, or None when the profile gives nothing to rank by."""
    status = profile.status
    if status is None:
        return None
    sm = status.metrics.percent("sm_throughput")
    mem = status.metrics.percent("memory_throughput")
    if sm is not None and mem is not None:
        return min(max(sm, 0.0), 100.0) / 100, min(max(mem, 0.0), 100.0) / 100
    return _SHARES_BY_BOUND.get(status.bound_type)


SCALED_UNITS: tuple[Unit, ...] = ("tensor", "fp32", "fp64", "memory")  # latency time stays as it is
LINK: Unit = "interconnect"  # scaled by a link's figure where the workload has one on both products


def unit_figures(product: GpuProduct, gpus: int = 1) -> dict[Unit, float]:
    """The product's sustained figure for each scaled unit (TFLOP/s; GB/s for memory) and, for a
    workload on ``gpus`` > 1 GPUs, the bandwidth of the link it gets there (GB/s both ways)."""
    figures = {unit: figure for unit in SCALED_UNITS if (figure := product.sustained(unit)) is not None}
    if (link := product.link(gpus)) is not None:
        figures[LINK] = link.gbs
    return figures


def relative_time_by_units(
    shares: Mapping[Unit, float], *, reference: Mapping[Unit, float], product: Mapping[Unit, float]
) -> float:
    """Time on ``product`` relative to ``reference`` (where the shares were measured): each scaled
    unit's share (the interconnect's where both have a link figure) times the reference's figure over
    the product's, plus the latency share."""
    scaled = sum(shares.get(u, 0.0) * reference[u] / product[u] for u in SCALED_UNITS if shares.get(u))
    link = shares.get(LINK, 0.0)
    if link and LINK in reference and LINK in product:
        link *= reference[LINK] / product[LINK]
    return scaled + link + shares.get("latency", 0.0)


def roofline_relative_time(
    throughputs: Mapping[Unit, float], *, reference: Mapping[Unit, float], product: Mapping[Unit, float]
) -> float:
    """The model of a profile from before time shares, whose throughputs overlap: the largest of the
    scaled terms plus the idle share, ``max(sm x FP32 ratio, mem x bandwidth ratio) + 1 - max(sm, mem)``."""
    terms = [share * reference[u] / product[u] for u, share in throughputs.items()]
    return max(terms, default=0.0) + 1 - max(throughputs.values(), default=0.0)


def predicted_relative_time(sm: float, mem: float, *, reference: GpuProduct, product: GpuProduct) -> float:
    """``roofline_relative_time`` of SM (as FP32) and memory throughputs between two products."""
    return roofline_relative_time(
        dict(_overlapping(sm, mem)), reference=unit_figures(reference), product=unit_figures(product)
    )


def shares_from_throughputs(sm: float, mem: float) -> dict[Unit, float]:
    """The time split on its own GPU of a profile from before time shares, as the roofline reads it:
    the busier of SM (standing for FP32) and memory throughput is that unit's share (a tie split
    between them), the rest latency. The ranking reads such a profile by ``roofline_relative_time``."""
    busy = max(sm, mem)
    found: dict[Unit, float] = {"latency": 1 - busy}
    if sm >= mem:
        found["fp32"] = busy if sm > mem else busy / 2
    if mem >= sm:
        found["memory"] = busy if mem > sm else busy / 2
    return found


def profile_shares(profile: WorkloadProfile) -> dict[Unit, float] | None:
    """The status's ``timeShares``; for a profile without them, ``shares_from_throughputs`` of its
    throughputs or bound type; None when it gives nothing to rank by."""
    status = profile.status
    found = status.time_shares.fractions() if status is not None and status.time_shares else None
    throughputs = throughput_shares(profile) if found is None else None
    return shares_from_throughputs(*throughputs) if throughputs is not None else found


def _reading(profile: WorkloadProfile) -> tuple[tuple[tuple[Unit, float], ...], bool] | None:
    """What the ranking reads a profile by, hashable: its time shares, or (True: by the roofline) its
    SM and memory throughputs as the fp32 and memory shares; None when it gives nothing to rank by."""
    status = profile.status
    found = status.time_shares.fractions() if status is not None and status.time_shares else None
    if found is not None:
        return _key(found), False
    throughputs = throughput_shares(profile)
    return (_overlapping(*throughputs), True) if throughputs is not None else None


def _overlapping(sm: float, mem: float) -> tuple[tuple[Unit, float], ...]:
    return (("fp32", sm), ("memory", mem))


def _key(shares: Mapping[Unit, float]) -> tuple[tuple[Unit, float], ...]:
    """The shares as a hashable tuple in the units' order (the cached ranking's key)."""
    return tuple((unit, shares[unit]) for unit in v.UNITS if shares.get(unit, 0.0) > 0)


def _score(relative_time: float, product: GpuProduct, strategy: Strategy) -> float:
    if strategy == "performance":
        return 1 / relative_time
    if strategy == "cost":
        return 1 / product.relative_cost
    return 1 / (relative_time * product.relative_cost)  # balanced: performance per cost


@dataclass(frozen=True, slots=True)
class _Reading:
    """What a ranking reads a profile by: its shares (by unit, or SM and memory throughputs read by the
    roofline), the product they were measured on, and the figures to read them against where a re-fit
    gave them (None: that product's own, calibrated where its calibration qualifies)."""

    shares: tuple[tuple[Unit, float], ...]
    roofline: bool
    profiled: str | None
    figures: tuple[tuple[Unit, float], ...] | None = None


def _read(
    profile: WorkloadProfile, *, catalog: Catalog, calibration: Calibration, min_calibration_runs: int
) -> _Reading | None:
    reading = _reading(profile)
    if reading is None:
        return None
    shares, roofline = reading
    profiled = profile.status.gpu.product if profile.status else None
    fitted = calibration.shares_for(profile)
    measured_on = catalog.placement(profiled) if profiled else None
    own = calibration.get(measured_on.product) if measured_on is not None else None
    if (
        fitted is not None
        and fitted.runs >= min_calibration_runs
        and measured_on is not None
        and not (own and all(own.support(u).qualifies(min_calibration_runs) for u in _fitted_units(fitted)))
    ):
        # the shares re-fitted from its runs (per unit, or by its throughputs), of the figures the fit
        # gave its profiled product; until that product is calibrated in every unit they use
        refitted = (
            _key(dict(fitted.time_shares)) if fitted.time_shares else _overlapping(fitted.sm, fitted.mem)
        )
        figures = fitted.figures if fitted.time_shares else (
            ("fp32", fitted.fp32_tflops), ("memory", fitted.bandwidth_gbs)
        )  # fmt: skip
        return _Reading(refitted, not fitted.time_shares, fitted.profiled, figures)
    return _Reading(shares, roofline, profiled)


def rank_gpu_products(
    profile: WorkloadProfile,
    node_products: Iterable[str],
    *,
    catalog: Catalog,
    strategy: Strategy,
    reference_product: str,
    min_compute_capability: tuple[int, int] | None = None,
    min_memory_mib: int | None = None,
    min_observed_runs: int = 3,
    calibration: Calibration = NO_CALIBRATION,
    min_calibration_runs: int = 5,
    gpus: int = 1,
) -> list[RankedProduct]:
    """Products best first, weights 1..100 (the best gets 100). Unknown products get no entry.
    ``gpus``: how many GPUs the workload runs on together (a gang's), which sets the link its
    interconnect time scales by on each product.

    The ranking depends only on the profile's figures, the cluster's products and the config, so
    it is computed once per distinct input and served from a bounded cache after that.
    """
    reading = _read(
        profile, catalog=catalog, calibration=calibration, min_calibration_runs=min_calibration_runs
    )
    if reading is None:
        return []
    return list(
        _rank(
            catalog,
            shares=reading.shares,
            roofline=reading.roofline,
            profiled=reading.profiled,
            reference_figures=reading.figures,
            node_products=frozenset(node_products),
            strategy=strategy,
            reference_product=reference_product,
            min_compute_capability=min_compute_capability,
            min_memory_mib=min_memory_mib,
            observed=observed_times(profile, gpus),
            min_observed_runs=min_observed_runs,
            calibration=calibration,
            min_calibration_runs=min_calibration_runs,
            gpus=gpus,
        )
    )


# where the figures a profile's shares are read against come from, weakest first
FigureSource = Literal["datasheet", "measured", "calibrated"]
FIGURE_SOURCES: tuple[FigureSource, ...] = ("datasheet", "measured", "calibrated")


@dataclass(frozen=True, slots=True)
class Reference:
    """The product a profile was measured on, and what the figures its shares are converted with rest
    on, per unit the workload's time uses: the cluster's calibration (or a re-fit of its runs), the
    catalog's cited measurement, or the datasheet times a factor. ``figures`` is the weakest of them:
    every prediction the model makes from this profile rests on it."""

    product: str
    by_unit: tuple[tuple[Unit, FigureSource], ...]

    @property
    def figures(self) -> FigureSource:
        return min((s for _, s in self.by_unit), key=FIGURE_SOURCES.index, default="calibrated")


def figure_source(
    entry: GpuProduct, unit: Unit, calibration: Calibration, min_runs: int, gpus: int = 1
) -> FigureSource:
    """Where the ranking's figure for ``unit`` of catalog ``entry`` comes from (the interconnect's: the
    link ``gpus`` GPUs get there, calibrated where its factor qualifies, else its datasheet)."""
    own = calibration.get(entry.product)
    if unit == LINK:
        link = entry.link(gpus)
        calibrated = own is not None and link is not None and own.link(link.kind).qualifies(min_runs)
        return "calibrated" if calibrated else "datasheet"
    if own is not None and own.support(unit).qualifies(min_runs):
        return "calibrated"
    return "measured" if entry.measured(unit) else "datasheet"


def reference_of(
    profile: WorkloadProfile,
    *,
    catalog: Catalog,
    calibration: Calibration,
    min_calibration_runs: int,
    gpus: int = 1,
) -> Reference | None:
    """The measuring product of a profile the model reads, and what its figures rest on (the hints
    record's ``measuredOn``, ``placement``); None when the profile gives nothing to rank by or names
    no product the catalog knows."""
    reading = _read(
        profile, catalog=catalog, calibration=calibration, min_calibration_runs=min_calibration_runs
    )
    entry = catalog.lookup(reading.profiled) if reading is not None and reading.profiled else None
    if reading is None or entry is None:
        return None
    scaled = (*SCALED_UNITS, LINK) if entry.link(gpus) is not None else SCALED_UNITS
    units = [u for u, share in reading.shares if u in scaled and share > 0]
    if reading.figures is not None:  # read against the figures a re-fit of its runs gave
        return Reference(entry.product, tuple((u, "calibrated") for u in units))
    return Reference(
        entry.product,
        tuple((u, figure_source(entry, u, calibration, min_calibration_runs, gpus)) for u in units),
    )


def _fitted_units(fitted: WorkloadShares) -> tuple[Unit, ...]:
    """The units whose figures a workload's re-fitted shares read: those of its time shares, or FP32
    and memory for one re-fitted by its throughputs."""
    if fitted.time_shares:
        return tuple(u for u, share in fitted.time_shares if u != "latency" and share > 0)
    return ("fp32", "memory")


@functools.lru_cache(maxsize=4096)
def _rank(
    catalog: Catalog,
    *,
    shares: tuple[tuple[Unit, float], ...],
    roofline: bool,
    profiled: str | None,
    reference_figures: tuple[tuple[Unit, float], ...] | None,
    node_products: frozenset[str],
    strategy: Strategy,
    reference_product: str,
    min_compute_capability: tuple[int, int] | None,
    min_memory_mib: int | None,
    observed: tuple[tuple[str, float, int], ...],
    min_observed_runs: int,
    calibration: Calibration,
    min_calibration_runs: int,
    gpus: int = 1,
) -> tuple[RankedProduct, ...]:
    reference = (catalog.placement(profiled) if profiled else None) or catalog.lookup(reference_product)
    if reference is None:
        return ()
    if reference_figures is not None:
        reference_calibrated = True
        reference = reference.with_sustained(dict(reference_figures))
    else:
        reference, reference_calibrated = calibration.calibrated(reference, min_calibration_runs, gpus)
    labels_by_product: dict[str, tuple[GpuProduct, list[str]]] = {}
    calibrated: set[str] = set()
    candidates = sorted(node_products) or [p.product for p in catalog.products]
    for label in candidates:
        entry = catalog.placement(label)
        if entry is None or not _meets(entry, min_compute_capability, min_memory_mib):
            continue
        if (
            entry.product not in labels_by_product
            and entry.product == reference.product
            and reference_figures
        ):
            entry, changed = reference, True  # the figures the workload's shares were re-fitted with
        elif entry.product not in labels_by_product:
            entry, changed = calibration.calibrated(entry, min_calibration_runs, gpus)
            if changed or reference_calibrated:
                calibrated.add(entry.product)
        labels_by_product.setdefault(entry.product, (entry, []))[1].append(label)
    if not labels_by_product:
        return ()
    by_unit, figures = dict(shares), unit_figures(reference, gpus)
    model = roofline_relative_time if roofline else relative_time_by_units
    modelled = {
        name: model(by_unit, reference=figures, product=unit_figures(entry, gpus))
        for name, (entry, _) in labels_by_product.items()
    }
    measured = observed_by_product(
        catalog,
        tuple((label, t) for label, t, runs in observed if runs >= min_observed_runs),
        labels_by_product,
    )
    weighed: dict[str, int] = {}
    if len(measured) >= 2:
        # the model, scaled by the geometric mean of observed/predicted, so both share one unit
        scale = math.exp(sum(math.log(t / modelled[name]) for name, t in measured.items()) / len(measured))
        relative = {
            name: measured[name] / scale if name in measured else rel for name, rel in modelled.items()
        }
        for name, (seconds, runs) in few_runs(
            catalog, observed, min_observed_runs, measured, relative
        ).items():
            # in log-time, the model's prediction worth PRIOR_RUNS runs, each run of its own one
            own = runs / (runs + PRIOR_RUNS)
            relative[name] = math.exp(own * math.log(seconds / scale) + (1 - own) * math.log(modelled[name]))
            weighed[name] = runs
    else:
        measured, relative = {}, modelled
    scored = []
    for name, (entry, labels) in labels_by_product.items():
        rel = relative[name]
        scored.append(
            (_score(rel, entry, strategy), entry, tuple(sorted(set(labels))), rel, name in measured, name)
        )
    best = max(s for s, *_ in scored)
    ranked = [
        RankedProduct(
            entry,
            labels,
            rel,
            max(1, min(100, round(100 * score / best))),
            seen,
            name in calibrated,
            weighed.get(name, 0),
            str(link) if (link := entry.link(gpus)) is not None else "",
        )
        for score, entry, labels, rel, seen, name in scored
    ]
    ranked.sort(key=lambda r: (-r.weight, r.relative_time, r.product.product))
    return tuple(ranked)


def _meets(entry: GpuProduct, min_cc: tuple[int, int] | None, min_memory_mib: int | None) -> bool:
    if min_cc is not None:
        major, minor = (int(x) for x in entry.compute_capability.split("."))
        if (major, minor) < min_cc:
            return False
    # GPU Feature Discovery reports about 1024 MiB per datasheet GB (A100 80GB: 81920, L4: 23034).
    return min_memory_mib is None or entry.memory_gb * 1024 >= min_memory_mib * 0.95
