"""Offline strict field validation (issue 60): the fields of a Job or Pod that Kubernetes does not know,
named by path as kubectl names them, from a table that is the installed kubernetes_asyncio's schema."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from kratos_admit.admission.strict import FIELDS_FILE, derive_field_table, unknown_fields
from tests.builders import make_job, make_pod


def test_the_field_table_is_the_schema_kubernetes_asyncio_carries():
    """Regenerate with ``python docs/generate.py`` when kubernetes_asyncio is upgraded."""
    models = pytest.importorskip("kubernetes_asyncio.client.models")
    stored = json.loads(resources.files("kratos_admit.admission").joinpath(FIELDS_FILE).read_text("utf-8"))
    assert stored == derive_field_table(models)


def job_with(**changes: Any) -> dict[str, Any]:
    """The builder's Job with ``a__b__0__c=value`` set at a.b[0].c."""
    obj = make_job("sweep").obj()
    for path, value in changes.items():
        *parents, last = path.split("__")
        where: Any = obj
        for key in parents:
            where = where[int(key)] if key.isdigit() else where[key]
        where[last] = value
    return obj


CASES = [
    ("known-fields-only", make_job("sweep").obj(), []),
    ("job-spec", job_with(spec__paralellism=2), ['unknown field "spec.paralellism"', 'did you mean "parallelism"']),
    ("container", job_with(spec__template__spec__containers__0__resourcez={}),
     ['unknown field "spec.template.spec.containers[0].resourcez"', 'did you mean "resources"']),
    ("metadata", job_with(metadata__lables={}), ['unknown field "metadata.lables"', 'did you mean "labels"']),
    ("pod-toleration", make_pod("p").spec(tolerations=[{"key": "k", "opertor": "Exists"}]).obj(),
     ['unknown field "spec.tolerations[0].opertor"', 'did you mean "operator"']),
    ("nothing-like-it", job_with(spec__zzz=1), ['unknown field "spec.zzz"']),
    ("labels-map-holds-any-key", job_with(metadata__labels={"anything": "x"}), []),
    ("a-value-of-the-wrong-type-is-not-this-checks-concern", job_with(spec__template="x"), []),
    ("a-kind-kratos-does-not-review", {"apiVersion": "v1", "kind": "Service", "spec": {"clusterIPz": 1}}, []),
]  # fmt: skip


@pytest.mark.parametrize("obj, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_unknown_field_is_named_by_its_path(obj, expected: list[str]):
    warnings = unknown_fields(obj)
    assert len(warnings) == (1 if expected else 0), warnings
    assert all(part in warnings[0] for part in expected), warnings
    if expected and "did you mean" not in " ".join(expected):
        assert "did you mean" not in warnings[0]
