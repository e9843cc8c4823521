"""Releasing a follower: a Job or Pod held (suspended, gated) while its workload was profiled, let
go by the controller once the profile is Ready or Failed, with the hints it now gets (DESIGN "What it is")."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kratos_admit.decisions.calibration import NO_CALIBRATION, Calibration
from kratos_admit.decisions.hints import hints_record, pod_parts, ranked_hint
from kratos_admit.decisions.ranking import RankedProduct
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.catalog import Catalog
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.raw import as_list, as_mapping, child, clone
from kratos_admit.domain.signing import sign_block
from kratos_admit.domain.workload import Kind


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
) -> dict[str, Any]:
    """A follower held while its workload was profiled, released by the controller: the ranked
    affinity from a Ready profile (a Failed one leaves the base hints), ``awaiting-profile`` gone,
    a Job KRATOS suspended unsuspended (one the user suspended stays so), a Pod's gate removed, the
    record rewritten and signed. Only scheduling directives change: what a suspended Job's template
    and a gated Pod accept (Kubernetes 1.27+)."""
    obj: dict[str, Any] = clone(dict(held))
    metadata = child(obj, "metadata")
    annotations = child(metadata, "annotations")
    annotations.pop(v.AWAITING_PROFILE_ANNOTATION, None)
    try:
        before = json.loads(annotations.get(v.HINTS_ANNOTATION, "{}"))
    except ValueError:
        before = {}
    injected = [i for i in as_list(as_mapping(before).get("injected")) if isinstance(i, str)]
    pod_meta, pod_spec = pod_parts(obj, kind)
    if kind == "Job" and "suspend" in injected:
        obj["spec"]["suspend"] = False
    if kind == "Pod":
        gates = [
            g
            for g in as_list(pod_spec.get("schedulingGates"))
            if as_mapping(g).get("name") != v.PROFILE_SCHEDULING_GATE
        ]
        pod_spec["schedulingGates"] = gates
        if not gates:
            del pod_spec["schedulingGates"]
    injected = [i for i in injected if i not in ("suspend", "schedulingGates")]
    user_annotations = {k: val for k, val in annotations.items() if isinstance(val, str)}
    ranked: list[RankedProduct] = []
    if profile.ready:
        ranked, added = ranked_hint(
            pod_spec,
            profile,
            node_products,
            annotations=user_annotations,
            config=config,
            catalog=catalog,
            calibration=calibration,
        )
        if added:
            injected.append("affinity.nodeAffinity.preferred")
    phase = profile.status.phase if profile.status else "without status"
    record = hints_record(
        profile.metadata.name if profile.ready else "",
        profile.status.bound_type if profile.status else "unknown",
        strategy=config.hint_strategy,
        injected=tuple(injected),
        ranked=tuple(ranked),
        reason="" if profile.ready else f"WorkloadProfile {profile.metadata.name} is {phase}",
    )
    for block in [metadata] if kind == "Pod" else [metadata, pod_meta]:
        block_annotations = child(block, "annotations")
        block_annotations[v.HINTS_ANNOTATION] = record
        if profile.ready:
            block_annotations[v.PROFILE_ANNOTATION] = profile.reference
        sign_block(block, namespace=namespace, key=signing_key)
    return obj
