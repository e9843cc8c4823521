"""Offline review: both webhooks on a manifest, the same code path as the server's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonpatch

from kratos_admit.admission import AdmissionEngine, answer
from kratos_admit.fields import FieldError
from kratos_admit.policy import Action
from kratos_admit.raw import as_mapping, clone
from kratos_admit.request import admission_review, parse_review


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


def review_document(
    doc: dict[str, Any], *, index: int, engine: AdmissionEngine, namespace: str | None, user: str
) -> Reviewed:
    """What the API server would store for ``doc``: the mutating webhook, its patch applied, then
    the validating webhook on the result, as a dry-run CREATE."""
    namespace = namespace or as_mapping(doc.get("metadata")).get("namespace") or "default"

    def envelope(obj: dict[str, Any]) -> dict[str, Any]:
        return admission_review(
            obj, uid=f"kratos-review-{index}", namespace=namespace, user=user, dry_run=True
        )

    mutated = answer(parse_review(envelope(doc)), webhook="mutate", engine=engine)
    patch = mutated.patch
    final = jsonpatch.apply_patch(doc, patch) if patch else clone(doc)
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
        allowed=allowed,
        action=mutated.decision.action if allowed else "none",
        violations=tuple(violations),
        warnings=tuple(warnings),
        patch=patch if allowed else [],
        object=final if allowed else clone(doc),
    )
