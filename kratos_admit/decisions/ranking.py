"""Rank GPU products by how this workload's measured bottleneck fits each one (docs/ranking.md).

The model predicts the workload's runtime on product P relative to the GPU it was profiled on (R):

    time(P) / time(R) = max(sm * FP32(R) / FP32(P), mem * BW(R) / BW(P)) + (1 - max(sm, mem))

``sm`` and ``mem`` are the SM and memory throughputs the profile measured, as fractions of R's peak;
FP32 and BW are the *sustained* figures (published measurements, else datasheet x a documented
factor), and a MIG slice counts as its share of the GPU. The busy share scales with the product's
figure in the resource that bounds it (roofline); the idle share (latency, launch gaps) does not.

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

import dataclasses
import functools
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kratos_admit.decisions.calibration import DOMINANT, NO_CALIBRATION, PRIOR_RUNS, Calibration
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.catalog import Catalog, GpuProduct, mig_profile_of
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.quantity import parse_positive_integer
from kratos_admit.domain.raw import as_list, as_mapping, string_map
from kratos_admit.domain.vocabulary import Strategy

# When a profile has a bound type but no throughputs (an older runner), assume typical shares.
_SHARES_BY_BOUND: dict[str, tuple[float, float]] = {
    "compute": (0.8, 0.3),
    "memory": (0.3, 0.8),
    "balanced": (0.7, 0.7),
    "latency": (0.3, 0.3),
}


RankingSource = Literal[
    "model", "calibrated", "observed", "none"
]  # the metric kratos_hints_total's source label


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
        return found


def ranking_source(ranked: Sequence[RankedProduct]) -> RankingSource:
    """What a hint's first choice rests on: measured runtimes, the calibrated model or the catalog's
    model; ``none`` for base hints."""
    return ranked[0].source if ranked else "none"


def observed_times(profile: WorkloadProfile) -> tuple[tuple[str, float, int], ...]:
    """(product label, mean seconds, runs) of every product with a successful run."""
    status = profile.status
    found: list[tuple[str, float, int]] = []
    for observation in status.observations if status is not None else ():
        try:
            seconds = float(observation.mean_seconds)
        except ValueError:
            continue
        if observation.runs >= 1 and seconds > 0:
            found.append((observation.product, seconds, observation.runs))
    return tuple(sorted(found))


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


def predicted_relative_time(sm: float, mem: float, *, reference: GpuProduct, product: GpuProduct) -> float:
    compute = sm * reference.sustained_fp32_tflops / product.sustained_fp32_tflops
    memory = mem * reference.sustained_bandwidth_gbs / product.sustained_bandwidth_gbs
    return max(compute, memory) + (1 - max(sm, mem))


def _score(relative_time: float, product: GpuProduct, strategy: Strategy) -> float:
    if strategy == "performance":
        return 1 / relative_time
    if strategy == "cost":
        return 1 / product.relative_cost
    return 1 / (relative_time * product.relative_cost)  # balanced: performance per cost


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
) -> list[RankedProduct]:
    """Products best first, weights 1..100 (the best gets 100). Unknown products get no entry.

    The ranking depends only on the profile's figures, the cluster's products and the config, so
    it is computed once per distinct input and served from a bounded cache after that.
    """
    shares = throughput_shares(profile)
    if shares is None:
        return []
    profiled = profile.status.gpu.product if profile.status else None
    fitted = calibration.shares_of(profile.metadata.namespace, profile.spec.workload)
    figures: tuple[float, float] | None = None
    measured_on = catalog.placement(profiled) if profiled else None
    own = calibration.get(measured_on.product) if measured_on is not None else None
    if (
        fitted is not None
        and fitted.runs >= min_calibration_runs
        and measured_on is not None
        and not (own and own.qualifies(min_calibration_runs))
    ):
        # the shares re-fitted from its runs, of the figures the fit gave its profiled product
        shares, profiled = (fitted.sm, fitted.mem), fitted.profiled
        figures = (fitted.fp32_tflops, fitted.bandwidth_gbs)
    return list(
        _rank(
            catalog,
            shares=shares,
            profiled=profiled,
            reference_figures=figures,
            node_products=frozenset(node_products),
            strategy=strategy,
            reference_product=reference_product,
            min_compute_capability=min_compute_capability,
            min_memory_mib=min_memory_mib,
            observed=observed_times(profile),
            min_observed_runs=min_observed_runs,
            calibration=calibration,
            min_calibration_runs=min_calibration_runs,
        )
    )


@functools.lru_cache(maxsize=4096)
def _rank(
    catalog: Catalog,
    *,
    shares: tuple[float, float],
    profiled: str | None,
    reference_figures: tuple[float, float] | None,
    node_products: frozenset[str],
    strategy: Strategy,
    reference_product: str,
    min_compute_capability: tuple[int, int] | None,
    min_memory_mib: int | None,
    observed: tuple[tuple[str, float, int], ...],
    min_observed_runs: int,
    calibration: Calibration,
    min_calibration_runs: int,
) -> tuple[RankedProduct, ...]:
    reference = (catalog.placement(profiled) if profiled else None) or catalog.lookup(reference_product)
    if reference is None:
        return ()
    if reference_figures is not None:
        reference_calibrated = True
        reference = reference.model_copy(
            update={
                "measured_fp32_tflops": reference_figures[0],
                "measured_bandwidth_gbs": reference_figures[1],
            }
        )
    else:
        reference, reference_calibrated = calibration.calibrated(reference, min_calibration_runs)
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
            entry, changed = calibration.calibrated(entry, min_calibration_runs)
            if changed or reference_calibrated:
                calibrated.add(entry.product)
        labels_by_product.setdefault(entry.product, (entry, []))[1].append(label)
    if not labels_by_product:
        return ()
    sm, mem = shares
    modelled = {
        name: predicted_relative_time(sm, mem, reference=reference, product=entry)
        for name, (entry, _) in labels_by_product.items()
    }
    measured = _observed_by_product(
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
        for name, (seconds, runs) in _few_runs(
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
        )
        for score, entry, labels, rel, seen, name in scored
    ]
    ranked.sort(key=lambda r: (-r.weight, r.relative_time, r.product.product))
    return tuple(ranked)


def _observed_by_product(
    catalog: Catalog,
    observed: tuple[tuple[str, float], ...],
    present: dict[str, tuple[GpuProduct, list[str]]],
) -> dict[str, float]:
    """Observed mean seconds by the ranked entry they belong to (an observation is keyed by the node
    label it ran on, so ``-SHARED`` variants of one product pool into it; MIG slices stay apart)."""
    totals: dict[str, list[float]] = {}
    for label, seconds in observed:
        entry = catalog.placement(label)
        if entry is not None and entry.product in present:
            totals.setdefault(entry.product, []).append(seconds)
    return {name: sum(times) / len(times) for name, times in totals.items()}


def _few_runs(
    catalog: Catalog,
    observed: tuple[tuple[str, float, int], ...],
    min_runs: int,
    measured: dict[str, float],
    present: Mapping[str, object],
) -> dict[str, tuple[float, int]]:
    """(mean seconds, runs) by ranked entry of the products with runs, but fewer than ``min_runs``
    on every label of theirs: their runs pooled (a run-weighted mean) across the entry's labels."""
    totals: dict[str, tuple[float, int]] = {}
    for label, seconds, runs in observed:
        entry = catalog.placement(label)
        if entry is None or entry.product not in present or entry.product in measured or runs >= min_runs:
            continue
        total, count = totals.get(entry.product, (0.0, 0))
        totals[entry.product] = (total + seconds * runs, count + runs)
    return {name: (total / count, count) for name, (total, count) in totals.items()}


