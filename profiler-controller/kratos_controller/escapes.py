"""The escape of "Wait or run slow" in a cluster: a narrowed Job whose Pod waits unschedulable for an
acceptable product is let onto a kept-off product where that product has room now and the Job is
predicted to finish there sooner than by waiting (the rule: ``decisions/escape.py``; the same rule
runs in ``simulate``'s ``kratos``).

At each look of the ``WaitController`` (every 30 s), for the Jobs that may escape, in the order their
Pods were created (the queue), one list of the GPU Nodes and the bound Pods gives when each GPU frees;
a Job that waits on counts as ahead of the next ones on its best product. A Job that escapes is
written three times, as Kueue writes a Job it stops (``pkg/controller/jobs/job``): suspended with the
plan in its hints record (the Job controller deletes its Pending Pod), its ``status.startTime``
reset, then widened to the product and resumed. The plan in the record carries the escape across a
restart of the controller: a Job that holds one and is still suspended is finished at the next look.

Which Jobs may escape (``escapable``): a Job that no Kueue queue manages (Kueue's flavor assignment
decides those) and no JobSet owns (its gang spans Jobs), of one Pod at a time or a gang of all its Pods
at once (``parallelism`` equal to ``completions``: the whole gang moves, onto a product with room for
every Pod), none of whose Pods has started, one of them marked ``Unschedulable`` by the scheduler, and whose record gives its predicted
runtimes. The Pending Pod the Job controller deletes on suspension is not counted as failed (seen on
Kubernetes 1.28.7: ``status.failed`` stays unset), so ``backoffLimit: 0`` is no obstacle. A bare Pod
cannot escape: the API server never widens a Pod's required affinity.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.decisions.escape import (
    ESCAPE_KEY,
    Occupancy,
    Plan,
    escape_under_way,
    escaped,
    escaping,
    job_gpus,
    job_record,
    plan,
    ready_to_widen,
    recorded_seconds,
)
from kratos_admit.domain.raw import as_list, as_mapping
from kratos_admit.domain.workload import kueue_queue
from kratos_controller.runtime import Obj, Shared, meta_of

log = logging.getLogger("kratos.controller")

# how long one look waits for the Job controller to delete a suspended Job's Pod before it widens
SETTLE_SECONDS = 10.0


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """Whether kube-scheduler has marked the Pod ``PodScheduled=False``, reason ``Unschedulable``."""
    return any(
        as_mapping(c).get("type") == "PodScheduled"
        and as_mapping(c).get("status") == "False"
        and as_mapping(c).get("reason") == "Unschedulable"
        for c in as_list(as_mapping(pod.get("status")).get("conditions"))
    )


def escapable(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a narrowed Job may escape now (the module's list)."""
    spec, status = as_mapping(job.get("spec")), as_mapping(job.get("status"))
    record = job_record(job)
    parallelism = int(spec.get("parallelism") or 1)
    owners = [
        as_mapping(o).get("kind") for o in as_list(as_mapping(job.get("metadata")).get("ownerReferences"))
    ]
    return (
        not kueue_queue(job)
        and all(kind == "CronJob" for kind in owners)  # a JobSet's Jobs: its gang spans Jobs
        and (parallelism == 1 or int(spec.get("completions") or parallelism) == parallelism)
        and spec.get("suspend") is not True
        and not as_mapping(job.get("metadata")).get("deletionTimestamp")
        and not status.get("succeeded")
        and bool(recorded_seconds(record))
        and bool(pods)
        and all(not as_mapping(p.get("spec")).get("nodeName") for p in pods)
        and any(unschedulable(p) for p in pods)
    )


@dataclass(frozen=True, slots=True)
class Waiting:
    """A narrowed Job that waits, in the queue at the creation of its first waiting Pod."""

    since: float
    job: Obj
    pods: tuple[Obj, ...]


