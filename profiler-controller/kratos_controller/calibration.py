"""The calibration controller: every GPU product's calibration, and every workload's re-fitted shares,
from the samples of all profiles' counted runs, kept per profile from the profiles' own watch (issue
59: no list at resync, no refit while nothing changed, and each refit re-fits only the shares a change
moved, ``FitMemo``). The factors go to the ConfigMap ``kratos-gpu-calibration`` (whose size grows with
the GPU products only) at the write cadence of ``learning.calibration_write_wait``; each workload's
shares to its profile's ``status.calibratedShares``, apart: those that differ from what the profile
holds, at most once per ``calibrationWriteSeconds`` (never sooner), ``SHARES_WRITERS`` at a time, and
put off while finished runs wait to be counted (``counting``), up to ``SHARES_PATIENCE`` intervals: the
runs' own writes of the same profiles go first and are not refused (409) for them, and a burst of runs
writes each profile's shares a few times, not once an interval or a run. A refused write is the metric
``kratos_calibration_write_failures_total`` and an error log line (and, for the ConfigMap, a warning
Event on it), and is tried again (the write alone, never the fit) after ``calibrationWriteSeconds``."""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_mapping, string_map
from kratos_admit.domain.vocabulary import Unit
from kratos_admit.edge.kube import Informer, Sweep
from kratos_admit.model.calibration import (
    CONFIGMAP_NAME,
    NO_CALIBRATION,
    Calibration,
    Sample,
    WorkloadShares,
    profile_shares,
    under_way,
)
from kratos_admit.model.calibration_fit import FitMemo, fit_calibration
from kratos_admit.model.calibration_writes import keep_unchanged_dates
from kratos_admit.model.catalog import Catalog
from kratos_controller.learning import (
    calibration_write_wait,
    current_calibration,
    exploring_job,
    profile_samples,
    published_calibration,
)
from kratos_controller.runtime import Obj, Shared, WorkQueue, meta_of, reconcile_backoff, reconcile_failed

log = logging.getLogger("kratos.controller")
Key = tuple[str, str]
SHARES_WRITERS = 4  # profiles' calibratedShares patched at once (20,000 after a first fit)
SHARES_PATIENCE = 10  # calibrationWriteSeconds the shares wait at most for the runs to be counted


# the C library's malloc_trim, as the interpreter has it linked (glibc's; musl has none)
MALLOC_TRIM: Callable[[int], int] | None = getattr(ctypes.CDLL(None), "malloc_trim", None)


def release_freed_memory() -> None:
    """Hand the C heap's free pages back to the kernel (glibc's ``malloc_trim``, as Dask's workers
    do). A refit at 20,000 workloads frees tens of MiB in holes among the pages still in use, which
    glibc keeps; each later refit then peaked higher (issue 59, the real server: 236 MiB at rest,
    284 after one run, 328 after the next). Nothing where the C library has no ``malloc_trim``."""
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


def _fit_and_release(
    samples: list[Sample], catalog: Catalog, *, updated_at: str, memo: FitMemo
) -> Calibration:
    """``fit_calibration``, then what it freed handed back (``release_freed_memory``): in the fit's thread."""
    try:
        return fit_calibration(samples, catalog, updated_at=updated_at, memo=memo)
    finally:
        release_freed_memory()


def _shares_body(calibration: Calibration, workload: str) -> dict[str, Any] | None:
    """What a profile's ``calibratedShares`` should hold after ``calibration`` (None: none)."""
    fitted = calibration.workloads.get(workload)
    return fitted.as_dict() if fitted is not None else None


# what the controller keeps of one profile: its samples, its workload (namespace/workload, as the
# calibration keys its shares) and the shares its status holds
Held = tuple[tuple[Sample, ...], str, dict[str, Any] | None]


