"""Followers: a Job or Pod held (suspended, gated) while its workload was profiled, let go by the
controller, or by the webhook for a Pod made after, once the profile is Ready or Failed, with the
hints it now gets (DESIGN "What it is"); for a Job Kueue manages, the gate in its pod template and
the state of KRATOS's AdmissionCheck (DESIGN "Where Kueue runs")."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from kratos_admit.decisions.acceptable import narrow
from kratos_admit.decisions.hints import (
    add_profile_gate,
    mark_template_held,
    pod_parts,
    ranked_hint,
)
from kratos_admit.decisions.record import hints_record
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.raw import as_list, as_mapping, child, clone, string_map
from kratos_admit.domain.signing import sign_block, signature_valid
from kratos_admit.domain.workload import Kind, kueue_queue
from kratos_admit.model.calibration import NO_CALIBRATION, Calibration
from kratos_admit.model.catalog import Catalog
from kratos_admit.model.exploration import object_key
from kratos_admit.model.ranking import RankedProduct

CheckState = Literal["Pending", "Ready"]


def template_mutable(job: Mapping[str, Any]) -> bool:
    """A Job's pod template takes new scheduling directives only while the Job is suspended and has
    never started (``JobMutableSchedulingDirectives``, GA in Kubernetes 1.27)."""
    return as_mapping(job.get("spec")).get("suspend") is True and not as_mapping(job.get("status")).get(
        "startTime"
    )


def awaiting_mark(obj: Mapping[str, Any], *, signing_key: bytes) -> str:
    """The profile a Job or Pod is held for ("" when none): the ``awaiting-profile`` mark, counted
    only when KRATOS signed it (a user cannot forge one)."""
    meta = as_mapping(obj.get("metadata"))
    held = string_map(meta.get("annotations")).get(v.AWAITING_PROFILE_ANNOTATION, "")
    namespace = str(meta.get("namespace", "default"))
    return held if held and signature_valid(meta, namespace=namespace, key=signing_key) else ""


def _injected(annotations: Mapping[str, Any]) -> list[str]:
    try:
        before = json.loads(str(annotations.get(v.HINTS_ANNOTATION, "{}")))
    except ValueError:
        before = {}
    return [i for i in as_list(as_mapping(before).get("injected")) if isinstance(i, str)]


def _without_profile_gate(pod_spec: dict[str, Any]) -> None:
    gates = [
        g
        for g in as_list(pod_spec.get("schedulingGates"))
        if as_mapping(g).get("name") != v.PROFILE_SCHEDULING_GATE
    ]
    pod_spec["schedulingGates"] = gates
    if not gates:
        del pod_spec["schedulingGates"]


def release_hold(
    held: Mapping[str, Any],
    kind: Kind,
    *,
    profile: WorkloadProfile,
    node_products: frozenset[str],
    namespace: str,
    config: Config,
    catalog: Catalog,
    signing_key: bytes,
    calibration: Calibration = NO_CALIBRATION,
    product_gpus: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A follower held while its workload was profiled, released: the ranked affinity from a Ready
    profile (a Failed one leaves the base hints), ``awaiting-profile`` gone, a Job KRATOS suspended
    unsuspended (one the user suspended stays so), a Pod's gate removed, the record rewritten and
    signed. Only scheduling directives change: what a suspended Job's template and a gated Pod accept
    (Kubernetes 1.27+).

    A Job Kueue manages keeps its ``spec.suspend`` (Kueue's to write): while its template is mutable
    the gate comes out of it with the ranked affinity in; once Kueue has started it, only its own
    metadata changes, and its gated Pods are released one by one (they are followers too)."""
    obj: dict[str, Any] = clone(dict(held))
    metadata = child(obj, "metadata")
    annotations = child(metadata, "annotations")
    annotations.pop(v.AWAITING_PROFILE_ANNOTATION, None)
    injected = _injected(annotations)
    pod_meta, pod_spec = pod_parts(obj, kind)
    kueue = kind == "Job" and bool(kueue_queue(obj))
    template = kind == "Pod" or not kueue or template_mutable(obj)
    if kind == "Job" and "suspend" in injected and not kueue:
        obj["spec"]["suspend"] = False
    if template and (kind == "Pod" or kueue):
        _without_profile_gate(pod_spec)
        if kind == "Job":
            child(pod_meta, "annotations").pop(v.AWAITING_PROFILE_ANNOTATION, None)
    injected = [i for i in injected if i not in ("suspend", "schedulingGates")]
    if not template:  # Kueue started it: its template is immutable, and its gated Pods are followers
        injected.append("schedulingGates")
    user_annotations = {k: val for k, val in annotations.items() if isinstance(val, str)}
    ranked: list[RankedProduct] = []
    explored, reference, narrowed = None, None, None
    if profile.ready:
        hint = ranked_hint(
            pod_spec if template else clone(pod_spec),
            profile,
            node_products,
            annotations=user_annotations,
            config=config,
            catalog=catalog,
            calibration=calibration,
            key=object_key(metadata, namespace),
        )
        ranked, explored, reference = hint.ranked, hint.explored, hint.reference
        if hint.added and template:
            injected.append("affinity.nodeAffinity.preferred")
        # a gated Pod's required terms may take more requirements, a suspended Job's template any
        # affinity (Kubernetes 1.27+): the release narrows as admission would have; once Kueue started
        # the Job, nothing of its Pods' placement changes
        narrowed = (
            narrow(
                pod_spec,
                ranked,
                profile,
                annotations=user_annotations,
                config=config,
                product_gpus=product_gpus,
                explored=explored,
            )
            if template
            else None
        )
        if narrowed is not None:
            injected.append("affinity.nodeAffinity.required.product")
    phase = profile.status.phase if profile.status else "without status"
    record = hints_record(
        profile.metadata.name if profile.ready else "",
        profile.status.bound_type if profile.status else "unknown",
        strategy=config.hint_strategy,
        injected=tuple(injected),
        ranked=tuple(ranked),
        reason="" if profile.ready else f"WorkloadProfile {profile.metadata.name} is {phase}",
        explore=explored,
        reference=reference,
        cut=narrowed,
    )
    for block in [metadata] if kind == "Pod" else [metadata, pod_meta] if template else [metadata]:
        block_annotations = child(block, "annotations")
        block_annotations[v.HINTS_ANNOTATION] = record
        if profile.ready:
            block_annotations[v.PROFILE_ANNOTATION] = profile.reference
        sign_block(block, namespace=namespace, key=signing_key)
    return obj


