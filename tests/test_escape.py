"""The escape of "Wait or run slow" (decisions/escape.py, kratos_controller/escapes.py): a narrowed Job
that waits unschedulable for an acceptable product is let onto a kept-off product with room where it is
predicted to finish sooner than by waiting; the rule, a cluster's occupancy, the two writes, and the
controller's three steps through the API double (the Job controller's suspension, the template's
immutability but for a suspended, never-started Job's scheduling directives, RBAC)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from kratos_admit.decisions.escape import (
    UNKNOWN_REMAINING_FLOOR_SECONDS,
    Occupancy,
    Plan,
    escape_product,
    escape_under_way,
    escaped,
    escaping,
    finish_time,
    plan,
    ready_to_widen,
    recorded_seconds,
    tolerated,
)
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.signing import signature_valid
from tests.harness import CATALOG, JOBS, NAMESPACES, NODES, PODS, TEST_KEY, api_for, api_server
from tests.kube_double import CONTROLLER, EVENTS, KubeDouble

H100, A100, L40S, A10 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S", "NVIDIA-A10"
NS = "ml-team"
NOW = dt.datetime(2026, 11, 29, 10, 0, tzinfo=dt.UTC)
T0 = NOW.timestamp()


def iso(at: dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def hints(best: float | None = 300.0, **extra: Any) -> dict[str, Any]:
    """An FP64 workload's record: H100 best, A100 1.6x; L40S (6x) and A10 (19x) kept off by a cap of 4."""
    found: dict[str, Any] = {
        "maxSlowdown": 4,
        "acceptable": [{"product": H100, "slowdown": 1.0}, {"product": A100, "slowdown": 1.6}],
        "keptOff": [{"product": L40S, "slowdown": 6.0}, {"product": A10, "slowdown": 19.2}],
        **extra,
    }
    if best is not None:
        found["bestSeconds"] = best
    return found


def node(
    name: str, product: str, gpus: int = 4, *, taints: list[Any] | None = None, ready: bool = True
) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {v.GPU_PRODUCT_LABEL: product, v.GPU_PRESENT_LABEL: "true"}},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {v.GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def running(name: str, on: str, *, started: dt.datetime, record: dict[str, Any] | None, gpus: int = 1) -> Any:
    annotations = {v.HINTS_ANNOTATION: json.dumps(record)} if record is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "other", "uid": f"uid-{name}", "annotations": annotations,
                     "creationTimestamp": iso(started)},
        "spec": {"nodeName": on, "containers": [{"name": "main", "image": "cuda",
                                                  "resources": {"limits": {v.GPU_RESOURCE: str(gpus)}}}]},
        "status": {"phase": "Running", "startTime": iso(started)},
    }  # fmt: skip


def narrowed_job(name: str = "cfd", **record: Any) -> Any:
    said = json.dumps(hints(**record))
    template_spec = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "cfd:1", "resources": {"limits": {v.GPU_RESOURCE: "1"}}}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": v.GPU_PRODUCT_LABEL, "operator": "In", "values": [A100, H100]}]}
        ]}}},
    }  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "creationTimestamp": iso(NOW),
                     "labels": {v.WORKLOAD_LABEL: "cfd"}, "annotations": {v.HINTS_ANNOTATION: said}},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 6, "suspend": False,
                 "template": {"metadata": {"labels": {v.WORKLOAD_LABEL: "cfd"},
                                           "annotations": {v.HINTS_ANNOTATION: said}},
                              "spec": template_spec}},
        "status": {"startTime": iso(NOW), "active": 1},
    }  # fmt: skip


def pending_pod(job: Any, *, unschedulable: bool = True) -> Any:
    name = job["metadata"]["name"]
    conditions = (
        [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}] if unschedulable else []
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-x1", "namespace": NS, "uid": f"uid-{name}-x1",
                     "creationTimestamp": iso(NOW), "labels": {"job-name": name},
                     "annotations": job["spec"]["template"]["metadata"]["annotations"],
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                          "uid": job["metadata"]["uid"], "controller": True}]},
        "spec": copy.deepcopy(job["spec"]["template"]["spec"]),
        "status": {"phase": "Pending", "conditions": conditions},
    }  # fmt: skip


