"""The observation controller: a finished, successful hinted or execution Job's runs, per GPU product,
into its workload's ``status.observations`` (``learning.runs_of``/``record_runs`` decide; this applies).
The runs counted are remembered in the ledger ConfigMap ``<profile>-counted-runs`` (issue 59), the
profile's ``countedRuns`` naming only its last write's runs, so no run is counted twice across
restarts and the webhook's list of profiles carries no run uids."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_mapping
from kratos_admit.domain.workload import Kind
from kratos_controller.learning import (
    Run,
    ledger_after,
    ledger_name,
    ledger_runs,
    observed_job,
    record_runs,
    runs_of,
)
from kratos_controller.runtime import Obj, Shared, WorkQueue, meta_of, reconcile_backoff, reconcile_failed

log = logging.getLogger("kratos.controller")
CONFLICT_ATTEMPTS = 5  # guarded writes of one Job's runs before the queue's backoff takes over


class ObservationController:
    """Keyed by (namespace, Job). ``on_counted()`` is told when runs were counted (the calibration is
    refitted); ``on_job_pods(pods, workload)`` gets the Job's Pods, for the telemetry controller to
    measure those the Pod informer never sees (set only when telemetry is on)."""

    def __init__(
        self,
        shared: Shared,
        *,
        on_counted: Callable[[], None],
        on_job_pods: Callable[[Iterable[Obj], str], None] | None = None,
    ) -> None:
        self.shared = shared
        self.on_counted = on_counted
        self.on_job_pods = on_job_pods
        self.queue: WorkQueue[tuple[str, str]] = WorkQueue(
            self.reconcile,
            backoff=reconcile_backoff,
            on_failure=reconcile_failed(shared.metrics, "observe"),
        )

    def watch(self, obj: Obj, kind: Kind) -> None:
        if kind == "Job" and observed_job(obj, signing_key=self.shared.signing_key):
            namespace, name, _, _ = meta_of(obj)
            self.queue.add((namespace, name))

    async def run(self) -> None:
        await self.queue.run()

    async def reconcile(self, key: tuple[str, str]) -> None:
        namespace, name = key
        shared = self.shared
        job = shared.jobs.get(key)
        if job is None or not observed_job(job, signing_key=shared.signing_key):
            return
        workload = meta_of(job)[2].get(v.WORKLOAD_LABEL, "")
        pods = await shared.io.job_pods(namespace, name)
        if self.on_job_pods is not None:
            self.on_job_pods(pods, workload)
        nodes = {str(as_mapping(p.get("spec")).get("nodeName", "")) for p in pods}
        products = {node: await shared.io.product_of(node) for node in nodes if node}
        runs = runs_of(pods, products)
        if not runs:
            return
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                if not await self._record(namespace, workload, runs):
                    return
                break
            except ApiException as exc:
                # 409: the profile changed since it was read (most often the calibration's write of its
                # shares, a merge patch of another field): read it again and count anew, at once,
                # rather than after the queue's backoff (issue 59's burst of 600 runs)
                if exc.status != 409 or attempt == CONFLICT_ATTEMPTS:
                    raise
        for run in runs:
            note = f"run {run.uid} on {run.product} took {run.seconds:.1f} s"
            await shared.report(job, "Job", "Observed", note, detail=run.uid)
        log.info("runs observed", extra={"namespace": namespace, "job": name, "runs": len(runs)})
        self.on_counted()

    async def _record(self, namespace: str, workload: str, runs: list[Run]) -> bool:
        """Count ``runs`` into the workload's profile (those neither it nor its ledger counted yet), a
        write guarded by the resourceVersion read here; False when there was nothing to count."""
        io = self.shared.io
        ledger = ledger_name(v.profile_name(workload))
        held = await io.get_configmap(namespace, ledger)  # read first: the profile's read-to-write is short
        profile = await io.get_profile(namespace, v.profile_name(workload))
        if profile is None:
            return False
        counted = ledger_runs(held)
        action = record_runs(profile, runs, counted)
        if action is None:
            return False
        # the runs the profile names go to the ledger first: the profile's write then names only these
        moved = ledger_after(counted, profile)
        if moved is not None:
            await io.write_ledger(profile, ledger, moved, exists=held is not None)
        await io.apply(action)
        return True
