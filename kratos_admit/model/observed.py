"""What a workload really took (DESIGN "WorkloadProfile", ``status.observations``), as the ranking
reads it: each product's mean seconds and runs at the gang size being ranked, pooled by the ranked
entry a node label belongs to. Pure; ``ranking.py`` puts them before the model's figures."""

from __future__ import annotations

from collections.abc import Mapping

from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.model.catalog import Catalog, GpuProduct


def observed_times(profile: WorkloadProfile, gpus: int = 1) -> tuple[tuple[str, float, int], ...]:
    """(product label, mean seconds, runs) of every product with a successful run. Where the profile
    measured a gang's links (an ``interconnect`` share), only the runs of ``gpus`` GPUs together count:
    a gang of another size moved its data over another link (an observation that does not say its
    size, kept before sizes were recorded, stands in where none of that size does). Elsewhere the runs
    of every size pool, by run-weighted mean, as they did before sizes were recorded: the model has no
    term that depends on the size."""
    status = profile.status
    if status is None:
        return ()
    by_size = status.measured_links
    sized = {o.product for o in status.observations if o.gang_gpus == gpus}
    pooled: dict[str, list[tuple[float, int]]] = {}
    for observation in status.observations:
        size = observation.gang_gpus
        if by_size and (size != gpus if size is not None else observation.product in sized):
            continue
        try:
            seconds = float(observation.mean_seconds)
        except ValueError:
            continue
        if observation.runs >= 1 and seconds > 0:
            pooled.setdefault(observation.product, []).append((seconds, observation.runs))
    found = []
    for label, means in pooled.items():
        runs = sum(n for _, n in means)
        mean = means[0][0] if len(means) == 1 else sum(t * n for t, n in means) / runs
        found.append((label, mean, runs))
    return tuple(sorted(found))


def observed_by_product(
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


def few_runs(
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
