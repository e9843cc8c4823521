"""The load-aware half of "Wait or run slow" (DESIGN): a narrowed Job that finds no acceptable GPU
product with room escapes onto a product the cap keeps it off, where that product has room now and
the Job is predicted to finish there before it would on any acceptable product, the Pods running
there and the Jobs ahead of it in the queue counted (Lin and Kumar's threshold: the slow server only
once the queue for the fast one is long enough). It never waits for a kept-off product.

Pure. ``finish_time`` and ``escape_product`` are the rule, shared by ``simulate`` (the model's
replay) and the controller (a cluster's Nodes and Pods, read by ``Occupancy``). ``escaping`` and
``escaped`` are the two writes of a Job's escape: suspended with the plan in its hints record, then,
once its Pods are gone and its start is reset (the API server lets a suspended Job's template
affinity change only then, ``JobMutableNodeSchedulingDirectives``), widened to the product and
resumed. Kueue does the same to a Job it stops (``pkg/controller/jobs/job``: suspend, reset
``status.startTime``, restore the scheduling directives).
"""

from __future__ import annotations

import datetime as dt
import heapq
import json
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kratos_admit.decisions.acceptable import pod_gpus
from kratos_admit.decisions.stores import node_gpus
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_list, as_mapping, child, clone, string_map
from kratos_admit.domain.signing import sign_block

# the record's key of an escape under way or done (DESIGN "Wait or run slow", "Say it")
ESCAPE_KEY = "escapedTo"
# where a running Pod's record gives no predicted runtime: it is taken to run as long again as it
# has run (the median remaining life of a heavy-tailed runtime), at least this long
UNKNOWN_REMAINING_FLOOR_SECONDS = 60.0


def finish_time(frees: Iterable[float], seconds: float, ahead: Sequence[float] = (), gpus: int = 1) -> float:
    """When a Job of ``seconds`` on ``gpus`` GPUs together ends on a product whose GPUs free at
    ``frees``: the GPUs ``ahead`` (their seconds, in queue order) each take the next GPU that frees,
    and this one the next ``gpus`` after them, starting when the last of those frees (inf where the
    product has fewer GPUs)."""
    heap = list(frees)
    if len(heap) < max(gpus, 1):
        return math.inf
    heapq.heapify(heap)
    for before in ahead:
        heapq.heappush(heap, heapq.heappop(heap) + before)
    return heapq.nsmallest(max(gpus, 1), heap)[-1] + seconds


def escape_product(
    now: float,
    predicted: Mapping[str, float],
    acceptable: Collection[str],
    *,
    room: Callable[[str], bool],
    finish: Callable[[str, float], float],
) -> tuple[str, float] | None:
    """The kept-off product (in ``predicted``, not in ``acceptable``) with ``room`` now where a Job of
    ``predicted`` seconds per product ends before ``finish(product, seconds)`` on any acceptable one,
    the soonest such, with that soonest acceptable finish (inf: none frees); None: it waits."""
    waited = min((finish(p, s) for p, s in predicted.items() if p in acceptable), default=math.inf)
    sooner = sorted(
        (now + s, p) for p, s in predicted.items() if p not in acceptable and now + s < waited and room(p)
    )
    return (sooner[0][1], waited) if sooner else None


# --- a cluster's Nodes and Pods -----------------------------------------------------------------


