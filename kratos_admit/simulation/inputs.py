"""The simulator's input files (DESIGN "Simulation"): the cluster's Nodes, the trace, the truth.

Each loader reads one file and returns the pure simulation's inputs, or raises ``SimFileError``
with one line naming the file, the field, what was found and what is expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import validated_document
from kratos_admit.domain.manifests import ManifestError, parse_yaml
from kratos_admit.domain.quantity import parse_positive_integer, parse_quantity
from kratos_admit.domain.raw import as_mapping, string_map
from kratos_admit.edge.files import StoreError, load_nodes
from kratos_admit.model.catalog import Catalog
from kratos_admit.simulation.scheduling import SimNode
from kratos_admit.simulation.trace import DEFAULT_PROFILING_SECONDS, Figures, Trace, TraceJob, Truth

# A Node file that states no CPU or memory (as --nodes files need not) gets a typical GPU server's.
DEFAULT_NODE_CPU = "64"
DEFAULT_NODE_MEMORY = "512Gi"
MAX_JOB_NAME = v.DNS1123_LABEL_MAX - len("-execution")


class SimFileError(ValueError):
    """A simulation input that cannot be used; one line naming the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _TraceJob(_Strict):
    name: str = Field(pattern=v.DNS1123_LABEL.pattern, max_length=MAX_JOB_NAME)
    workload: str = Field(pattern=v.DNS1123_LABEL.pattern, max_length=v.DNS1123_LABEL_MAX)
    arrival: float = Field(ge=0)
    gpus: int = Field(ge=1)  # per Pod
    pods: int = Field(default=1, ge=1)  # of its gang: all start together, on one product
    reference_product: str = Field(alias="referenceProduct")
    reference_seconds: float = Field(alias="referenceSeconds", gt=0)
    metrics: dict[str, str | float]

    @field_validator("metrics")
    @classmethod
    def _throughputs(cls, metrics: dict[str, str | float]) -> dict[str, str | float]:
        for key in ("smThroughput", "memoryThroughput"):
            if key not in metrics:
                raise ValueError(f"{key} is missing (percent of peak, 0 to 100)")
            try:
                value = float(metrics[key])
            except ValueError:
                raise ValueError(f"{key} is {metrics[key]!r}, not a number") from None
            if not 0 <= value <= 100:
                raise ValueError(f"{key} is {value}, expected a percentage from 0 to 100")
        return metrics

    time_shares: dict[str, str | float] | None = Field(default=None, alias="timeShares")

    @field_validator("time_shares")
    @classmethod
    def _units(cls, shares: dict[str, str | float] | None) -> dict[str, str | float] | None:
        if shares is None:
            return None
        total = 0.0
        for key, raw in shares.items():
            if key not in v.UNITS:
                raise ValueError(f"{key!r} is not a unit (expected {', '.join(v.UNITS)})")
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{key} is {raw!r}, not a number") from None
            if not value >= 0:
                raise ValueError(f"{key} is {value}, expected a fraction of the time, 0 or more")
            total += value
        if total <= 0:
            raise ValueError("the shares sum to 0; expected fractions of the GPU time summing to 1")
        return shares

    def unit_shares(self) -> dict[v.Unit, float] | None:
        """The time shares by unit, normalised to sum 1 (None: the trace gives only metrics)."""
        if self.time_shares is None:
            return None
        total = sum(float(x) for x in self.time_shares.values())
        return {
            u: float(self.time_shares.get(u, 0.0)) / total
            for u in v.UNITS
            if u != "interconnect" or u in self.time_shares  # unmeasured unless given
        }


class _Trace(_Strict):
    jobs: list[_TraceJob] = Field(min_length=1)
    profiling_seconds: float = Field(default=DEFAULT_PROFILING_SECONDS, alias="profilingSeconds", gt=0)


class _TruthProduct(_Strict):
    product: str
    sustained_fp32_tflops: float = Field(alias="sustainedFp32Tflops", gt=0)
    sustained_bandwidth_gbs: float = Field(alias="sustainedBandwidthGBs", gt=0)
    # optional: the catalog's sustained figure where absent
    sustained_tensor_tflops: float | None = Field(default=None, alias="sustainedTensorTflops", gt=0)
    sustained_fp64_tflops: float | None = Field(default=None, alias="sustainedFp64Tflops", gt=0)
    # a GPU's links, both ways (the catalog's where absent): what a gang's interconnect time moves over
    nvlink_gbs: float | None = Field(default=None, alias="nvlinkGBs", gt=0)
    pcie_gbs: float | None = Field(default=None, alias="pcieGBs", gt=0)


class _Truth(_Strict):
    products: list[_TruthProduct]


