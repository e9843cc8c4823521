"""Where WorkloadProfiles and GPU Nodes come from. The admission path only ever reads memory.

``ProfileStore`` and ``NodeStore`` are the interface; the file stores here load once at start, the
cluster stores (``kratos_admit.cluster``) keep the same memory current with list+watch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from kratos_admit import vocabulary as v
from kratos_admit.calibration import (
    CONFIGMAP_KEY,
    NO_CALIBRATION,
    Calibration,
    CalibrationError,
    parse_calibration,
)
from kratos_admit.manifests import ManifestError, split_documents
from kratos_admit.profile import WorkloadProfile


class StoreError(ValueError):
    """A profile or node file that cannot be used; the message names the file and the field."""


class ProfileStore(Protocol):
    def get(self, namespace: str, workload: str) -> WorkloadProfile | None: ...
    def ready(self) -> bool: ...
    def __len__(self) -> int: ...
    async def refresh(self, namespace: str, workload: str) -> None:
        """Called on a cache miss before the answer; a store that cannot miss does nothing."""

    async def run(self) -> None:
        """Keep the store current until cancelled; a store read once at start returns at once."""


class NodeStore(Protocol):
    def gpu_products(self) -> frozenset[str]: ...
    def ready(self) -> bool: ...
    async def run(self) -> None:
        """Keep the store current until cancelled; a store read once at start returns at once."""


class CalibrationStore(Protocol):
    def current(self) -> Calibration:
        """The calibration in force now, from memory (never fetched per request)."""

    async def run(self) -> None:
        """Keep the store current until cancelled; a store fixed at start returns at once."""


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


class StaticCalibrationStore:
    """A calibration fixed at start (none, for file stores), or set by its owner (the simulator)."""

    def __init__(self, calibration: Calibration = NO_CALIBRATION) -> None:
        self.calibration = calibration

    def current(self) -> Calibration:
        return self.calibration

    async def run(self) -> None:
        """Fixed at start: nothing to keep current."""


class ProfileIndex:
    """Profiles by (namespace, spec.workload): the in-memory map every profile store serves from."""

    def __init__(self, profiles: Iterable[WorkloadProfile] = ()) -> None:
        self._by_key: dict[tuple[str, str], WorkloadProfile] = {}
        self._key_by_name: dict[tuple[str, str], tuple[str, str]] = {}
        for profile in profiles:
            self.put(profile)

    def put(self, profile: WorkloadProfile) -> None:
        self.remove(profile.metadata.namespace, profile.metadata.name)
        key = (profile.metadata.namespace, profile.spec.workload)
        self._by_key[key] = profile
        self._key_by_name[(profile.metadata.namespace, profile.metadata.name)] = key

    def remove(self, namespace: str, name: str) -> None:
        key = self._key_by_name.pop((namespace, name), None)
        if key is not None:
            self._by_key.pop(key, None)

    def replace(self, profiles: Iterable[WorkloadProfile]) -> None:
        self._by_key.clear()
        self._key_by_name.clear()
        for profile in profiles:
            self.put(profile)

    def get(self, namespace: str, workload: str) -> WorkloadProfile | None:
        return self._by_key.get((namespace, workload))

    def profiles(self) -> list[WorkloadProfile]:
        return list(self._by_key.values())

    def __len__(self) -> int:
        return len(self._by_key)


def gpu_products_of(nodes: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The nvidia.com/gpu.product values of the nodes that have a GPU."""
    products = set()
    for node in nodes:
        labels = node.get("metadata", {}).get("labels") or {}
        product = labels.get(v.GPU_PRODUCT_LABEL)
        if isinstance(product, str) and product and labels.get(v.GPU_PRESENT_LABEL, "true") == "true":
            products.add(product)
    return frozenset(products)


def _documents(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise StoreError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        yield from enumerate(split_documents(text, str(path)))
    except ManifestError as exc:
        raise StoreError(str(exc)) from None


def load_profiles(paths: Iterable[Path]) -> list[WorkloadProfile]:
    profiles = []
    for path in paths:
        for i, doc in _documents(path):
            if not isinstance(doc, dict) or doc.get("kind") != v.PROFILE_KIND:
                continue
            try:
                profiles.append(WorkloadProfile.model_validate(doc))
            except ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(str(p) for p in err["loc"])
                raise StoreError(f"{path} (document {i + 1}): {where}: {err['msg']}") from None
    return profiles


def load_nodes(path: Path) -> list[dict[str, Any]]:
    return [doc for _, doc in _documents(path) if isinstance(doc, dict) and doc.get("kind") == "Node"]


def profile_files(directory: Path) -> list[Path]:
    if directory.is_file():
        return [directory]
    if not directory.is_dir():
        raise StoreError(f"{directory}: no such profile directory")
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())


class StaticProfileStore:
    """Profiles held in memory and fixed at start: read from files, or handed over directly."""

    def __init__(self, profiles: Iterable[WorkloadProfile] = ()) -> None:
        self._index = ProfileIndex(profiles)

    def get(self, namespace: str, workload: str) -> WorkloadProfile | None:
        return self._index.get(namespace, workload)

    def ready(self) -> bool:
        return True

    def __len__(self) -> int:
        return len(self._index)

    async def refresh(self, namespace: str, workload: str) -> None:
        """Every profile is in memory: a miss is an answer."""

    async def run(self) -> None:
        """Fixed at start: nothing to keep current."""


class FileProfileStore(StaticProfileStore):
    """WorkloadProfiles from a directory of YAML files, read once at start."""

    def __init__(self, directory: Path | None) -> None:
        super().__init__(load_profiles(profile_files(directory)) if directory else ())


class StaticNodeStore:
    """The GPU products of a cluster, fixed at start."""

    def __init__(self, products: Iterable[str] = ()) -> None:
        self._products = frozenset(products)

    def gpu_products(self) -> frozenset[str]:
        return self._products

    def ready(self) -> bool:
        return True

    async def run(self) -> None:
        """Fixed at start: nothing to keep current."""


class FileNodeStore(StaticNodeStore):
    """Nodes from a (multi-document) YAML file, read once at start."""

    def __init__(self, path: Path | None) -> None:
        super().__init__(gpu_products_of(load_nodes(path)) if path else ())
