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
from kratos_admit.config import in_our_words
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
    def product_nodes(self) -> Mapping[str, int]:
        """How many Nodes carry each GPU product label (where profiling runs go first)."""

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

    def __init__(self, products: Iterable[str] = (), nodes: Mapping[str, int] | None = None) -> None:
        self._products = frozenset(products)
        self._nodes = dict(nodes) if nodes is not None else dict.fromkeys(self._products, 1)

    def gpu_products(self) -> frozenset[str]:
        return self._products

    def product_nodes(self) -> Mapping[str, int]:
        return self._nodes

    def ready(self) -> bool:
        return True

    async def run(self) -> None:
        """Fixed at start: nothing to keep current."""


class FileNodeStore(StaticNodeStore):
    """Nodes from a (multi-document) YAML file, read once at start."""

    def __init__(self, path: Path | None) -> None:
        nodes = load_nodes(path) if path else []
        counts: dict[str, int] = {}
        for node in nodes:
            for product in gpu_products_of([node]):
                counts[product] = counts.get(product, 0) + 1
        super().__init__(gpu_products_of(nodes), counts)
