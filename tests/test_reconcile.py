"""reconcile(observed) -> actions, as a table: every state a profiling Job and its products can be in;
the release of followers; observations of real runs."""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

import pytest

from kratos_admit.decisions.profiling import decode_original_template
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import ProfileStatus, RunnerSummary, TimeShares, WorkloadProfile
from kratos_admit.domain.signing import sign_block, signature_valid
from kratos_admit.model.telemetry import DRAM_ACTIVE, PIPE_FP32_ACTIVE, PodTelemetry
from kratos_controller.actions import (
    ContainerEnd,
    CreateExecutionJob,
    MarkExecutionJob,
    Observed,
    PublishConfigMap,
    PublishProfile,
    RecordObservations,
    ReleaseFollower,
    RemoveFinalizer,
)
from kratos_controller.learning import (
    Run,
    record_runs,
    record_telemetry,
    runs_of,
    telemetry_due,
    telemetry_run,
)
from kratos_controller.reconcile import (
    execution_job_name,
    orphan_profile,
    orphaned,
    pod_failure,
    profile_status,
    read_summary,
    reconcile,
    release_followers,
)
from tests.builders import PodBuilder, make_job, make_pod, make_profile
from tests.harness import (
    CATALOG,
    DATA,
    TEST_KEY,
    admit,
    assert_valid_kubernetes,
    engine,
    finish,
    make_ctx,
    profiling_job,
    require_fixtures,
    runner_summary,
    runner_summary_cannot_start,
)

FAILED_LAUNCH = DATA / "ncu" / "ada-failed-launch-nan-text.txt"  # ==ERROR== LaunchFailed, every figure nan

JOB = profiling_job()
DONE = finish(JOB)
SUMMARY = runner_summary()  # memory-bound, from the project's T4 two-kernel text report


def ran(message: str | None, exit_code: int = 0) -> ContainerEnd:
    return ContainerEnd(
        exit_code=exit_code, reason="Completed" if exit_code == 0 else "Error", message=message or ""
    )


def kinds(actions):
    return [type(a).__name__ for a in actions]


def published(observed: Observed):
    actions = reconcile(observed, signing_key=TEST_KEY)
    return {type(a).__name__: a for a in actions}


def as_profile(status: ProfileStatus, name: str = "vector-add-profile") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team-a", "resourceVersion": "9"},
        "status": status.as_status(),
    }


# --- a profiling run --------------------------------------------------------------------------------


def test_a_running_profiling_job_marks_the_workload_profiling_once():
    [action] = reconcile(Observed(job=JOB), signing_key=TEST_KEY)
    assert isinstance(action, PublishProfile) and action.status.phase == "Profiling"
    assert action.status.source_job == "vector-add"
    assert reconcile(Observed(job=JOB, profile=as_profile(action.status)), signing_key=TEST_KEY) == []


def test_complete_job_publishes_profile_and_summary_creates_and_marks_the_execution_job():
    actions = reconcile(Observed(job=DONE, runner=ran(SUMMARY), pods_seen=True), signing_key=TEST_KEY)
    assert kinds(actions) == ["PublishConfigMap", "PublishProfile", "CreateExecutionJob", "MarkExecutionJob"]
    cm, profile, create, mark = actions
    assert isinstance(cm, PublishConfigMap) and isinstance(profile, PublishProfile)
    assert isinstance(create, CreateExecutionJob) and isinstance(mark, MarkExecutionJob)
    assert (profile.namespace, profile.name, profile.spec) == (
        "team-a",
        "vector-add-profile",
        {"workload": "vector-add"},
    )
    status = profile.status.as_status()
    assert status["phase"] == "Ready" and status["boundType"] == "memory"
    assert status["metrics"]["memoryThroughput"] == "78.90" and status["metrics"]["kernelCount"] == "2"
    assert status["gpu"] == {"computeCapability": "7.5"}
    assert status["sourceJob"] == "vector-add" and status["profiledAt"] == "2026-11-22T10:03:00Z"
    assert cm.name == "vector-add-profile-summary" and cm.data["summary.json"] == SUMMARY
    assert (
        cm.data["boundType"] == "memory"
        and cm.data["smThroughput"] == "29.40"
        and cm.data["ncuVersion"] == "2024.3.2.0"
    )
    assert mark.annotations[v.EXECUTION_JOB_ANNOTATION] == "vector-add-execution"
    marked = copy.deepcopy(JOB["metadata"])
    marked["annotations"].update(mark.annotations)
    assert signature_valid(marked, namespace="team-a", key=TEST_KEY), "the original's block stays signed"