def regate_for_kueue(job: Mapping[str, Any], *, namespace: str, signing_key: bytes) -> dict[str, Any] | None:
    """A follower KRATOS held by suspend (its own, or the user's) before Kueue's webhook named its
    queue (Kueue's ``LocalQueueDefaulting``, when KRATOS's webhook is called first), seen again on
    reinvocation:
    the hold a Kueue Job gets instead, byte for byte what KRATOS gives when called after Kueue. The
    suspend stays, Kueue's now. None when there is nothing to change."""
    if not kueue_queue(job) or not awaiting_mark(job, signing_key=signing_key):
        return None
    annotations = string_map(as_mapping(job.get("metadata")).get("annotations"))
    if "schedulingGates" in _injected(annotations):
        return None
    obj: dict[str, Any] = clone(dict(job))
    pod_meta, pod_spec = pod_parts(obj, "Job")
    add_profile_gate(pod_spec)
    mark_template_held(obj, pod_meta, hold=annotations[v.AWAITING_PROFILE_ANNOTATION])
    record = json.loads(annotations[v.HINTS_ANNOTATION])
    # the hold is the last thing admission adds: KRATOS's suspend, or nothing for a Job the user suspended
    record["injected"] = [i for i in record["injected"] if i != "suspend"] + ["schedulingGates"]
    rewritten = json.dumps(record, separators=(",", ":"))
    for block in (child(obj, "metadata"), pod_meta):
        child(block, "annotations")[v.HINTS_ANNOTATION] = rewritten
        sign_block(block, namespace=namespace, key=signing_key)
    return obj


def admission_check_state(job: Mapping[str, Any] | None, *, signing_key: bytes) -> tuple[CheckState, str]:
    """The state of KRATOS's AdmissionCheck on the Kueue Workload of ``job`` (None: the Workload's
    owner is no Job, or is gone): Pending while the Job is a follower KRATOS holds, Ready at once
    for every other Workload. The controller releases a follower before this turns Ready, so Kueue
    starts its Pods with the hints and without the gate."""
    if job is None:
        return "Ready", "not a batch/v1 Job: nothing for KRATOS to wait for"
    held = awaiting_mark(job, signing_key=signing_key)
    if held:
        return "Pending", (
            f"waiting for the profiling run of its workload: WorkloadProfile {held} is not yet Ready or Failed"
        )
    return "Ready", "no profiling run to wait for"
