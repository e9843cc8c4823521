"""What the pure reconcile sees and decides (STYLE "I/O at the edges"): the observed state of a
profiling run, and the actions the controller then applies."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from kratos_admit.domain.profile import (
    ProfileStatus,
    RunnerSummary,
)
from kratos_admit.domain.workload import Kind

Obj = dict[str, Any]


@dataclass(frozen=True)
class ContainerEnd:
    """A container's terminated state, as the kubelet reported it."""

    exit_code: int
    reason: str = ""
    message: str = ""
    container: str = ""  # which container (profiling-runner, stage-workload, stage-profiler)


@dataclass(frozen=True)
class PullFailure:
    """A container of the profiling Pod whose image the kubelet cannot pull (its waiting state)."""

    container: str
    image: str
    reason: str  # ErrImagePull, ImagePullBackOff, ErrImageNeverPull, InvalidImageName
    message: str
    since: dt.datetime | None  # when the kubelet took the Pod (status.startTime): pulling began then


@dataclass(frozen=True)
class Disruption:
    """The profiling Pod ended from outside: evicted by the kubelet, or deleted (an API eviction, a
    preemption, a person), with the kubelet's or the DisruptionTarget condition's words."""

    how: str  # "evicted" | "deleted"
    reason: str  # Evicted, EvictionByEvictionAPI, PreemptionByScheduler, ... ("" when none was given)
    message: str


@dataclass(frozen=True)
class Observed:
    """What the controller saw of one profiling Job and the objects it produces."""

    job: Obj
    runner: ContainerEnd | None = None  # profiling-runner's end, preferring a pod whose runner left a message
    stage: ContainerEnd | None = None  # stage-workload's or stage-profiler's end, when it failed
    pods_seen: bool = False  # any pod of the Job still exists
    pods_holding: tuple[str, ...] = ()  # names of its pods that carry the release finalizer
    profile: Obj | None = None
    configmap_exists: bool = False
    execution_job_exists: bool = False
    source_job_exists: bool = True  # the Job named by the profile's sourceJob still exists
    node: str = ""  # the node the newest profiling Pod was bound to ("" before it was)
    pull: PullFailure | None = None  # an image of the newest profiling Pod that cannot be pulled
    disruption: Disruption | None = None  # the newest profiling Pod evicted or deleted
    now: dt.datetime | None = None  # when this was observed


@dataclass(frozen=True)
class _Named:
    """The object an action writes: its namespace and name."""

    namespace: str
    name: str


@dataclass(frozen=True)
class PublishConfigMap(_Named):
    data: dict[str, str]


@dataclass(frozen=True)
class PublishProfile(_Named):
    spec: dict[str, Any]
    status: ProfileStatus
    labels: dict[str, str] = field(default_factory=dict)
    # a new profile only: one that appeared meanwhile (a profiling run's) is left as it is
    only_new: bool = False


@dataclass(frozen=True)
class CreateExecutionJob:
    manifest: Obj


@dataclass(frozen=True)
class MarkExecutionJob(_Named):
    """Write ``execution-job`` (and the block's new signature) onto the original Job."""

    annotations: dict[str, str]


@dataclass(frozen=True)
class RemoveFinalizer:
    """Take the ``release`` finalizer off a profiling Job or one of its Pods."""

    kind: Kind
    namespace: str
    name: str


@dataclass(frozen=True)
class StopJob(_Named):
    """End a profiling Job that can no longer profile (an image that never pulls): its
    ``activeDeadlineSeconds`` lowered to the time it has run, so the Job controller stops it and its
    Pod (``DeadlineExceeded``). Never ``spec.suspend``: Kueue owns a Kueue Job's."""

    active_deadline_seconds: int


@dataclass(frozen=True)
class ReleaseFollower:
    """Replace a held Job or Pod with its released form (scheduling directives and metadata only)."""

    kind: Kind
    namespace: str
    name: str
    released: Obj
    held: Obj  # the object as read: the write changes only what differs


@dataclass(frozen=True)
class RecordObservations:
    """Write the profile's status with new runs counted (a replace guarded by resourceVersion)."""

    namespace: str
    name: str
    resource_version: str
    status: ProfileStatus


Action = (
    PublishConfigMap
    | PublishProfile
    | CreateExecutionJob
    | MarkExecutionJob
    | RemoveFinalizer
    | StopJob
    | ReleaseFollower
    | RecordObservations
)


@dataclass(frozen=True)
class Summary:
    data: RunnerSummary | None
    problem: str  # why there is no usable summary, "" when there is
