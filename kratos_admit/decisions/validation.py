"""Every validation rule of DESIGN's table. Rules collect FieldErrors and never raise for user mistakes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from kratos_admit.decisions.acceptable import parse_max_slowdown
from kratos_admit.decisions.profiling import profiling_target_errors
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.fields import FieldError, Path
from kratos_admit.domain.gpu_requests import PodGpus, mig_profile, read_pod_gpus, resource_maps
from kratos_admit.domain.quantity import parse_positive_integer, parse_quantity
from kratos_admit.domain.raw import as_mapping
from kratos_admit.domain.signing import has_reserved_keys, reserved_keys, signature_valid
from kratos_admit.domain.workload import MetadataBlock, Workload

_COMPUTE_CAPABILITY = re.compile(r"^[0-9]{1,2}\.[0-9]{1,2}$")
_KAI_MEMORY = re.compile(r"^[1-9][0-9]*$")


@dataclass(frozen=True, slots=True)
class ValidationContext:
    namespace: str
    signing_key: bytes
    max_gpus_per_pod: int
    mig_profiles: frozenset[str]
    profiling_demanded: bool  # profiling asked for explicitly and needed: profiling-target applies
    config: Config  # the profiling form (profilingForm) profiling-target checks against


def validate_workload(
    workload: Workload, ctx: ValidationContext, gpus: PodGpus | None = None
) -> list[FieldError]:
    """All violations of an object labelled for KRATOS, in a stable order. ``gpus`` is the pod's
    GPU requests where the caller has read them already (the mutating path needs them again)."""
    gpus = read_pod_gpus(workload) if gpus is None else gpus
    errors: list[FieldError] = []
    errors += _workload_name(workload)
    errors += _reserved_keys(workload, ctx)
    errors += _hint_format(workload)
    errors += _gpu_count(gpus)
    errors += _gpu_max(workload, gpus, ctx)
    errors += _mig_profile(gpus, ctx)
    errors += _gpu_sharing(workload, gpus)
    errors += _no_gpu(workload, gpus)
    if ctx.profiling_demanded:
        errors += profiling_target_errors(workload, gpus, ctx.config)
    return errors


def _workload_name(workload: Workload) -> Iterator[FieldError]:
    for block in workload.blocks:
        value = as_mapping(block.raw.get("labels")).get(v.WORKLOAD_LABEL)  # raw: a 5 is not a name
        if value is None or (isinstance(value, str) and v.is_dns1123_label(value)):
            continue
        found = repr(value) if isinstance(value, str) else f"{value!r} (a {_json_type(value)}, not a string)"
        yield FieldError(
            "workload-name",
            block.path.child("labels").key(v.WORKLOAD_LABEL),
            f"{found} must be a DNS-1123 label: lowercase letters, digits and '-', "
            f"starting and ending alphanumeric, at most {v.DNS1123_LABEL_MAX} characters"
            + (", quoted in YAML" if not isinstance(value, str) else ""),
            value,
        )


def _json_type(value: object) -> str:
    kinds = ((bool, "boolean"), (int, "number"), (float, "number"), (dict, "mapping"), (list, "list"))
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def _reserved_keys(workload: Workload, ctx: ValidationContext) -> Iterator[FieldError]:
    for block in workload.blocks:
        if not has_reserved_keys(block.raw) or signature_valid(
            block.raw, namespace=ctx.namespace, key=ctx.signing_key
        ):
            continue
        labels, annotations = reserved_keys(block.raw)
        values: dict[Path, str] = {block.path.child("labels").key(k): labels[k] for k in sorted(labels)}
        values |= {block.path.child("annotations").key(k): annotations[k] for k in sorted(annotations)}
        paths = list(values) or [block.path.child("annotations").key(v.SIGNATURE_ANNOTATION)]
        for path in paths:
            yield FieldError(
                "reserved-key",
                path,
                f"is written by KRATOS only and this block has no valid {v.SIGNATURE_ANNOTATION}",
                values.get(path),
            )


def _hint_format(workload: Workload) -> Iterator[FieldError]:
    block: MetadataBlock = workload.metadata
    annotations = block.annotations
    base = block.path.child("annotations")
    checks: list[tuple[str, bool, str]] = []
    if (cc := annotations.get(v.MIN_CC_ANNOTATION)) is not None:
        checks.append(
            (v.MIN_CC_ANNOTATION, bool(_COMPUTE_CAPABILITY.match(cc)), 'a compute capability like "8.0"')
        )
    if (memory := annotations.get(v.MIN_MEMORY_ANNOTATION)) is not None:
        quantity = parse_quantity(memory)
        checks.append(
            (
                v.MIN_MEMORY_ANNOTATION,
                quantity is not None and quantity >= 2**20,
                'a quantity of at least 1Mi, like "40Gi"',
            )
        )
    if (slowdown := annotations.get(v.MAX_SLOWDOWN_ANNOTATION)) is not None:
        checks.append(
            (
                v.MAX_SLOWDOWN_ANNOTATION,
                parse_max_slowdown(slowdown) is not None,
                'a number of at least 1 like "3", or "none" (or "0") for no cap',
            )
        )
    if (priority := annotations.get(v.PRIORITY_ANNOTATION)) is not None:
        checks.append((v.PRIORITY_ANNOTATION, priority in v.PRIORITIES, "one of high, normal, low"))
    if (profiling := annotations.get(v.PROFILING_ANNOTATION)) is not None:
        checks.append((v.PROFILING_ANNOTATION, profiling in ("true", "false"), '"true" or "false"'))
    if (scheduler := annotations.get(v.SCHEDULER_ANNOTATION)) is not None:
        checks.append(
            (v.SCHEDULER_ANNOTATION, scheduler in v.SCHEDULER_BACKENDS, "one of default, kai, volcano")
        )
    if (skip := annotations.get(v.PROFILE_SKIP_ANNOTATION)) is not None:
        checks.append(
            (
                v.PROFILE_SKIP_ANNOTATION,
                skip.isascii() and skip.isdigit() and len(skip) <= 9,
                'a count like "10"',
            )
        )
    if (form := annotations.get(v.PROFILING_FORM_ANNOTATION)) is not None:
        checks.append((v.PROFILING_FORM_ANNOTATION, form in v.PROFILING_FORMS, "one of staged, in-image"))
    if (exe := annotations.get(v.EXECUTABLE_ANNOTATION)) is not None:
        ok = exe.startswith("/") and len(exe) > 1 and not any(c in exe for c in "\0\n\r")
        checks.append((v.EXECUTABLE_ANNOTATION, ok, 'an absolute path like "/usr/local/bin/app"'))
    for key, ok, expected in checks:
        if not ok:
            yield FieldError(
                "hint-format", base.key(key), f"{annotations[key]!r} must be {expected}", annotations[key]
            )


def _gpu_count(gpus: PodGpus) -> Iterator[FieldError]:
    for c in gpus.containers:
        limits, requests = resource_maps(c.container)
        resources = c.container.path.child("resources")
        limit_ok = True
        if v.GPU_RESOURCE in limits and parse_positive_integer(limits[v.GPU_RESOURCE]) is None:
            limit_ok = False
            yield FieldError(
                "gpu-count",
                resources.child("limits").key(v.GPU_RESOURCE),
                f"must be a positive integer, got {limits[v.GPU_RESOURCE]!r}",
                limits[v.GPU_RESOURCE],
            )
        if v.GPU_RESOURCE not in requests:
            continue
        request_path = resources.child("requests").key(v.GPU_RESOURCE)
        requested = parse_positive_integer(requests[v.GPU_RESOURCE])
        if requested is None:
            yield FieldError(
                "gpu-count",
                request_path,
                f"must be a positive integer, got {requests[v.GPU_RESOURCE]!r}",
                requests[v.GPU_RESOURCE],
            )
        elif v.GPU_RESOURCE not in limits:
            yield FieldError(
                "gpu-count",
                request_path,
                "is requested without a limit; GPUs are set in limits (requests may repeat them)",
                requests[v.GPU_RESOURCE],
            )
        elif limit_ok and requested != parse_positive_integer(limits[v.GPU_RESOURCE]):
            yield FieldError(
                "gpu-count",
                request_path,
                f"must equal the limit ({limits[v.GPU_RESOURCE]}), got {requests[v.GPU_RESOURCE]}",
                requests[v.GPU_RESOURCE],
            )


def _gpu_max(workload: Workload, gpus: PodGpus, ctx: ValidationContext) -> Iterator[FieldError]:
    if gpus.effective_gpus > ctx.max_gpus_per_pod:
        yield FieldError(
            "gpu-max",
            workload.pod_spec_path,
            f"asks for {gpus.effective_gpus} GPUs in one pod (max of the largest init container and "
            f"the sum of containers); at most {ctx.max_gpus_per_pod} are allowed",
            gpus.effective_gpus,
        )


def _mig_profile(gpus: PodGpus, ctx: ValidationContext) -> Iterator[FieldError]:
    for c in gpus.containers:
        limits, requests = resource_maps(c.container)
        resources = c.container.path.child("resources")
        for section, values in (("limits", limits), ("requests", requests)):
            for name, value in values.items():
                profile = mig_profile(name)
                if profile is None:
                    continue
                path = resources.child(section).key(name)
                if profile not in ctx.mig_profiles:
                    yield FieldError(
                        "mig-profile", path, f"{profile!r} is not a MIG profile of any known GPU", name
                    )
                elif parse_positive_integer(value) is None:
                    yield FieldError("mig-profile", path, f"must be a positive integer, got {value!r}", value)
        if c.mig and c.has_gpu_key:
            yield FieldError(
                "mig-profile",
                resources,
                "asks for MIG slices and full GPUs (nvidia.com/gpu) in one container",
            )


def _gpu_sharing(workload: Workload, gpus: PodGpus) -> Iterator[FieldError]:
    sharing = gpus.sharing
    annotations = workload.pod_metadata.path.child("annotations")
    if sharing.fraction is not None and sharing.memory is not None:
        yield FieldError(
            "gpu-sharing",
            annotations.key(v.KAI_MEMORY_ANNOTATION),
            f"cannot be set together with {v.KAI_FRACTION_ANNOTATION}; choose one",
            sharing.memory,
        )
    if sharing.fraction is not None and not _fraction_ok(sharing.fraction):
        yield FieldError(
            "gpu-sharing",
            annotations.key(v.KAI_FRACTION_ANNOTATION),
            f"{sharing.fraction!r} must be a number strictly between 0 and 1",
            sharing.fraction,
        )
    if sharing.memory is not None and not _KAI_MEMORY.match(sharing.memory):
        yield FieldError(
            "gpu-sharing",
            annotations.key(v.KAI_MEMORY_ANNOTATION),
            f"{sharing.memory!r} must be a positive integer of MiB",
            sharing.memory,
        )
    if sharing.num_devices is not None:
        problem = (
            f"{sharing.num_devices!r} must be a positive integer"
            if parse_positive_integer(sharing.num_devices) is None or not sharing.num_devices.isdigit()
            else ""
            if sharing.requested
            else f"needs {v.KAI_FRACTION_ANNOTATION} or {v.KAI_MEMORY_ANNOTATION}"
        )
        if problem:
            yield FieldError(
                "gpu-sharing", annotations.key(v.KAI_NUM_DEVICES_ANNOTATION), problem, sharing.num_devices
            )
    if not sharing.requested:
        return
    if sharing.container_name is not None and not any(
        c.container.name == sharing.container_name for c in gpus.containers
    ):
        yield FieldError(
            "gpu-sharing",
            annotations.key(v.KAI_CONTAINER_NAME_ANNOTATION),
            f"names no container or init container: {sharing.container_name!r}",
            sharing.container_name,
        )
    for c in gpus.containers:
        if c.has_gpu_key:
            yield FieldError(
                "gpu-sharing",
                c.container.path.child("resources"),
                f"asks for {v.GPU_RESOURCE} while the pod shares a GPU through KAI "
                f"{v.KAI_FRACTION_ANNOTATION}/{v.KAI_MEMORY_ANNOTATION}; use one or the other",
            )


def _fraction_ok(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return 0 < value < 1


def _no_gpu(workload: Workload, gpus: PodGpus) -> Iterator[FieldError]:
    if not gpus.any:
        yield FieldError(
            "no-gpu",
            workload.pod_spec_path,
            f"requests no GPU ({v.GPU_RESOURCE}, a MIG slice, KAI sharing or a DRA claim); "
            f"request one or remove the {v.WORKLOAD_LABEL} label",
        )


def new_violations(new: list[FieldError], old: list[FieldError]) -> list[FieldError]:
    """On UPDATE, deny only what the update introduced (ratcheting), so old objects stay updatable."""
    known = {(e.rule, e.field) for e in old}
    return [e for e in new if (e.rule, e.field) not in known]
