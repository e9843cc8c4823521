"""The admission decisions, pure: ``(object, profile, nodes, config) -> Decision``, no I/O.

The mutating path validates first and denies what the validating path would deny, so an opted-in
object is never silently passed on unchanged when it is broken.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kratos_admit.decisions.gangs import Gang, read_gang
from kratos_admit.decisions.hints import apply_hints
from kratos_admit.decisions.holds import awaiting_mark, regate_for_kueue, release_hold
from kratos_admit.decisions.profiling import (
    profiling_demanded,
    profiling_plan,
    profiling_products,
    profiling_wanted,
    unprofilable_reason,
)
from kratos_admit.decisions.record import recorded_ranking_source
from kratos_admit.decisions.rewrite import capability_warnings, rewrite_for_profiling
from kratos_admit.decisions.validation import ValidationContext, new_violations, validate_workload
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.fields import FieldError
from kratos_admit.domain.gpu_requests import PodGpus, read_pod_gpus
from kratos_admit.domain.profile import COUNTERS_UNAVAILABLE, WorkloadProfile
from kratos_admit.domain.raw import as_mapping, clone, string_map
from kratos_admit.domain.signing import signature_valid, signed_role
from kratos_admit.domain.workload import Kind, ParentKind, Workload, kueue_queue
from kratos_admit.model.calibration import NO_CALIBRATION, Calibration
from kratos_admit.model.catalog import Catalog
from kratos_admit.model.ranking import RankingSource

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
    ranking_source: RankingSource = "none"  # of hints: what the preferred products rest on
    explored: str = ""  # the product a Job was sent first to explore (config explorationShare)
    gang: str = ""  # what made the object a gang (DESIGN "Distributed training"), "" when it runs alone
    named: bool = False  # the answer embeds the object's name (its original template, its gang's Pods)


def already_hinted(workload: Workload, namespace: str, key: bytes) -> bool:
    return v.HINTS_ANNOTATION in workload.metadata.annotations and signature_valid(
        workload.metadata.raw, namespace=namespace, key=key
    )


def _violations(
    workload: Workload,
    *,
    operation: str,
    profile: WorkloadProfile | None,
    namespace: str,
    ctx: PolicyContext,
    role: str | None,
    gpus: PodGpus | None = None,
) -> list[FieldError]:
    """Every rule's violations; ``role`` is the object's signed role (None: not made by KRATOS),
    ``gpus`` its GPU requests where the caller has read them. A gang is never profiled, so it is
    never denied for what profiling would need."""
    demanded = profiling_demanded(
        workload, operation=operation, profile=profile, config=ctx.config, role=role
    )
    if demanded:
        gpus = gpus if gpus is not None else read_pod_gpus(workload)
        demanded = read_gang(workload, gpus) is None
    vctx = ValidationContext(
        namespace=namespace,
        signing_key=ctx.signing_key,
        max_gpus_per_pod=ctx.config.max_gpus_per_pod,
        mig_profiles=ctx.catalog.mig_profiles,
        profiling_demanded=demanded,
        config=ctx.config,
    )
    return validate_workload(workload, vctx, gpus)


def _role(workload: Workload, namespace: str, ctx: PolicyContext) -> str | None:
    return signed_role(workload.metadata.raw, namespace=namespace, key=ctx.signing_key)


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
    errors = _violations(
        workload,
        operation=operation,
        profile=profile,
        namespace=namespace,
        ctx=ctx,
        role=_role(workload, namespace, ctx),
    )
    if operation == "UPDATE" and old_workload is not None and old_workload.workload_label is not None:
        old_role = _role(old_workload, namespace, ctx)
        old_errors = _violations(
            old_workload, operation=operation, profile=profile, namespace=namespace, ctx=ctx, role=old_role
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
    calibration: Calibration = NO_CALIBRATION,
    product_nodes: Mapping[str, int] | None = None,
    product_gpus: Mapping[str, int] | None = None,
) -> Decision:
    """DESIGN "Hints" and "Profiling rewrite": deny what validation denies; leave KRATOS's own
    output alone (idempotent); else base hints always, ranked hints from a Ready profile, a hold
    while a profiling run of the workload is under way, or the profiling rewrite."""
    if operation != "CREATE":
        return Decision(allowed=True)
    workload = Workload(kind, obj)
    name = workload.workload_label or ""
    key = ctx.signing_key
    role = _role(workload, namespace, ctx)
    gpus = read_pod_gpus(workload)  # read once: validation and the profiling target both need it
    errors = _violations(
        workload, operation=operation, profile=profile, namespace=namespace, ctx=ctx, role=role, gpus=gpus
    )
    if errors:
        return Decision(allowed=False, violations=errors)
    if role == "profiling":
        return Decision(allowed=True)
    if already_hinted(workload, namespace, key):
        return _hinted_again(
            obj,
            kind,
            profile=profile,
            node_products=node_products,
            namespace=namespace,
            ctx=ctx,
            calibration=calibration,
            product_gpus=product_gpus,
        )
    gang = read_gang(workload, gpus)

    def hinted(
        source: Mapping[str, Any],
        *,
        reason: str = "",
        warning: str = "",
        hold: str = "",
        owned: bool = False,
        profile_on: tuple[str, ...] = (),
        warnings: tuple[str, ...] = (),
    ) -> Decision:
        result = apply_hints(
            source,
            kind,
            profile=profile,
            node_products=node_products,
            namespace=namespace,
            config=ctx.config,
            catalog=ctx.catalog,
            signing_key=key,
            reason=reason,
            hold=hold,
            owned=owned,
            calibration=calibration,
            profile_on=profile_on,
            gang=gang,
            product_gpus=product_gpus,
        )
        return Decision(
            allowed=True,
            action="hints",
            mutated=result.hinted,
            warnings=[*([warning] if warning else []), *warnings, *result.warnings],
            ranking_source=result.source,
            explored=result.explored,
            gang=gang.why if gang is not None else "",
            named=gang is not None and v.JOB_NAME_LABEL in dict(gang.peers),
        )

    if gang is not None:
        reason, notes = gang_notes(gang, workload, profile=profile, namespace=namespace, config=ctx.config)
        return hinted(obj, reason=reason, warnings=notes)
    if profile is not None and profile.ready:
        return hinted(obj)
    phase = profile.status.phase if profile is not None and profile.status is not None else None
    if profile is not None and phase == "Profiling" and role is None:
        held = (
            f"a Pod gated by {v.PROFILE_SCHEDULING_GATE}"
            if kind == "Pod"
            else f"a Job whose pod template is gated by {v.PROFILE_SCHEDULING_GATE} (Kueue owns its spec.suspend)"
            if workload.kueue_queue
            else "a Job suspended"
        )
        return hinted(
            obj,
            reason=f"awaiting the profiling run of workload {name}",
            warning=f"workload {name} is being profiled (WorkloadProfile {profile.metadata.name}): admitted as "
            f"{held} with base hints; KRATOS releases it with ranked hints when the profile is ready",
            hold=profile.metadata.name,
        )
    if profile is not None:
        message = profile.status.message if profile.status and profile.status.message else "no reason given"
        failure = profile.status.failure if profile.status else None
        # the counters were out of reach (DCGM, restricted counters, no GPU): profiling again fails the
        # same way until the nodes change, and telemetry is what still learns (docs/operations.md)
        then = (
            f"profiling failed with {failure}, which a new run meets again until the nodes are fixed; with "
            "telemetry configured, the workload's runs make the profile Ready from DCGM counters"
            if failure in COUNTERS_UNAVAILABLE
            else "delete the profile to profile again"
        )
        return hinted(
            obj,
            reason=f"WorkloadProfile {profile.metadata.name} is {phase or 'without status'}",
            warning=f"WorkloadProfile {profile.metadata.name} is {phase or 'without status'} ({message}): "
            f"admitted with base hints only; {then}",
        )
    if kind == "Pod":
        return hinted(
            obj,
            reason=f"no WorkloadProfile for workload {name} in namespace {namespace}",
            warning=f"no WorkloadProfile for workload {name} in namespace {namespace}: Pod admitted with base hints only "
            "(Pods are never rewritten for profiling; submit a Job to profile it)",
        )
    if role == "execution":
        return hinted(
            obj,
            reason=f"no WorkloadProfile for workload {name} in namespace {namespace}",
            warning=f"no WorkloadProfile for workload {name} in namespace {namespace}: execution Job admitted with base hints only",
        )
    if not profiling_wanted(workload.metadata.annotations, ctx.config):
        return hinted(
            obj,
            reason="profiling is off",
            warning=f"no WorkloadProfile for workload {name} in namespace {namespace} and profiling is off: admitted with base hints only",
        )
    plan = profiling_plan(workload, gpus, ctx.config)
    if plan is None:
        return hinted(
            obj,
            reason="cannot be profiled",
            warning=f"no WorkloadProfile for workload {name} in namespace {namespace}, and this Job cannot be "
            f"profiled: admitted with base hints only ({unprofilable_reason(workload, gpus, ctx.config)})",
        )
    rewritten: dict[str, Any] = clone(obj)
    rewrite_for_profiling(
        rewritten,
        plan=plan,
        namespace=namespace,
        config=ctx.config,
        signing_key=key,
    )
    profile_on = profiling_products(
        node_products,
        product_nodes if product_nodes is not None else dict.fromkeys(node_products, 1),
        calibration=calibration,
        catalog=ctx.catalog,
        config=ctx.config,
    )
    decision = hinted(rewritten, reason="profiling run", owned=True, profile_on=profile_on)  # our own copy
    decision.action, decision.named = "profiling", True
    decision.warnings = [
        f"no WorkloadProfile for workload {name} in namespace {namespace} yet: this Job runs once under Nsight Compute, which ends "
        "it after the profiled kernels; the controller then creates the execution Job with hints",
        plan.warning(),
        *capability_warnings(ctx.config),
        *decision.warnings,
    ]
    return decision


def gang_notes(
    gang: Gang, workload: Workload, *, profile: WorkloadProfile | None, namespace: str, config: Config
) -> tuple[str, tuple[str, ...]]:
    """The hints record's reason (why no ranked hints) and the warnings of a gang: it runs as written
    (never profiled, never held), what made it one, and where its profile comes from."""
    name = workload.workload_label or ""
    ready = profile is not None and profile.ready
    phase = profile.status.phase if profile is not None and profile.status is not None else None
    doubt = (
        f", by default: {gang.doubt}; a gang treated as one Job would be broken, a Job treated as a gang "
        "only goes without its Nsight Compute profile"
        if gang.doubt
        else ""
    )
    learned = (
        f"with the ranked hints of WorkloadProfile {profile.metadata.name}"
        if ready and profile is not None
        else "with base hints; its profile comes from the DCGM telemetry of its own run, after "
        f"telemetry.windowSeconds ({config.telemetry.window_seconds:g} s) of it"
    )
    notes = []
    if not ready or gang.doubt:  # a Ready gang's hints record says it is one, and why
        notes.append(
            f"workload {name} runs as a gang ({gang.why}{doubt}): admitted as written, never rewritten into "
            f"a profiling run nor held, {learned}"
        )
    if workload.metadata.annotations.get(v.PROFILING_ANNOTATION) == "true":
        notes.append(
            f'{v.PROFILING_ANNOTATION}: "true" has no effect on a gang: its peers would wait for each other '
            "under Nsight Compute (NVIDIA/nccl#536)"
        )
    if not ready and not config.telemetry.prometheus_url:
        notes.append(
            f"telemetry is not configured, so workload {name} gets no profile from its runs: set "
            "telemetry.prometheusURL (the telemetry component, or the chart's telemetry values) on the "
            "webhook and the controller"
        )
    if profile is not None and phase in ("Failed", "Profiling"):
        notes.append(f"WorkloadProfile {profile.metadata.name} is {phase}: the gang is not held for it")
    notes += gang.mismatches
    if ready:
        return "", tuple(notes)
    reason = f"gang without a Ready WorkloadProfile in namespace {namespace}"
    return reason, tuple(notes)


def _hinted_again(
    obj: Mapping[str, Any],
    kind: Kind,
    *,
    profile: WorkloadProfile | None,
    node_products: frozenset[str],
    namespace: str,
    ctx: PolicyContext,
    calibration: Calibration,
    product_gpus: Mapping[str, int] | None = None,
) -> Decision:
    """KRATOS's own output, seen again: left alone (idempotent), but for two holds that must change.
    A Job KRATOS suspended that Kueue has since given a queue (reinvocation after Kueue's webhook)
    is held by the gate instead; a Pod made from a held Kueue Job's template after its profile
    settled is let go at once (DESIGN "Where Kueue runs")."""
    if kind == "Job":
        regated = regate_for_kueue(obj, namespace=namespace, signing_key=ctx.signing_key)
        if regated is None:
            return Decision(allowed=True)
        queue = kueue_queue(obj)
        return Decision(
            allowed=True,
            action="hints",
            mutated=regated,
            warnings=[
                f"Kueue's LocalQueue {queue} starts this Job and owns spec.suspend: KRATOS holds it with the "
                f"scheduling gate {v.PROFILE_SCHEDULING_GATE} in its pod template instead, until the profile is ready"
            ],
        )
    held = awaiting_mark(obj, signing_key=ctx.signing_key)
    settled = (
        profile is not None and profile.status is not None and profile.status.phase in ("Ready", "Failed")
    )
    if not held or profile is None or not settled or held != profile.metadata.name:
        return Decision(allowed=True)
    released = release_hold(
        obj,
        kind,
        profile=profile,
        node_products=node_products,
        namespace=namespace,
        config=ctx.config,
        catalog=ctx.catalog,
        signing_key=ctx.signing_key,
        calibration=calibration,
        product_gpus=product_gpus,
    )
    return Decision(
        allowed=True, action="hints", mutated=released, ranking_source=recorded_ranking_source(released)
    )


def parent_warnings(obj: Mapping[str, Any], parent: ParentKind) -> list[str]:
    """What KRATOS will do with the Jobs or Pods a labelled CronJob or Deployment makes; it never
    changes the parent itself (DESIGN: only batch/v1 Jobs and v1 Pods are reviewed)."""
    spec = as_mapping(obj.get("spec"))
    template_key = "jobTemplate" if parent == "CronJob" else "template"
    template_labels = string_map(as_mapping(as_mapping(spec.get(template_key)).get("metadata")).get("labels"))
    workload = template_labels.get(v.WORKLOAD_LABEL)
    made = "Jobs" if parent == "CronJob" else "Pods"
    if workload is None:
        return [
            f"the {v.WORKLOAD_LABEL} label on a {parent} does nothing by itself: KRATOS reviews the {made} "
            f"it makes, so put the label on spec.{template_key}.metadata.labels"
        ]
    if parent == "CronJob":
        return [
            f"KRATOS admits the Jobs this CronJob creates as workload {workload}: until the workload has a "
            "WorkloadProfile the first is rewritten into a short profiling run under Nsight Compute, and the "
            "execution Job it leads to (owned by that Job, so the CronJob's history limits clean up both) "
            "does the work; later Jobs get hints"
        ]
    return [
        f"KRATOS gives this Deployment's Pods base hints, and ranked hints once workload {workload} has a "
        f"Ready WorkloadProfile; Pods are never profiled: run a Job of workload {workload} once to create it"
    ]