def test_a_nsight_compute_result_replaces_a_telemetry_profile_and_keeps_its_telemetry():
    telemetry = {
        "phase": "Ready",
        "boundType": "latency",
        "source": "telemetry",
        "telemetry": [{"product": "Tesla-T4", "runs": 2, "seconds": "900", "counters": {"DCGM_FI_PROF_DRAM_ACTIVE": "0.3"}}],
        "countedTelemetry": ["pod-1", "pod-2"],
    }  # fmt: skip
    existing = as_profile(ProfileStatus.model_validate(telemetry))
    profile = published(Observed(job=DONE, runner=ran(SUMMARY), profile=existing))["PublishProfile"]
    status = profile.status.as_status()
    assert (status["source"], status["boundType"]) == ("nsight-compute", "memory")
    assert (status["telemetry"], status["countedTelemetry"]) == (
        telemetry["telemetry"],
        telemetry["countedTelemetry"],
    )


@pytest.mark.parametrize(
    ("report", "phase", "bound", "memory", "message_part"),
    [
        pytest.param("mdinfo-t4-two-kernel-basic-text.txt", "Ready", "memory", "73.59", "", id="real-t4-text"),
        pytest.param("dd2360-sm89-failed-launch-full-text.txt", "Failed", "unknown", None, "LaunchFailed", id="real-failed-launch"),
    ],
)  # fmt: skip
def test_real_outside_reports_become_the_profile(report, phase, bound, memory, message_part):
    """The same publish path on real ncu outputs from ../shared/fixtures (skipped when absent)."""
    summary = runner_summary(require_fixtures() / "ncu" / report)
    actions = published(Observed(job=DONE, runner=ran(summary)))
    assert {"PublishConfigMap", "PublishProfile", "CreateExecutionJob"} <= set(actions)
    status = actions["PublishProfile"].status.as_status()
    assert (status["phase"], status["boundType"]) == (phase, bound)
    assert status["metrics"].get("memoryThroughput") == memory
    assert message_part in status.get("message", "")
    assert actions["PublishConfigMap"].data["summary.json"] == summary


@pytest.mark.parametrize(
    ("export", "unit"),
    [
        pytest.param("h100-ncu2025-torch-bf16-gemm.csv", "tensor", id="h100-bf16-gemm"),
        pytest.param("h100-ncu2025-stream.csv", "memory", id="h100-triad"),
        pytest.param("h100-ncu2025-compute.csv", "fp32", id="h100-fma-loop"),
    ],
)
def test_the_profile_carries_the_time_shares_of_the_runners_summary(export: str, unit: str):
    """Issue 43: the summary the runner writes from a real H100 export (pipe metrics of the basic set)
    becomes the profile's status.timeShares as it is, the unit the kernels ran on holding the time."""
    summary = runner_summary(require_fixtures() / "ncu" / export)
    written = json.loads(summary)["timeShares"]
    status = published(Observed(job=DONE, runner=ran(summary)))["PublishProfile"].status.as_status()
    assert status["timeShares"] == written and float(written[unit]) >= 0.8
    assert status["source"] == "nsight-compute"


def test_a_summary_without_time_shares_from_an_older_runner_writes_none():
    """The T4 report's summary as this runner writes it has shares from the speed-of-light figures;
    the same summary from a runner older than the units model has none, and the profile none either
    (the ranking then derives them from its throughputs)."""
    status = published(Observed(job=DONE, runner=ran(SUMMARY)))["PublishProfile"].status.as_status()
    assert status["timeShares"] == json.loads(SUMMARY)["timeShares"]
    older = json.loads(SUMMARY)
    del older["timeShares"], older["timeSharesFrom"]
    status = published(Observed(job=DONE, runner=ran(json.dumps(older))))["PublishProfile"].status.as_status()
    assert status["phase"] == "Ready" and "timeShares" not in status
    assert status["boundType"] == "memory" and status["metrics"]["memoryThroughput"] == "78.90"


def test_a_profile_written_before_time_shares_is_written_again_with_them():
    """A controller upgraded while a finished run still holds its finalizer: the same result, now with
    the summary's shares, is published again (a result differing only in timeShares is not the same)."""
    older = json.loads(SUMMARY)
    del older["timeShares"], older["timeSharesFrom"]
    before = published(Observed(job=DONE, runner=ran(json.dumps(older))))["PublishProfile"].status
    again = published(Observed(job=DONE, runner=ran(SUMMARY), profile=as_profile(before)))
    assert again["PublishProfile"].status.time_shares is not None
    settled = published(
        Observed(job=DONE, runner=ran(SUMMARY), profile=as_profile(again["PublishProfile"].status))
    )
    assert "PublishProfile" not in settled