CLUSTER = [node("h100-0", H100), node("a100-0", A100), node("l40s-0", L40S), node("a10-0", A10)]


def busy_h100(remaining: float) -> list[Any]:
    """The one H100 node's 4 GPUs held by Pods predicted to end ``remaining`` s from NOW."""
    return full("h100-0", remaining=remaining)


def full(name: str, count: int = 4, *, remaining: float = 5000.0) -> list[Any]:
    """A node's GPUs held by Pods of a workload predicted to run 10,000 s on an H100, and so on its
    product by its slowdown, started so that each ends ``remaining`` s from NOW."""
    product = next(
        n["metadata"]["labels"][v.GPU_PRODUCT_LABEL] for n in CLUSTER if n["metadata"]["name"] == name
    )
    runtime = recorded_seconds(hints(best=10000.0))[product]
    started = NOW - dt.timedelta(seconds=runtime - remaining)
    return [running(f"{name}-{i}", name, started=started, record=hints(best=10000.0)) for i in range(count)]


# --- the rule -------------------------------------------------------------------------------------


def test_finish_time_replays_the_queue_gpu_by_gpu():
    assert finish_time([0.0, 0.0], 100.0) == 100.0
    # the one ahead takes the GPU that frees at 50 and frees it at 250; this one takes it then
    assert finish_time([50.0, 400.0], 100.0, [200.0]) == 350.0
    assert finish_time([50.0, 400.0], 100.0, [200.0, 300.0]) == 500.0
    assert finish_time([], 100.0) == math.inf


def test_a_job_escapes_only_onto_a_kept_off_product_with_room_where_it_ends_sooner():
    ends = {H100: 3000.0, L40S: 0.0}

    def finish(p: str, s: float) -> float:
        return ends[p] + s

    predicted = {H100: 300.0, L40S: 1800.0}
    assert escape_product(0.0, predicted, {H100}, room=lambda p: p == L40S, finish=finish) == (L40S, 3300.0)
    ends[H100] = 1000.0  # the H100 frees soon enough: it waits
    assert escape_product(0.0, predicted, {H100}, room=lambda p: p == L40S, finish=finish) is None
    ends[H100] = 3000.0  # no room on the kept-off product: it never waits for one
    assert escape_product(0.0, predicted, {H100}, room=lambda p: False, finish=finish) is None


