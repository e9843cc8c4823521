"""The GPU product catalog: datasheet figures keyed by GPU Feature Discovery product strings."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kratos_admit.domain.manifests import ManifestError, parse_yaml
from kratos_admit.domain.vocabulary import Unit

_CC = r"^[0-9]+\.[0-9]+$"
# GFD appends "-SHARED" under time-slicing/MPS and "-MIG-<profile>" under the MIG single strategy.
_SUFFIXES = re.compile(r"(-MIG-[0-9]+g\.[0-9]+gb(?:\.me)?)?(-SHARED)?$")
_MIG = re.compile(r"-MIG-(?P<profile>(?P<g>[0-9]+)g\.(?P<m>[0-9]+)gb(?:\.me)?)(?:-SHARED)?$")
_MIG_PROFILE = re.compile(r"^(?P<g>[0-9]+)g\.(?P<m>[0-9]+)gb(?:\.me)?$")
LinkKind = Literal["NVLink", "PCIe"]

# Kernels do not reach datasheet peaks. Where no measurement of a product is published, its
# sustained figure is the datasheet's times the factor of its architecture (FP32) or memory type
# (bandwidth), each derived from the measured products of that kind (docs/ranking.md shows the
# derivation and every source: te42kyfo/gpu-benches' gpu-roofline and gpu-stream results). SMs
# with 128 FP32 lanes (GA10x, Ada, Hopper, Blackwell) need an FFMA issued every cycle of every
# scheduler to reach the datasheet figure and sustain 44-64 % of it; SMs with 64 (GA100, Volta,
# Turing) leave issue slots free and sustain nearly all of it. HBM3e parts reach a smaller share
# of their bandwidth (74 % on H200) than HBM2/HBM2e (86-92 %) or GDDR6 (93-95 %) ones.
FP32_FACTOR: dict[str, float] = {
    "Turing": 0.95,  # not measured here: 64 FP32 lanes per SM, as GA100 (assumed a little below it)
    "Volta": 0.95,  # not measured here: as Turing
    "Ampere": 0.98,  # GA100: A100-SXM4-40GB 19.19 of 19.5
    "Ampere GA10x": 0.63,  # A40 23.61 of 37.4
    "Ada Lovelace": 0.44,  # L40 39.73 of 90.5 (at the 1740 MHz it held under load)
    # H200 42.56 of 67; an FP32 FMA loop measured for kratos on an H100 80GB HBM3 reached 56.2 of 67
    # (0.84): that product carries its own measurement, the others keep the gpu-roofline share
    "Hopper": 0.64,
    "Blackwell": 0.64,  # not measured here: 128 FP32 lanes per SM, as Hopper
}
BANDWIDTH_FACTOR: dict[str, float] = {
    "GDDR6": 0.94,  # A40 663 of 696, L40 803 of 864
    "HBM2": 0.88,  # A100-SXM4-40GB 1375 of 1555
    "HBM2e": 0.89,  # A100-SXM4-80GB 1759 of 2039, H100-PCIe 1832 of 2000
    "HBM3": 0.83,  # H100 80GB HBM3: STREAM triad 2767 of 3350 (measured for kratos)
    "HBM3e": 0.74,  # H200 3534 of 4800
}
# Dense FP16/BF16 tensor-core throughput: one measurement, the H100's bf16 GEMM (789 of its 989
# TFLOP/s, measured on an H100 80GB HBM3, PyTorch 8192^3 bf16 matmul, without Nsight Compute); its
# TF32 GEMM reached the same share of its TF32 peak (422 of 494.5, 0.85). Every other architecture is
# assumed to reach the same share: cuBLAS GEMMs keep the tensor cores as busy on each of them, but no
# measurement of another one is cited here.
TENSOR_FACTOR: dict[str, float] = {
    "Turing": 0.80,  # assumed as Hopper
    "Volta": 0.80,  # assumed as Hopper
    "Ampere": 0.80,  # assumed as Hopper
    "Ampere GA10x": 0.80,  # assumed as Hopper
    "Ada Lovelace": 0.80,  # assumed as Hopper
    "Hopper": 0.80,  # H100 80GB HBM3: bf16 GEMM 789 of 989
    "Blackwell": 0.80,  # assumed as Hopper
}
# FP64 (on the FP64 tensor cores where a product has them, else on its FP64 CUDA cores): one
# measurement, the H100's FP64 GEMM (62.1 of its 67 FP64 tensor TFLOP/s, PyTorch float64 matmul).
# A DGEMM keeps the FP64 pipe as busy wherever it runs, so every architecture is assumed to reach
# the same share; on Ada, GA10x and Turing, with 2 FP64 units per SM, any FP64 work is bound by them.
FP64_FACTOR: dict[str, float] = {
    "Turing": 0.93,  # assumed as Hopper
    "Volta": 0.93,  # assumed as Hopper
    "Ampere": 0.93,  # assumed as Hopper (FP64 tensor cores, as the H100's)
    "Ampere GA10x": 0.93,  # assumed as Hopper
    "Ada Lovelace": 0.93,  # assumed as Hopper
    "Hopper": 0.93,  # H100 80GB HBM3: FP64 GEMM 62.1 of 67
    "Blackwell": 0.93,  # assumed as Hopper
}
DEFAULT_FACTOR = 0.85  # an architecture or memory type this table does not know
# A PCIe x16 link's bandwidth, both directions together, as NVIDIA's datasheets print it: Gen3 "16*2 =
# 32 GB/s" (V100), Gen4 "PCIe Gen4 x16: 64GB/s bidirectional" (L40, L40S, A40), Gen5 128 GB/s (H100).
PCIE_X16_GBS: dict[int, float] = {3: 32.0, 4: 64.0, 5: 128.0}
# the field that holds each unit's measured (or calibrated) sustained figure
MEASURED_FIELD: dict[Unit, str] = {
    "tensor": "measured_tensor_tflops",
    "fp32": "measured_fp32_tflops",
    "fp64": "measured_fp64_tflops",
    "memory": "measured_bandwidth_gbs",
}


@dataclass(frozen=True, slots=True)
class Link:
    """A link between GPUs: its kind, bandwidth (GB/s, both directions together) and generation."""

    kind: LinkKind
    gbs: float
    generation: int | None = None

    @property
    def name(self) -> str:
        """As the vendor names it: ``NVLink 4``, ``PCIe Gen5``."""
        if not self.generation:
            return self.kind
        return (
            f"{self.kind} Gen{self.generation}" if self.kind == "PCIe" else f"{self.kind} {self.generation}"
        )

    def __str__(self) -> str:
        return f"{self.name} {self.gbs:g} GB/s"


class GpuProduct(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    product: str
    aliases: tuple[str, ...] = ()
    architecture: str
    memory_gb: float = Field(alias="memoryGB", gt=0)
    memory_bandwidth_gbs: float = Field(alias="memoryBandwidthGBs", gt=0)
    fp32_tflops: float = Field(alias="fp32Tflops", gt=0)
    fp16_tensor_tflops: float = Field(alias="fp16TensorTflops", gt=0)
    sm_count: int = Field(alias="smCount", gt=0)
    compute_capability: str = Field(alias="computeCapability", pattern=_CC)
    relative_cost: float = Field(alias="relativeCost", gt=0)
    mig_profiles: tuple[str, ...] = Field(default=(), alias="migProfiles")
    source: str
    memory_type: str = Field(default="", alias="memoryType")
    # FP64 on the CUDA cores (the datasheet's, or its stated fraction of FP32 where it prints none)
    fp64_tflops: float = Field(alias="fp64Tflops", gt=0)
    # FP64 on the tensor cores: only the products that have them (GA100, GH100, GB100 class)
    fp64_tensor_tflops: float | None = Field(default=None, alias="fp64TensorTflops", gt=0)
    # published microbenchmark measurements, where they exist (each with its source)
    measured_fp32_tflops: float | None = Field(default=None, alias="measuredFp32Tflops", gt=0)
    measured_bandwidth_gbs: float | None = Field(default=None, alias="measuredBandwidthGBs", gt=0)
    measured_tensor_tflops: float | None = Field(default=None, alias="measuredTensorTflops", gt=0)
    measured_fp64_tflops: float | None = Field(default=None, alias="measuredFp64Tflops", gt=0)
    measured_source: str | None = Field(default=None, alias="measuredSource")
    # links (DESIGN "The interconnect"): NVLink per GPU, both directions, and how many GPUs one NVLink
    # domain joins (8 over an HGX board's NVSwitches, 2 over a bridge); the PCIe host link
    nvlink_generation: int | None = Field(default=None, alias="nvlinkGeneration", gt=0)
    nvlink_gbs: float | None = Field(default=None, alias="nvlinkGBs", gt=0)
    nvlink_gpus: int = Field(default=0, alias="nvlinkGPUs", ge=0)
    pcie_generation: int | None = Field(default=None, alias="pcieGeneration", ge=1)
    pcie_gbs: float | None = Field(default=None, alias="pcieGBs", gt=0)  # x16, both ways; else by generation
    link_source: str = Field(default="", alias="linkSource")

    @model_validator(mode="after")
    def _links_whole(self) -> GpuProduct:
        if self.nvlink_gbs is not None and self.nvlink_gpus < 2:
            raise ValueError("nvlinkGBs needs nvlinkGPUs (at least 2): how many GPUs one NVLink domain joins")
        if (
            self.pcie_gbs is None
            and self.pcie_generation is not None
            and self.pcie_generation not in PCIE_X16_GBS
        ):
            raise ValueError(
                f"pcieGeneration {self.pcie_generation} has no known x16 bandwidth: give pcieGBs"
            )
        return self

    @property
    def pcie_bandwidth_gbs(self) -> float | None:
        """The PCIe x16 host link's bandwidth, both directions: ``pcieGBs``, else by its generation."""
        if self.pcie_gbs is not None:
            return self.pcie_gbs
        return PCIE_X16_GBS.get(self.pcie_generation) if self.pcie_generation is not None else None

    def link(self, gpus: int) -> Link | None:
        """The link a workload on ``gpus`` GPUs moves its data over on this product: NVLink where they
        all fit one NVLink domain of it (inside one node), else PCIe (between cards without a bridge,
        and to the network); None on one GPU, or where the catalog has no figure for that link."""
        if gpus <= 1:
            return None
        if self.nvlink_gbs is not None and gpus <= self.nvlink_gpus:
            return Link("NVLink", self.nvlink_gbs, self.nvlink_generation)
        pcie = self.pcie_bandwidth_gbs
        return Link("PCIe", pcie, self.pcie_generation) if pcie is not None else None

    @model_validator(mode="after")
    def _measurements_cited(self) -> GpuProduct:
        measured = (
            self.measured_fp32_tflops,
            self.measured_bandwidth_gbs,
            self.measured_tensor_tflops,
            self.measured_fp64_tflops,
        )
        if any(m is not None for m in measured) and not self.measured_source:
            raise ValueError("a measured figure needs measuredSource: where it was measured")
        return self

    @property
    def sustained_fp32_tflops(self) -> float:
        """What kernels reach: the measurement, else the datasheet times its architecture's factor."""
        if self.measured_fp32_tflops is not None:
            return self.measured_fp32_tflops
        return self.fp32_tflops * FP32_FACTOR.get(self.architecture, DEFAULT_FACTOR)

    @property
    def sustained_bandwidth_gbs(self) -> float:
        if self.measured_bandwidth_gbs is not None:
            return self.measured_bandwidth_gbs
        return self.memory_bandwidth_gbs * BANDWIDTH_FACTOR.get(self.memory_type, DEFAULT_FACTOR)

    @property
    def sustained_tensor_tflops(self) -> float:
        """Dense FP16/BF16 tensor-core throughput kernels reach: the measurement, else the datasheet
        times its architecture's factor."""
        if self.measured_tensor_tflops is not None:
            return self.measured_tensor_tflops
        return self.fp16_tensor_tflops * TENSOR_FACTOR.get(self.architecture, DEFAULT_FACTOR)

    @property
    def sustained_fp64_tflops(self) -> float:
        """FP64 throughput kernels reach: on the FP64 tensor cores where the product has them, else on
        its FP64 CUDA cores; the measurement, else the datasheet times its architecture's factor."""
        if self.measured_fp64_tflops is not None:
            return self.measured_fp64_tflops
        peak = self.fp64_tensor_tflops if self.fp64_tensor_tflops is not None else self.fp64_tflops
        return peak * FP64_FACTOR.get(self.architecture, DEFAULT_FACTOR)

    def sustained(self, unit: Unit) -> float | None:
        """The sustained figure that scales ``unit``'s time: TFLOP/s for tensor, fp32 and fp64, GB/s
        for memory; None for latency, whose time no figure scales."""
        if unit == "tensor":
            return self.sustained_tensor_tflops
        if unit == "fp32":
            return self.sustained_fp32_tflops
        if unit == "fp64":
            return self.sustained_fp64_tflops
        if unit == "memory":
            return self.sustained_bandwidth_gbs
        return None

    def measured(self, unit: Unit) -> bool:
        """Whether this entry's sustained figure for ``unit`` is a cited measurement (else the
        datasheet times its architecture's factor). Read it on the catalog's own entry: a calibrated
        copy (``with_sustained``) carries the cluster's figures in the same fields."""
        field = MEASURED_FIELD.get(unit)
        return field is not None and getattr(self, field) is not None

    @property
    def fully_measured(self) -> bool:
        """Every unit's sustained figure is a cited measurement: a profile measured here is converted
        with figures known to be true (the H100 80GB HBM3's, today)."""
        return all(self.measured(unit) for unit in MEASURED_FIELD)

    def with_sustained(self, figures: Mapping[Unit, float]) -> GpuProduct:
        """This product with these sustained figures in place of its own (a calibration's, a re-fit's);
        the units not named keep theirs, and latency has none."""
        return self.model_copy(
            update={MEASURED_FIELD[unit]: value for unit, value in figures.items() if unit in MEASURED_FIELD}
        )

    def mig_slice(self, profile: str) -> GpuProduct | None:
        """The share of this GPU a MIG instance of ``profile`` gets: ``<g>g`` of its compute slices and
        ``<m>gb`` of its memory (and so of its bandwidth), from its largest profile; None when this
        product has no such profile."""
        match = _MIG_PROFILE.match(profile)
        if match is None or profile not in self.mig_profiles:
            return None
        whole = [m for p in self.mig_profiles if (m := _MIG_PROFILE.match(p))]
        compute = int(match["g"]) / max(int(m["g"]) for m in whole)
        memory = int(match["m"]) / max(int(m["m"]) for m in whole)
        return self.model_copy(
            update={
                "product": f"{self.product}-MIG-{profile}",
                "aliases": (),
                "memory_gb": float(match["m"]),
                "fp32_tflops": self.fp32_tflops * compute,
                "fp16_tensor_tflops": self.fp16_tensor_tflops * compute,
                "fp64_tflops": self.fp64_tflops * compute,
                "fp64_tensor_tflops": None
                if self.fp64_tensor_tflops is None
                else self.fp64_tensor_tflops * compute,
                "memory_bandwidth_gbs": self.memory_bandwidth_gbs * memory,
                "measured_fp32_tflops": self.sustained_fp32_tflops * compute,
                "measured_bandwidth_gbs": self.sustained_bandwidth_gbs * memory,
                "measured_tensor_tflops": self.sustained_tensor_tflops * compute,
                "measured_fp64_tflops": self.sustained_fp64_tflops * compute,
                "sm_count": max(1, round(self.sm_count * compute)),
                "mig_profiles": (),
                "nvlink_gbs": None,  # a MIG instance has no NVLink to another GPU (no peer-to-peer)
                "nvlink_gpus": 0,
            }
        )


class CatalogFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    products: list[GpuProduct]


class CatalogError(ValueError):
    """The catalog file cannot be used; the message names the file and the bad entry."""


def mig_profile_of(product: str) -> str | None:
    """The MIG profile in a GPU Feature Discovery product string (``...-MIG-1g.10gb``), if any."""
    match = _MIG.search(product)
    return match["profile"] if match else None


def base_product(product: str) -> str:
    """The product string without the -SHARED / -MIG-<profile> suffixes GPU Feature Discovery adds."""
    return _SUFFIXES.sub("", product)


class Catalog:
    def __init__(self, products: list[GpuProduct]) -> None:
        self.products = tuple(products)
        self._by_name: dict[str, GpuProduct] = {}
        for p in products:
            for name in (p.product, *p.aliases):
                self._by_name[name.lower()] = p

    def lookup(self, product: str) -> GpuProduct | None:
        """The catalog entry for a node's product string, or None when the catalog does not know it."""
        return self._by_name.get(product.lower()) or self._by_name.get(base_product(product).lower())

    def placement(self, product: str) -> GpuProduct | None:
        """What a node with this product label offers a pod: the whole GPU, or for a MIG-partitioned
        node (``-MIG-<profile>``) the slice's share of it, never the whole GPU."""
        entry = self.lookup(product)
        profile = mig_profile_of(product)
        if entry is None or profile is None:
            return entry
        return entry.mig_slice(profile)

    def measured_ground(self, label: str) -> bool:
        """A node label naming a whole, unshared GPU whose every catalog figure is a cited measurement:
        a profile measured there is converted with figures known to be right before any calibration
        exists. A MIG slice's figures are shares of its GPU's, and a time-sliced (``-SHARED``) GPU's
        run is not its own."""
        entry = self.lookup(label)
        return entry is not None and entry.fully_measured and base_product(label) == label

    @cached_property
    def mig_profiles(self) -> frozenset[str]:
        return frozenset(m for p in self.products for m in p.mig_profiles)


def _parse(text: str, origin: str) -> Catalog:
    try:
        data = parse_yaml(text, origin)
        return Catalog(CatalogFile.model_validate(data).products)
    except ManifestError as exc:
        raise CatalogError(str(exc)) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CatalogError(f"{origin}: {where}: {first['msg']}") from None


def load_catalog(path: Path | None = None) -> Catalog:
    """The built-in catalog, or the file that replaces it."""
    if path is None:
        text = resources.files("kratos_admit.model").joinpath("data/gpu_catalog.yaml").read_text("utf-8")
        return _parse(text, "built-in catalog")
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise CatalogError(f"{path}: {exc.strerror}") from None
    return _parse(text, str(path))
