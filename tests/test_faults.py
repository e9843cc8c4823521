"""Issue 37, without a cluster: the faults a real node brings, named from the kubelet's own statuses.

The Pods in tests/data/kubelet/ are what a real kubelet (v1.28.7, containerd) reported (the README
there says how each was made); here each becomes the profiling Pod of a profiling Job (its one
container renamed as KRATOS names its containers), and the pure controller says what it makes of it.
A kubelet eviction (``Evicted``) could not be caused on the test node; its Pod is written as the
kubelet's eviction manager writes one (pkg/kubelet/eviction: phase Failed, reason Evicted, message
"The node was low on resource: ...").
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_controller.actions import CreateExecutionJob, Observed, PublishProfile, StopJob
from kratos_controller.faults import image_pull_wait, kubelet_failure, stop_job
from kratos_controller.kube_io import container_ends, disruption, pull_failure
from kratos_controller.reconcile import reconcile
from tests.builders import make_job
from tests.harness import (
    DATA,
    JOBS,
    PODS,
    PROFILES,
    TEST_KEY,
    eventually,
    finish,
    kratos_cluster,
    profiling_job,
    runner_summary_failed,
)

KUBELET = DATA / "kubelet"
GRACE = 300.0


def captured(
    name: str, *, container: str = v.RUNNER_CONTAINER, job: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A Pod of tests/data/kubelet as the profiling Pod of ``job``: its container renamed."""
    pod: dict[str, Any] = json.loads((KUBELET / f"{name}.json").read_text())
    pod["spec"]["containers"][0]["name"] = container
    pod["status"]["containerStatuses"][0]["name"] = container
    if job is not None:
        pod["metadata"]["labels"] = {"job-name": job["metadata"]["name"], v.ROLE_LABEL: "profiling"}
    return pod


