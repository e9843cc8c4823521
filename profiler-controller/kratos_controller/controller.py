"""The controller loop: watch profiling Jobs, reconcile each finished one, apply the actions.

Observe -> pure ``reconcile`` -> apply, per Job key, from a de-duplicating work queue; failures
are retried with backoff, and a periodic resync re-checks every finished Job so nothing is missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry, Counter

from kratos_admit import vocabulary as v
from kratos_admit.kube import Backoff, Informer
from kratos_admit.raw import as_mapping
from kratos_controller.kube_io import KubeIO
from kratos_controller.leader import LeaderElector
from kratos_controller.reconcile import CreateExecutionJob, PublishProfile, finished, reconcile

log = logging.getLogger("kratos.controller")
Key = tuple[str, str]


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.profiles_published = Counter(
            "kratos_profiles_published",
            "WorkloadProfiles written, by outcome (ready, failed).",
            ["outcome"],
            registry=self.registry,
        )
        self.execution_jobs_created = Counter(
            "kratos_execution_jobs_created",
            "Execution Jobs created from profiling Jobs.",
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "kratos_reconcile_errors", "Reconciles that failed and were retried.", registry=self.registry
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
    ) -> None:
        self.io = KubeIO(api)
        self.signing_key = signing_key
        self.metrics = metrics
        self.resync_seconds = resync_seconds
        self.jobs: dict[Key, dict[str, Any]] = {}
        self.queue: asyncio.Queue[Key] = asyncio.Queue()
        self.queued: set[Key] = set()
        self.attempts: dict[Key, Backoff] = {}
        self.informer = Informer(
            client.BatchV1Api(api).list_job_for_all_namespaces,
            name="profiling-jobs",
            label_selector=f"{v.ROLE_LABEL}=profiling",
            on_replace=self._replace,
            on_event=self._event,
            watch_timeout=watch_timeout,
        )

    @staticmethod
    def _key(job: dict[str, Any]) -> Key:
        meta = as_mapping(job.get("metadata"))
        return str(meta.get("namespace", "")), str(meta.get("name", ""))

    def enqueue(self, key: Key) -> None:
        if key not in self.queued:
            self.queued.add(key)
            self.queue.put_nowait(key)

    def _replace(self, items: list[dict[str, Any]]) -> None:
        self.jobs = {self._key(job): job for job in items}
        for key, job in self.jobs.items():
            if finished(job):
                self.enqueue(key)

    def _event(self, kind: str, job: dict[str, Any]) -> None:
        key = self._key(job)
        if kind == "DELETED":
            self.jobs.pop(key, None)
            return
        self.jobs[key] = job
        if finished(job):
            self.enqueue(key)

    async def reconcile_key(self, key: Key) -> None:
        job = self.jobs.get(key)
        if job is None:
            return
        observed = await self.io.observe(job)
        for action in reconcile(observed, signing_key=self.signing_key):
            outcome = await self.io.apply(action)
            if isinstance(action, PublishProfile):
                self.metrics.profiles_published.labels(str(action.status["phase"]).lower()).inc()
                log.info(
                    "profile published",
                    extra={
                        "namespace": key[0],
                        "job": key[1],
                        "profile": action.name,
                        "phase": action.status["phase"],
                    },
                )
            elif isinstance(action, CreateExecutionJob) and outcome == "created":
                self.metrics.execution_jobs_created.inc()
                log.info(
                    "execution Job created",
                    extra={
                        "namespace": key[0],
                        "job": key[1],
                        "executionJob": action.manifest["metadata"]["name"],
                    },
                )

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            self.queued.discard(key)
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
                        "namespace": key[0],
                        "job": key[1],
                        "reason": f"{type(exc).__name__}: {exc}",
                        "retryIn": round(delay, 2),
                    },
                )
                asyncio.get_running_loop().call_later(delay, self.enqueue, key)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_seconds)
            for key, job in list(self.jobs.items()):
                if finished(job):
                    self.enqueue(key)

    async def run(self, workers: int = 2) -> None:
        tasks = [asyncio.create_task(self.informer.run()), asyncio.create_task(self._resync())]
        tasks += [asyncio.create_task(self._worker()) for _ in range(workers)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def run_when_leading(controller: ProfilerController, elector: LeaderElector) -> None:
    """Act only while holding the Lease; return (to exit and be restarted) when leadership is lost."""
    election = asyncio.create_task(elector.run())
    try:
        await elector.leading.wait()
        work = asyncio.create_task(controller.run())
        lost = asyncio.create_task(elector.lost.wait())
        await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        lost.cancel()
    finally:
        election.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await election
