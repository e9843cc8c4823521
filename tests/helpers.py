"""Engines over in-memory stores, and a one-call admission helper for tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kratos_admit.admission import AdmissionEngine, ReviewResult, Webhook, answer
from kratos_admit.policy import PolicyContext
from kratos_admit.profile import WorkloadProfile
from kratos_admit.raw import clone
from kratos_admit.request import Operation, admission_review, parse_review
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
    operation: Operation = "CREATE",
    old: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> ReviewResult:
    review = admission_review(
        clone(obj),
        operation=operation,
        uid="test-uid",
        old=clone(old) if old is not None else None,
        dry_run=dry_run,
    )
    return answer(parse_review(review), webhook=webhook, engine=eng)