class CalibrationController:
    """One key: the ConfigMap in the KRATOS namespace. Asked for once the profiles' first list is in
    (a full fit), when a profile's samples change, at every resync (``recheck``: the ConfigMap read,
    a write put off or refused made; nothing is refitted), and after each counted run (``request``:
    nothing read or written until the profile's watch event brings the run). The profiles' shares
    have a queue of their own (``write_shares``)."""

    def __init__(
        self, shared: Shared, *, watch_timeout: int = 300, counting: Callable[[], bool] = lambda: False
    ) -> None:
        self.shared = shared
        self.counting = counting  # whether finished runs wait to be counted (the observation queue)
        self.key = (shared.config.lease_namespace, CONFIGMAP_NAME)
        self.current: Calibration = NO_CALIBRATION  # the last fit, for releasing followers
        self.held: dict[Key, Held] = {}
        self.memo = FitMemo()
        self.changed = True  # samples changed since the last fit
        # the ConfigMap holds the last fit (written, or read so): a count's request, which its profile's
        # watch event follows, reads nothing; a refit, a refusal or a resync (``recheck``) reads it again
        self.settled = False
        self.synced = False
        self.written_at: float | None = None  # loop time of this controller's last ConfigMap write
        self.due: asyncio.TimerHandle | None = None  # a write put off (calibrationWriteSeconds) or refused
        self.shares_written_at: float | None = None  # loop time of its last round of shares writes
        self.shares_due: asyncio.TimerHandle | None = None
        self.shares_since: float | None = None  # loop time the shares to write were first put off
        # profiles whose samples changed since the fit under way began, and those whose samples a
        # finished fit took in: a round of shares writes these first (``_round``)
        self.moved: set[Key] = set()
        self.fresh: dict[Key, None] = {}
        # the exploring Jobs under way, by Job (product, figure, namespace/workload), from the manager's
        # Job informer: published with the factors, so the webhook spreads the next exploring Jobs over
        # the figures no run is on its way to measure (docs/ranking.md "Exploration")
        self.exploring: dict[Key, tuple[str, Unit, str]] = {}
        self.exploring_changed = False
        self.queue: WorkQueue[tuple[str, str]] = WorkQueue(
            self.reconcile,
            backoff=reconcile_backoff,
            on_failure=reconcile_failed(shared.metrics, "calibrate"),
        )
        self.shares_queue: WorkQueue[tuple[str, str]] = WorkQueue(
            self.write_shares,
            backoff=reconcile_backoff,
            on_failure=reconcile_failed(shared.metrics, "calibrate"),
        )
        custom = shared.io.custom
        self.informer = Informer(
            functools.partial(custom.list_cluster_custom_object, v.GROUP, v.VERSION, v.PROFILE_PLURAL),
            name="kratos-calibration-profiles",
            fold=Sweep(self._stored, self.held.keys, self._dropped, self._listed),
            on_event=self._event,
            watch_timeout=watch_timeout,
        )

    def request(self) -> None:
        self.queue.add(self.key)

    def recheck(self) -> None:
        """At a resync: read the ConfigMap again, and write it where it no longer holds the fit."""
        self.settled = False
        self.request()

    def calibration(self) -> Calibration:
        return self.current

    async def run(self) -> None:
        await asyncio.gather(self.informer.run(), self.queue.run(), self.shares_queue.run())

    # --- the exploring Jobs under way, from the manager's Job informer ---------------------------------

    def job_seen(self, job: Obj) -> None:
        """A Job listed or watched: counted while it explores (its signed hints record names the product
        and the figure) and has not finished."""
        namespace, name, labels, _ = meta_of(job)
        found = exploring_job(job, signing_key=self.shared.signing_key)
        entry = (*found, f"{namespace}/{labels.get(v.WORKLOAD_LABEL, '')}") if found is not None else None
        if self.exploring.get((namespace, name)) == entry:
            return
        if entry is None:
            del self.exploring[(namespace, name)]
        else:
            self.exploring[(namespace, name)] = entry
        self._exploring_moved()

    def job_gone(self, key: Key) -> None:
        if self.exploring.pop(key, None) is not None:
            self._exploring_moved()

    def _exploring_moved(self) -> None:
        self.exploring_changed = True
        if self.synced:
            self.request()

    # --- the profiles' watch: each profile's samples, read once per change -----------------------------

    def _stored(self, obj: Obj) -> Key:
        namespace, name, _, _ = meta_of(obj)
        config = self.shared.config
        samples = tuple(
            profile_samples([obj], catalog=self.shared.catalog, reference_product=config.reference_product)
        )
        workload = str(as_mapping(obj.get("spec")).get("workload", ""))
        shares = as_mapping(obj.get("status")).get("calibratedShares")
        before = self.held.get((namespace, name))
        self.held[(namespace, name)] = (
            samples,
            f"{namespace}/{workload}",
            dict(shares) if isinstance(shares, dict) else None,
        )
        if before is None or before[0] != samples:
            self.changed = True
            if self.synced:
                self.moved.add((namespace, name))
                self.request()
        return namespace, name

    def _dropped(self, key: Key) -> None:
        if self.held.pop(key, None) is not None:
            self.changed = True

    def _listed(self) -> None:
        self.synced = True
        self.request()

    def _event(self, event: str, obj: Obj) -> None:
        if event == "DELETED":
            namespace, name, _, _ = meta_of(obj)
            self._dropped((namespace, name))
            if self.synced:
                self.request()
            return
        self._stored(obj)

    # --- the fit and its writes ------------------------------------------------------------------------

    async def reconcile(self, key: tuple[str, str]) -> None:
        """Refit when a profile's samples changed since the last fit; write the ConfigMap when it
        differs, at most once per ``calibrationWriteSeconds`` unless a factor moved beyond its noise (a
        write put off is made when the interval is up); hand the shares to ``write_shares``."""
        if not self.synced or (self.settled and not self.changed and not self.exploring_changed):
            return  # before the first list ends (it asks again), or nothing to read or write
        namespace = key[0]
        shared, config = self.shared, self.shared.config
        configmap = await shared.io.get_configmap(namespace, CONFIGMAP_NAME)
        written = current_calibration(configmap)
        if self.changed:
            self.changed = False
            moved, self.moved = self.moved, set()
            samples = [s for held in self.held.values() for s in held[0]]
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            # pure, and minutes of CPU at tens of thousands of workloads the first time: in a thread,
            # so the event loop goes on answering /healthz, renewing the Lease and reconciling meanwhile
            began = time.monotonic()
            fitted = await asyncio.to_thread(
                _fit_and_release, samples, shared.catalog, updated_at=now, memo=self.memo
            )
            shared.metrics.calibration_fit.observe(time.monotonic() - began)
            self.current = self._dated(keep_unchanged_dates(fitted, written))
            self.fresh.update(dict.fromkeys(moved))
        calibration = self.current
        if self._shares_to_write(calibration):
            self.shares_queue.add(self.key)
        self.exploring_changed = False
        data = published_calibration(
            dataclasses.replace(calibration, exploring=under_way(self.exploring.values()))
        )
        self.settled = configmap is not None and string_map(configmap.get("data")) == data
        if self.settled:
            return
        loop = asyncio.get_running_loop()
        since = None if self.written_at is None else loop.time() - self.written_at
        wait = calibration_write_wait(
            calibration,
            written,
            since_write=since,
            interval=config.calibration_write_seconds,
            min_runs=config.min_calibration_runs,
        )
        if wait > 0:
            self._again(wait)
            return
        reason = "interval" if since is None or since >= config.calibration_write_seconds else "moved"
        self.written_at = loop.time()
        refused = await self._write_configmap(
            namespace, data, reason, products=len(calibration.products), exists=configmap is not None
        )
        self.settled = not refused
        if refused:
            self._again(config.calibration_write_seconds)

    async def write_shares(self, key: tuple[str, str]) -> None:
        """Write every profile's ``calibratedShares`` that differs from the last fit's, the fit's
        latest when the round starts, at most one round per ``calibrationWriteSeconds``; those refused,
        or changed meanwhile, in the next round."""
        loop, interval = asyncio.get_running_loop(), self.shared.config.calibration_write_seconds
        since = None if self.shares_written_at is None else loop.time() - self.shares_written_at
        if since is not None and since < interval:
            self._shares_again(interval - since)
            return
        wanted = self._shares_to_write(self.current)
        if not wanted:
            return
        waited = loop.time() - (self.shares_since or loop.time())
        if self.counting() and waited < SHARES_PATIENCE * interval:
            self.shares_since = loop.time() - waited
            self._shares_again(interval)
            return
        self.shares_since = None
        each = self._round(wanted)

        async def writer() -> int:
            return sum([await self._write_shares(profile_key, body) for profile_key, body in each])

        self.shares_written_at = loop.time()
        if sum(await asyncio.gather(*(writer() for _ in range(SHARES_WRITERS)))):
            self._shares_again(interval)

    def _dated(self, fitted: Calibration) -> Calibration:
        """``fitted`` with each workload's ``updatedAt`` kept from the shares its profile holds where
        the fit did not change them (the same runs, after a restart, write nothing)."""
        held = {workload: shares for _, workload, shares in self.held.values()}
        workloads: dict[str, WorkloadShares] = {}
        for name, shares in fitted.workloads.items():
            namespace, workload = name.split("/", 1)
            was = profile_shares(namespace, workload, held.get(name))
            workloads[name] = (
                dataclasses.replace(shares, updated_at=was.updated_at)
                if was is not None and was.same_fit(shares)
                else shares
            )
        return Calibration(fitted.products, workloads)

    def _round(self, wanted: dict[Key, dict[str, Any] | None]) -> Iterator[tuple[Key, dict[str, Any] | None]]:
        """A round's writes, shared by its writers: first each profile whose own samples a fit took in
        (a finished run's: its workload's ranking is the one that moved), at the latest fit, also where
        that fit ended while the round was under way; then the rest of ``wanted`` in order. A round of
        20,000 profiles takes minutes; a run's own profile does not wait behind it."""
        while True:
            if self.fresh:
                key = next(iter(self.fresh))
                del self.fresh[key]
                wanted.pop(key, None)
                held = self.held.get(key)
                body = None if held is None else _shares_body(self.current, held[1])
                if held is not None and body != held[2]:
                    yield key, body
                continue
            if not wanted:
                return
            key = next(iter(wanted))
            yield key, wanted.pop(key)

    def _shares_to_write(self, calibration: Calibration) -> dict[Key, dict[str, Any] | None]:
        """By profile: the ``calibratedShares`` to write where it holds other ones (None: remove them,
        the workload no longer re-fitted)."""
        found: dict[Key, dict[str, Any] | None] = {}
        for profile_key, (_, workload, shares) in self.held.items():
            wanted = _shares_body(calibration, workload)
            if wanted != shares:
                found[profile_key] = wanted
        return found

    def _again(self, wait: float) -> None:
        if self.due is None:
            self.due = asyncio.get_running_loop().call_later(wait, self._is_due)

    def _is_due(self) -> None:
        self.due = None
        self.request()

    def _shares_again(self, wait: float) -> None:
        if self.shares_due is None:
            self.shares_due = asyncio.get_running_loop().call_later(wait, self._shares_are_due)

    def _shares_are_due(self) -> None:
        self.shares_due = None
        self.shares_queue.add(self.key)

    async def _write_configmap(
        self, namespace: str, data: dict[str, str], reason: str, *, products: int, exists: bool
    ) -> int:
        """Write the factors; 1 when the API server refused (reported: Event, metric, log), else 0."""
        shared = self.shared
        try:
            await shared.io.publish_configmap(namespace, CONFIGMAP_NAME, data, exists=exists)
        except ApiException as exc:
            shared.metrics.calibration_write_failures.labels("configmap", str(exc.status)).inc()
            note = (
                f"the API server refused calibration.json ({len(data[next(iter(data))].encode())} bytes): "
                f"{exc.status} {exc.reason}; tried again in {shared.config.calibration_write_seconds:g} s"
            )
            log.error("calibration not written", extra={"configMap": CONFIGMAP_NAME, "reason": note})
            configmap = {"metadata": {"name": CONFIGMAP_NAME, "namespace": namespace}}
            await shared.report(configmap, "ConfigMap", "CalibrationNotWritten", note, detail=str(exc.status))
            return 1
        shared.metrics.calibration_writes.labels(reason).inc()
        log.info(
            "calibration written",
            extra={"namespace": namespace, "configMap": CONFIGMAP_NAME, "products": products},
        )
        return 0

    async def _write_shares(self, key: Key, body: dict[str, Any] | None) -> int:
        """Write one profile's ``status.calibratedShares``; 1 when refused (counted), else 0."""
        try:
            await self.shared.io.patch_profile_status(key[0], key[1], {"calibratedShares": body})
        except ApiException as exc:
            if exc.status == 404:
                return 0  # the profile is gone: its watch event drops it
            self.shared.metrics.calibration_write_failures.labels("shares", str(exc.status)).inc()
            log.error(
                "calibrated shares not written", extra={"profile": f"{key[0]}/{key[1]}", "reason": exc.reason}
            )
            return 1
        held = self.held.get(key)
        if held is not None:
            self.held[key] = (held[0], held[1], body)
        return 0
