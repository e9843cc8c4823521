"""The profiling rewrite of a Job (DESIGN "Profiling rewrite") and the original-template round trip."""

from __future__ import annotations

import base64
import gzip
import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.fields import METADATA, FieldError
from kratos_admit.domain.gpu_requests import ContainerGpus, PodGpus
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.raw import as_list, as_mapping, child, clone
from kratos_admit.domain.signing import sign_block, signature_valid
from kratos_admit.domain.workload import MetadataBlock, Workload

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


_VERSION_SUFFIX = re.compile(r"[-_.]?[0-9]+(?:\.[0-9]+)*[a-z]?$")


def is_interpreter(path: str, interpreters: Iterable[str]) -> bool:
    """Whether ``path``'s file name is one of config ``interpreters``, a version suffix allowed:
    ``/usr/bin/python3.11`` matches ``python``, ``pypy3.10`` ``pypy``, ``node18`` ``node``."""
    name = posixpath.basename(path.rstrip("/"))
    known = frozenset(interpreters)
    if name in known:
        return True
    stem = _VERSION_SUFFIX.sub("", name)
    return bool(stem) and stem != name and stem in known


@dataclass(frozen=True, slots=True)
class ProfilingPlan:
    """How a Job is profiled: which container, in which form, and why (for the warning and review).

    ``executable`` is what the staged form copies (the annotation, else command[0]); ``wrapped`` is
    what the in-image form runs after the runner's ``--``: the user's command and args unchanged (or,
    for a container without a command, the executable annotation and the args)."""

    target: ContainerGpus
    executable: str | None  # set: the staged form
    wrapped: tuple[str, ...]  # the in-image form's workload command
    why: str

    @property
    def form(self) -> v.ProfilingForm:
        return "staged" if self.executable is not None else "in-image"

    def warning(self) -> str:
        if self.form == "staged":
            return (
                f"profiling form staged (the executable is copied into the Nsight Compute image): {self.why}; "
                "if it needs libraries or files of its own image, set "
                f"{v.PROFILING_FORM_ANNOTATION}: in-image"
            )
        return f"profiling form in-image (Nsight Compute runs inside the workload's own image): {self.why}"


def requested_form(annotations: Mapping[str, str], config: Config) -> v.ProfilingFormSetting:
    """The object's ``profiling-form`` annotation, else config ``profilingForm``."""
    value = annotations.get(v.PROFILING_FORM_ANNOTATION)
    if value == "staged":
        return "staged"
    if value == "in-image":
        return "in-image"
    return config.profiling_form


def _strings(value: object) -> list[str]:
    return [item for item in as_list(value) if isinstance(item, str)]


def _wrappable(workload: Workload, gpu_container: ContainerGpus) -> tuple[str, ...] | None:
    """What the in-image form runs: the command and args; with no command, the executable
    annotation and the args; None when the container runs its image's entrypoint unnamed."""
    raw = gpu_container.container.raw
    command, args = _strings(raw.get("command")), _strings(raw.get("args"))
    if command:
        return (*command, *args)
    exe = workload.metadata.annotations.get(v.EXECUTABLE_ANNOTATION)
    if exe is not None and exe.startswith("/"):
        return (exe, *args)
    return None


def profiling_plan(workload: Workload, gpus: PodGpus, config: Config) -> ProfilingPlan | None:
    """DESIGN "Profiling in the workload's own image": the form the annotation or config asks for,
    or under ``auto`` staged for an absolute executable that is not an interpreter or launcher and
    in-image for every other container with a command. None when nothing can be profiled
    (``unprofilable_reason`` and ``profiling_target_errors`` say why)."""
    if len(gpus.gpu_containers) != 1:
        return None
    target = gpus.gpu_containers[0]
    annotations = workload.metadata.annotations
    executable = profiling_executable(workload, target)
    wrapped = _wrappable(workload, target)
    form = requested_form(annotations, config)
    asked = (
        f"the {v.PROFILING_FORM_ANNOTATION} annotation asks for it"
        if v.PROFILING_FORM_ANNOTATION in annotations
        else f"config profilingForm is {form}"
    )
    if form == "staged":
        return None if executable is None else ProfilingPlan(target, executable, (), asked)
    if form == "in-image":
        return None if wrapped is None else ProfilingPlan(target, None, wrapped, asked)
    if executable is not None and not is_interpreter(executable, config.interpreters):
        why = f"{executable} is an absolute executable, not an interpreter or launcher (config interpreters)"
        return ProfilingPlan(target, executable, (), why)
    if wrapped is None:
        return None
    named = (
        f"the {v.EXECUTABLE_ANNOTATION} annotation {executable!r}"
        if v.EXECUTABLE_ANNOTATION in annotations
        else f"command[0] {wrapped[0]!r}"
    )
    why = (
        f"{named} is an interpreter or launcher (config interpreters)"
        if executable is not None or is_interpreter(wrapped[0], config.interpreters)
        else f"{named} is not an absolute path, so only the workload's image can run it"
    )
    return ProfilingPlan(target, None, wrapped, why)


