"""Object builders for tests (Kueue's MakeJob style): readable tables of Jobs and Pods."""

from __future__ import annotations

import copy
import struct
from typing import Any, Self

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.simulation.scheduling import SimNode
from kratos_admit.simulation.trace import TraceJob

NAMESPACE = "team-a"


class _PodTemplateBuilder:
    """The setters a Job's pod template and a Pod share; subclasses say where the spec lives."""

    def __init__(self, api_version: str, kind: str, name: str, namespace: str, spec: dict[str, Any]) -> None:
        labels = {v.WORKLOAD_LABEL: name}
        self._obj: dict[str, Any] = {
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": spec,
        }

    def _template(self) -> dict[str, Any]:
        """The dict holding the pod's ``metadata`` and ``spec``: a Job's template, or the Pod."""
        return self._obj

    @property
    def pod_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self._template()["spec"]
        return spec

    @property
    def pod_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = self._template().setdefault("metadata", {})
        return meta

    def container(self, i: int = 0) -> dict[str, Any]:
        container: dict[str, Any] = self.pod_spec["containers"][i]
        return container

    def label(self, key: str, value: str) -> Self:
        self._obj["metadata"].setdefault("labels", {})[key] = value
        return self

    def unlabelled(self) -> Self:
        self._obj["metadata"]["labels"].pop(v.WORKLOAD_LABEL)
        return self

    def annotate(self, key: str, value: str) -> Self:
        self._obj["metadata"].setdefault("annotations", {})[key] = value
        return self

    def pod_annotate(self, key: str, value: str) -> Self:
        self.pod_meta.setdefault("annotations", {})[key] = value
        return self

    def limits(self, values: dict[str, Any], i: int = 0) -> Self:
        self.container(i).setdefault("resources", {})["limits"] = values
        return self

    def requests(self, values: dict[str, Any], i: int = 0) -> Self:
        self.container(i).setdefault("resources", {})["requests"] = values
        return self

    def no_resources(self, i: int = 0) -> Self:
        self.container(i).pop("resources", None)
        return self

    def command(self, *command: str, i: int = 0) -> Self:
        if command:
            self.container(i)["command"] = list(command)
        else:
            self.container(i).pop("command", None)
        return self

    def args(self, *args: str, i: int = 0) -> Self:
        self.container(i)["args"] = list(args)
        return self

    def add_container(self, name: str, limits: dict[str, Any] | None = None, *, init: bool = False) -> Self:
        container: dict[str, Any] = {"name": name, "image": "busybox:1.36", "command": ["/bin/true"]}
        if limits is not None:
            container["resources"] = {"limits": limits}
        self.pod_spec.setdefault("initContainers" if init else "containers", []).append(container)
        return self

    def dra_claim(self, name: str, template: str, i: int = 0) -> Self:
        """A GPU claimed through Dynamic Resource Allocation instead of nvidia.com/gpu."""
        self.pod_spec.setdefault("resourceClaims", []).append(
            {"name": name, "resourceClaimTemplateName": template}
        )
        self.container(i)["resources"] = {"claims": [{"name": name}]}
        return self

    def spec(self, **fields: Any) -> Self:
        self.pod_spec.update(fields)
        return self

    def obj(self) -> dict[str, Any]:
        """The object built so far (a copy: the builder can go on)."""
        return copy.deepcopy(self._obj)


def _vector_add() -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
        "command": ["/cuda-samples/vectorAdd"],
        "resources": {"limits": {v.GPU_RESOURCE: 1}},
    }
    return {"restartPolicy": "Never", "containers": [container]}


class JobBuilder(_PodTemplateBuilder):
    """A batch/v1 Job of the vectorAdd sample, labelled for KRATOS with its own name as workload."""

    def __init__(self, name: str, namespace: str = NAMESPACE) -> None:
        super().__init__("batch/v1", "Job", name, namespace, {"template": {"spec": _vector_add()}})

    def _template(self) -> dict[str, Any]:
        template: dict[str, Any] = self._obj["spec"]["template"]
        return template

    @classmethod
    def of(cls, job: dict[str, Any]) -> JobBuilder:
        """Go on building a Job made elsewhere (the webhook's rewrite, say); ``job`` is copied."""
        builder = cls(str(job["metadata"]["name"]))
        builder._obj = copy.deepcopy(job)
        return builder

    def job_spec(self, **fields: Any) -> Self:
        self._obj["spec"].update(fields)
        return self

    def finished(
        self,
        condition: str = "Complete",
        *,
        reason: str = "",
        message: str = "",
        at: str = "2026-11-22T10:03:00Z",
    ) -> Self:
        """The status the Job controller writes when the Job ends (``Complete`` or ``Failed``)."""
        ended = {
            "type": condition,
            "status": "True",
            "lastTransitionTime": at,
            "reason": reason,
            "message": message,
        }
        status: dict[str, Any] = {
            "conditions": [ended],
            "succeeded" if condition == "Complete" else "failed": 1,
        }
        if condition == "Complete":
            status["completionTime"] = at
        self._obj["status"] = status
        return self