def _record(meta: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return dict(as_mapping(json.loads(string_map(meta.get("annotations")).get(v.HINTS_ANNOTATION, "{}"))))
    except ValueError:
        return {}


def recorded_seconds(record: Mapping[str, Any]) -> dict[str, float]:
    """Per product, the runtime a hints record predicts: its ``bestSeconds`` times each acceptable or
    kept-off product's slowdown (empty: no run of the workload has given the model a unit)."""
    best = record.get("bestSeconds")
    if not isinstance(best, int | float) or isinstance(best, bool) or best <= 0:
        return {}
    found: dict[str, float] = {}
    for entry in (as_mapping(e) for key in ("acceptable", "keptOff") for e in as_list(record.get(key))):
        slowdown = entry.get("slowdown")
        if isinstance(slowdown, int | float) and slowdown > 0:
            found[str(entry.get("product", ""))] = float(best) * float(slowdown)
    return found


def timestamp(raw: object) -> float | None:
    """An RFC 3339 time of the API (``2026-11-29T10:00:00Z``) as POSIX seconds; None if unreadable."""
    if not isinstance(raw, str):
        return None
    try:
        return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a taint keeps no Pod with these tolerations off (``PreferNoSchedule`` never does), as
    ``v1.Toleration.ToleratesTaint`` reads them: an empty key with ``Exists`` tolerates every taint."""
    effect = taint.get("effect")
    if effect not in ("NoSchedule", "NoExecute"):
        return True
    for t in tolerations:
        if t.get("effect") not in (None, "", effect):
            continue
        if t.get("operator") == "Exists" and not t.get("key"):
            return True
        if t.get("key") != taint.get("key"):
            continue
        if t.get("operator") == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _usable(node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    spec, status = as_mapping(node.get("spec")), as_mapping(node.get("status"))
    ready = any(
        as_mapping(c).get("type") == "Ready" and as_mapping(c).get("status") == "True"
        for c in as_list(status.get("conditions"))
    )
    return (
        ready
        and not spec.get("unschedulable")
        and all(tolerated(as_mapping(t), tolerations) for t in as_list(spec.get("taints")))
    )


@dataclass
class Occupancy:
    """When each GPU of each product frees, and each Node's GPUs free now, for one Pod's tolerations:
    read from the GPU Nodes and the bound, unfinished Pods at ``now`` (POSIX seconds)."""

    now: float
    frees: dict[str, list[float]] = field(default_factory=dict)  # product -> when each GPU frees
    free_now: dict[str, list[int]] = field(default_factory=dict)  # product -> each Node's free GPUs

    @classmethod
    def read(
        cls,
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        *,
        now: float,
        tolerations: Sequence[Mapping[str, Any]] = (),
    ) -> Occupancy:
        found = cls(now)
        by_node: dict[str, tuple[str, int]] = {}
        for node in nodes:
            meta = as_mapping(node.get("metadata"))
            product = string_map(meta.get("labels")).get(v.GPU_PRODUCT_LABEL, "")
            if product and _usable(node, tolerations):
                by_node[str(meta.get("name", ""))] = (product, node_gpus(node))
        held: dict[str, list[float]] = {}
        for pod in pods:
            spec, meta = as_mapping(pod.get("spec")), as_mapping(pod.get("metadata"))
            node_name = str(spec.get("nodeName") or "")
            if node_name not in by_node or as_mapping(pod.get("status")).get("phase") in (
                "Succeeded",
                "Failed",
            ):
                continue
            product = by_node[node_name][0]
            gpus = pod_gpus(spec) if _asks_gpus(spec) else 0
            held.setdefault(node_name, []).extend([found.predicted_end(pod, meta, product)] * gpus)
        for name, (product, gpus) in sorted(by_node.items()):
            ends = held.get(name, [])
            found.free_now.setdefault(product, []).append(max(gpus - len(ends), 0))
            found.frees.setdefault(product, []).extend(
                [now] * max(gpus - len(ends), 0) + sorted(ends)[: max(gpus, 0)]
            )
        return found

    def predicted_end(self, pod: Mapping[str, Any], meta: Mapping[str, Any], product: str) -> float:
        """When a running Pod frees its GPUs: its start plus its record's predicted runtime on the
        product, else as long again as it has run (``UNKNOWN_REMAINING_FLOOR_SECONDS`` at least);
        now where it is overdue."""
        started = timestamp(as_mapping(pod.get("status")).get("startTime")) or timestamp(
            meta.get("creationTimestamp")
        )
        start = min(started, self.now) if started is not None else self.now
        seconds = recorded_seconds(_record(meta)).get(product)
        if seconds is not None:
            return max(self.now, start + seconds)
        return self.now + max(self.now - start, UNKNOWN_REMAINING_FLOOR_SECONDS)

    def room(self, product: str, gpus: int, pods: int = 1) -> bool:
        """Whether the product's Nodes have room now for ``pods`` Pods of ``gpus`` GPUs each."""
        return sum(free // max(gpus, 1) for free in self.free_now.get(product, ())) >= pods

    def finish(self, product: str, seconds: float, ahead: Sequence[float] = (), gpus: int = 1) -> float:
        return finish_time(self.frees.get(product, ()), seconds, ahead, gpus)


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """What ``Occupancy`` reads of a Pod, or None for a Pod that asks no GPU: a cluster-wide list is
    kept page by page in this form, not whole (tens of thousands of Pods at the largest clusters)."""
    meta, spec, status = (as_mapping(pod.get(k)) for k in ("metadata", "spec", "status"))
    if not _asks_gpus(spec):
        return None
    record = string_map(meta.get("annotations")).get(v.HINTS_ANNOTATION)
    return {
        "metadata": {
            "creationTimestamp": meta.get("creationTimestamp"),
            "annotations": {v.HINTS_ANNOTATION: record} if record is not None else {},
        },
        "spec": {"nodeName": spec.get("nodeName"), "containers": [
            {"resources": {"limits": {v.GPU_RESOURCE: as_mapping(as_mapping(as_mapping(c).get("resources")).get("limits")).get(v.GPU_RESOURCE)}}}
            for c in as_list(spec.get("containers"))
        ]},
        "status": {"phase": status.get("phase"), "startTime": status.get("startTime")},
    }  # fmt: skip


def slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """What ``Occupancy`` reads of a Node: its name and product, taints, cordon, readiness and GPUs."""
    meta, spec, status = (as_mapping(node.get(k)) for k in ("metadata", "spec", "status"))
    labels = string_map(meta.get("labels"))
    return {
        "metadata": {"name": meta.get("name"), "labels": {k: labels[k] for k in (v.GPU_PRODUCT_LABEL, v.GPU_COUNT_LABEL) if k in labels}},
        "spec": {"taints": spec.get("taints") or [], "unschedulable": spec.get("unschedulable")},
        "status": {"allocatable": {v.GPU_RESOURCE: as_mapping(status.get("allocatable")).get(v.GPU_RESOURCE)},
                   "conditions": [c for c in as_list(status.get("conditions")) if as_mapping(c).get("type") == "Ready"]},
    }  # fmt: skip


def _asks_gpus(spec: Mapping[str, Any]) -> bool:
    return any(
        v.GPU_RESOURCE in as_mapping(as_mapping(as_mapping(c).get("resources")).get("limits"))
        for c in as_list(spec.get("containers"))
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """Where a waiting Job escapes to, and why: its predicted runtime there and its slowdown, against
    the predicted seconds from now to its end on its soonest acceptable product (None: never known)."""

    product: str
    slowdown: float
    seconds: float
    waiting: float | None

    @classmethod
    def of(cls, found: Mapping[str, Any]) -> Plan:
        """The plan a record's ``escapedTo`` holds (what ``as_dict`` wrote)."""
        waiting = found.get("acceptableFinishSeconds")
        return cls(
            str(found.get("product", "")),
            float(found.get("slowdown") or 0),
            float(found.get("predictedSeconds") or 0),
            float(waiting) if isinstance(waiting, int | float) else None,
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "product": self.product,
            "slowdown": round(self.slowdown, 2),
            "predictedSeconds": round(self.seconds, 1),
            "acceptableFinishSeconds": None if self.waiting is None else round(self.waiting, 1),
        }

    def note(self, acceptable: Sequence[str]) -> str:
        waiting = (
            "no acceptable product is predicted to free"
            if self.waiting is None
            else f"it is predicted to finish {self.waiting:.0f} s from now on {', '.join(acceptable)}, the Pods "
            "running there and the Jobs ahead of it counted"
        )
        return (
            f"no acceptable GPU product had room and {waiting}; on {self.product} (kept off, predicted "
            f"{self.slowdown:g}x slower than its best) it has room now and is predicted to finish in "
            f"{self.seconds:.0f} s: the Job was suspended before any Pod of it started, widened to "
            f"{self.product} and resumed"
        )


def job_record(job: Mapping[str, Any]) -> dict[str, Any]:
    """The hints record on a Job's own metadata ({} where none is readable)."""
    return _record(as_mapping(job.get("metadata")))


def job_gpus(job: Mapping[str, Any]) -> tuple[int, int]:
    """A Job's GPUs per Pod and the Pods that run together (its parallelism: a gang's, all at once)."""
    spec = as_mapping(job.get("spec"))
    parallelism = spec.get("parallelism")
    pods = parallelism if isinstance(parallelism, int) and parallelism > 0 else 1
    return pod_gpus(as_mapping(as_mapping(spec.get("template")).get("spec"))), pods


def plan(job: Mapping[str, Any], occupancy: Occupancy, ahead: Mapping[str, Sequence[float]]) -> Plan | None:
    """The escape of a narrowed Job that waits, or None: it waits on. ``ahead``: per product, the
    predicted seconds of the Jobs before it in the queue that wait for it, one entry per GPU. A gang
    (its parallelism's Pods at once) needs room for all its Pods and starts when its last GPU frees."""
    record = job_record(job)
    predicted = recorded_seconds(record)
    acceptable = [str(as_mapping(a).get("product", "")) for a in as_list(record.get("acceptable"))]
    if not predicted or not acceptable or ESCAPE_KEY in record:
        return None
    gpus, pods = job_gpus(job)
    now = occupancy.now
    found = escape_product(
        now,
        predicted,
        acceptable,
        room=lambda p: occupancy.room(p, gpus, pods),
        finish=lambda p, s: occupancy.finish(p, s, ahead.get(p, ()), gpus * pods),
    )
    if found is None:
        return None
    product, waited = found
    best = float(record.get("bestSeconds") or 1.0)
    return Plan(
        product, predicted[product] / best, predicted[product], None if math.isinf(waited) else waited - now
    )


def escaping(job: Mapping[str, Any], chosen: Plan, *, namespace: str, signing_key: bytes) -> dict[str, Any]:
    """The first write: the Job suspended (its Pods, none started, go), its plan in its record."""
    obj: dict[str, Any] = clone(dict(job))
    child(obj, "spec")["suspend"] = True
    meta = child(obj, "metadata")
    record = job_record(obj)
    record[ESCAPE_KEY] = chosen.as_dict()
    child(meta, "annotations")[v.HINTS_ANNOTATION] = json.dumps(record, separators=(",", ":"))
    sign_block(meta, namespace=namespace, key=signing_key)
    return obj


def escape_under_way(job: Mapping[str, Any]) -> str:
    """The product a Job is being widened to: suspended by ``escaping`` and not yet resumed ("" else)."""
    found = as_mapping(job_record(job).get(ESCAPE_KEY))
    return str(found.get("product", "")) if as_mapping(job.get("spec")).get("suspend") is True else ""


def ready_to_widen(job: Mapping[str, Any]) -> bool:
    """Whether the API server takes the widened template now: suspended, never started (its start
    reset), and no Pod of it left active."""
    status = as_mapping(job.get("status"))
    return bool(escape_under_way(job)) and not status.get("startTime") and not status.get("active")


def _widened_record(record: dict[str, Any], product: str) -> str:
    kept = [as_mapping(k) for k in as_list(record.get("keptOff"))]
    moved = [k for k in kept if k.get("product") == product]
    record["acceptable"] = [*as_list(record.get("acceptable")), *moved]
    record["keptOff"] = [k for k in kept if k.get("product") != product]
    return json.dumps(record, separators=(",", ":"))


def escaped(job: Mapping[str, Any], *, namespace: str, signing_key: bytes) -> dict[str, Any]:
    """The second write: the product added to the cut's requirement in every required term of the
    pod template, moved from kept off to acceptable in both records, and the Job resumed."""
    product = escape_under_way(job)
    obj: dict[str, Any] = clone(dict(job))
    template = child(child(obj, "spec"), "template")
    pod_spec = child(template, "spec")
    affinity = as_mapping(as_mapping(pod_spec.get("affinity")).get("nodeAffinity"))
    required = as_mapping(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    for term in as_list(required.get("nodeSelectorTerms")):
        for expression in as_list(as_mapping(term).get("matchExpressions")):
            found = as_mapping(expression)
            values = [str(x) for x in as_list(found.get("values"))]
            if (
                found.get("key") == v.GPU_PRODUCT_LABEL
                and found.get("operator") == "In"
                and product not in values
            ):
                expression["values"] = sorted([*values, product])
    for block in (child(obj, "metadata"), child(template, "metadata")):
        record = _record(block)
        if record:
            record.setdefault(ESCAPE_KEY, job_record(job).get(ESCAPE_KEY))
            child(block, "annotations")[v.HINTS_ANNOTATION] = _widened_record(record, product)
            sign_block(block, namespace=namespace, key=signing_key)
    child(obj, "spec")["suspend"] = False
    return obj