def _meets(entry: GpuProduct, min_cc: tuple[int, int] | None, min_memory_mib: int | None) -> bool:
    if min_cc is not None:
        major, minor = (int(x) for x in entry.compute_capability.split("."))
        if (major, minor) < min_cc:
            return False
    # GPU Feature Discovery reports about 1024 MiB per datasheet GB (A100 80GB: 81920, L4: 23034).
    return min_memory_mib is None or entry.memory_gb * 1024 >= min_memory_mib * 0.95


# --- exploration (DESIGN "Exploration: learning every figure that matters") --------------------------

Figure = Literal["compute", "memory"]


@dataclass(frozen=True, slots=True)
class Exploration:
    """A Job sent to a product to measure a figure the ranking has no trustworthy observations of."""

    product: RankedProduct
    figure: Figure
    reason: str


def explored_figure(profile: WorkloadProfile) -> Figure | None:
    """The figure a workload's runs measure: FP32 (and tensor) throughput for a compute-bound one,
    bandwidth for a memory-bound one; none for a latency-bound or balanced one, whose runs the fit
    cannot pin on either (calibration's DOMINANT)."""
    bound = profile.status.bound_type if profile.status else "unknown"
    return "compute" if bound == "compute" else "memory" if bound == "memory" else None


def exploring(key: str, share: float) -> bool:
    """Whether the Job ``key`` (namespace/name) is one of the ``share`` that explore: a hash, not a
    random draw, so the same Job decides the same way on every call (reinvocation, a replay, a test)."""
    if share <= 0 or not key:
        return False
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0x1_0000_0000 < share


