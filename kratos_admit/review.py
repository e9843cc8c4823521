"""Offline review: both webhooks on a manifest, the same code path as the server's."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonpatch
import yaml

from kratos_admit.admission import AdmissionEngine, answer
from kratos_admit.fields import FieldError
from kratos_admit.policy import Action
from kratos_admit.quantity import parse_quantity
from kratos_admit.stores import split_documents
from kratos_admit.workload import Container, Workload, as_mapping, workload_kind


class InputError(ValueError):
    """A document that is not a usable Kubernetes object (exit status 2)."""


@dataclass(frozen=True, slots=True)
class Reviewed:
    kind: str
    name: str
    allowed: bool
    action: Action
    violations: tuple[FieldError, ...]
    warnings: tuple[str, ...]
    patch: list[dict[str, Any]]
    object: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "allowed": self.allowed,
            "action": self.action,
            "violations": [e.as_dict() for e in self.violations],
            "warnings": list(self.warnings),
            "patch": self.patch,
            "object": self.object,
        }


def load_documents(text: str) -> list[dict[str, Any]]:
    """Every object in a YAML/JSON stream (Lists flattened), checked as the API server would first."""
    try:
        found = split_documents(text)
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML: {' '.join(str(exc).split())}") from None
    docs: list[dict[str, Any]] = []
    for number, doc in enumerate(found, start=1):
        if not isinstance(doc, dict):
            raise InputError(f"document {number}: is not a Kubernetes object (a mapping)")
        for key in ("apiVersion", "kind"):
            if not isinstance(doc.get(key), str) or not doc[key]:
                raise InputError(f"document {number}: {key} is missing")
        if not isinstance(doc.get("metadata", {}), dict):
            raise InputError(f"document {number}: metadata must be a mapping")
        _check_quantities(doc, number)
        docs.append(doc)
    if not docs:
        raise InputError("no Kubernetes object in the input")
    return docs


def _check_quantities(doc: Mapping[str, Any], number: int) -> None:
    kind = workload_kind(doc.get("apiVersion"), doc.get("kind"))
    if kind is None:
        return
    container: Container
    for container in Workload(kind, doc).all_containers():
        resources = as_mapping(container.raw.get("resources"))
        for section in ("limits", "requests"):
            for name, value in as_mapping(resources.get(section)).items():
                if parse_quantity(value) is None:
                    field = container.path.child("resources").child(section).key(name)
                    raise InputError(f"document {number}: {field}: {value!r} is not a valid quantity")


def _gvk(doc: Mapping[str, Any]) -> dict[str, str]:
    group, _, version = str(doc["apiVersion"]).rpartition("/")
    return {"group": group, "version": version, "kind": str(doc["kind"])}


def review_document(
    doc: dict[str, Any], *, index: int, engine: AdmissionEngine, namespace: str | None, user: str
) -> Reviewed:
    meta = as_mapping(doc.get("metadata"))
    ns = namespace or meta.get("namespace") or "default"
    request: dict[str, Any] = {
        "uid": f"kratos-review-{index}",
        "kind": _gvk(doc),
        "operation": "CREATE",
        "namespace": ns,
        "userInfo": {"username": user},
        "object": doc,
        "dryRun": True,
    }
    mutated = answer("admission.k8s.io/v1", request, webhook="mutate", engine=engine)
    patch = mutated.patch
    final = jsonpatch.apply_patch(doc, patch) if patch else copy.deepcopy(doc)
    violations = list(mutated.decision.violations)
    warnings = list(mutated.decision.warnings)
    allowed = mutated.decision.allowed
    if allowed:
        validated = answer(
            "admission.k8s.io/v1", {**request, "object": final}, webhook="validate", engine=engine
        )
        allowed = validated.decision.allowed
        violations += validated.decision.violations
        warnings += validated.decision.warnings
    return Reviewed(
        kind=str(doc["kind"]),
        name=mutated.name,
        allowed=allowed,
        action=mutated.decision.action if allowed else "none",
        violations=tuple(violations),
        warnings=tuple(warnings),
        patch=patch if allowed else [],
        object=final if allowed else copy.deepcopy(doc),
    )
