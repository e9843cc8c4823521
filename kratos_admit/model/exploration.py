"""Exploration (docs/ranking.md, "Exploration"): a small, hash-chosen share of a workload's one-GPU Jobs
sent to the best-ranked product whose figure for the workload's largest unit rests on too few runs, so
calibration learns every figure that matters; and what a Job's own affinity and GPU request allow."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.quantity import parse_positive_integer
from kratos_admit.domain.raw import as_list, as_mapping, string_map
from kratos_admit.domain.vocabulary import Unit
from kratos_admit.model.calibration import (
    DOMINANT,
    Calibration,
    FactorSupport,
)
from kratos_admit.model.catalog import Catalog, GpuProduct, mig_profile_of
from kratos_admit.model.ranking import (
    SCALED_UNITS,
    RankedProduct,
    profile_shares,
    throughput_shares,
    unit_figures,
)


@dataclass(frozen=True, slots=True)
class Exploration:
    """A Job sent to a product to measure a figure the ranking has no trustworthy observations of."""

    product: RankedProduct
    figure: Unit  # the unit whose figure its run measures (tensor, fp32, fp64, memory)
    reason: str


# how the reason names each unit's figure
_FIGURE_NAME: dict[Unit, str] = {"tensor": "tensor", "fp32": "FP32", "fp64": "FP64", "memory": "bandwidth"}


def explored_figure(profile: WorkloadProfile) -> Unit | None:
    """The figure a workload's runs measure: that of its largest unit by time share (tensor, FP32,
    FP64 or memory; none when latency or the interconnect is the largest: no figure of a product's own
    scales latency, and a link's is the datasheet's, which exploring cannot improve). A profile
    written before the units model goes by its bound type: FP32 for compute-bound, bandwidth for
    memory-bound, none for a latency-bound or balanced one, whose runs the fit cannot pin on either
    (calibration's DOMINANT)."""
    status = profile.status
    if status is None:
        return None
    fractions = status.time_shares.fractions() if status.time_shares is not None else None
    if fractions is not None:
        largest = max(v.UNITS, key=lambda u: fractions.get(u, 0.0))
        return None if largest in ("latency", "interconnect") else largest  # no product figure scales them
    return "fp32" if status.bound_type == "compute" else "memory" if status.bound_type == "memory" else None


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
    """For ``share`` of a workload's Jobs: a product after the first choice (which the other Jobs
    measure) whose figure for the workload's bound type has too few observations to trust (fewer
    than ``minCalibrationRuns`` runs from two workloads, telemetry runs counted as any other), counting
    the exploring Jobs under way there (``calibration.exploring``) as runs to come: the best-ranked
    one with no run and none under way, else the best-ranked one. Only among the ranked products
    (present in the cluster, within the Job's GPU minimums), never a MIG slice (its figures are a
    share of the whole GPU's), and within ``allowed`` (the product labels a Job's own required
    affinity or nodeSelector admits) when it names any."""
    figure = explored_figure(profile)
    if figure is None or not ranked or not exploring(key, share):
        return None
    shares = profile_shares(profile)
    profiled = catalog.placement(profile.status.gpu.product or "") if catalog and profile.status else None
    unknown: list[tuple[RankedProduct, FactorSupport, tuple[str, ...]]] = []
    for candidate in ranked[1:]:  # the first choice is measured by the Jobs that are not exploring
        if candidate.relative_time > REACH * ranked[0].relative_time:
            break  # this and every further product is beyond the workload's reach: no run is worth it
        if any(mig_profile_of(label) for label in candidate.labels):
            continue
        if (
            shares is not None
            and profiled is not None
            and not _bounded_by(figure, profile, shares, profiled, candidate.product)
        ):
            continue  # its run there would not clearly measure the figure (DOMINANT)
        if allowed is not None and not set(candidate.labels) & allowed:
            continue
        known = calibration.get(candidate.product.product)
        support = known.support(figure) if known is not None else FactorSupport()
        under_way = calibration.exploring_on(candidate.product.product, figure)
        if _will_qualify(support, under_way, min_calibration_runs):
            continue  # known, or the Jobs under way will make it so: another Job would measure nothing new
        unknown.append((candidate, support, under_way))
    if not unknown:
        return None
    # a figure no run has reached and none is on its way to first: Jobs spread over the unknown
    # figures rather than queue for the best-ranked one while its first runs are still under way
    candidate, support, under_way = next((u for u in unknown if not u[1].runs and not u[2]), unknown[0])
    return Exploration(
        candidate,
        figure,
        f"the {_FIGURE_NAME[figure]} figure of {candidate.product.product} rests on {support.runs} run(s) "
        f"from {support.workloads} workload(s)"
        + (f" and {len(under_way)} exploring Job(s) under way" if under_way else "")
        + f", fewer than {min_calibration_runs} from 2 (explorationShare {share:g})",
    )


def _will_qualify(support: FactorSupport, under_way: Sequence[str], min_runs: int) -> bool:
    """Whether a figure's runs, with those of the exploring Jobs under way (each a run, its workload
    perhaps a new one), reach ``minCalibrationRuns`` from two workloads."""
    return support.runs + len(under_way) >= min_runs and support.workloads + len(set(under_way)) >= 2


# a product whose predicted time is more than this many times the first choice's is beyond the
# workload's reach: a Job lands there only when every better product is full, and a run spent there
# to learn its figure costs more than the figure is worth to its ranking (docs/ranking.md "Exploration")
REACH = 3.0


def _bounded_by(
    figure: Unit,
    profile: WorkloadProfile,
    shares: Mapping[Unit, float],
    profiled: GpuProduct,
    there: GpuProduct,
) -> bool:
    """Whether a run on ``there`` is clearly bound by ``figure`` by the model (the catalog's figures):
    its term at least DOMINANT times every other unit's. Only such a run tells the calibration that
    figure. A profile written before the units model is read by its throughputs, as the fit reads it."""
    status = profile.status
    throughputs = throughput_shares(profile)
    if status is not None and status.time_shares is None and throughputs is not None:
        sm, mem = throughputs
        terms: dict[Unit, float] = {
            "fp32": sm * profiled.sustained_fp32_tflops / there.sustained_fp32_tflops,
            "memory": mem * profiled.sustained_bandwidth_gbs / there.sustained_bandwidth_gbs,
        }
    else:
        here, elsewhere = unit_figures(profiled), unit_figures(there)
        terms = {u: shares.get(u, 0.0) * here[u] / elsewhere[u] for u in SCALED_UNITS}
        terms["latency"] = shares.get("latency", 0.0)  # as the fit reads it: latency competes too
    mine = terms.get(figure, 0.0)
    return mine > 0 and all(mine >= DOMINANT * t for u, t in terms.items() if u != figure)


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
