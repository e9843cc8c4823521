"""The admission request, decoded and checked once (controller-runtime's ``admission.Request``).

Everything later layers need of the AdmissionReview is read here, once: the server, the offline
review and the policy all work from this frozen value and never re-read the raw review.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

import orjson

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_mapping
from kratos_admit.domain.workload import Kind, ParentKind

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
OPERATIONS: Final[tuple[Operation, ...]] = get_args(Operation)
REVIEW_VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
_KINDS: Final[dict[tuple[str, str, str], Kind]] = {
    ("", "v1", "Pod"): "Pod",
    ("batch", "v1", "Job"): "Job",
}
# Kinds that make Jobs or Pods: KRATOS only tells their authors what it will do with what they make.
_PARENTS: Final[dict[tuple[str, str, str], ParentKind]] = {
    ("batch", "v1", "CronJob"): "CronJob",
    ("apps", "v1", "Deployment"): "Deployment",
}


class AdmissionRequestError(ValueError):
    """The caller sent something that is not a usable AdmissionReview (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    api_version: str  # of the AdmissionReview envelope, echoed in the answer
    uid: str
    operation: Operation
    kind: Kind | None  # None: a kind KRATOS does not review (allowed untouched)
    parent_kind: ParentKind | None  # a CronJob or Deployment: answered with a warning only
    kind_name: str  # for metrics and logs, also of kinds KRATOS does not review
    namespace: str
    name: str
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    sub_resource: str
    dry_run: bool
    profile_key: tuple[str, str] | None  # (namespace, workload) whose profile this request needs

    @property
    def opted_in(self) -> bool:
        """The one "is this ours?" gate: a Job or Pod (not a subresource) created or updated, whose
        object, or old object on UPDATE, carries the workload label. Everything else is allowed."""
        if self.kind is None or self.object is None or self.sub_resource:
            return False
        if self.operation not in ("CREATE", "UPDATE"):
            return False
        return _workload_label(self.object) is not None or (
            self.old_object is not None and _workload_label(self.old_object) is not None
        )

    @property
    def labelled_parent(self) -> bool:
        """A CronJob or Deployment created or updated with the workload label on itself or on the
        template of what it makes."""
        if self.parent_kind is None or self.object is None or self.sub_resource:
            return False
        return self.operation in ("CREATE", "UPDATE") and v.WORKLOAD_LABEL in parent_labels(self.object)


def parent_labels(obj: Mapping[str, Any]) -> dict[str, object]:
    """The labels of a parent and of the template it makes Jobs or Pods from, merged."""
    spec = as_mapping(obj.get("spec"))
    template = as_mapping(spec.get("jobTemplate") or spec.get("template"))
    return {
        **as_mapping(as_mapping(obj.get("metadata")).get("labels")),
        **as_mapping(as_mapping(template.get("metadata")).get("labels")),
    }


def _workload_label(obj: Mapping[str, Any]) -> object:
    return as_mapping(as_mapping(obj.get("metadata")).get("labels")).get(v.WORKLOAD_LABEL)


def decode_review(body: bytes) -> AdmissionRequest:
    """Bytes from the wire to a checked request; AdmissionRequestError for anything unusable."""
    try:
        review = orjson.loads(body)  # orjson: 2-10x the stdlib's speed on the per-request JSON
    except orjson.JSONDecodeError as exc:
        raise AdmissionRequestError(f"body is not JSON: {exc}") from None
    return parse_review(review)


def parse_review(review: object) -> AdmissionRequest:
    """A decoded AdmissionReview to a checked request; AdmissionRequestError for anything unusable."""
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise AdmissionRequestError("body is not an AdmissionReview (kind must be AdmissionReview)")
    api_version = review.get("apiVersion")
    if api_version not in REVIEW_VERSIONS:
        raise AdmissionRequestError(f"apiVersion must be one of {', '.join(REVIEW_VERSIONS)}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise AdmissionRequestError("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise AdmissionRequestError("request.uid is missing")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise AdmissionRequestError(f"request.operation must be one of {', '.join(OPERATIONS)}")
    obj = request.get("object")
    if operation in ("CREATE", "UPDATE") and not isinstance(obj, dict):
        raise AdmissionRequestError(f"request.object is missing on {operation}")
    old = request.get("oldObject")
    if operation == "UPDATE" and old is not None and not isinstance(old, dict):
        raise AdmissionRequestError("request.oldObject is not an object")
    for key in ("kind", "namespace", "subResource"):
        if request.get(key) is not None and not isinstance(request[key], (dict if key == "kind" else str)):
            raise AdmissionRequestError(f"request.{key} has the wrong type")
    gvk = as_mapping(request.get("kind"))
    group_version_kind = (str(gvk.get("group", "")), str(gvk.get("version", "")), str(gvk.get("kind", "")))
    kind = _KINDS.get(group_version_kind)
    meta = as_mapping(as_mapping(obj).get("metadata"))
    namespace = str(request.get("namespace") or meta.get("namespace") or "default")
    obj = obj if isinstance(obj, dict) else None
    sub_resource = str(request.get("subResource") or "")
    workload = _workload_label(obj) if obj is not None else None
    profile_key = (
        (namespace, workload)
        if kind is not None
        and obj is not None
        and not sub_resource
        and operation in ("CREATE", "UPDATE")
        and isinstance(workload, str)
        and v.is_dns1123_label(workload)
        else None
    )
    return AdmissionRequest(
        api_version=str(api_version),
        uid=uid,
        operation=operation,
        kind=kind,
        parent_kind=_PARENTS.get(group_version_kind),
        kind_name=group_version_kind[2] or "unknown",
        namespace=namespace,
        name=str(request.get("name") or meta.get("name") or meta.get("generateName") or ""),
        object=obj,
        old_object=old if isinstance(old, dict) else None,
        sub_resource=sub_resource,
        dry_run=request.get("dryRun") is True,
        profile_key=profile_key,
    )


def admission_review(
    obj: Mapping[str, Any],
    *,
    operation: Operation = "CREATE",
    uid: str = "kratos-review",
    namespace: str | None = None,
    old: Mapping[str, Any] | None = None,
    user: str = "kratos-review",
    dry_run: bool = False,
) -> dict[str, Any]:
    """An ``admission.k8s.io/v1`` AdmissionReview of ``obj`` as the API server would send it: the
    one envelope builder for the offline review, the benchmark and the tests."""
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    kind = str(obj.get("kind", ""))
    meta = as_mapping(obj.get("metadata"))
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
        "operation": operation,
        "namespace": namespace or meta.get("namespace") or "default",
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": obj,
        "dryRun": dry_run,
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
