"""Engines over in-memory stores, and a one-call admission helper for tests."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from kratos_admit.admission import AdmissionEngine, ReviewResult, Webhook, answer
from kratos_admit.policy import PolicyContext
from kratos_admit.profile import WorkloadProfile
from kratos_admit.stores import StaticNodeStore, StaticProfileStore

MIXED_CLUSTER = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S", "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3")


def engine(
    ctx: PolicyContext, profiles: Iterable[WorkloadProfile] = (), products: Iterable[str] = MIXED_CLUSTER
) -> AdmissionEngine:
    return AdmissionEngine(ctx=ctx, profiles=StaticProfileStore(profiles), nodes=StaticNodeStore(products))


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
