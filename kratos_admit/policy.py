"""The admission decisions, pure: ``(object, profile, nodes, config) -> Decision``, no I/O.

The mutating path validates first and denies what the validating path would deny, so an opted-in
object is never silently passed on unchanged when it is broken.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kratos_admit import vocabulary as v
from kratos_admit.catalog import Catalog
from kratos_admit.config import Config
from kratos_admit.fields import FieldError
from kratos_admit.gpu_requests import read_pod_gpus
from kratos_admit.hints import apply_hints
from kratos_admit.profile import WorkloadProfile
from kratos_admit.profiling import profiling_needed, profiling_target, profiling_wanted, rewrite_for_profiling
from kratos_admit.raw import clone
from kratos_admit.signing import signature_valid, signed_role
from kratos_admit.validation import ValidationContext, new_violations, validate_workload
from kratos_admit.workload import Kind, Workload

Action = Literal["hints", "profiling", "none"]


@dataclass(frozen=True, slots=True)
class PolicyContext:
    config: Config
    catalog: Catalog
    signing_key: bytes


@dataclass(slots=True)
class Decision:
    allowed: bool
    action: Action = "none"
    mutated: dict[str, Any] | None = None  # None: the object is admitted as sent
    violations: list[FieldError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def already_hinted(workload: Workload, namespace: str, key: bytes) -> bool:
    return v.HINTS_ANNOTATION in workload.metadata.annotations and signature_valid(
        workload.metadata.raw, namespace=namespace, key=key
    )


def _violations(
    workload: Workload, *, operation: str, profile: WorkloadProfile | None, namespace: str, ctx: PolicyContext
) -> list[FieldError]:
    vctx = ValidationContext(
        namespace=namespace,
        signing_key=ctx.signing_key,
        max_gpus_per_pod=ctx.config.max_gpus_per_pod,
        mig_profiles=ctx.catalog.mig_profiles,
        profiling_needed=profiling_needed(
            workload,
            operation=operation,
            profile=profile,
            namespace=namespace,
            config=ctx.config,
            signing_key=ctx.signing_key,
        ),
    )
    return validate_workload(workload, vctx)


def validate(
    obj: Mapping[str, Any],
    kind: Kind,
    *,
    old: Mapping[str, Any] | None,
    operation: str,
    namespace: str,
    profile: WorkloadProfile | None,
    ctx: PolicyContext,
) -> Decision:
    workload = Workload(kind, obj)
    old_workload = Workload(kind, old) if old is not None else None
    errors = _violations(workload, operation=operation, profile=profile, namespace=namespace, ctx=ctx)
    if operation == "UPDATE" and old_workload is not None and old_workload.workload_label is not None:
        old_errors = _violations(
            old_workload, operation=operation, profile=profile, namespace=namespace, ctx=ctx
        )
        errors = new_violations(errors, old_errors)
    return Decision(allowed=not errors, violations=errors)


def mutate(
    obj: Mapping[str, Any],
    kind: Kind,
    *,
    operation: str,
    namespace: str,
    profile: WorkloadProfile | None,
    node_products: frozenset[str],
    ctx: PolicyContext,
) -> Decision:
    if operation != "CREATE":
        return Decision(allowed=True)
    workload = Workload(kind, obj)
    name = workload.workload_label
    errors = _violations(workload, operation=operation, profile=profile, namespace=namespace, ctx=ctx)
    if errors:
        return Decision(allowed=False, violations=errors)
    key = ctx.signing_key
    role = signed_role(workload.metadata.raw, namespace=namespace, key=key)
    if already_hinted(workload, namespace, key) or role == "profiling":
        return Decision(allowed=True)
    if profile is not None and profile.ready:
        result = apply_hints(
            obj,
            kind,
            profile=profile,
            node_products=node_products,
            namespace=namespace,
            config=ctx.config,
            catalog=ctx.catalog,
            signing_key=key,
        )
        return Decision(allowed=True, action="hints", mutated=result.hinted, warnings=list(result.warnings))
    if profile is not None:
        reason = profile.status.message if profile.status and profile.status.message else "no reason given"
        return Decision(
            allowed=True,
            warnings=[
                f"WorkloadProfile {profile.metadata.name} is Failed ({reason}): admitted without hints; "
                "delete the profile to profile again"
            ],
        )
    if kind == "Pod":
        return Decision(
            allowed=True,
            warnings=[
                f"no WorkloadProfile for workload {name}: Pod admitted without hints "
                "(Pods are never rewritten for profiling; submit a Job to profile it)"
            ],
        )
    if role == "execution":
        return Decision(
            allowed=True,
            warnings=[f"no WorkloadProfile for workload {name}: execution Job admitted without hints"],
        )
    if not profiling_wanted(workload.metadata.annotations, ctx.config):
        return Decision(
            allowed=True,
            warnings=[f"no WorkloadProfile for workload {name} and profiling is off: admitted without hints"],
        )
    found = profiling_target(workload, read_pod_gpus(workload))
    assert found is not None, "profiling-target validation refused a Job without a target"
    target, executable = found
    rewritten: dict[str, Any] = clone(obj)
    rewrite_for_profiling(
        rewritten,
        target=target,
        executable=executable,
        namespace=namespace,
        config=ctx.config,
        signing_key=key,
    )
    return Decision(
        allowed=True,
        action="profiling",
        mutated=rewritten,
        warnings=[
            f"no WorkloadProfile for workload {name} yet: this Job runs once under Nsight Compute; "
            "the controller then creates the execution Job with hints"
        ],
    )
