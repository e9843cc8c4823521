"""Offline review: both webhooks on a manifest, the same code path as the server's, and its output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import yaml

from kratos_admit.admission import AdmissionEngine, answer
from kratos_admit.fields import FieldError
from kratos_admit.policy import Action
from kratos_admit.raw import as_mapping
from kratos_admit.request import admission_review, parse_review
from kratos_admit.workload import workload_kind


@dataclass(frozen=True, slots=True)
class Reviewed:
    kind: str
    name: str
    namespace: str  # the namespace it was reviewed in
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


def review_namespace(doc: dict[str, Any], namespace: str | None) -> str:
    """``-n`` if given, else the object's own, else ``default`` (kubectl's order)."""
    return namespace or as_mapping(doc.get("metadata")).get("namespace") or "default"


def in_namespace(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The Job or Pod as the API server hands it to webhooks: ``metadata.namespace`` is the namespace
    of the request (it fills it in before admission). Other kinds, which may be cluster-scoped, are
    left as written. A shallow copy: the caller's document is not changed."""
    meta = as_mapping(doc.get("metadata"))
    if workload_kind(doc.get("apiVersion"), doc.get("kind")) is None or meta.get("namespace") == namespace:
        return doc
    return {**doc, "metadata": {**meta, "namespace": namespace}}


def review_body_size(doc: dict[str, Any], *, namespace: str, user: str) -> int:
    """Bytes of the AdmissionReview the API server would send for ``doc``: the webhook refuses one
    over ``maxBodyBytes`` (413), so the offline review must too."""
    envelope = admission_review(doc, uid="kratos-review", namespace=namespace, user=user, dry_run=True)
    return len(orjson.dumps(envelope))


def review_document(
    doc: dict[str, Any], *, index: int, engine: AdmissionEngine, namespace: str | None, user: str
) -> Reviewed:
    """What the API server would store for ``doc``: the mutating webhook, its patch applied, then
    the validating webhook on the result, as a dry-run CREATE."""
    namespace = review_namespace(doc, namespace)
    doc = in_namespace(doc, namespace)

    def envelope(obj: dict[str, Any]) -> dict[str, Any]:
        return admission_review(
            obj, uid=f"kratos-review-{index}", namespace=namespace, user=user, dry_run=True
        )

    mutated = answer(parse_review(envelope(doc)), webhook="mutate", engine=engine)
    patch = mutated.patch
    # the decision's object is the patch applied (tests check patch and object agree): no copy needed
    final = mutated.decision.mutated if patch and mutated.decision.mutated is not None else doc
    violations = list(mutated.decision.violations)
    warnings = list(mutated.decision.warnings)
    allowed = mutated.decision.allowed
    if allowed:
        validated = answer(parse_review(envelope(final)), webhook="validate", engine=engine)
        allowed = validated.decision.allowed
        violations += validated.decision.violations
        warnings += validated.decision.warnings
    return Reviewed(
        kind=str(doc["kind"]),
        name=mutated.request.name,
        namespace=namespace,
        allowed=allowed,
        action=mutated.decision.action if allowed else "none",
        violations=tuple(violations),
        warnings=tuple(warnings),
        patch=patch if allowed else [],
        object=final if allowed else doc,
    )


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """libyaml's emitter where PyYAML has it; every object printed in full (no ``&id001`` anchors
    where the same value appears twice: kubectl reads them, people do not)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def as_yaml(obj: dict[str, Any]) -> str:
    """One YAML document, keys in the object's own order."""
    text: str = yaml.dump(obj, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
    return text


def as_json(value: Any) -> str:
    """Indented JSON (orjson: the 12,000-Job benchmark in docs/benchmarks.md spent 6 s in json.dumps)."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def as_patch_entry(reviewed: Reviewed) -> dict[str, Any]:
    return {"kind": reviewed.kind, "name": reviewed.name, "patch": reviewed.patch}
