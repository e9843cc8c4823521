"""The profiling rewrite of a Job (DESIGN "Profiling rewrite") and the original-template round trip."""

from __future__ import annotations

import base64
import gzip
import json
import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

from kratos_admit import vocabulary as v
from kratos_admit.calibration import Calibration
from kratos_admit.catalog import Catalog
from kratos_admit.config import Config
from kratos_admit.fields import METADATA, FieldError
from kratos_admit.gpu_requests import ContainerGpus, PodGpus
from kratos_admit.profile import WorkloadProfile
from kratos_admit.raw import as_list, as_mapping, child, clone
from kratos_admit.signing import sign_block, signature_valid
from kratos_admit.workload import MetadataBlock, Workload

# Job fields that name containers or indexes the profiling run no longer has.
_DROPPED_JOB_FIELDS = (
    "ttlSecondsAfterFinished",  # the TTL controller would delete the run before the controller reads it
    "podFailurePolicy",
    "successPolicy",
    "backoffLimitPerIndex",
    "maxFailedIndexes",
    "completionMode",
)
_USER_CONTAINER_FIELDS = ("env", "envFrom", "workingDir", "securityContext")

STAGE_SCRIPT = (
    'set -eu; src="$1"; '
    'if [ ! -e "$src" ]; then echo "kratos: executable $src does not exist in this image; '
    'set the gpu.scheduler.io/executable annotation to its absolute path" >&2; exit 66; fi; '
    f'cp -L "$src" {v.STAGE_MOUNT_PATH}/; chmod a+rx "{v.STAGE_MOUNT_PATH}/$(basename "$src")"'
)


class OriginalTemplateError(ValueError):
    """The original-template annotation is missing, unsigned or unreadable."""


def encode_original_template(job: Mapping[str, Any]) -> str:
    """gzip+base64 JSON of what is needed to recreate the user's Job exactly."""
    meta = as_mapping(job.get("metadata"))
    kept_meta: dict[str, Any] = {}
    for key in ("name", "generateName"):
        if key in meta:
            kept_meta[key] = meta[key]
    labels = {k: val for k, val in as_mapping(meta.get("labels")).items() if k not in v.RESERVED_LABELS}
    annotations = {
        k: val for k, val in as_mapping(meta.get("annotations")).items() if k not in v.RESERVED_ANNOTATIONS
    }
    if labels:
        kept_meta["labels"] = labels
    if annotations:
        kept_meta["annotations"] = annotations
    document = {"metadata": kept_meta, "spec": job.get("spec", {})}
    raw = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    return base64.b64encode(gzip.compress(raw, mtime=0)).decode()


def decode_original_template(job: Mapping[str, Any], *, namespace: str, signing_key: bytes) -> dict[str, Any]:
    """The user's Job metadata and spec, after checking KRATOS signed them."""
    meta = as_mapping(job.get("metadata"))
    encoded = as_mapping(meta.get("annotations")).get(v.ORIGINAL_TEMPLATE_ANNOTATION)
    if not isinstance(encoded, str):
        raise OriginalTemplateError(f"annotation {v.ORIGINAL_TEMPLATE_ANNOTATION} is missing")
    if not signature_valid(meta, namespace=namespace, key=signing_key):
        raise OriginalTemplateError(f"annotation {v.ORIGINAL_TEMPLATE_ANNOTATION} has no valid signature")
    try:
        document = json.loads(gzip.decompress(base64.b64decode(encoded, validate=True)))
    except (ValueError, OSError, EOFError) as exc:
        raise OriginalTemplateError(
            f"annotation {v.ORIGINAL_TEMPLATE_ANNOTATION} is unreadable: {exc}"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("spec"), dict):
        raise OriginalTemplateError(f"annotation {v.ORIGINAL_TEMPLATE_ANNOTATION} holds no Job spec")
    return document


def profiling_wanted(annotations: Mapping[str, str], config: Config) -> bool:
    value = annotations.get(v.PROFILING_ANNOTATION)
    return config.profiling_default if value is None else value == "true"


