"""The telemetry controller: an opted-in GPU Pod's DCGM counters, asked of Prometheus once its run is
due, folded into its workload's profile (``learning.telemetry_due``/``record_telemetry`` decide; this
applies). Its queue is its own, with a longer backoff, so a slow or absent Prometheus never delays a
release or any other controller's work."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Iterable
from typing import Any

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_list, as_mapping, clone
from kratos_admit.domain.workload import Kind
from kratos_admit.edge.kube import Backoff, one_line
from kratos_admit.edge.prometheus import Prometheus, PrometheusError
from kratos_admit.model.telemetry import pod_samples, pod_telemetry, product_of
from kratos_controller.actions import PublishProfile
from kratos_controller.learning import (
    TelemetryDue,
    counted_telemetry,
    missing_counters_note,
    missing_links_note,
    record_telemetry,
    telemetry_due,
    telemetry_run,
)
from kratos_controller.runtime import Obj, Shared, WorkQueue, meta_of

log = logging.getLogger("kratos.controller")
DONE_LIMIT = 10_000  # Pod uids remembered as asked; past that the memory starts again


class TelemetryController:
    """Keyed by (namespace, Pod). A Pod of the Pod informer asks for itself when its run is due, or
    sets a timer for when its window will have passed; a completed Job's unlabelled Pods come from
    the observation controller (``job_pods_seen``)."""

    def __init__(self, shared: Shared, prometheus: Prometheus) -> None:
        self.shared = shared
        self.prometheus = prometheus
        self.retry_base = 5.0  # seconds, doubling per failure up to 5 min (jittered)
        self.timers: set[tuple[str, str]] = set()  # running Pods waiting for their window
        self.failing: dict[str, str] = {}  # workload -> the error already logged for it
        self.done: set[str] = set()  # Pod uids asked, whatever the answer: never asked again
        # Pods of a completed Job labelled only on its own metadata (the Pod informer never sees
        # them), held with their workload's label until their telemetry is asked
        self.job_pods: dict[tuple[str, str], Obj] = {}
        self.queue: WorkQueue[tuple[str, str]] = WorkQueue(
            self.reconcile,
            backoff=lambda: Backoff(base=self.retry_base, cap=300.0),
            on_failure=self._failed,
        )

    def watch(self, obj: Obj, kind: Kind) -> None:
        """Queue the Pod's telemetry when due, or look again when its window will have passed."""
        if kind != "Pod":
            return
        namespace, name, _, _ = meta_of(obj)
        key = (namespace, name)
        window = self.shared.config.telemetry.window_seconds
        due = telemetry_due(obj, now=dt.datetime.now(dt.UTC), window_seconds=window)
        if isinstance(due, TelemetryDue):
            if due.uid not in self.done:
                self.queue.add(key)
        elif isinstance(due, float) and key not in self.timers:
            self.timers.add(key)
            asyncio.get_running_loop().call_later(due + 1.0, self._window_passed, key)

    def _window_passed(self, key: tuple[str, str]) -> None:
        self.timers.discard(key)
        pod = self.shared.pods.get(key)
        if pod is not None:
            self.watch(pod, "Pod")

    def job_pods_seen(self, pods: Iterable[Obj], workload: str) -> None:
        """A Job labelled only on its own metadata (the label not on its pod template, as most Jobs
        are written) makes Pods without the workload label, which the Pod informer never sees: once
        the Job completes its Pods are measured as its workload's."""
        for pod in pods:
            namespace, name, labels, _ = meta_of(pod)
            uid = str(as_mapping(pod.get("metadata")).get("uid", ""))
            if v.WORKLOAD_LABEL in labels or uid in self.done:
                continue  # the Pod informer has it, or it was asked
            labelled = clone(pod)
            labelled["metadata"]["labels"] = {**labels, v.WORKLOAD_LABEL: workload}
            window = self.shared.config.telemetry.window_seconds
            if isinstance(
                telemetry_due(labelled, now=dt.datetime.now(dt.UTC), window_seconds=window), TelemetryDue
            ):
                self.job_pods[(namespace, name)] = labelled
                self.queue.add((namespace, name))

    async def run(self) -> None:
        await self.queue.run()

    async def close(self) -> None:
        await self.prometheus.close()

    async def reconcile(self, key: tuple[str, str]) -> None:
        await self._ask(*key)
        held = self.job_pods.get(key)
        if held is not None and as_mapping(held.get("metadata")).get("uid") in self.done:
            del self.job_pods[key]  # asked; one whose profile appeared meanwhile comes back

    def _failed(self, key: tuple[str, str], exc: Exception, delay: float) -> None:
        """A query waits for Prometheus at most ``timeoutSeconds``; a failure is retried with backoff
        (5 s doubling to 5 min). Prometheus's own failures were logged once per workload already."""
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

    async def _ask(self, namespace: str, name: str) -> None:
        """Ask Prometheus for the Pod's counters and fold them into its workload's profile. A failed
        query makes no profile: it raises PrometheusError, and the queue retries."""
        shared = self.shared
        pod = shared.pods.get((namespace, name)) or self.job_pods.get((namespace, name))
        if pod is None:
            return
        settings = shared.config.telemetry
        due = telemetry_due(pod, now=dt.datetime.now(dt.UTC), window_seconds=settings.window_seconds)
        if not isinstance(due, TelemetryDue) or due.uid in self.done:
            return
        profile = await shared.io.get_profile(namespace, v.profile_name(due.workload))
        if counted_telemetry(profile, due.uid):
            self._asked(due.uid)
            return
        try:
            samples = await self.prometheus.pod_samples(
                namespace=namespace, pod=name, end=due.end, seconds=due.seconds
            )
        except PrometheusError as exc:
            shared.metrics.telemetry_queries.labels("error").inc()
            await self._unavailable(due, profile, str(exc), detail="prometheus")
            raise
        self.failing.pop(due.workload, None)
        found = pod_telemetry(
            pod_samples(samples, namespace=namespace, pod=name, labels=settings.labels), settings.labels
        )
        url = self.prometheus.url
        if not found.gpus:
            shared.metrics.telemetry_queries.labels("empty").inc()
            note = (
                f"Prometheus at {url} has no DCGM series for Pod {namespace}/{name}: is dcgm-exporter "
                "running in its Kubernetes mode on node " + due.node + ", and scraped?"
            )
            await self._unavailable(due, profile, note, detail=f"empty/{due.uid}")
            self._asked(due.uid)
            return
        shared.metrics.telemetry_queries.labels("incomplete" if found.missing else "ok").inc()
        if found.missing:
            note = missing_counters_note(due, found, url)
            await self._unavailable(due, profile, note, detail="missing/" + ",".join(found.missing))
        product = await shared.io.product_of(due.node) or product_of(samples, settings.labels)
        unlinked = missing_links_note(due, found, product, shared.catalog, url)
        if unlinked is not None and not found.missing:  # one Event per cause: the profiling counters' first
            await self._unavailable(due, profile, unlinked, detail="links")
        run = telemetry_run(due, found, product)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        action = (
            record_telemetry(profile, due, run, now=now, catalog=shared.catalog) if run is not None else None
        )
        if action is not None:
            outcome = await shared.io.apply(action)
            if outcome == "exists":  # a profile appeared since it was read: fold into it next time
                self.queue.add_after(1.0, (namespace, name))
                return
            if isinstance(action, PublishProfile) and outcome == "created":
                shared.metrics.profiles_published.labels("ready").inc()
                ref = {"metadata": {"namespace": action.namespace, "name": action.name}}
                note = f"WorkloadProfile {action.name} is Ready from DCGM telemetry: {action.status.bound_type}-bound"
                await shared.report(ref, "WorkloadProfile", "ProfileReady", note)
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
        if len(self.done) > DONE_LIMIT:  # the profiles' countedTelemetry still dedupes
            self.done.clear()
        self.done.add(uid)

    async def _unavailable(
        self, due: TelemetryDue, profile: dict[str, Any] | None, note: str, *, detail: str
    ) -> None:
        """One log line and one Event per workload and cause: on its WorkloadProfile, or while the
        workload has none on the run's Job (a Pod of a Job), else on the Pod."""
        shared = self.shared
        if self.failing.get(due.workload) != detail:
            self.failing[due.workload] = detail
            log.warning(
                "telemetry unavailable",
                extra={"namespace": due.namespace, "workload": due.workload, "pod": due.pod, "reason": note},
            )
        if profile is not None:
            await shared.report(profile, "WorkloadProfile", "TelemetryUnavailable", note, detail=detail)
            return
        pod = shared.pods.get((due.namespace, due.pod)) or self.job_pods.get((due.namespace, due.pod)) or {}
        owner = next(
            (
                shared.jobs.get((due.namespace, str(ref.get("name"))))
                for ref in as_list(as_mapping(pod.get("metadata")).get("ownerReferences"))
                if as_mapping(ref).get("kind") == "Job"
            ),
            None,
        )
        if owner is not None:  # the run's Job, where kubectl describe job shows it
            await shared.report(owner, "Job", "TelemetryUnavailable", note, detail=f"{due.workload}/{detail}")
        else:
            await shared.report(pod, "Pod", "TelemetryUnavailable", note, detail=f"{due.workload}/{detail}")
