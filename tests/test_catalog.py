from __future__ import annotations

from pathlib import Path

import pytest

from kratos_admit.domain.catalog import CatalogError, base_product, load_catalog
from tests.harness import CATALOG

# Every product family DESIGN names, as GPU Feature Discovery writes it.
DESIGN_PRODUCTS = [
    "Tesla-T4",
    "Tesla-V100-SXM2-16GB",
    "Tesla-V100-PCIE-32GB",
    "NVIDIA-A10",
    "NVIDIA-A30",
    "NVIDIA-A40",
    "NVIDIA-A100-PCIE-40GB",
    "NVIDIA-A100-SXM4-40GB",
    "NVIDIA-A100-80GB-PCIe",
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-L4",
    "NVIDIA-L40",
    "NVIDIA-L40S",
    "NVIDIA-RTX-6000-Ada-Generation",
    "NVIDIA-H100-PCIe",
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-H100-NVL",
    "NVIDIA-H200",
    "NVIDIA-GH200-480GB",
    "NVIDIA-B200",
]


@pytest.mark.parametrize("product", DESIGN_PRODUCTS)
def test_catalog_covers_design_products(product):
    entry = CATALOG.lookup(product)
    assert entry is not None and entry.source
    assert (
        entry.memory_bandwidth_gbs > 0
        and entry.fp32_tflops > 0
        and entry.fp16_tensor_tflops > entry.fp32_tflops
    )


@pytest.mark.parametrize(
    ("label", "base"),
    [
        ("NVIDIA-L40S-SHARED", "NVIDIA-L40S"),
        ("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "NVIDIA-A100-SXM4-40GB"),
        ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb.me-SHARED", "NVIDIA-A100-SXM4-80GB"),
        ("Tesla-T4", "Tesla-T4"),
    ],
)
def test_gfd_suffixes_are_understood(label, base):
    assert base_product(label) == base
    assert CATALOG.lookup(label) is CATALOG.lookup(base)


def test_datasheet_figures_spot_check():
    a100 = CATALOG.lookup("NVIDIA-A100-SXM4-80GB")
    l40s = CATALOG.lookup("NVIDIA-L40S")
    assert a100 and l40s
    assert (a100.memory_bandwidth_gbs, a100.fp32_tflops, a100.sm_count, a100.compute_capability) == (
        2039,
        19.5,
        108,
        "8.0",
    )
    assert (l40s.memory_bandwidth_gbs, l40s.fp32_tflops, l40s.compute_capability) == (864, 91.6, "8.9")


def test_catalog_file_overrides_the_built_in(tmp_path: Path):
    path = tmp_path / "catalog.yaml"
    path.write_text(
        "products:\n- {product: X-GPU, architecture: Test, memoryGB: 8, memoryBandwidthGBs: 100, fp32Tflops: 1,"
        " fp16TensorTflops: 2, smCount: 4, computeCapability: '8.0', relativeCost: 0.1, source: test}\n"
    )
    catalog = load_catalog(path)
    assert [p.product for p in catalog.products] == ["X-GPU"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("products: [{product: X}]", "products.0.architecture"),
        ("products: [", "not valid YAML"),
        (
            "products:\n- {product: X-GPU, architecture: T, memoryGB: 8, memoryBandwidthGBs: 100, fp32Tflops: 1, fp16TensorTflops: 2, smCount: 4, computeCapability: 'eight', relativeCost: 0.1, source: t}",
            "computeCapability",
        ),
    ],
)
def test_bad_catalog_file_names_the_field(tmp_path: Path, text, message):
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=message):
        load_catalog(path)