def profiling_demanded(
    workload: Workload, *, operation: str, profile: WorkloadProfile | None, config: Config, role: str | None
) -> bool:
    """Profiling asked for explicitly (``profiling: "true"``) and needed (a Job created without a
    profile, not made by KRATOS: no signed ``role``): only then is a Job that cannot be profiled
    denied (rule profiling-target); profiling by default never denies a Job."""
    return (
        workload.metadata.annotations.get(v.PROFILING_ANNOTATION) == "true"
        and workload.kind == "Job"
        and operation == "CREATE"
        and profile is None
        and profiling_wanted(workload.metadata.annotations, config)
        and role is None
    )


def unprofilable_reason(workload: Workload, gpus: PodGpus) -> str:
    """Why ``profiling_target`` found nothing and what would change that, for a warning (a Job
    profiled only by default): the remedy follows the cause."""
    if len(gpus.gpu_containers) != 1:
        return (
            f"it has {len(gpus.gpu_containers)} containers that use a GPU and profiling needs exactly one; "
            "to profile it, run the GPU work in a single container"
        )
    command = gpus.gpu_containers[0].container.command
    remedy = (
        f"to profile it, give its GPU container an absolute command[0] or set the "
        f"{v.EXECUTABLE_ANNOTATION} annotation to the executable's absolute path"
    )
    if command:
        return f"its GPU container's command[0] {command[0]!r} is not an absolute path; {remedy}"
    return (
        "its GPU container runs its image's entrypoint, so KRATOS does not know which executable to "
        f"profile; {remedy}"
    )


def profiling_executable(workload: Workload, gpu_container: ContainerGpus) -> str | None:
    """The absolute executable to stage: the annotation, else command[0]; None when neither is one."""
    exe = workload.metadata.annotations.get(v.EXECUTABLE_ANNOTATION)
    if exe is None:
        command = gpu_container.container.command
        exe = command[0] if command else None
    return exe if exe is not None and exe.startswith("/") else None


def profiling_target_errors(workload: Workload, gpus: PodGpus) -> list[FieldError]:
    candidates = gpus.gpu_containers
    containers = workload.pod_spec_path.child("containers")
    if len(candidates) != 1:
        return [
            FieldError(
                "profiling-target",
                containers,
                f"profiling needs exactly one container that uses a GPU, found {len(candidates)}; "
                f'set {v.PROFILING_ANNOTATION}: "false" to run without a profile',
            )
        ]
    target = candidates[0]
    if profiling_executable(workload, target) is None:
        return [
            FieldError(
                "profiling-target",
                target.container.path.child("command"),
                "profiling needs an absolute executable: make command[0] an absolute path or set "
                f"the {v.EXECUTABLE_ANNOTATION} annotation",
            )
        ]
    return []


def profiling_target(workload: Workload, gpus: PodGpus) -> tuple[ContainerGpus, str] | None:
    """The container to profile and its absolute executable, or None when profiling cannot be done
    (``profiling_target_errors`` says why)."""
    if len(gpus.gpu_containers) != 1:
        return None
    target = gpus.gpu_containers[0]
    executable = profiling_executable(workload, target)
    return None if executable is None else (target, executable)


def staged_path(executable: str) -> str:
    return posixpath.join(v.STAGE_MOUNT_PATH, posixpath.basename(executable.rstrip("/")))


def _user_mounts(user: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [m for m in as_list(user.get("volumeMounts")) if isinstance(m, Mapping)]


# Identity fields of the user's securityContext the staging copy keeps: it reads the user's image
# as the user's container would; everything else about it is locked down (Pod Security "restricted").
_IDENTITY_FIELDS = ("runAsUser", "runAsGroup", "runAsNonRoot", "seLinuxOptions", "windowsOptions")
# Capabilities Pod Security "restricted" lets a container add (v1.28 of the standard).
RESTRICTED_ADDABLE_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})


