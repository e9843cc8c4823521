"""Rank GPU products by how this workload's measured bottleneck fits each one (docs/ranking.md).

The model predicts the workload's runtime on product P relative to the GPU it was profiled on (R):

    time(P) / time(R) = max(sm * FP32(R) / FP32(P), mem * BW(R) / BW(P)) + (1 - max(sm, mem))

``sm`` and ``mem`` are the SM and memory throughputs the profile measured, as fractions of R's peak.
The busy share scales with the product's peak in the resource that bounds it (roofline); the idle
share (latency, launch gaps) is assumed not to scale with the product.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from kratos_admit.catalog import Catalog, GpuProduct
from kratos_admit.profile import WorkloadProfile
from kratos_admit.vocabulary import Strategy

# When a profile has a bound type but no throughputs (an older runner), assume typical shares.
_SHARES_BY_BOUND: dict[str, tuple[float, float]] = {
    "compute": (0.8, 0.3),
    "memory": (0.3, 0.8),
    "balanced": (0.7, 0.7),
    "latency": (0.3, 0.3),
}


@dataclass(frozen=True, slots=True)
class RankedProduct:
    product: GpuProduct
    labels: tuple[str, ...]  # the node label values this entry stands for
    relative_time: float
    weight: int

    def as_dict(self) -> dict[str, object]:
        return {
            "product": self.product.product,
            "weight": self.weight,
            "relativeTime": round(self.relative_time, 3),
        }


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
    compute = sm * reference.fp32_tflops / product.fp32_tflops
    memory = mem * reference.memory_bandwidth_gbs / product.memory_bandwidth_gbs
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
) -> list[RankedProduct]:
    """Products best first, weights 1..100 (the best gets 100). Unknown products get no entry.

    The ranking depends only on the profile's figures, the cluster's products and the config, so
    it is computed once per distinct input and served from a bounded cache after that.
    """
    shares = throughput_shares(profile)
    if shares is None:
        return []
    profiled = profile.status.gpu.product if profile.status else None
    return list(
        _rank(
            catalog,
            shares=shares,
            profiled=profiled,
            node_products=frozenset(node_products),
            strategy=strategy,
            reference_product=reference_product,
            min_compute_capability=min_compute_capability,
            min_memory_mib=min_memory_mib,
        )
    )


@functools.lru_cache(maxsize=4096)
def _rank(
    catalog: Catalog,
    *,
    shares: tuple[float, float],
    profiled: str | None,
    node_products: frozenset[str],
    strategy: Strategy,
    reference_product: str,
    min_compute_capability: tuple[int, int] | None,
    min_memory_mib: int | None,
) -> tuple[RankedProduct, ...]:
    reference = (catalog.lookup(profiled) if profiled else None) or catalog.lookup(reference_product)
    if reference is None:
        return ()
    labels_by_product: dict[str, tuple[GpuProduct, list[str]]] = {}
    candidates = sorted(node_products) or [p.product for p in catalog.products]
    for label in candidates:
        entry = catalog.lookup(label)
        if entry is None or not _meets(entry, min_compute_capability, min_memory_mib):
            continue
        labels_by_product.setdefault(entry.product, (entry, []))[1].append(label)
    if not labels_by_product:
        return ()
    sm, mem = shares
    scored = []
    for entry, labels in labels_by_product.values():
        rel = predicted_relative_time(sm, mem, reference=reference, product=entry)
        scored.append((_score(rel, entry, strategy), entry, tuple(sorted(set(labels))), rel))
    best = max(s for s, *_ in scored)
    ranked = [
        RankedProduct(entry, labels, rel, max(1, min(100, round(100 * score / best))))
        for score, entry, labels, rel in scored
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
