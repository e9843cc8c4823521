"""The GPU product catalog: datasheet figures keyed by GPU Feature Discovery product strings."""

from __future__ import annotations

import re
from functools import cached_property
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kratos_admit.manifests import ManifestError, parse_yaml

_CC = r"^[0-9]+\.[0-9]+$"
# GFD appends "-SHARED" under time-slicing/MPS and "-MIG-<profile>" under the MIG single strategy.
_SUFFIXES = re.compile(r"(-MIG-[0-9]+g\.[0-9]+gb(?:\.me)?)?(-SHARED)?$")


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


class CatalogFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    products: list[GpuProduct]


class CatalogError(ValueError):
    """The catalog file cannot be used; the message names the file and the bad entry."""


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
        text = resources.files("kratos_admit").joinpath("data/gpu_catalog.yaml").read_text("utf-8")
        return _parse(text, "built-in catalog")
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise CatalogError(f"{path}: {exc.strerror}") from None
    return _parse(text, str(path))
