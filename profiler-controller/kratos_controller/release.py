"""The release controller: the followers of a workload (Jobs suspended, Pods gated, marked
``awaiting-profile``) let go with hints once its profile settles, or with base hints when the run
they wait for never started (``reconcile.release_followers`` decides; this applies)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from kratos_admit.decisions.record import recorded_ranking_source
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.workload import Kind, kueue_queue
from kratos_admit.model.calibration import Calibration
from kratos_controller.actions import ReleaseFollower
from kratos_controller.reconcile import orphan_profile, orphaned, release_followers
from kratos_controller.runtime import Obj, Shared, WorkQueue, meta_of, reconcile_backoff, reconcile_failed

log = logging.getLogger("kratos.controller")


class ReleaseController:
    """Keyed by (namespace, workload); a held Job or Pod asks for its workload. It ranks with the
    calibration controller's last fit (``calibration()``), and tells the Kueue admission check of a
    released Job (``on_job_released(namespace, name)``), when there is one."""

    def __init__(
        self,
        shared: Shared,
        *,
        calibration: Callable[[], Calibration],
        on_job_released: Callable[[str, str], None] | None = None,
        workers: int = 2,
    ) -> None:
        self.shared = shared
        self.calibration = calibration
        self.on_job_released = on_job_released
        self.queue: WorkQueue[tuple[str, str]] = WorkQueue(
            self.reconcile,
            backoff=reconcile_backoff,
            on_failure=reconcile_failed(shared.metrics, "release"),
            workers=workers,
        )

    def watch(self, obj: Obj, kind: Kind) -> None:
        namespace, _, labels, annotations = meta_of(obj)
        if v.AWAITING_PROFILE_ANNOTATION in annotations and v.WORKLOAD_LABEL in labels:
            self.queue.add((namespace, labels[v.WORKLOAD_LABEL]))

    def settled(self, namespace: str, workload: str) -> None:
        """The workload's profile turned Ready or Failed: look at its followers now."""
        self.queue.add((namespace, workload))

    async def run(self) -> None:
        await self.queue.run()

    def _followers(self, namespace: str, workload: str) -> list[tuple[Kind, Obj]]:
        found: list[tuple[Kind, Obj]] = []
        caches: tuple[tuple[Kind, dict[tuple[str, str], Obj]], ...] = (
            ("Job", self.shared.jobs),
            ("Pod", self.shared.pods),
        )
        for kind, cache in caches:
            for (ns, _), obj in cache.items():
                _, _, labels, annotations = meta_of(obj)
                if (
                    ns == namespace
                    and labels.get(v.WORKLOAD_LABEL) == workload
                    and v.AWAITING_PROFILE_ANNOTATION in annotations
                ):
                    found.append((kind, obj))
        return found

    async def reconcile(self, key: tuple[str, str]) -> None:
        namespace, workload = key
        shared = self.shared
        followers = self._followers(namespace, workload)
        if not followers:
            return
        for kind, obj in followers:
            how = (
                "suspended"
                if kind == "Job" and not kueue_queue(obj)
                else f"scheduling gate {v.PROFILE_SCHEDULING_GATE}"
                + (" in its pod template: Kueue owns its spec.suspend" if kind == "Job" else "")
            )
            await shared.report(
                obj,
                kind,
                "AwaitingProfile",
                f"held ({how}) until the profiling run of workload {workload} ends",
            )
        raw = await shared.io.get_profile(namespace, v.profile_name(workload))
        if raw is None:
            running = any(
                meta_of(job)[2].get(v.ROLE_LABEL) == "profiling"
                and meta_of(job)[2].get(v.WORKLOAD_LABEL) == workload
                for (ns, _), job in shared.jobs.items()
                if ns == namespace
            )
            now = dt.datetime.now(dt.UTC)
            grace = shared.config.follower_release_seconds
            followers = [
                (kind, obj) for kind, obj in followers if not running and orphaned(obj, now=now, grace=grace)
            ]
            if not followers:
                return
            profile = orphan_profile(namespace, workload)
        else:
            profile = WorkloadProfile.model_validate(raw)
        products, gpus = await shared.io.gpu_inventory() if profile.ready else (frozenset[str](), {})
        actions = release_followers(
            profile,
            followers,
            node_products=products,
            product_gpus=gpus,
            config=shared.config,
            catalog=shared.catalog,
            signing_key=shared.signing_key,
            calibration=self.calibration(),
        )
        held = {(kind, meta_of(obj)[1]): obj for kind, obj in followers}
        for action in actions:
            await shared.io.apply(action)
            if isinstance(action, ReleaseFollower):
                how = (
                    f"ranked hints from WorkloadProfile {profile.metadata.name}"
                    if profile.ready
                    else f"base hints: WorkloadProfile {profile.metadata.name} is not Ready"
                )
                await shared.report(
                    held[(action.kind, action.name)], action.kind, "Released", f"released with {how}"
                )
                shared.metrics.hints.labels(recorded_ranking_source(action.released)).inc()
                if action.kind == "Job" and self.on_job_released is not None:
                    self.on_job_released(namespace, action.name)  # its Workload's check: Ready
                log.info(
                    "follower released",
                    extra={
                        "namespace": namespace,
                        "kind": action.kind,
                        "objectName": action.name,
                        "profile": profile.metadata.name,
                    },
                )
