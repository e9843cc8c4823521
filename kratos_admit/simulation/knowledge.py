"""What ``kratos`` knew after the trace (DESIGN "Simulation"): per GPU product, the worst error of
the runtimes it would now predict there, over all workloads and by the figure their runs exercise
(their largest unit's; by throughputs, FP32 for compute-bound and bandwidth for memory-bound), its runs, whether its figures are
calibrated, and the Jobs sent there to explore; and what it knew them from (``Learned``: its profiles,
its calibration)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kratos_admit.decisions.hints import ranking_of
from kratos_admit.decisions.stores import ProfileIndex, StaticCalibrationStore
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import ObjectMeta, ProfileSpec, ProfileStatus, WorkloadProfile
from kratos_admit.model.calibration import Calibration
from kratos_admit.model.catalog import Catalog
from kratos_admit.simulation.scheduling import SimNode
from kratos_admit.simulation.trace import (
    NAMESPACE,
    Figure,
    ProductKnowledge,
    Trace,
    TraceJob,
    Truth,
    figure_of,
    time_shares_status,
)


class SimulatedProfiles:
    """The WorkloadProfiles the simulated controller has published: a profile store in memory."""

    def __init__(self) -> None:
        self.index = ProfileIndex()
        self.versions = itertools.count(1)

    def put(self, workload: str, status: ProfileStatus) -> WorkloadProfile:
        profile = WorkloadProfile(
            metadata=ObjectMeta(
                name=v.profile_name(workload), namespace=NAMESPACE, resourceVersion=str(next(self.versions))
            ),
            spec=ProfileSpec(workload=workload),
            status=status,
        )
        self.index.put(profile)
        return profile

    def get(self, namespace: str, workload: str) -> WorkloadProfile | None:
        return self.index.get(namespace, workload)

    def ready(self) -> bool:
        return True

    def __len__(self) -> int:
        return len(self.index)

    async def refresh(self, namespace: str, workload: str) -> None:
        """Every profile is in memory: a miss is an answer."""

    async def run(self) -> None:
        """Changed by the simulation itself: nothing to keep current."""


@dataclass
class Learned:
    profiles: SimulatedProfiles
    calibration: StaticCalibrationStore = field(default_factory=StaticCalibrationStore)
    explored: Mapping[str, int] = field(default_factory=dict)  # Jobs sent to explore, by product

    def current(self) -> Calibration:
        return self.calibration.current()


ByFigure = dict[
    str, dict[Figure, float]
]  # product -> figure -> worst error over the workloads of that figure


def prediction_errors(
    learned: Learned,
    jobs: Sequence[TraceJob],
    *,
    truth: Truth,
    node_products: frozenset[str],
    config: Config,
    catalog: Catalog,
) -> dict[str, float]:
    """Per product, the worst |predicted/true - 1| of the runtime over ``jobs``' workloads (``worst_errors``)."""
    return worst_errors(
        learned, jobs, truth=truth, node_products=node_products, config=config, catalog=catalog
    )[0]


