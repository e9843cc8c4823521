"""KRATOS's Kueue AdmissionCheck (DESIGN "Where Kueue runs"), optional per ClusterQueue: a follower's
Workload waits ``Pending`` until its workload's profile is Ready or Failed, so Kueue admits nothing
for it, and starts no Pod, before then; every other Workload's check turns ``Ready`` at once.

It runs beside the manager's controllers when config ``kueueAdmissionCheck`` is on (the
kueue-admission-check component sets it, with the RBAC it needs): informers of Kueue's AdmissionChecks
(those whose ``controllerName`` is ``gpu.scheduler.io/profile`` are marked ``Active``) and Workloads
(each one's entry of such a check is kept in step with its Job). Where Kueue's API is not served, it
says so once and looks again each resync, and the rest of the controller runs as ever.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from kratos_admit.decisions.holds import admission_check_state
from kratos_admit.domain.raw import as_mapping
from kratos_admit.edge.kube import Backoff, Informer, one_line
from kratos_admit.edge.kueue import KueueApi, active, check_states, ours, owner_job
from kratos_controller.runtime import run_together

log = logging.getLogger("kratos.controller")
Obj = dict[str, Any]
Key = tuple[Literal["workload", "check"], str, str]  # (what, namespace, name)


def _key(obj: Obj) -> tuple[str, str]:
    meta = as_mapping(obj.get("metadata"))
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class AdmissionCheckController:
    def __init__(
        self,
        kueue: KueueApi,
        *,
        read_job: Callable[[str, str], Awaitable[Obj | None]],
        signing_key: bytes,
        resync_seconds: float = 300.0,
        watch_timeout: int = 300,
        on_state: Callable[[str], None] | None = None,
    ) -> None:
        self.kueue = kueue
        self.read_job = read_job  # a fresh GET: the Job informer may not have seen a new Job yet
        self.signing_key = signing_key
        self.resync_seconds = resync_seconds
        self.on_state = on_state or (lambda state: None)  # counts the states written (metrics)
        self.checks: dict[str, Obj] = {}  # our AdmissionChecks by name
        self.workloads: dict[tuple[str, str], Obj] = {}
        self.queue: asyncio.Queue[Key] = asyncio.Queue()
        self.queued: set[Key] = set()
        self.attempts: dict[Key, Backoff] = {}
        self.served = asyncio.Event()
        self.check_informer = Informer(
            kueue.list_admission_checks,
            name="kueue-admissionchecks",
            on_replace=self._checks_replaced,
            on_event=self._check_event,
            watch_timeout=watch_timeout,
        )
        self.workload_informer = Informer(
            kueue.list_workloads,
            name="kueue-workloads",
            on_replace=self._workloads_replaced,
            on_event=self._workload_event,
            watch_timeout=watch_timeout,
        )

    # --- the caches ------------------------------------------------------------------------------

    def _checks_replaced(self, items: list[Obj]) -> None:
        self.checks = {_key(c)[1]: c for c in items if ours(c)}
        for name in self.checks:
            self.enqueue(("check", "", name))
        self._all_workloads()

    def _check_event(self, event: str, obj: Obj) -> None:
        name = _key(obj)[1]
        if event == "DELETED" or not ours(obj):
            self.checks.pop(name, None)
            return
        new = name not in self.checks
        self.checks[name] = obj
        self.enqueue(("check", "", name))
        if new:  # a check listed by a ClusterQueue after its Workloads were made
            self._all_workloads()

    def _workloads_replaced(self, items: list[Obj]) -> None:
        self.workloads = {_key(w): w for w in items}
        self._all_workloads()

    def _workload_event(self, event: str, obj: Obj) -> None:
        if event == "DELETED":
            self.workloads.pop(_key(obj), None)
            return
        self.workloads[_key(obj)] = obj
        if self._ours_in(obj):
            self.enqueue(("workload", *_key(obj)))

    def _ours_in(self, workload: Obj) -> list[str]:
        return [name for name in check_states(workload) if name in self.checks]

    def _all_workloads(self) -> None:
        for key, workload in self.workloads.items():
            if self._ours_in(workload):
                self.enqueue(("workload", *key))

    def job_changed(self, namespace: str, job: str) -> None:
        """A Job was released (or changed): look again at the Workloads it controls."""
        for (ns, name), workload in self.workloads.items():
            if ns == namespace and owner_job(workload) == job:
                self.enqueue(("workload", ns, name))

    # --- the work --------------------------------------------------------------------------------

    def enqueue(self, key: Key) -> None:
        if key not in self.queued:
            self.queued.add(key)
            self.queue.put_nowait(key)

    async def _activate(self, name: str) -> None:
        check = self.checks.get(name)
        if check is not None and not active(check):
            await self.kueue.activate(name, now=_now())
            log.info("admission check active", extra={"admissionCheck": name})

    async def _workload(self, namespace: str, name: str) -> None:
        workload = self.workloads.get((namespace, name))
        if workload is None:
            return
        job_name = owner_job(workload)
        job = await self.read_job(namespace, job_name) if job_name else None
        state, message = admission_check_state(job, signing_key=self.signing_key)
        for check, entry in check_states(workload).items():
            if check not in self.checks or (entry.get("state"), entry.get("message")) == (state, message):
                continue
            if entry.get("state") in ("Rejected",):  # Kueue's or a person's decision: not ours to undo
                continue
            same = entry.get("state") == state and isinstance(entry.get("lastTransitionTime"), str)
            await self.kueue.set_check_state(
                namespace,
                name,
                check=check,
                state=state,
                message=message,
                now=str(entry["lastTransitionTime"]) if same else _now(),
            )
            self.on_state(state)
            log.info(
                "admission check state",
                extra={"namespace": namespace, "workload": name, "job": job_name, "state": state},
            )

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            self.queued.discard(key)
            what, namespace, name = key
            try:
                if what == "check":
                    await self._activate(name)
                else:
                    await self._workload(namespace, name)
                self.attempts.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = self.attempts.setdefault(key, Backoff(base=1.0, cap=60.0)).next_delay()
                log.warning(
                    "admission check failed, retrying",
                    extra={
                        "namespace": namespace,
                        "objectName": name,
                        "reason": one_line(exc),
                        "retryIn": round(delay, 2),
                    },
                )
                asyncio.get_running_loop().call_later(delay, self.enqueue, key)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_seconds)
            self._all_workloads()

    async def _wait_until_served(self) -> None:
        """Until Kueue's API is served: said once, looked at again each resync (an error, with backoff)."""
        said = ""
        backoff = Backoff(base=1.0, cap=self.resync_seconds)
        while True:
            try:
                if await self.kueue.served():
                    return
                why, delay = "Kueue's API (kueue.x-k8s.io/v1beta1) is not served", self.resync_seconds
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                why, delay = f"Kueue's API cannot be read: {one_line(exc)}", backoff.next_delay()
            if why != said:
                log.warning(f"{why}: the AdmissionCheck waits for it", extra={"retryIn": round(delay, 2)})
                said = why
            await asyncio.sleep(delay)

    async def run(self) -> None:
        await self._wait_until_served()
        self.served.set()
        await run_together(
            [self.check_informer.run(), self.workload_informer.run(), self._worker(), self._resync()]
        )
