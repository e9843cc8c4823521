"""The load-aware rules of "Wait or run slow" in the model's replay (``trace.LOAD_AWARE``):

- the escape, in ``kratos``, ``kratos-static`` and ``kratos-no-exploration`` (``trace.ESCAPING``), as
  the controller runs it in a cluster (the rule: ``decisions/escape.py``): the cap, through the
  admission engine, and a narrowed Job that finds no acceptable product free escapes onto a product
  the cap keeps it off where that product has room now and the Job is predicted to finish there
  before it would on any acceptable product, the Jobs running there and those ahead of it in the
  queue counted (Lin and Kumar's threshold). It never waits for a kept-off product. Single-Pod Jobs
  only: a gang waits whole, for one acceptable product.
- ``kratos-eft``, in the model only (``MODEL_ONLY``): no cap; each waiting Job, in arrival order, takes
  the product where it is predicted to finish first, the wait counted (HEFT's earliest finish time),
  and starts only when that product has a free GPU; otherwise it waits for it.

The wait for a product is read from the predicted ends of the Jobs running there and of the Jobs ahead
in the queue that wait for it; every prediction is KRATOS's own (the ranking's relative times, in the
unit of the Job's runtime on the product its profile was measured on), never the truth. The measured
comparison with the fixed cap (``kratos-cap``) is in docs/placement.md ("Wait or run slow").
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from kratos_admit.decisions.escape import escape_product, finish_time
from kratos_admit.decisions.hints import ranking_of
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.raw import as_list, as_mapping
from kratos_admit.model.calibration import Calibration
from kratos_admit.model.catalog import Catalog
from kratos_admit.simulation.calibration import SimulatedCalibration
from kratos_admit.simulation.knowledge import SimulatedProfiles
from kratos_admit.simulation.scheduling import ClusterState, PodRequest, SimNode, feasible, schedule
from kratos_admit.simulation.trace import ESCAPING, NAMESPACE, Policy, TraceJob


@dataclass
class EarliestFinish:
    """The predicted ends of the Jobs running on each product, and the choice for a waiting Job.

    ``ahead`` (in ``choose`` and ``escape``): per product, the predicted seconds of the Jobs before this
    one in the queue that wait for it; each takes the next GPU that frees there, in turn."""

    capacity: dict[str, int] = field(default_factory=dict)  # product -> its GPUs in the cluster
    running: dict[str, list[float]] = field(default_factory=dict)  # product -> sorted predicted ends
    ends: dict[str, tuple[str, float, int]] = field(default_factory=dict)  # Job -> (product, end, GPUs)

    def started(self, job: str, product: str, predicted_end: float, gpus: int = 1) -> None:
        for _ in range(gpus):
            bisect.insort(self.running.setdefault(product, []), predicted_end)
        self.ends[job] = (product, predicted_end, gpus)

    def finished(self, job: str) -> None:
        found = self.ends.pop(job, None)
        if found is None:
            return
        product, end, gpus = found
        ends = self.running.get(product, [])
        for _ in range(gpus):
            i = bisect.bisect_left(ends, end)
            if i < len(ends) and ends[i] == end:
                ends.pop(i)

    def finish_on(
        self, product: str, seconds: float, now: float, *, ahead: Mapping[str, Sequence[float]], gpus: int = 1
    ) -> float:
        """When a Job of ``seconds`` on ``product`` is predicted to end: each GPU there frees at its
        running Job's predicted end (now if idle or overdue), the Jobs ahead take them in turn, and this
        one the next (inf: the product has no GPU); the rule's ``finish_time``."""
        ends = self.running.get(product, [])
        frees = [now] * max(self.capacity.get(product, 0) - len(ends), 0) + [max(now, e) for e in ends]
        return finish_time(frees, seconds, ahead.get(product, ()), gpus)

    def choose(
        self,
        now: float,
        predicted: Mapping[str, float],
        *,
        free: Callable[[str], bool],
        ahead: Mapping[str, Sequence[float]],
    ) -> tuple[str, bool] | None:
        """The product where a Job of ``predicted`` seconds per product finishes first, and whether it
        has a free GPU now (and no Job ahead waits for it); None where no product can be predicted."""
        best: tuple[float, str, bool] | None = None
        for product, seconds in sorted(predicted.items()):
            now_free = free(product) and not ahead.get(product)
            finish = now + seconds if now_free else self.finish_on(product, seconds, now, ahead=ahead)
            if best is None or finish < best[0]:
                best = (finish, product, now_free)
        if best is None or math.isinf(best[0]):
            return None
        return best[1], best[2]

    def escape(
        self,
        now: float,
        predicted: Mapping[str, float],
        acceptable: Collection[str],
        *,
        free: Callable[[str], bool],
        ahead: Mapping[str, Sequence[float]],
    ) -> str | None:
        """The kept-off product a waiting Job escapes to (the rule's ``escape_product``), or None."""
        found = escape_product(
            now, predicted, acceptable, room=free, finish=lambda p, s: self.finish_on(p, s, now, ahead=ahead)
        )
        return found[0] if found is not None else None


