"""Gangs (DESIGN "Distributed training (gangs)"): which Jobs and Pods run as Pods or GPUs that wait for
each other, read from the object alone, and the hint that keeps a gang's Pods on one GPU product.

A gang is never profiled: NCCL's collectives wait for their peers and Nsight Compute serializes kernel
launches (NVIDIA/nccl#536), so its profiling run would hang, and a gang rewritten into one Pod waits at
its rendezvous for peers that never come. When the object cannot be read (an owner KRATOS does not
know, a launcher argument it cannot resolve, a GPU claim whose size it cannot see) it is a gang: a gang
treated as one Job is broken, a Job treated as a gang only loses its Nsight Compute profile.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.gpu_requests import PodGpus
from kratos_admit.domain.quantity import parse_positive_integer
from kratos_admit.domain.raw import as_list, as_mapping, child, string_map
from kratos_admit.domain.workload import Container, Workload

# the preferred inter-Pod affinity term's weight: as strong as the strongest product preference
GANG_AFFINITY_WEIGHT = 100


@dataclass(frozen=True, slots=True)
class Gang:
    """Why an object is a gang (for the hints record and the warning), the labels that select its
    Pods (empty: one Pod, or Pods KRATOS cannot name at admission) and, when it could not be read
    and is a gang by default, what could not be read."""

    why: str
    peers: tuple[tuple[str, str], ...] = ()
    doubt: str = ""
    gpus: int = 1  # GPUs per Pod
    # its Pods, where admission sees them all (an Indexed Job's parallelism, a lone Pod); None where
    # others come from elsewhere (a JobSet's other Jobs, a training operator's other Pods)
    pods: int | None = 1
    # each launcher whose counts disagree with the object's Pods and GPUs, in words naming both
    mismatches: tuple[str, ...] = ()

    @property
    def total_gpus(self) -> int:
        """The GPUs it runs on together, as far as admission sees: what sets its link on a product."""
        return self.gpus * (self.pods or 1)

    @property
    def across_nodes(self) -> bool:
        """Its Pods may run on several nodes, whose network no counter KRATOS reads measures."""
        return self.pods is None or self.pods > 1


def read_gang(workload: Workload, gpus: PodGpus) -> Gang | None:
    """The gang this Job or Pod is, or None when it runs alone (DESIGN "What is a gang")."""
    reasons: list[str] = []
    doubts: list[str] = []
    peers: dict[str, str] = {}
    meta = workload.metadata
    labels = meta.labels
    for ref in as_list(meta.raw.get("ownerReferences")):
        kind, name = str(as_mapping(ref).get("kind", "")), str(as_mapping(ref).get("name", ""))
        alone = v.JOB_OWNER_KINDS_ALONE if workload.kind == "Job" else v.POD_OWNER_KINDS_ALONE
        if kind in v.GANG_OWNER_KINDS:
            reasons.append(f"owned by {kind} {name}")
            if kind == "JobSet":
                peers.setdefault(v.JOBSET_NAME_LABEL, name)
        elif kind not in alone:
            doubts.append(f"owned by {kind or 'an owner without a kind'} {name}, which KRATOS does not know")
    for key in v.GANG_POD_LABELS:
        if labels.get(key):
            reasons.append(f"label {key}={labels[key]}")
            peers.setdefault(key, labels[key])
    if workload.kind == "Job":
        reasons += _job_reasons(workload, peers, doubts)
    else:
        index = labels.get(v.JOB_COMPLETION_INDEX) or meta.annotations.get(v.JOB_COMPLETION_INDEX)
        if index is not None:
            doubts.append("a Pod of an Indexed Job, whose parallelism a Pod does not show")
    subdomain = workload.pod_spec.get("subdomain")
    if isinstance(subdomain, str) and subdomain:
        reasons.append(f"its Pods have subdomain {subdomain}, by which they address each other")
    reasons += _gpu_reasons(gpus, doubts)
    for container in gpus.gpu_containers:
        found = launcher_reading(container.container)
        if found is not None:
            (reasons if not found[1] else doubts).append(found[0] or found[1])
    if not reasons and not doubts:
        return None
    elsewhere = bool(peers.keys() - {v.JOB_NAME_LABEL}) or any(
        str(as_mapping(ref).get("kind", "")) in v.GANG_OWNER_KINDS
        for ref in as_list(meta.raw.get("ownerReferences"))
    )
    pods = None if elsewhere else _pods(workload)
    return Gang(
        "; ".join(reasons + doubts),
        tuple(sorted(peers.items())),
        "; ".join(doubts) if not reasons else "",
        gpus=max(gpus.effective_gpus, 1),
        pods=pods,
        # a Pod some controller made is one of Pods admission does not see: only its own GPUs compare
        mismatches=tuple(
            launcher_mismatches(
                gpus,
                pods=pods if workload.kind == "Job" or not as_list(meta.raw.get("ownerReferences")) else None,
                kind=workload.kind,
            )
        ),
    )


def _pods(workload: Workload) -> int | None:
    """A Job's Pods that run at once (its parallelism; None where it cannot be read), a Pod's 1."""
    if workload.kind != "Job":
        indexed = (
            v.JOB_COMPLETION_INDEX in workload.metadata.labels
            or v.JOB_COMPLETION_INDEX in workload.metadata.annotations
        )
        return None if indexed else 1
    raw = as_mapping(workload.raw.get("spec")).get("parallelism", 1)
    return 1 if raw == 0 else parse_positive_integer(raw)


def _job_reasons(workload: Workload, peers: dict[str, str], doubts: list[str]) -> list[str]:
    """An Indexed Job whose Pods run at once; its Pods are named by the Job's name where it has more
    than one (a Job created with generateName has no name at admission: its Pods go unnamed)."""
    spec = as_mapping(workload.raw.get("spec"))
    raw_parallelism = spec.get("parallelism", 1)
    parallelism = 1 if raw_parallelism == 0 else parse_positive_integer(raw_parallelism)
    reasons: list[str] = []
    if parallelism is None:
        doubts.append(f"spec.parallelism {raw_parallelism!r} cannot be read")
    elif spec.get("completionMode") == "Indexed" and parallelism > 1:
        reasons.append(f"Indexed Job whose {parallelism} Pods run at once")
    name = str(workload.metadata.raw.get("name") or "")
    several = parallelism is None or parallelism > 1 or bool(workload.pod_spec.get("subdomain"))
    if name and several and not peers:
        peers[v.JOB_NAME_LABEL] = name
    return reasons


def _gpu_reasons(gpus: PodGpus, doubts: list[str]) -> list[str]:
    reasons: list[str] = []
    for found in gpus.gpu_containers:
        name = found.container.name or f"#{found.container.index}"
        if found.gpus > 1:
            reasons.append(f"{found.gpus} GPUs in container {name}")
        slices = sum(parse_positive_integer(q) or 0 for q in found.mig.values())
        if slices > 1:
            reasons.append(f"{slices} MIG devices in container {name}")
        if found.claims and not found.has_gpu_key and not found.mig:
            doubts.append(
                f"container {name} claims devices through Dynamic Resource Allocation ({', '.join(found.claims)}), "
                "whose count is in the ResourceClaim, which admission does not read"
            )
    devices = gpus.sharing.num_devices
    if gpus.sharing.requested and devices is not None and (parse_positive_integer(devices) or 0) > 1:
        reasons.append(f"KAI GPU sharing on {devices} devices")
    return reasons


# --- launchers: how many processes a command starts ------------------------------------------------

_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})
_KUBE_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
# (launcher, the flags that count its processes or nodes) as each launcher spells them
_COUNT_FLAGS: Mapping[str, tuple[str, ...]] = {
    "torchrun": ("--nnodes", "--nproc-per-node", "--nproc_per_node"),
    "mpirun": ("-np", "-n", "--np", "-c", "--n"),
    "deepspeed": ("--num_gpus", "--num-gpus", "--num_nodes", "--num-nodes"),
    "accelerate": ("--num_processes", "--num-processes", "--num_machines", "--num-machines"),
    "srun": ("-n", "--ntasks", "-N", "--nodes"),
}
_LAUNCHER_ALIASES: Mapping[str, str] = {
    "torchrun": "torchrun",
    "mpirun": "mpirun",
    "mpiexec": "mpirun",
    "horovodrun": "mpirun",
    "deepspeed": "deepspeed",
    "srun": "srun",
}
# flags that start peers on other hosts, or on every local GPU: a gang whatever the counts say
_GANG_FLAGS: Mapping[str, tuple[str, ...]] = {
    "deepspeed": ("--hostfile", "-H", "--include", "-i"),
    "accelerate": ("--multi_gpu", "--multi-gpu"),
    "mpirun": ("--hostfile", "-hostfile", "--host", "-H", "-host"),
}


def expand_kube_vars(value: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` in a command or argument, expanded from the container's literal ``env`` as the
    kubelet expands it; ``$$`` is a literal ``$``; an unknown variable stays as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _KUBE_VAR.sub(replace, value)


def container_argv(container: Container) -> list[str]:
    raw = container.raw
    env = {
        str(e.get("name")): str(e["value"])
        for e in (as_mapping(item) for item in as_list(raw.get("env")))
        if isinstance(e.get("value"), str)
    }
    words = [w for w in as_list(raw.get("command")) + as_list(raw.get("args")) if isinstance(w, str)]
    return [expand_kube_vars(w, env) for w in words]


def _shell_words(argv: Sequence[str]) -> list[str]:
    """The words of the command, with a shell's ``-c`` script split as the shell would (quotes,
    comments); a script shlex cannot split is split on white space."""
    if argv and posixpath.basename(argv[0]) in _SHELLS:
        for i, word in enumerate(argv[1:-1], start=1):
            if word.startswith("-") and "c" in word[1:] and not word.startswith("--"):
                script = argv[i + 1]
                try:
                    return shlex.split(script, comments=True)
                except ValueError:
                    return script.split()
    return list(argv)


def _launchers(words: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
    """Each launcher in the words, with the words after it."""
    for i, word in enumerate(words):
        base = posixpath.basename(word)
        rest = list(words[i + 1 :])
        if base in _LAUNCHER_ALIASES:
            yield _LAUNCHER_ALIASES[base], rest
        elif base.startswith("python") and rest[:1] == ["-m"] and rest[1:2] and rest[1] in _TORCHRUN_MODULES:
            yield "torchrun", rest[2:]
        elif base == "accelerate" and rest[:1] == ["launch"]:
            yield "accelerate", rest[1:]


def _flag_values(words: Sequence[str], flags: Sequence[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name in flags:
            if eq:
                found[name] = value
            elif i + 1 < len(words):
                found[name] = words[i + 1]
            else:
                found[name] = ""
    return found


def _count(value: str) -> int | None:
    """A process or node count as launchers write it: ``N``, or torchrun's ``MIN:MAX`` (the most)."""
    parts = value.split(":")
    numbers = [int(p) for p in parts if p.isdigit()]
    return max(numbers) if len(numbers) == len(parts) and numbers and len(parts) <= 2 else None


