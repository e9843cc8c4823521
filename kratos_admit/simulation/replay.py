"""Replay a trace of GPU Jobs on a modelled cluster under four placement policies (DESIGN
"Simulation", docs/placement.md). Pure: the inputs in, the results out; the CLI reads the files.

- ``default``: no KRATOS; kube-scheduler spreads the Jobs (``scheduling.py``).
- ``kratos-static``: every Job through the real admission engine (the one ``review`` uses): the
  first Job of a workload is rewritten into a profiling run, the Jobs that arrive meanwhile are held
  and released with hints by the same code the controller runs, the rest get hints; the ranking
  uses the catalog's figures only.
- ``kratos``: as ``kratos-static``, and it learns as the trace runs: each finished run becomes an
  observation of its workload's profile, and calibration is refitted from them (``calibration.py``).
- ``oracle``: every Job on the free GPU product that truly runs it fastest.

A Job's true runtime on product P is its reference runtime scaled by the ranking's roofline model
evaluated with the truth figures of P and of the reference product, times a factor drawn within
``1 +- noise`` (one draw per Job, the same under every policy).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kratos_admit.admission.engine import AdmissionEngine, build_engine
from kratos_admit.admission.review import review_document
from kratos_admit.decisions.calibration import Calibration, samples_of
from kratos_admit.decisions.calibration_fit import fit_calibration
from kratos_admit.decisions.hints import ranking_of
from kratos_admit.decisions.holds import release_hold
from kratos_admit.decisions.stores import ProfileIndex, StaticCalibrationStore, StaticNodeStore
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.catalog import Catalog
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import ObjectMeta, ProfileSpec, ProfileStatus, WorkloadProfile, with_runs
from kratos_admit.domain.raw import as_mapping
from kratos_admit.domain.signing import DEVELOPMENT_KEY
from kratos_admit.simulation.scheduling import ClusterState, PodRequest, SimNode, schedule
from kratos_admit.simulation.trace import (
    NAMESPACE,
    POLICIES,
    Policy,
    PolicyResult,
    ProductKnowledge,
    SimulationError,
    Trace,
    TraceJob,
    Truth,
    bound_type,
    job_manifest,
)


@dataclass(frozen=True)
class SimulationResult:
    policies: dict[Policy, PolicyResult]
    prediction_error: dict[str, float]  # product -> worst |predicted/true - 1| after the trace
    learned: Learned  # what ``kratos`` knew at the end: its profiles
    products: dict[str, ProductKnowledge] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "policies": {name: r.as_dict() for name, r in self.policies.items()},
            "predictionError": {p: round(e, 4) for p, e in sorted(self.prediction_error.items())},
            "products": {p: k.as_dict() for p, k in sorted(self.products.items())},
        }


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

    def current(self) -> Calibration:
        return self.calibration.current()


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
        self.config, self.catalog = config, catalog
        self.state = ClusterState(tuple(nodes))
        self.rng = random.Random(seed)
        self.noise = {
            job.name: 1 + random.Random(f"{seed}/{job.name}").uniform(-noise, noise) for job in trace.jobs
        }
        self.products = frozenset(n.product for n in nodes if n.product)
        self.profiles = SimulatedProfiles()
        self.calibration = StaticCalibrationStore()
        self.engine: AdmissionEngine = build_engine(
            config,
            signing_key=DEVELOPMENT_KEY,
            profiles=self.profiles,
            nodes=StaticNodeStore(self.products, Counter(n.product for n in nodes if n.product)),
            catalog=catalog,
            calibration=self.calibration,
        )
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.pending: list[Pending] = []
        self.held: dict[str, list[tuple[TraceJob, dict[str, Any]]]] = {}
        self.finished: dict[str, float] = {}
        self.gpu_seconds = 0.0
        self.reviews = itertools.count()

    # --- admission -------------------------------------------------------------------------------

    def admit(self, job: TraceJob, now: float, name: str | None = None) -> None:
        if self.policy in ("default", "oracle"):
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
        if reviewed.action == "profiling":
            self.profiles.put(
                job.workload,
                ProfileStatus(phase="Profiling", sourceJob=job.name, message=f"profiling Job {job.name}"),
            )
            self._enqueue(job, now, _pod_spec(obj), profiling=True)
        elif as_mapping(obj.get("spec")).get("suspend") is True:
            self.held.setdefault(job.workload, []).append((job, obj))
        else:
            self._enqueue(job, now, _pod_spec(obj))

    def _enqueue(
        self, job: TraceJob, now: float, spec: Mapping[str, Any] | None, *, profiling: bool = False
    ) -> None:
        pod = PodRequest.from_pod_spec(spec) if spec is not None else PodRequest(gpus=job.gpus)
        heapq.heappush(self.pending, Pending(now, next(self.seq), job, pod, profiling, spec))

    # --- placement -------------------------------------------------------------------------------

    def _place(self, entry: Pending) -> SimNode | None:
        if self.policy != "oracle":
            return schedule(entry.pod, self.state, self.rng)
        free = [n for n in self.state.nodes if self.state.free_gpus(n) >= entry.pod.gpus]
        if not free:
            return None
        times = {
            n.product: self.truth.relative_time(
                entry.job.shares, reference=entry.job.reference_product, product=n.product
            )
            for n in free
        }
        best = min(times.values())
        return schedule(entry.pod, self.state, self.rng, among=[n for n in free if times[n.product] == best])

    def _schedule_pending(self, now: float) -> None:
        waiting: list[Pending] = []
        while self.pending:
            entry = heapq.heappop(self.pending)
            node = self._place(entry)
            if node is None:
                waiting.append(entry)
                continue
            self.state.bind(node, entry.pod)
            seconds = self.started(entry, node.product)
            self._event(now + seconds, "done", (entry, node, seconds))
        for entry in waiting:
            heapq.heappush(self.pending, entry)

    def started(self, entry: Pending, product: str) -> float:
        """How long ``entry`` runs on ``product`` (a profiling run: the trace's profiling time); its
        GPU time is counted."""
        if entry.profiling:
            seconds = self.trace.profiling_seconds
        else:
            seconds = (
                entry.job.reference_seconds
                * self.truth.relative_time(
                    entry.job.shares, reference=entry.job.reference_product, product=product
                )
                * self.noise[entry.job.name]
            )
        self.gpu_seconds += seconds * entry.pod.gpus
        return seconds

    def true_weights(self, job: TraceJob) -> dict[str, int]:
        """The oracle's preference as node-affinity weights: 100 for the truly fastest product,
        the others in proportion to their speed."""
        times = {
            p: self.truth.relative_time(job.shares, reference=job.reference_product, product=p)
            for p in self.products
        }
        best = min(times.values())
        return {p: max(1, round(100 * best / t)) for p, t in times.items()}

    def _event(self, when: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, payload))

    # --- completions -----------------------------------------------------------------------------

    def done(self, entry: Pending, node: SimNode, seconds: float, now: float) -> None:
        self.state.release(node, entry.pod)
        job = entry.job
        if entry.profiling:
            self._profiled(job, node, now)
            return
        self.finished[job.name] = now
        if self.policy == "kratos":
            self._observe(job, node, seconds)

    def _profiled(self, job: TraceJob, node: SimNode, now: float) -> None:
        """What the controller does when a profiling run ends: publish the profile, create the
        execution Job (admitted again, now with hints), release the Jobs held meanwhile."""
        metrics = self.truth.measured_on(job, node.product)
        status = ProfileStatus.model_validate(
            {
                "phase": "Ready",
                "boundType": bound_type(float(metrics["smThroughput"]), float(metrics["memoryThroughput"])),
                "metrics": metrics,
                "gpu": {"product": node.product},
                "sourceJob": job.name,
            }
        )
        profile = self.profiles.put(job.workload, status)
        self.admit(job, now, name=f"{job.name}-execution"[: v.DNS1123_LABEL_MAX])
        for follower, held in self.held.pop(job.workload, []):
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
            )
            self._enqueue(follower, now, _pod_spec(released))

    def _observe(self, job: TraceJob, node: SimNode, seconds: float) -> None:
        profile = self.profiles.get(NAMESPACE, job.workload)
        if profile is None or profile.status is None:
            return
        updated = with_runs(profile.status, [(job.name, node.product, seconds)])
        if updated is None:
            return
        self.profiles.put(job.workload, updated)
        samples = samples_of(
            self.profiles.index.profiles(), self.catalog, reference_product=self.config.reference_product
        )
        self.calibration.calibration = fit_calibration(samples, self.catalog)

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> PolicyResult:
        for job in self.trace.jobs:
            self._event(job.arrival, "arrive", job)
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, _, kind, payload = heapq.heappop(self.events)
                if kind == "arrive":
                    self.admit(payload, now)
                else:
                    entry, node, seconds = payload
                    self.done(entry, node, seconds, now)
            self._schedule_pending(now)
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
        )


def prediction_errors(
    learned: Learned,
    jobs: Sequence[TraceJob],
    *,
    truth: Truth,
    node_products: frozenset[str],
    config: Config,
    catalog: Catalog,
) -> dict[str, float]:
    """Per product, the worst |predicted/true - 1| of the runtime over ``jobs``' workloads, as
    ``kratos`` would rank them now. Predicted seconds are the ranking's relative times in the unit
    the workload's own observations give them (the mean of observed/relative over its observed
    products); a workload without observations (never seen) is profiled on its reference product,
    and its true runtime there is the unit. True seconds: the workload's mean reference runtime
    scaled by the truth."""
    worst: dict[str, float] = {}
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
            )
            profile = WorkloadProfile(
                metadata=ObjectMeta(name=v.profile_name(workload), namespace=NAMESPACE),
                spec=ProfileSpec(workload=workload),
                status=status,
            )
        assert profile.status is not None
        ranked_now = ranking_of(
            profile, node_products, config=config, catalog=catalog, calibration=learned.current()
        )

        def true_seconds(label: str, job: TraceJob = job, seconds: float = seconds) -> float:
            return seconds * truth.relative_time(job.shares, reference=job.reference_product, product=label)

        observed: dict[str, float] = {}
        for o in profile.status.observations:
            entry = catalog.placement(o.product)
            if entry is not None and o.runs:
                observed[entry.product] = float(o.mean_seconds)
        units = [
            math.log(observed[r.product.product] / r.relative_time)
            for r in ranked_now
            if r.product.product in observed
        ]
        if units:
            unit = math.exp(sum(units) / len(units))
        else:
            unit = true_seconds(profile.status.gpu.product or job.reference_product)
        for ranked in ranked_now:
            error = abs(ranked.relative_time * unit / true_seconds(ranked.labels[0]) - 1)
            worst[ranked.product.product] = max(worst.get(ranked.product.product, 0.0), error)
    return worst


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
) -> SimulationResult:
    results: dict[Policy, PolicyResult] = {}
    learned = Learned(SimulatedProfiles())
    for policy in policies:
        run = PolicyRun(
            policy, trace, nodes, truth=truth, config=config, catalog=catalog, seed=seed, noise=noise
        )
        results[policy] = run.run()
        if policy == "kratos":
            learned = Learned(run.profiles, run.calibration)
    return simulation_result(results, learned, trace, nodes, truth=truth, config=config, catalog=catalog)


def simulation_result(
    results: dict[Policy, PolicyResult],
    learned: Learned,
    trace: Trace,
    nodes: Sequence[SimNode],
    *,
    truth: Truth,
    config: Config,
    catalog: Catalog,
) -> SimulationResult:
    """The policies' results with the prediction error of what ``kratos`` learned (none without it),
    for a modelled run and for one on a real cluster alike."""
    products = frozenset(n.product for n in nodes if n.product)
    if "kratos" not in results:
        return SimulationResult(results, {}, learned)
    errors = prediction_errors(
        learned, trace.jobs, truth=truth, node_products=products, config=config, catalog=catalog
    )
    return SimulationResult(
        results, errors, learned, product_knowledge(learned, products, errors, config, catalog)
    )


def product_knowledge(
    learned: Learned,
    node_products: frozenset[str],
    errors: Mapping[str, float],
    config: Config,
    catalog: Catalog,
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
            runs.get(entry.product, 0), calibrated, errors.get(entry.product)
        )
    return found
