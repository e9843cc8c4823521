"""The GPU product catalog: datasheet figures keyed by GPU Feature Discovery product strings."""

from __future__ import annotations

import re
from functools import cached_property
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kratos_admit.domain.manifests import ManifestError, parse_yaml

_CC = r"^[0-9]+\.[0-9]+$"
# GFD appends "-SHARED" under time-slicing/MPS and "-MIG-<profile>" under the MIG single strategy.
_SUFFIXES = re.compile(r"(-MIG-[0-9]+g\.[0-9]+gb(?:\.me)?)?(-SHARED)?$")
_MIG = re.compile(r"-MIG-(?P<profile>(?P<g>[0-9]+)g\.(?P<m>[0-9]+)gb(?:\.me)?)(?:-SHARED)?$")
_MIG_PROFILE = re.compile(r"^(?P<g>[0-9]+)g\.(?P<m>[0-9]+)gb(?:\.me)?$")

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
    "Hopper": 0.64,  # H200 42.56 of 67
    "Blackwell": 0.64,  # not measured here: 128 FP32 lanes per SM, as Hopper
}
BANDWIDTH_FACTOR: dict[str, float] = {
    "GDDR6": 0.94,  # A40 663 of 696, L40 803 of 864
    "HBM2": 0.88,  # A100-SXM4-40GB 1375 of 1555
    "HBM2e": 0.89,  # A100-SXM4-80GB 1759 of 2039, H100-PCIe 1832 of 2000
    "HBM3": 0.89,  # not measured here: taken as HBM2e
    "HBM3e": 0.74,  # H200 3534 of 4800
}
DEFAULT_FACTOR = 0.85  # an architecture or memory type this table does not know


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
    # published microbenchmark measurements, where they exist (each with its source)
    measured_fp32_tflops: float | None = Field(default=None, alias="measuredFp32Tflops", gt=0)
    measured_bandwidth_gbs: float | None = Field(default=None, alias="measuredBandwidthGBs", gt=0)
    measured_source: str | None = Field(default=None, alias="measuredSource")

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
                "memory_bandwidth_gbs": self.memory_bandwidth_gbs * memory,
                "measured_fp32_tflops": self.sustained_fp32_tflops * compute,
                "measured_bandwidth_gbs": self.sustained_bandwidth_gbs * memory,
                "sm_count": max(1, round(self.sm_count * compute)),
                "mig_profiles": (),
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
        text = resources.files("kratos_admit.domain").joinpath("data/gpu_catalog.yaml").read_text("utf-8")
        return _parse(text, "built-in catalog")
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise CatalogError(f"{path}: {exc.strerror}") from None
    return _parse(text, str(path))