def test_execution_job_is_the_original_job_owned_by_it_with_role_execution_and_signed():
    create = published(Observed(job=DONE, runner=ran(SUMMARY)))["CreateExecutionJob"]
    job = create.manifest
    original = decode_original_template(JOB, namespace="team-a", signing_key=TEST_KEY)
    assert job["metadata"]["name"] == "vector-add-execution" and job["metadata"]["namespace"] == "team-a"
    assert job["metadata"]["labels"] == {v.WORKLOAD_LABEL: "vector-add", v.ROLE_LABEL: "execution"}
    assert job["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "vector-add",
            "uid": "uid-vector-add",
            "blockOwnerDeletion": False,
        }
    ]
    assert job["spec"] == original["spec"]
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["--n", "4096"]
    assert signature_valid(job["metadata"], namespace="team-a", key=TEST_KEY)
    assert_valid_kubernetes(job)


def test_the_execution_job_inherits_the_users_ttl_the_profiling_job_dropped():
    user = make_job().job_spec(ttlSecondsAfterFinished=0).obj()
    rewritten = admit(user, engine(make_ctx())).decision.mutated
    assert rewritten is not None and "ttlSecondsAfterFinished" not in rewritten["spec"]
    rewritten["metadata"]["uid"] = "uid-1"
    create = published(Observed(job=finish(rewritten), runner=ran(SUMMARY)))["CreateExecutionJob"]
    assert create.manifest["spec"]["ttlSecondsAfterFinished"] == 0


def holding(job: dict[str, Any]) -> dict[str, Any]:
    assert v.RELEASE_FINALIZER in job["metadata"]["finalizers"]
    return job


def test_the_finalizer_goes_last_once_the_execution_job_exists():
    done = holding(finish(JOB))
    first = reconcile(
        Observed(job=done, runner=ran(SUMMARY), pods_holding=("vector-add-abcde",)), signing_key=TEST_KEY
    )
    assert not [a for a in first if isinstance(a, RemoveFinalizer)], (
        "nothing let go before the execution Job exists"
    )
    profile = as_profile(next(a for a in first if isinstance(a, PublishProfile)).status)
    marked = copy.deepcopy(done)
    marked["metadata"]["annotations"].update(
        next(a for a in first if isinstance(a, MarkExecutionJob)).annotations
    )
    later = reconcile(
        Observed(
            job=marked, runner=ran(SUMMARY), pods_holding=("vector-add-abcde",), profile=profile,
            configmap_exists=True, execution_job_exists=True,
        ),
        signing_key=TEST_KEY,
    )  # fmt: skip
    assert later == [
        RemoveFinalizer("Pod", "team-a", "vector-add-abcde"),
        RemoveFinalizer("Job", "team-a", "vector-add"),
    ]


def test_a_profiling_job_deleted_before_it_finished_still_releases_the_workload():
    deleted = copy.deepcopy(JOB)
    deleted["metadata"]["deletionTimestamp"] = "2026-11-22T10:01:00Z"
    actions = published(Observed(job=deleted, pods_seen=False))
    assert {"PublishProfile", "CreateExecutionJob"} <= set(actions)
    status = actions["PublishProfile"].status
    assert status.phase == "Failed" and "deleted before it finished" in status.message
    assert "MarkExecutionJob" not in actions, "a Job being deleted is not annotated any more"


@pytest.mark.parametrize(
    ("observed", "message_part"),
    [
        pytest.param(Observed(job=finish(JOB, "Failed", reason="DeadlineExceeded", message="Job was active longer than specified deadline"), runner=ran(None, 137), pods_seen=True), "DeadlineExceeded", id="failed-job-no-summary"),
        pytest.param(Observed(job=DONE, runner=ran("Segmentation fault (core dumped)")), "not JSON", id="unreadable-summary"),
        pytest.param(Observed(job=DONE, runner=ran('{"hello": 1}')), "not a KRATOS runner summary", id="foreign-json"),
        pytest.param(Observed(job=DONE, runner=ran(runner_summary(FAILED_LAUNCH))), "LaunchFailed", id="summary-unknown-bound"),
        pytest.param(Observed(job=DONE, pods_seen=False), "pod is gone", id="pod-gone"),
    ],
)  # fmt: skip
def test_failed_profiling_records_why_and_still_releases_the_workload(observed, message_part):
    actions = published(observed)
    assert {"PublishConfigMap", "PublishProfile", "CreateExecutionJob"} <= set(actions)
    status = actions["PublishProfile"].status
    assert status.phase == "Failed" and status.bound_type == "unknown"
    assert message_part in status.message


IN_IMAGE_FIX = "gpu.scheduler.io/profiling-form: in-image"