def unprofilable_reason(workload: Workload, gpus: PodGpus, config: Config) -> str:
    """Why ``profiling_plan`` found nothing and what would change that, for a warning (a Job
    profiled only by default): the remedy follows the cause."""
    if len(gpus.gpu_containers) != 1:
        return (
            f"it has {len(gpus.gpu_containers)} containers that use a GPU and profiling needs exactly one; "
            "to profile it, run the GPU work in a single container"
        )
    command = gpus.gpu_containers[0].container.command
    if requested_form(workload.metadata.annotations, config) == "staged":
        remedy = (
            f"to profile it, give its GPU container an absolute command[0] or set the "
            f"{v.EXECUTABLE_ANNOTATION} annotation to the executable's absolute path, or set "
            f"{v.PROFILING_FORM_ANNOTATION}: in-image"
        )
        if command:
            return f"the staged form needs an absolute executable and command[0] {command[0]!r} is not one; {remedy}"
    else:
        remedy = (
            "to profile it, give its GPU container a command (command[0] and its args, as the image's "
            f"entrypoint would run them) or set the {v.EXECUTABLE_ANNOTATION} annotation to the absolute "
            "path of the entrypoint's executable"
        )
    return (
        "its GPU container runs its image's entrypoint, so KRATOS does not know which program to "
        f"profile; {remedy}"
    )


def profiling_executable(workload: Workload, gpu_container: ContainerGpus) -> str | None:
    """The absolute executable to stage: the annotation, else command[0]; None when neither is one."""
    exe = workload.metadata.annotations.get(v.EXECUTABLE_ANNOTATION)
    if exe is None:
        command = gpu_container.container.command
        exe = command[0] if command else None
    return exe if exe is not None and exe.startswith("/") else None


def profiling_target_errors(workload: Workload, gpus: PodGpus, config: Config) -> list[FieldError]:
    """Rule profiling-target: profiling asked for explicitly, but nothing the requested form can
    profile (not exactly one GPU container; for ``staged`` no absolute executable; for ``in-image``
    and ``auto`` no command and no executable annotation)."""
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
    if profiling_plan(workload, gpus, config) is not None:
        return []
    target = candidates[0]
    if requested_form(workload.metadata.annotations, config) == "staged":
        message = (
            "the staged profiling form needs an absolute executable: make command[0] an absolute path, "
            f"set the {v.EXECUTABLE_ANNOTATION} annotation, or set {v.PROFILING_FORM_ANNOTATION}: in-image"
        )
    else:
        message = (
            "profiling needs a command to run under Nsight Compute and this container runs its image's "
            f"entrypoint: give it a command, or set the {v.EXECUTABLE_ANNOTATION} annotation to the "
            "entrypoint's absolute path"
        )
    return [FieldError("profiling-target", target.container.path.child("command"), message)]


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


def _runner_options(config: Config, skip: int) -> list[str]:
    return [
        "--set", config.ncu_set,
        "--launch-skip", str(skip),
        "--launch-count", str(config.ncu_launch_count),
    ]  # fmt: skip


def _in_image_runner_container(
    user: Mapping[str, Any], wrapped: tuple[str, ...], config: Config, *, skip: int
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
    for block in (metadata, pod_meta):
        finalizers = [f for f in as_list(block.get("finalizers")) if f != v.RELEASE_FINALIZER]
        block["finalizers"] = [*finalizers, v.RELEASE_FINALIZER]
        sign_block(block, namespace=namespace, key=signing_key)
