"""Live stores: WorkloadProfiles (all namespaces), GPU Nodes and the GPU calibration cached by list+watch.

They implement the same ``ProfileStore``/``NodeStore`` interface as the file stores; the admission
path reads only their memory. The one exception is a profile cache miss: one direct GET with a
short timeout, so a profile the controller wrote a moment ago is seen by the very next admission
(the controller publishes the profile, then creates the execution Job).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client
from pydantic import ValidationError

from kratos_admit.decisions.stores import PackedProfileIndex, most_gpus, node_gpus
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import WorkloadProfile, as_read
from kratos_admit.edge.kube import Informer, Key, Sweep, is_status, metadata_lister, one_line
from kratos_admit.model.calibration import (
    CONFIGMAP_KEY,
    CONFIGMAP_NAME,
    NO_CALIBRATION,
    Calibration,
    CalibrationError,
    parse_calibration,
)

log = logging.getLogger("kratos.stores")
Obj = dict[str, Any]


def _profile(obj: Obj) -> WorkloadProfile | None:
    """The webhook's copy of a profile: as the decisions read it (``as_read``: no countedRuns, no
    managedFields), so the cache holds nothing admission never reads."""
    obj = dict(as_read(obj))
    try:
        return WorkloadProfile.model_validate(obj)
    except ValidationError as exc:
        meta = obj.get("metadata", {})
        log.warning(
            "ignoring an invalid WorkloadProfile",
            extra={
                "namespace": meta.get("namespace"),
                "profile": meta.get("name"),
                "reason": str(exc.errors()[0]),
            },
        )
        return None


class ClusterProfileStore:
    def __init__(self, api: client.ApiClient, *, get_timeout: float = 1.0, negative_ttl: float = 1.0) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.index = PackedProfileIndex()
        self.get_timeout = get_timeout
        self.negative_ttl = negative_ttl
        self._absent: dict[tuple[str, str], float] = {}
        # a (re)list is folded page by page (mark and sweep): each page's profiles are parsed into the
        # index as they come, so neither the whole list as sent nor a second index is ever held; those
        # the list did not name are dropped at its end. Meanwhile admission answers from the index.
        self.informer = Informer(
            functools.partial(self.custom.list_cluster_custom_object, v.GROUP, v.VERSION, v.PROFILE_PLURAL),
            name="workloadprofiles",
            fold=Sweep(
                self._listed, self.index.names, lambda key: self.index.remove(*key), self._absent.clear
            ),
            on_event=self._event,
        )

    def _listed(self, obj: Obj) -> Key:
        meta = obj.get("metadata", {})
        named = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        profile = _profile(obj)
        if profile is None:
            self.index.remove(*named)
        else:
            self.index.put(profile)
        return named

    def _event(self, kind: str, obj: Obj) -> None:
        meta = obj.get("metadata", {})
        if kind == "DELETED":
            self.index.remove(str(meta.get("namespace", "")), str(meta.get("name", "")))
            return
        profile = _profile(obj)
        if profile is None:
            self.index.remove(str(meta.get("namespace", "")), str(meta.get("name", "")))
            return
        self.index.put(profile)
        self._absent.pop((profile.metadata.namespace, profile.spec.workload), None)

    def get(self, namespace: str, workload: str) -> WorkloadProfile | None:
        return self.index.get(namespace, workload)

    def ready(self) -> bool:
        return self.informer.synced.is_set()

    def __len__(self) -> int:
        return len(self.index)

    async def refresh(self, namespace: str, workload: str) -> None:
        """After a cache miss: one GET of ``<workload>-profile``, bounded by ``get_timeout``."""
        key = (namespace, workload)
        if time.monotonic() < self._absent.get(key, 0.0):
            return
        try:
            obj: Obj = await asyncio.wait_for(
                self.custom.get_namespaced_custom_object(
                    v.GROUP,
                    v.VERSION,
                    namespace,
                    v.PROFILE_PLURAL,
                    v.profile_name(workload),
                    _request_timeout=self.get_timeout,
                ),
                timeout=self.get_timeout,
            )
        except Exception as exc:
            if not is_status(exc, 404):
                log.warning(
                    "profile lookup failed; answering from the cache",
                    extra={
                        "namespace": namespace,
                        "workload": workload,
                        "reason": one_line(exc),
                    },
                )
            self._absent[key] = time.monotonic() + self.negative_ttl
            return
        profile = _profile(obj)
        if profile is not None and profile.spec.workload == workload:
            self.index.put(profile)

    async def run(self) -> None:
        await self.informer.run()


class ClusterNodeStore:
    """The GPU products of Nodes labelled nvidia.com/gpu.present=true, kept current by a watch of
    their metadata alone (``metadata_lister``): the product is a label (GPU Feature Discovery's
    ``nvidia.com/gpu.product``), and a Node's status, which its kubelet fills with conditions,
    addresses and images, is never read. A Node without the product label is not counted: admission
    ranks products, and such a Node has none to rank (its GPUs still take Pods the scheduler sends)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._by_node: dict[str, tuple[str, int]] = {}  # name -> (product, GPUs by its gpu.count label)
        self._listing: dict[str, tuple[str, int]] = {}  # the list being read, page by page
        self._products: frozenset[str] = frozenset()
        self._product_nodes: Counter[str] = Counter()
        self._product_gpus: dict[str, int] = {}
        self.informer = Informer(
            metadata_lister(api, "/api/v1/nodes"),
            name="gpu-nodes",
            label_selector=f"{v.GPU_PRESENT_LABEL}=true",
            fold=self,
            on_event=self._event,
        )

    def _product(self, node: Obj) -> str | None:
        product = (node.get("metadata", {}).get("labels") or {}).get(v.GPU_PRODUCT_LABEL)
        return product if isinstance(product, str) and product else None

    # a (re)list, folded page by page into a map of its own (a name and a product a Node), which
    # replaces the one admission reads once the last page is in
    def begin(self) -> None:
        self._listing = {}

    def page(self, items: list[Obj]) -> None:
        self._listing.update(
            (str(n["metadata"]["name"]), (p, node_gpus(n))) for n in items if (p := self._product(n))
        )

    def end(self) -> None:
        self._by_node, self._listing = self._listing, {}
        self._changed()

    def _event(self, kind: str, node: Obj) -> None:
        name = str(node.get("metadata", {}).get("name", ""))
        product = self._product(node)
        if kind == "DELETED" or product is None:
            self._by_node.pop(name, None)
        else:
            self._by_node[name] = (product, node_gpus(node))
        self._changed()

    def _changed(self) -> None:
        """What admission reads, derived once per change of the Nodes, not per request."""
        self._products = frozenset(p for p, _ in self._by_node.values())
        self._product_nodes = Counter(p for p, _ in self._by_node.values())
        gpus = most_gpus(self._by_node.values())
        if gpus != self._product_gpus:  # identity is what the decision cache compares first
            self._product_gpus = gpus

    def gpu_products(self) -> frozenset[str]:
        return self._products

    def product_nodes(self) -> Mapping[str, int]:
        return self._product_nodes

    def product_gpus(self) -> Mapping[str, int]:
        return self._product_gpus

    def ready(self) -> bool:
        return self.informer.synced.is_set()

    async def run(self) -> None:
        await self.informer.run()


