"""Partial, read-only views over the raw Job or Pod dict: where its pod spec and metadata blocks live.

The raw dict stays the truth (as in lightkube/kr8s): nothing here copies or re-serialises the object,
so fields this code does not know are never lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.fields import METADATA, ROOT, TEMPLATE, Path
from kratos_admit.domain.raw import as_list, as_mapping, string_map

Kind = Literal["Job", "Pod"]
ParentKind = Literal["CronJob", "Deployment"]


@dataclass(frozen=True, slots=True)
class MetadataBlock:
    """One metadata block that carries labels and annotations: the Job's, its pod template's, a Pod's."""

    path: Path
    raw: Mapping[str, Any]

    @property
    def labels(self) -> dict[str, str]:
        return string_map(self.raw.get("labels"))

    @property
    def annotations(self) -> dict[str, str]:
        return string_map(self.raw.get("annotations"))


@dataclass(frozen=True, slots=True)
class Container:
    """A container or init container, with its index in its list."""

    path: Path
    raw: Mapping[str, Any]
    index: int
    init: bool

    @property
    def name(self) -> str:
        name = self.raw.get("name")
        return name if isinstance(name, str) else ""

    @property
    def command(self) -> list[str]:
        return [c for c in as_list(self.raw.get("command")) if isinstance(c, str)]


class Workload:
    """A Job or a Pod, with the paths of the parts KRATOS reads (computed once per object)."""

    __slots__ = ("blocks", "kind", "metadata", "pod_metadata", "pod_spec", "pod_spec_path", "raw")

    def __init__(self, kind: Kind, raw: Mapping[str, Any]) -> None:
        self.kind = kind
        self.raw = raw
        self.metadata = MetadataBlock(METADATA, as_mapping(raw.get("metadata")))
        spec = as_mapping(raw.get("spec"))
        if kind == "Pod":
            self.pod_metadata = self.metadata
            self.pod_spec_path = ROOT.child("spec")
            self.pod_spec: Mapping[str, Any] = spec
            self.blocks: tuple[MetadataBlock, ...] = (self.metadata,)
        else:
            template = as_mapping(spec.get("template"))
            self.pod_metadata = MetadataBlock(
                TEMPLATE.child("metadata"), as_mapping(template.get("metadata"))
            )
            self.pod_spec_path = TEMPLATE.child("spec")
            self.pod_spec = as_mapping(template.get("spec"))
            self.blocks = (self.metadata, self.pod_metadata)

    @property
    def workload_label(self) -> str | None:
        return self.metadata.labels.get(v.WORKLOAD_LABEL)

    @property
    def kueue_queue(self) -> str:
        """The Kueue LocalQueue a Job names ("" when none): Kueue's ``QueueNameForObject``, the
        label first, then the deprecated annotation. Such a Job is Kueue's to start."""
        return kueue_queue(self.raw) if self.kind == "Job" else ""

    def containers(self, *, init: bool) -> Iterator[Container]:
        key = "initContainers" if init else "containers"
        base = self.pod_spec_path.child(key)
        for i, raw in enumerate(as_list(self.pod_spec.get(key))):
            yield Container(base.index(i), as_mapping(raw), i, init)

    def all_containers(self) -> Iterator[Container]:
        yield from self.containers(init=True)
        yield from self.containers(init=False)


def kueue_queue(job: Mapping[str, Any]) -> str:
    """The queue a Job names for Kueue, read as Kueue reads it (label, then the annotation)."""
    metadata = as_mapping(job.get("metadata"))
    label = as_mapping(metadata.get("labels")).get(v.KUEUE_QUEUE_LABEL)
    if isinstance(label, str) and label:
        return label
    annotation = as_mapping(metadata.get("annotations")).get(v.KUEUE_QUEUE_LABEL)
    return annotation if isinstance(annotation, str) else ""


def workload_kind(api_version: object, kind: object) -> Kind | None:
    """Only batch/v1 Jobs and v1 Pods are KRATOS workloads (a Volcano or Kubeflow "Job" is not)."""
    if kind == "Job" and api_version == "batch/v1":
        return "Job"
    if kind == "Pod" and api_version == "v1":
        return "Pod"
    return None
