"""Hints (DESIGN "Hints"): base hints on every opted-in GPU object, the ranked product preference
only from a Ready WorkloadProfile. Each applier adds only what is missing and never overrides the
user; a field holding the API server's default (``schedulerName: default-scheduler``) is no choice.

Appliers work on a writable copy of the raw object and return the names of what they added.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kratos_admit.decisions.acceptable import (
    Cut,
    and_into_terms,
    narrowing,
    observed_seconds,
    product_requirement,
    required_variants,
)
from kratos_admit.decisions.gangs import Gang, gang_affinity, label_gang_pods
from kratos_admit.decisions.record import hints_record
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.quantity import parse_quantity
from kratos_admit.domain.raw import as_list, as_mapping, child, clone
from kratos_admit.domain.signing import sign_block
from kratos_admit.domain.workload import Kind, kueue_queue
from kratos_admit.model.calibration import NO_CALIBRATION, Calibration
from kratos_admit.model.catalog import Catalog
from kratos_admit.model.exploration import (
    Exploration,
    allowed_products,
    exploration,
    explored_first,
    object_key,
    one_gpu,
)
from kratos_admit.model.ranking import (
    RankedProduct,
    RankingSource,
    Reference,
    rank_gpu_products,
    ranking_source,
    reference_of,
)


@dataclass(frozen=True, slots=True)
class RankedHint:
    ranked: list[RankedProduct]
    added: bool  # the preferred affinity was added (a user's own product preference wins)
    explored: Exploration | None
    reference: Reference | None  # the measuring product and what its figures rest on


@dataclass(frozen=True, slots=True)
class HintResult:
    hinted: dict[str, Any]  # the object with its hints; shares untouched subtrees with the request
    warnings: tuple[str, ...]
    source: RankingSource = "none"
    explored: str = ""  # the product this Job explores (config explorationShare), "" when none


def min_compute_capability(annotations: Mapping[str, str]) -> tuple[int, int] | None:
    raw = annotations.get(v.MIN_CC_ANNOTATION)
    if raw is None:
        return None
    major, _, minor = raw.partition(".")
    return int(major), int(minor)


def min_memory_mib(annotations: Mapping[str, str]) -> int | None:
    raw = annotations.get(v.MIN_MEMORY_ANNOTATION)
    quantity = parse_quantity(raw) if raw is not None else None
    if quantity is None:
        return None
    return int((quantity / Decimal(2**20)).to_integral_value(rounding="ROUND_CEILING"))


def _prefer_products(pod_spec: dict[str, Any], ranked: list[RankedProduct]) -> bool:
    node_affinity = child(child(pod_spec, "affinity"), "nodeAffinity")
    preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")
    for term in as_list(preferred):
        expressions = as_list(as_mapping(as_mapping(term).get("preference")).get("matchExpressions"))
        if any(as_mapping(e).get("key") == v.GPU_PRODUCT_LABEL for e in expressions):
            return False  # the user already states a product preference: theirs wins
    if not ranked:
        return False
    terms = [
        {
            "weight": r.weight,
            "preference": {
                "matchExpressions": [{"key": v.GPU_PRODUCT_LABEL, "operator": "In", "values": list(r.labels)}]
            },
        }
        for r in ranked
    ]
    node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [*as_list(preferred), *terms]
    return True


def _prefer_for_profiling(pod_spec: dict[str, Any], labels: tuple[str, ...]) -> bool:
    """One preferred term (weight 100, never a requirement) for the products a profiling run should
    land on; a user's own product preference wins."""
    node_affinity = child(child(pod_spec, "affinity"), "nodeAffinity")
    preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")
    for term in as_list(preferred):
        expressions = as_list(as_mapping(as_mapping(term).get("preference")).get("matchExpressions"))
        if any(as_mapping(e).get("key") == v.GPU_PRODUCT_LABEL for e in expressions):
            return False
    term = {
        "weight": 100,
        "preference": {
            "matchExpressions": [{"key": v.GPU_PRODUCT_LABEL, "operator": "In", "values": list(labels)}]
        },
    }
    node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [*as_list(preferred), term]
    return True


