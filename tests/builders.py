"""Object builders for tests (Kueue's MakeJob style): readable tables of Jobs and Pods."""

from __future__ import annotations

import copy
from typing import Any

from kratos_admit import vocabulary as v
from kratos_admit.profile import WorkloadProfile

NAMESPACE = "team-a"


class PodSpecBuilder:
    def __init__(self, kind: str, name: str, namespace: str = NAMESPACE) -> None:
        self.kind = kind
        container = {
            "name": "main",
            "image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
            "command": ["/cuda-samples/vectorAdd"],
            "resources": {"limits": {v.GPU_RESOURCE: 1}},
        }
        pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
        if kind == "Job":
            self.obj: dict[str, Any] = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "namespace": namespace, "labels": {v.WORKLOAD_LABEL: name}},
                "spec": {"template": {"spec": pod_spec}},
            }
        else:
            self.obj = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": {v.WORKLOAD_LABEL: name}},
                "spec": pod_spec,
            }

    @property
    def pod_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = (
            self.obj["spec"]["template"]["spec"] if self.kind == "Job" else self.obj["spec"]
        )
        return spec

    @property
    def pod_meta(self) -> dict[str, Any]:
        template: dict[str, Any] = (
            self.obj["spec"]["template"] if self.kind == "Job" else {"metadata": self.obj["metadata"]}
        )
        meta: dict[str, Any] = template.setdefault("metadata", {})
        return meta

    def container(self, i: int = 0) -> dict[str, Any]:
        container: dict[str, Any] = self.pod_spec["containers"][i]
        return container

    def label(self, key: str, value: str) -> PodSpecBuilder:
        self.obj["metadata"].setdefault("labels", {})[key] = value
        return self

    def unlabelled(self) -> PodSpecBuilder:
        self.obj["metadata"]["labels"].pop(v.WORKLOAD_LABEL)
        return self

    def annotate(self, key: str, value: str) -> PodSpecBuilder:
        self.obj["metadata"].setdefault("annotations", {})[key] = value
        return self

    def pod_annotate(self, key: str, value: str) -> PodSpecBuilder:
        self.pod_meta.setdefault("annotations", {})[key] = value
        return self

    def limits(self, values: dict[str, Any], i: int = 0) -> PodSpecBuilder:
        self.container(i).setdefault("resources", {})["limits"] = values
        return self

    def requests(self, values: dict[str, Any], i: int = 0) -> PodSpecBuilder:
        self.container(i).setdefault("resources", {})["requests"] = values
        return self

    def no_resources(self, i: int = 0) -> PodSpecBuilder:
        self.container(i).pop("resources", None)
        return self

    def command(self, *command: str, i: int = 0) -> PodSpecBuilder:
        if command:
            self.container(i)["command"] = list(command)
        else:
            self.container(i).pop("command", None)
        return self

    def args(self, *args: str, i: int = 0) -> PodSpecBuilder:
        self.container(i)["args"] = list(args)
        return self

    def add_container(
        self, name: str, limits: dict[str, Any] | None = None, *, init: bool = False
    ) -> PodSpecBuilder:
        container: dict[str, Any] = {"name": name, "image": "busybox:1.36", "command": ["/bin/true"]}
        if limits is not None:
            container["resources"] = {"limits": limits}
        self.pod_spec.setdefault("initContainers" if init else "containers", []).append(container)
        return self

    def dra_claim(self, name: str, template: str, i: int = 0) -> PodSpecBuilder:
        """A GPU claimed through Dynamic Resource Allocation instead of nvidia.com/gpu."""
        self.pod_spec.setdefault("resourceClaims", []).append(
            {"name": name, "resourceClaimTemplateName": template}
        )
        self.container(i)["resources"] = {"claims": [{"name": name}]}
        return self

    def spec(self, **fields: Any) -> PodSpecBuilder:
        self.pod_spec.update(fields)
        return self

    def job_spec(self, **fields: Any) -> PodSpecBuilder:
        self.obj["spec"].update(fields)
        return self

    def build(self) -> dict[str, Any]:
        return copy.deepcopy(self.obj)


def make_job(name: str = "vector-add", namespace: str = NAMESPACE) -> PodSpecBuilder:
    return PodSpecBuilder("Job", name, namespace)


def make_pod(name: str = "vector-add", namespace: str = NAMESPACE) -> PodSpecBuilder:
    return PodSpecBuilder("Pod", name, namespace)


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
