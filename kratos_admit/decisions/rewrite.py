"""The profiling rewrite of a Job into either form (DESIGN "Profiling rewrite", "Profiling in the
workload's own image"): the KRATOS containers, their security contexts, and the Job spec changes."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from kratos_admit.decisions.profiling import ProfilingPlan, encode_original_template
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.fields import METADATA
from kratos_admit.domain.raw import as_list, as_mapping, child, clone, is_mapping
from kratos_admit.domain.signing import sign_block
from kratos_admit.domain.workload import MetadataBlock

# Job fields that name containers or indexes the profiling run no longer has. completionMode stays: an
# Indexed Job's run is its index 0 (completions 1), so JOB_COMPLETION_INDEX is set as the program expects.
_DROPPED_JOB_FIELDS = (
    "ttlSecondsAfterFinished",  # the TTL controller would delete the run before the controller reads it
    "podFailurePolicy",
    "successPolicy",
    "backoffLimitPerIndex",
    "maxFailedIndexes",
)
_USER_CONTAINER_FIELDS = ("env", "envFrom", "workingDir", "securityContext")

STAGE_SCRIPT = (
    'set -eu; src="$1"; '
    'if [ ! -e "$src" ]; then echo "kratos: executable $src does not exist in this image; '
    'set the gpu.scheduler.io/executable annotation to its absolute path" >&2; exit 66; fi; '
    f'cp -L "$src" {v.STAGE_MOUNT_PATH}/; chmod a+rx "{v.STAGE_MOUNT_PATH}/$(basename "$src")"'
)


def staged_path(executable: str) -> str:
    return posixpath.join(v.STAGE_MOUNT_PATH, posixpath.basename(executable.rstrip("/")))


def _user_mounts(user: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [m for m in as_list(user.get("volumeMounts")) if is_mapping(m)]


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


def launch_skip(annotations: Mapping[str, str], config: Config) -> int | None:
    """Kernels to let run before profiling (warm-up): the annotation, else config ``ncuLaunchSkip``;
    None when neither is set, so the runner finds the warm-up itself (its steady-state profile)."""
    raw = annotations.get(v.PROFILE_SKIP_ANNOTATION)
    return int(raw) if raw is not None and raw.isdigit() else config.ncu_launch_skip


def _runner_options(config: Config, skip: int | None) -> list[str]:
    """The runner's options: the section set, and the launch window only where the annotation or
    config fixes it (either wins over the runner's steady-state selection, docs/profiling.md)."""
    options = ["--set", config.ncu_set]
    if skip is not None:
        options += ["--launch-skip", str(skip)]
    if config.ncu_launch_count is not None:
        options += ["--launch-count", str(config.ncu_launch_count)]
    return options


def _runner_container(
    user: Mapping[str, Any], executable: str, config: Config, *, skip: int | None
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
            *_runner_options(config, skip),
            "--",
            staged_path(executable),
            *workload_args,
        ],
        "terminationMessagePolicy": "File",
    }
    return _with_user_fields(
        runner, user, config, {"name": v.STAGE_VOLUME, "mountPath": v.STAGE_MOUNT_PATH, "readOnly": True}
    )


def _with_user_fields(
    runner: dict[str, Any], user: Mapping[str, Any], config: Config, tools_mount: dict[str, Any]
) -> dict[str, Any]:
    """profiling-runner's share of the user's container (both forms), then the KRATOS mount and
    the configured capabilities."""
    for key in _USER_CONTAINER_FIELDS:
        if key in user:
            runner[key] = clone(user[key])
    runner["resources"] = _runner_resources(user, config)
    mounts = _user_mounts(user)
    runner["volumeMounts"] = [*clone(mounts), tools_mount]
    if config.profiling_capabilities:
        security = child(runner, "securityContext")
        capabilities = child(security, "capabilities")
        added = [c for c in as_list(capabilities.get("add")) if isinstance(c, str)]
        capabilities["add"] = [*added, *(c for c in config.profiling_capabilities if c not in added)]
    return runner


TOOLS_RUNNER_PATH = posixpath.join(v.TOOLS_MOUNT_PATH, v.TOOLS_RUNNER)
TOOLS_NCU_PATH = posixpath.join(v.TOOLS_MOUNT_PATH, v.TOOLS_NCU)
STAGE_PROFILER_SCRIPT = (
    f"set -eu; if [ ! -x {v.TOOLS_IMAGE_PATH}/{v.TOOLS_RUNNER} ] || [ ! -x {v.TOOLS_IMAGE_PATH}/{v.TOOLS_NCU} ]; "
    f'then echo "kratos: this image has no {v.TOOLS_IMAGE_PATH}/{v.TOOLS_RUNNER} and {v.TOOLS_NCU}: '
    'set nsightComputeImage to the runner image built from runner/Dockerfile" >&2; exit 66; fi; '
    f"cp -RP {v.TOOLS_IMAGE_PATH}/. {v.TOOLS_MOUNT_PATH}/"
)
# -P keeps links as links: nsight-compute/ncu is a relative link to the real program under target/,
# which finds its libraries beside itself ($ORIGIN), so a copy of it elsewhere would not start.
# runner/Dockerfile builds the tree with relative links only, so none dangles in the workload's image.