def _tolerate_gpu_taint(pod_spec: dict[str, Any]) -> bool:
    tolerations = as_list(pod_spec.get("tolerations"))
    for toleration in tolerations:
        t = as_mapping(toleration)
        key, operator = t.get("key"), t.get("operator", "Equal")
        if key == v.GPU_TAINT_KEY or (not key and operator == "Exists"):
            return False
    pod_spec["tolerations"] = [
        *tolerations,
        {"key": v.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
    ]
    return True


def _set_missing(mapping: dict[str, Any], key: str, value: object) -> bool:
    if mapping.get(key):
        return False
    mapping[key] = value
    return True


def _writable_copy(obj: Mapping[str, Any], kind: Kind) -> dict[str, Any]:
    """A copy of ``obj`` in which every container ``apply_hints`` writes into is new; everything
    else is shared with the request (never written), so the patch diff skips it by identity."""
    out = dict(obj)
    out["metadata"] = clone(obj.get("metadata")) if isinstance(obj.get("metadata"), dict) else {}
    if kind == "Pod":
        pod_spec = out["spec"] = dict(as_mapping(obj.get("spec")))
    else:
        spec = out["spec"] = dict(as_mapping(obj.get("spec")))
        template = spec["template"] = dict(as_mapping(spec.get("template")))
        template["metadata"] = (
            clone(template.get("metadata")) if isinstance(template.get("metadata"), dict) else {}
        )
        pod_spec = template["spec"] = dict(as_mapping(template.get("spec")))
    if isinstance(pod_spec.get("affinity"), dict):
        pod_spec["affinity"] = clone(pod_spec["affinity"])
    return out


def pod_parts(obj: dict[str, Any], kind: Kind) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod metadata, pod spec) of the writable copy, created where absent."""
    if kind == "Pod":
        return child(obj, "metadata"), child(obj, "spec")
    template = child(child(obj, "spec"), "template")
    pod_meta = child(template, "metadata")
    return pod_meta, child(template, "spec")


def scheduler_backend(annotations: Mapping[str, str], config: Config) -> v.SchedulerBackend:
    """The object's ``gpu.scheduler.io/scheduler`` annotation, else the configured backend."""
    chosen = annotations.get(v.SCHEDULER_ANNOTATION)
    return next((b for b in v.SCHEDULER_BACKENDS if b == chosen), config.scheduler)


def _set_scheduler(pod_spec: dict[str, Any], name: str) -> bool:
    """Set schedulerName unless the user chose one; the server's default is no choice (DESIGN)."""
    if pod_spec.get("schedulerName") not in (None, "", v.DEFAULT_SCHEDULER_NAME):
        return False
    pod_spec["schedulerName"] = name
    return True


def _apply_scheduler(
    obj_meta: dict[str, Any],
    pod_meta: dict[str, Any],
    pod_spec: dict[str, Any],
    kind: Kind,
    *,
    annotations: Mapping[str, str],
    config: Config,
) -> list[str]:
    injected: list[str] = []
    backend = scheduler_backend(annotations, config)
    if backend == "kai":
        if _set_scheduler(pod_spec, v.KAI_SCHEDULER_NAME):
            injected.append("schedulerName")
        for block in [pod_meta] if kind == "Pod" else [obj_meta, pod_meta]:
            if _set_missing(child(block, "labels"), v.KAI_QUEUE_LABEL, config.kai_queue):
                injected.append(f"labels[{v.KAI_QUEUE_LABEL}]")
    else:
        # volcano's scheduler, or with the default backend the profile config schedulerName names
        name = v.VOLCANO_SCHEDULER_NAME if backend == "volcano" else config.scheduler_name
        if name and _set_scheduler(pod_spec, name):
            injected.append("schedulerName")
    return injected


def _apply_priority(
    pod_spec: dict[str, Any],
    kind: Kind,
    *,
    annotations: Mapping[str, str],
    config: Config,
    warnings: list[str],
) -> list[str]:
    priority = annotations.get(v.PRIORITY_ANNOTATION)
    priority_class = next((c for p, c in config.priority_classes.items() if p == priority), None)
    if priority is not None and not priority_class:
        warnings.append(
            f"{v.PRIORITY_ANNOTATION}: {priority} has no effect: the configuration's priorityClasses "
            f"maps {priority!r} to no PriorityClass (set priorityClasses.{priority} to use it)"
        )
    if not priority_class:
        return []
    if kind == "Pod":
        # The Priority admission plugin resolves priorityClassName before webhooks run, so a
        # class set here on a bare Pod would not take effect; Jobs' pods resolve it later.
        warnings.append(
            f"priority class {priority_class!r} is applied to Jobs only; set it on the Pod yourself"
        )
        return []
    return ["priorityClassName"] if _set_missing(pod_spec, "priorityClassName", priority_class) else []