def test_tolerations_as_kubernetes_reads_them():
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert not tolerated(taint, [])
    assert tolerated(taint, [{"key": "nvidia.com/gpu", "operator": "Exists"}])
    assert tolerated(taint, [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    assert not tolerated(taint, [{"key": "nvidia.com/gpu", "value": "absent"}])
    assert not tolerated(taint, [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}])
    assert tolerated(taint, [{"operator": "Exists"}])
    assert tolerated({**taint, "effect": "PreferNoSchedule"}, [])


def test_occupancy_reads_each_gpus_predicted_end_and_the_room_a_pods_tolerations_give():
    nodes = [
        *CLUSTER,
        node("l40s-tainted", L40S, taints=[{"key": "kratos.dev/fill", "effect": "NoSchedule"}]),
        node("a10-down", A10, ready=False),
    ]
    unknown = running("u", "a100-0", started=NOW - dt.timedelta(seconds=10), record=None, gpus=2)
    old = running("o", "a100-0", started=NOW - dt.timedelta(seconds=500), record=None)
    pods = [*busy_h100(2900.0), unknown, old, running("t", "l40s-tainted", started=NOW, record=None, gpus=4)]
    found = Occupancy.read(nodes, pods, now=T0)
    assert found.frees[H100] == [T0 + 2900.0] * 4
    # no record: as long again as it ran, a minute at least; the A100's fourth GPU is free
    assert found.frees[A100] == [
        T0,
        T0 + UNKNOWN_REMAINING_FLOOR_SECONDS,
        T0 + UNKNOWN_REMAINING_FLOOR_SECONDS,
        T0 + 500.0,
    ]
    assert found.free_now[L40S] == [4]  # the tainted node is not this Pod's; the NotReady A10 neither
    assert found.free_now[A10] == [4]
    assert found.room(L40S, 4) and not found.room(H100, 1)
    tolerant = Occupancy.read(
        nodes, pods, now=T0, tolerations=[{"key": "kratos.dev/fill", "operator": "Exists"}]
    )
    assert sorted(tolerant.free_now[L40S]) == [0, 4]


def test_the_plan_counts_the_queue_and_never_escapes_without_a_runtime_or_twice():
    job = narrowed_job()
    busy = Occupancy.read(CLUSTER, [*busy_h100(2900.0), *full("a100-0")], now=T0)
    chosen = plan(job, busy, {})
    assert chosen == Plan(L40S, 6.0, 1800.0, 3200.0)  # the H100 frees at 2900 s, then 300 s
    soon = Occupancy.read(CLUSTER, [*busy_h100(1000.0), *full("a100-0")], now=T0)
    assert plan(job, soon, {}) is None  # 1300 s on the H100 beats 1800 s on the L40S
    assert plan(job, soon, {H100: [600.0, 600.0, 600.0, 600.0, 600.0]}) == Plan(L40S, 6.0, 1800.0, 1900.0)
    assert plan(narrowed_job(best=None), busy, {}) is None
    assert plan(escaping(job, chosen, namespace=NS, signing_key=TEST_KEY), busy, {}) is None
    assert recorded_seconds(hints()) == {H100: 300.0, A100: 480.0, L40S: 1800.0, A10: 5760.0}


def test_a_gang_escapes_only_onto_a_product_with_room_for_all_its_pods_and_waits_for_its_last_gpu():
    gang = narrowed_job(gang="parallelism 2")
    gang["spec"].update(parallelism=2, completions=2)
    assert finish_time([0.0, 100.0, 400.0], 50.0, gpus=2) == 150.0, "it starts when its second GPU frees"
    assert finish_time([0.0], 50.0, gpus=2) == math.inf
    one_free = [*busy_h100(2900.0), *full("a100-0"), *full("l40s-0", 3), *full("a10-0")]
    assert plan(narrowed_job(), Occupancy.read(CLUSTER, one_free, now=T0), {}) is not None, "one Pod fits"
    assert plan(gang, Occupancy.read(CLUSTER, one_free, now=T0), {}) is None, "the gang's two do not"
    two_free = [*busy_h100(2900.0), *full("a100-0"), *full("l40s-0", 2), *full("a10-0")]
    assert plan(gang, Occupancy.read(CLUSTER, two_free, now=T0), {}) == Plan(L40S, 6.0, 1800.0, 3200.0)


def test_the_two_writes_suspend_with_the_plan_then_widen_every_term_sign_and_resume():
    job = narrowed_job()
    chosen = Plan(L40S, 6.0, 1800.0, 3200.0)
    held = escaping(job, chosen, namespace=NS, signing_key=TEST_KEY)
    assert held["spec"]["suspend"] is True and escape_under_way(held) == L40S
    assert json.loads(held["metadata"]["annotations"][v.HINTS_ANNOTATION])["escapedTo"]["product"] == L40S
    assert signature_valid(held["metadata"], namespace=NS, key=TEST_KEY)
    assert held["spec"]["template"] == job["spec"]["template"], "the template waits for the second write"
    assert not ready_to_widen(held), "its start is not reset yet"
    held["status"] = {"active": 0}
    assert ready_to_widen(held)
    widened = escaped(held, namespace=NS, signing_key=TEST_KEY)
    assert widened["spec"]["suspend"] is False and not escape_under_way(widened)
    terms = widened["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == sorted([A100, H100, L40S])
    for block in (widened["metadata"], widened["spec"]["template"]["metadata"]):
        said = json.loads(block["annotations"][v.HINTS_ANNOTATION])
        assert [a["product"] for a in said["acceptable"]] == [H100, A100, L40S]
        assert [k["product"] for k in said["keptOff"]] == [A10]
        assert said["escapedTo"] == chosen.as_dict()
        assert signature_valid(block, namespace=NS, key=TEST_KEY)


# --- the controller, through the API double -------------------------------------------------------


@asynccontextmanager
async def controller(kube: KubeDouble) -> AsyncIterator[Any]:
    from kratos_controller.kube_io import KubeIO
    from kratos_controller.metrics import ControllerMetrics
    from kratos_controller.runtime import Shared
    from kratos_controller.waiting import WaitController

    async with api_server(kube) as server:
        api = api_for(server, "controller", identity=CONTROLLER)
        try:
            shared = Shared(KubeIO(api), config=Config(), catalog=CATALOG, signing_key=TEST_KEY,
                            metrics=ControllerMetrics(), identity="kratos-controller-test")  # fmt: skip
            waits = WaitController(shared)
            waits.escapes.settle_seconds = 0.0  # the test runs the Job controller itself
            yield waits
        finally:
            await api.close()


def seeded(job: Any, *others: Any) -> KubeDouble:
    kube = KubeDouble()
    kube.put(*NAMESPACES, {"metadata": {"name": NS}})
    kube.put(*NAMESPACES, {"metadata": {"name": "other"}})
    for n in CLUSTER:
        kube.put(*NODES, n)
    for pod in others:
        kube.put(*PODS, pod)
    kube.put(*JOBS, job)
    kube.put(*PODS, pending_pod(job))
    return kube


def current(kube: KubeDouble, name: str = "cfd") -> Any:
    return kube.objects[JOBS][(NS, name)]


async def test_a_waiting_job_is_suspended_reset_widened_and_resumed_and_its_new_pod_may_run_there():
    kube = seeded(narrowed_job(), *busy_h100(2900.0), *full("a100-0"))
    async with controller(kube) as waits:
        waits.watch(current(kube), "Job")
        await waits.check(NOW + dt.timedelta(seconds=60))
        job = current(kube)
        assert job["spec"]["suspend"] is True and escape_under_way(job) == L40S
        assert job["spec"]["template"] == narrowed_job()["spec"]["template"]
        await kube.run_jobs()  # the Job controller: the Pending Pod deleted, not counted failed
        assert (NS, "cfd-x1") not in kube.objects[PODS]
        assert "failed" not in current(kube)["status"] and current(kube)["status"]["startTime"]
        waits.watch(current(kube), "Job")
        await waits.check(NOW + dt.timedelta(seconds=90))
        job = current(kube)
        assert job["spec"]["suspend"] is False and "startTime" not in job["status"]
        values = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
        assert L40S in values
        [event] = [e for e in kube.items(*EVENTS) if e["reason"] == "EscapedToProduct"]
        assert event["regarding"]["name"] == "cfd" and L40S in event["note"] and "1800 s" in event["note"]
        assert (
            "3140 s" in event["note"]
        )  # checked 60 s after NOW: the H100 frees 2840 s later and "6x" in event["note"]
        assert waits.shared.metrics.escapes.labels(L40S)._value.get() == 1
        [created] = await kube.run_jobs()  # resumed: a new Pod from the widened template
        pod = kube.objects[PODS][(NS, created)]
        assert L40S in json.dumps(pod["spec"]["affinity"])
        waits.watch(current(kube), "Job")
        await waits.check(NOW + dt.timedelta(seconds=120))
        assert len([e for e in kube.items(*EVENTS) if e["reason"] == "EscapedToProduct"]) == 1, "once"


async def test_a_controller_restarted_mid_escape_finishes_it_from_the_record():
    kube = seeded(narrowed_job(), *busy_h100(2900.0), *full("a100-0"))
    async with controller(kube) as waits:
        waits.watch(current(kube), "Job")
        await waits.check(NOW + dt.timedelta(seconds=60))
    await kube.run_jobs()
    async with controller(kube) as fresh:  # a new process: nothing kept but the Job's own record
        fresh.watch(current(kube), "Job")
        await fresh.check(NOW + dt.timedelta(seconds=90))
        assert current(kube)["spec"]["suspend"] is False
        assert L40S in json.dumps(current(kube)["spec"]["template"]["spec"]["affinity"])


@pytest.mark.parametrize(
    ("why", "job", "others", "pod_unschedulable"),
    [
        ("the H100 frees in time", narrowed_job(), [*busy_h100(1000.0), *full("a100-0")], True),
        ("the scheduler has not tried it yet", narrowed_job(), [*busy_h100(2900.0), *full("a100-0")], False),
        ("no run gives its runtime", narrowed_job(best=None), [*busy_h100(2900.0), *full("a100-0")], True),
        ("the kept-off products are full", narrowed_job(), [*busy_h100(2900.0), *full("a100-0"), *full("l40s-0"), *full("a10-0")], True),
    ],
)  # fmt: skip
async def test_a_job_waits_on_where_escaping_does_not_pay_or_is_not_known(
    why: str, job: Any, others: list[Any], pod_unschedulable: bool
):
    kube = seeded(job, *others)
    kube.put(*PODS, pending_pod(job, unschedulable=pod_unschedulable))
    async with controller(kube) as waits:
        waits.watch(current(kube), "Job")
        await waits.check(NOW + dt.timedelta(seconds=60))
        assert current(kube)["spec"]["suspend"] is False, why
        assert not [e for e in kube.items(*EVENTS) if e["reason"] == "EscapedToProduct"], why


@pytest.mark.parametrize(
    ("why", "change"),
    [
        ("Kueue's flavors decide a queued Job", lambda j: j["metadata"]["labels"].update({"kueue.x-k8s.io/queue-name": "gpu"})),
        ("a JobSet's Job: its gang spans Jobs", lambda j: j["metadata"].update(ownerReferences=[{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train", "uid": "u", "controller": True}])),
        ("Pods that do not all run at once", lambda j: j["spec"].update(parallelism=2, completions=8)),
    ],
)  # fmt: skip
def test_jobs_that_may_not_escape(why: str, change: Any):
    from kratos_controller.escapes import escapable

    job = narrowed_job()
    pods = [pending_pod(job)]
    assert escapable(job, pods)
    change(job)
    assert not escapable(job, pods), why
    bound = pending_pod(narrowed_job())
    bound["spec"]["nodeName"] = "h100-0"
    assert not escapable(narrowed_job(), [bound]), "a Pod of it started"


async def test_the_api_server_refuses_the_widening_until_the_start_is_reset():
    """What the three writes are for: the double, as the API server, refuses the template's change on
    a suspended Job that has started (JobMutableNodeSchedulingDirectives)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    from kratos_controller.kube_io import KubeIO

    kube = seeded(narrowed_job(), *busy_h100(2900.0))
    async with api_server(kube) as server:
        api = api_for(server, "controller", identity=CONTROLLER)
        try:
            io = KubeIO(api)
            job = current(kube)
            held = escaping(job, Plan(L40S, 6.0, 1800.0, 3200.0), namespace=NS, signing_key=TEST_KEY)
            await io.patch_changed("Job", NS, "cfd", job, held)
            await kube.run_jobs()
            job = current(kube)
            with pytest.raises(ApiException) as refused:
                await io.patch_changed(
                    "Job", NS, "cfd", job, escaped(job, namespace=NS, signing_key=TEST_KEY)
                )
            assert refused.value.status == 422 and "field is immutable" in str(refused.value.body)
            await io.reset_job_start(NS, "cfd")
            job = current(kube)
            assert (
                await io.patch_changed(
                    "Job", NS, "cfd", job, escaped(job, namespace=NS, signing_key=TEST_KEY)
                )
                == "updated"
            )
            with pytest.raises(ApiException) as resumed:  # no longer suspended: the patch's test fails
                await io.reset_job_start(NS, "cfd")
            assert resumed.value.status == 422
        finally:
            await api.close()


def test_the_validating_webhook_admits_both_writes_of_a_job_admission_narrowed():
    """A Job the mutating webhook narrowed (a Ready FP64 profile keeps it off the L40S and A10) is
    suspended with its plan and then widened by the controller: both UPDATEs pass validation (the
    blocks re-signed, nothing a user could not have written), and a forged plan does not."""
    from kratos_admit.admission.engine import AdmissionEngine
    from kratos_admit.decisions.stores import StaticNodeStore, StaticProfileStore
    from tests.builders import make_job, shares_profile
    from tests.harness import admit, make_ctx, mutate_and_check

    fp64 = shares_profile("cfd", {"fp64": "0.80", "memory": "0.12", "latency": "0.08"})
    products = (A100, H100, L40S, A10)
    eng = AdmissionEngine(
        ctx=make_ctx(),
        profiles=StaticProfileStore([fp64]),
        nodes=StaticNodeStore(products, dict.fromkeys(products, 2), None),
    )
    _, narrowed = mutate_and_check(make_job("cfd", namespace=NS).label(v.WORKLOAD_LABEL, "cfd").obj(), eng)
    kept = json.loads(narrowed["metadata"]["annotations"][v.HINTS_ANNOTATION])["keptOff"]
    assert {k["product"] for k in kept} == {L40S, A10}
    narrowed["status"] = {"startTime": iso(NOW), "active": 1}
    held = escaping(narrowed, Plan(L40S, 6.0, 1800.0, 3200.0), namespace=NS, signing_key=TEST_KEY)
    result = admit(held, eng, webhook="validate", operation="UPDATE", old=narrowed)
    assert result.decision.allowed, result.decision.violations
    held["status"] = {"active": 0}
    widened = escaped(held, namespace=NS, signing_key=TEST_KEY)
    result = admit(widened, eng, webhook="validate", operation="UPDATE", old=held)
    assert result.decision.allowed, result.decision.violations
    forged = escaping(narrowed, Plan(L40S, 6.0, 1800.0, 3200.0), namespace=NS, signing_key=b"x" * 32)
    result = admit(forged, eng, webhook="validate", operation="UPDATE", old=narrowed)
    assert not result.decision.allowed
    assert any("reserved-key" in str(violation) for violation in result.decision.violations)


def test_the_slim_forms_a_cluster_wide_list_is_kept_in_read_the_same():
    """The controller keeps a cluster-wide list of Pods and Nodes page by page in a slim form (only
    what holds GPUs, and only what is read of it): the occupancy read from it is the same."""
    from kratos_admit.decisions.escape import slim_node, slim_pod

    nodes = [*CLUSTER, node("l40s-tainted", L40S, taints=[{"key": "x", "effect": "NoSchedule"}])]
    pods = [*busy_h100(2900.0), running("u", "a100-0", started=NOW, record=None, gpus=2)]
    cpu_only = running("c", "a100-0", started=NOW, record=None)
    cpu_only["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    assert slim_pod(cpu_only) is None
    slim = Occupancy.read(
        [slim_node(n) for n in nodes], [p for p in map(slim_pod, [*pods, cpu_only]) if p], now=T0
    )
    whole = Occupancy.read(nodes, [*pods, cpu_only], now=T0)
    assert (slim.frees, slim.free_now) == (whole.frees, whole.free_now)
