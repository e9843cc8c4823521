"""Wait or run slow (DESIGN "Wait or run slow", issue 58): a workload with a Ready profile may run only
on the products predicted within ``maxSlowdown`` times its best, as a required node affinity that
kube-scheduler and Kueue's flavor assignment both read; never starving it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kratos_admit.admission.engine import AdmissionEngine
from kratos_admit.decisions.acceptable import cut, holds_pod, parse_max_slowdown
from kratos_admit.decisions.holds import release_hold
from kratos_admit.decisions.stores import StaticNodeStore, StaticProfileStore, most_gpus, node_gpus
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.model.ranking import rank_gpu_products
from tests.builders import make_job, make_pod, shares_profile
from tests.harness import CATALOG, TEST_KEY, admit, make_ctx, mutate_and_check

A100, H100, L40S, A10, L4 = (
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-L40S",
    "NVIDIA-A10",
    "NVIDIA-L4",
)
CLUSTER = (A100, H100, L40S, A10)


FP64 = shares_profile("cfd", {"fp64": "0.80", "memory": "0.12", "latency": "0.08"})
DRAM = shares_profile("stream", {"memory": "0.85", "latency": "0.15"})


def engine_of(
    *profiles: WorkloadProfile, gpus: dict[str, int] | None = None, **config: Any
) -> AdmissionEngine:
    return AdmissionEngine(
        ctx=make_ctx(**config),
        profiles=StaticProfileStore(profiles),
        nodes=StaticNodeStore(CLUSTER, dict.fromkeys(CLUSTER, 2), gpus),
    )


def required_terms(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
    node_affinity = spec["affinity"]["nodeAffinity"]
    terms: list[dict[str, Any]] = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


def products_required(obj: dict[str, Any]) -> list[list[str] | None]:
    """Per required term, the products it lets in (None: no product requirement)."""
    found: list[list[str] | None] = []
    for term in required_terms(obj):
        values = [e["values"] for e in term["matchExpressions"] if e["key"] == v.GPU_PRODUCT_LABEL]
        found.append(values[0] if values else None)
    return found


def record(obj: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(obj["metadata"]["annotations"][v.HINTS_ANNOTATION])
    return found


def job(workload: str = "cfd") -> Any:
    return make_job(workload, namespace="ml-team").label(v.WORKLOAD_LABEL, workload)


# --- the cut, pure -------------------------------------------------------------------------------


def ranked_fp64(products: tuple[str, ...] = CLUSTER) -> list[Any]:
    return rank_gpu_products(FP64, products, catalog=CATALOG, strategy="performance", reference_product=A100)


def test_the_cut_keeps_the_products_within_the_cap_of_the_best_and_says_each_ones_slowdown():
    found = cut(ranked_fp64(), cap=4)
    assert found is not None and found.narrows
    slowdowns = {s.product: s.slowdown for s in (*found.acceptable, *found.kept_off)}
    assert {s.product for s in found.acceptable} == {H100, A100}
    assert {s.product for s in found.kept_off} == {L40S, A10}
    assert min(slowdowns.values()) == 1.0 and slowdowns[A10] > 10 and slowdowns[L40S] > 10, slowdowns
    assert all(s.slowdown <= 4 for s in found.acceptable)
    assert found.record()["maxSlowdown"] == 4 and found.labels == (A100, H100)


def test_no_cap_and_an_empty_ranking_narrow_nothing():
    assert cut(ranked_fp64(), cap=0) is None
    assert cut([], cap=4) is None


def test_a_product_whose_nodes_cannot_hold_a_pod_is_never_the_best_the_cap_is_measured_from():
    """Never starve: an 8-GPU Pod where the H100 and A100 Nodes have 4 GPUs each; the best product
    that can hold it (of the L40S's 8 and the A10's 4) is the one the others are measured against,
    and the acceptable set holds it."""
    found = cut(ranked_fp64(), cap=4, gpus_per_pod=8, product_gpus={H100: 4, A100: 4, L40S: 8, A10: 4})
    assert found is not None
    assert [s.product for s in found.acceptable] == [L40S]
    assert {s.product for s in found.kept_off} == {H100, A100, A10}
    assert holds_pod(None, (A10,), 64), "unknown GPU counts: any product can hold the Pod"
    assert (
        cut(ranked_fp64(), cap=4, gpus_per_pod=16, product_gpus={H100: 4, A100: 4, L40S: 8, A10: 4}) is None
    )


def test_the_product_a_job_explores_is_acceptable_for_it():
    found = cut(ranked_fp64(), cap=4, explored=A10)
    assert found is not None and A10 in {s.product for s in found.acceptable}
    assert [s.product for s in found.kept_off] == [L40S]


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [("3", 3.0), ("1", 1.0), ("2.5", 2.5), ("none", 0.0), ("0", 0.0), ("0.5", None), ("fast", None),
     ("nan", None), ("inf", None), ("-2", None)],
)  # fmt: skip
def test_the_annotation_is_a_number_of_at_least_one_or_none(raw: str, parsed: float | None):
    assert parse_max_slowdown(raw) == parsed


# --- admission -----------------------------------------------------------------------------------


def test_a_ready_fp64_job_is_required_onto_the_products_within_the_cap_anded_into_every_term():
    """Two required terms (a compute capability of 8.6 needs two) each get the product requirement,
    beside the ranked preferences; the record lists what is acceptable and what is kept off."""
    obj = job().annotate(v.MIN_CC_ANNOTATION, "8.0").obj()
    result, mutated = mutate_and_check(obj, engine_of(FP64))
    assert products_required(mutated) == [[A100, H100]]
    said = record(mutated)
    assert said["maxSlowdown"] == Config().max_slowdown
    assert [a["product"] for a in said["acceptable"]] == [H100, A100]
    assert {k["product"] for k in said["keptOff"]} == {L40S, A10}
    assert all(k["slowdown"] > Config().max_slowdown for k in said["keptOff"])
    assert "affinity.nodeAffinity.required.product" in said["injected"]
    preferred = mutated["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert len(preferred) == 4, "the ranked preferences stay beside the requirement"
    assert result.decision.action == "hints"


def test_every_existing_required_term_gets_the_requirement():
    obj = job().annotate(v.MIN_CC_ANNOTATION, "8.6").obj()
    _, mutated = mutate_and_check(obj, engine_of(FP64))
    assert products_required(mutated) == [[H100], [H100]], "the A100's 8.0 is below 8.6"


def test_a_memory_bound_job_is_not_kept_off_a_product_it_runs_acceptably_on():
    """DRAM-bound work runs within the default cap on every product here (on the A10's 600 GB/s, the
    slowest, under 5 times the H100's time): nothing is kept off, nothing narrowed, nothing waits. A
    tighter cap of 4 keeps only the A10 off; the L40S, which FP64 work is kept off, stays acceptable."""
    _, everywhere = mutate_and_check(job("stream").obj(), engine_of(DRAM))
    assert products_required(everywhere) == [None] and "keptOff" not in record(everywhere)
    _, mutated = mutate_and_check(job("stream").obj(), engine_of(DRAM, max_slowdown=4))
    assert products_required(mutated) == [[A100, H100, L40S]]
    assert [k["product"] for k in record(mutated)["keptOff"]] == [A10]


def test_the_annotation_overrides_the_configuration_per_object():
    _, none = mutate_and_check(job().annotate(v.MAX_SLOWDOWN_ANNOTATION, "none").obj(), engine_of(FP64))
    assert products_required(none) == [None]
    _, tight = mutate_and_check(job().annotate(v.MAX_SLOWDOWN_ANNOTATION, "1").obj(), engine_of(FP64))
    assert products_required(tight) == [[H100]]
    _, off = mutate_and_check(job().obj(), engine_of(FP64, max_slowdown=0))
    assert products_required(off) == [None], "0 in the configuration turns it off"


def test_a_malformed_annotation_is_denied_naming_it():
    result = admit(job().annotate(v.MAX_SLOWDOWN_ANNOTATION, "0.5").obj(), engine_of(FP64))
    assert not result.decision.allowed
    [error] = result.decision.violations
    assert error.rule == "hint-format" and v.MAX_SLOWDOWN_ANNOTATION in str(error)
    assert "at least 1" in str(error)


def test_a_users_own_product_requirement_wins():
    obj = job().spec(nodeSelector={v.GPU_PRODUCT_LABEL: L40S}).obj()
    _, mutated = mutate_and_check(obj, engine_of(FP64))
    assert products_required(mutated) == [None] and "keptOff" not in record(mutated)


def test_no_ready_profile_no_narrowing():
    result = admit(job().obj(), engine_of())
    assert result.decision.action == "profiling"
    mutated = result.decision.mutated
    assert mutated is not None and products_required(mutated) == [None]


def test_a_pod_too_large_for_the_fast_products_nodes_is_sent_where_it_fits():
    """Never starve, through admission: 8 GPUs a Pod, the H100 and A100 Nodes have 4."""
    obj = job().limits({v.GPU_RESOURCE: 8}).obj()
    eng = engine_of(FP64, gpus={H100: 4, A100: 4, L40S: 8, A10: 8})
    _, mutated = mutate_and_check(obj, eng)
    assert products_required(mutated)[0] is not None
    assert set(products_required(mutated)[0] or ()) <= {L40S, A10}


def test_node_gpus_reads_allocatable_else_the_gpu_count_label():
    with_status = {
        "metadata": {"labels": {v.GPU_COUNT_LABEL: "8"}},
        "status": {"allocatable": {v.GPU_RESOURCE: "4"}},
    }
    assert node_gpus(with_status) == 4
    assert node_gpus({"metadata": {"labels": {v.GPU_COUNT_LABEL: "8"}}}) == 8
    assert node_gpus({"metadata": {"labels": {}}}) == 0
    assert most_gpus([(A100, 4), (A100, 8), (L4, 0)]) == {A100: 8}


def test_a_gated_pod_released_with_a_ready_profile_is_narrowed_as_admission_would():
    """Kubernetes 1.27+ lets a gated Pod's required terms take more requirements: the release narrows."""
    held = make_pod("cfd", namespace="ml-team").label(v.WORKLOAD_LABEL, "cfd").obj()
    held["spec"]["schedulingGates"] = [{"name": v.PROFILE_SCHEDULING_GATE}]
    held["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": v.GPU_PRESENT_LABEL, "operator": "In", "values": ["true"]}]}
                ]
            }
        }
    }
    held["metadata"]["annotations"] = {
        v.HINTS_ANNOTATION: json.dumps({"injected": ["schedulingGates"], "ranked": []}),
        v.AWAITING_PROFILE_ANNOTATION: FP64.metadata.name,
    }
    released = release_hold(
        held,
        "Pod",
        profile=FP64,
        node_products=frozenset(CLUSTER),
        namespace="ml-team",
        config=Config(),
        catalog=CATALOG,
        signing_key=TEST_KEY,
    )
    assert products_required(released) == [[A100, H100]]
    assert "schedulingGates" not in released["spec"] or not released["spec"]["schedulingGates"]
    assert {k["product"] for k in record(released)["keptOff"]} == {L40S, A10}


