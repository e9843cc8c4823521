"""The units model against the runner's own summaries from a real H100 (tests/data/h100-runner: the
runner's defaults, Nsight Compute 2025.3.1): each program's predicted time on an A100, L40S, A10 and
L4, relative to the H100 it was measured on, against the datasheet ratio of the unit its kernels ran
on (issue 43's acceptance). The datasheet figures are the catalog's own (``fp16TensorTflops``,
``fp32Tflops``, ``fp64TensorTflops`` else ``fp64Tflops``, ``memoryBandwidthGBs``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kratos_admit.cli.common import ExitStatus
from kratos_admit.cli.main import main
from kratos_admit.model.catalog import GpuProduct, load_catalog
from tests.harness import REPO

DATA = REPO / "tests" / "data" / "h100-runner"
MEASURED_ON = "NVIDIA-H100-80GB-HBM3"
TARGETS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S", "NVIDIA-A10", "NVIDIA-L4")
# Ada and GA10x datasheets count FP32 issued on both datapaths of a partition, which kernels reach
# only in part: the truth for FP32 work lies between the datasheet ratio and twice it
DUAL_ISSUE_FP32 = frozenset({"Ada Lovelace", "Ampere GA10x"})
FACTOR = 1.6


def datasheet(product: GpuProduct, unit: str) -> float:
    if unit == "tensor":
        return product.fp16_tensor_tflops
    if unit == "fp32":
        return product.fp32_tflops
    if unit == "fp64":
        return product.fp64_tensor_tflops or product.fp64_tflops
    assert unit == "memory", unit
    return product.memory_bandwidth_gbs


def predicted(summary: Path) -> dict[str, float]:
    out, err = io.StringIO(), io.StringIO()
    status = main(["placement", "--summary", str(summary), "-o", "json"], stdout=out, stderr=err)
    assert status == ExitStatus.OK, err.getvalue()
    return {row["product"]: float(row["relative_time"]) for row in json.loads(out.getvalue())}


def shares_of(summary: Path) -> dict[str, float]:
    return {unit: float(share) for unit, share in json.loads(summary.read_text())["timeShares"].items()}


@pytest.mark.parametrize(
    ("program", "unit"),
    [
        ("compute", "fp32"), ("sgemm", "fp32"), ("bf16-gemm", "tensor"), ("tf32-gemm", "tensor"),
        ("fp64-gemm", "fp64"), ("stream", "memory"), ("fp16-decode", "memory"), ("latency", "latency"),
    ],
)  # fmt: skip
def test_each_single_unit_program_puts_its_time_on_its_unit(program: str, unit: str):
    shares = shares_of(DATA / f"{program}.json")
    assert shares[unit] >= 0.8, shares
    assert sum(shares.values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "program", ["compute", "sgemm", "bf16-gemm", "tf32-gemm", "fp64-gemm", "stream", "fp16-decode"]
)
def test_a_single_unit_program_is_predicted_within_the_datasheet_ratio_of_its_unit(program: str):
    catalog = load_catalog()
    summary = DATA / f"{program}.json"
    [(unit, _)] = [(u, s) for u, s in shares_of(summary).items() if s >= 0.8]
    times = predicted(summary)
    reference = catalog.lookup(MEASURED_ON)
    assert reference is not None and times[MEASURED_ON] == pytest.approx(1.0)
    for name in TARGETS:
        product = catalog.lookup(name)
        assert product is not None, name
        ratio = datasheet(reference, unit) / datasheet(product, unit)
        low, high = ratio, ratio * (2 if unit == "fp32" and product.architecture in DUAL_ISSUE_FP32 else 1)
        assert low / FACTOR <= times[name] <= high * FACTOR, (program, name, times[name], (low, high))


def test_the_training_step_is_predicted_from_its_mix_of_units():
    """31 % tensor, 26 % memory, 43 % small kernels: the truth is the same mix of datasheet ratios,
    the small kernels' time unchanged."""
    catalog = load_catalog()
    summary = DATA / "train-step.json"
    shares = shares_of(summary)
    assert shares["tensor"] >= 0.25 and shares["memory"] >= 0.2 and shares["latency"] >= 0.35, shares
    times = predicted(summary)
    reference = catalog.lookup(MEASURED_ON)
    assert reference is not None
    for name in TARGETS:
        product = catalog.lookup(name)
        assert product is not None
        truth = shares["latency"] + sum(
            share * datasheet(reference, unit) / datasheet(product, unit)
            for unit, share in shares.items()
            if unit != "latency"
        )
        assert truth / FACTOR <= times[name] <= truth * FACTOR, (name, times[name], truth)


def test_an_fp64_gemm_ranks_every_product_with_fp64_tensor_cores_above_every_ada_and_ga10x_one():
    catalog = load_catalog()
    times = predicted(DATA / "fp64-gemm.json")
    products = [p for p in (catalog.lookup(name) for name in times) if p is not None]
    with_fp64_tensor = [times[p.product] for p in products if p.fp64_tensor_tflops is not None]
    consumer_class = [times[p.product] for p in products if p.architecture in DUAL_ISSUE_FP32]
    assert with_fp64_tensor and consumer_class
    assert max(with_fp64_tensor) < min(consumer_class)