def started(pod: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(pod["status"]["startTime"].replace("Z", "+00:00"))


def running(job: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(job)
    out["status"] = {"startTime": "2026-11-26T09:21:02Z", "active": 1}
    return out


def observed_of(job: dict[str, Any], pods: list[dict[str, Any]], *, now: dt.datetime) -> Observed:
    runner, stage = container_ends(pods)
    return Observed(
        job=job, runner=runner, stage=stage, pods_seen=bool(pods), pull=pull_failure(pods),
        disruption=disruption(pods), now=now, profile={"status": {"phase": "Profiling", "sourceJob": job["metadata"]["name"]}},
    )  # fmt: skip


# --- image-pull ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capture", "reason", "at_once"),
    [
        pytest.param("pull-missing", "ErrImagePull", False, id="no-registry-has-it"),
        pytest.param("pull-never", "ErrImageNeverPull", False, id="pull-policy-never"),
        pytest.param("pull-invalid", "InvalidImageName", True, id="invalid-name"),
    ],
)
def test_an_image_that_never_pulls_ends_the_run_after_the_grace_or_at_once(
    capture: str, reason: str, at_once: bool
):
    job = running(profiling_job("train"))
    pod = captured(capture, job=job)
    pull = pull_failure([pod])
    assert pull is not None and pull.reason == reason and pull.image == pod["spec"]["containers"][0]["image"]
    early = observed_of(job, [pod], now=started(pod) + dt.timedelta(seconds=10))
    assert image_pull_wait(early, grace=GRACE) == (0.0 if at_once else GRACE - 10)
    late = observed_of(job, [pod], now=started(pod) + dt.timedelta(seconds=GRACE + 1))
    assert image_pull_wait(late, grace=GRACE) == 0.0
    failure = kubelet_failure(late, grace=GRACE)
    assert failure is not None and failure[0] == "image-pull"
    assert (
        pull.image in failure[1]
        and reason in failure[1]
        and pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"][:60] in failure[1]
    )


def test_a_run_whose_image_never_pulls_is_stopped_and_published_failed_and_the_workload_recreated():
    job = running(profiling_job("train"))
    pod = captured("pull-missing", job=job)
    before = reconcile(
        observed_of(job, [pod], now=started(pod) + dt.timedelta(seconds=60)), signing_key=TEST_KEY
    )
    assert before == [], "within the grace: the run goes on"
    now = started(pod) + dt.timedelta(seconds=GRACE + 5)
    actions = reconcile(observed_of(job, [pod], now=now), signing_key=TEST_KEY)
    [stop] = [a for a in actions if isinstance(a, StopJob)]
    job_started = dt.datetime.fromisoformat(job["status"]["startTime"].replace("Z", "+00:00"))
    assert stop.active_deadline_seconds == int((now - job_started).total_seconds()), (
        "the time the Job has run"
    )
    [profile] = [a for a in actions if isinstance(a, PublishProfile)]
    assert profile.status.phase == "Failed" and profile.status.failure == "image-pull"
    assert profile.status.conditions and profile.status.conditions[0].reason == "ImagePull"
    assert any(isinstance(a, CreateExecutionJob) for a in actions), "nothing of the user's is lost"
    assert not any(a.__class__.__name__ == "RemoveFinalizer" for a in actions), "the finalizer goes last"


def test_stopping_is_done_once():
    job = running(profiling_job("train"))
    now = dt.datetime(2026, 11, 26, 9, 31, 2, tzinfo=dt.UTC)
    stop = stop_job(job, now)
    assert stop is not None and stop.active_deadline_seconds == 600
    job["spec"]["activeDeadlineSeconds"] = 600
    assert stop_job(job, now) is None


# --- killed ----------------------------------------------------------------------------------------


def test_an_oom_killed_runner_is_named_with_its_limit_and_what_to_do():
    job = finish(profiling_job("train"), "Failed", reason="BackoffLimitExceeded")
    job["spec"]["template"]["spec"]["containers"][0].setdefault("resources", {}).setdefault("limits", {})[
        "memory"
    ] = "40Mi"
    pod = captured("oom", job=job)
    failure = kubelet_failure(observed_of(job, [pod], now=dt.datetime.now(dt.UTC)), grace=GRACE)
    assert failure is not None and failure[0] == "killed"
    assert (
        "OOMKilled at its memory limit (40Mi)" in failure[1]
        and "raise that container's memory limit" in failure[1]
    )


def test_an_oom_kill_of_ncu_under_the_runner_is_killed_not_the_runners_guess():
    """Seen with the runner image under a 12 MiB limit: the kernel killed ncu, the runner wrote
    ncu-error (exit -9) and exited; containerd reports the container OOMKilled all the same."""
    job = finish(profiling_job("train"), "Failed", reason="BackoffLimitExceeded")
    pod = captured("oom", job=job)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = runner_summary_failed("")
    [profile] = [
        a
        for a in reconcile(observed_of(job, [pod], now=dt.datetime.now(dt.UTC)), signing_key=TEST_KEY)
        if isinstance(a, PublishProfile)
    ]
    assert profile.status.failure == "killed" and "OOMKilled" in profile.status.message
    assert "the runner said: ncu failed: it printed nothing" in profile.status.message


def test_an_oom_killed_staging_container_names_the_setting_that_sizes_it():
    job = finish(profiling_job("train"), "Failed", reason="BackoffLimitExceeded")
    pod = captured("oom", job=job)
    stage_status = copy.deepcopy(pod["status"]["containerStatuses"][0])
    stage_status["name"] = v.STAGE_CONTAINER
    pod["status"] = {**pod["status"], "initContainerStatuses": [stage_status], "containerStatuses": []}
    runner, stage = container_ends([pod])
    assert runner is None and stage is not None and stage.container == v.STAGE_CONTAINER
    failure = kubelet_failure(observed_of(job, [pod], now=dt.datetime.now(dt.UTC)), grace=GRACE)
    assert failure is not None and failure[0] == "killed" and "profilingResources.limits.memory" in failure[1]


def init_killed(job: dict[str, Any]) -> dict[str, Any]:
    """tests/data/kubelet/init-killed.json, the profiling Pod of ``job``."""
    pod: dict[str, Any] = json.loads((KUBELET / "init-killed.json").read_text())
    pod["metadata"]["labels"] = {"job-name": job["metadata"]["name"], v.ROLE_LABEL: "profiling"}
    return pod


def test_the_users_own_init_container_killed_from_the_host_is_killed_and_named():
    """Our own fault check on the real node: ``ctr task kill -s SIGKILL`` of the Job's init container
    ``prepare`` while it ran. The runner never started, so there is no summary: the profile says
    which container ended, how, and what exit 137 means, not that the runner left no message."""
    job = finish(profiling_job("train"), "Failed", reason="BackoffLimitExceeded")
    pod = init_killed(job)
    runner, stage = container_ends([pod])
    assert runner is None and stage is not None
    assert (stage.container, stage.reason, stage.exit_code) == ("prepare", "Error", 137)
    failure = kubelet_failure(observed_of(job, [pod], now=dt.datetime.now(dt.UTC)), grace=GRACE)
    assert failure is not None and failure[0] == "killed"
    assert "the Job's own init container prepare ended 'Error' (exit 137)" in failure[1]
    assert "137 is SIGKILL" in failure[1] and "kubectl logs -c prepare" in failure[1]
    actions = reconcile(observed_of(job, [pod], now=dt.datetime.now(dt.UTC)), signing_key=TEST_KEY)
    [profile] = [a for a in actions if isinstance(a, PublishProfile)]
    assert profile.status.failure == "killed" and "profiling-runner left no termination message" not in (
        profile.status.message
    )
    assert any(isinstance(a, CreateExecutionJob) for a in actions), "nothing of the user's is lost"


def test_the_users_own_init_container_oom_killed_names_its_own_limit_not_kratos_setting():
    job = finish(profiling_job("train"), "Failed", reason="BackoffLimitExceeded")
    job["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "prepare", "image": "train:1", "resources": {"limits": {"memory": "64Mi"}}}
    ]
    pod = init_killed(job)
    pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"] = "OOMKilled"
    failure = kubelet_failure(observed_of(job, [pod], now=dt.datetime.now(dt.UTC)), grace=GRACE)
    assert failure is not None and failure[0] == "killed"
    assert "init container prepare was OOMKilled at its memory limit (64Mi)" in failure[1]
    assert "profilingResources" not in failure[1]


def test_a_users_init_container_that_cannot_start_is_cannot_start_naming_it():
    """A reason the kubelet gives a container that never ran (``StartError``, exit 128: a command
    that does not exist) is the Job's own failure: ``cannot-start``, naming that container."""
    job = finish(profiling_job("train"), "Failed", reason="BackoffLimitExceeded")
    pod = init_killed(job)
    pod["status"]["initContainerStatuses"][0]["state"]["terminated"].update(
        reason="StartError", exitCode=128, message='exec: "prep": executable file not found in $PATH'
    )
    actions = reconcile(observed_of(job, [pod], now=dt.datetime.now(dt.UTC)), signing_key=TEST_KEY)
    [profile] = [a for a in actions if isinstance(a, PublishProfile)]
    assert profile.status.failure == "cannot-start"
    assert profile.status.message.startswith("prepare failed (exit 128): exec:"), profile.status.message


@pytest.mark.parametrize(
    ("capture", "words"),
    [
        pytest.param("deleted", "deleted while it ran", id="deleted"),
        pytest.param("evicted-api", "'EvictionByEvictionAPI': Eviction API: evicting", id="eviction-api"),
    ],
)
def test_a_profiling_pod_deleted_or_evicted_mid_run_is_named(capture: str, words: str):
    job = finish(profiling_job("train"), "Failed", reason="BackoffLimitExceeded")
    pod = captured(capture, job=job)
    failure = kubelet_failure(observed_of(job, [pod], now=dt.datetime.now(dt.UTC)), grace=GRACE)
    assert failure is not None and failure[0] == "killed"
    assert words in failure[1] and "'Error' (exit 137)" in failure[1]


def test_a_profiling_pod_deleted_in_the_users_own_init_container_is_named():
    """Deleted before any KRATOS container ran (the user's init container still at work)."""
    job = finish(profiling_job("train"), "Failed", reason="BackoffLimitExceeded")
    pod = captured("deleted", container="prepare", job=job)
    pod["status"]["initContainerStatuses"] = pod["status"].pop("containerStatuses")
    pod["status"]["containerStatuses"] = [
        {"name": v.RUNNER_CONTAINER, "state": {"waiting": {"reason": "PodInitializing"}}}
    ]
    failure = kubelet_failure(observed_of(job, [pod], now=dt.datetime.now(dt.UTC)), grace=GRACE)
    assert failure is not None and failure[0] == "killed"
    assert "deleted while it ran" in failure[1] and "before the runner's summary" in failure[1]


def test_a_kubelet_eviction_is_named_with_the_kubelets_words():
    job = finish(profiling_job("train"), "Failed", reason="BackoffLimitExceeded")
    pod = captured("oom", job=job)
    pod["status"].update(
        phase="Failed",
        reason="Evicted",
        message="The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki.",
    )
    failure = kubelet_failure(observed_of(job, [pod], now=dt.datetime.now(dt.UTC)), grace=GRACE)
    assert failure is not None and failure == (
        "killed",
        "the kubelet evicted the profiling Pod ('Evicted': The node was low on resource: memory. Threshold quantity: "
        "100Mi, available: 51200Ki.): the node ran short of a resource; the run may profile again on a node with room "
        "(delete the profile)",
    )


def test_a_run_past_its_deadline_is_named_deadline_exceeded():
    job = finish(
        profiling_job("train"),
        "Failed",
        reason="DeadlineExceeded",
        message="Job was active longer than specified deadline",
    )
    failure = kubelet_failure(Observed(job=job, pods_seen=False), grace=GRACE)
    assert failure is not None and failure[0] == "killed" and "'DeadlineExceeded'" in failure[1]
    assert "3600 s, config profilingDeadlineSeconds" in failure[1]


def test_the_runners_own_summary_wins_over_the_kubelet():
    """A runner that wrote its summary named the failure itself, whatever the Pod's end."""
    job = finish(profiling_job("train"), "Failed", reason="BackoffLimitExceeded")
    pod = captured("deleted", job=job)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = runner_summary_failed()
    [profile] = [
        a
        for a in reconcile(observed_of(job, [pod], now=dt.datetime.now(dt.UTC)), signing_key=TEST_KEY)
        if isinstance(a, PublishProfile)
    ]
    assert profile.status.failure == "counters-in-use"


def test_every_capture_is_a_real_kubelet_status():
    for path in sorted(Path(KUBELET).glob("*.json")):
        pod = json.loads(path.read_text())
        assert pod["kind"] == "Pod" and pod["status"]["containerStatuses"], path.name
        assert "managedFields" not in pod["metadata"]


# --- through the API double: the controller sees the kubelet's word as it comes ------------------------


async def test_an_image_that_never_pulls_releases_the_followers_and_creates_the_execution_job(tmp_path: Path):
    config = Config(image_pull_grace_seconds=1)
    async with kratos_cluster(tmp_path, "NVIDIA-A100-SXM4-80GB", controller_config=config) as (kube, _, api):
        batch = client.BatchV1Api(api)
        for name in ("sweep-0", "sweep-1"):
            body: Any = make_job(name).label(v.WORKLOAD_LABEL, "sweep").obj()
            await batch.create_namespaced_job("team-a", body)
        [pod_name] = await kube.run_jobs()
        pod = kube.get(*PODS, "team-a", pod_name)
        assert pod is not None and pod["metadata"]["labels"][v.WORKLOAD_LABEL] == "sweep", (
            "the controller sees it"
        )
        kubelet = captured("pull-missing")  # the kubelet's status, as it reported it, now
        kubelet["status"]["containerStatuses"][0]["name"] = v.RUNNER_CONTAINER
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        pod["status"] = {**kubelet["status"], "startTime": now}
        job = kube.get(*JOBS, "team-a", "sweep-0")
        assert job is not None
        job["status"]["startTime"] = now  # the Job controller started it now (the double's clock is fixed)
        kube.put(*JOBS, job)
        kube.put(*PODS, pod)
        profile = await eventually(
            lambda: (p := kube.get(*PROFILES, "team-a", "sweep-profile")) and p.get("status", {}).get("phase") == "Failed" and p,
            timeout=20,
        )  # fmt: skip
        assert profile["status"]["failure"] == "image-pull"
        assert (
            f"the image kratos-nsight-compute-poc:latest of {v.RUNNER_CONTAINER}"
            in profile["status"]["message"]
        )
        assert "cannot be pulled (ErrImagePull" in profile["status"]["message"]
        await eventually(lambda: kube.get(*JOBS, "team-a", "sweep-0-execution"))
        await eventually(
            lambda: (kube.get(*JOBS, "team-a", "sweep-1") or {}).get("spec", {}).get("suspend") is False
        )
        stopped = kube.get(*JOBS, "team-a", "sweep-0")
        assert stopped is not None and stopped["spec"]["activeDeadlineSeconds"] < 60, (
            "stopped, not left to its hour"
        )
        assert stopped["spec"].get("suspend") is False, "stopped by its deadline, never by suspend"
