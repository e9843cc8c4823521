"""Kubernetes' strict field validation, offline: the fields of a Job or Pod that Kubernetes does not
know, each named by its path, as kubectl names them (``unknown field "spec.paralellism"``).

In a cluster the API server does this before any webhook is called (kubectl's default
``--validate=strict`` refuses the object; other clients have the field dropped), so only the offline
``review`` and ``test`` need it: there a misspelt ``resourcez`` would otherwise surface as "requests
no GPU" and a misspelt ``paralellism`` not at all.

The fields come from the Kubernetes OpenAPI schema as ``kubernetes_asyncio`` (a runtime dependency)
carries it, one generated model class per schema type (``V1Job.attribute_map`` and
``openapi_types``). Importing those classes costs about a second (the client package loads every API
and model at once), more than the offline commands' whole budget, so the part KRATOS reads (every
type reachable from ``batch/v1`` Job and ``v1`` Pod) is written down in ``data/kubernetes_fields.json``
by ``derive_field_table``, and the suite derives it again from the installed ``kubernetes_asyncio``
and compares (``tests/test_strict.py``): a new Kubernetes field cannot be missed, nor a stale one kept.
``python docs/generate.py`` writes it again.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Mapping
from importlib import resources
from types import ModuleType
from typing import Any

from kratos_admit.domain.fields import ROOT, Path

FIELDS_FILE = "data/kubernetes_fields.json"
# each kind KRATOS reviews, by apiVersion/kind, and its schema type in kubernetes_asyncio's models
ROOTS: Mapping[str, str] = {"batch/v1/Job": "V1Job", "v1/Pod": "V1Pod"}
_MODEL = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_LIST = re.compile(r"^list\[(.+)\]$")
_MAP = re.compile(r"^dict\(str, (.+)\)$")

FieldType = str  # a schema type's name, "[]" + one (a list of it), "{}" + one (a map to it), or "" (a scalar)


def _field_type(openapi_type: str, models: ModuleType) -> FieldType:
    """kubernetes_asyncio's type string (``list[V1Container]``, ``dict(str, str)``, ``V1PodSpec``,
    ``object``) as the table writes it: only the types with fields of their own are kept."""
    if (found := _LIST.match(openapi_type)) is not None:
        inner = _field_type(found.group(1), models)
        return "[]" + inner if inner else ""
    if (found := _MAP.match(openapi_type)) is not None:
        inner = _field_type(found.group(1), models)
        return "{}" + inner if inner else ""
    return openapi_type if _MODEL.match(openapi_type) and hasattr(models, openapi_type) else ""


def derive_field_table(models: ModuleType) -> dict[str, Any]:
    """The table from ``kubernetes_asyncio.client.models``: for every type reachable from ``ROOTS``,
    its fields (JSON names) and their types."""
    types: dict[str, dict[str, FieldType]] = {}
    todo = list(ROOTS.values())
    while todo:
        name = todo.pop()
        if name in types:
            continue
        cls = getattr(models, name)
        fields = {cls.attribute_map[a]: _field_type(t, models) for a, t in cls.openapi_types.items()}
        types[name] = dict(sorted(fields.items()))
        todo += [t.lstrip("[]{}") for t in fields.values() if t]
    return {"roots": dict(ROOTS), "types": dict(sorted(types.items()))}


@functools.cache
def field_table() -> Mapping[str, Any]:
    text = resources.files("kratos_admit.admission").joinpath(FIELDS_FILE).read_text("utf-8")
    table: Mapping[str, Any] = json.loads(text)
    return table


def unknown_fields(doc: Mapping[str, Any]) -> list[str]:
    """One warning per field of ``doc`` that its kind's schema does not have (none for a kind KRATOS
    does not review), with the known field it most resembles."""
    table = field_table()
    root = table["roots"].get(f"{doc.get('apiVersion')}/{doc.get('kind')}")
    if root is None:
        return []
    found: list[tuple[Path, list[str]]] = []
    _walk(doc, root, ROOT, table["types"], found)
    warnings = []
    for path, known in found:
        name = path.text.rpartition(".")[2]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f'; did you mean "{close[0]}"?' if close else ""
        warnings.append(
            f'unknown field "{path}": the Kubernetes schema has no such field (kubectl\'s strict field '
            f"validation refuses the object, other clients drop the field){hint}"
        )
    return warnings


def _walk(
    value: object,
    field_type: FieldType,
    path: Path,
    types: Mapping[str, Mapping[str, FieldType]],
    found: list[tuple[Path, list[str]]],
) -> None:
    """Values of the wrong type are left to the validation rules and the API server: only unknown
    names are this walk's concern."""
    if field_type.startswith("[]"):
        if isinstance(value, list):
            for i, item in enumerate(value):
                _walk(item, field_type[2:], path.index(i), types, found)
        return
    if field_type.startswith("{}"):
        if isinstance(value, dict):
            for key, item in value.items():
                _walk(item, field_type[2:], path.key(str(key)), types, found)
        return
    fields = types.get(field_type)
    if fields is None or not isinstance(value, dict):
        return
    for key, item in value.items():
        if key not in fields:
            found.append((path.child(str(key)), sorted(fields)))
        elif fields[key]:
            _walk(item, fields[key], path.child(str(key)), types, found)
