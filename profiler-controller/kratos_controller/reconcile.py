"""The controller's decisions, pure: ``reconcile(observed) -> actions``. The I/O shell applies them.

Level-triggered and idempotent: the same observation always gives the same actions, and once the
profile and the execution Job exist it gives none, so a restart half-way simply finishes the work.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kratos_admit import vocabulary as v
from kratos_admit.profiling import OriginalTemplateError, decode_original_template
from kratos_admit.raw import as_list, as_mapping
from kratos_admit.signing import sign_block

Obj = dict[str, Any]
BOUND_TYPES = ("compute", "memory", "balanced", "latency", "unknown")
EXECUTION_SUFFIX = "-execution"
MAX_NAME = 63
# Labels the Job controller adds to a template; an execution Job must get its own.
_GENERATED_TEMPLATE_LABELS = (
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
)


@dataclass(frozen=True)
class Observed:
    """What the controller saw of one profiling Job and the objects it produces."""

    job: Obj
    runner_message: str | None = None  # the profiling-runner container's termination message
    pod_failure: str | None = None  # why the pod ended, when there is no message
    profile: Obj | None = None
    configmap_exists: bool = False
    execution_job_exists: bool = False


@dataclass(frozen=True)
class PublishConfigMap:
    namespace: str
    name: str
    data: dict[str, str]


@dataclass(frozen=True)
class PublishProfile:
    namespace: str
    name: str
    spec: dict[str, Any]
    status: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CreateExecutionJob:
    manifest: Obj


Action = PublishConfigMap | PublishProfile | CreateExecutionJob


@dataclass(frozen=True)
class Summary:
    data: dict[str, Any] | None
    problem: str  # why there is no usable summary, "" when there is


def finished(job: Mapping[str, Any]) -> Literal["Complete", "Failed"] | None:
    for condition in as_list(as_mapping(job.get("status")).get("conditions")):
        c = as_mapping(condition)
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return "Complete" if c["type"] == "Complete" else "Failed"
    return None


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
    return ""


def read_summary(message: str | None) -> Summary:
    if message is None or not message.strip():
        return Summary(None, "the profiling-runner left no termination message")
    try:
        data = json.loads(message)
    except ValueError:
        return Summary(None, f"the runner's termination message is not JSON: {message[:120]!r}")
    if (
        not isinstance(data, dict)
        or data.get("boundType") not in BOUND_TYPES
        or not isinstance(data.get("metrics", {}), dict)
    ):
        return Summary(None, "the runner's termination message is not a KRATOS runner summary")
    return Summary(data, "")


def execution_job_name(job_name: str) -> str:
    """``<job>-execution``, shortened with a stable hash when it would pass 63 characters."""
    name = job_name + EXECUTION_SUFFIX
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:8]
    keep = MAX_NAME - len(EXECUTION_SUFFIX) - len(digest) - 1
    return f"{job_name[:keep].rstrip('-.')}-{digest}{EXECUTION_SUFFIX}"


def profile_status(observed: Observed, summary: Summary) -> dict[str, Any]:
    job = observed.job
    meta = as_mapping(job.get("metadata"))
    status: dict[str, Any] = {"profiledAt": _finished_at(job), "sourceJob": str(meta.get("name", ""))}
    data = summary.data
    if data is not None and data.get("boundType") != "unknown":
        metrics = {k: str(val) for k, val in as_mapping(data.get("metrics")).items()}
        gpu = {
            k: str(val)
            for k, val in as_mapping(data.get("gpu")).items()
            if k in ("product", "computeCapability")
        }
        exit_code = data.get("exitCode", 0)
        message = f"the workload exited {exit_code} under profiling" if exit_code else ""
        return {
            "phase": "Ready",
            "boundType": data["boundType"],
            "metrics": metrics,
            "gpu": gpu,
            **status,
            "message": message,
        }
    reasons = [
        r
        for r in (
            str(data.get("reason", "")) if data else summary.problem,
            observed.pod_failure or "",
            f"profiling Job failed ({_failed_condition(job)})" if finished(job) == "Failed" else "",
        )
        if r
    ]
    return {
        "phase": "Failed",
        "boundType": "unknown",
        **status,
        "message": "; ".join(reasons) or "no usable profile",
    }


def configmap_data(summary: Summary, status: Mapping[str, Any], message: str | None) -> dict[str, str]:
    data: dict[str, str] = {
        "phase": str(status["phase"]),
        "boundType": str(status["boundType"]),
        "sourceJob": str(status["sourceJob"]),
        "profiledAt": str(status["profiledAt"]),
        "message": str(status.get("message", "")),
    }
    for key, value in as_mapping(status.get("metrics")).items():
        data[str(key)] = str(value)
    gpu = as_mapping(status.get("gpu"))
    if "product" in gpu:
        data["gpuProduct"] = str(gpu["product"])
    if "computeCapability" in gpu:
        data["gpuComputeCapability"] = str(gpu["computeCapability"])
    if summary.data is not None:
        data["ncuVersion"] = str(summary.data.get("ncuVersion", ""))
        data["exitCode"] = str(summary.data.get("exitCode", ""))
    data["summary.json"] = message or ""
    return data


def build_execution_job(
    profiling_job: Mapping[str, Any], original: Mapping[str, Any], *, signing_key: bytes
) -> Obj:
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
    annotations = {
        k: val for k, val in as_mapping(kept.get("annotations")).items() if k not in v.RESERVED_ANNOTATIONS
    }
    if annotations:
        metadata["annotations"] = annotations
    spec = json.loads(json.dumps(original.get("spec", {})))
    if not spec.get("manualSelector"):
        spec.pop("selector", None)
        template_labels = as_mapping(as_mapping(spec.get("template")).get("metadata")).get("labels")
        if isinstance(template_labels, dict):
            for key in _GENERATED_TEMPLATE_LABELS:
                template_labels.pop(key, None)
    sign_block(metadata, namespace=namespace, key=signing_key)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def _same_result(existing: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    current = as_mapping(existing.get("status"))
    return all(
        current.get(k) == status.get(k)
        for k in ("phase", "boundType", "metrics", "gpu", "sourceJob", "message")
    )


def reconcile(observed: Observed, *, signing_key: bytes) -> list[Action]:
    """What to do for one profiling Job. Nothing until it has finished; nothing once all is done."""
    job = observed.job
    if finished(job) is None:
        return []
    meta = as_mapping(job.get("metadata"))
    namespace = str(meta.get("namespace", "default"))
    workload = as_mapping(meta.get("labels")).get(v.WORKLOAD_LABEL)
    if not isinstance(workload, str) or not v.is_dns1123_label(workload):
        return []
    summary = read_summary(observed.runner_message)
    status = profile_status(observed, summary)
    actions: list[Action] = []
    existing = observed.profile
    ours = existing is None or as_mapping(existing.get("status")).get("sourceJob") in (None, meta.get("name"))
    try:
        original: Mapping[str, Any] | None = decode_original_template(
            job, namespace=namespace, signing_key=signing_key
        )
    except OriginalTemplateError as exc:
        original = None
        status = {
            **status,
            "phase": "Failed",
            "boundType": "unknown",
            "message": f"cannot recreate the workload: {exc}",
        }
        status.pop("metrics", None)
        status.pop("gpu", None)
    if ours and (existing is None or not _same_result(existing, status)):
        actions.append(
            PublishConfigMap(
                namespace,
                v.summary_configmap_name(workload),
                configmap_data(summary, status, observed.runner_message),
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
                namespace,
                v.summary_configmap_name(workload),
                configmap_data(summary, status, observed.runner_message),
            )
        )
    if original is not None and not observed.execution_job_exists:
        actions.append(CreateExecutionJob(build_execution_job(job, original, signing_key=signing_key)))
    return actions