def exploration(
    ranked: Sequence[RankedProduct],
    profile: WorkloadProfile,
    *,
    key: str,
    share: float,
    calibration: Calibration,
    min_calibration_runs: int,
    allowed: frozenset[str] | None = None,
    catalog: Catalog | None = None,
) -> Exploration | None:
    """For ``share`` of a workload's Jobs: the best-ranked product after the first choice (which the
    other Jobs measure) whose figure for the workload's bound type has too few observations to trust
    (fewer than ``minCalibrationRuns`` runs from two workloads, telemetry runs counted as any other). Only
    among the ranked products (present in the cluster, within the Job's GPU minimums), never a MIG
    slice (its figures are a share of the whole GPU's), and within ``allowed`` (the product labels a
    Job's own required affinity or nodeSelector admits) when it names any."""
    figure = explored_figure(profile)
    if figure is None or not ranked or not exploring(key, share):
        return None
    shares = throughput_shares(profile)
    profiled = catalog.placement(profile.status.gpu.product or "") if catalog and profile.status else None
    for candidate in ranked[1:]:  # the first choice is measured by the Jobs that are not exploring
        if candidate.relative_time > REACH * ranked[0].relative_time:
            break  # this and every further product is beyond the workload's reach: no run is worth it
        if any(mig_profile_of(label) for label in candidate.labels):
            continue
        if (
            shares is not None
            and profiled is not None
            and not _bounded_by(figure, shares, profiled, candidate.product)
        ):
            continue  # its run there would not clearly measure the figure (DOMINANT)
        if allowed is not None and not set(candidate.labels) & allowed:
            continue
        known = calibration.get(candidate.product.product)
        support = getattr(known, figure) if known is not None else None
        if support is not None and support.qualifies(min_calibration_runs):
            continue
        runs = support.runs if support is not None else 0
        workloads = support.workloads if support is not None else 0
        name = "FP32" if figure == "compute" else "bandwidth"
        return Exploration(
            candidate,
            figure,
            f"the {name} figure of {candidate.product.product} rests on {runs} run(s) from {workloads} workload(s), "
            f"fewer than {min_calibration_runs} from 2 (explorationShare {share:g})",
        )
    return None


# a product whose predicted time is more than this many times the first choice's is beyond the
# workload's reach: a Job lands there only when every better product is full, and a run spent there
# to learn its figure costs more than the figure is worth to its ranking (docs/ranking.md "Exploration")
REACH = 3.0


def _bounded_by(figure: Figure, shares: tuple[float, float], profiled: GpuProduct, there: GpuProduct) -> bool:
    """Whether a run on ``there`` is clearly bound by ``figure`` by the model (the catalog's figures):
    only such a run tells the calibration that figure."""
    sm, mem = shares
    compute = sm * profiled.sustained_fp32_tflops / there.sustained_fp32_tflops
    memory = mem * profiled.sustained_bandwidth_gbs / there.sustained_bandwidth_gbs
    return compute >= DOMINANT * memory if figure == "compute" else memory >= DOMINANT * compute


def explored_first(ranked: Sequence[RankedProduct], chosen: RankedProduct) -> list[RankedProduct]:
    """The explored product first at weight 100, the rest after it in their order at half their
    weight, so the scheduler tries it first and falls back as before when it is full."""
    rest = [dataclasses.replace(r, weight=max(1, r.weight // 2)) for r in ranked if r is not chosen]
    return [dataclasses.replace(chosen, weight=100), *rest]


def allowed_products(pod_spec: Mapping[str, Any]) -> frozenset[str] | None:
    """The GPU products a pod can run on by its own nodeSelector or required node affinity on
    ``nvidia.com/gpu.product`` (None: it names none). Exploration never sends a Job elsewhere."""
    found: set[str] | None = None
    selected = string_map(pod_spec.get("nodeSelector")).get(v.GPU_PRODUCT_LABEL)
    if selected is not None:
        found = {selected}
    required = as_mapping(as_mapping(as_mapping(pod_spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ))  # fmt: skip
    terms = [as_mapping(t) for t in as_list(required.get("nodeSelectorTerms"))]
    named = [
        {str(x) for x in as_list(as_mapping(e).get("values"))}
        for t in terms
        for e in as_list(t.get("matchExpressions"))
        if as_mapping(e).get("key") == v.GPU_PRODUCT_LABEL and as_mapping(e).get("operator") == "In"
    ]
    if terms and len(named) == len(terms):  # every ORed term names its products
        union = set().union(*named)
        found = union if found is None else found & union
    return frozenset(found) if found is not None else None


def one_gpu(pod_spec: Mapping[str, Any]) -> bool:
    """Whether the pod asks for one whole GPU: only such Jobs explore. One GPU measures a product's
    figure as well as eight, at an eighth of the GPU-hours, and waits for less room on a smaller product."""
    asked = 0
    for container in as_list(pod_spec.get("containers")):
        limits = as_mapping(as_mapping(as_mapping(container).get("resources")).get("limits"))
        asked += parse_positive_integer(limits.get(v.GPU_RESOURCE)) or 0  # as validation reads it
    return asked == 1


def object_key(metadata: Mapping[str, Any], namespace: str) -> str:
    """namespace/name: what a Job's exploration is decided by ("" for a generateName-only object,
    whose name comes after admission: it never explores)."""
    name = metadata.get("name")
    return f"{namespace}/{name}" if isinstance(name, str) and name else ""
