"""What the manager lends each controller, as controller-runtime's manager does: the client, the
shared informers' caches, the Event recorder and the settings (``Shared``), and a work queue of the
controller's own (``WorkQueue``)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, Generic, Literal, TypeVar

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.raw import as_mapping, string_map
from kratos_admit.domain.workload import Kind
from kratos_admit.edge.kube import Backoff, one_line
from kratos_admit.model.catalog import Catalog
from kratos_controller.events import Reason, Regarding, event_body
from kratos_controller.kube_io import KubeIO
from kratos_controller.metrics import ControllerMetrics

log = logging.getLogger("kratos.controller")
Obj = dict[str, Any]
Cache = dict[tuple[str, str], Obj]  # (namespace, name) -> the object as last listed or watched
K = TypeVar("K", bound=Hashable)


def meta_of(obj: Obj) -> tuple[str, str, dict[str, str], dict[str, str]]:
    """An object's namespace, name, labels and annotations."""
    meta = as_mapping(obj.get("metadata"))
    return (
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        string_map(meta.get("labels")),
        string_map(meta.get("annotations")),
    )


class Shared:
    """The manager's client, caches and recorder, one set for every controller: the Job and Pod
    informers fill ``jobs`` and ``pods`` (KRATOS's opted-in objects only), and each controller reads
    them instead of asking the API server again."""

    def __init__(
        self,
        io: KubeIO,
        *,
        config: Config,
        catalog: Catalog,
        signing_key: bytes,
        metrics: ControllerMetrics,
        identity: str,
    ) -> None:
        self.io = io
        self.config = config
        self.catalog = catalog
        self.signing_key = signing_key
        self.metrics = metrics
        self.identity = identity  # reportingInstance of its Events
        self.jobs: Cache = {}
        self.pods: Cache = {}

    async def report(
        self,
        obj: Obj,
        kind: Kind | Literal["WorkloadProfile", "Secret", "ConfigMap"],
        reason: Reason,
        note: str,
        detail: str = "",
    ) -> None:
        """An Event about ``obj`` (best effort: see ``KubeIO.record``)."""
        api_version = {"Job": "batch/v1", "Pod": "v1", "Secret": "v1", "ConfigMap": "v1"}.get(
            kind, v.API_VERSION
        )
        regarding = Regarding.of(obj, api_version=api_version, kind=kind)
        now = dt.datetime.now(dt.UTC)
        await self.io.record(
            event_body(regarding, reason, note, instance=self.identity, now=now, detail=detail)
        )


class WorkQueue(Generic[K]):
    """client-go's rate-limited work queue: a key waits in it once, is never handled by two workers
    at once, and one added while it is being handled is handled again afterwards; a key whose
    handling raised comes back after its backoff (``on_failure`` says so, with the delay)."""

    def __init__(
        self,
        handle: Callable[[K], Awaitable[None]],
        *,
        backoff: Callable[[], Backoff],
        on_failure: Callable[[K, Exception, float], None],
        workers: int = 1,
    ) -> None:
        self.handle = handle
        self.backoff = backoff
        self.on_failure = on_failure
        self.workers = workers
        self.queue: asyncio.Queue[K] = asyncio.Queue()
        self.queued: set[K] = set()
        self.processing: set[K] = set()
        self.dirty: set[K] = set()
        self.attempts: dict[K, Backoff] = {}

    def add(self, key: K) -> None:
        if key in self.processing:
            self.dirty.add(key)
        elif key not in self.queued:
            self.queued.add(key)
            self.queue.put_nowait(key)

    def busy(self) -> bool:
        """Whether a key waits or is being handled."""
        return bool(self.queued or self.processing)

    def add_after(self, delay: float, key: K) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, self.add, key)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            self.queued.discard(key)
            self.processing.add(key)
            try:
                await self.handle(key)
                self.attempts.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = self.attempts.setdefault(key, self.backoff()).next_delay()
                self.on_failure(key, exc, delay)
                self.add_after(delay, key)
            finally:
                self.processing.discard(key)
                if key in self.dirty:
                    self.dirty.discard(key)
                    self.add(key)

    async def run(self) -> None:
        await asyncio.gather(*(self._worker() for _ in range(self.workers)))


def reconcile_failed(
    metrics: ControllerMetrics, work: str
) -> Callable[[tuple[str, str], Exception, float], None]:
    """The failure hook of a controller keyed by (namespace, name): counted, and logged on one line."""

    def failed(key: tuple[str, str], exc: Exception, delay: float) -> None:
        metrics.reconcile_errors.inc()
        log.warning(
            "reconcile failed, retrying",
            extra={
                "work": work,
                "namespace": key[0],
                "job": key[1],
                "reason": one_line(exc),
                "retryIn": round(delay, 2),
            },
        )

    return failed


def reconcile_backoff() -> Backoff:
    return Backoff(base=1.0, cap=60.0)


async def run_together(runs: list[Coroutine[Any, Any, None]]) -> None:
    """Runs each coroutine as a task until the first fails or this is cancelled, then cancels the
    rest and waits until each has ended, so none outlives the component that started it."""
    tasks = [asyncio.create_task(run) for run in runs]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