def launcher_reading(container: Container) -> tuple[str, str] | None:
    """(why it is a gang, "") when the container's command starts several processes or nodes, ("",
    what could not be read) when it names a launcher whose count KRATOS cannot read, None when it
    starts one process (or no launcher)."""
    for launcher, rest in _launchers(_shell_words(container_argv(container))):
        present = [f for f in _GANG_FLAGS.get(launcher, ()) if any(w.partition("=")[0] == f for w in rest)]
        if present:
            return f"{launcher} {present[0]} starts peers", ""
        values = _flag_values(rest, _COUNT_FLAGS[launcher])
        for flag, value in values.items():
            if launcher == "torchrun" and flag != "--nnodes" and value in ("gpu", "auto", "cpu"):
                continue  # one process per visible GPU: the container's GPU count decides
            count = _count(value)
            if count is None:
                return "", f"{launcher} {flag}={value or '(no value)'} cannot be read"
            if count > 1:
                return f"{launcher} {flag}={value}", ""
        if launcher == "mpirun" and not values:
            return "", "mpirun without -np starts as many processes as it has slots"
        if launcher == "accelerate" and not values:
            return "", "accelerate launch without --num_processes follows a config file admission cannot read"
    return None


# what each count flag counts: the nodes (one Pod each), the processes on each node (one per GPU), or
# the processes of the whole gang
_COUNTS: Mapping[str, str] = {
    "--nnodes": "nodes",
    "--num_nodes": "nodes",
    "--num-nodes": "nodes",
    "--num_machines": "nodes",
    "--num-machines": "nodes",
    "-N": "nodes",
    "--nodes": "nodes",
    "--nproc-per-node": "per-node",
    "--nproc_per_node": "per-node",
    "--num_gpus": "per-node",
    "--num-gpus": "per-node",
    "-np": "total",
    "-n": "total",
    "--np": "total",
    "-c": "total",
    "--n": "total",
    "--num_processes": "total",
    "--num-processes": "total",
    "--ntasks": "total",
}


