"""What the kubelet says of a profiling run, pure (DESIGN "Faults a real node brings"): an image that
never pulls (``image-pull``, after config ``imagePullGraceSeconds``), and a container killed from
outside, or the Pod evicted or deleted, before the runner's summary (``killed``, by the kubelet's own
reason), each in words the person can act on; and how a run that can no longer profile is stopped."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any, Literal

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_list, as_mapping
from kratos_controller.actions import Observed, StopJob


def finished(job: Mapping[str, Any]) -> Literal["Complete", "Failed"] | None:
    for condition in as_list(as_mapping(job.get("status")).get("conditions")):
        c = as_mapping(condition)
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return "Complete" if c["type"] == "Complete" else "Failed"
    return None


def timestamp(value: object) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


# an image the kubelet can never pull, however long it tries (its name does not parse)
PULL_AT_ONCE = frozenset({"InvalidImageName"})
# KRATOS's own init containers of a profiling Pod (the Job's own run before them)
KRATOS_INIT_CONTAINERS = frozenset({v.STAGE_CONTAINER, v.STAGE_PROFILER_CONTAINER})
# the kubelet's terminated reasons of a container killed from outside, or that died without a word
KILLED_REASONS = frozenset({"OOMKilled", "Error", "ContainerStatusUnknown", "DeadlineExceeded", "Evicted"})


def image_pull_wait(observed: Observed, *, grace: float) -> float | None:
    """Seconds until an image the profiling Pod cannot pull ends the run (0: it ends now), None while
    every image pulls. ``grace`` is config ``imagePullGraceSeconds``, counted from when the kubelet
    took the Pod; a name that cannot parse ends it at once."""
    pull = observed.pull
    if pull is None or finished(observed.job) is not None:
        return None
    if pull.reason in PULL_AT_ONCE:
        return 0.0
    if pull.since is None or observed.now is None:
        return grace
    return max(0.0, grace - (observed.now - pull.since).total_seconds())


def _limit(job: Mapping[str, Any], container: str) -> str:
    pod_spec = as_mapping(as_mapping(as_mapping(job.get("spec")).get("template")).get("spec"))
    for key in ("initContainers", "containers"):
        for c in as_list(pod_spec.get(key)):
            if as_mapping(c).get("name") == container:
                limits = as_mapping(as_mapping(as_mapping(c).get("resources")).get("limits"))
                return str(limits.get("memory") or "none")
    return "none"


def _oom_advice(job: Mapping[str, Any], container: str) -> str:
    if container == v.RUNNER_CONTAINER:
        return (
            f"{container} was OOMKilled at its memory limit ({_limit(job, container)}): Nsight Compute needs memory of "
            "its own beside the workload's. profiling-runner runs with the resources of the Job's GPU container: raise "
            "that container's memory limit (by 1 GiB or so) and submit the Job again, after deleting its profile"
        )
    if container not in KRATOS_INIT_CONTAINERS:
        return (
            f"the Job's own init container {container} was OOMKilled at its memory limit ({_limit(job, container)}): "
            "raise that limit in the Job, as its runs without KRATOS need too"
        )
    return (
        f"{container} was OOMKilled at its memory limit ({_limit(job, container)}): raise config "
        "profilingResources.limits.memory, which KRATOS gives it"
    )


def read_runner_reason(message: str) -> str:
    """The ``reason`` of a runner summary in a termination message ("" when there is none)."""
    try:
        summary = json.loads(message) if message.strip() else {}
    except ValueError:
        return ""
    reason = summary.get("reason") if isinstance(summary, dict) else None
    return str(reason)[:300] if reason else ""


def kubelet_failure(observed: Observed, *, grace: float) -> tuple[str, str] | None:
    """(class, reason) of a profiling run the kubelet ended or cannot start, from its statuses (DESIGN
    "Faults a real node brings"): ``image-pull``, or ``killed`` named by the kubelet's reason. None
    when the kubelet says nothing of the kind (the runner's own summary, if any, names the failure)."""
    job, pull = observed.job, observed.pull
    if pull is not None and image_pull_wait(observed, grace=grace) == 0.0:
        said = f"{pull.reason}: {pull.message.strip()}" if pull.message.strip() else pull.reason
        return "image-pull", (
            f"the image {pull.image} of {pull.container} cannot be pulled ({said[:400]}): check the image's name "
            "and tag, and give the namespace's ServiceAccount an imagePullSecret for a private registry"
        )
    runner, stage, gone = observed.runner, observed.stage, observed.disruption
    ended = next(
        (
            e
            for e in (stage, runner)
            if e is not None and not e.message.strip() and e.reason in KILLED_REASONS
        ),
        None,
    )
    if stage is not None and stage.reason == "OOMKilled":
        ended = stage
    if gone is not None and gone.how == "evicted":
        return "killed", (
            f"the kubelet evicted the profiling Pod ('Evicted': {gone.message.strip()[:300]}): the node ran short "
            "of a resource; the run may profile again on a node with room (delete the profile)"
        )
    if runner is not None and runner.reason == "OOMKilled":
        # the kernel killed a process of the container (ncu, or the runner itself): what the runner
        # wrote after its child died says less than that
        said = read_runner_reason(runner.message)
        return "killed", _oom_advice(job, v.RUNNER_CONTAINER) + (f"; the runner said: {said}" if said else "")
    if ended is not None and ended.reason == "OOMKilled":
        return "killed", _oom_advice(job, ended.container or v.RUNNER_CONTAINER)
    if gone is not None and (runner is None or not runner.message.strip()):
        why = f" ('{gone.reason}': {gone.message.strip()[:200]})" if gone.reason else ""
        if ended is None:
            how = "before the runner's summary"
        elif ended is stage and ended.container not in KRATOS_INIT_CONTAINERS:
            how = (
                f"the Job's own init container {ended.container} ended '{ended.reason}' (exit {ended.exit_code}) "
                "before the runner's summary"
            )
        else:
            how = f"{ended.container or v.RUNNER_CONTAINER} ended '{ended.reason}' (exit {ended.exit_code}) before its summary"
        return "killed", (
            f"the profiling Pod was deleted while it ran{why}, as an eviction, a preemption or a person does: "
            f"{how}; delete the profile to profile again"
        )
    if failed_reason(job) == "DeadlineExceeded" and (runner is None or not runner.message.strip()):
        deadline = as_mapping(job.get("spec")).get("activeDeadlineSeconds")
        return "killed", (
            f"the profiling run did not finish within its activeDeadlineSeconds ({deadline} s, config "
            "profilingDeadlineSeconds) ('DeadlineExceeded'): ncu ends the workload after its profiled kernels, so a "
            "workload that launches fewer, or waits long before the first, runs to the deadline; lower "
            "gpu.scheduler.io/profile-skip-kernels, or raise the deadline"
        )
    if ended is not None and ended is stage and ended.container not in KRATOS_INIT_CONTAINERS:
        return "killed", (
            f"the Job's own init container {ended.container} ended '{ended.reason}' (exit {ended.exit_code}) before "
            "the workload started under Nsight Compute: exit 137 is SIGKILL (killed from outside, or for memory), 143 "
            f"SIGTERM; any other code is its own failure, which the Job meets without KRATOS too (kubectl logs -c "
            f"{ended.container})"
        )
    if ended is not None and ended is runner:
        return "killed", (
            f"profiling-runner ended '{ended.reason}' (exit {ended.exit_code}) without a runner summary: killed from "
            "outside (exit 137: SIGKILL, 143: SIGTERM) or it crashed; its log says which (kubectl logs -c profiling-runner)"
        )
    return None


def failed_reason(job: Mapping[str, Any]) -> str:
    for condition in as_list(as_mapping(job.get("status")).get("conditions")):
        c = as_mapping(condition)
        if c.get("type") == "Failed" and c.get("status") == "True":
            return str(c.get("reason") or "")
    return ""


def stop_job(job: Mapping[str, Any], now: dt.datetime | None) -> StopJob | None:
    """Stop a running profiling Job at once: its activeDeadlineSeconds down to the time it has run
    (at least 1 s), unless it is there already."""
    meta, spec = as_mapping(job.get("metadata")), as_mapping(job.get("spec"))
    started = timestamp(as_mapping(job.get("status")).get("startTime"))
    ran = int((now - started).total_seconds()) if now is not None and started is not None else 1
    deadline = max(1, ran)
    current = spec.get("activeDeadlineSeconds")
    if isinstance(current, int) and current <= deadline:
        return None
    return StopJob(str(meta.get("namespace", "default")), str(meta.get("name", "")), deadline)
