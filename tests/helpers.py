"""Engines over in-memory stores, and a one-call admission helper for tests."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from kratos_admit.admission import AdmissionEngine, ReviewResult, Webhook, answer
from kratos_admit.policy import PolicyContext
from kratos_admit.profile import WorkloadProfile
from kratos_admit.stores import ProfileIndex


class MemoryProfiles:
    def __init__(self, profiles: Iterable[WorkloadProfile] = ()) -> None:
        self.index = ProfileIndex(profiles)

    def get(self, namespace: str, workload: str) -> WorkloadProfile | None:
        return self.index.get(namespace, workload)

    def ready(self) -> bool:
        return True

    def __len__(self) -> int:
        return len(self.index)

    async def refresh(self, namespace: str, workload: str) -> None:
        """Nothing to fetch: the tests put every profile in memory."""

    async def run(self) -> None:
        """Nothing to watch."""


class MemoryNodes:
    def __init__(self, products: Iterable[str] = ()) -> None:
        self.products = frozenset(products)

    def gpu_products(self) -> frozenset[str]:
        return self.products

    def ready(self) -> bool:
        return True

    async def run(self) -> None:
        """Nothing to watch."""


MIXED_CLUSTER = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S", "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3")


def engine(
    ctx: PolicyContext, profiles: Iterable[WorkloadProfile] = (), products: Iterable[str] = MIXED_CLUSTER
) -> AdmissionEngine:
    return AdmissionEngine(ctx=ctx, profiles=MemoryProfiles(profiles), nodes=MemoryNodes(products))


def admit(
    obj: dict[str, Any],
    eng: AdmissionEngine,
    *,
    webhook: Webhook = "mutate",
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
) -> ReviewResult:
    group, _, version = obj["apiVersion"].rpartition("/")
    request: dict[str, Any] = {
        "uid": "test-uid",
        "kind": {"group": group, "version": version, "kind": obj["kind"]},
        "operation": operation,
        "namespace": obj["metadata"].get("namespace", "team-a"),
        "object": copy.deepcopy(obj),
    }
    if old is not None:
        request["oldObject"] = copy.deepcopy(old)
    return answer("admission.k8s.io/v1", request, webhook=webhook, engine=eng)