def _count_range(value: str) -> tuple[int, int] | None:
    """``N``, or torchrun's elastic ``MIN:MAX``."""
    parts = value.split(":")
    if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[-1])


def launcher_mismatches(gpus: PodGpus, *, pods: int | None, kind: str) -> list[str]:
    """Each launcher (those ``launcher_reading`` reads) whose node or process counts are not what the
    object runs: its nodes against the Pods that run at once (where admission sees them all), its
    processes per node against the container's GPUs, its processes in all against Pods x GPUs. Such
    a rendezvous waits for peers that never come, or leaves GPUs idle."""
    found: list[str] = []
    for container in gpus.gpu_containers:
        if container.gpus < 1:
            continue  # MIG slices or a device claim: no count to compare
        name = container.container.name or f"#{container.container.index}"
        for launcher, rest in _launchers(_shell_words(container_argv(container.container))):
            said, ours = [], []
            for flag, value in _flag_values(rest, _COUNT_FLAGS[launcher]).items():
                counted, span = _COUNTS[flag], _count_range(value)
                expected = {
                    "nodes": pods,
                    "per-node": container.gpus,
                    "total": None if pods is None else pods * container.gpus,
                }[counted]
                if span is None or expected is None or span[0] <= expected <= span[1]:
                    continue
                said.append(f"{flag}={value}")
                ours.append(
                    f"{pods} Pod(s)"
                    if counted == "nodes"
                    else f"{container.gpus} GPU(s) in container {name}"
                    if counted == "per-node"
                    else f"{pods} Pod(s) x {container.gpus} GPU(s) = {expected}"
                )
            if said:
                found.append(
                    f"{launcher} {' '.join(said)} disagrees with the {kind}, which runs "
                    f"{' and '.join(dict.fromkeys(ours))}: its rendezvous waits for peers that never come, "
                    "or leaves GPUs idle; make the launcher's counts match the object's"
                )
    return found


