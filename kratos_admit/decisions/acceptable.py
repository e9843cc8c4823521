"""Wait or run slow (DESIGN "Wait or run slow"): the products a workload with a Ready profile may run
on, as a required node affinity, so that under load neither kube-scheduler nor Kueue's flavor
assignment puts it on a GPU many times slower than its best.

Pure. ``cut`` takes the ranking (each product's predicted time relative to the profile's) and keeps
the products whose predicted time is within ``max_slowdown`` times the best one's, where "best" is
the fastest product with a Node that can hold one of the workload's Pods (its GPUs per Pod fit in the
most GPUs one Node of that product has). It never starves a workload: the acceptable set always holds
such a product, the product a Job explores is acceptable for it, and where the Nodes' GPU counts are
unknown a product counts as able to hold the Pod.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.quantity import parse_positive_integer
from kratos_admit.domain.raw import as_list, as_mapping, child, child_list, clone
from kratos_admit.model.exploration import Exploration
from kratos_admit.model.ranking import RankedProduct

Expression = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Slowdown:
    """A product of the cut, with its predicted time over the best product's."""

    product: str
    labels: tuple[str, ...]
    slowdown: float

    def as_dict(self) -> dict[str, object]:
        return {"product": self.product, "slowdown": round(self.slowdown, 2)}


@dataclass(frozen=True, slots=True)
class Cut:
    """The acceptable products and those kept off (each with its predicted slowdown), by a cap."""

    cap: float
    acceptable: tuple[Slowdown, ...]
    kept_off: tuple[Slowdown, ...]
    # the predicted runtime on the best product, in seconds, where the workload's own runs give the
    # model's relative times a unit (None: no run yet); the controller's "waited too long" mark
    best_seconds: float | None = None

    @property
    def narrows(self) -> bool:
        return bool(self.kept_off) and bool(self.acceptable)

    @property
    def labels(self) -> tuple[str, ...]:
        """The node label values the required term lets in, sorted."""
        return tuple(sorted({label for s in self.acceptable for label in s.labels}))

    def record(self) -> dict[str, object]:
        """What the hints record says of the cut."""
        found: dict[str, object] = {
            "maxSlowdown": self.cap,
            "acceptable": [s.as_dict() for s in self.acceptable],
            "keptOff": [s.as_dict() for s in self.kept_off],
        }
        if self.best_seconds is not None:
            found["bestSeconds"] = round(self.best_seconds, 1)
        return found


def parse_max_slowdown(raw: str | None) -> float | None:
    """The annotation's value: a number of at least 1 (the cap), ``0`` or ``none`` (no cap: 0.0);
    None when it is not one of these (validation denies it, rule ``hint-format``)."""
    if raw is None:
        return None
    text = raw.strip()
    if text == "none":
        return 0.0
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or (value != 0 and value < 1):
        return None
    return value


def effective_cap(annotations: Mapping[str, str], configured: float) -> float:
    """The object's ``max-slowdown`` annotation where it parses, else the configuration's; 0: no cap."""
    found = parse_max_slowdown(annotations.get(v.MAX_SLOWDOWN_ANNOTATION))
    return configured if found is None else found


def holds_pod(product_gpus: Mapping[str, int] | None, labels: Sequence[str], gpus_per_pod: int) -> bool:
    """Whether some Node of the product (any of its label values) can hold one Pod of ``gpus_per_pod``
    GPUs: the most GPUs one of its Nodes has, where known; unknown counts as yes."""
    if product_gpus is None:
        return True
    known = [product_gpus[label] for label in labels if product_gpus.get(label, 0) > 0]
    return not known or max(known) >= gpus_per_pod


def cut(
    ranked: Sequence[RankedProduct],
    *,
    cap: float,
    gpus_per_pod: int = 1,
    product_gpus: Mapping[str, int] | None = None,
    explored: str = "",
    observed: Mapping[str, float] | None = None,
) -> Cut | None:
    """``_cut`` of hashable arguments, memoised: a decision's inputs repeat (the same ranking, cap and
    Nodes for every Job of a workload), as the ranking's and the hints record's do."""
    return _cut(
        tuple(ranked),
        cap,
        gpus_per_pod=gpus_per_pod,
        product_gpus_items=None if product_gpus is None else tuple(sorted(product_gpus.items())),
        explored=explored,
        observed_items=tuple(sorted((observed or {}).items())),
    )


