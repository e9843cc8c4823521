"""Issue 36, without a cluster: KRATOS's decisions where Kueue runs (DESIGN "Where Kueue runs").

A Job that names a Kueue queue is Kueue's to start: KRATOS never writes its ``spec.suspend``. A
follower is held by the scheduling gate in its pod template; its Pods made after the profile settled
are admitted ungated; the decision is the same in either order of the two mutating webhooks (Kueue's
defaulting imitated below exactly as far as KRATOS meets it); ``release`` lets go of gated templates;
the AdmissionCheck's state follows the hold. The real Kueue meets the same cases in
tests/e2e/test_kueue.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kratos_admit.decisions.holds import admission_check_state, release_hold, template_mutable
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.signing import signature_valid
from kratos_admit.edge.release import plan_release
from tests.builders import make_job
from tests.harness import (
    CATALOG,
    TEST_KEY,
    admit,
    assert_valid_kubernetes,
    engine,
    make_ctx,
    mutate_and_check,
    profile,
)

QUEUE = v.KUEUE_QUEUE_LABEL
PROFILING = WorkloadProfile.model_validate(profile("sweep", phase="Profiling"))
READY = WorkloadProfile.model_validate(profile("sweep"))
FAILED = WorkloadProfile.model_validate(profile("sweep", phase="Failed"))


def job(name: str = "sweep-1", *, queue: str | None = "team", suspend: bool | None = None) -> dict[str, Any]:
    """A Job as the API server hands it to the webhooks (its defaults filled in)."""
    built = make_job(name).label(v.WORKLOAD_LABEL, "sweep").command("/app/train").obj()
    built["spec"].setdefault("suspend", False)
    if suspend is not None:
        built["spec"]["suspend"] = suspend
    if queue:
        built["metadata"]["labels"][QUEUE] = queue
    return built


def kueue_job_defaults(obj: dict[str, Any], *, default_queue: bool = False) -> dict[str, Any]:
    """What Kueue v0.13's Job webhook (``mjob.kb.io``, ``JobWebhook.Default``) does to a Job at
    creation, and no more: ``ApplyDefaultLocalQueue`` names the queue ``default`` when the Job has
    none and its namespace has a LocalQueue of that name (gate LocalQueueDefaulting, on by default);
    ``ApplyDefaultForSuspend`` suspends a Job that names a queue. (pkg/controller/jobs/job/job_webhook.go,
    pkg/controller/jobframework/defaults.go)"""
    out = copy.deepcopy(obj)
    labels = out["metadata"].setdefault("labels", {})
    if not labels.get(QUEUE) and default_queue:
        labels[QUEUE] = "default"
    if labels.get(QUEUE):
        out["spec"]["suspend"] = True
    return out


def mutated(obj: dict[str, Any], profiles: list[WorkloadProfile]) -> dict[str, Any]:
    result = admit(obj, engine(make_ctx(), profiles))
    assert result.decision.allowed, result.decision.violations
    return result.decision.mutated if result.decision.mutated is not None else obj


def kratos_first(
    obj: dict[str, Any], profiles: list[WorkloadProfile], *, default_queue: bool
) -> dict[str, Any]:
    """kratos-admit sorts before kueue-mutating-webhook-configuration: KRATOS, Kueue, then KRATOS again
    (reinvocationPolicy IfNeeded, as Kueue changed the object)."""
    once = mutated(obj, profiles)
    after_kueue = kueue_job_defaults(once, default_queue=default_queue)
    return mutated(after_kueue, profiles) if after_kueue != once else once


def kueue_first(
    obj: dict[str, Any], profiles: list[WorkloadProfile], *, default_queue: bool
) -> dict[str, Any]:
    return mutated(kueue_job_defaults(obj, default_queue=default_queue), profiles)


def template(obj: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = obj["spec"]["template"]
    return pod


def gates(pod_spec: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod_spec.get("schedulingGates") or []]


def record(meta: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(meta["annotations"][v.HINTS_ANNOTATION])
    return found


# --- the hold: the gate in the pod template, never spec.suspend ----------------------------------------


def test_a_kueue_follower_is_held_by_the_gate_in_its_template_and_its_suspend_is_left_alone():
    follower = job()
    result, held = mutate_and_check(follower, engine(make_ctx(), [PROFILING]))
    assert held["spec"]["suspend"] is False, "KRATOS never writes suspend on a Job Kueue manages"
    assert not any(op["path"] == "/spec/suspend" for op in result.patch)
    pod = template(held)
    assert gates(pod["spec"]) == [v.PROFILE_SCHEDULING_GATE]
    assert held["metadata"]["annotations"][v.AWAITING_PROFILE_ANNOTATION] == "sweep-profile"
    assert pod["metadata"]["annotations"][v.AWAITING_PROFILE_ANNOTATION] == "sweep-profile"
    assert pod["metadata"]["labels"][v.WORKLOAD_LABEL] == "sweep", (
        "its Pods reach the webhook and the controller"
    )
    for block in (held["metadata"], pod["metadata"]):
        assert "schedulingGates" in record(block)["injected"] and "suspend" not in record(block)["injected"]
        assert signature_valid(block, namespace="team-a", key=TEST_KEY)
    assert any("Kueue owns its spec.suspend" in w for w in result.decision.warnings)


def test_a_plain_follower_is_still_suspended():
    _, held = mutate_and_check(job(queue=None), engine(make_ctx(), [PROFILING]))
    assert held["spec"]["suspend"] is True and "schedulingGates" not in template(held)["spec"]


def test_the_deprecated_queue_annotation_counts_as_kueues_as_kueue_reads_it():
    follower = job(queue=None)
    follower["metadata"]["annotations"] = {QUEUE: "team"}
    _, held = mutate_and_check(follower, engine(make_ctx(), [PROFILING]))
    assert held["spec"]["suspend"] is False and gates(template(held)["spec"]) == [v.PROFILE_SCHEDULING_GATE]


# --- the two webhooks in either order ---------------------------------------------------------------


ORDER_CASES = [
    pytest.param(job(), [PROFILING], False, id="follower-queue-label"),
    pytest.param(job(queue=None), [PROFILING], True, id="follower-local-queue-defaulting"),
    pytest.param(job(queue=None, suspend=True), [PROFILING], True, id="follower-user-suspended-defaulting"),
    pytest.param(job(), [READY], False, id="ready-profile"),
    pytest.param(job(queue=None), [FAILED], True, id="failed-profile-defaulting"),
]


@pytest.mark.parametrize(("obj", "profiles", "default_queue"), ORDER_CASES)
def test_the_decision_is_the_same_in_either_order_of_the_webhooks(obj, profiles, default_queue):
    first = kratos_first(obj, profiles, default_queue=default_queue)
    second = kueue_first(obj, profiles, default_queue=default_queue)
    assert first == second
    assert first["spec"]["suspend"] is True, "Kueue suspended it either way"
    assert_valid_kubernetes(first)
    assert admit(first, engine(make_ctx(), profiles), webhook="validate").decision.allowed


def test_a_new_workloads_job_is_profiled_in_either_order_and_keeps_its_queue():
    for default_queue, obj in ((False, job("sweep-0")), (True, job("sweep-0", queue=None))):
        first = kratos_first(obj, [], default_queue=default_queue)
        second = kueue_first(obj, [], default_queue=default_queue)
        for out in (first, second):
            assert out["metadata"]["labels"][v.ROLE_LABEL] == "profiling"
            assert out["metadata"]["labels"][QUEUE] in ("team", "default"), "Kueue queues the profiling run"
            assert "schedulingGates" not in template(out)["spec"]
        # the same rewrite; only the original template differs (KRATOS saw the queue label or did not)
        for out in (first, second):
            out["metadata"]["annotations"].pop(v.ORIGINAL_TEMPLATE_ANNOTATION)
            out["metadata"]["annotations"].pop(v.SIGNATURE_ANNOTATION)
        assert first == second


def test_the_profiling_run_requests_only_what_a_cluster_queue_covers():
    """A ClusterQueue covers cpu, memory and nvidia.com/gpu; a workload Kueue cannot cover waits for ever."""
    for form in ("staged", "in-image"):
        user = job("sweep-0")
        user["metadata"]["annotations"] = {v.PROFILING_FORM_ANNOTATION: form}
        rewritten = mutated(user, [])
        pod = template(rewritten)["spec"]
        names = {
            name
            for c in [*pod.get("initContainers", []), *pod["containers"]]
            for part in ("requests", "limits")
            for name in (c.get("resources") or {}).get(part, {})
        }
        assert names <= {"cpu", "memory", v.GPU_RESOURCE}, (form, names)


# --- Pods of a held Kueue Job, and its release -----------------------------------------------------------


def pod_of(held_job: dict[str, Any], name: str = "sweep-1-abcde") -> dict[str, Any]:
    """A Pod as the Job controller makes it from the template (labels and annotations carried over)."""
    pod = copy.deepcopy(template(held_job))
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    pod["metadata"] = {**pod["metadata"], "name": name, "namespace": "team-a"}
    pod["metadata"]["labels"] = {**pod["metadata"]["labels"], "job-name": "sweep-1"}
    return pod


def held_kueue_job() -> dict[str, Any]:
    return mutated(kueue_job_defaults(job()), [PROFILING])


def test_a_pod_made_while_the_run_is_under_way_stays_gated():
    pod = pod_of(held_kueue_job())
    result = admit(pod, engine(make_ctx(), [PROFILING]))
    assert result.decision.allowed and result.patch == []


@pytest.mark.parametrize("settled", [READY, FAILED], ids=["ready", "failed"])
def test_a_pod_made_after_the_profile_settled_is_admitted_without_the_gate(settled):
    pod = pod_of(held_kueue_job())
    _, released = mutate_and_check(pod, engine(make_ctx(), [settled]))
    assert "schedulingGates" not in released["spec"]
    assert v.AWAITING_PROFILE_ANNOTATION not in released["metadata"]["annotations"]
    preferred = released["spec"]["affinity"]["nodeAffinity"].get(
        "preferredDuringSchedulingIgnoredDuringExecution"
    )
    assert bool(preferred) is (settled is READY), (
        "ranked hints from a Ready profile, base hints from a Failed one"
    )
    assert signature_valid(released["metadata"], namespace="team-a", key=TEST_KEY)


def release(obj: dict[str, Any], settled: WorkloadProfile = READY) -> dict[str, Any]:
    return release_hold(
        obj, "Job", profile=settled, node_products=frozenset({"NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"}),
        namespace="team-a", config=make_ctx().config, catalog=CATALOG, signing_key=TEST_KEY,
    )  # fmt: skip


def test_a_kueue_follower_not_yet_admitted_is_released_in_its_template_and_stays_suspended():
    held = held_kueue_job()
    assert template_mutable(held)
    released = release(held)
    assert released["spec"]["suspend"] is True, "Kueue's to unsuspend"
    pod = template(released)
    assert "schedulingGates" not in pod["spec"]
    assert v.AWAITING_PROFILE_ANNOTATION not in pod["metadata"]["annotations"]
    assert pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert admit(released, engine(make_ctx(), [READY]), webhook="validate").decision.allowed


def test_a_kueue_follower_kueue_started_changes_only_its_own_metadata():
    held = held_kueue_job()
    held["spec"]["suspend"] = False  # Kueue admitted it and started it: its template is immutable
    held["status"] = {"startTime": "2026-11-26T10:00:00Z", "active": 1}
    released = release(held)
    assert released["spec"] == held["spec"]
    assert v.AWAITING_PROFILE_ANNOTATION not in released["metadata"]["annotations"]
    assert signature_valid(released["metadata"], namespace="team-a", key=TEST_KEY)
    assert "schedulingGates" in record(released["metadata"])["injected"], "its Pods are released one by one"


def test_kueues_admission_of_a_held_follower_passes_kratos_validation():
    """Kueue's start: the flavor's nodeSelector and its own podset label into the template, then unsuspend."""
    held = held_kueue_job()
    started = copy.deepcopy(held)
    template(started)["spec"]["nodeSelector"] = {v.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}
    template(started)["metadata"]["labels"]["kueue.x-k8s.io/podset"] = "main"
    started["spec"]["suspend"] = False
    result = admit(started, engine(make_ctx(), [PROFILING]), webhook="validate", operation="UPDATE", old=held)
    assert result.decision.allowed, result.decision.violations


# --- kratos-admit release ------------------------------------------------------------------------------


def test_release_takes_the_gate_out_of_a_kueue_template_it_can_change_and_never_resumes_it():
    held = held_kueue_job()
    held["metadata"]["resourceVersion"] = "7"
    planned = plan_release("Job", held)
    assert planned is not None
    assert planned.patch == {
        "metadata": {"resourceVersion": "7"},
        "spec": {"template": {"spec": {"schedulingGates": None}}},
    }


def test_release_says_what_stays_held_in_a_started_kueue_jobs_template():
    held = held_kueue_job()
    held["spec"]["suspend"] = False
    held["status"] = {"startTime": "2026-11-26T10:00:00Z"}
    planned = plan_release("Job", held)
    assert planned is not None and planned.patch == {} and planned.done == ()
    assert "keeps the scheduling gate" in planned.line(dry_run=False)


def test_release_never_resumes_a_kueue_job_even_one_held_by_suspend():
    """A Kueue Job an older KRATOS suspended: Kueue's to unsuspend all the same."""
    suspended = mutated(job(queue=None), [PROFILING])
    suspended["metadata"]["labels"][QUEUE] = "team"
    assert plan_release("Job", suspended) is None


# --- the AdmissionCheck's state --------------------------------------------------------------------------


def test_the_check_is_pending_for_a_held_follower_and_ready_for_everything_else():
    held = held_kueue_job()
    assert admission_check_state(held, signing_key=TEST_KEY)[0] == "Pending"
    assert admission_check_state(release(held), signing_key=TEST_KEY)[0] == "Ready"
    assert admission_check_state(mutated(job("sweep-0"), []), signing_key=TEST_KEY)[0] == "Ready"
    assert admission_check_state(None, signing_key=TEST_KEY)[0] == "Ready"


def test_a_forged_awaiting_mark_holds_nothing():
    forged = job()
    forged["metadata"]["annotations"] = {v.AWAITING_PROFILE_ANNOTATION: "sweep-profile"}
    assert admission_check_state(forged, signing_key=TEST_KEY) == ("Ready", "no profiling run to wait for")
