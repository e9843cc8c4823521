"""The profiling controller: each profiling Job, from its run to the profile it publishes and the
execution Job that recreates the workload (``reconcile.reconcile`` decides; this applies)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import condition_reason
from kratos_admit.domain.workload import Kind
from kratos_controller.actions import CreateExecutionJob, PublishProfile, StopJob
from kratos_controller.faults import image_pull_wait
from kratos_controller.reconcile import reconcile
from kratos_controller.runtime import Obj, Shared, WorkQueue, meta_of, reconcile_backoff, reconcile_failed

log = logging.getLogger("kratos.controller")


class ProfilingController:
    """Keyed by (namespace, profiling Job); a Job of role ``profiling``, or a Pod of one (the
    kubelet's word on its run), asks for its Job to be looked at. ``on_settled(namespace, workload)``
    is told when a profile turns Ready or Failed: its followers can go."""

    def __init__(self, shared: Shared, *, on_settled: Callable[[str, str], None], workers: int = 2) -> None:
        self.shared = shared
        self.on_settled = on_settled
        self.queue: WorkQueue[tuple[str, str]] = WorkQueue(
            self.reconcile,
            backoff=reconcile_backoff,
            on_failure=reconcile_failed(shared.metrics, "run"),
            workers=workers,
        )

    def watch(self, obj: Obj, kind: Kind) -> None:
        namespace, name, labels, _ = meta_of(obj)
        if labels.get(v.ROLE_LABEL) != "profiling":
            return
        if kind == "Job":
            self.queue.add((namespace, name))
        elif labels.get("job-name"):
            self.queue.add((namespace, labels["job-name"]))

    async def run(self) -> None:
        await self.queue.run()

    async def reconcile(self, key: tuple[str, str]) -> None:
        namespace, name = key
        shared = self.shared
        job = shared.jobs.get(key)
        if job is None:
            return
        observed = await shared.io.observe(job)
        grace = shared.config.image_pull_grace_seconds
        actions = reconcile(observed, signing_key=shared.signing_key, image_pull_grace=grace)
        if actions:  # look again once these are applied: the finalizer comes off in a later pass
            self.queue.add(key)
        wait = image_pull_wait(observed, grace=grace)
        if (
            wait
        ):  # an image failing to pull: look again when its grace is up (the kubelet may say nothing new)
            self.queue.add_after(wait + 1.0, key)
        for action in actions:
            outcome = await shared.io.apply(action)
            if isinstance(action, PublishProfile):
                await self._report_published(job, action)
                shared.metrics.profiles_published.labels(action.status.phase.lower()).inc()
                if action.status.phase == "Failed":
                    product = await shared.io.product_of(observed.node) if observed.node else ""
                    shared.metrics.profiling_failures.labels(
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
                    self.on_settled(namespace, str(action.spec.get("workload", "")))
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
                await shared.report(job, "Job", "ExecutionJobCreated", f"created execution Job {execution}")
                shared.metrics.execution_jobs_created.inc()
                log.info(
                    "execution Job created",
                    extra={"namespace": namespace, "job": name, "executionJob": execution},
                )

    async def _report_published(self, job: dict[str, Any], action: PublishProfile) -> None:
        status = action.status
        workload = str(action.spec.get("workload", ""))
        report = self.shared.report
        if status.phase == "Profiling":
            await report(
                job, "Job", "ProfilingStarted",
                f"profiling workload {workload} under Nsight Compute; Jobs of {workload} created meanwhile wait for WorkloadProfile {action.name}",
            )  # fmt: skip
            return
        profile = {"metadata": {"namespace": action.namespace, "name": action.name}}
        if status.phase == "Ready":
            note = f"WorkloadProfile {action.name} is Ready: {status.bound_type}-bound"
            await report(job, "Job", "ProfileReady", note)
            await report(profile, "WorkloadProfile", "ProfileReady", note)
        elif status.phase == "Failed":
            note = f"WorkloadProfile {action.name} is Failed ({condition_reason(status.failure)}): {status.message}"
            await report(job, "Job", "ProfileFailed", note)
            await report(profile, "WorkloadProfile", "ProfileFailed", note)
