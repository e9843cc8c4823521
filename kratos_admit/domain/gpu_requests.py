"""What GPUs a pod asks for, in every form: nvidia.com/gpu, MIG slices, KAI sharing, DRA claims."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.quantity import parse_positive_integer
from kratos_admit.domain.raw import as_list, as_mapping, is_mapping
from kratos_admit.domain.workload import Container, Workload


@dataclass(frozen=True, slots=True)
class ContainerGpus:
    container: Container
    gpus: int  # a valid nvidia.com/gpu limit, else 0
    has_gpu_key: bool  # nvidia.com/gpu named in limits or requests, valid or not
    mig: dict[str, object]  # MIG profile -> the quantity as written
    claims: tuple[str, ...]  # resources.claims names (Dynamic Resource Allocation)
    shared: bool  # the container KAI's gpu-fraction / gpu-memory applies to

    @property
    def requests_gpu(self) -> bool:
        return self.has_gpu_key or bool(self.mig) or bool(self.claims) or self.shared


@dataclass(frozen=True, slots=True)
class KaiSharing:
    fraction: str | None
    memory: str | None
    num_devices: str | None
    container_name: str | None

    @property
    def requested(self) -> bool:
        return self.fraction is not None or self.memory is not None


@dataclass(frozen=True, slots=True)
class PodGpus:
    containers: tuple[ContainerGpus, ...]
    sharing: KaiSharing

    @property
    def regular(self) -> tuple[ContainerGpus, ...]:
        return tuple(c for c in self.containers if not c.container.init)

    @property
    def effective_gpus(self) -> int:
        """What the scheduler reserves: max(largest init container, sum of containers)."""
        largest_init = max((c.gpus for c in self.containers if c.container.init), default=0)
        return max(largest_init, sum(c.gpus for c in self.regular))

    @property
    def any(self) -> bool:
        return self.sharing.requested or any(c.requests_gpu for c in self.containers)

    @property
    def gpu_containers(self) -> tuple[ContainerGpus, ...]:
        """Regular containers that use a GPU (the candidates for profiling)."""
        return tuple(c for c in self.regular if c.requests_gpu)


def resource_maps(container: Container) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    resources = as_mapping(container.raw.get("resources"))
    return as_mapping(resources.get("limits")), as_mapping(resources.get("requests"))


def mig_profile(resource: str) -> str | None:
    return resource[len(v.MIG_RESOURCE_PREFIX) :] if resource.startswith(v.MIG_RESOURCE_PREFIX) else None


def _kai_sharing(workload: Workload) -> KaiSharing:
    annotations = workload.pod_metadata.annotations
    return KaiSharing(
        fraction=annotations.get(v.KAI_FRACTION_ANNOTATION),
        memory=annotations.get(v.KAI_MEMORY_ANNOTATION),
        num_devices=annotations.get(v.KAI_NUM_DEVICES_ANNOTATION),
        container_name=annotations.get(v.KAI_CONTAINER_NAME_ANNOTATION),
    )


def _shared_target(workload: Workload, sharing: KaiSharing) -> Container | None:
    """KAI gives the shared GPU to the named container, else to the first container."""
    if not sharing.requested:
        return None
    if sharing.container_name is not None:
        return next((c for c in workload.all_containers() if c.name == sharing.container_name), None)
    return next(workload.containers(init=False), None)


def read_pod_gpus(workload: Workload) -> PodGpus:
    sharing = _kai_sharing(workload)
    target = _shared_target(workload, sharing)
    containers: list[ContainerGpus] = []
    for container in workload.all_containers():
        limits, requests = resource_maps(container)
        mig: dict[str, object] = {}
        for resources in (requests, limits):
            for name, value in resources.items():
                profile = mig_profile(name)
                if profile is not None:
                    mig[profile] = value
        claims = tuple(
            str(c.get("name"))
            for c in as_list(as_mapping(container.raw.get("resources")).get("claims"))
            if is_mapping(c)
        )
        containers.append(
            ContainerGpus(
                container=container,
                gpus=parse_positive_integer(limits.get(v.GPU_RESOURCE)) or 0,
                has_gpu_key=v.GPU_RESOURCE in limits or v.GPU_RESOURCE in requests,
                mig=mig,
                claims=claims,
                shared=target is not None and target.path == container.path,
            )
        )
    return PodGpus(tuple(containers), sharing)
