"""The calibration controller: every GPU product's calibration, and every workload's re-fitted shares,
from the samples of all profiles' counted runs, kept per profile from the profiles' own watch (issue
59: no list at resync, no refit while nothing changed, and each refit re-fits only the shares a change
moved, ``FitMemo``). The factors go to the ConfigMap ``kratos-gpu-calibration`` (whose size grows with
the GPU products only), each workload's shares to its profile's ``status.calibratedShares``, at the
write cadence of ``learning.calibration_write_wait``. A refused write is a warning Event on the
ConfigMap, the metric ``kratos_calibration_write_failures_total`` and an error log line, and is tried
again (the write alone, never the fit) after ``calibrationWriteSeconds``."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
import logging
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_mapping, string_map
from kratos_admit.edge.kube import Informer, Sweep
from kratos_admit.model.calibration import (
    CONFIGMAP_NAME,
    NO_CALIBRATION,
    Calibration,
    Sample,
    WorkloadShares,
    keep_unchanged_dates,
    profile_shares,
)
from kratos_admit.model.calibration_fit import FitMemo, fit_calibration
from kratos_controller.learning import (
    calibration_write_wait,
    current_calibration,
    profile_samples,
    published_calibration,
)
from kratos_controller.runtime import Obj, Shared, WorkQueue, meta_of, reconcile_backoff, reconcile_failed

log = logging.getLogger("kratos.controller")
Key = tuple[str, str]


# what the controller keeps of one profile: its samples, its workload (namespace/workload, as the
# calibration keys its shares) and the shares its status holds
Held = tuple[tuple[Sample, ...], str, dict[str, Any] | None]


class CalibrationController:
    """One key: the ConfigMap in the KRATOS namespace. Asked for once the profiles' first list is in
    (a full fit), when a profile's samples change, at every resync (a write put off or refused is
    made; nothing is refitted), and after each counted run (``request``)."""

    def __init__(self, shared: Shared, *, watch_timeout: int = 300) -> None:
        self.shared = shared
        self.key = (shared.config.lease_namespace, CONFIGMAP_NAME)
        self.current: Calibration = NO_CALIBRATION  # the last fit, for releasing followers
        self.held: dict[Key, Held] = {}
        self.memo = FitMemo()
        self.changed = True  # samples changed since the last fit
        self.synced = False
        self.fits = 0
        self.written_at: float | None = None  # loop time of this controller's last write
        self.due: asyncio.TimerHandle | None = None  # a write put off (calibrationWriteSeconds) or refused
        self.queue: WorkQueue[tuple[str, str]] = WorkQueue(
            self.reconcile,
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

    def calibration(self) -> Calibration:
        return self.current

    async def run(self) -> None:
        await asyncio.gather(self.informer.run(), self.queue.run())

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
        """Refit when a profile's samples changed since the last fit; write the ConfigMap and the
        profiles' shares that differ from what they hold, at most once per ``calibrationWriteSeconds``
        unless a factor moved beyond its noise (a write put off is made when the interval is up)."""
        if not self.synced:
            return  # the first list's end asks again
        namespace = key[0]
        shared, config = self.shared, self.shared.config
        configmap = await shared.io.get_configmap(namespace, CONFIGMAP_NAME)
        written = current_calibration(configmap)
        if self.changed:
            self.changed = False
            samples = [s for held in self.held.values() for s in held[0]]
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            # pure, and minutes of CPU at tens of thousands of workloads the first time: in a thread,
            # so the event loop goes on answering /healthz, renewing the Lease and reconciling meanwhile
            fitted = await asyncio.to_thread(
                fit_calibration, samples, shared.catalog, updated_at=now, memo=self.memo
            )
            self.current = self._dated(keep_unchanged_dates(fitted, written))
            self.fits += 1
        calibration = self.current
        data = published_calibration(calibration)
        shares = self._shares_to_write(calibration)
        same_configmap = configmap is not None and string_map(configmap.get("data")) == data
        if same_configmap and not shares:
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
        refused = 0
        if not same_configmap:
            refused += await self._write_configmap(namespace, data, reason, len(calibration.products))
        for profile_key, body in shares.items():
            refused += await self._write_shares(profile_key, body)
        if refused:
            self._again(config.calibration_write_seconds)

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

    def _shares_to_write(self, calibration: Calibration) -> dict[Key, dict[str, Any] | None]:
        """By profile: the ``calibratedShares`` to write where it holds other ones (None: remove them,
        the workload no longer re-fitted)."""
        found: dict[Key, dict[str, Any] | None] = {}
        for profile_key, (_, workload, shares) in self.held.items():
            fitted = calibration.workloads.get(workload)
            wanted = fitted.as_dict() if fitted is not None else None
            if wanted != shares:
                found[profile_key] = wanted
        return found

    def _again(self, wait: float) -> None:
        if self.due is None:
            self.due = asyncio.get_running_loop().call_later(wait, self._is_due)

    def _is_due(self) -> None:
        self.due = None
        self.request()

    async def _write_configmap(self, namespace: str, data: dict[str, str], reason: str, products: int) -> int:
        """Write the factors; 1 when the API server refused (reported: Event, metric, log), else 0."""
        shared = self.shared
        try:
            await shared.io.publish_configmap(namespace, CONFIGMAP_NAME, data)
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