def test_a_staged_executable_that_could_not_start_fails_the_profile_naming_the_in_image_form():
    """The Job controller ends the profiling Job Failed (the runner exited 127, backoffLimit 0): the
    profile says why in the runner's words first, and the user's Job still runs as the execution Job."""
    summary = runner_summary_cannot_start()
    job = finish(
        JOB, "Failed", reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit"
    )
    actions = reconcile(Observed(job=job, runner=ran(summary, 127), pods_seen=True), signing_key=TEST_KEY)
    assert kinds(actions) == ["PublishConfigMap", "PublishProfile", "CreateExecutionJob", "MarkExecutionJob"]
    cm, profile, create, _ = actions
    assert isinstance(cm, PublishConfigMap) and isinstance(profile, PublishProfile)
    assert isinstance(create, CreateExecutionJob)
    status = profile.status
    assert (status.phase, status.bound_type) == ("Failed", "unknown")
    assert status.message.startswith(
        "/kratos/stage/vectorAdd could not start: shared library libcudart.so.12 is missing"
    )
    assert IN_IMAGE_FIX in status.message
    assert "profiling Job failed (BackoffLimitExceeded" in status.message
    assert cm.data["message"] == status.message and cm.data["exitCode"] == "127"
    assert cm.data["summary.json"] == summary
    original = decode_original_template(JOB, namespace="team-a", signing_key=TEST_KEY)
    assert create.manifest["spec"] == original["spec"], "the user's own Job, unchanged"
    assert create.manifest["metadata"]["labels"][v.ROLE_LABEL] == "execution"


@pytest.mark.parametrize(
    ("observed", "wording"),
    [
        pytest.param(Observed(job=DONE, pods_seen=False), "the profiling pod is gone (deleted or garbage-collected)", id="no-pod"),
        pytest.param(Observed(job=DONE, pods_seen=True, runner=ran(None, 137)), "profiling-runner ended Error (exit 137)", id="runner-no-message"),
        pytest.param(
            Observed(job=DONE, pods_seen=True, stage=ContainerEnd(66, "Error", "kratos: executable /app does not exist")),
            "stage-workload failed (exit 66): kratos: executable /app does not exist", id="stage-failed",
        ),
        pytest.param(Observed(job=DONE, pods_seen=True, runner=ran(SUMMARY)), "", id="runner-left-a-summary"),
    ],
)  # fmt: skip
def test_why_the_pod_gave_no_summary_is_worded_in_reconcile(observed, wording):
    assert pod_failure(observed) == wording


def test_profile_already_published_and_execution_job_there_gives_nothing_but_the_finalizer():
    first = published(Observed(job=DONE, runner=ran(SUMMARY)))
    marked = copy.deepcopy(DONE)
    marked["metadata"]["annotations"].update(first["MarkExecutionJob"].annotations)
    marked["metadata"]["finalizers"] = []
    observed = Observed(
        job=marked, runner=ran(SUMMARY), profile=as_profile(first["PublishProfile"].status),
        configmap_exists=True, execution_job_exists=True,
    )  # fmt: skip
    assert reconcile(observed, signing_key=TEST_KEY) == []


def test_controller_restarted_half_way_finishes_the_work():
    # published the profile, then died before creating the execution Job (and the ConfigMap was lost)
    first = published(Observed(job=DONE, runner=ran(SUMMARY)))
    actions = reconcile(
        Observed(job=DONE, runner=ran(SUMMARY), profile=as_profile(first["PublishProfile"].status)),
        signing_key=TEST_KEY,
    )
    assert kinds(actions) == ["PublishConfigMap", "CreateExecutionJob", "MarkExecutionJob"]


def test_a_profile_from_another_profiling_run_is_kept():
    other = {
        "metadata": {"name": "vector-add-profile"},
        "status": {"phase": "Ready", "boundType": "compute", "sourceJob": "vector-add-earlier"},
    }
    actions = reconcile(Observed(job=DONE, runner=ran(SUMMARY), profile=other), signing_key=TEST_KEY)
    assert kinds(actions) == ["CreateExecutionJob", "MarkExecutionJob"]


def test_a_profiling_mark_whose_run_is_gone_is_taken_over():
    """The race of two Jobs admitted before the controller marked the run: the second profiles too.
    If the first's Job vanished without a result, the second's profile replaces the stale mark."""
    stale = {
        "metadata": {"name": "vector-add-profile"},
        "status": {"phase": "Profiling", "sourceJob": "lost-job"},
    }
    kept = reconcile(
        Observed(job=DONE, runner=ran(SUMMARY), profile=stale, source_job_exists=True), signing_key=TEST_KEY
    )
    assert "PublishProfile" not in kinds(kept)
    taken = published(Observed(job=DONE, runner=ran(SUMMARY), profile=stale, source_job_exists=False))
    assert taken["PublishProfile"].status.phase == "Ready"