@functools.lru_cache(maxsize=4096)
def _cut(
    ranked: tuple[RankedProduct, ...],
    cap: float,
    *,
    gpus_per_pod: int,
    product_gpus_items: tuple[tuple[str, int], ...] | None,
    explored: str,
    observed_items: tuple[tuple[str, float], ...],
) -> Cut | None:
    """The acceptable products of ``ranked`` under ``cap`` (0: no cut, None); None too where the ranking
    is empty or no product can hold a Pod (then nothing is narrowed: base hints and preferences only).
    ``observed``: the workload's mean seconds per product label, which give its best product's
    predicted seconds (``best_seconds``)."""
    if cap <= 0 or not ranked:
        return None
    product_gpus = None if product_gpus_items is None else dict(product_gpus_items)
    observed = dict(observed_items)
    fits = [r for r in ranked if holds_pod(product_gpus, r.labels, gpus_per_pod)]
    if not fits:
        return None
    best = min(r.relative_time for r in fits)
    if best <= 0:
        return None
    acceptable: list[Slowdown] = []
    kept_off: list[Slowdown] = []
    for r in sorted(ranked, key=lambda r: (r.relative_time, r.product.product)):
        slowdown = r.relative_time / best
        entry = Slowdown(r.product.product, r.labels, slowdown)
        within = slowdown <= cap * (1 + 1e-9) and r in fits
        (acceptable if within or r.product.product == explored else kept_off).append(entry)
    return Cut(cap, tuple(acceptable), tuple(kept_off), predicted_seconds(ranked, best, observed))


def predicted_seconds(
    ranked: Sequence[RankedProduct], relative: float, observed: Mapping[str, float]
) -> float | None:
    """Seconds for ``relative`` (a relative time of the ranking), in the unit the workload's own runs
    give it: the geometric mean of observed seconds over relative time on the products it ran on."""
    logs = [
        math.log(seconds / r.relative_time)
        for r in ranked
        for label in r.labels[:1]
        if (seconds := observed.get(label, observed.get(r.product.product, 0.0))) > 0 and r.relative_time > 0
    ]
    return relative * math.exp(sum(logs) / len(logs)) if logs else None


def pod_gpus(pod_spec: Mapping[str, Any]) -> int:
    """The whole GPUs one Pod asks for (its containers' ``nvidia.com/gpu`` limits, as validation
    reads them; init containers run before and alongside none of them); at least 1."""
    asked = 0
    for container in as_list(pod_spec.get("containers")):
        limits = as_mapping(as_mapping(as_mapping(container).get("resources")).get("limits"))
        asked += parse_positive_integer(limits.get(v.GPU_RESOURCE)) or 0
    return max(asked, 1)


def required_variants(cc: tuple[int, int] | None, memory_mib: int | None) -> list[list[Expression]]:
    """Alternatives (ORed terms) of ANDed requirements. "cc >= M.m" needs two terms when m > 0."""
    base: list[Expression] = [{"key": v.GPU_PRESENT_LABEL, "operator": "In", "values": ["true"]}]
    if memory_mib is not None:
        base.append({"key": v.GPU_MEMORY_LABEL, "operator": "Gt", "values": [str(memory_mib - 1)]})
    if cc is None:
        return [base]
    major, minor = cc
    if minor == 0:
        return [[*base, {"key": v.GPU_CC_MAJOR_LABEL, "operator": "Gt", "values": [str(major - 1)]}]]
    return [
        [*base, {"key": v.GPU_CC_MAJOR_LABEL, "operator": "Gt", "values": [str(major)]}],
        [
            *base,
            {"key": v.GPU_CC_MAJOR_LABEL, "operator": "In", "values": [str(major)]},
            {"key": v.GPU_CC_MINOR_LABEL, "operator": "Gt", "values": [str(minor - 1)]},
        ],
    ]


