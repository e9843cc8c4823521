"""What a simulation found: each policy's figures, and what ``kratos`` (and ``kratos-no-exploration``)
knew after the trace, for a modelled run and for one on a real cluster alike (DESIGN "Simulation")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kratos_admit.domain.config import Config
from kratos_admit.model.catalog import Catalog
from kratos_admit.simulation.knowledge import Learned, SimulatedProfiles, knowledge_of, worst_errors
from kratos_admit.simulation.scheduling import SimNode
from kratos_admit.simulation.trace import Policy, PolicyResult, ProductKnowledge, Trace, Truth


@dataclass(frozen=True)
class SimulationResult:
    policies: dict[Policy, PolicyResult]
    prediction_error: dict[str, float]  # product -> worst |predicted/true - 1| after the trace
    learned: Learned  # what ``kratos`` knew at the end: its profiles
    products: dict[str, ProductKnowledge] = field(default_factory=dict)
    # what kratos-no-exploration knew at the end (empty where it did not run): exploration's gain
    without_exploration: dict[str, ProductKnowledge] = field(default_factory=dict)
    # a trace with gangs: the prediction error over the gangs' workloads and the single-GPU ones apart
    gang_prediction_error: dict[str, float] = field(default_factory=dict)
    single_prediction_error: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "policies": {name: r.as_dict() for name, r in self.policies.items()},
            "predictionError": {p: round(e, 4) for p, e in sorted(self.prediction_error.items())},
            "products": {p: k.as_dict() for p, k in sorted(self.products.items())},
        }
        if self.products:  # DESIGN's three keys per product stay as they are; the figures beside them
            found["figureErrors"] = {p: k.figures_dict() for p, k in sorted(self.products.items())}
            found["explored"] = {p: k.explored for p, k in sorted(self.products.items())}
        if any(r.gangs for r in self.policies.values()):  # beside DESIGN's keys: gangs and the rest apart
            found["meanJctApart"] = {name: r.apart() for name, r in self.policies.items()}
        if self.gang_prediction_error or self.single_prediction_error:
            found["predictionErrorApart"] = {
                "gangs": {p: round(e, 4) for p, e in sorted(self.gang_prediction_error.items())},
                "singleGpu": {p: round(e, 4) for p, e in sorted(self.single_prediction_error.items())},
            }
        if self.without_exploration:
            found["withoutExploration"] = {
                "predictionError": {
                    p: None if k.prediction_error is None else round(k.prediction_error, 4)
                    for p, k in sorted(self.without_exploration.items())
                },
                "figureErrors": {p: k.figures_dict() for p, k in sorted(self.without_exploration.items())},
            }
        return found


def simulation_result(
    results: dict[Policy, PolicyResult],
    learned_by: Mapping[Policy, Learned],
    trace: Trace,
    nodes: Sequence[SimNode],
    *,
    truth: Truth,
    config: Config,
    catalog: Catalog,
) -> SimulationResult:
    """The policies' results with the prediction error of what ``kratos`` learned (none without it)
    and of what ``kratos-no-exploration`` learned where it ran, for a modelled run and for one on a
    real cluster alike."""
    learned = learned_by.get("kratos", Learned(SimulatedProfiles()))
    without = learned_by.get("kratos-no-exploration")
    if "kratos" not in results:
        return SimulationResult(results, {}, learned)
    errors, products = knowledge_of(learned, trace, nodes, truth=truth, config=config, catalog=catalog)
    apart: dict[bool, dict[str, float]] = {}
    if any(job.gang for job in trace.jobs):
        node_products = frozenset(n.product for n in nodes if n.product)
        for gang in (True, False):
            jobs = [job for job in trace.jobs if job.gang == gang]
            apart[gang] = (
                worst_errors(
                    learned, jobs, truth=truth, node_products=node_products, config=config, catalog=catalog
                )[0]
                if jobs
                else {}
            )
    return SimulationResult(
        results,
        errors,
        learned,
        products,
        knowledge_of(without, trace, nodes, truth=truth, config=config, catalog=catalog)[1]
        if without
        else {},
        apart.get(True, {}),
        apart.get(False, {}),
    )