def test_unsigned_original_template_is_never_recreated():
    forged = finish(JOB)
    forged["metadata"]["annotations"][v.ORIGINAL_TEMPLATE_ANNOTATION] = "H4sIAAAAAAAA/6uuBQBDv6ajAgAAAA=="
    actions = published(Observed(job=forged, runner=ran(SUMMARY)))
    assert "CreateExecutionJob" not in actions
    assert actions["PublishProfile"].status.phase == "Failed"
    assert "no valid signature" in actions["PublishProfile"].status.message


def test_jobs_without_a_valid_workload_label_are_ignored():
    job = finish(JOB)
    del job["metadata"]["labels"][v.WORKLOAD_LABEL]
    assert reconcile(Observed(job=job, runner=ran(SUMMARY)), signing_key=TEST_KEY) == []


def test_workload_exit_code_is_noted_on_a_ready_profile_unless_the_runner_ended_it():
    status = profile_status(Observed(job=DONE), read_summary(ran(runner_summary(exit_code=3))))
    assert status.phase == "Ready" and status.message == "the workload exited 3 under profiling"
    killed = json.loads(runner_summary(exit_code=137))
    killed["killed"] = True
    status = profile_status(Observed(job=DONE), read_summary(ran(json.dumps(killed))))
    assert status.phase == "Ready" and status.message == ""


def test_the_runners_real_summary_matches_the_python_schema():
    summary = RunnerSummary.model_validate_json(runner_summary())
    assert summary.bound_type == "memory" and summary.kernels == 2 and summary.ncu_version == "2024.3.2.0"


@pytest.mark.parametrize("length", [1, 53, 54, 63, 200])
def test_execution_job_name_fits_63_characters_and_is_stable(length: int):
    name = "j" * length
    shortened = execution_job_name(name)
    assert len(shortened) <= 63 and shortened.endswith("-execution") and shortened == execution_job_name(name)
    if length + len("-execution") <= 63:
        assert shortened == name + "-execution"
    else:
        assert shortened != execution_job_name("k" * length)


def test_generate_name_jobs_get_their_real_name():
    job = profiling_job("sample-job-", workload="sample")
    job["metadata"]["name"] = "sample-job-x7k2p"
    create = published(Observed(job=finish(job), runner=ran(SUMMARY)))["CreateExecutionJob"]
    assert create.manifest["metadata"]["name"] == "sample-job-x7k2p-execution"


# --- followers --------------------------------------------------------------------------------------

RUNNING = make_profile(phase="Profiling", sm=None, mem=None, bound="unknown", product=None)


def held(builder) -> dict[str, Any]:
    """A Job or Pod of workload vector-add admitted while its profiling run is under way."""
    result = admit(builder.label(v.WORKLOAD_LABEL, "vector-add").obj(), engine(make_ctx(), [RUNNING]))
    assert result.decision.allowed and result.decision.mutated is not None
    return result.decision.mutated


def test_followers_are_held_at_admission_while_a_run_is_under_way():
    job, pod = held(make_job("sweep-1")), held(make_pod("pod-1"))
    assert (
        job["spec"]["suspend"] is True
        and job["metadata"]["annotations"][v.AWAITING_PROFILE_ANNOTATION] == "vector-add-profile"
    )
    assert {"name": v.PROFILE_SCHEDULING_GATE} in pod["spec"]["schedulingGates"]
    for obj in (job, pod):
        assert admit(obj, engine(make_ctx(), [RUNNING]), webhook="validate").decision.allowed