def predicted_seconds(
    profile: WorkloadProfile | None,
    job: TraceJob,
    products: frozenset[str],
    *,
    config: Config,
    catalog: Catalog,
    calibration: Calibration,
) -> dict[str, float]:
    """What KRATOS predicts ``job`` takes on each product of the cluster: the ranking's relative times
    of its workload's ``profile``, in the unit of its runtime on its reference product (the trace's
    reference runtime, as a user's own estimate); empty without a Ready profile."""
    if profile is None or not profile.ready or profile.status is None:
        return {}
    measured = profile.status.gpu.product or job.reference_product
    ranked = ranking_of(
        profile,
        products | {job.reference_product, measured},
        config=config,
        catalog=catalog,
        calibration=calibration,
        gpus=job.total_gpus,
    )
    relative = {label: r.relative_time for r in ranked for label in r.labels}
    unit = job.reference_seconds / relative.get(job.reference_product, 1.0)
    return {p: relative[p] * unit for p in products if p in relative}


class Entry(Protocol):
    """A Job waiting in the replay's queue (``replay.Pending``), as these rules read and widen it."""

    job: TraceJob
    pod: PodRequest


class OracleRun(Protocol):
    """What ``oracle_escape`` reads of the wait-aware oracle's replay (``replay.PolicyRun``)."""

    now: float
    products: frozenset[str]
    state: ClusterState
    rng: random.Random
    eft: EarliestFinish

    def _true_time(self, job: TraceJob, product: str) -> float: ...


class Run(Protocol):
    """What these rules read of one policy's replay (``replay.PolicyRun``)."""

    policy: Policy
    now: float
    products: frozenset[str]
    profiles: SimulatedProfiles
    calibration: SimulatedCalibration
    config: Config
    catalog: Catalog
    state: ClusterState
    rng: random.Random
    eft: EarliestFinish


def _predicted(run: Run, job: TraceJob) -> dict[str, float]:
    return predicted_seconds(
        run.profiles.get(NAMESPACE, job.workload),
        job,
        run.products,
        config=run.config,
        catalog=run.catalog,
        calibration=run.calibration.current(),
    )


def acceptable_products(pod: PodRequest) -> frozenset[str] | None:
    """The products the cut's requirement (``nvidia.com/gpu.product In``) lets a pod onto; None where
    it has none (nothing narrowed)."""
    for term in pod.required_terms:
        for expression in as_list(term.get("matchExpressions")):
            found = as_mapping(expression)
            if found.get("key") == v.GPU_PRODUCT_LABEL and found.get("operator") == "In":
                return frozenset(str(x) for x in as_list(found.get("values")))
    return None


def widened(pod: PodRequest, product: str) -> PodRequest:
    """``pod`` with ``product`` added to the cut's requirement in every required term."""
    terms = tuple(
        {
            **term,
            "matchExpressions": [
                {**e, "values": [*as_list(e.get("values")), product]}
                if e.get("key") == v.GPU_PRODUCT_LABEL and e.get("operator") == "In"
                else e
                for e in (as_mapping(x) for x in as_list(term.get("matchExpressions")))
            ],
        }
        for term in pod.required_terms
    )
    return replace(pod, required_terms=terms)


def place_load_aware(run: Run, entry: Entry, ahead: dict[str, list[float]]) -> SimNode | None:
    """Where a model-only policy puts a (single-Pod) Job now, or None: it waits; ``ahead`` counts the
    Jobs before it that wait for each product, and this one is added where it waits."""
    predicted = _predicted(run, entry.job)

    def free(product: str) -> bool:
        pod = widened(entry.pod, product)
        return any(n.product == product and feasible(n, pod, run.state) for n in run.state.nodes)

    if run.policy != "kratos-eft":  # the escape of KRATOS's own policies (trace.ESCAPING)
        node = schedule(entry.pod, run.state, run.rng)
        acceptable = acceptable_products(entry.pod)
        if node is not None or acceptable is None or not predicted:
            return node
        product = run.eft.escape(run.now, predicted, acceptable, free=free, ahead=ahead)
        if product is None:
            target = min((p for p in predicted if p in acceptable), key=predicted.__getitem__, default=None)
            if target is not None:
                ahead.setdefault(target, []).append(predicted[target])
            return None
        entry.pod = widened(entry.pod, product)
        return schedule(
            entry.pod, run.state, run.rng, among=[n for n in run.state.nodes if n.product == product]
        )
    if not predicted:  # kratos-eft, no Ready profile yet: placed as kratos places it
        return schedule(entry.pod, run.state, run.rng)
    chosen = run.eft.choose(run.now, predicted, free=free, ahead=ahead)
    if chosen is None:
        return schedule(entry.pod, run.state, run.rng)
    product, now_free = chosen
    if not now_free:
        ahead.setdefault(product, []).append(predicted[product])
        return None
    return schedule(entry.pod, run.state, run.rng, among=[n for n in run.state.nodes if n.product == product])


