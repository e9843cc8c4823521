"""Where WorkloadProfiles, GPU Nodes and the calibration come from, as the decisions see them:
the store interfaces, and the stores held in memory. The admission path only ever reads memory.

``ProfileStore``, ``NodeStore`` and ``CalibrationStore`` are the interface; the file stores
(``kratos_admit.edge.files``) load once at start, the cluster stores (``kratos_admit.edge.cluster``)
keep the same memory current with list+watch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.quantity import parse_positive_integer
from kratos_admit.domain.raw import as_mapping
from kratos_admit.model.calibration import NO_CALIBRATION, Calibration


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
    def product_gpus(self) -> Mapping[str, int]:
        """Per product label, the most GPUs one of its Nodes has (a product whose Nodes say nothing of
        their GPUs is absent: it counts as able to hold any Pod)."""
        ...

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


class StaticCalibrationStore:
    """A calibration fixed at start (none, for file stores), or set by its owner (the simulator)."""

    def __init__(self, calibration: Calibration = NO_CALIBRATION) -> None:
        self.calibration = calibration

    def current(self) -> Calibration:
        return self.calibration

    async def run(self) -> None:
        """Fixed at start: nothing to keep current."""


class ProfileIndex:
    """Profiles by (namespace, spec.workload): the in-memory map every profile store serves from.

    Should two profiles in a namespace name the same workload, the one put last is served; the
    other's delete then leaves it in place."""

    def __init__(self, profiles: Iterable[WorkloadProfile] = ()) -> None:
        self._by_key: dict[tuple[str, str], WorkloadProfile] = {}
        self._key_by_name: dict[tuple[str, str], tuple[str, str]] = {}
        self._name_by_key: dict[tuple[str, str], tuple[str, str]] = {}
        for profile in profiles:
            self.put(profile)

    def put(self, profile: WorkloadProfile) -> None:
        named = (profile.metadata.namespace, profile.metadata.name)
        self.remove(*named)
        key = (profile.metadata.namespace, profile.spec.workload)
        self._key_by_name[named] = key
        self._name_by_key[key] = named
        self._store(key, profile)

    def remove(self, namespace: str, name: str) -> None:
        named = (namespace, name)
        key = self._key_by_name.pop(named, None)
        if key is not None and self._name_by_key.get(key) == named:
            del self._name_by_key[key]
            self._drop(key)

    def _store(self, key: tuple[str, str], profile: WorkloadProfile) -> None:
        self._by_key[key] = profile

    def _drop(self, key: tuple[str, str]) -> None:
        self._by_key.pop(key, None)

    def get(self, namespace: str, workload: str) -> WorkloadProfile | None:
        return self._by_key.get((namespace, workload))

    def names(self) -> set[tuple[str, str]]:
        """The (namespace, name) of every profile held."""
        return set(self._key_by_name)

    def profiles(self) -> list[WorkloadProfile]:
        return list(self._by_key.values())

    def __len__(self) -> int:
        return len(self._name_by_key)


PARSED: Final = 1024  # the packed index keeps this many profiles parsed, the most recently read


class PackedProfileIndex(ProfileIndex):
    """``ProfileIndex`` with each profile held as the JSON of its model (about 1 KiB, where the parsed
    model costs about 8 KiB), and the ``parsed`` most recently read kept parsed: what the webhook
    holds for every profile in the cluster (at 20,000 profiles, 20 MiB rather than 160 MiB).

    A profile read again after it fell out of the parsed few is parsed anew (about 11 us): equal to
    the one put, not the very object, so a decision remembered against it is made again once."""

    def __init__(self, parsed: int = PARSED) -> None:
        self._packed: dict[tuple[str, str], bytes] = {}
        self._parsed: OrderedDict[tuple[str, str], WorkloadProfile] = OrderedDict()
        self._room = max(1, parsed)
        super().__init__()

    def _store(self, key: tuple[str, str], profile: WorkloadProfile) -> None:
        self._packed[key] = WorkloadProfile.__pydantic_serializer__.to_json(profile, by_alias=True)
        self._keep(key, profile)

    def _keep(self, key: tuple[str, str], profile: WorkloadProfile) -> None:
        self._parsed[key] = profile
        self._parsed.move_to_end(key)
        if len(self._parsed) > self._room:
            self._parsed.popitem(last=False)

    def _drop(self, key: tuple[str, str]) -> None:
        self._packed.pop(key, None)
        self._parsed.pop(key, None)

    def get(self, namespace: str, workload: str) -> WorkloadProfile | None:
        key = (namespace, workload)
        profile = self._parsed.get(key)
        if profile is not None:
            self._parsed.move_to_end(key)
            return profile
        packed = self._packed.get(key)
        if packed is None:
            return None
        profile = WorkloadProfile.model_validate_json(packed)
        self._keep(key, profile)
        return profile

    def profiles(self) -> list[WorkloadProfile]:
        return [profile for key in list(self._packed) if (profile := self.get(*key)) is not None]


def node_gpus(node: Mapping[str, Any]) -> int:
    """The GPUs a Node has: its status's allocatable ``nvidia.com/gpu`` where the object has a status,
    else GPU Feature Discovery's ``nvidia.com/gpu.count`` label (a watch of metadata alone sees only
    that); 0 when neither says."""
    allocatable = as_mapping(as_mapping(node.get("status")).get("allocatable"))
    for value in (
        allocatable.get(v.GPU_RESOURCE),
        as_mapping(as_mapping(node.get("metadata")).get("labels")).get(v.GPU_COUNT_LABEL),
    ):
        count = parse_positive_integer(value)
        if count is not None:
            return count
    return 0


def most_gpus(nodes: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Per product, the most GPUs one of its Nodes has, from (product, GPUs) pairs; 0 counts are left out."""
    found: dict[str, int] = {}
    for product, gpus in nodes:
        if gpus > 0:
            found[product] = max(found.get(product, 0), gpus)
    return found


def gpu_products_of(nodes: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The nvidia.com/gpu.product values of the nodes that have a GPU."""
    products = set()
    for node in nodes:
        labels = node.get("metadata", {}).get("labels") or {}
        product = labels.get(v.GPU_PRODUCT_LABEL)
        if isinstance(product, str) and product and labels.get(v.GPU_PRESENT_LABEL, "true") == "true":
            products.add(product)
    return frozenset(products)


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


class StaticNodeStore:
    """The GPU products of a cluster, fixed at start."""

    def __init__(
        self,
        products: Iterable[str] = (),
        nodes: Mapping[str, int] | None = None,
        gpus: Mapping[str, int] | None = None,
    ) -> None:
        self._products = frozenset(products)
        self._nodes = dict(nodes) if nodes is not None else dict.fromkeys(self._products, 1)
        self._gpus = dict(gpus) if gpus is not None else {}

    def product_gpus(self) -> Mapping[str, int]:
        return self._gpus

    def gpu_products(self) -> frozenset[str]:
        return self._products

    def product_nodes(self) -> Mapping[str, int]:
        return self._nodes

    def ready(self) -> bool:
        return True

    async def run(self) -> None:
        """Fixed at start: nothing to keep current."""