@pytest.mark.parametrize("phase", ["Ready", "Failed"])
def test_followers_are_released_when_the_run_ends(phase):
    job, pod = held(make_job("sweep-1")), held(make_pod("pod-1"))
    user_suspended = held(make_job("sweep-2").job_spec(suspend=True))
    profile = make_profile(phase=phase, message="ncu failed" if phase == "Failed" else "")
    actions = release_followers(
        profile, [("Job", job), ("Pod", pod), ("Job", user_suspended)],
        node_products=frozenset({"NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"}), config=make_ctx().config, catalog=CATALOG,
        signing_key=TEST_KEY,
    )  # fmt: skip
    assert [type(a) for a in actions] == [ReleaseFollower] * 3
    released = {a.name: a.released for a in actions if isinstance(a, ReleaseFollower)}
    assert released["sweep-1"]["spec"]["suspend"] is False
    assert released["sweep-2"]["spec"]["suspend"] is True, "a Job the user suspended stays suspended"
    assert "schedulingGates" not in released["pod-1"]["spec"]
    ranked = phase == "Ready"
    for name, obj in released.items():
        pod_spec = obj["spec"] if name == "pod-1" else obj["spec"]["template"]["spec"]
        preferred = pod_spec["affinity"]["nodeAffinity"].get(
            "preferredDuringSchedulingIgnoredDuringExecution"
        )
        assert bool(preferred) == ranked, name
        assert v.AWAITING_PROFILE_ANNOTATION not in obj["metadata"]["annotations"]
        assert_valid_kubernetes(obj)
        kind = "Pod" if name == "pod-1" else "Job"
        original = pod if name == "pod-1" else job if name == "sweep-1" else user_suspended
        update = admit(
            obj, engine(make_ctx(), [profile]), webhook="validate", operation="UPDATE", old=original
        )
        assert update.decision.allowed, (kind, update.decision.violations)


def test_a_forged_awaiting_mark_is_not_released():
    job = held(make_job("sweep-1"))
    job["metadata"]["annotations"][v.AWAITING_PROFILE_ANNOTATION] = "other-profile"
    actions = release_followers(
        make_profile(phase="Ready").model_copy(update={"metadata": make_profile().metadata.model_copy(update={"name": "other-profile"})}),
        [("Job", job)], node_products=frozenset(), config=make_ctx().config, catalog=CATALOG, signing_key=TEST_KEY,
    )  # fmt: skip
    assert actions == []


def test_no_release_while_the_run_is_still_under_way():
    job = held(make_job("sweep-1"))
    assert (
        release_followers(
            RUNNING,
            [("Job", job)],
            node_products=frozenset(),
            config=make_ctx().config,
            catalog=CATALOG,
            signing_key=TEST_KEY,
        )
        == []
    )


# --- observations -----------------------------------------------------------------------------------


def finished_pod(
    uid: str, node: str, start: str, end: str, *, phase: str = "Succeeded", exit_code: int = 0
) -> dict[str, Any]:
    return {
        "metadata": {"name": f"pod-{uid}", "uid": uid},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "resources": {"limits": {v.GPU_RESOURCE: 1}}}],
        },
        "status": {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": "main",
                    "state": {"terminated": {"exitCode": exit_code, "startedAt": start, "finishedAt": end}},
                }
            ],
        },
    }


def test_runs_are_the_gpu_containers_start_to_finish_on_the_nodes_product():
    pods = [
        finished_pod("a", "node-1", "2026-11-22T10:00:00Z", "2026-11-22T10:06:40Z"),
        finished_pod(
            "b", "node-2", "2026-11-22T10:00:00Z", "2026-11-22T10:01:00Z", phase="Failed", exit_code=1
        ),
        finished_pod("c", "node-unknown", "2026-11-22T10:00:00Z", "2026-11-22T10:01:00Z"),
    ]
    runs = runs_of(pods, {"node-1": "NVIDIA-A100-SXM4-80GB", "node-2": "NVIDIA-L40S"})
    assert runs == [Run("a", "NVIDIA-A100-SXM4-80GB", 400.0)]


def test_observations_keep_a_running_mean_and_never_count_a_run_twice():
    profile = as_profile(make_profile().status)  # type: ignore[arg-type]
    first = record_runs(profile, [Run("a", "NVIDIA-L40S", 300.0), Run("b", "NVIDIA-L40S", 500.0)])
    assert first is not None
    profile["status"] = first.status.as_status()
    assert profile["status"]["observations"] == [
        {"product": "NVIDIA-L40S", "runs": 2, "meanSeconds": "400.0"}
    ]
    assert record_runs(profile, [Run("b", "NVIDIA-L40S", 500.0)]) is None, "a replayed run counts once"
    second = record_runs(profile, [Run("b", "NVIDIA-L40S", 500.0), Run("c", "NVIDIA-L40S", 700.0)])
    assert second is not None
    assert second.status.observations[0].runs == 3 and second.status.observations[0].mean_seconds == "500.0"
    assert second.resource_version == "9", "the write is guarded by the profile's resourceVersion"