class ClusterCalibrationStore:
    """The ConfigMap ``kratos-gpu-calibration`` the controller writes, watched by name (a field
    selector, which is also what lets RBAC's ``resourceNames`` authorise the list and the watch).
    Admission reads ``current()`` from memory; an unreadable ConfigMap keeps the last good one."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.calibration: Calibration = NO_CALIBRATION
        self.informer = Informer(
            functools.partial(self.core.list_namespaced_config_map, namespace),
            name="gpu-calibration",
            field_selector=f"metadata.name={CONFIGMAP_NAME}",
            on_replace=self._replace,
            on_event=self._event,
        )

    def _read(self, configmap: Obj) -> None:
        text = (configmap.get("data") or {}).get(CONFIGMAP_KEY)
        if not isinstance(text, str):
            self.calibration = NO_CALIBRATION
            return
        try:
            self.calibration = parse_calibration(text)
        except CalibrationError as exc:
            log.warning(
                "ignoring an unreadable calibration; keeping the last one",
                extra={"namespace": self.namespace, "configMap": CONFIGMAP_NAME, "reason": str(exc)},
            )

    def _replace(self, items: list[Obj]) -> None:
        found = [c for c in items if c.get("metadata", {}).get("name") == CONFIGMAP_NAME]
        if found:
            self._read(found[0])
        else:
            self.calibration = NO_CALIBRATION

    def _event(self, kind: str, configmap: Obj) -> None:
        if configmap.get("metadata", {}).get("name") != CONFIGMAP_NAME:
            return
        if kind == "DELETED":
            self.calibration = NO_CALIBRATION
        else:
            self._read(configmap)

    def current(self) -> Calibration:
        return self.calibration

    async def run(self) -> None:
        await self.informer.run()
