"""The controller's decisions, pure: ``reconcile(observed) -> actions``. The I/O shell applies them.

Level-triggered and idempotent: the same observation always gives the same actions, and once the
work is done it gives none, so a restart half-way simply finishes it. Three loops share this module:

- a profiling Job: the ``Profiling`` phase while it runs; when it ends (or is deleted first), the
  profile and its ConfigMap, the execution Job (owned by the original), the ``execution-job``
  annotation, and only then the ``release`` finalizer off the Job and its Pods;
- the followers of a run (Jobs suspended, Pods gated, marked ``awaiting-profile``): released with
  hints once the profile is Ready or Failed;
- finished hinted and execution Jobs: their runs' durations per GPU product, into the profile's
  ``observations``, each run counted once; then the calibration of each GPU product, refitted from
  every profile's observations, into the ConfigMap ``kratos-gpu-calibration``;
- telemetry: an opted-in GPU Pod of any owner that succeeded or has run ``telemetry.windowSeconds``
  is due; its DCGM counters (asked of Prometheus by the shell) fold into the profile's
  ``status.telemetry``, making a Ready profile from telemetry where Nsight Compute gave none.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from kratos_admit.decisions.holds import release_hold
from kratos_admit.decisions.profiling import OriginalTemplateError, decode_original_template
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import (
    Observation,
    ProfileStatus,
    RunnerSummary,
    TelemetryRecord,
    WorkloadProfile,
    failed_fields,
    ready_status,
)
from kratos_admit.domain.raw import as_list, as_mapping, clone, string_map
from kratos_admit.domain.signing import sign_block, signature_valid
from kratos_admit.domain.workload import Kind
from kratos_admit.model.calibration import (
    NO_CALIBRATION,
    Calibration,
)
from kratos_admit.model.catalog import Catalog
from kratos_controller.actions import (
    Action,
    ContainerEnd,
    CreateExecutionJob,
    MarkExecutionJob,
    Observed,
    PublishConfigMap,
    PublishProfile,
    ReleaseFollower,
    RemoveFinalizer,
    StopJob,
    Summary,
)
from kratos_controller.faults import finished, image_pull_wait, kubelet_failure, stop_job, timestamp

Obj = dict[str, Any]
EXECUTION_SUFFIX = "-execution"
# Labels the Job controller adds to a template; an execution Job must get its own.
_GENERATED_TEMPLATE_LABELS = (
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
)


# --- reading what the profiling run left ------------------------------------------------------------


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool(as_mapping(obj.get("metadata")).get("deletionTimestamp"))


def _failed_condition(job: Mapping[str, Any]) -> str:
    for condition in as_list(as_mapping(job.get("status")).get("conditions")):
        c = as_mapping(condition)
        if c.get("type") == "Failed" and c.get("status") == "True":
            return f"{c.get('reason', 'Failed')}: {c.get('message', '')}".rstrip(": ")
    return ""


def _finished_at(job: Mapping[str, Any]) -> str:
    status = as_mapping(job.get("status"))
    if isinstance(status.get("completionTime"), str):
        return str(status["completionTime"])
    for condition in as_list(status.get("conditions")):
        c = as_mapping(condition)
        if c.get("type") in ("Complete", "Failed") and isinstance(c.get("lastTransitionTime"), str):
            return str(c["lastTransitionTime"])
    return str(as_mapping(job.get("metadata")).get("deletionTimestamp") or "")


def read_summary(runner: ContainerEnd | None) -> Summary:
    message = runner.message if runner is not None else None
    if message is None or not message.strip():
        return Summary(None, "the profiling-runner left no termination message")
    try:
        return Summary(RunnerSummary.model_validate_json(message), "")
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            return Summary(None, f"the runner's termination message is not JSON: {message[:120]!r}")
        return Summary(None, "the runner's termination message is not a KRATOS runner summary")


def staging_container(job: Mapping[str, Any]) -> str:
    """The profiling Job's staging init container: ``stage-profiler`` in the in-image form,
    ``stage-workload`` in the staged form."""
    pod_spec = as_mapping(as_mapping(as_mapping(job.get("spec")).get("template")).get("spec"))
    names = {as_mapping(c).get("name") for c in as_list(pod_spec.get("initContainers"))}
    return v.STAGE_PROFILER_CONTAINER if v.STAGE_PROFILER_CONTAINER in names else v.STAGE_CONTAINER


def pod_failure(observed: Observed) -> str:
    """Why the profiling pod gave no summary, in words (the I/O shell only collects the facts)."""
    if observed.stage is not None:
        return (
            f"{observed.stage.container or staging_container(observed.job)} failed (exit {observed.stage.exit_code}): "
            f"{observed.stage.message.strip()[:300]}"
        )
    if observed.runner is not None and not observed.runner.message:
        return f"profiling-runner ended {observed.runner.reason or 'without a reason'} (exit {observed.runner.exit_code})"
    if not observed.pods_seen:
        return "the profiling pod is gone (deleted or garbage-collected)"
    return ""


def execution_job_name(job_name: str) -> str:
    """``<job>-execution``, shortened with a stable hash when it would pass 63 characters."""
    name = job_name + EXECUTION_SUFFIX
    if len(name) <= v.DNS1123_LABEL_MAX:
        return name
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:8]
    keep = v.DNS1123_LABEL_MAX - len(EXECUTION_SUFFIX) - len(digest) - 1
    return f"{job_name[:keep].rstrip('-.')}-{digest}{EXECUTION_SUFFIX}"


def profile_status(observed: Observed, summary: Summary, *, grace: float = 300.0) -> ProfileStatus:
    job = observed.job
    meta = as_mapping(job.get("metadata"))
    now = observed.now.strftime("%Y-%m-%dT%H:%M:%SZ") if observed.now else ""
    common = {"profiledAt": _finished_at(job) or now, "sourceJob": str(meta.get("name", ""))}
    data = summary.data
    if data is not None and data.bound_type != "unknown":
        return ready_status(data, profiled_at=common["profiledAt"], source_job=common["sourceJob"])
    if data is not None:
        said = data.reason
    elif observed.stage is not None and observed.runner is None:
        said = ""  # the runner never ran (an init container failed first): no summary to miss
    else:
        said = summary.problem
    reasons = [
        r
        for r in (
            said,
            pod_failure(observed),
            f"profiling Job failed ({_failed_condition(job)})" if finished(job) == "Failed" else "",
            "the profiling Job was deleted before it finished"
            if finished(job) is None and deleting(job)
            else "",
        )
        if r
    ]
    # the runner's class; else what the kubelet says; a staging container that failed could not start
    # the workload
    kubelet = kubelet_failure(observed, grace=grace)
    if data and data.failure and not (observed.runner and observed.runner.reason == "OOMKilled"):
        kubelet = None  # the runner named it, unless the kernel killed something in its container
    failure = (
        kubelet[0]
        if kubelet
        else data.failure
        if data and data.failure
        else "cannot-start"
        if observed.stage
        else None
    )
    if kubelet is not None:
        reasons = [kubelet[1]]
    at = common["profiledAt"] or str(meta.get("creationTimestamp") or "")
    message = "; ".join(reasons) or "no usable profile"
    return ProfileStatus.model_validate(
        {"phase": "Failed", "boundType": "unknown", **common, **failed_fields(failure, message, at)}
    )


def configmap_data(summary: Summary, status: ProfileStatus, message: str | None) -> dict[str, str]:
    data: dict[str, str] = {
        "phase": status.phase,
        "boundType": status.bound_type,
        "sourceJob": status.source_job or "",
        "profiledAt": status.profiled_at or "",
        "message": status.message,
    }
    data.update(
        {k: str(val) for k, val in status.metrics.model_dump(by_alias=True, exclude_none=True).items()}
    )
    if status.gpu.product:
        data["gpuProduct"] = status.gpu.product
    if status.gpu.compute_capability:
        data["gpuComputeCapability"] = status.gpu.compute_capability
    if summary.data is not None:
        data["ncuVersion"] = summary.data.ncu_version
        if summary.data.ncu_set:
            data["ncuSet"] = summary.data.ncu_set
        data["exitCode"] = str(summary.data.exit_code)
    data["summary.json"] = message or ""
    return data


def build_execution_job(
    profiling_job: Mapping[str, Any], original: Mapping[str, Any], *, signing_key: bytes
) -> Obj:
    """The user's Job again, as ``<job>-execution``: owned by the original (deleting it, or a CronJob's
    history limit, removes both), with the user's own ``ttlSecondsAfterFinished``. When the original
    is already being deleted (a delete or TTL that came before the controller), the execution Job is
    not owned by it: the garbage collector would delete it with its owner, losing the workload."""
    meta = as_mapping(profiling_job.get("metadata"))
    namespace = str(meta.get("namespace", "default"))
    kept = as_mapping(original.get("metadata"))
    labels = {k: val for k, val in as_mapping(kept.get("labels")).items() if k not in v.RESERVED_LABELS}
    labels[v.ROLE_LABEL] = "execution"
    metadata: Obj = {
        "name": execution_job_name(str(meta.get("name", ""))),
        "namespace": namespace,
        "labels": labels,
    }
    if meta.get("uid") and not deleting(profiling_job):
        metadata["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": str(meta.get("name", "")),
                "uid": str(meta["uid"]),
                "blockOwnerDeletion": False,
            }
        ]
    annotations = {
        k: val for k, val in as_mapping(kept.get("annotations")).items() if k not in v.RESERVED_ANNOTATIONS
    }
    if annotations:
        metadata["annotations"] = annotations
    spec = clone(dict(as_mapping(original.get("spec"))))
    if not spec.get("manualSelector"):
        spec.pop("selector", None)
        template_labels = as_mapping(as_mapping(spec.get("template")).get("metadata")).get("labels")
        if isinstance(template_labels, dict):
            for key in _GENERATED_TEMPLATE_LABELS:
                template_labels.pop(key, None)
    sign_block(metadata, namespace=namespace, key=signing_key)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def _same_result(existing: Mapping[str, Any], status: ProfileStatus) -> bool:
    current = as_mapping(existing.get("status"))
    wanted = status.as_status()
    return all(
        current.get(k) == wanted.get(k)
        for k in ("phase", "boundType", "metrics", "timeShares", "gpu", "sourceJob", "message")
    )


def _mark_execution_job(
    job: Mapping[str, Any], name: str, *, namespace: str, signing_key: bytes
) -> MarkExecutionJob | None:
    meta = as_mapping(job.get("metadata"))
    if string_map(meta.get("annotations")).get(v.EXECUTION_JOB_ANNOTATION) == name:
        return None
    block: Obj = {
        "labels": dict(as_mapping(meta.get("labels"))),
        "annotations": dict(as_mapping(meta.get("annotations"))),
    }
    block["annotations"][v.EXECUTION_JOB_ANNOTATION] = name
    sign_block(block, namespace=namespace, key=signing_key)
    return MarkExecutionJob(
        namespace,
        str(meta.get("name", "")),
        {k: block["annotations"][k] for k in (v.EXECUTION_JOB_ANNOTATION, v.SIGNATURE_ANNOTATION)},
    )


def reconcile(observed: Observed, *, signing_key: bytes, image_pull_grace: float = 300.0) -> list[Action]:
    """What to do for one profiling Job: mark the run, then once it has ended publish, recreate,
    annotate, and last let go of the finalizer. A run whose image never pulls has ended too: it is
    stopped, and handled the same. Nothing once all is done."""
    job = observed.job
    meta = as_mapping(job.get("metadata"))
    namespace = str(meta.get("namespace", "default"))
    name = str(meta.get("name", ""))
    workload = as_mapping(meta.get("labels")).get(v.WORKLOAD_LABEL)
    if not isinstance(workload, str) or not v.is_dns1123_label(workload):
        return []
    existing = observed.profile
    existing_status = as_mapping(as_mapping(existing).get("status"))
    stuck = image_pull_wait(observed, grace=image_pull_grace) == 0.0
    if finished(job) is None and not deleting(job) and not stuck:
        if existing is None:  # tell the webhook a run is under way: later Jobs of the workload wait for it
            running = ProfileStatus.model_validate(
                {"phase": "Profiling", "sourceJob": name, "message": f"profiling Job {name} is running"}
            )
            return [
                PublishProfile(
                    namespace,
                    v.profile_name(workload),
                    {"workload": workload},
                    running,
                    {v.WORKLOAD_LABEL: workload},
                )
            ]
        return []
    summary = read_summary(observed.runner)
    status = profile_status(observed, summary, grace=image_pull_grace)
    actions: list[Action] = []
    if stuck and (stop := stop_job(job, observed.now)) is not None:
        actions.append(stop)
    source = existing_status.get("sourceJob")
    ours = (
        existing is None
        or source in (None, name)
        or (existing_status.get("phase") == "Profiling" and not observed.source_job_exists)
    )
    try:
        original: Mapping[str, Any] | None = decode_original_template(
            job, namespace=namespace, signing_key=signing_key
        )
    except OriginalTemplateError as exc:
        original = None
        status = ProfileStatus.model_validate(
            {
                "phase": "Failed",
                "boundType": "unknown",
                "profiledAt": status.profiled_at,
                "sourceJob": status.source_job,
                "message": f"cannot recreate the workload: {exc}",
            }
        )
    # keep what the controller learnt from real runs across a re-publication
    status = status.model_copy(
        update={
            "observations": [
                Observation.model_validate(o) for o in as_list(existing_status.get("observations"))
            ],
            "counted_runs": [str(u) for u in as_list(existing_status.get("countedRuns"))],
            "observed_runs": int(existing_status.get("observedRuns") or 0),
            "telemetry": [
                TelemetryRecord.model_validate(t) for t in as_list(existing_status.get("telemetry"))
            ],
            "counted_telemetry": [str(u) for u in as_list(existing_status.get("countedTelemetry"))],
        }
    )
    message = observed.runner.message if observed.runner else None
    # a published result is only ever replaced by a Ready one: once the pods are gone (the finalizer
    # let them go), a later look at this Job sees less than the first one did
    settled = existing_status.get("phase") in ("Ready", "Failed")
    if (
        ours
        and (existing is None or not settled or status.phase == "Ready")
        and (existing is None or not _same_result(existing, status))
    ):
        actions.append(
            PublishConfigMap(
                namespace, v.summary_configmap_name(workload), configmap_data(summary, status, message)
            )
        )
        actions.append(
            PublishProfile(
                namespace,
                v.profile_name(workload),
                {"workload": workload},
                status,
                {v.WORKLOAD_LABEL: workload},
            )
        )
    elif ours and not observed.configmap_exists:
        actions.append(
            PublishConfigMap(
                namespace, v.summary_configmap_name(workload), configmap_data(summary, status, message)
            )
        )
    execution = execution_job_name(name)
    if original is not None and not observed.execution_job_exists:
        actions.append(CreateExecutionJob(build_execution_job(job, original, signing_key=signing_key)))
    if original is not None and not deleting(job):
        mark = _mark_execution_job(job, execution, namespace=namespace, signing_key=signing_key)
        if mark is not None:
            actions.append(mark)
    # the finalizer goes last, and only once nothing is left to lose: the execution Job exists (or
    # the workload cannot be recreated, which the profile now says) and the profile is published
    released = observed.execution_job_exists or original is None
    if released and not any(isinstance(a, (PublishProfile, CreateExecutionJob, StopJob)) for a in actions):
        actions += [RemoveFinalizer("Pod", namespace, pod) for pod in observed.pods_holding]
        if v.RELEASE_FINALIZER in as_list(meta.get("finalizers")):
            actions.append(RemoveFinalizer("Job", namespace, name))
    return actions


# --- followers of a run: held at admission, released here ---------------------------------------------


def awaiting(obj: Mapping[str, Any], profile_name: str, *, signing_key: bytes) -> bool:
    """A Job or Pod KRATOS held for ``profile_name`` (the mark is signed: a user cannot forge one)."""
    meta = as_mapping(obj.get("metadata"))
    namespace = str(meta.get("namespace", "default"))
    return string_map(meta.get("annotations")).get(
        v.AWAITING_PROFILE_ANNOTATION
    ) == profile_name and signature_valid(meta, namespace=namespace, key=signing_key)


def release_followers(
    profile: WorkloadProfile,
    followers: Iterable[tuple[Kind, Obj]],
    *,
    node_products: frozenset[str],
    config: Config,
    catalog: Catalog,
    signing_key: bytes,
    calibration: Calibration = NO_CALIBRATION,
    product_gpus: Mapping[str, int] | None = None,
) -> list[Action]:
    """Release every object held for ``profile`` once its run ended (Ready: ranked hints; Failed:
    base hints as they are)."""
    if profile.status is None or profile.status.phase not in ("Ready", "Failed"):
        return []
    actions: list[Action] = []
    for kind, obj in followers:
        if not awaiting(obj, profile.metadata.name, signing_key=signing_key) or deleting(obj):
            continue
        meta = as_mapping(obj.get("metadata"))
        released = release_hold(
            obj,
            kind,
            profile=profile,
            node_products=node_products,
            namespace=str(meta.get("namespace", "default")),
            config=config,
            catalog=catalog,
            signing_key=signing_key,
            calibration=calibration,
            product_gpus=product_gpus,
        )
        actions.append(
            ReleaseFollower(
                kind, str(meta.get("namespace", "")), str(meta.get("name", "")), released, held=obj
            )
        )
    return actions


def orphan_profile(namespace: str, workload: str) -> WorkloadProfile:
    """Stands in for a run that never started (the API server refused the Job the webhook had just
    rewritten, say): its followers are released with base hints rather than held for ever."""
    return WorkloadProfile.model_validate(
        {
            "metadata": {"name": v.profile_name(workload), "namespace": namespace},
            "spec": {"workload": workload},
            "status": {
                "phase": "Failed",
                "message": "the profiling run its followers waited for never started",
            },
        }
    )


def orphaned(obj: Mapping[str, Any], *, now: dt.datetime, grace: float) -> bool:
    """A follower held longer than ``grace`` (config ``followerReleaseSeconds``) for a run that never
    appeared."""
    created = timestamp(as_mapping(obj.get("metadata")).get("creationTimestamp"))
    return created is not None and (now - created).total_seconds() > grace