def test_a_gangs_runs_carry_its_size_from_the_pods_hints_record_and_each_size_is_its_own_entry():
    """The hints record a gang's Pods inherit says how many GPUs it runs on together (``gangGPUs``):
    where its profile measured its links, its runs' observations are kept by product and size, so 8 and
    16 GPUs of one workload stay apart."""
    pod = finished_pod("g", "node-1", "2026-11-22T10:00:00Z", "2026-11-22T10:06:40Z")
    pod["metadata"]["annotations"] = {v.HINTS_ANNOTATION: json.dumps({"gang": "Indexed Job", "gangGPUs": 16})}
    assert runs_of([pod], {"node-1": "NVIDIA-L40S"}) == [Run("g", "NVIDIA-L40S", 400.0, 16)]
    status = make_profile().status
    assert status is not None
    linked = TimeShares(tensor="0.50", interconnect="0.40", latency="0.10")  # its links were measured
    profile = as_profile(status.model_copy(update={"time_shares": linked}))
    runs = [
        Run("a", "NVIDIA-L40S", 300.0, 16),
        Run("b", "NVIDIA-L40S", 100.0, 8),
        Run("c", "NVIDIA-L40S", 50.0),
    ]
    recorded = record_runs(profile, runs)
    assert recorded is not None
    assert recorded.status.as_status()["observations"] == [
        {"product": "NVIDIA-L40S", "runs": 1, "meanSeconds": "50.0"},
        {"product": "NVIDIA-L40S", "runs": 1, "meanSeconds": "100.0", "gangGPUs": 8},
        {"product": "NVIDIA-L40S", "runs": 1, "meanSeconds": "300.0", "gangGPUs": 16},
    ]
    assert recorded.status.counted_runs == ["c", "b", "a"] and recorded.status.observed_runs == 3


def test_the_observations_change_the_ranking_through_the_profile():
    profile = make_profile(sm="12.0", mem="85.0", product="NVIDIA-A100-SXM4-80GB")
    raw = as_profile(profile.status)  # type: ignore[arg-type]
    runs = [Run(f"a{i}", "NVIDIA-A100-SXM4-80GB", 400.0) for i in range(3)]
    runs += [Run(f"l{i}", "NVIDIA-L40S", 200.0) for i in range(3)]
    recorded = record_runs(raw, runs)
    assert recorded is not None
    seen = WorkloadProfile.model_validate(
        {**profile.model_dump(by_alias=True), "status": recorded.status.as_status()}
    )
    job = make_job().obj()
    sign_block(
        job["metadata"], namespace="team-a", key=TEST_KEY
    )  # no KRATOS key yet: the signature alone is harmless
    del job["metadata"]["annotations"]
    result = admit(job, engine(make_ctx(), [seen], products=("NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S")))
    record = json.loads(result.decision.mutated["metadata"]["annotations"][v.HINTS_ANNOTATION])  # type: ignore[index]
    assert [r["product"] for r in record["ranked"]] == ["NVIDIA-L40S", "NVIDIA-A100-SXM4-80GB"]
    assert all(r["source"] == "observed" for r in record["ranked"])


def test_followers_of_a_run_that_never_started_are_released_with_base_hints():
    job = held(make_job("sweep-1"))
    job["metadata"]["creationTimestamp"] = "2026-11-22T10:00:00Z"
    late = dt.datetime(2026, 11, 22, 10, 5, tzinfo=dt.UTC)
    grace = make_ctx().config.follower_release_seconds  # 180 s by default
    assert orphaned(job, now=late, grace=grace) and not orphaned(
        job, now=late - dt.timedelta(minutes=4), grace=grace
    )
    two_minutes = late - dt.timedelta(minutes=3)  # held two minutes: released only under a shorter delay
    assert not orphaned(job, now=two_minutes, grace=grace)
    assert orphaned(
        job, now=two_minutes, grace=make_ctx(followerReleaseSeconds=60).config.follower_release_seconds
    )
    [action] = release_followers(
        orphan_profile("team-a", "vector-add"), [("Job", job)], node_products=frozenset(),
        config=make_ctx().config, catalog=CATALOG, signing_key=TEST_KEY,
    )  # fmt: skip
    assert isinstance(action, ReleaseFollower) and action.released["spec"]["suspend"] is False
    record = json.loads(action.released["metadata"]["annotations"][v.HINTS_ANNOTATION])
    assert "never started" not in record["reason"] and "is Failed" in record["reason"]


# --- telemetry -------------------------------------------------------------------------------------

NOW = dt.datetime(2026, 11, 25, 8, 0, tzinfo=dt.UTC)
STARTED = "2026-11-25T07:00:00Z"  # an hour before NOW


def gpu_pod(name: str = "infer-0") -> PodBuilder:
    return make_pod(name).label(v.WORKLOAD_LABEL, "infer")