def ranked_hint(
    pod_spec: dict[str, Any],
    profile: WorkloadProfile,
    node_products: frozenset[str],
    *,
    annotations: Mapping[str, str],
    config: Config,
    catalog: Catalog,
    calibration: Calibration,
    key: str = "",
    gpus: int = 1,
) -> RankedHint:
    """The ranking, whether its preferred affinity was added (a user's own product preference wins),
    the exploration it carries (for config ``explorationShare`` of Jobs, ``key``: namespace/name, the
    best-ranked product whose figure for the workload's bound type is not yet calibrated, first), and
    what the measuring product's figures rest on."""
    ranked = ranking_of(
        profile,
        node_products,
        config=config,
        catalog=catalog,
        annotations=annotations,
        calibration=calibration,
        gpus=gpus,
    )
    explored = exploration(
        ranked,
        profile,
        key=key if one_gpu(pod_spec) else "",
        share=config.exploration_share,
        calibration=calibration,
        min_calibration_runs=config.min_calibration_runs,
        allowed=allowed_products(pod_spec),
        catalog=catalog,
    )
    if explored is not None:
        ranked = explored_first(ranked, explored.product)
    added = _prefer_products(pod_spec, ranked)
    reference = reference_of(
        profile,
        catalog=catalog,
        calibration=calibration,
        min_calibration_runs=config.min_calibration_runs,
        gpus=gpus,
    )
    return RankedHint(ranked, added, explored if added else None, reference if ranked else None)


def ranking_of(
    profile: WorkloadProfile,
    node_products: Iterable[str],
    *,
    config: Config,
    catalog: Catalog,
    annotations: Mapping[str, str] | None = None,
    calibration: Calibration = NO_CALIBRATION,
    gpus: int = 1,
) -> list[RankedProduct]:
    """The ranking the configuration asks for (strategy, reference, observed runs, calibration),
    within the object's own GPU minimums when ``annotations`` has them, for a workload on ``gpus``
    GPUs together: what hints and the placement report show."""
    found = annotations or {}
    return rank_gpu_products(
        profile,
        node_products,
        catalog=catalog,
        strategy=config.hint_strategy,
        reference_product=config.reference_product,
        min_compute_capability=min_compute_capability(found),
        min_memory_mib=min_memory_mib(found),
        min_observed_runs=config.min_observed_runs,
        calibration=calibration,
        min_calibration_runs=config.min_calibration_runs,
        gpus=gpus,
    )


def _interconnect_note(gang: Gang | None, profile: WorkloadProfile | None) -> str:
    """What the hints record says of a gang's interconnect (DESIGN "The interconnect"): that the
    network between nodes is not measured, where its Pods may run on several; that its links were
    not measured, where its profile has no interconnect share; "" for one Pod whose links were."""
    if gang is None or gang.across_nodes:
        return "unmeasured across nodes" if gang is not None else ""
    shares = profile.status.time_shares if profile is not None and profile.status is not None else None
    if profile is not None and (shares is None or shares.interconnect is None):
        return "unmeasured"
    return ""


def _apply_hold(
    obj: dict[str, Any], pod_meta: dict[str, Any], pod_spec: dict[str, Any], kind: Kind, *, hold: str
) -> list[str]:
    """Hold a follower until the run under way ends: gate a Pod, and the pod template of a Job Kueue
    manages (Kueue owns its ``spec.suspend``: DESIGN "Where Kueue runs"); suspend any other Job (one
    the user suspended stays so, and the record says KRATOS did not suspend it)."""
    if kind == "Pod" or kueue_queue(obj):
        add_profile_gate(pod_spec)
        if kind == "Job":
            mark_template_held(obj, pod_meta, hold=hold)
        return ["schedulingGates"]
    spec = obj["spec"]
    if spec.get("suspend") is True:
        return []
    spec["suspend"] = True
    return ["suspend"]


def add_profile_gate(pod_spec: dict[str, Any]) -> None:
    gates = [
        g
        for g in as_list(pod_spec.get("schedulingGates"))
        if as_mapping(g).get("name") != v.PROFILE_SCHEDULING_GATE
    ]
    pod_spec["schedulingGates"] = [*gates, {"name": v.PROFILE_SCHEDULING_GATE}]


def mark_template_held(job: Mapping[str, Any], pod_meta: dict[str, Any], *, hold: str) -> None:
    """A gated Job template's Pods are followers too: they carry ``awaiting-profile`` and the
    workload label (so the webhook and the controller see them, as they see a bare Pod follower)."""
    child(pod_meta, "annotations")[v.AWAITING_PROFILE_ANNOTATION] = hold
    workload = as_mapping(as_mapping(job.get("metadata")).get("labels")).get(v.WORKLOAD_LABEL)
    if isinstance(workload, str):
        child(pod_meta, "labels").setdefault(v.WORKLOAD_LABEL, workload)