def gang_affinity(pod_spec: dict[str, Any], gang: Gang) -> bool:
    """A preferred inter-Pod affinity on the GPU product: each Pod of the gang prefers the product its
    peers already run on, so the kube-scheduler keeps the gang on one product whenever it can (never a
    requirement: a gang never waits for KRATOS). Added once; the user's own terms stay."""
    if not gang.peers:
        return False
    affinity = child(pod_spec, "affinity")
    pod_affinity = child(affinity, "podAffinity")
    preferred = as_list(pod_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"))
    term = {
        "weight": GANG_AFFINITY_WEIGHT,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": dict(gang.peers)},
            "topologyKey": v.GPU_PRODUCT_LABEL,
        },
    }
    if term in preferred:
        return False
    pod_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [*preferred, term]
    return True


def label_gang_pods(obj: Mapping[str, Any], pod_meta: dict[str, Any]) -> bool:
    """A gang Job's Pods carry its workload label, so the controller's telemetry sees them while they
    run (the gang's profile comes from its own run, DESIGN "Telemetry profiles")."""
    workload = string_map(as_mapping(obj.get("metadata")).get("labels")).get(v.WORKLOAD_LABEL)
    labels = child(pod_meta, "labels")
    if workload is None or labels.get(v.WORKLOAD_LABEL):
        return False
    labels[v.WORKLOAD_LABEL] = workload
    return True
