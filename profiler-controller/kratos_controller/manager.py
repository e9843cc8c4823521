"""The manager, as controller-runtime's runs several small controllers: one Job informer and one Pod
informer (KRATOS's opted-in objects), whose caches and events every controller shares; the leader
election they run under; and the controllers, each with a work queue of its own:

- ``profiling``: a profiling Job's run -> the profile -> the execution Job (``profiling.py``);
- ``release``: the followers of a workload, once its profile settles (``release.py``);
- ``observation``: a finished hinted Job's runs, per GPU product (``observation.py``);
- ``calibration``: every product's calibration, from all counted runs (``calibration.py``);
- ``telemetry``, with ``telemetry.prometheusURL``: a Pod's DCGM counters (``telemetry.py``).

Beside them run the optional Kueue admission check (its own informers) and the certificate renewal.
Every controller sees every informer event and resync, and queues what it is concerned with; a
controller tells another only through the callbacks wired here (a settled profile releases its
followers; counted runs refit the calibration).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from kubernetes_asyncio import client

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.workload import Kind
from kratos_admit.edge.kube import Informer, Sweep
from kratos_admit.edge.kueue import KueueApi
from kratos_admit.edge.prometheus import Prometheus
from kratos_admit.model.catalog import Catalog, load_catalog
from kratos_controller.admission_check import AdmissionCheckController
from kratos_controller.calibration import CalibrationController
from kratos_controller.kube_io import KubeIO
from kratos_controller.leader import LeaderElector
from kratos_controller.metrics import ControllerMetrics
from kratos_controller.observation import ObservationController
from kratos_controller.profiling import ProfilingController
from kratos_controller.release import ReleaseController
from kratos_controller.renewal import CertificateRenewal
from kratos_controller.runtime import Cache, Obj, Shared, meta_of, run_together
from kratos_controller.telemetry import TelemetryController
from kratos_controller.waiting import WaitController

log = logging.getLogger("kratos.controller")


class Watcher(Protocol):
    """A controller as the manager drives it: told of every object the informers see, and run."""

    def watch(self, obj: Obj, kind: Kind) -> None: ...

    async def run(self) -> None: ...


def unmanaged(obj: Obj) -> Obj:
    """``obj`` (as listed or watched: the cache's own) without ``metadata.managedFields``, which no
    controller reads and writes never send back (they are JSON patches of what changed): an entry per
    writer naming every field it wrote, a good part of a cached Pod."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


class Manager:
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
        config = config or Config()
        self.shared = Shared(
            KubeIO(api),
            config=config,
            catalog=catalog or load_catalog(config.catalog_file),
            signing_key=signing_key,
            metrics=metrics,
            identity=identity,
        )
        self.io, self.config, self.metrics = self.shared.io, config, metrics
        self.jobs, self.pods = self.shared.jobs, self.shared.pods
        self.resync_seconds = resync_seconds
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
            if config.kueue_admission_check
            else None
        )
        self.renewal = CertificateRenewal(
            api,
            namespace=config.lease_namespace,
            renew_before=config.certificate_renew_before,
            resync_seconds=resync_seconds,
            on_outcome=lambda outcome: metrics.certificate_renewals.labels(outcome).inc(),
            on_expiry=lambda which, at: metrics.certificate_expiry.labels(which).set(at),
            report=lambda secret, reason, note, detail: self.shared.report(
                secret, "Secret", reason, note, detail
            ),
        )
        telemetry = config.telemetry
        prometheus = prometheus or (Prometheus(telemetry) if telemetry.prometheus_url else None)
        self.telemetry = TelemetryController(self.shared, prometheus) if prometheus is not None else None
        self.calibration = CalibrationController(self.shared, watch_timeout=watch_timeout)
        self.release = ReleaseController(
            self.shared,
            calibration=self.calibration.calibration,
            on_job_released=self.admission_checks.job_changed if self.admission_checks is not None else None,
        )
        self.profiling = ProfilingController(self.shared, on_settled=self.release.settled)
        self.observation = ObservationController(
            self.shared,
            on_counted=self.calibration.request,
            on_job_pods=self.telemetry.job_pods_seen if self.telemetry is not None else None,
        )
        self.calibration.counting = self.observation.queue.busy  # the runs' counts before the shares
        self.waiting = WaitController(self.shared)
        self.controllers: list[Watcher] = [self.profiling, self.release, self.observation, self.waiting]
        if self.telemetry is not None:
            self.controllers.append(self.telemetry)
        metrics.profiling_deadline.set(config.profiling_deadline_seconds)
        metrics.watch_held(lambda: [*self.jobs.values(), *self.pods.values()])
        metrics.caches(
            {
                "Job": (self.informer.synced.is_set, self.jobs),
                "Pod": (self.pod_informer.synced.is_set, self.pods),
            }
        )

    def _informer(
        self, list_all: Callable[..., Any], cache: Cache, kind: Kind, watch_timeout: int
    ) -> Informer:
        """List+watch of every opted-in object of ``kind`` (profiling runs, followers, hinted runs)."""
        return Informer(
            list_all,
            name=f"kratos-{kind.lower()}s",
            label_selector=v.WORKLOAD_LABEL,
            fold=Sweep(
                lambda obj: self._cached(cache, obj, kind),
                cache.keys,
                lambda key: self._gone(cache, key, kind),
            ),
            on_event=lambda event, obj: self._event(cache, event, obj, kind),
            watch_timeout=watch_timeout,
        )

    def _dispatch(self, obj: Obj, kind: Kind) -> None:
        if kind == "Job":
            self.calibration.job_seen(obj)  # the exploring Jobs under way, published with the factors
        for controller in self.controllers:
            controller.watch(obj, kind)

    def _event(self, cache: Cache, event: str, obj: Obj, kind: Kind) -> None:
        if event == "DELETED":
            namespace, name, _, _ = meta_of(obj)
            self._gone(cache, (namespace, name), kind)
            return
        self._cached(cache, obj, kind)

    def _gone(self, cache: Cache, key: tuple[str, str], kind: Kind) -> None:
        """An object deleted (its watch event, or missing from a relist)."""
        cache.pop(key, None)
        if kind == "Job":
            self.calibration.job_gone(key)

    def _cached(self, cache: Cache, obj: Obj, kind: Kind) -> tuple[str, str]:
        """``obj`` stored (without managedFields) and told to every controller; its key. A relist's
        pages come here one object at a time (the Informer's ``Sweep``), as the watch's events do."""
        namespace, name, _, _ = meta_of(obj)
        cache[(namespace, name)] = unmanaged(obj)
        self._dispatch(obj, kind)
        return namespace, name

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_seconds)
            self.calibration.recheck()
            caches: tuple[tuple[Kind, Cache], ...] = (("Job", self.jobs), ("Pod", self.pods))
            for kind, cache in caches:
                for obj in list(cache.values()):
                    self._dispatch(obj, kind)

    def unready_reason(self, tolerance: float) -> str:
        """Why the manager cannot do its work ("" when it can): a list or watch of its Jobs or Pods
        failing for longer than ``tolerance`` seconds (refused, or the API away)."""
        for informer in (self.informer, self.pod_informer):
            if informer.failing.longer_than(tolerance):
                return f"{informer.name} list/watch failing: {informer.failing.reason}"
        return ""

    async def run(self) -> None:
        runs = [self.informer.run(), self.pod_informer.run(), self._resync(), self.calibration.run()]
        runs += [controller.run() for controller in self.controllers]
        if self.admission_checks is not None:
            runs.append(self.admission_checks.run())
        runs.append(self.renewal.run())
        try:
            await run_together(runs)
        finally:
            if self.telemetry is not None:
                await self.telemetry.close()


async def run_when_leading(manager: Manager, elector: LeaderElector) -> None:
    """Run the manager only while holding the Lease; return (to exit and be restarted) when
    leadership is lost."""
    election = asyncio.create_task(elector.run())
    try:
        await elector.leading.wait()
        manager.metrics.leader.set(1)
        work = asyncio.create_task(manager.run())
        lost = asyncio.create_task(elector.lost.wait())
        await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        lost.cancel()
    finally:
        manager.metrics.leader.set(0)
        election.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await election