def _stage_security_context(user: Mapping[str, Any]) -> dict[str, Any]:
    """Passes "restricted" whenever the user's container does, and is never more privileged than it."""
    given = as_mapping(user.get("securityContext"))
    security: dict[str, Any] = {k: clone(given[k]) for k in _IDENTITY_FIELDS if k in given}
    security["allowPrivilegeEscalation"] = False
    security["capabilities"] = {"drop": ["ALL"]}
    seccomp = as_mapping(given.get("seccompProfile"))
    security["seccompProfile"] = (
        clone(seccomp) if seccomp.get("type") == "Localhost" else {"type": "RuntimeDefault"}
    )
    return security


def _stage_container(user: Mapping[str, Any], executable: str, config: Config) -> dict[str, Any]:
    mounts = _user_mounts(user)
    container: dict[str, Any] = {
        "name": v.STAGE_CONTAINER,
        "image": user.get("image"),
        "command": ["sh", "-c", STAGE_SCRIPT, v.STAGE_CONTAINER, executable],
        "volumeMounts": [*clone(mounts), {"name": v.STAGE_VOLUME, "mountPath": v.STAGE_MOUNT_PATH}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": config.profiling_resources.as_dict(),
        "securityContext": _stage_security_context(user),
    }
    if "imagePullPolicy" in user:
        container["imagePullPolicy"] = user["imagePullPolicy"]
    return container


def _runner_resources(user: Mapping[str, Any], config: Config) -> dict[str, Any]:
    """The user's resources (their GPUs above all), plus the configured requests for cpu and memory
    where the user's container states neither a request nor a limit, so quotas that require
    requests admit the pod; never a limit the workload did not have."""
    resources: dict[str, Any] = clone(dict(as_mapping(user.get("resources"))))
    stated = set(as_mapping(resources.get("requests"))) | set(as_mapping(resources.get("limits")))
    for name, quantity in config.profiling_resources.requests.items():
        if name not in stated:
            child(resources, "requests")[name] = quantity
    return resources


def launch_skip(annotations: Mapping[str, str], config: Config) -> int:
    """Kernels to let run before profiling (warm-up): the annotation, else config ``ncuLaunchSkip``."""
    raw = annotations.get(v.PROFILE_SKIP_ANNOTATION)
    return int(raw) if raw is not None and raw.isdigit() else config.ncu_launch_skip


def _runner_container(
    user: Mapping[str, Any], executable: str, config: Config, *, skip: int
) -> dict[str, Any]:
    command = [c for c in as_list(user.get("command")) if isinstance(c, str)]
    args = [a for a in as_list(user.get("args")) if isinstance(a, str)]
    workload_args = [*command[1:], *args]
    runner: dict[str, Any] = {
        "name": v.RUNNER_CONTAINER,
        "image": config.nsight_compute_image,
        "command": [
            "python3",
            "-m",
            "kratos_runner",
            "--set",
            config.ncu_set,
            "--launch-skip",
            str(skip),
            "--launch-count",
            str(config.ncu_launch_count),
            "--",
            staged_path(executable),
            *workload_args,
        ],
        "terminationMessagePolicy": "File",
    }
    for key in _USER_CONTAINER_FIELDS:
        if key in user:
            runner[key] = clone(user[key])
    runner["resources"] = _runner_resources(user, config)
    mounts = _user_mounts(user)
    runner["volumeMounts"] = [
        *clone(mounts),
        {"name": v.STAGE_VOLUME, "mountPath": v.STAGE_MOUNT_PATH, "readOnly": True},
    ]
    if config.profiling_capabilities:
        security = child(runner, "securityContext")
        capabilities = child(security, "capabilities")
        added = [c for c in as_list(capabilities.get("add")) if isinstance(c, str)]
        capabilities["add"] = [*added, *(c for c in config.profiling_capabilities if c not in added)]
    return runner


def capability_warnings(config: Config) -> list[str]:
    """profilingCapabilities that Pod Security "restricted" forbids: the API server will refuse the
    profiling pod in a namespace that enforces it, so say so at admission."""
    forbidden = [c for c in config.profiling_capabilities if c not in RESTRICTED_ADDABLE_CAPABILITIES]
    if not forbidden:
        return []
    return [
        f'profilingCapabilities {", ".join(forbidden)} are not allowed under Pod Security "restricted" '
        "(only NET_BIND_SERVICE may be added): a namespace that enforces it refuses the profiling pod"
    ]


def profiling_products(
    node_products: Iterable[str],
    product_nodes: Mapping[str, int],
    *,
    calibration: Calibration,
    catalog: Catalog,
    config: Config,
) -> tuple[str, ...]:
    """The node label values a profiling run prefers (DESIGN "Learning the cluster's GPUs"), so its
    shares are measured where the figures are known: config ``profilingProducts`` (those in the
    cluster, all of them when the node list is unknown); else the best-calibrated product in the
    cluster (both factors qualify; the most runs behind the weaker one); before any qualifies, the
    product with the most Nodes. Empty when the cluster's products are unknown, or all its products
    have as many Nodes (a term naming them all would prefer nothing)."""
    present = sorted(node_products)
    if config.profiling_products:
        chosen = [p for p in config.profiling_products if p in present] if present else []
        return tuple(chosen or config.profiling_products)
    if not present:
        return ()
    qualified: dict[str, int] = {}
    for label in present:
        entry = catalog.placement(label)
        found = calibration.get(entry.product) if entry is not None else None
        if found is not None and found.qualifies(config.min_calibration_runs):
            qualified[label] = found.runs
    if qualified:
        best = max(qualified.values())
        return tuple(label for label in present if qualified.get(label) == best)
    most = max(product_nodes.get(label, 0) for label in present)
    largest = tuple(label for label in present if product_nodes.get(label, 0) == most)
    return largest if len(largest) < len(present) else ()  # all alike: nothing to prefer


def rewrite_for_profiling(
    job: dict[str, Any],
    *,
    target: ContainerGpus,
    executable: str,
    namespace: str,
    config: Config,
    signing_key: bytes,
) -> None:
    """Turn the Job (a deep copy) into its profiling form, in place; the Job keeps its name.

    The Job and its pods carry the ``release`` finalizer until the controller has read the summary
    and created the execution Job, and drop ``ttlSecondsAfterFinished`` (the execution Job gets the
    user's), so neither a TTL nor an early delete can lose the workload or its profile.
    """
    original = encode_original_template(job)
    spec = child(job, "spec")
    template = child(spec, "template")
    pod_spec = child(template, "spec")
    user = target.container.raw
    metadata = child(job, "metadata")
    skip = launch_skip(MetadataBlock(METADATA, metadata).annotations, config)
    pod_spec["initContainers"] = [
        *as_list(pod_spec.get("initContainers")),
        _stage_container(user, executable, config),
    ]
    pod_spec["containers"] = [_runner_container(user, executable, config, skip=skip)]
    volumes = [
        vol for vol in as_list(pod_spec.get("volumes")) if as_mapping(vol).get("name") != v.STAGE_VOLUME
    ]
    pod_spec["volumes"] = [*volumes, {"name": v.STAGE_VOLUME, "emptyDir": {}}]
    pod_spec["restartPolicy"] = "Never"
    for field in _DROPPED_JOB_FIELDS:
        spec.pop(field, None)
    spec.update(
        parallelism=1,
        completions=1,
        backoffLimit=0,
        activeDeadlineSeconds=config.profiling_deadline_seconds,
    )
    child(metadata, "labels")[v.ROLE_LABEL] = "profiling"
    child(metadata, "annotations")[v.ORIGINAL_TEMPLATE_ANNOTATION] = original
    pod_meta = child(template, "metadata")
    child(pod_meta, "labels")[v.ROLE_LABEL] = "profiling"
    for block in (metadata, pod_meta):
        finalizers = [f for f in as_list(block.get("finalizers")) if f != v.RELEASE_FINALIZER]
        block["finalizers"] = [*finalizers, v.RELEASE_FINALIZER]
        sign_block(block, namespace=namespace, key=signing_key)
