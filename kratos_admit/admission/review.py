"""Offline review: both webhooks on a manifest, the same code path as the server's, and its output.

A big input is reviewed in batches by forked worker processes, one per CPU (each document's review
is independent of the others: offline review never remembers a profiling run), and the batches'
output is written in input order, so the result is the same text as one process would write.
"""

from __future__ import annotations

import io
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from kratos_admit.admission.engine import AdmissionEngine, answer
from kratos_admit.admission.request import admission_review, parse_review
from kratos_admit.admission.strict import unknown_fields
from kratos_admit.decisions.policy import Action
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.fields import FieldError
from kratos_admit.domain.raw import as_mapping
from kratos_admit.domain.workload import workload_kind
from kratos_admit.domain.yamlio import DocumentWriter

OutputForm = Literal["yaml", "json", "patch"]


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
    # the product the decision sent the Job to explore ("" when none), and what made it a gang ("" when
    # it runs alone): not in the CLI's output, whose shape DESIGN fixes; its hints annotation says both
    explored: str = ""
    gang: str = ""
    # why an allowed object comes back with action none ("" otherwise): printed as a note, and in
    # JSON as "reason" beside DESIGN's keys
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        found = {
            "kind": self.kind,
            "name": self.name,
            "allowed": self.allowed,
            "action": self.action,
            "violations": [e.as_dict() for e in self.violations],
            "warnings": list(self.warnings),
            "patch": self.patch,
            "object": self.object,
        }
        if self.reason:
            found["reason"] = self.reason
        return found


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


def left_alone(doc: dict[str, Any]) -> str:
    """Why KRATOS leaves an object as it is: a kind it does not review, or a Job or Pod not opted in.
    "" where the object is opted in (an action none there is KRATOS's own profiling run, or output
    it hinted before, which the hints record says)."""
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if workload_kind(api_version, kind) is None:
        return (
            f"KRATOS does not review a {api_version} {kind}: only batch/v1 Jobs and v1 Pods (a CronJob's "
            "Jobs and a Deployment's Pods are reviewed as they are made)"
        )
    labels = as_mapping(as_mapping(doc.get("metadata")).get("labels"))
    if v.WORKLOAD_LABEL not in labels:
        return f"not opted in: KRATOS acts only on a {kind} labelled {v.WORKLOAD_LABEL}: <workload name>"
    return ""


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
    # offline only: in a cluster the API server refuses unknown fields before any webhook sees them
    warnings = [*unknown_fields(doc), *mutated.decision.warnings]
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
        explored=mutated.decision.explored if allowed else "",
        gang=mutated.decision.gang if allowed else "",
        reason=left_alone(doc) if allowed and mutated.decision.action == "none" else "",
    )


def as_json(value: Any) -> str:
    """Indented JSON (orjson: the 12,000-Job benchmark in docs/benchmarks.md spent 6 s in json.dumps)."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def as_patch_entry(reviewed: Reviewed) -> dict[str, Any]:
    return {"kind": reviewed.kind, "name": reviewed.name, "patch": reviewed.patch}


@dataclass(frozen=True, slots=True)
class Batch:
    """What a run of consecutive documents gives: output text, stderr lines, and whether all passed."""

    text: str  # YAML documents (only the allowed), or JSON entries each indented for an array
    entries: int  # how many documents or entries ``text`` holds
    allowed: bool
    notes: tuple[str, ...]  # "warning: Kind/name: ..." and "denied: Kind/name: ..." lines


@dataclass(frozen=True, slots=True)
class _Work:
    documents: Sequence[dict[str, Any]]
    engine: AdmissionEngine
    namespace: str | None
    user: str
    form: OutputForm
    several: bool


_work: _Work | None = None  # set before the workers fork; they read it, copy-on-write


def _review_batch(bounds: tuple[int, int]) -> Batch:
    assert _work is not None
    work = _work
    out = io.StringIO()
    yaml_out = DocumentWriter(out) if work.form == "yaml" else None
    entries, allowed, notes, texts = 0, True, [], []
    for index in range(*bounds):
        r = review_document(
            work.documents[index], index=index, engine=work.engine, namespace=work.namespace, user=work.user
        )
        notes += [f"warning: {r.kind}/{r.name}: {text}" for text in r.warnings]
        notes += [f"denied: {r.kind}/{r.name}: {error}" for error in r.violations]
        if r.reason:
            notes.append(f"left alone: {r.kind}/{r.name}: {r.reason}")
        allowed = allowed and r.allowed
        if yaml_out is not None:
            if r.allowed:  # only what may be applied: `| kubectl apply -f -` never gets a denied one
                yaml_out.write(r.object)
                entries += 1
            continue
        text = as_json(r.as_dict() if work.form == "json" else as_patch_entry(r))
        texts.append(text.replace("\n", "\n  ") if work.several else text)  # JSON strings hold no raw newline
        entries += 1
    if yaml_out is not None:
        yaml_out.close()
    return Batch(
        out.getvalue() if yaml_out is not None else ",\n  ".join(texts), entries, allowed, tuple(notes)
    )


def review_batches(
    documents: Sequence[dict[str, Any]],
    *,
    engine: AdmissionEngine,
    namespace: str | None,
    user: str,
    form: OutputForm,
    batch_size: int = 500,
    workers: int | None = None,
) -> Iterator[Batch]:
    """Every document reviewed, as batches in input order: in this process for a small input, else
    by ``workers`` forked processes (default: one per CPU this process may use)."""
    global _work  # noqa: PLW0603 (handed to the forked workers through the module, not pickled)
    _work = _Work(documents, engine, namespace, user, form, several=len(documents) > 1)
    bounds = [
        (start, min(start + batch_size, len(documents))) for start in range(0, len(documents), batch_size)
    ]
    workers = len(os.sched_getaffinity(0)) if workers is None else workers
    try:
        if (
            workers < 2 or len(bounds) < 2 or form == "json"
        ):  # 137 MB of JSON costs more to pass back than it saves
            yield from map(_review_batch, bounds)
            return
        with multiprocessing.get_context("fork").Pool(min(workers, len(bounds))) as pool:
            yield from pool.imap(_review_batch, bounds)
    finally:
        _work = None
