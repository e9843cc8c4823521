"""The controller loop: watch KRATOS's Jobs and Pods, reconcile, apply the actions.

Observe -> pure ``reconcile`` -> apply, per key, from a de-duplicating work queue; failures are
retried with backoff, and a periodic resync re-checks everything so nothing is missed. Four kinds
of work share the queue (``reconcile``'s module docstring): a profiling run, the release of the
followers of a workload, the observation of a finished hinted Job, and the calibration. Telemetry
(a Pod's DCGM counters from Prometheus) has a queue and worker of its own, so a slow or absent
Prometheus never delays a release.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Iterable
from typing import Any, Literal

from kubernetes_asyncio import client

from kratos_admit.decisions.calibration import CONFIGMAP_NAME, NO_CALIBRATION, Calibration
from kratos_admit.decisions.hints import recorded_ranking_source
from kratos_admit.decisions.telemetry import pod_samples, pod_telemetry, product_of
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.catalog import Catalog, load_catalog
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile, condition_reason
from kratos_admit.domain.raw import as_list, as_mapping, clone, string_map
from kratos_admit.domain.workload import Kind, kueue_queue
from kratos_admit.edge.kube import Backoff, Informer, one_line
from kratos_admit.edge.kueue import KueueApi
from kratos_admit.edge.prometheus import Prometheus, PrometheusError
from kratos_controller.actions import CreateExecutionJob, PublishProfile, ReleaseFollower, StopJob
from kratos_controller.admission_check import AdmissionCheckController
from kratos_controller.events import Reason, Regarding, event_body
from kratos_controller.faults import image_pull_wait
from kratos_controller.kube_io import KubeIO
from kratos_controller.leader import LeaderElector
from kratos_controller.learning import (
    TelemetryDue,
    calibrate,
    calibration_write_wait,
    counted_telemetry,
    current_calibration,
    missing_counters_note,
    observed_job,
    record_runs,
    record_telemetry,
    runs_of,
    telemetry_due,
    telemetry_run,
)
from kratos_controller.metrics import ControllerMetrics
from kratos_controller.reconcile import orphan_profile, orphaned, reconcile, release_followers
from kratos_controller.renewal import CertificateRenewal

log = logging.getLogger("kratos.controller")
Work = Literal["run", "release", "observe", "calibrate"]
Key = tuple[Work, str, str]  # (work, namespace, Job name or workload)
TELEMETRY_DONE_LIMIT = 10_000  # Pod uids remembered as asked; past that the memory starts again


def _meta(obj: dict[str, Any]) -> tuple[str, str, dict[str, str], dict[str, str]]:
    meta = as_mapping(obj.get("metadata"))
    return (
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        string_map(meta.get("labels")),
        string_map(meta.get("annotations")),
    )


class ProfilerController:
    def __init__(
        self,
        api: client.ApiClient,
        *,
        signing_key: bytes,
        metrics: ControllerMetrics,
        resync_seconds: float = 300.0,
        watch_timeout: int = 300,
        config: Config | None = None,
        catalog: Catalog | None = None,
        identity: str = "kratos-controller",
        prometheus: Prometheus | None = None,
    ) -> None:
        self.io = KubeIO(api)
        self.identity = identity  # reportingInstance of its Events
        self.signing_key = signing_key
        self.metrics = metrics
        self.resync_seconds = resync_seconds
        self.config = config or Config()
        self.catalog = catalog or load_catalog(self.config.catalog_file)
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.queue: asyncio.Queue[Key] = asyncio.Queue()
        self.queued: set[Key] = set()
        self.processing: set[Key] = set()
        self.dirty: set[Key] = set()
        self.attempts: dict[Key, Backoff] = {}
        self.calibration: Calibration = NO_CALIBRATION  # the last fit, for releasing followers
        self.calibration_written_at: float | None = None  # loop time of this controller's last write
        self.calibration_due: asyncio.TimerHandle | None = None  # a write put off (calibrationWriteSeconds)
        self.calibrate_key: Key = ("calibrate", self.config.lease_namespace, CONFIGMAP_NAME)
        telemetry = self.config.telemetry
        self.prometheus = prometheus or (Prometheus(telemetry) if telemetry.prometheus_url else None)
        self.telemetry_queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.telemetry_queued: set[tuple[str, str]] = set()  # (namespace, Pod) waiting in the queue
        self.telemetry_timers: set[tuple[str, str]] = set()  # running Pods waiting for their window
        self.telemetry_retries: dict[tuple[str, str], Backoff] = {}
        self.telemetry_retry_base = 5.0  # seconds, doubling per failure up to 5 min (jittered)
        self.telemetry_failing: dict[str, str] = {}  # workload -> the error already logged for it
        self.telemetry_done: set[str] = set()  # Pod uids asked, whatever the answer: never asked again
        # Pods of a completed Job labelled only on its own metadata (the Pod informer never sees
        # them), held with their workload's label until their telemetry is asked
        self.job_pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.informer = self._informer(
            client.BatchV1Api(api).list_job_for_all_namespaces, self.jobs, "Job", watch_timeout
        )
        self.pod_informer = self._informer(
            client.CoreV1Api(api).list_pod_for_all_namespaces, self.pods, "Pod", watch_timeout
        )
        self.admission_checks = (
            AdmissionCheckController(
                KueueApi(api),
                read_job=self.io.read_job,
                signing_key=signing_key,
                resync_seconds=resync_seconds,
                watch_timeout=watch_timeout,
                on_state=lambda state: metrics.admission_checks.labels(state).inc(),
            )
            if self.config.kueue_admission_check
            else None
        )
        self.renewal = CertificateRenewal(
            api,
            namespace=self.config.lease_namespace,
            renew_before=self.config.certificate_renew_before,
            resync_seconds=resync_seconds,
            on_outcome=lambda outcome: metrics.certificate_renewals.labels(outcome).inc(),
            on_expiry=lambda which, at: metrics.certificate_expiry.labels(which).set(at),
            report=lambda secret, reason, note, detail: self.report(secret, "Secret", reason, note, detail),
        )
        metrics.profiling_deadline.set(self.config.profiling_deadline_seconds)
        metrics.watch_held(lambda: [*self.jobs.values(), *self.pods.values()])

    def _informer(
        self, list_all: Any, cache: dict[tuple[str, str], dict[str, Any]], kind: Kind, watch_timeout: int
    ) -> Informer:
        """List+watch of every opted-in object of ``kind`` (profiling runs, followers, hinted runs)."""
        return Informer(
            list_all,
            name=f"kratos-{kind.lower()}s",
            label_selector=v.WORKLOAD_LABEL,
            on_replace=lambda items: self._replace(cache, items, kind),
            on_event=lambda event, obj: self._event(cache, event, obj, kind),
            watch_timeout=watch_timeout,
        )

    def enqueue(self, key: Key) -> None:
        """client-go's work queue: a key is queued once, and never handled by two workers at once; one
        enqueued while it is being handled is handled again afterwards."""
        if key in self.processing:
            self.dirty.add(key)
        elif key not in self.queued:
            self.queued.add(key)
            self.queue.put_nowait(key)

    def _work_for(self, obj: dict[str, Any], kind: Kind) -> None:
        namespace, name, labels, annotations = _meta(obj)
        if kind == "Job" and labels.get(v.ROLE_LABEL) == "profiling":
            self.enqueue(("run", namespace, name))
        if kind == "Pod" and labels.get(v.ROLE_LABEL) == "profiling" and labels.get("job-name"):
            self.enqueue(("run", namespace, labels["job-name"]))  # the kubelet's word on its run
        if v.AWAITING_PROFILE_ANNOTATION in annotations and v.WORKLOAD_LABEL in labels:
            self.enqueue(("release", namespace, labels[v.WORKLOAD_LABEL]))
        if kind == "Job" and observed_job(obj, signing_key=self.signing_key):
            self.enqueue(("observe", namespace, name))
        if kind == "Pod" and self.prometheus is not None:
            self._telemetry_for(obj)

    def _telemetry_for(self, pod: dict[str, Any]) -> None:
        """Queue the Pod's telemetry when due, or look again when its window will have passed."""
        key = (_meta(pod)[0], _meta(pod)[1])
        window = self.config.telemetry.window_seconds
        due = telemetry_due(pod, now=dt.datetime.now(dt.UTC), window_seconds=window)
        if isinstance(due, TelemetryDue):
            if due.uid not in self.telemetry_done:
                self.enqueue_telemetry(key)
        elif isinstance(due, float) and key not in self.telemetry_timers:
            self.telemetry_timers.add(key)
            asyncio.get_running_loop().call_later(due + 1.0, self._window_passed, key)

    def _window_passed(self, key: tuple[str, str]) -> None:
        self.telemetry_timers.discard(key)
        pod = self.pods.get(key)
        if pod is not None:
            self._telemetry_for(pod)

    def enqueue_telemetry(self, key: tuple[str, str]) -> None:
        if key not in self.telemetry_queued:
            self.telemetry_queued.add(key)
            self.telemetry_queue.put_nowait(key)

    def _replace(
        self, cache: dict[tuple[str, str], dict[str, Any]], items: list[dict[str, Any]], kind: Kind
    ) -> None:
        cache.clear()
        for obj in items:
            namespace, name, _, _ = _meta(obj)
            cache[(namespace, name)] = obj
            self._work_for(obj, kind)

    def _event(
        self, cache: dict[tuple[str, str], dict[str, Any]], event: str, obj: dict[str, Any], kind: Kind
    ) -> None:
        namespace, name, _, _ = _meta(obj)
        if event == "DELETED":
            cache.pop((namespace, name), None)
            return
        cache[(namespace, name)] = obj
        self._work_for(obj, kind)

    async def report(
        self,
        obj: dict[str, Any],
        kind: Kind | Literal["WorkloadProfile", "Secret"],
        reason: Reason,
        note: str,
        detail: str = "",
    ) -> None:
        """An Event about ``obj`` (best effort: see ``KubeIO.record``)."""
        api_version = {"Job": "batch/v1", "Pod": "v1", "Secret": "v1"}.get(kind, v.API_VERSION)
        regarding = Regarding.of(obj, api_version=api_version, kind=kind)
        now = dt.datetime.now(dt.UTC)
        await self.io.record(
            event_body(regarding, reason, note, instance=self.identity, now=now, detail=detail)
        )

    async def reconcile_key(self, key: Key) -> None:
        work, namespace, name = key
        if work == "run":
            await self._run(namespace, name)
        elif work == "release":
            await self._release(namespace, name)
        elif work == "calibrate":
            await self._calibrate(namespace)
        else:
            await self._observe(namespace, name)

    async def _run(self, namespace: str, name: str) -> None:
        job = self.jobs.get((namespace, name))
        if job is None:
            return
        observed = await self.io.observe(job)
        grace = self.config.image_pull_grace_seconds
        actions = reconcile(observed, signing_key=self.signing_key, image_pull_grace=grace)
        if actions:  # look again once these are applied: the finalizer comes off in a later pass
            self.enqueue(("run", namespace, name))
        wait = image_pull_wait(observed, grace=grace)
        if (
            wait
        ):  # an image failing to pull: look again when its grace is up (the kubelet may say nothing new)
            asyncio.get_running_loop().call_later(wait + 1.0, self.enqueue, ("run", namespace, name))
        for action in actions:
            outcome = await self.io.apply(action)
            if isinstance(action, PublishProfile):
                await self._report_published(job, action)
                self.metrics.profiles_published.labels(action.status.phase.lower()).inc()
                if action.status.phase == "Failed":
                    product = await self.io.product_of(observed.node) if observed.node else ""
                    self.metrics.profiling_failures.labels(
                        action.status.failure or "unknown", observed.node or "unknown", product or "unknown"
                    ).inc()
                log.info(
                    "profile published",
                    extra={
                        "namespace": namespace,
                        "job": name,
                        "profile": action.name,
                        "phase": action.status.phase,
                    },
                )
                if action.status.phase in ("Ready", "Failed"):
                    workload = str(action.spec.get("workload", ""))
                    self.enqueue(("release", namespace, workload))
            elif isinstance(action, StopJob):
                log.info(
                    "profiling Job stopped",
                    extra={
                        "namespace": namespace,
                        "job": name,
                        "activeDeadlineSeconds": action.active_deadline_seconds,
                    },
                )
            elif isinstance(action, CreateExecutionJob) and outcome == "created":
                execution = action.manifest["metadata"]["name"]
                await self.report(job, "Job", "ExecutionJobCreated", f"created execution Job {execution}")
                self.metrics.execution_jobs_created.inc()
                log.info(
                    "execution Job created",
                    extra={
                        "namespace": namespace,
                        "job": name,
                        "executionJob": action.manifest["metadata"]["name"],
                    },
                )

    async def _report_published(self, job: dict[str, Any], action: PublishProfile) -> None:
        status = action.status
        workload = str(action.spec.get("workload", ""))
        if status.phase == "Profiling":
            await self.report(
                job, "Job", "ProfilingStarted",
                f"profiling workload {workload} under Nsight Compute; Jobs of {workload} created meanwhile wait for WorkloadProfile {action.name}",
            )  # fmt: skip
            return
        profile = {"metadata": {"namespace": action.namespace, "name": action.name}}
        if status.phase == "Ready":
            note = f"WorkloadProfile {action.name} is Ready: {status.bound_type}-bound"
            for obj, kind in ((job, "Job"), (profile, "WorkloadProfile")):
                await self.report(obj, kind, "ProfileReady", note)  # type: ignore[arg-type]
        elif status.phase == "Failed":
            note = f"WorkloadProfile {action.name} is Failed ({condition_reason(status.failure)}): {status.message}"
            for obj, kind in ((job, "Job"), (profile, "WorkloadProfile")):
                await self.report(obj, kind, "ProfileFailed", note)  # type: ignore[arg-type]

    def _followers(self, namespace: str, workload: str) -> list[tuple[Kind, dict[str, Any]]]:
        found: list[tuple[Kind, dict[str, Any]]] = []
        for kind, cache in (("Job", self.jobs), ("Pod", self.pods)):
            for (ns, _), obj in cache.items():
                _, _, labels, annotations = _meta(obj)
                if (
                    ns == namespace
                    and labels.get(v.WORKLOAD_LABEL) == workload
                    and v.AWAITING_PROFILE_ANNOTATION in annotations
                ):
                    found.append((kind, obj))  # type: ignore[arg-type]
        return found

    async def _release(self, namespace: str, workload: str) -> None:
        followers = self._followers(namespace, workload)
        if not followers:
            return
        for kind, obj in followers:
            how = (
                "suspended"
                if kind == "Job" and not kueue_queue(obj)
                else f"scheduling gate {v.PROFILE_SCHEDULING_GATE}"
                + (" in its pod template: Kueue owns its spec.suspend" if kind == "Job" else "")
            )
            await self.report(
                obj,
                kind,
                "AwaitingProfile",
                f"held ({how}) until the profiling run of workload {workload} ends",
            )
        raw = await self.io.get_profile(namespace, v.profile_name(workload))
        if raw is None:
            running = any(
                _meta(job)[2].get(v.ROLE_LABEL) == "profiling"
                and _meta(job)[2].get(v.WORKLOAD_LABEL) == workload
                for (ns, _), job in self.jobs.items()
                if ns == namespace
            )
            now = dt.datetime.now(dt.UTC)
            grace = self.config.follower_release_seconds
            followers = [
                (kind, obj) for kind, obj in followers if not running and orphaned(obj, now=now, grace=grace)
            ]
            if not followers:
                return
            profile = orphan_profile(namespace, workload)
        else:
            profile = WorkloadProfile.model_validate(raw)
        actions = release_followers(
            profile,
            followers,
            node_products=await self.io.gpu_products() if profile.ready else frozenset(),
            config=self.config,
            catalog=self.catalog,
            signing_key=self.signing_key,
            calibration=self.calibration,
        )
        held = {(kind, _meta(obj)[1]): obj for kind, obj in followers}
        for action in actions:
            await self.io.apply(action)
            if isinstance(action, ReleaseFollower):
                how = (
                    f"ranked hints from WorkloadProfile {profile.metadata.name}"
                    if profile.ready
                    else f"base hints: WorkloadProfile {profile.metadata.name} is not Ready"
                )
                await self.report(
                    held[(action.kind, action.name)], action.kind, "Released", f"released with {how}"
                )
                self.metrics.hints.labels(recorded_ranking_source(action.released)).inc()
                if action.kind == "Job" and self.admission_checks is not None:
                    self.admission_checks.job_changed(namespace, action.name)  # its Workload's check: Ready
                log.info(
                    "follower released",
                    extra={
                        "namespace": namespace,
                        "kind": action.kind,
                        "objectName": action.name,
                        "profile": profile.metadata.name,
                    },
                )

    async def _observe(self, namespace: str, name: str) -> None:
        job = self.jobs.get((namespace, name))
        if job is None or not observed_job(job, signing_key=self.signing_key):
            return
        workload = _meta(job)[2].get(v.WORKLOAD_LABEL, "")
        pods = await self.io.job_pods(namespace, name)
        if self.prometheus is not None:
            self._telemetry_of_job_pods(pods, workload)
        nodes = {str(as_mapping(p.get("spec")).get("nodeName", "")) for p in pods}
        products = {node: await self.io.product_of(node) for node in nodes if node}
        runs = runs_of(pods, products)
        if not runs:
            return
        profile = await self.io.get_profile(namespace, v.profile_name(workload))
        action = record_runs(profile, runs) if profile is not None else None
        if action is not None:
            await self.io.apply(action)
            for run in runs:
                note = f"run {run.uid} on {run.product} took {run.seconds:.1f} s"
                await self.report(job, "Job", "Observed", note, detail=run.uid)
            log.info("runs observed", extra={"namespace": namespace, "job": name, "runs": len(runs)})
            self.enqueue(self.calibrate_key)

    def _telemetry_of_job_pods(self, pods: Iterable[dict[str, Any]], workload: str) -> None:
        """A Job labelled only on its own metadata (the label not on its pod template, as most Jobs
        are written) makes Pods without the workload label, which the Pod informer never sees: once
        the Job completes its Pods are measured as its workload's."""
        for pod in pods:
            namespace, name, labels, _ = _meta(pod)
            uid = str(as_mapping(pod.get("metadata")).get("uid", ""))
            if v.WORKLOAD_LABEL in labels or uid in self.telemetry_done:
                continue  # the Pod informer has it, or it was asked
            labelled = clone(pod)
            labelled["metadata"]["labels"] = {**labels, v.WORKLOAD_LABEL: workload}
            window = self.config.telemetry.window_seconds
            if isinstance(
                telemetry_due(labelled, now=dt.datetime.now(dt.UTC), window_seconds=window), TelemetryDue
            ):
                self.job_pods[(namespace, name)] = labelled
                self.enqueue_telemetry((namespace, name))

    async def _telemetry(self, namespace: str, name: str) -> None:
        """Ask Prometheus for the Pod's counters and fold them into its workload's profile. A failed
        query makes no profile: it raises PrometheusError, and the telemetry worker retries."""
        pod = self.pods.get((namespace, name)) or self.job_pods.get((namespace, name))
        if pod is None or self.prometheus is None:
            return
        settings = self.config.telemetry
        due = telemetry_due(pod, now=dt.datetime.now(dt.UTC), window_seconds=settings.window_seconds)
        if not isinstance(due, TelemetryDue) or due.uid in self.telemetry_done:
            return
        profile = await self.io.get_profile(namespace, v.profile_name(due.workload))
        if counted_telemetry(profile, due.uid):
            self._asked(due.uid)
            return
        try:
            samples = await self.prometheus.pod_samples(
                namespace=namespace, pod=name, end=due.end, seconds=due.seconds
            )
        except PrometheusError as exc:
            self.metrics.telemetry_queries.labels("error").inc()
            await self._telemetry_unavailable(due, profile, str(exc), detail="prometheus")
            raise
        self.telemetry_failing.pop(due.workload, None)
        found = pod_telemetry(
            pod_samples(samples, namespace=namespace, pod=name, labels=settings.labels), settings.labels
        )
        url = self.prometheus.url
        if not found.gpus:
            self.metrics.telemetry_queries.labels("empty").inc()
            note = (
                f"Prometheus at {url} has no DCGM series for Pod {namespace}/{name}: is dcgm-exporter "
                "running in its Kubernetes mode on node " + due.node + ", and scraped?"
            )
            await self._telemetry_unavailable(due, profile, note, detail=f"empty/{due.uid}")
            self._asked(due.uid)
            return
        self.metrics.telemetry_queries.labels("incomplete" if found.missing else "ok").inc()
        if found.missing:
            note = missing_counters_note(due, found, url)
            await self._telemetry_unavailable(due, profile, note, detail="missing/" + ",".join(found.missing))
        product = await self.io.product_of(due.node) or product_of(samples, settings.labels)
        run = telemetry_run(due, found, product)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        action = record_telemetry(profile, due, run, now=now) if run is not None else None
        if action is not None:
            outcome = await self.io.apply(action)
            if outcome == "exists":  # a profile appeared since it was read: fold into it next time
                asyncio.get_running_loop().call_later(1.0, self.enqueue_telemetry, (namespace, name))
                return
            if isinstance(action, PublishProfile) and outcome == "created":
                self.metrics.profiles_published.labels("ready").inc()
                ref = {"metadata": {"namespace": action.namespace, "name": action.name}}
                note = f"WorkloadProfile {action.name} is Ready from DCGM telemetry: {action.status.bound_type}-bound"
                await self.report(ref, "WorkloadProfile", "ProfileReady", note)
            log.info(
                "telemetry counted",
                extra={
                    "namespace": namespace,
                    "pod": name,
                    "workload": due.workload,
                    "product": product,
                    "gpus": len(found.gpus),
                    "seconds": round(due.seconds, 1),
                },
            )
        self._asked(due.uid)

    def _asked(self, uid: str) -> None:
        if len(self.telemetry_done) > TELEMETRY_DONE_LIMIT:  # the profiles' countedTelemetry still dedupes
            self.telemetry_done.clear()
        self.telemetry_done.add(uid)

    async def _telemetry_unavailable(
        self, due: TelemetryDue, profile: dict[str, Any] | None, note: str, *, detail: str
    ) -> None:
        """One log line and one Event per workload and cause: on its WorkloadProfile, or while the
        workload has none on the run's Job (a Pod of a Job), else on the Pod."""
        if self.telemetry_failing.get(due.workload) != detail:
            self.telemetry_failing[due.workload] = detail
            log.warning(
                "telemetry unavailable",
                extra={"namespace": due.namespace, "workload": due.workload, "pod": due.pod, "reason": note},
            )
        if profile is not None:
            await self.report(profile, "WorkloadProfile", "TelemetryUnavailable", note, detail=detail)
            return
        pod = self.pods.get((due.namespace, due.pod)) or self.job_pods.get((due.namespace, due.pod)) or {}
        owner = next(
            (
                self.jobs.get((due.namespace, str(ref.get("name"))))
                for ref in as_list(as_mapping(pod.get("metadata")).get("ownerReferences"))
                if as_mapping(ref).get("kind") == "Job"
            ),
            None,
        )
        if owner is not None:  # the run's Job, where kubectl describe job shows it
            await self.report(owner, "Job", "TelemetryUnavailable", note, detail=f"{due.workload}/{detail}")
        else:
            await self.report(pod, "Pod", "TelemetryUnavailable", note, detail=f"{due.workload}/{detail}")

    async def _telemetry_worker(self) -> None:
        """Telemetry's own worker: a query waits for Prometheus at most ``timeoutSeconds``, and a
        failure is retried with backoff (5 s doubling to 5 min), never on the main queue."""
        while True:
            key = await self.telemetry_queue.get()
            self.telemetry_queued.discard(key)
            try:
                await self._telemetry(*key)
                self.telemetry_retries.pop(key, None)
                held = self.job_pods.get(key)
                if held is not None and as_mapping(held.get("metadata")).get("uid") in self.telemetry_done:
                    del self.job_pods[key]  # asked; one whose profile appeared meanwhile comes back
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                backoff = Backoff(base=self.telemetry_retry_base, cap=300.0)
                delay = self.telemetry_retries.setdefault(key, backoff).next_delay()
                if not isinstance(exc, PrometheusError):
                    log.warning(
                        "telemetry failed, retrying",
                        extra={
                            "namespace": key[0],
                            "pod": key[1],
                            "reason": one_line(exc),
                            "retryIn": round(delay, 2),
                        },
                    )
                asyncio.get_running_loop().call_later(delay, self.enqueue_telemetry, key)

    async def _calibrate(self, namespace: str) -> None:
        """Refit every product's calibration (and every workload's shares) from all profiles; write
        the ConfigMap if it changed, at most once per ``calibrationWriteSeconds`` unless a factor
        moved beyond its noise (a write put off is made when the interval is up; the runs stay in
        the profiles, so a restart loses none)."""
        configmap = await self.io.get_configmap(namespace, CONFIGMAP_NAME)
        calibration, action = calibrate(
            await self.io.all_profiles(),
            configmap,
            namespace=namespace,
            catalog=self.catalog,
            reference_product=self.config.reference_product,
            now=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        self.calibration = calibration
        if action is not None:
            loop = asyncio.get_running_loop()
            written_at = self.calibration_written_at
            since = None if written_at is None else loop.time() - written_at
            wait = calibration_write_wait(
                calibration,
                current_calibration(configmap),
                since_write=since,
                interval=self.config.calibration_write_seconds,
                min_runs=self.config.min_calibration_runs,
            )
            if wait > 0:
                if self.calibration_due is None:
                    self.calibration_due = loop.call_later(wait, self._calibration_is_due)
                return
            reason = (
                "interval" if since is None or since >= self.config.calibration_write_seconds else "moved"
            )
            await self.io.apply(action)
            self.calibration_written_at = loop.time()
            self.metrics.calibration_writes.labels(reason).inc()
            log.info(
                "calibration written",
                extra={
                    "namespace": namespace,
                    "configMap": CONFIGMAP_NAME,
                    "products": len(calibration.products),
                },
            )

    def _calibration_is_due(self) -> None:
        self.calibration_due = None
        self.enqueue(self.calibrate_key)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            self.queued.discard(key)
            self.processing.add(key)
            try:
                await self.reconcile_key(key)
                self.attempts.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.reconcile_errors.inc()
                delay = self.attempts.setdefault(key, Backoff(base=1.0, cap=60.0)).next_delay()
                log.warning(
                    "reconcile failed, retrying",
                    extra={
                        "work": key[0],
                        "namespace": key[1],
                        "job": key[2],
                        "reason": one_line(exc),
                        "retryIn": round(delay, 2),
                    },
                )
                asyncio.get_running_loop().call_later(delay, self.enqueue, key)
            finally:
                self.processing.discard(key)
                if key in self.dirty:
                    self.dirty.discard(key)
                    self.enqueue(key)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_seconds)
            self.enqueue(self.calibrate_key)
            for kind, cache in (("Job", self.jobs), ("Pod", self.pods)):
                for obj in list(cache.values()):
                    self._work_for(obj, kind)  # type: ignore[arg-type]

    def unready_reason(self, tolerance: float) -> str:
        """Why this controller cannot do its work ("" when it can): a list or watch of its Jobs or
        Pods failing for longer than ``tolerance`` seconds (refused, or the API away)."""
        for informer in (self.informer, self.pod_informer):
            if informer.failing.longer_than(tolerance):
                return f"{informer.name} list/watch failing: {informer.failing.reason}"
        return ""

    async def run(self, workers: int = 2) -> None:
        tasks = [
            asyncio.create_task(self.informer.run()),
            asyncio.create_task(self.pod_informer.run()),
            asyncio.create_task(self._resync()),
        ]
        tasks += [asyncio.create_task(self._worker()) for _ in range(workers)]
        if self.prometheus is not None:
            tasks.append(asyncio.create_task(self._telemetry_worker()))
        if self.admission_checks is not None:
            tasks.append(asyncio.create_task(self.admission_checks.run()))
        tasks.append(asyncio.create_task(self.renewal.run()))
        self.enqueue(self.calibrate_key)  # what the runs counted so far say, after a restart too
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self.prometheus is not None:
                await self.prometheus.close()


async def run_when_leading(controller: ProfilerController, elector: LeaderElector) -> None:
    """Act only while holding the Lease; return (to exit and be restarted) when leadership is lost."""
    election = asyncio.create_task(elector.run())
    try:
        await elector.leading.wait()
        controller.metrics.leader.set(1)
        work = asyncio.create_task(controller.run())
        lost = asyncio.create_task(elector.lost.wait())
        await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        lost.cancel()
    finally:
        controller.metrics.leader.set(0)
        election.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await election