class Escapes:
    """The escapes under way are read from the Jobs themselves; nothing is kept between looks."""

    def __init__(self, shared: Shared, *, settle_seconds: float = SETTLE_SECONDS) -> None:
        self.shared = shared
        self.settle_seconds = settle_seconds

    async def look(self, now: dt.datetime, waiting: Sequence[Waiting], under_way: Sequence[Obj]) -> None:
        """Finish the escapes under way; then decide, in queue order, for the Jobs that may escape."""
        for job in under_way:
            await self._finish(job)
        queue = sorted((w for w in waiting if escapable(w.job, w.pods)), key=lambda w: w.since)
        if not queue:
            return
        nodes, pods = await self.shared.io.gpu_occupancy()
        occupancies: dict[str, Occupancy] = {}
        ahead: dict[str, list[float]] = {}
        taken: set[str] = set()  # one escape per product per look: the next look sees it bound
        for entry in queue:
            template = as_mapping(as_mapping(entry.job.get("spec")).get("template"))
            tolerations = [
                as_mapping(t) for t in as_list(as_mapping(template.get("spec")).get("tolerations"))
            ]
            key = json.dumps(tolerations, sort_keys=True)
            if key not in occupancies:
                occupancies[key] = Occupancy.read(nodes, pods, now=now.timestamp(), tolerations=tolerations)
            chosen = plan(entry.job, occupancies[key], ahead)
            if chosen is None or chosen.product in taken:
                self._queue_behind(entry.job, ahead)
                continue
            taken.add(chosen.product)
            await self._start(entry.job, chosen)

    @staticmethod
    def _queue_behind(job: Obj, ahead: dict[str, list[float]]) -> None:
        """A Job that waits on is ahead of the later ones on its best acceptable product, each GPU."""
        record = job_record(job)
        predicted = recorded_seconds(record)
        acceptable = [str(as_mapping(a).get("product", "")) for a in as_list(record.get("acceptable"))]
        best = min((p for p in acceptable if p in predicted), key=predicted.__getitem__, default=None)
        if best is not None:
            gpus, pods = job_gpus(job)
            ahead.setdefault(best, []).extend([predicted[best]] * (gpus * pods))

    async def _start(self, job: Obj, chosen: Plan) -> None:
        shared = self.shared
        namespace, name, _, _ = meta_of(job)
        suspended = escaping(job, chosen, namespace=namespace, signing_key=shared.signing_key)
        try:
            await shared.io.patch_changed("Job", namespace, name, job, suspended)
        except ApiException as exc:
            if exc.status in (404, 409):
                return  # gone, or changed since it was read (bound, say): the next look sees it as it is
            raise
        log.info(
            "escape started",
            extra={"namespace": namespace, "objectName": name, "product": chosen.product},
        )
        # the Job controller deletes its Pending Pod; finish now where it does so soon, else next look
        deadline = asyncio.get_running_loop().time() + self.settle_seconds
        while True:
            fresh = await shared.io.read_job(namespace, name)
            if fresh is None:
                return
            if not as_mapping(fresh.get("status")).get("active"):
                await self._finish(fresh)  # reads it again: one GET more, once per escape
                return
            if asyncio.get_running_loop().time() >= deadline:
                return
            await asyncio.sleep(1.0)

    async def _finish(self, job: Obj) -> None:
        """Reset the start of a Job suspended for its escape, widen it and resume it, once no Pod of it
        is active; else leave it to the next look."""
        shared = self.shared
        namespace, name, _, _ = meta_of(job)
        try:
            fresh = await shared.io.read_job(namespace, name)  # the informer's copy may lag the writes
            if fresh is None:
                return
            job = fresh
            if not escape_under_way(job) or as_mapping(job.get("status")).get("active"):
                return
            if as_mapping(job.get("status")).get("startTime"):
                await shared.io.reset_job_start(namespace, name)
                fresh = await shared.io.read_job(namespace, name)
                if fresh is None:
                    return
                job = fresh
            if not ready_to_widen(job):
                return
            widened = escaped(job, namespace=namespace, signing_key=shared.signing_key)
            await shared.io.patch_changed("Job", namespace, name, job, widened)
        except ApiException as exc:
            if exc.status in (404, 409, 422):
                return  # gone, changed, or resumed by someone else: the next look reads it again
            raise
        chosen = Plan.of(as_mapping(job_record(job).get(ESCAPE_KEY)))
        acceptable = [
            str(as_mapping(a).get("product", "")) for a in as_list(job_record(job).get("acceptable"))
        ]
        shared.metrics.escapes.labels(chosen.product).inc()
        await shared.report(job, "Job", "EscapedToProduct", chosen.note(acceptable))
        log.info(
            "escape done: widened and resumed",
            extra={"namespace": namespace, "objectName": name, "product": chosen.product},
        )
