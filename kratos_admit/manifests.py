"""Reading manifests: YAML or JSON streams of Kubernetes objects, as kubectl reads them.

One reader for the offline review, the profile and node files, the config and the catalog, so a
syntax error is reported the same way everywhere: the file, the line and column, and the problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from kratos_admit.quantity import parse_quantity
from kratos_admit.raw import as_mapping
from kratos_admit.workload import Container, Workload, workload_kind


class ManifestError(ValueError):
    """A stream that is not usable Kubernetes objects; the message names where and why, in one line."""


def yaml_problem(exc: yaml.YAMLError) -> str:
    """``line L, column C: <problem>`` for a syntax error (PyYAML counts from 0, editors from 1)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = " ".join(f"{context} {problem}".split()) if context else " ".join(str(problem).split())
    if mark is None:
        return text
    return f"line {mark.line + 1}, column {mark.column + 1}: {text}"


def parse_yaml(text: str, origin: str) -> Any:
    """One YAML document, or ManifestError naming ``origin`` and the line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{origin}: not valid YAML: {yaml_problem(exc)}") from None


def split_documents(text: str, origin: str) -> list[object]:
    """Every document of a YAML or JSON stream, empty ones skipped and ``*List`` objects flattened
    into their items (as kubectl reads manifests)."""
    documents: list[object] = []
    try:
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            if (
                isinstance(doc, dict)
                and str(doc.get("kind", "")).endswith("List")
                and isinstance(doc.get("items"), list)
            ):
                documents.extend(doc["items"])
            else:
                documents.append(doc)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{origin}: not valid YAML: {yaml_problem(exc)}") from None
    return documents


def load_objects(text: str, origin: str) -> list[dict[str, Any]]:
    """Every object in a stream, checked as the API server would first (kind, apiVersion, metadata,
    resource quantities), so a broken manifest is refused with a reason instead of reviewed."""
    docs: list[dict[str, Any]] = []
    for number, doc in enumerate(split_documents(text, origin), start=1):
        where = f"{origin}: document {number}"
        if not isinstance(doc, dict):
            raise ManifestError(f"{where}: is not a Kubernetes object (a mapping)")
        for key in ("apiVersion", "kind"):
            if not isinstance(doc.get(key), str) or not doc[key]:
                raise ManifestError(f"{where}: {key} is missing")
        if not isinstance(doc.get("metadata", {}), dict):
            raise ManifestError(f"{where}: metadata must be a mapping")
        _check_quantities(doc, where)
        docs.append(doc)
    if not docs:
        raise ManifestError(f"{origin}: no Kubernetes object in the input")
    return docs


def _check_quantities(doc: Mapping[str, Any], where: str) -> None:
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
                    raise ManifestError(f"{where}: {field}: {value!r} is not a valid quantity")
