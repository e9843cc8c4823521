"""WorkloadProfiles, Nodes and a calibration read from files (``--profiles``, ``--nodes``,
``--calibration``), once at start, into the in-memory stores of ``kratos_admit.decisions.stores``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kratos_admit.decisions.stores import (
    StaticNodeStore,
    StaticProfileStore,
    gpu_products_of,
    most_gpus,
    node_gpus,
)
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import in_our_words
from kratos_admit.domain.manifests import ManifestError, split_documents
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.model.calibration import CONFIGMAP_KEY, Calibration, CalibrationError, parse_calibration


class StoreError(ValueError):
    """A profile or node file that cannot be used; the message names the file and the field."""


def load_calibration(path: Path) -> Calibration:
    """A calibration from a file: the ConfigMap as ``kubectl get -o yaml`` prints it, or its
    ``calibration.json`` alone."""
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise StoreError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        docs = list(split_documents(text, str(path)))
    except ManifestError:
        docs = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
            text = str((doc.get("data") or {}).get(CONFIGMAP_KEY, ""))
            break
    try:
        return parse_calibration(text)
    except CalibrationError as exc:
        raise StoreError(f"{path}: {exc}") from None


def read_text(path: Path, *, expected: str) -> str:
    """A file's text, or StoreError naming it: missing, a directory, unreadable, or not UTF-8."""
    try:
        return path.read_text("utf-8")
    except IsADirectoryError:
        raise StoreError(f"{path}: is a directory; {expected}") from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise StoreError(f"{path}: not UTF-8 text (byte {exc.start}); {expected}") from None


def _documents(path: Path, *, kind: str, expected: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Every document of a file, each of which must be a ``kind``: a file holding anything else was
    named by mistake, and reading it as holding none would silently change every decision."""
    try:
        documents = split_documents(read_text(path, expected=expected), str(path))
    except ManifestError as exc:
        raise StoreError(str(exc)) from None
    for i, doc in enumerate(documents):
        found = doc.get("kind") if isinstance(doc, dict) else None
        if found != kind:
            what = f"a {found}" if isinstance(found, str) and found else "not a Kubernetes object"
            raise StoreError(f"{path}: document {i + 1} is {what}; {expected}")
        assert isinstance(doc, dict)
        yield i, doc


PROFILES_EXPECTED = f"--profiles expects a directory of {v.PROFILE_KIND} YAML files"
NODES_EXPECTED = "--nodes expects a file of Node objects (kubectl get nodes -o yaml)"


def load_profiles(paths: Iterable[Path], *, expected: str = PROFILES_EXPECTED) -> list[WorkloadProfile]:
    """Every WorkloadProfile in ``paths``; two for one workload (namespace and spec.workload) are an
    error naming both files, as the webhook could only pick one of them at random."""
    profiles = []
    seen: dict[tuple[str, str], str] = {}
    for path in paths:
        for i, doc in _documents(path, kind=v.PROFILE_KIND, expected=expected):
            where = f"{path} (document {i + 1})"
            try:
                profile = WorkloadProfile.model_validate(doc)
            except ValidationError as exc:
                problem = in_our_words(exc.errors()[0], doc, model=WorkloadProfile, noun="field")
                raise StoreError(f"{where}: {problem}") from None
            key = (profile.metadata.namespace, profile.spec.workload)
            if key in seen:
                raise StoreError(
                    f"{where}: a second {v.PROFILE_KIND} for workload {key[1]} in namespace {key[0]}; "
                    f"the first is in {seen[key]} (keep one)"
                )
            seen[key] = where
            profiles.append(profile)
    return profiles


def load_nodes(path: Path) -> list[dict[str, Any]]:
    nodes = [doc for _, doc in _documents(path, kind="Node", expected=NODES_EXPECTED)]
    if not nodes:
        raise StoreError(f"{path}: holds no Node; {NODES_EXPECTED}")
    return nodes


def profile_files(directory: Path) -> list[Path]:
    if directory.is_file():
        raise StoreError(f"{directory}: is a file; {PROFILES_EXPECTED}")
    if not directory.is_dir():
        raise StoreError(f"{directory}: no such profile directory; {PROFILES_EXPECTED}")
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())


class FileProfileStore(StaticProfileStore):
    """WorkloadProfiles from a directory of YAML files, read once at start."""

    def __init__(self, directory: Path | None) -> None:
        super().__init__(load_profiles(profile_files(directory)) if directory else ())


class FileNodeStore(StaticNodeStore):
    """Nodes from a (multi-document) YAML file, read once at start."""

    def __init__(self, path: Path | None) -> None:
        nodes = load_nodes(path) if path else []
        counts: dict[str, int] = {}
        gpus: list[tuple[str, int]] = []
        for node in nodes:
            for product in gpu_products_of([node]):
                counts[product] = counts.get(product, 0) + 1
                gpus.append((product, node_gpus(node)))
        super().__init__(gpu_products_of(nodes), counts, most_gpus(gpus))
