from __future__ import annotations

from pathlib import Path

import pytest

from kratos_admit.model.catalog import FP64_FACTOR, TENSOR_FACTOR, CatalogError, base_product, load_catalog
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
        " fp16TensorTflops: 2, fp64Tflops: 0.5, smCount: 4, computeCapability: '8.0', relativeCost: 0.1,"
        " source: test}\n"
    )
    catalog = load_catalog(path)
    assert [p.product for p in catalog.products] == ["X-GPU"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("products: [{product: X}]", "products.0.architecture"),
        ("products: [", "not valid YAML"),
        (
            "products:\n- {product: X-GPU, architecture: T, memoryGB: 8, memoryBandwidthGBs: 100, fp32Tflops: 1, fp16TensorTflops: 2, fp64Tflops: 1, smCount: 4, computeCapability: 'eight', relativeCost: 0.1, source: t}",
            "computeCapability",
        ),
        (
            "products:\n- {product: X-GPU, architecture: T, memoryGB: 8, memoryBandwidthGBs: 100, fp32Tflops: 1, fp16TensorTflops: 2, smCount: 4, computeCapability: '8.0', relativeCost: 0.1, source: t}",
            "products.0.fp64Tflops: Field required",
        ),
        (
            "products:\n- {product: X-GPU, architecture: T, memoryGB: 8, memoryBandwidthGBs: 100, fp32Tflops: 1, fp16TensorTflops: 2, fp64Tflops: 1, measuredFp64Tflops: 0.9, smCount: 4, computeCapability: '8.0', relativeCost: 0.1, source: t}",
            "a measured figure needs measuredSource",
        ),
    ],
)
def test_bad_catalog_file_names_the_field(tmp_path: Path, text, message):
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=message):
        load_catalog(path)


# --- every unit (issue 43): FP64, FP64 tensor cores, sustained tensor and FP64 figures --------------

# the products with FP64 tensor cores (GA100, GH100, GB100 class), as the catalog names them
FP64_TENSOR = {
    "NVIDIA-A30",
    "NVIDIA-A100-PCIE-40GB",
    "NVIDIA-A100-SXM4-40GB",
    "NVIDIA-A100-80GB-PCIe",
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-H100-PCIe",
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-H100-NVL",
    "NVIDIA-H200",
    "NVIDIA-H200-NVL",
    "NVIDIA-GH200-480GB",
    "NVIDIA-GH200-144G-HBM3e",
    "NVIDIA-B200",
}
H100 = "NVIDIA-H100-80GB-HBM3"


def test_every_product_has_fp64_and_only_fp64_tensor_core_products_have_fp64_tensor_figures():
    for entry in CATALOG.products:
        assert entry.fp64_tflops > 0, entry.product
        for unit in ("tensor", "fp32", "fp64", "memory"):
            figure = entry.sustained(unit)
            assert figure is not None and figure > 0, (entry.product, unit)
        assert entry.sustained("latency") is None
    assert {p.product for p in CATALOG.products if p.fp64_tensor_tflops is not None} == FP64_TENSOR


@pytest.mark.parametrize(
    ("architecture", "fraction"),
    [("Ada Lovelace", 1 / 64), ("Ampere GA10x", 1 / 32), ("Turing", 1 / 32), ("Volta", 1 / 2)],
)
def test_fp64_on_cuda_core_parts_is_their_architectures_fraction_of_fp32(architecture, fraction):
    entries = [p for p in CATALOG.products if p.architecture == architecture]
    assert entries
    for entry in entries:
        assert entry.fp64_tflops == pytest.approx(entry.fp32_tflops * fraction, rel=0.03), entry.product
        assert entry.fp64_tensor_tflops is None


def test_fp64_tensor_cores_run_fp64_at_the_fp32_rate_or_twice_the_cuda_cores():
    for name in FP64_TENSOR:
        entry = CATALOG.lookup(name)
        assert entry is not None and entry.fp64_tensor_tflops is not None
        assert entry.fp64_tensor_tflops >= entry.fp64_tflops
        assert entry.sustained_fp64_tflops > entry.fp64_tflops * 0.9  # the tensor cores' figure is used


def test_the_h100s_measured_figures_are_its_sustained_figures_and_cited():
    entry = CATALOG.lookup(H100)
    assert entry is not None and entry.measured_source
    assert "H100 80GB HBM3" in entry.measured_source and "Nsight Compute 2025.3.1" in entry.measured_source
    assert (
        entry.sustained("tensor"),
        entry.sustained("fp32"),
        entry.sustained("fp64"),
        entry.sustained("memory"),
    ) == (
        789,
        56.2,
        62.1,
        2767,
    )


def test_unmeasured_figures_are_the_datasheets_times_the_architectures_factor():
    a10 = CATALOG.lookup("NVIDIA-A10")
    assert a10 is not None and a10.measured_tensor_tflops is None and a10.measured_fp64_tflops is None
    assert a10.sustained_tensor_tflops == pytest.approx(125 * TENSOR_FACTOR["Ampere GA10x"])
    assert a10.sustained_fp64_tflops == pytest.approx(a10.fp64_tflops * FP64_FACTOR["Ampere GA10x"])
    a100 = CATALOG.lookup("NVIDIA-A100-SXM4-80GB")
    assert a100 is not None  # FP64 on its tensor cores, not its CUDA cores
    assert a100.sustained_fp64_tflops == pytest.approx(19.5 * FP64_FACTOR["Ampere"])
    # the Hopper factors are the H100's measurements over its datasheet
    assert TENSOR_FACTOR["Hopper"] == pytest.approx(789 / 989, abs=0.01)
    assert FP64_FACTOR["Hopper"] == pytest.approx(62.1 / 67, abs=0.01)


@pytest.mark.parametrize("product", ["NVIDIA-L40S", "NVIDIA-A10", "NVIDIA-L4", "NVIDIA-A100-SXM4-80GB"])
def test_products_are_keyed_as_gpu_feature_discovery_writes_them(product):
    """GFD writes the NVML name with its spaces as dashes: "NVIDIA L40S" becomes NVIDIA-L40S."""
    entry = CATALOG.lookup(product)
    assert entry is not None and entry.product == product


def test_a_mig_slice_gets_its_share_of_every_units_figure():
    whole = CATALOG.lookup("NVIDIA-A100-SXM4-80GB")
    part = CATALOG.placement("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb")
    assert whole is not None and part is not None
    assert part.sustained_tensor_tflops == pytest.approx(whole.sustained_tensor_tflops * 3 / 7)
    assert part.sustained_fp64_tflops == pytest.approx(whole.sustained_fp64_tflops * 3 / 7)
    assert part.fp64_tensor_tflops == pytest.approx(19.5 * 3 / 7)
    assert part.sustained_bandwidth_gbs == pytest.approx(whole.sustained_bandwidth_gbs * 40 / 80)


def test_with_sustained_replaces_only_the_units_named():
    entry = CATALOG.lookup("NVIDIA-L40S")
    assert entry is not None
    changed = entry.with_sustained({"fp64": 2.0, "latency": 9.0})
    assert changed.sustained_fp64_tflops == 2.0 and changed.sustained("latency") is None
    assert changed.sustained_tensor_tflops == entry.sustained_tensor_tflops
    assert changed.sustained_bandwidth_gbs == entry.sustained_bandwidth_gbs