def apply_hints(
    request_object: Mapping[str, Any],
    kind: Kind,
    *,
    profile: WorkloadProfile | None,
    node_products: frozenset[str],
    namespace: str,
    config: Config,
    catalog: Catalog,
    signing_key: bytes,
    reason: str = "",
    hold: str = "",
    owned: bool = False,
    calibration: Calibration = NO_CALIBRATION,
    profile_on: tuple[str, ...] = (),
    gang: Gang | None = None,
    product_gpus: Mapping[str, int] | None = None,
) -> HintResult:
    """The object with its hints, recorded and signed; ``request_object`` is not changed, unless
    the caller ``owned`` it (a copy of its own, such as the profiling rewrite): then it is hinted
    in place, saving a second copy on the admission path.

    Base hints always; the ranked product preference only from a Ready ``profile``. ``reason``
    says, in the record, why a call without a Ready profile gave base hints only. ``hold`` names
    the profile whose run is under way: a Job is then suspended (gated in its template when Kueue
    manages it), a Pod gated, and both marked ``awaiting-profile`` for the controller to release. ``profile_on`` (a profiling run) names the
    products it prefers, as one preferred node-affinity term. A ``gang`` never explores; its Pods
    prefer the GPU product their peers run on, and carry the workload label.
    """
    obj = (
        request_object if owned and isinstance(request_object, dict) else _writable_copy(request_object, kind)
    )
    metadata = child(obj, "metadata")
    annotations = {
        k: val for k, val in as_mapping(metadata.get("annotations")).items() if isinstance(val, str)
    }
    pod_meta, pod_spec = pod_parts(obj, kind)
    ready = profile is not None and profile.ready
    warnings: list[str] = []
    injected: list[str] = []
    runtime_class = (profile.spec.runtime_class_name if profile else None) or config.runtime_class_name
    if runtime_class and _set_missing(pod_spec, "runtimeClassName", runtime_class):
        injected.append("runtimeClassName")
    cc, memory = min_compute_capability(annotations), min_memory_mib(annotations)
    variants = required_variants(cc, memory)  # ANDed in once, with the cut's product where it narrows
    required_at = len(injected)
    ranked: list[RankedProduct] = []
    explored: Exploration | None = None
    reference: Reference | None = None
    narrowed: Cut | None = None
    if ready and profile is not None:  # the ranked hint: the only one that needs a profile
        hint = ranked_hint(
            pod_spec,
            profile,
            node_products,
            annotations=annotations,
            config=config,
            catalog=catalog,
            calibration=calibration,
            key=object_key(metadata, namespace) if gang is None else "",
            gpus=gang.total_gpus if gang is not None else 1,
        )
        ranked, explored, reference = hint.ranked, hint.explored, hint.reference
        if hint.added:
            injected.append("affinity.nodeAffinity.preferred")
        narrowed = narrowing(
            pod_spec, ranked, annotations=annotations, config=config, product_gpus=product_gpus,
            explored=explored, observed=observed_seconds(profile.status.observations if profile.status else ()),
        )  # fmt: skip
        if narrowed is not None and narrowed.narrows:
            variants = [[*variant, product_requirement(narrowed.labels)] for variant in variants]
            injected.append("affinity.nodeAffinity.required.product")
        else:
            narrowed = None
        if not ranked:
            warnings.append(
                f"no GPU product preference: profile {profile.metadata.name} gives nothing to rank by"
            )
    if and_into_terms(pod_spec, variants):
        injected.insert(required_at, "affinity.nodeAffinity.required")
    if profile_on and not ready and _prefer_for_profiling(pod_spec, profile_on):
        injected.append("affinity.nodeAffinity.preferred")
    if gang is not None and gang_affinity(pod_spec, gang):
        injected.append("affinity.podAffinity.preferred")
    if gang is not None and kind == "Job" and label_gang_pods(obj, pod_meta):
        injected.append(f"template.labels[{v.WORKLOAD_LABEL}]")
    if _tolerate_gpu_taint(pod_spec):
        injected.append("tolerations")
    injected += _apply_scheduler(metadata, pod_meta, pod_spec, kind, annotations=annotations, config=config)
    injected += _apply_priority(pod_spec, kind, annotations=annotations, config=config, warnings=warnings)
    if hold:
        injected += _apply_hold(obj, pod_meta, pod_spec, kind, hold=hold)
        child(metadata, "annotations")[v.AWAITING_PROFILE_ANNOTATION] = hold
    record = hints_record(
        profile.metadata.name if ready and profile else "",
        profile.status.bound_type if profile and profile.status else "unknown",
        strategy=config.hint_strategy,
        injected=tuple(injected),
        ranked=tuple(ranked),
        reason="" if ready else reason,
        explore=explored,
        gang=gang.why if gang is not None else "",
        reference=reference,
        interconnect=_interconnect_note(gang, profile if ready else None),
        gang_gpus=gang.total_gpus if gang is not None else 1,
        cut=narrowed,
    )
    for block in [metadata] if kind == "Pod" else [metadata, pod_meta]:
        block_annotations = child(block, "annotations")
        block_annotations[v.HINTS_ANNOTATION] = record
        if ready and profile is not None:
            block_annotations[v.PROFILE_ANNOTATION] = profile.reference
        sign_block(block, namespace=namespace, key=signing_key)
    return HintResult(
        obj, tuple(warnings), ranking_source(ranked), explored.product.product.product if explored else ""
    )