def _stage_profiler_container(user: Mapping[str, Any], config: Config) -> dict[str, Any]:
    """The in-image form's init container: the runner image copies the one-file runner and Nsight
    Compute's command-line part into kratos-tools (it has a shell; the user's image need not)."""
    return {
        "name": v.STAGE_PROFILER_CONTAINER,
        "image": config.nsight_compute_image,
        "command": ["sh", "-c", STAGE_PROFILER_SCRIPT],
        "volumeMounts": [{"name": v.TOOLS_VOLUME, "mountPath": v.TOOLS_MOUNT_PATH}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": config.profiling_resources.as_dict(),
        "securityContext": _stage_security_context(user),
    }


def _in_image_runner_container(
    user: Mapping[str, Any], wrapped: tuple[str, ...], config: Config, *, skip: int | None
) -> dict[str, Any]:
    """profiling-runner in the workload's own image: the staged runner and ncu, then the user's
    command and args unchanged; the user's env, envFrom, workingDir, security context, resources,
    mounts and pull policy, plus kratos-tools read-only."""
    runner: dict[str, Any] = {
        "name": v.RUNNER_CONTAINER,
        "image": user.get("image"),
        "command": [
            TOOLS_RUNNER_PATH,
            "--ncu",
            TOOLS_NCU_PATH,
            "--target-processes",
            "all",
            *_runner_options(config, skip),
            "--",
            *wrapped,
        ],
        "terminationMessagePolicy": "File",
    }
    if "imagePullPolicy" in user:
        runner["imagePullPolicy"] = user["imagePullPolicy"]
    return _with_user_fields(
        runner, user, config, {"name": v.TOOLS_VOLUME, "mountPath": v.TOOLS_MOUNT_PATH, "readOnly": True}
    )


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


def rewrite_for_profiling(
    job: dict[str, Any],
    *,
    plan: ProfilingPlan,
    namespace: str,
    config: Config,
    signing_key: bytes,
) -> None:
    """Turn the Job (a deep copy) into its profiling form (``plan.form``), in place; the Job keeps
    its name.

    The Job and its pods carry the ``release`` finalizer until the controller has read the summary
    and created the execution Job, and drop ``ttlSecondsAfterFinished`` (the execution Job gets the
    user's), so neither a TTL nor an early delete can lose the workload or its profile.
    """
    original = encode_original_template(job)
    spec = child(job, "spec")
    template = child(spec, "template")
    pod_spec = child(template, "spec")
    user = plan.target.container.raw
    metadata = child(job, "metadata")
    skip = launch_skip(MetadataBlock(METADATA, metadata).annotations, config)
    if plan.executable is not None:
        init, runner = (
            _stage_container(user, plan.executable, config),
            _runner_container(user, plan.executable, config, skip=skip),
        )
        volume = v.STAGE_VOLUME
    else:
        init, runner = (
            _stage_profiler_container(user, config),
            _in_image_runner_container(user, plan.wrapped, config, skip=skip),
        )
        volume = v.TOOLS_VOLUME
    pod_spec["initContainers"] = [*as_list(pod_spec.get("initContainers")), init]
    pod_spec["containers"] = [runner]
    volumes = [vol for vol in as_list(pod_spec.get("volumes")) if as_mapping(vol).get("name") != volume]
    pod_spec["volumes"] = [*volumes, {"name": volume, "emptyDir": {}}]
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
    # its Pods carry the workload label too, so the controller sees the kubelet's word on them (an
    # image that never pulls, a container killed) as it happens
    workload = as_mapping(metadata.get("labels")).get(v.WORKLOAD_LABEL)
    if isinstance(workload, str):
        child(pod_meta, "labels").setdefault(v.WORKLOAD_LABEL, workload)
    for block in (metadata, pod_meta):
        finalizers = [f for f in as_list(block.get("finalizers")) if f != v.RELEASE_FINALIZER]
        block["finalizers"] = [*finalizers, v.RELEASE_FINALIZER]
        sign_block(block, namespace=namespace, key=signing_key)
