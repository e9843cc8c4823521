"""Reading manifests: YAML or JSON streams of Kubernetes objects, as kubectl reads them.

One reader for the offline review, the profile and node files, the config and the catalog, so a
syntax error is reported the same way everywhere: the file, the line and column, and the problem.
YAML is read by ``yamlio`` (libyaml, with the per-node Python work cut down), a JSON document by
orjson.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
import yaml

from kratos_admit.domain import yamlio
from kratos_admit.domain.quantity import parse_quantity
from kratos_admit.domain.raw import as_mapping
from kratos_admit.domain.workload import Container, Workload, workload_kind

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")  # what kubectl reads from a directory


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
        return yamlio.load(text)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{origin}: not valid YAML: {yaml_problem(exc)}") from None


def split_documents(text: str, origin: str) -> list[object]:
    """Every document of a YAML or JSON stream, empty ones skipped and ``*List`` objects flattened
    into their items (as kubectl reads manifests)."""
    documents: list[object] = []
    try:
        for number, doc in enumerate(_json_or_yaml_stream(text), start=1):
            if doc is None:
                continue
            if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List"):
                documents.extend(_list_items(doc, f"{origin}: document {number}"))
            else:
                documents.append(doc)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{origin}: not valid YAML: {yaml_problem(exc)}") from None
    return documents


def _list_items(doc: dict[str, Any], where: str) -> list[object]:
    """A ``*List``'s items; kubectl refuses one whose ``items`` is not a list, and so do we, rather
    than echo it back as if it were an object to admit."""
    items = doc.get("items")
    if items is None:
        return []
    if not isinstance(items, list):
        raise ManifestError(f"{where}: kind {doc.get('kind')}: items: must be a list, found {_a(items)}")
    return items


def _json_or_yaml_stream(text: str) -> Iterable[object]:
    """One JSON document (``kubectl get -o json``) read by orjson, else the YAML stream."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            return [orjson.loads(text)]
        except orjson.JSONDecodeError:
            pass  # several JSON documents, or YAML flow style: the YAML parser reads both
    return yamlio.load_all(text)


@dataclass(frozen=True, slots=True)
class Document:
    """One object of the input and where it came from."""

    origin: str  # the file, or <stdin>
    number: int  # its place in that file, from 1
    object: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.origin}: document {self.number}"


def load_objects(text: str, origin: str) -> list[Document]:
    """Every object in a stream, checked as the API server would first (kind, apiVersion, the shape
    of metadata and of the pod spec, resource quantities), so a broken manifest is refused with a
    reason instead of reviewed."""
    docs: list[Document] = []
    for number, doc in enumerate(split_documents(text, origin), start=1):
        where = f"{origin}: document {number}"
        if not isinstance(doc, dict):
            raise ManifestError(f"{where}: is not a Kubernetes object (a mapping), found {_a(doc)}")
        for key in ("apiVersion", "kind"):
            if not isinstance(doc.get(key), str) or not doc[key]:
                raise ManifestError(f"{where}: {key} is missing")
        if not isinstance(doc.get("metadata", {}), dict):
            raise ManifestError(f"{where}: metadata must be a mapping, found {_a(doc['metadata'])}")
        _check_shape(doc, where)
        _check_quantities(doc, where)
        _check_json(doc, where)
        docs.append(Document(origin, number, doc))
    return docs


def read_manifests(names: Iterable[str], *, recursive: bool, stdin: IO[str]) -> list[Document]:
    """The objects of every ``-f``: a file, a directory's .yaml/.yml/.json files (its subdirectories'
    too with ``recursive``, as ``kubectl -R``), or ``-`` for standard input, each read once."""
    documents: list[Document] = []
    seen: set[Path] = set()
    for name in names:
        if name == "-":
            documents += load_objects(stdin.read(), "<stdin>")
            continue
        for path in _manifest_files(Path(name), recursive=recursive):
            if path.resolve() not in seen:
                seen.add(path.resolve())
                documents += load_objects(read_manifest(path), str(path))
    if not documents:
        named = ", ".join("<stdin>" if name == "-" else name for name in names)
        raise ManifestError(f"{named}: no Kubernetes object in the input")
    return documents


def _manifest_files(path: Path, *, recursive: bool) -> list[Path]:
    if not path.is_dir():
        return [path]  # a missing file is said by read_manifest
    found = path.rglob("*") if recursive else path.iterdir()
    files = sorted(p for p in found if p.suffix in MANIFEST_SUFFIXES and p.is_file())
    if not files:
        deeper = "" if recursive else " (-R to look in its subdirectories)"
        raise ManifestError(f"{path}: a directory with no .yaml, .yml or .json file{deeper}")
    return files


def read_manifest(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ManifestError(
            f"{path}: not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x})"
        ) from None


def _a(value: object) -> str:
    """``the string 'oops'``: what was found where something else belongs, for the error line."""
    if value is None:
        return "null"
    if isinstance(value, dict | list):
        return "a mapping" if isinstance(value, dict) else "a list"
    noun = {str: "the string", bool: "the boolean", int: "the number", float: "the number"}.get(type(value))
    return f"{noun} {value!r}" if noun else type(value).__name__


def _check_json(doc: Mapping[str, Any], where: str) -> None:
    """What kubectl could not send as JSON (a recursive alias, a !!set) is no object to review."""
    try:
        orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError as exc:
        raise ManifestError(f"{where}: cannot be sent to the API server as JSON: {exc}") from None


def _check_shape(doc: Mapping[str, Any], where: str) -> None:
    """The parts of a Job or Pod KRATOS reads must have the types the API server would insist on
    (a ``spec: "oops"`` never reaches a webhook: the server refuses to decode it)."""
    kind = workload_kind(doc.get("apiVersion"), doc.get("kind"))
    if kind is None:
        return

    def mapping(value: object, field: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ManifestError(f"{where}: {field}: must be a mapping, found {_a(value)}")
        return value

    meta = mapping(doc.get("metadata"), "metadata")
    for key in ("labels", "annotations"):
        mapping(meta.get(key), f"metadata.{key}")
    pod_spec, pod_path = mapping(doc.get("spec"), "spec"), "spec"
    if kind == "Job":
        template = mapping(pod_spec.get("template"), "spec.template")
        template_meta = mapping(template.get("metadata"), "spec.template.metadata")
        for key in ("labels", "annotations"):
            mapping(template_meta.get(key), f"spec.template.metadata.{key}")
        pod_spec, pod_path = mapping(template.get("spec"), "spec.template.spec"), "spec.template.spec"
    for key in ("initContainers", "containers"):
        containers = pod_spec.get(key)
        if containers is None:
            continue
        if not isinstance(containers, list):
            raise ManifestError(f"{where}: {pod_path}.{key}: must be a list, found {_a(containers)}")
        for i, container in enumerate(containers):
            path = f"{pod_path}.{key}[{i}]"
            resources = mapping(mapping(container, path).get("resources"), f"{path}.resources")
            for section in ("limits", "requests"):
                mapping(resources.get(section), f"{path}.resources.{section}")


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
