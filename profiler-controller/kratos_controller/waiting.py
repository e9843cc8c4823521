"""Pods that wait for an acceptable GPU product (DESIGN "Wait or run slow"): what admission's cut costs,
told where it shows.

An object whose hints record keeps products off (``keptOff``) is narrowed: its Pods may run only on
the acceptable products, and under load they wait for one. Every ``CHECK_SECONDS`` this controller
looks at the unbound Pods of the narrowed objects it knows (a bare Pod, or a Job's Pods), adds the
seconds each waited since the last look to ``kratos_acceptable_wait_seconds_total``, and gives a Pod
that has waited longer than its predicted runtime on its best product (the record's ``bestSeconds``;
``UNKNOWN_RUNTIME_SECONDS`` where no run of the workload gave one) one Event ``WaitingForProduct``
naming the products it is kept off, their predicted slowdowns, and how to change that.

Only narrowed objects are tracked, and a Job's Pods are listed only while it has waited past a
look's interval: at rest, with nothing narrowed and waiting, it asks the API server nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kratos_admit.decisions.escape import escape_under_way
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_list, as_mapping, string_map
from kratos_admit.domain.workload import Kind
from kratos_controller.escapes import Escapes, Waiting
from kratos_controller.faults import finished, timestamp
from kratos_controller.runtime import Obj, Shared, meta_of

log = logging.getLogger("kratos.controller")

CHECK_SECONDS = 30.0
# where no run of the workload has given its runtime a unit: the Event after this long a wait
UNKNOWN_RUNTIME_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class Narrowed:
    """What a narrowed object's hints record says of its cut."""

    cap: float
    kept_off: tuple[tuple[str, float], ...]  # (product, predicted slowdown)
    best: str
    best_seconds: float | None

    @property
    def patience(self) -> float:
        """How long one of its Pods may wait before it is told."""
        return self.best_seconds if self.best_seconds is not None else UNKNOWN_RUNTIME_SECONDS

    def note(self, waited: float) -> str:
        predicted = (
            f"longer than its predicted {self.best_seconds:.0f} s on its best product {self.best}"
            if self.best_seconds is not None
            else f"{UNKNOWN_RUNTIME_SECONDS:.0f} s (no run of its workload yet gives its runtime) for its best "
            f"product {self.best}"
        )
        kept = ", ".join(f"{product} ({slowdown:g}x)" for product, slowdown in self.kept_off)
        return (
            f"waited {waited:.0f} s for an acceptable GPU product, {predicted}; kept off {kept}: predicted "
            f"more than maxSlowdown {self.cap:g} times slower than its best. Set the annotation "
            f'{v.MAX_SLOWDOWN_ANNOTATION}: "none" (or a larger number) on the Job or Pod to let it run there'
        )


def narrowed_by(obj: Mapping[str, Any]) -> Narrowed | None:
    """The cut an object's hints record names (None: not narrowed, or no readable record)."""
    annotations = string_map(as_mapping(obj.get("metadata")).get("annotations"))
    try:
        record = as_mapping(json.loads(annotations.get(v.HINTS_ANNOTATION, "{}")))
    except ValueError:
        return None
    kept = [as_mapping(k) for k in as_list(record.get("keptOff"))]
    acceptable = [as_mapping(a) for a in as_list(record.get("acceptable"))]
    if not kept or not acceptable:
        return None
    best = record.get("bestSeconds")
    return Narrowed(
        cap=float(record.get("maxSlowdown") or 0),
        kept_off=tuple((str(k.get("product", "")), float(k.get("slowdown") or 0)) for k in kept),
        best=str(acceptable[0].get("product", "")),
        best_seconds=float(best) if isinstance(best, int | float) and best > 0 else None,
    )


def unbound(pod: Mapping[str, Any]) -> bool:
    """A Pod still waiting for a Node: Pending, not bound, not being deleted."""
    meta, spec, status = (as_mapping(pod.get(k)) for k in ("metadata", "spec", "status"))
    return (
        not spec.get("nodeName")
        and status.get("phase", "Pending") == "Pending"
        and not meta.get("deletionTimestamp")
    )


def finished_pod(pod: Mapping[str, Any]) -> bool:
    return as_mapping(pod.get("status")).get("phase") in ("Succeeded", "Failed")


def created(obj: Mapping[str, Any]) -> dt.datetime | None:
    return timestamp(as_mapping(obj.get("metadata")).get("creationTimestamp"))


class WaitController:
    """Keyed by (kind, namespace, name) of the narrowed objects the informers have shown it."""

    def __init__(self, shared: Shared, *, check_seconds: float = CHECK_SECONDS) -> None:
        self.shared = shared
        self.check_seconds = check_seconds
        self.narrowed: dict[tuple[Kind, str, str], tuple[Obj, Narrowed]] = {}
        self.seen: dict[str, float] = {}  # Pod uid -> the waited seconds already counted
        self.told: set[str] = set()  # Pod uids given the Event
        self.escapes = Escapes(shared)

    def watch(self, obj: Obj, kind: Kind) -> None:
        namespace, name, _, _ = meta_of(obj)
        key = (kind, namespace, name)
        found = narrowed_by(obj)
        # a Job's Pods are looked at through their Job (listed by its name), never twice
        owned = any(
            as_mapping(o).get("kind") == "Job"
            for o in as_list(as_mapping(obj.get("metadata")).get("ownerReferences"))
        )
        done = (kind == "Job" and finished(obj) is not None) or (
            kind == "Pod" and (owned or not unbound(obj))
        )
        if found is None or done:
            self.narrowed.pop(key, None)
            return
        self.narrowed[key] = (obj, found)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.check_seconds)
            try:
                await self.check(dt.datetime.now(dt.UTC))
            except Exception:
                log.warning("could not look at the Pods waiting for an acceptable product", exc_info=True)

    async def check(self, now: dt.datetime) -> None:
        """One look: count the waits, tell the Pods that waited too long, let Jobs escape."""
        waiting: set[str] = set()
        queue: list[Waiting] = []
        under_way: list[Obj] = []
        for (kind, namespace, name), (obj, narrowed) in list(self.narrowed.items()):
            if kind == "Job" and escape_under_way(obj):
                under_way.append(obj)
                continue
            since = created(obj)
            if since is None or (now - since).total_seconds() < self.check_seconds:
                continue  # too young to have waited: no list for it
            pods = [obj] if kind == "Pod" else await self.shared.io.job_pods(namespace, name)
            for pod in pods:
                if not unbound(pod):
                    continue
                uid = str(as_mapping(pod.get("metadata")).get("uid") or meta_of(pod)[1])
                start = created(pod)
                if start is None:
                    continue
                waited = max(0.0, (now - start).total_seconds())
                waiting.add(uid)
                self.shared.metrics.acceptable_wait_seconds.inc(max(0.0, waited - self.seen.get(uid, 0.0)))
                self.seen[uid] = waited
                if waited > narrowed.patience and uid not in self.told:
                    self.told.add(uid)
                    await self.shared.report(pod, "Pod", "WaitingForProduct", narrowed.note(waited))
            starts = [s.timestamp() for s in (created(p) for p in pods if unbound(p)) if s is not None]
            if kind == "Job" and starts:
                queue.append(Waiting(min(starts), obj, tuple(p for p in pods if not finished_pod(p))))
        self.shared.metrics.waiting_for_product.set(len(waiting))
        # forget the Pods no longer waiting (bound, gone): what is kept stays as large as what waits
        self.seen = {uid: s for uid, s in self.seen.items() if uid in waiting}
        self.told &= waiting
        await self.escapes.look(now, queue, under_way)
