"""reconcile(observed) -> actions, as a table: every state a profiling Job and its products can be in."""

from __future__ import annotations

import pytest

from kratos_admit import vocabulary as v
from kratos_admit.profiling import decode_original_template
from kratos_admit.signing import signature_valid
from kratos_controller.reconcile import (
    CreateExecutionJob,
    Observed,
    PublishConfigMap,
    PublishProfile,
    execution_job_name,
    profile_status,
    read_summary,
    reconcile,
)
from tests.conftest import TEST_KEY, assert_valid_kubernetes
from tests.controller_helpers import finish, profiling_job, runner_summary

JOB = profiling_job()
DONE = finish(JOB)
SUMMARY = runner_summary()  # memory-bound, from the T4 two-kernel report


def kinds(actions):
    return [type(a).__name__ for a in actions]


def published(observed: Observed):
    actions = reconcile(observed, signing_key=TEST_KEY)
    return {type(a).__name__: a for a in actions}


def test_running_job_gives_nothing():
    assert reconcile(Observed(job=JOB, runner_message=SUMMARY), signing_key=TEST_KEY) == []


def test_complete_job_publishes_profile_and_summary_then_creates_the_execution_job():
    actions = reconcile(Observed(job=DONE, runner_message=SUMMARY), signing_key=TEST_KEY)
    assert kinds(actions) == ["PublishConfigMap", "PublishProfile", "CreateExecutionJob"]
    cm, profile, create = actions
    assert (
        isinstance(cm, PublishConfigMap)
        and isinstance(profile, PublishProfile)
        and isinstance(create, CreateExecutionJob)
    )
    assert (profile.namespace, profile.name, profile.spec) == (
        "team-a",
        "vector-add-profile",
        {"workload": "vector-add"},
    )
    assert profile.status["phase"] == "Ready" and profile.status["boundType"] == "memory"
    assert (
        profile.status["metrics"]["memoryThroughput"] == "73.59"
        and profile.status["metrics"]["kernelCount"] == "2"
    )
    assert profile.status["gpu"] == {"computeCapability": "7.5"}
    assert (
        profile.status["sourceJob"] == "vector-add" and profile.status["profiledAt"] == "2026-11-22T10:03:00Z"
    )
    assert cm.name == "vector-add-profile-summary" and cm.data["summary.json"] == SUMMARY
    assert (
        cm.data["boundType"] == "memory"
        and cm.data["smThroughput"] == "33.23"
        and cm.data["ncuVersion"] == "2024.3.2.0"
    )


def test_execution_job_is_the_original_job_with_role_execution_and_signed():
    create = reconcile(Observed(job=DONE, runner_message=SUMMARY), signing_key=TEST_KEY)[-1]
    assert isinstance(create, CreateExecutionJob)
    job = create.manifest
    original = decode_original_template(JOB, namespace="team-a", signing_key=TEST_KEY)
    assert job["metadata"]["name"] == "vector-add-execution" and job["metadata"]["namespace"] == "team-a"
    assert job["metadata"]["labels"] == {v.WORKLOAD_LABEL: "vector-add", v.ROLE_LABEL: "execution"}
    assert job["spec"] == original["spec"]
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["--n", "4096"]
    assert signature_valid(job["metadata"], namespace="team-a", key=TEST_KEY)
    assert_valid_kubernetes(job)


@pytest.mark.parametrize(
    ("observed", "message_part"),
    [
        pytest.param(Observed(job=finish(JOB, "Failed", reason="DeadlineExceeded", message="Job was active longer than specified deadline"), pod_failure="profiling-runner ended Error (exit 137)"), "DeadlineExceeded", id="failed-job-no-summary"),
        pytest.param(Observed(job=DONE, runner_message="Segmentation fault (core dumped)"), "not JSON", id="unreadable-summary"),
        pytest.param(Observed(job=DONE, runner_message='{"hello": 1}'), "not a KRATOS runner summary", id="foreign-json"),
        pytest.param(Observed(job=DONE, runner_message=runner_summary("dd2360-sm89-failed-launch-full-text.txt")), "LaunchFailed", id="summary-unknown-bound"),
        pytest.param(Observed(job=DONE, runner_message=None, pod_failure="the profiling pod is gone (deleted or garbage-collected)"), "pod is gone", id="pod-gone"),
    ],
)  # fmt: skip
def test_failed_profiling_records_why_and_still_releases_the_workload(observed, message_part):
    actions = published(observed)
    assert set(actions) == {"PublishConfigMap", "PublishProfile", "CreateExecutionJob"}
    status = actions["PublishProfile"].status
    assert status["phase"] == "Failed" and status["boundType"] == "unknown"
    assert message_part in status["message"]