class PodBuilder(_PodTemplateBuilder):
    """A v1 Pod of the vectorAdd sample, labelled for KRATOS with its own name as workload."""

    def __init__(self, name: str, namespace: str = NAMESPACE) -> None:
        super().__init__("v1", "Pod", name, namespace, _vector_add())

    def owned_by(self, kind: str, name: str, api_version: str = "apps/v1") -> Self:
        self._obj["metadata"]["ownerReferences"] = [
            {"apiVersion": api_version, "kind": kind, "name": name, "uid": f"uid-{name}", "controller": True}
        ]
        return self

    def ran(self, node: str, started: str, finished: str | None = None, *, exit_code: int = 0) -> Self:
        """Bound to ``node``, its first container started at ``started``: Running, or ended at
        ``finished`` (Succeeded with exit 0, else Failed), as the kubelet reports it."""
        self.pod_spec["nodeName"] = node
        self._obj["metadata"].setdefault("uid", f"uid-{self._obj['metadata']['name']}")
        name = self.container()["name"]
        if finished is None:
            state: dict[str, Any] = {"running": {"startedAt": started}}
            phase = "Running"
        else:
            state = {"terminated": {"exitCode": exit_code, "startedAt": started, "finishedAt": finished}}
            phase = "Succeeded" if exit_code == 0 else "Failed"
        self._obj["status"] = {
            "phase": phase,
            "startTime": started,
            "containerStatuses": [{"name": name, "ready": finished is None, "state": state}],
        }
        return self


def make_job(name: str = "vector-add", namespace: str = NAMESPACE) -> JobBuilder:
    return JobBuilder(name, namespace)


def make_pod(name: str = "vector-add", namespace: str = NAMESPACE) -> PodBuilder:
    return PodBuilder(name, namespace)


PYTORCH_IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"