# --- the controller: the wait counted, the Pod that waited too long told ---------------------------


def narrowed_job(name: str, *, best_seconds: float | None) -> dict[str, Any]:
    said: dict[str, Any] = {
        "maxSlowdown": 4,
        "acceptable": [{"product": H100, "slowdown": 1.0}, {"product": A100, "slowdown": 1.6}],
        "keptOff": [{"product": L40S, "slowdown": 14.6}, {"product": A10, "slowdown": 19.2}],
    }
    if best_seconds is not None:
        said["bestSeconds"] = best_seconds
    obj: dict[str, Any] = job("cfd").obj()
    obj["metadata"].update({"name": name, "uid": f"uid-{name}", "creationTimestamp": "2026-11-29T10:00:00Z"})
    obj["metadata"]["annotations"] = {v.HINTS_ANNOTATION: json.dumps(said)}
    return obj


def waiting_pod(job_name: str, *, bound: str = "") -> dict[str, Any]:
    pod = make_pod(f"{job_name}-abcde", namespace="ml-team").obj()
    pod["metadata"].update(
        {
            "uid": f"uid-{job_name}-pod",
            "creationTimestamp": "2026-11-29T10:00:00Z",
            "labels": {"job-name": job_name},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job_name,
                    "uid": f"uid-{job_name}",
                    "controller": True,
                }
            ],
        }
    )
    pod["status"] = {"phase": "Pending"}
    if bound:
        pod["spec"]["nodeName"] = bound
    return pod