def _read(path: Path) -> Any:
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise SimFileError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SimFileError(f"{path}: not UTF-8 text") from None
    try:
        return parse_yaml(text, str(path))
    except ManifestError as exc:
        raise SimFileError(str(exc)) from None


def load_trace(path: Path, catalog: Catalog) -> Trace:
    parsed = validated_document(_Trace, _read(path), path, SimFileError, "expected a mapping at the top")
    names: set[str] = set()
    jobs = []
    for i, job in enumerate(parsed.jobs):
        if job.name in names:
            raise SimFileError(f"{path}: jobs[{i}].name: {job.name!r} appears twice; Job names are unique")
        names.add(job.name)
        if catalog.placement(job.reference_product) is None:
            raise SimFileError(
                f"{path}: jobs[{i}].referenceProduct: {job.reference_product!r} is not in the GPU catalog"
            )
        jobs.append(
            TraceJob(
                name=job.name,
                workload=job.workload,
                arrival=job.arrival,
                gpus=job.gpus,
                reference_product=job.reference_product,
                reference_seconds=job.reference_seconds,
                metrics={k: str(val) for k, val in job.metrics.items()},
                time_shares=job.unit_shares(),
                pods=job.pods,
            )
        )
    return Trace(
        jobs=tuple(sorted(jobs, key=lambda j: j.arrival)), profiling_seconds=parsed.profiling_seconds
    )


def _quantity(node: Mapping[str, Any], resource: str) -> object:
    status = as_mapping(node.get("status"))
    return as_mapping(status.get("allocatable")).get(
        resource, as_mapping(status.get("capacity")).get(resource)
    )


def load_cluster(path: Path, catalog: Catalog) -> list[SimNode]:
    if not path.is_file():
        raise SimFileError(f"{path}: no such file (expected Node YAML)")
    try:
        docs = load_nodes(path)
    except StoreError as exc:
        raise SimFileError(str(exc)) from None
    nodes = []
    for doc in docs:
        meta = as_mapping(doc.get("metadata"))
        name = str(meta.get("name", ""))
        labels = string_map(meta.get("labels"))
        gpus_raw = _quantity(doc, v.GPU_RESOURCE)
        product = labels.get(v.GPU_PRODUCT_LABEL)
        gpus = parse_positive_integer(gpus_raw) if gpus_raw not in (None, "0", 0) else 0
        cpu = parse_quantity(_quantity(doc, "cpu") or DEFAULT_NODE_CPU)
        memory = parse_quantity(_quantity(doc, "memory") or DEFAULT_NODE_MEMORY)
        if gpus is None or cpu is None or memory is None:
            raise SimFileError(
                f"{path}: Node {name}: status.allocatable: nvidia.com/gpu, cpu and memory must be "
                f"quantities (a whole number of GPUs), found nvidia.com/gpu {gpus_raw!r}"
            )
        if gpus and not product:
            raise SimFileError(f"{path}: Node {name}: has {gpus} GPUs but no {v.GPU_PRODUCT_LABEL} label")
        if product and catalog.placement(product) is None:
            raise SimFileError(
                f"{path}: Node {name}: {v.GPU_PRODUCT_LABEL} {product!r} is not in the GPU catalog "
                "(add it with catalogFile)"
            )
        nodes.append(
            SimNode(name=name, labels=labels, gpus=gpus, milli_cpu=int(cpu * 1000), memory_bytes=int(memory))
        )
    if not any(n.gpus for n in nodes):
        raise SimFileError(
            f"{path}: no Node with {v.GPU_RESOURCE} in status.capacity or status.allocatable; "
            "expected GPU Nodes labelled nvidia.com/gpu.product"
        )
    return nodes


def load_truth(path: Path | None, catalog: Catalog) -> Truth:
    """The truth file's figures by catalog product; without a file, the catalog is the truth."""
    if path is None:
        return Truth(catalog, {})
    parsed = validated_document(_Truth, _read(path), path, SimFileError, "expected a mapping at the top")
    figures: dict[str, Figures] = {}
    for i, entry in enumerate(parsed.products):
        known = catalog.lookup(entry.product)
        if known is None:
            raise SimFileError(f"{path}: products[{i}].product: {entry.product!r} is not in the GPU catalog")
        if entry.nvlink_gbs is not None and known.nvlink_gpus < 2:
            raise SimFileError(
                f"{path}: products[{i}].nvlinkGBs: the catalog gives {known.product} no NVLink domain "
                "(nvlinkGPUs): give it one with catalogFile, or leave nvlinkGBs out"
            )
        figures[known.product] = Figures(
            entry.sustained_fp32_tflops,
            entry.sustained_bandwidth_gbs,
            entry.sustained_tensor_tflops,
            entry.sustained_fp64_tflops,
            entry.nvlink_gbs,
            entry.pcie_gbs,
        )
    return Truth(catalog, figures)
