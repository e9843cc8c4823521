"""Whether and how a Job is profiled (DESIGN "Profiling rewrite", "Profiling in the workload's own image"):
wanted or demanded, which container, which form and why; and the original-template round trip."""

from __future__ import annotations

import base64
import functools
import gzip
import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.fields import FieldError
from kratos_admit.domain.gpu_requests import ContainerGpus, PodGpus
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.raw import as_list, as_mapping
from kratos_admit.domain.signing import signature_valid
from kratos_admit.domain.workload import Workload
from kratos_admit.model.calibration import Calibration
from kratos_admit.model.catalog import Catalog


# Job fields that name containers or indexes the profiling run no longer has.
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


@functools.lru_cache(maxsize=1024)
def is_interpreter(path: str, interpreters: tuple[str, ...]) -> bool:
    """Whether ``path``'s file name is one of config ``interpreters``, a version suffix allowed:
    ``/usr/bin/python3.11`` matches ``python``, ``pypy3.10`` ``pypy``, ``node18`` ``node``. Cached:
    a cluster runs few distinct commands, and the admission path then pays a lookup."""
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


def can_profile(workload: Workload, target: ContainerGpus, config: Config) -> bool:
    """Whether ``profiling_plan`` finds a form for ``target``, without writing down why (the
    validating path only needs the answer)."""
    form = requested_form(workload.metadata.annotations, config)
    if form == "staged":
        return profiling_executable(workload, target) is not None
    if form == "in-image":
        return _wrappable(workload, target) is not None
    return profiling_executable(workload, target) is not None or _wrappable(workload, target) is not None


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
    form = requested_form(annotations, config)
    if form != "auto":
        asked = (
            f"the {v.PROFILING_FORM_ANNOTATION} annotation asks for it"
            if v.PROFILING_FORM_ANNOTATION in annotations
            else f"config profilingForm is {form}"
        )
        if form == "staged":
            return None if executable is None else ProfilingPlan(target, executable, (), asked)
        wrapped = _wrappable(workload, target)
        return None if wrapped is None else ProfilingPlan(target, None, wrapped, asked)
    if executable is not None and not is_interpreter(executable, config.interpreters):
        why = f"{executable} is an absolute executable, not an interpreter or launcher (config interpreters)"
        return ProfilingPlan(target, executable, (), why)
    wrapped = _wrappable(workload, target)
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
    target = candidates[0]
    if can_profile(workload, target, config):
        return []
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
    cluster (both factors qualify; the most runs behind the weaker one); before any qualifies, a
    product whose catalog figures are all measured and cited (the one with the most Nodes, where
    several are), else the product with the most Nodes. Empty when the cluster's products are
    unknown, or all its products have as many Nodes (a term naming them all would prefer nothing).

    Remembered for the inputs it was last asked with, by identity: the stores hand out the same
    objects until the cluster or the calibration changes, so the admission path pays five ``is``
    checks, not a hash of the catalog and the calibration."""
    inputs: tuple[object, ...] = (node_products, product_nodes, calibration, catalog, config)
    if _LAST_PROFILING_PRODUCTS:
        seen, answer = _LAST_PROFILING_PRODUCTS[0]
        if all(a is b for a, b in zip(seen, inputs, strict=True)):
            return answer
    result = _profiling_products(
        frozenset(node_products),
        tuple(product_nodes.items()),
        calibration=calibration,
        catalog=catalog,
        preferred=tuple(config.profiling_products),
        min_calibration_runs=config.min_calibration_runs,
    )
    _LAST_PROFILING_PRODUCTS[:] = [(inputs, result)]
    return result


_LAST_PROFILING_PRODUCTS: list[
    tuple[tuple[object, ...], tuple[str, ...]]
] = []  # the last call's inputs and answer


@functools.lru_cache(maxsize=256)
def _profiling_products(
    node_products: frozenset[str],
    product_nodes: tuple[tuple[str, int], ...],
    *,
    calibration: Calibration,
    catalog: Catalog,
    preferred: tuple[str, ...],
    min_calibration_runs: int,
) -> tuple[str, ...]:
    present = sorted(node_products)
    if preferred:
        chosen = [p for p in preferred if p in present] if present else []
        return tuple(chosen or preferred)
    if not present:
        return ()
    qualified: dict[str, int] = {}
    for label in present:
        entry = catalog.placement(label)
        found = calibration.get(entry.product) if entry is not None else None
        if found is not None and found.qualifies(min_calibration_runs):
            qualified[label] = found.runs
    if qualified:
        best = max(qualified.values())
        return tuple(label for label in present if qualified.get(label) == best)
    nodes = dict(product_nodes)
    measured = [label for label in present if catalog.measured_ground(label)]
    candidates = measured or present
    most = max(nodes.get(label, 0) for label in candidates)
    largest = tuple(label for label in candidates if nodes.get(label, 0) == most)
    return largest if len(largest) < len(present) else ()  # all alike: nothing to prefer