def note_started(run: Run, entry: Entry, product: str, gpus: int) -> None:
    """A model-only policy's record of a Job that starts on ``product`` on ``gpus`` GPUs in all: its
    predicted end there, which later Jobs' waits are read from."""
    seconds = _predicted(run, entry.job).get(product)
    if seconds is not None:
        run.eft.started(entry.job.name, product, run.now + seconds, gpus)


def oracle_escape(
    run: OracleRun, entry: Entry, accepted: frozenset[str], ahead: dict[str, list[float]]
) -> SimNode | None:
    """``oracle-wait``'s escape: the rule of ``decisions/escape.py`` on the true times, the true ends
    of what runs counted; None: it waits (counted ahead on its truly best acceptable product)."""
    job = entry.job
    predicted = {p: job.reference_seconds * run._true_time(job, p) for p in run.products}

    def free(product: str) -> bool:
        return any(n.product == product and run.state.free_gpus(n) >= entry.pod.gpus for n in run.state.nodes)

    product = run.eft.escape(run.now, predicted, accepted, free=free, ahead=ahead)
    if product is None:
        best = min(accepted, key=predicted.__getitem__, default=None)
        if best is not None:
            ahead.setdefault(best, []).append(predicted[best])
        return None
    among = [n for n in run.state.nodes if n.product == product and run.state.free_gpus(n) >= entry.pod.gpus]
    return schedule(entry.pod, run.state, run.rng, among=among)


def gang_escape(
    run: Run | OracleRun,
    entry: Entry,
    ahead: dict[str, list[float]],
    *,
    predicted: Mapping[str, float],
    acceptable: frozenset[str] | None,
) -> str | None:
    """The kept-off product a narrowed gang that found no acceptable product with room for all its
    Pods escapes to (the rule of ``decisions/escape.py``, the gang's GPUs taken together), its Pod
    widened to it; None: it waits, counted ahead (each of its GPUs) on its best acceptable product.
    KRATOS's policies pass their predictions and the Pod's cut, ``oracle-wait`` the truth and its own."""
    if acceptable is None or not predicted:
        return None
    job, gpus = entry.job, entry.pod.gpus

    def room(product: str) -> bool:
        pod = widened(entry.pod, product)
        fits = sum(
            run.state.free_gpus(n) // gpus
            for n in run.state.nodes
            if n.product == product and feasible(n, pod, run.state)
        )
        return fits >= job.pods

    found = escape_product(
        run.now,
        predicted,
        acceptable,
        room=room,
        finish=lambda p, s: run.eft.finish_on(p, s, run.now, ahead=ahead, gpus=job.total_gpus),
    )
    if found is None:
        target = min((p for p in predicted if p in acceptable), key=predicted.__getitem__, default=None)
        if target is not None:
            ahead.setdefault(target, []).extend([predicted[target]] * job.total_gpus)
        return None
    entry.pod = widened(entry.pod, found[0])
    return found[0]


class FullRun(Run, OracleRun, Protocol):
    """The whole of a policy's replay, as ``escape_gang`` reads it."""


def escape_gang(
    run: FullRun, entry: Entry, ahead: dict[str, list[float]], accepted: frozenset[str]
) -> str | None:
    """Where a gang that found no room escapes to: KRATOS's own policies by their predictions and the
    cut admission wrote into its Pod, ``oracle-wait`` by the truth and the products it ``accepted``;
    None for the others (and for ``oracle-wait`` without a cap: it accepts every product)."""
    if run.policy in ESCAPING:
        predicted = _predicted(run, entry.job)
        return gang_escape(run, entry, ahead, predicted=predicted, acceptable=acceptable_products(entry.pod))
    if accepted == run.products:
        return None
    truth = {p: entry.job.reference_seconds * run._true_time(entry.job, p) for p in run.products}
    return gang_escape(run, entry, ahead, predicted=truth, acceptable=accepted)