def make_training_job(name: str = "train", namespace: str = NAMESPACE) -> JobBuilder:
    """A PyTorch-style training Job as people write it: the framework's image, a working directory,
    env (a value and a field reference), envFrom, a data volume, and stated resources; give it a
    ``command`` (and ``args``) to profile."""
    builder = make_job(name, namespace).spec(
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}]
    )
    builder.container().update(
        image=PYTORCH_IMAGE,
        imagePullPolicy="IfNotPresent",
        workingDir="/workspace",
        env=[
            {"name": "DATA_DIR", "value": "/data/imagenet"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        envFrom=[{"configMapRef": {"name": "train-config"}}],
        volumeMounts=[{"name": "data", "mountPath": "/data", "readOnly": True}],
        resources={
            "requests": {"cpu": "8", "memory": "32Gi"},
            "limits": {"memory": "32Gi", v.GPU_RESOURCE: 1},
        },
    )
    return builder


def llama_ddp() -> JobBuilder:
    """The issue's Indexed Job: 4 Pods x 8 GPUs that rendezvous through a headless Service."""
    return (
        make_job("llama-ddp")
        .command("torchrun")
        .args(
            "--nnodes=4",
            "--nproc-per-node=8",
            "--node-rank=$(JOB_COMPLETION_INDEX)",
            "--master-addr=llama-ddp-0.llama-ddp",
            "train.py",
        )
        .limits({v.GPU_RESOURCE: 8})
        .job_spec(completionMode="Indexed", completions=4, parallelism=4)
        .spec(subdomain="llama-ddp")
    )


def jobset_child() -> JobBuilder:
    """A child Job as the JobSet v0.11 controller creates it: owned by the JobSet, its labels, its
    Pods' subdomain the JobSet's name."""
    job = (
        make_job("llama-workers-0")
        .label(v.WORKLOAD_LABEL, "llama")
        .label(v.JOBSET_NAME_LABEL, "llama")
        .label("jobset.sigs.k8s.io/replicatedjob-name", "workers")
        .command("torchrun", "--nnodes=2", "--nproc-per-node=1", "train.py")
        .limits({v.GPU_RESOURCE: 1})
        .job_spec(completionMode="Indexed", completions=1, parallelism=1)
        .spec(subdomain="llama")
    )
    job._obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "name": "llama",
            "uid": "4f0c2b9e-0000-4000-8000-000000000001",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return job


def make_profile(
    workload: str = "vector-add",
    *,
    namespace: str = NAMESPACE,
    phase: str = "Ready",
    bound: str = "memory",
    sm: str | None = "12.56",
    mem: str | None = "81.40",
    product: str | None = "NVIDIA-H100-80GB-HBM3",
    message: str = "",
    resource_version: str = "7",
    runtime_class: str | None = None,
) -> WorkloadProfile:
    metrics = {k: val for k, val in {"smThroughput": sm, "memoryThroughput": mem}.items() if val is not None}
    spec: dict[str, Any] = {"workload": workload}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return WorkloadProfile.model_validate(
        {
            "apiVersion": "gpu.scheduler.io/v1alpha1",
            "kind": "WorkloadProfile",
            "metadata": {
                "name": f"{workload}-profile",
                "namespace": namespace,
                "resourceVersion": resource_version,
            },
            "spec": spec,
            "status": {
                "phase": phase,
                "boundType": bound,
                "metrics": metrics,
                "gpu": {"product": product} if product else {},
                "message": message,
            },
        }
    )


# --- simulation ------------------------------------------------------------------------------------

A100, L40S, L4, T4 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S", "NVIDIA-L4", "Tesla-T4"
# (SM %, memory %) on the A100 of workloads the calibration tests observe: memory-, compute-,
# latency-bound and in between
WORKLOAD_SHAPES: dict[str, tuple[float, float]] = {
    "stream": (8, 92),
    "spmv": (15, 84),
    "decode": (20, 88),
    "nbody": (90, 8),
    "pricing": (88, 5),
    "raytrace": (85, 25),
    "bfs": (25, 35),
    "infer": (30, 20),
}


def trace_job(
    name: str,
    *,
    workload: str | None = None,
    arrival: float = 0.0,
    gpus: int = 1,
    sm: float = 10.0,
    mem: float = 90.0,
    seconds: float = 600.0,
    reference: str = A100,
) -> TraceJob:
    """One trace entry: SM and memory throughput in percent of peak on ``reference``."""
    return TraceJob(
        name=name,
        workload=workload or name,
        arrival=arrival,
        gpus=gpus,
        reference_product=reference,
        reference_seconds=seconds,
        metrics={"smThroughput": f"{sm:.2f}", "memoryThroughput": f"{mem:.2f}"},
    )


def sim_node(name: str, product: str, *, gpus: int = 8, cpu: int = 96, memory_gib: int = 1024) -> SimNode:
    """A GPU Node as the scheduler model sees it."""
    return SimNode(
        name=name,
        labels={v.GPU_PRESENT_LABEL: "true", v.GPU_PRODUCT_LABEL: product, "kubernetes.io/hostname": name},
        gpus=gpus,
        milli_cpu=cpu * 1000,
        memory_bytes=memory_gib * 2**30,
    )


EM_X86_64, EM_AARCH64 = 62, 183  # ELF e_machine values (elf.h)


def elf_program(machine: int, interpreter: str | None = None, *, elf_type: int = 2) -> bytes:
    """A minimal 64-bit little-endian ELF file header (type ``elf_type``, 2 = executable) for
    ``machine``, with one ``PT_INTERP`` program header naming ``interpreter`` when given: what the kernel
    reads to decide whether, and with which dynamic loader, a program can start. It has no code."""
    interp = (interpreter.encode() + b"\0") if interpreter else b""
    phnum = 1 if interp else 0
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, version 1, System V
    header += struct.pack("<HHIQQQIHHHHHH", elf_type, machine, 1, 0, 64, 0, 0, 64, 56, phnum, 64, 0, 0)
    if not interp:
        return header
    program_header = struct.pack("<IIQQQQQQ", 3, 4, 64 + 56, 0, 0, len(interp), len(interp), 1)  # PT_INTERP
    return header + program_header + interp


def shares_profile(
    workload: str, shares: dict[str, str], *, product: str = "NVIDIA-A100-SXM4-80GB"
) -> WorkloadProfile:
    """A Ready profile whose GPU time goes where ``shares`` says (status.timeShares), measured on ``product``."""
    return WorkloadProfile.model_validate(
        {
            "apiVersion": "gpu.scheduler.io/v1alpha1",
            "kind": "WorkloadProfile",
            "metadata": {"name": f"{workload}-profile", "namespace": "ml-team", "resourceVersion": "3"},
            "spec": {"workload": workload},
            "status": {
                "phase": "Ready",
                "boundType": "compute",
                "metrics": {"smThroughput": "86.0", "memoryThroughput": "30.0"},
                "gpu": {"product": product},
                "timeShares": shares,
            },
        }
    )
