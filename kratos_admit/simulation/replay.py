"""Replay a trace of GPU Jobs on a modelled cluster under five placement policies (DESIGN
"Simulation", docs/placement.md). Pure: the inputs in, the results out; the CLI reads the files.

- ``default``: no KRATOS; kube-scheduler spreads the Jobs (``scheduling.py``).
- ``kratos-static``: every Job through the real admission engine (the one ``review`` uses): the
  first Job of a workload is rewritten into a profiling run, the Jobs that arrive meanwhile are held
  and released with hints by the same code the controller runs, the rest get hints; the ranking
  uses the catalog's figures only.
- ``kratos-no-exploration``: as ``kratos-static``, and it learns as the trace runs: each finished
  run becomes an observation of its workload's profile, and calibration is refitted from them
  (``calibration.py``).
- ``kratos``: as ``kratos-no-exploration``, and ``explorationShare`` of each workload's Jobs are sent
  to a product whose figure for their bound type is not yet calibrated (docs/ranking.md
  "Exploration"); left out when the share is 0 (it would be the same run).
- In all three a narrowed Job that finds no acceptable product with room escapes onto a kept-off
  one where it is predicted to finish sooner, as the controller lets it (``waiting.py``,
  ``decisions/escape.py``); ``kratos-cap`` (asked for by name) is ``kratos`` without the escape.
- ``oracle``: every Job on the free GPU product that truly runs it fastest (greedy: it never waits
  while a GPU is free).
- ``oracle-wait``: the truth with KRATOS's rule of "Wait or run slow": every Job waits for a product
  whose true time is within ``maxSlowdown`` times its truly best (of those with a Node that can hold
  its Pod), and takes the fastest of them that is free, or escapes as kratos does, by the true
  times; the bound of that rule. Run only where
  ``maxSlowdown`` is set.

Telemetry, as the controller counts it from DCGM counters (the simulator models a cluster whose
telemetry is configured): under the KRATOS policies every run is counted once, after
``telemetry.windowSeconds`` of it or at its end if sooner, on the product it ran on. A workload
without an Nsight Compute profile (a gang, docs/distributed-training.md: here a Job on more than one
GPU, which is never profiled) gets its profile from those runs (``source: telemetry``), read as
measured on the catalog's measured ground where a run was counted there, else where it has the
most GPU-seconds (``measuring_product``).

A Job's true runtime on product P is its reference runtime scaled by the ranking's units model
evaluated with the truth figures of P and of the reference product (for a Job with only throughputs,
the roofline the ranking used before the units model), times a factor drawn within ``1 +- noise``
(one draw per Job, the same under every policy).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kratos_admit.admission.engine import AdmissionEngine, build_engine
from kratos_admit.admission.review import review_document
from kratos_admit.decisions.holds import release_hold
from kratos_admit.decisions.stores import StaticNodeStore, most_gpus
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import ProfileStatus, WorkloadProfile, with_runs
from kratos_admit.domain.raw import as_mapping
from kratos_admit.domain.signing import DEVELOPMENT_KEY
from kratos_admit.model.catalog import Catalog
from kratos_admit.model.telemetry import measuring_product
from kratos_admit.simulation.calibration import SimulatedCalibration
from kratos_admit.simulation.knowledge import Learned, SimulatedProfiles
from kratos_admit.simulation.result import SimulationResult, simulation_result
from kratos_admit.simulation.scheduling import ClusterState, PodRequest, SimNode, schedule
from kratos_admit.simulation.trace import (
    LEARNING,
    LOAD_AWARE,
    NAMESPACE,
    ORACLES,
    POLICIES,
    Policy,
    PolicyResult,
    Progress,
    SimulationError,
    Trace,
    TraceJob,
    Truth,
    bound_type,
    job_manifest,
    time_shares_status,
)
from kratos_admit.simulation.waiting import (
    EarliestFinish,
    escape_gang,
    note_started,
    oracle_escape,
    place_load_aware,
)


@dataclass(order=True)
class Pending:
    created: float
    seq: int
    job: TraceJob = field(compare=False)
    pod: PodRequest = field(compare=False)
    profiling: bool = field(compare=False, default=False)
    spec: Mapping[str, Any] | None = field(compare=False, default=None)  # the admitted pod spec, if any


def _pod_spec(job_object: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(as_mapping(as_mapping(job_object.get("spec")).get("template")).get("spec"))


class PolicyRun:
    """One policy over the whole trace: events, the pending queue, the cluster's use."""

    def __init__(
        self,
        policy: Policy,
        trace: Trace,
        nodes: Sequence[SimNode],
        *,
        truth: Truth,
        config: Config,
        catalog: Catalog,
        seed: int,
        noise: float,
    ) -> None:
        self.policy, self.trace, self.truth = policy, trace, truth
        # only kratos explores: without learning, exploring would go on for ever at its cost; the
        # load-aware rule waits by predicted finish time instead of the fixed cap
        self.config = (
            config
            if policy in ("kratos", "kratos-cap")
            else config.model_copy(update={"exploration_share": 0.0})
        )
        if policy == "kratos-eft":
            self.config = config.model_copy(update={"max_slowdown": 0.0})
        self.catalog = catalog
        self.explored: Counter[str] = Counter()  # Jobs sent to explore, by product
        self.state = ClusterState(tuple(nodes))
        gpus: Counter[str] = Counter()
        for node in nodes:
            gpus[node.product] += node.gpus
        self.eft = EarliestFinish(capacity=dict(gpus))
        self.rng = random.Random(seed)
        self.noise = {
            job.name: 1 + random.Random(f"{seed}/{job.name}").uniform(-noise, noise) for job in trace.jobs
        }
        self.products = frozenset(n.product for n in nodes if n.product)
        self.profiles = SimulatedProfiles()
        self.calibration = SimulatedCalibration()
        self.engine: AdmissionEngine = build_engine(
            self.config,
            signing_key=DEVELOPMENT_KEY,
            profiles=self.profiles,
            nodes=StaticNodeStore(
                self.products,
                Counter(n.product for n in nodes if n.product),
                most_gpus((n.product, n.gpus) for n in nodes if n.product),
            ),
            catalog=catalog,
            calibration=self.calibration,
        )
        self.events: list[tuple[float, int, str, Any]] = []
        self.now = 0.0
        self.seq = itertools.count()
        self.pending: list[Pending] = []
        self.held: dict[str, list[tuple[TraceJob, dict[str, Any]]]] = {}
        self.telemetry_seconds: dict[str, dict[str, float]] = {}  # workload -> product -> GPU-seconds
        self.finished: dict[str, float] = {}
        self.gpu_seconds = 0.0
        self.reviews = itertools.count()

    # --- admission -------------------------------------------------------------------------------

    def admit(self, job: TraceJob, now: float, name: str | None = None) -> None:
        if self.policy == "default" or self.policy in ORACLES:
            self._enqueue(job, now, None)
            return
        reviewed = review_document(
            job_manifest(job, name),
            index=next(self.reviews),
            engine=self.engine,
            namespace=NAMESPACE,
            user="kratos-simulate",
        )
        obj = reviewed.object
        if reviewed.explored:
            self.explored[reviewed.explored] += 1
        if reviewed.action == "profiling":
            self.profiles.put(
                job.workload,
                ProfileStatus(phase="Profiling", sourceJob=job.name, message=f"profiling Job {job.name}"),
            )
            self._enqueue(job, now, _pod_spec(obj), profiling=True)
        elif as_mapping(obj.get("spec")).get("suspend") is True:
            self.held.setdefault(job.workload, []).append((job, obj))
        else:
            self.calibration.started(job.name, job.workload, obj)
            self._enqueue(job, now, _pod_spec(obj))

    def _enqueue(
        self, job: TraceJob, now: float, spec: Mapping[str, Any] | None, *, profiling: bool = False
    ) -> None:
        pod = PodRequest.from_pod_spec(spec) if spec is not None else PodRequest(gpus=job.gpus)
        heapq.heappush(self.pending, Pending(now, next(self.seq), job, pod, profiling, spec))

    # --- placement -------------------------------------------------------------------------------

    def _true_time(self, job: TraceJob, product: str) -> float:
        return self.truth.relative_time(
            job.runtime_shares, reference=job.reference_product, product=product, gpus=job.total_gpus
        )

    def acceptable(self, job: TraceJob, gpus_per_pod: int) -> frozenset[str]:
        """The products ``oracle-wait`` lets ``job`` run on: truly within ``maxSlowdown`` of its best
        product that has a Node able to hold one of its Pods (every product for the greedy oracle)."""
        if self.policy != "oracle-wait" or self.config.max_slowdown <= 0:
            return self.products
        times = {
            p: self._true_time(job, p)
            for p in self.products
            if any(n.gpus >= gpus_per_pod for n in self.state.nodes if n.product == p)
        }
        best = min(times.values(), default=0.0)
        return frozenset(p for p, t in times.items() if t <= best * self.config.max_slowdown * (1 + 1e-9))

    def _place(self, entry: Pending, ahead: dict[str, list[float]] | None = None) -> SimNode | None:
        if self.policy in LOAD_AWARE and not entry.profiling and ahead is not None:
            return place_load_aware(self, entry, ahead)
        if self.policy not in ORACLES:
            return schedule(entry.pod, self.state, self.rng)
        accepted = self.acceptable(entry.job, entry.pod.gpus)
        free = [
            n for n in self.state.nodes if self.state.free_gpus(n) >= entry.pod.gpus and n.product in accepted
        ]
        if not free:  # oracle-wait escapes as kratos does, by the truth; the greedy oracle had nothing free
            return (
                None
                if ahead is None or accepted == self.products
                else oracle_escape(self, entry, accepted, ahead)
            )
        times = {n.product: self._true_time(entry.job, n.product) for n in free}
        best = min(times.values())
        return schedule(entry.pod, self.state, self.rng, among=[n for n in free if times[n.product] == best])

    def _place_gang(self, entry: Pending) -> list[SimNode] | None:
        """A gang of Pods placed whole on one product, or None: it waits (as Kueue, KAI and Volcano
        admit a gang, all or nothing). The product is the one the scheduler binds its first Pod to
        (the oracle: the truly fastest) among those with room for every Pod; the others follow it,
        as the gang's inter-Pod affinity on the product asks."""
        products = {n.product for n in self.state.nodes if n.product} & self.acceptable(
            entry.job, entry.pod.gpus
        )
        while products:
            among = [n for n in self.state.nodes if n.product in products]
            if self.policy in ORACLES:  # the truly fastest product with room for the whole gang
                best = min(products, key=lambda p: (self._true_time(entry.job, p), p))
                among = [n for n in among if n.product == best]
            first = schedule(entry.pod, self.state, self.rng, among=among)
            if first is None and self.policy in ORACLES:
                products.discard(best)
                continue
            if first is None:
                return None
            placed = self._fill(entry, first)
            if placed is not None:
                return placed
            products.discard(first.product)
        return None

    def _fill(self, entry: Pending, first: SimNode) -> list[SimNode] | None:
        """Nodes of ``first``'s product for each of the gang's Pods, ``first`` first, then the nodes
        with the most free GPUs (packed, as its Pods prefer each other); None when they do not fit."""
        free = {n.name: self.state.free_gpus(n) for n in self.state.nodes if n.product == first.product}
        others = (n for n in self.state.nodes if n.product == first.product and n is not first)
        order = [first, *sorted(others, key=lambda n: (-free[n.name], n.name))]
        placed: list[SimNode] = []
        for node in order:
            while len(placed) < entry.job.pods and free[node.name] >= entry.pod.gpus:
                free[node.name] -= entry.pod.gpus
                placed.append(node)
        return placed if len(placed) == entry.job.pods else None

    def _schedule_pending(self, now: float) -> None:
        waiting: list[Pending] = []
        self.now = now
        ahead: dict[str, list[float]] = {}  # LOAD_AWARE: the Jobs before this one that wait for each product
        while self.pending:
            entry = heapq.heappop(self.pending)
            if entry.job.pods > 1 and not entry.profiling:
                nodes = self._place_gang(entry)
                accepted = self.acceptable(entry.job, entry.pod.gpus)
                if nodes is None and (escape := escape_gang(self, entry, ahead, accepted)):
                    among = [n for n in self.state.nodes if n.product == escape]
                    first = schedule(entry.pod, self.state, self.rng, among=among)
                    nodes = self._fill(entry, first) if first is not None else None
            else:
                node = self._place(entry, ahead)
                nodes = [node] if node is not None else None
            if nodes is None:
                waiting.append(entry)
                continue
            for node in nodes:
                self.state.bind(node, entry.pod)
            node = nodes[0]
            seconds = self.started(entry, node.product, pods=len(nodes))
            if self.policy != "default" and self.policy not in ORACLES and not entry.profiling:
                # counted before its end at a tie: the run that ends is counted in the profile
                window = min(seconds, self.config.telemetry.window_seconds)
                self._event(
                    now + window, "telemetry", (entry.job, node, window * entry.pod.gpus * len(nodes))
                )
            self._event(now + seconds, "done", (entry, nodes, seconds))
        for entry in waiting:
            heapq.heappush(self.pending, entry)

    def started(self, entry: Pending, product: str, *, pods: int = 1) -> float:
        """How long ``entry`` runs on ``product`` (a profiling run: the trace's profiling time); the
        GPU time of its ``pods`` is counted."""
        if entry.profiling:
            seconds = self.trace.profiling_seconds
        else:
            seconds = (
                entry.job.reference_seconds * self._true_time(entry.job, product) * self.noise[entry.job.name]
            )
            if self.policy in LOAD_AWARE:
                note_started(self, entry, product, entry.pod.gpus * pods)
            elif self.policy == "oracle-wait":
                self.eft.started(entry.job.name, product, self.now + seconds, entry.pod.gpus * pods)
        self.gpu_seconds += seconds * entry.pod.gpus * pods
        return seconds

    def true_weights(self, job: TraceJob) -> dict[str, int]:
        """The oracle's preference as node-affinity weights: 100 for the truly fastest product,
        the others in proportion to their speed."""
        times = {p: self._true_time(job, p) for p in self.products}
        best = min(times.values())
        return {p: max(1, round(100 * best / t)) for p, t in times.items()}

    def _event(self, when: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, payload))

    # --- completions -----------------------------------------------------------------------------

    def done(self, entry: Pending, nodes: Sequence[SimNode], seconds: float, now: float) -> None:
        for node in nodes:
            self.state.release(node, entry.pod)
        self.eft.finished(entry.job.name)
        node = nodes[0]
        job = entry.job
        if entry.profiling:
            self._profiled(job, node, now)
            return
        self.finished[job.name] = now
        self.calibration.ended(job.name)
        if self.policy in LEARNING:
            self._observe(job, node, seconds)

    def _measured(self, job: TraceJob, node: SimNode, source: str) -> ProfileStatus:
        """The Ready profile a run of ``job`` on ``node`` makes: what Nsight Compute (a profiling run)
        or DCGM telemetry (a gang's own run) measures there."""
        metrics = self.truth.measured_on(job, node.product)
        shares = self.truth.time_shares_on(job, node.product)
        return ProfileStatus.model_validate(
            {
                "phase": "Ready",
                "boundType": bound_type(float(metrics["smThroughput"]), float(metrics["memoryThroughput"])),
                "metrics": metrics,
                "gpu": {"product": node.product}
                | ({"gangGPUs": job.total_gpus} if job.total_gpus > 1 else {}),
                "sourceJob": job.name,
                "source": source,
            }
            | ({"timeShares": time_shares_status(shares)} if shares is not None else {})
        )

    def _telemetry(self, job: TraceJob, node: SimNode, gpu_seconds: float, now: float) -> None:
        """A run counted by telemetry: the workload's profile is made (or moved to the product it is
        now read as measured on) unless Nsight Compute's figures are there, which keep precedence."""
        seconds = self.telemetry_seconds.setdefault(job.workload, {})
        seconds[node.product] = seconds.get(node.product, 0.0) + gpu_seconds
        found = self.profiles.get(NAMESPACE, job.workload)
        status = found.status if found is not None else None
        if status is not None and status.phase == "Ready" and status.source != "telemetry":
            return
        product = measuring_product(seconds, self.catalog.measured_ground)
        if status is not None and status.phase == "Ready" and status.gpu.product == product:
            return
        measured = self._measured(job, next(n for n in self.state.nodes if n.product == product), "telemetry")
        observations = status.observations if status is not None else []
        profile = self.profiles.put(job.workload, measured.model_copy(update={"observations": observations}))
        self._release(job.workload, profile, now)

    def _profiled(self, job: TraceJob, node: SimNode, now: float) -> None:
        """What the controller does when a profiling run ends: publish the profile, create the
        execution Job (admitted again, now with hints), release the Jobs held meanwhile."""
        profile = self.profiles.put(job.workload, self._measured(job, node, "nsight-compute"))
        self.admit(job, now, name=f"{job.name}-execution"[: v.DNS1123_LABEL_MAX])
        self._release(job.workload, profile, now)

    def _release(self, workload: str, profile: WorkloadProfile, now: float) -> None:
        """The followers held while the workload profiled, let go with the hints they now get."""
        for follower, held in self.held.pop(workload, []):
            released = release_hold(
                held,
                "Job",
                profile=profile,
                node_products=self.products,
                namespace=NAMESPACE,
                config=self.config,
                catalog=self.catalog,
                signing_key=DEVELOPMENT_KEY,
                calibration=self.calibration.current(),
                product_gpus=self.engine.nodes.product_gpus(),
            )
            self.calibration.started(follower.name, follower.workload, released)
            self._enqueue(follower, now, _pod_spec(released))

    def _observe(self, job: TraceJob, node: SimNode, seconds: float) -> None:
        profile = self.profiles.get(NAMESPACE, job.workload)
        if profile is None or profile.status is None:
            return
        gang = job.total_gpus if job.total_gpus > 1 else None  # as the hints record's gangGPUs
        updated = with_runs(profile.status, [(job.name, node.product, seconds)], gang_gpus=gang)
        if updated is None:
            return
        self.profiles.put(job.workload, updated)
        self.calibration.refit(self.profiles.index.profiles(), self.catalog, self.config.reference_product)

    # --- the loop --------------------------------------------------------------------------------

    def run(self, progress: Progress | None = None) -> PolicyResult:
        for job in self.trace.jobs:
            self._event(job.arrival, "arrive", job)
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, _, kind, payload = heapq.heappop(self.events)
                if kind == "arrive":
                    self.admit(payload, now)
                elif kind == "telemetry":
                    job, node, gpu_seconds = payload
                    self._telemetry(job, node, gpu_seconds, now)
                else:
                    entry, nodes, seconds = payload
                    self.done(entry, nodes, seconds, now)
            self._schedule_pending(now)
            if progress is not None:
                progress(self.policy, len(self.finished), len(self.trace.jobs))
        return self.result()

    def result(self) -> PolicyResult:
        unfinished = [j.name for j in self.trace.jobs if j.name not in self.finished]
        if unfinished:
            raise SimulationError(
                f"policy {self.policy}: Job {unfinished[0]} never fits a Node of the cluster "
                f"({len(unfinished)} Job(s) left waiting)"
            )
        first = min(j.arrival for j in self.trace.jobs)
        return PolicyResult(
            policy=self.policy,
            jct=tuple(self.finished[j.name] - j.arrival for j in self.trace.jobs),
            makespan=max(self.finished.values()) - first,
            gpu_seconds=self.gpu_seconds,
            gangs=tuple(j.gang for j in self.trace.jobs) if any(j.gang for j in self.trace.jobs) else (),
        )


def simulate(
    trace: Trace,
    nodes: Sequence[SimNode],
    *,
    truth: Truth,
    config: Config,
    catalog: Catalog,
    seed: int = 1,
    noise: float = 0.05,
    policies: Sequence[Policy] = POLICIES,
    progress: Progress | None = None,
) -> SimulationResult:
    results: dict[Policy, PolicyResult] = {}
    learned: dict[Policy, Learned] = {}
    for policy in run_policies(policies, config):
        run = PolicyRun(
            policy, trace, nodes, truth=truth, config=config, catalog=catalog, seed=seed, noise=noise
        )
        results[policy] = run.run(progress)
        if policy in LEARNING:
            learned[policy] = Learned(run.profiles, run.calibration, run.explored)
    return simulation_result(results, learned, trace, nodes, truth=truth, config=config, catalog=catalog)


def run_policies(policies: Sequence[Policy], config: Config) -> list[Policy]:
    """The policies to run: kratos-no-exploration only where kratos explores (else it is kratos), and
    oracle-wait only where ``maxSlowdown`` is set (else it is the oracle)."""
    return [
        p
        for p in policies
        if (p != "kratos-no-exploration" or config.exploration_share > 0)
        and (p != "oracle-wait" or config.max_slowdown > 0)
    ]