def worst_errors(
    learned: Learned,
    jobs: Sequence[TraceJob],
    *,
    truth: Truth,
    node_products: frozenset[str],
    config: Config,
    catalog: Catalog,
) -> tuple[dict[str, float], ByFigure]:
    """Per product, the worst |predicted/true - 1| of the runtime over ``jobs``' workloads, as
    ``kratos`` would rank them now, and the same over the workloads whose bound type exercises each
    figure (FP32: compute-bound, bandwidth: memory-bound). Predicted seconds are the ranking's relative times in the unit
    the workload's own observations give them (the mean of observed/relative over its observed
    products, each weighed by its runs); a workload without observations (never seen) is profiled on its reference product,
    and its true runtime there is the unit. True seconds: the workload's mean reference runtime
    scaled by the truth."""
    worst: dict[str, float] = {}
    by_figure: ByFigure = {}
    by_workload: dict[str, list[TraceJob]] = {}
    for job in jobs:
        by_workload.setdefault(job.workload, []).append(job)
    for workload, group in by_workload.items():
        job = group[0]
        seconds = sum(j.reference_seconds for j in group) / len(group)
        profile = learned.profiles.get(NAMESPACE, workload)
        if profile is None or not profile.ready:
            status = ProfileStatus.model_validate(
                {"phase": "Ready", "metrics": dict(job.metrics), "gpu": {"product": job.reference_product}}
                | ({"timeShares": time_shares_status(job.time_shares)} if job.time_shares is not None else {})
            )
            profile = WorkloadProfile(
                metadata=ObjectMeta(name=v.profile_name(workload), namespace=NAMESPACE),
                spec=ProfileSpec(workload=workload),
                status=status,
            )
        assert profile.status is not None
        ranked_now = ranking_of(
            profile,
            node_products,
            config=config,
            catalog=catalog,
            calibration=learned.current(),
            gpus=job.total_gpus,
        )

        def true_seconds(label: str, job: TraceJob = job, seconds: float = seconds) -> float:
            return seconds * truth.relative_time(
                job.runtime_shares, reference=job.reference_product, product=label, gpus=job.total_gpus
            )

        observed: dict[str, tuple[float, int]] = {}
        for o in profile.status.observations:
            entry = catalog.placement(o.product)
            if entry is not None and o.runs:
                observed[entry.product] = (float(o.mean_seconds), o.runs)
        # the unit: a run-weighted geometric mean of observed over predicted, so one run that spilled onto
        # a product the model gets wrong does not move every other product's prediction as much as the
        # dozens of runs on the products that agree
        units = [
            (math.log(observed[r.product.product][0] / r.relative_time), observed[r.product.product][1])
            for r in ranked_now
            if r.product.product in observed
        ]
        if units:
            unit = math.exp(sum(u * runs for u, runs in units) / sum(runs for _, runs in units))
        else:
            unit = true_seconds(profile.status.gpu.product or job.reference_product)
        figure = figure_of(job)
        for ranked in ranked_now:
            error = abs(ranked.relative_time * unit / true_seconds(ranked.labels[0]) - 1)
            name = ranked.product.product
            worst[name] = max(worst.get(name, 0.0), error)
            if figure is not None:
                figures = by_figure.setdefault(name, {})
                figures[figure] = max(figures.get(figure, 0.0), error)
    return worst, by_figure


def product_knowledge(
    learned: Learned,
    node_products: frozenset[str],
    errors: Mapping[str, float],
    config: Config,
    catalog: Catalog,
    *,
    by_figure: Mapping[str, Mapping[Figure, float]],
) -> dict[str, ProductKnowledge]:
    """Per catalog product in the cluster: the runs ``kratos`` counted there (its profiles'
    observations), whether a factor of it qualifies, and its prediction error (None: nothing ranked on it)."""
    runs: dict[str, int] = {}
    for profile in learned.profiles.index.profiles():
        for o in profile.status.observations if profile.status else ():
            entry = catalog.placement(o.product)
            if entry is not None:
                runs[entry.product] = runs.get(entry.product, 0) + o.runs
    calibration = learned.current()
    found: dict[str, ProductKnowledge] = {}
    for label in sorted(node_products):
        entry = catalog.placement(label)
        if entry is None or entry.product in found:
            continue
        _, calibrated = calibration.calibrated(entry, config.min_calibration_runs)
        found[entry.product] = ProductKnowledge(
            runs.get(entry.product, 0),
            calibrated,
            errors.get(entry.product),
            dict(by_figure.get(entry.product, {})),
            learned.explored.get(entry.product, 0),
        )
    return found


def knowledge_of(
    learned: Learned,
    trace: Trace,
    nodes: Sequence[SimNode],
    *,
    truth: Truth,
    config: Config,
    catalog: Catalog,
) -> tuple[dict[str, float], dict[str, ProductKnowledge]]:
    """What one learning policy knew after the trace: its prediction errors and per product knowledge."""
    products = frozenset(n.product for n in nodes if n.product)
    errors, by_figure = worst_errors(
        learned, trace.jobs, truth=truth, node_products=products, config=config, catalog=catalog
    )
    return errors, product_knowledge(learned, products, errors, config, catalog, by_figure=by_figure)
