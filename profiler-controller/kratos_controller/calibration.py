"""The calibration controller: every GPU product's calibration (and every workload's shares) refitted
from all profiles' counted runs (listed a page at a time, each folded into the fit's samples), into the
ConfigMap ``kratos-gpu-calibration`` (``learning.calibrate_samples`` decides; this applies, at the write cadence of ``learning.calibration_write_wait``)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

from kratos_admit.model.calibration import CONFIGMAP_NAME, NO_CALIBRATION, Calibration, Sample
from kratos_controller.learning import (
    calibrate_samples,
    calibration_write_wait,
    current_calibration,
    profile_samples,
)
from kratos_controller.runtime import Shared, WorkQueue, reconcile_backoff, reconcile_failed

log = logging.getLogger("kratos.controller")


class CalibrationController:
    """One key: the ConfigMap in the KRATOS namespace. Asked for at start (what the runs counted so
    far say, after a restart too), at every resync, and after each counted run (``request``)."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.key = (shared.config.lease_namespace, CONFIGMAP_NAME)
        self.current: Calibration = NO_CALIBRATION  # the last fit, for releasing followers
        self.written_at: float | None = None  # loop time of this controller's last write
        self.due: asyncio.TimerHandle | None = None  # a write put off (calibrationWriteSeconds)
        self.queue: WorkQueue[tuple[str, str]] = WorkQueue(
            self.reconcile,
            backoff=reconcile_backoff,
            on_failure=reconcile_failed(shared.metrics, "calibrate"),
        )

    def request(self) -> None:
        self.queue.add(self.key)

    def calibration(self) -> Calibration:
        return self.current

    async def run(self) -> None:
        self.request()
        await self.queue.run()

    async def reconcile(self, key: tuple[str, str]) -> None:
        """Refit; write the ConfigMap if it changed, at most once per ``calibrationWriteSeconds``
        unless a factor moved beyond its noise (a write put off is made when the interval is up; the
        runs stay in the profiles, so a restart loses none)."""
        namespace = key[0]
        shared, config = self.shared, self.shared.config
        configmap = await shared.io.get_configmap(namespace, CONFIGMAP_NAME)
        samples: list[Sample] = []
        async for page in shared.io.profile_pages():  # folded into samples a page at a time
            samples += profile_samples(
                page, catalog=shared.catalog, reference_product=config.reference_product
            )
        # the fit is pure and, at tens of thousands of profiles, minutes of CPU: in a thread, so the
        # event loop goes on answering /healthz, renewing the Lease and reconciling meanwhile
        calibration, action = await asyncio.to_thread(
            calibrate_samples,
            samples,
            configmap,
            namespace=namespace,
            catalog=shared.catalog,
            now=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        self.current = calibration
        if action is None:
            return
        loop = asyncio.get_running_loop()
        since = None if self.written_at is None else loop.time() - self.written_at
        wait = calibration_write_wait(
            calibration,
            current_calibration(configmap),
            since_write=since,
            interval=config.calibration_write_seconds,
            min_runs=config.min_calibration_runs,
        )
        if wait > 0:
            if self.due is None:
                self.due = loop.call_later(wait, self._is_due)
            return
        reason = "interval" if since is None or since >= config.calibration_write_seconds else "moved"
        await shared.io.apply(action)
        self.written_at = loop.time()
        shared.metrics.calibration_writes.labels(reason).inc()
        log.info(
            "calibration written",
            extra={
                "namespace": namespace,
                "configMap": CONFIGMAP_NAME,
                "products": len(calibration.products),
            },
        )

    def _is_due(self) -> None:
        self.due = None
        self.request()