def and_into_terms(pod_spec: dict[str, Any], variants: list[list[Expression]]) -> bool:
    affinity = child(pod_spec, "affinity")
    node_affinity = child(affinity, "nodeAffinity")
    required = child(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution")
    existing = [t for t in as_list(required.get("nodeSelectorTerms")) if isinstance(t, dict)] or [{}]
    terms: list[dict[str, Any]] = []
    for term in existing:
        for variant in variants:
            new_term = clone(term)
            expressions = child_list(new_term, "matchExpressions")
            for expression in variant:
                if expression not in expressions:
                    expressions.append(expression)
            terms.append(new_term)
    changed: bool = terms != required.get("nodeSelectorTerms")
    required["nodeSelectorTerms"] = terms
    return changed


def observed_seconds(observations: Iterable[Any]) -> dict[str, float]:
    """A profile's observations (``status.observations``) as mean seconds per product, runs on one
    GPU or the first entry of each product."""
    found: dict[str, float] = {}
    for o in observations:
        try:
            seconds = float(o.mean_seconds)
        except (TypeError, ValueError):
            continue
        if o.runs > 0 and seconds > 0:
            found.setdefault(str(o.product), seconds)
    return found


def user_product_requirement(pod_spec: Mapping[str, Any]) -> bool:
    """Whether the pod spec already requires GPU products itself (a ``nodeSelector`` on the product
    label, or a required term on it): the user's choice wins, and KRATOS narrows nothing."""
    if v.GPU_PRODUCT_LABEL in as_mapping(pod_spec.get("nodeSelector")):
        return True
    node_affinity = as_mapping(as_mapping(pod_spec.get("affinity")).get("nodeAffinity"))
    required = as_mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    for term in as_list(required.get("nodeSelectorTerms")):
        for expression in as_list(as_mapping(term).get("matchExpressions")):
            if as_mapping(expression).get("key") == v.GPU_PRODUCT_LABEL:
                return True
    return False


def product_requirement(labels: Sequence[str]) -> dict[str, Any]:
    """The expression ANDed into every required term: the acceptable products' label values."""
    return {"key": v.GPU_PRODUCT_LABEL, "operator": "In", "values": list(labels)}


def narrowing(
    pod_spec: Mapping[str, Any],
    ranked: Sequence[RankedProduct],
    *,
    annotations: Mapping[str, str],
    config: Config,
    product_gpus: Mapping[str, int] | None,
    explored: Exploration | None,
    observed: Mapping[str, float] | None = None,
) -> Cut | None:
    """The cut of "Wait or run slow" for a ranked workload (None: no narrowing), unless the user
    already requires GPU products, whose choice wins; ``product_gpus``: the most GPUs one Node of each
    product label has (None: unknown, every product can hold a Pod)."""
    if user_product_requirement(pod_spec):
        return None
    return cut(
        ranked,
        cap=effective_cap(annotations, config.max_slowdown),
        gpus_per_pod=pod_gpus(pod_spec),
        product_gpus=product_gpus,
        explored=explored.product.product.product if explored is not None else "",
        observed=observed,
    )


def narrow(
    pod_spec: dict[str, Any],
    ranked: Sequence[RankedProduct],
    profile: WorkloadProfile,
    *,
    annotations: Mapping[str, str],
    config: Config,
    product_gpus: Mapping[str, int] | None,
    explored: Exploration | None,
) -> Cut | None:
    """The cut of a Ready ``profile``'s ranking, written into ``pod_spec`` as the product requirement
    ANDed into every required term; None (nothing written) where it narrows nothing."""
    found = narrowing(
        pod_spec,
        ranked,
        annotations=annotations,
        config=config,
        product_gpus=product_gpus,
        explored=explored,
        observed=observed_seconds(profile.status.observations if profile.status else ()),
    )
    if found is None or not found.narrows:
        return None
    and_into_terms(pod_spec, [[product_requirement(found.labels)]])
    return found