async def test_a_pod_that_waited_past_its_predicted_runtime_gets_one_event_naming_what_it_is_kept_off():
    import datetime as dt

    from kratos_controller.kube_io import KubeIO
    from kratos_controller.metrics import ControllerMetrics
    from kratos_controller.runtime import Shared
    from kratos_controller.waiting import WaitController
    from tests.harness import JOBS, NAMESPACES, PODS, api_for, api_server
    from tests.kube_double import CONTROLLER, EVENTS, KubeDouble

    kube = KubeDouble()
    async with api_server(kube) as server:
        kube.put(*NAMESPACES, {"metadata": {"name": "ml-team"}})
        for name in ("slow", "ran"):  # the Jobs too: the double's garbage collector deletes an orphan Pod
            kube.put(*JOBS, narrowed_job(name, best_seconds=300.0))
        kube.put(*PODS, waiting_pod("slow"))
        kube.put(*PODS, waiting_pod("ran", bound="gpu-h100-1"))
        api = api_for(server, "controller", identity=CONTROLLER)
        try:
            metrics = ControllerMetrics()
            shared = Shared(
                KubeIO(api),
                config=Config(),
                catalog=CATALOG,
                signing_key=TEST_KEY,
                metrics=metrics,
                identity="kratos-controller-test",
            )
            waits = WaitController(shared)
            waits.watch(narrowed_job("slow", best_seconds=300.0), "Job")
            waits.watch(narrowed_job("ran", best_seconds=300.0), "Job")
            waits.watch(job("cfd").obj(), "Job")  # not narrowed: not tracked
            assert set(waits.narrowed) == {("Job", "ml-team", "slow"), ("Job", "ml-team", "ran")}
            start = dt.datetime(2026, 11, 29, 10, 0, tzinfo=dt.UTC)
            await waits.check(start + dt.timedelta(seconds=200))  # within its 300 s: counted, not told
            assert [e for e in kube.items(*EVENTS) if e["reason"] == "WaitingForProduct"] == []
            assert metrics.acceptable_wait_seconds._value.get() == 200.0
            assert metrics.waiting_for_product._value.get() == 1
            await waits.check(start + dt.timedelta(seconds=330))
            await waits.check(start + dt.timedelta(seconds=360))  # told once, counted on
            [event] = [e for e in kube.items(*EVENTS) if e["reason"] == "WaitingForProduct"]
            assert event["regarding"]["kind"] == "Pod" and event["regarding"]["name"] == "slow-abcde"
            note = event["note"]
            assert "waited 330 s" in note and "predicted 300 s" in note and H100 in note
            assert (
                f"{L40S} (14.6x)" in note and f"{A10} (19.2x)" in note and v.MAX_SLOWDOWN_ANNOTATION in note
            )
            assert metrics.acceptable_wait_seconds._value.get() == 360.0, "each second counted once"
            finished = narrowed_job("slow", best_seconds=300.0)
            finished["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
            waits.watch(finished, "Job")
            assert ("Job", "ml-team", "slow") not in waits.narrowed
        finally:
            await api.close()


def test_placement_shows_the_cut_per_product_and_what_it_keeps_off():
    import io

    from kratos_admit.cli.main import main
    from tests.harness import EXAMPLES

    out, err = io.StringIO(), io.StringIO()
    argv = [
        "placement",
        "-p",
        str(EXAMPLES / "profiles" / "vector-add-profile.yaml"),
        "--nodes",
        str(EXAMPLES / "nodes.yaml"),
    ]
    assert main(argv, stdout=out, stderr=err) == 0, err.getvalue()
    _, table, footer = out.getvalue().split("\n\n")
    header, *rows = table.splitlines()
    assert "SLOWDOWN" in header and "CUT" in header
    assert len(rows) == 5
    json_out = io.StringIO()
    assert main([*argv, "-o", "json"], stdout=json_out, stderr=err) == 0, err.getvalue()
    cut_of = {r["product"]: (r["cut"], r["slowdown"]) for r in json.loads(json_out.getvalue())}
    assert {p: c for p, (c, _) in cut_of.items()} == {
        H100: "acceptable", A100: "acceptable", L40S: "acceptable", L4: "kept-off", "Tesla-T4": "kept-off"
    }  # fmt: skip
    assert cut_of[H100][1] == 1.0 and cut_of[L4][1] == 8.17
    assert footer.startswith("maxSlowdown 5: required onto the products within 5x of the best; kept off ")
    assert "NVIDIA-L4 (8.17x)" in footer and "Tesla-T4 (7.67x)" in footer


# --- the load-aware escape (decisions/escape.py), in simulate's kratos --------------------------------


def test_a_waiting_job_escapes_onto_a_kept_off_product_only_where_it_ends_sooner_than_by_waiting():
    from kratos_admit.simulation.waiting import EarliestFinish

    eft = EarliestFinish(capacity={H100: 2, L4: 4})
    eft.started("a", H100, 1000.0)
    eft.started("b", H100, 1500.0)
    free = {H100: False, L4: True}.__getitem__
    # both H100 GPUs end at 1000 and 1500: waiting ends at 1100; the free L4 at 800
    assert eft.escape(0.0, {H100: 100.0, L4: 800.0}, {H100}, free=free, ahead={}) == L4
    # slower there than the wait: it waits
    assert eft.escape(0.0, {H100: 100.0, L4: 1200.0}, {H100}, free=free, ahead={}) is None
    # a Job of 900 s ahead waits for the H100 too: it takes the GPU that frees at 1000, this one the
    # other at 1500, ending at 1600; the L4 at 1200 is sooner
    assert eft.escape(0.0, {H100: 100.0, L4: 1200.0}, {H100}, free=free, ahead={H100: [900.0]}) == L4
    # three ahead take the GPUs freeing at 1000, 1500 and 1900 (1000 + 900): this one the one freeing at
    # 2400 (1500 + 900), ending at 2500
    assert eft.finish_on(H100, 100.0, 0.0, ahead={H100: [900.0] * 3}) == 2500.0
    # no room on the kept-off product now: it never waits for one
    assert eft.escape(0.0, {H100: 100.0, L4: 800.0}, {H100}, free=lambda p: False, ahead={}) is None
    eft.finished("a")
    eft.finished("b")
    assert eft.running[H100] == [] and eft.ends == {}


def test_simulate_kratos_escapes_only_where_the_queue_for_the_fast_gpus_is_longer_than_the_slowdown():
    """Training work predicted 8.3x slower on a T4 than on the H100 (the cap of 6 keeps it off), arriving
    faster than one 4-GPU H100 Node carries it: the cap alone (kratos-cap) keeps every Job on the H100
    and the queue grows; kratos sends Jobs to the T4s once their wait would be longer (a Job every 20 s:
    3814 s against 4347 s, the greedy oracle 4295 s). A trace the H100 carries alone (a Job every 600 s)
    escapes never: the same as the cap alone."""
    from kratos_admit.domain.vocabulary import Unit
    from kratos_admit.simulation.replay import simulate
    from kratos_admit.simulation.trace import Trace, TraceJob, Truth
    from tests.builders import sim_node

    shares: dict[Unit, float] = {"tensor": 0.62, "memory": 0.18, "latency": 0.20}
    nodes = [sim_node("h100-0", H100, gpus=4), *(sim_node(f"t4-{i}", "Tesla-T4", gpus=4) for i in range(3))]

    def trace(gap: float) -> Trace:
        return Trace(
            tuple(
                TraceJob(name=f"train-{i:03d}", workload="train", arrival=gap * i, gpus=1,
                         reference_product=A100, reference_seconds=1200.0, time_shares=shares,
                         metrics={"smThroughput": "71.00", "memoryThroughput": "42.00"})
                for i in range(60)
            )
        )  # fmt: skip

    def run(gap: float) -> dict[str, float]:
        result = simulate(
            trace(gap), nodes, truth=Truth(CATALOG, {}), config=Config(), catalog=CATALOG, seed=1,
            policies=("kratos", "kratos-cap", "oracle"),
        )  # fmt: skip
        return {name: r.mean_jct for name, r in result.policies.items()}

    busy = run(20.0)
    assert busy["kratos"] < 0.9 * busy["kratos-cap"], busy
    assert busy["kratos"] < busy["oracle"], busy
    quiet = run(600.0)
    assert quiet["kratos"] == pytest.approx(quiet["kratos-cap"]), quiet