@pytest.mark.parametrize(
    ("pod", "due"),
    [
        pytest.param(gpu_pod().ran("gpu-0", STARTED, "2026-11-25T07:05:00Z"), ("2026-11-25T07:05:00+00:00", 300.0), id="bare-pod-succeeded-whole-run"),
        pytest.param(gpu_pod("job-pod").label("job-name", "j").ran("gpu-0", STARTED, "2026-11-25T07:30:00Z"), ("2026-11-25T07:30:00+00:00", 1800.0), id="job-pod-succeeded"),
        pytest.param(gpu_pod("web-5d9c-x").owned_by("ReplicaSet", "web-5d9c").ran("gpu-0", STARTED), ("2026-11-25T07:10:00+00:00", 600.0), id="deployment-pod-running-past-its-window"),
        pytest.param(gpu_pod("db-0").owned_by("StatefulSet", "db").ran("gpu-0", "2026-11-25T07:58:00Z"), 480.0, id="statefulset-pod-inside-its-window-waits"),
        pytest.param(gpu_pod().ran("gpu-0", STARTED, "2026-11-25T07:05:00Z", exit_code=1), None, id="failed-run"),
        pytest.param(gpu_pod().label(v.ROLE_LABEL, "profiling").ran("gpu-0", STARTED, "2026-11-25T07:05:00Z"), None, id="profiling-run-under-ncu"),
        pytest.param(gpu_pod().no_resources().ran("gpu-0", STARTED, "2026-11-25T07:05:00Z"), None, id="no-gpu"),
        pytest.param(gpu_pod().limits({"nvidia.com/mig-1g.10gb": 1}).ran("gpu-0", STARTED, "2026-11-25T07:05:00Z"), ("2026-11-25T07:05:00+00:00", 300.0), id="mig-slice"),
        pytest.param(make_pod("x").unlabelled().ran("gpu-0", STARTED, "2026-11-25T07:05:00Z"), None, id="not-opted-in"),
        pytest.param(gpu_pod(), None, id="not-scheduled"),
    ],
)  # fmt: skip
def test_an_opted_in_gpu_pod_of_any_owner_is_due_when_it_succeeds_or_its_window_passes(pod, due):
    found = telemetry_due(pod.obj(), now=NOW, window_seconds=600)
    if isinstance(due, tuple):
        assert not isinstance(found, (float, type(None)))
        assert (found.end.isoformat(), found.seconds, found.workload, found.node) == (*due, "infer", "gpu-0")
    else:
        assert found == due


def _telemetry_run(pod: str, uid: str) -> tuple[Any, Any]:
    obj = gpu_pod(pod).ran("gpu-0", STARTED, "2026-11-25T07:05:00Z").obj()
    obj["metadata"]["uid"] = uid
    due = telemetry_due(obj, now=NOW, window_seconds=600)
    found = PodTelemetry({DRAM_ACTIVE: 0.8, PIPE_FP32_ACTIVE: 0.15}, ("GPU-a", "GPU-b"), ())
    run = telemetry_run(due, found, "NVIDIA-L4")  # type: ignore[arg-type]
    return due, run


def test_a_run_of_a_workload_without_a_profile_creates_a_ready_telemetry_profile():
    due, run = _telemetry_run("infer-0", "uid-1")
    action = record_telemetry(None, due, run, now="2026-11-25T08:00:00Z")
    assert isinstance(action, PublishProfile) and action.only_new, "never over a profile made meanwhile"
    assert (action.namespace, action.name) == (
        "team-a",
        "infer-profile",
    )
    assert action.labels == {v.WORKLOAD_LABEL: "infer"} and action.spec == {"workload": "infer"}
    status = action.status.as_status()
    assert (status["phase"], status["source"], status["boundType"]) == ("Ready", "telemetry", "memory")
    assert status["telemetry"] == [
        {
            "product": "NVIDIA-L4",
            "runs": 1,
            "seconds": "600",
            "counters": {DRAM_ACTIVE: "0.8", PIPE_FP32_ACTIVE: "0.15"},
        }
    ]


def test_a_run_folds_into_an_existing_profile_once_guarded_by_its_resource_version():
    due, run = _telemetry_run("infer-0", "uid-1")
    existing = as_profile(make_profile("infer", bound="compute").status)  # type: ignore[arg-type]
    action = record_telemetry(existing, due, run, now="2026-11-25T08:00:00Z")
    assert isinstance(action, RecordObservations) and action.resource_version == "9"
    assert action.status.bound_type == "compute" and action.status.counted_telemetry == ["uid-1"]
    again = {**existing, "status": action.status.as_status()}
    assert record_telemetry(again, due, run, now="2026-11-25T08:01:00Z") is None


def test_no_profiling_counter_means_no_run_to_fold():
    due, _ = _telemetry_run("infer-0", "uid-1")
    assert telemetry_run(due, PodTelemetry({}, ("GPU-a",), (DRAM_ACTIVE,)), "NVIDIA-L4") is None