def test_profile_already_published_and_execution_job_there_gives_nothing():
    first = published(Observed(job=DONE, runner_message=SUMMARY))
    profile = {"metadata": {"name": "vector-add-profile"}, "status": first["PublishProfile"].status}
    observed = Observed(
        job=DONE, runner_message=SUMMARY, profile=profile, configmap_exists=True, execution_job_exists=True
    )
    assert reconcile(observed, signing_key=TEST_KEY) == []


def test_controller_restarted_half_way_finishes_the_work():
    # published the profile, then died before creating the execution Job (and the ConfigMap was lost)
    first = published(Observed(job=DONE, runner_message=SUMMARY))
    profile = {"metadata": {"name": "vector-add-profile"}, "status": first["PublishProfile"].status}
    actions = reconcile(Observed(job=DONE, runner_message=SUMMARY, profile=profile), signing_key=TEST_KEY)
    assert kinds(actions) == ["PublishConfigMap", "CreateExecutionJob"]


def test_execution_job_already_there_publishes_only_the_profile():
    actions = reconcile(
        Observed(job=DONE, runner_message=SUMMARY, execution_job_exists=True), signing_key=TEST_KEY
    )
    assert kinds(actions) == ["PublishConfigMap", "PublishProfile"]


def test_a_profile_from_another_profiling_run_is_kept():
    other = {
        "metadata": {"name": "vector-add-profile"},
        "status": {"phase": "Ready", "boundType": "compute", "sourceJob": "vector-add-earlier"},
    }
    actions = reconcile(Observed(job=DONE, runner_message=SUMMARY, profile=other), signing_key=TEST_KEY)
    assert kinds(actions) == ["CreateExecutionJob"]


def test_a_stale_profile_from_this_job_is_updated():
    stale = {
        "metadata": {"name": "vector-add-profile"},
        "status": {"phase": "Failed", "sourceJob": "vector-add", "message": "old"},
    }
    actions = reconcile(
        Observed(
            job=DONE, runner_message=SUMMARY, profile=stale, configmap_exists=True, execution_job_exists=True
        ),
        signing_key=TEST_KEY,
    )
    assert kinds(actions) == ["PublishConfigMap", "PublishProfile"]


def test_unsigned_original_template_is_never_recreated():
    forged = finish(JOB)
    forged["metadata"]["annotations"][v.ORIGINAL_TEMPLATE_ANNOTATION] = "H4sIAAAAAAAA/6uuBQBDv6ajAgAAAA=="
    actions = published(Observed(job=forged, runner_message=SUMMARY))
    assert "CreateExecutionJob" not in actions
    assert actions["PublishProfile"].status["phase"] == "Failed"
    assert "no valid signature" in actions["PublishProfile"].status["message"]


def test_jobs_without_a_valid_workload_label_are_ignored():
    job = finish(JOB)
    del job["metadata"]["labels"][v.WORKLOAD_LABEL]
    assert reconcile(Observed(job=job, runner_message=SUMMARY), signing_key=TEST_KEY) == []


def test_workload_exit_code_is_noted_on_a_ready_profile():
    status = profile_status(Observed(job=DONE), read_summary(runner_summary(exit_code=3)))
    assert status["phase"] == "Ready" and status["message"] == "the workload exited 3 under profiling"


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
    create = reconcile(Observed(job=finish(job), runner_message=SUMMARY), signing_key=TEST_KEY)[-1]
    assert (
        isinstance(create, CreateExecutionJob)
        and create.manifest["metadata"]["name"] == "sample-job-x7k2p-execution"
    )
