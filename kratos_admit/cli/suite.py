"""Declarative review suites, ``kratos-admit test`` (as ``kyverno test`` and ``gator verify``).

A ``kratos-test.yaml`` names manifests, profiles, nodes and a config file (paths relative to it) and
the decision expected for each object; every object is reviewed exactly as ``kratos-admit review``
reviews it, and each expectation becomes one row of a table: met, or the mismatch. A suite's
decisions depend on its own files only: ``KRATOS_*`` variables are not read, so CI and a laptop
agree.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kratos_admit.admission.engine import build_engine
from kratos_admit.admission.review import Reviewed, review_document
from kratos_admit.decisions.policy import Action
from kratos_admit.domain.config import ConfigError, load_config, validated_document
from kratos_admit.domain.manifests import ManifestError, parse_yaml, read_manifests
from kratos_admit.domain.signing import DEVELOPMENT_KEY
from kratos_admit.edge.files import FileNodeStore, FileProfileStore, StoreError, read_text
from kratos_admit.model.catalog import CatalogError

SUITE_FILE = "kratos-test.yaml"
SUITE_API_VERSION = "cli.gpu.scheduler.io/v1alpha1"


class SuiteError(ValueError):
    """A suite file, or a file it names, that cannot be used; one line naming it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Expectation(_Strict):
    """What one object's review must say; a field left out is not checked."""

    kind: str
    name: str
    namespace: str | None = None  # needed only when two objects share kind and name
    allowed: bool | None = None
    action: Action | None = None
    rules: list[str] | None = None  # exactly these rule ids among the violations ([] for none)
    warnings: list[str] = Field(default_factory=list)  # each a part of some warning
    reason: str | None = None  # a part of why an allowed object is left alone (action none)


class Suite(_Strict):
    api_version: Literal["cli.gpu.scheduler.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["Test"]
    name: str
    manifests: list[str] = Field(min_length=1)  # files or directories, as review -f takes them
    profiles: str | None = None  # a directory of WorkloadProfiles, as review --profiles
    nodes: str | None = None  # a file of Nodes, as review --nodes
    config: str | None = None  # a configuration file, as review --config
    namespace: str | None = None  # as review -n
    user: str = "kratos-test"
    results: list[Expectation] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Row:
    suite: str
    object: str  # Kind/name, or Kind/namespace/name where the expectation names the namespace
    passed: bool
    reason: str  # the mismatches, "" when every field was met


def find_suites(directory: Path) -> list[Path]:
    """Every ``kratos-test.yaml`` under ``directory`` (or the file itself, when given one)."""
    if directory.is_file():
        return [directory]
    if not directory.is_dir():
        raise SuiteError(f"{directory}: no such directory")
    found = sorted(directory.rglob(SUITE_FILE))
    if not found:
        raise SuiteError(f'{directory}: holds no {SUITE_FILE} (docs/reference.md "Review suites" shows one)')
    return found


def load_suite(path: Path) -> Suite:
    try:
        data = parse_yaml(read_text(path, expected=f"a suite is a {SUITE_FILE} file"), str(path))
    except (StoreError, ManifestError) as exc:
        raise SuiteError(str(exc)) from None
    return validated_document(
        Suite, data, path, SuiteError, "must be a mapping (apiVersion, kind: Test, name, manifests, results)"
    )


def run_suite(path: Path) -> list[Row]:
    """One row per expectation of the suite at ``path``."""
    suite = load_suite(path)
    base = path.parent
    try:
        config = load_config(
            base / suite.config if suite.config else None,
            environ={},
            overrides={
                "profilesDir": base / suite.profiles if suite.profiles else None,
                "nodesFile": base / suite.nodes if suite.nodes else None,
                "source": "files",
            },
        )
        engine = build_engine(
            config,
            signing_key=DEVELOPMENT_KEY,
            profiles=FileProfileStore(config.profiles_dir),
            nodes=FileNodeStore(config.nodes_file),
        )
        documents = read_manifests(
            [str(base / m) for m in suite.manifests], recursive=False, stdin=io.StringIO()
        )
    except (ConfigError, CatalogError, StoreError, ManifestError) as exc:
        raise SuiteError(f"{path}: {exc}") from None
    reviewed = [
        review_document(d.object, index=i, engine=engine, namespace=suite.namespace, user=suite.user)
        for i, d in enumerate(documents)
    ]
    return [_check(suite.name, expected, reviewed) for expected in suite.results]


def _check(suite: str, expected: Expectation, reviewed: list[Reviewed]) -> Row:
    label = "/".join(p for p in (expected.kind, expected.namespace, expected.name) if p)
    found = [
        r
        for r in reviewed
        if (r.kind, r.name) == (expected.kind, expected.name) and expected.namespace in (None, r.namespace)
    ]
    if len(found) != 1:
        why = (
            "no such object in the manifests" if not found else f"{len(found)} objects match: give namespace"
        )
        return Row(suite, label, False, why)
    [got] = found
    mismatches = []
    if expected.allowed is not None and got.allowed != expected.allowed:
        mismatches.append(
            f"allowed: expected {str(expected.allowed).lower()}, got {str(got.allowed).lower()}"
        )
    if expected.action is not None and got.action != expected.action:
        mismatches.append(f"action: expected {expected.action}, got {got.action}")
    rules = sorted({e.rule for e in got.violations})
    if expected.rules is not None and sorted(set(expected.rules)) != rules:
        mismatches.append(
            f"rules: expected [{', '.join(sorted(set(expected.rules)))}], got [{', '.join(rules)}]"
        )
    for part in expected.warnings:
        if not any(part in w for w in got.warnings):
            mismatches.append(f"warnings: none contains {part!r}")
    if expected.reason is not None and expected.reason not in got.reason:
        mismatches.append(f"reason: {got.reason or 'none given'!r} does not contain {expected.reason!r}")
    return Row(suite, label, not mismatches, "; ".join(mismatches))


def format_rows(rows: list[Row]) -> str:
    """The table, then one line that counts what was met."""
    header = ("SUITE", "OBJECT", "RESULT", "REASON")
    cells = [(r.suite, r.object, "pass" if r.passed else "FAIL", r.reason) for r in rows]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(3)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)), row[3]]).rstrip()
             for row in [header, *cells]]  # fmt: skip
    failed = sum(not r.passed for r in rows)
    summary = (
        f"kratos-admit test: all {len(rows)} expectations met"
        if not failed
        else f"kratos-admit test: {failed} of {len(rows)} expectations not met"
    )
    return "\n".join([*lines, "", summary]) + "\n"
