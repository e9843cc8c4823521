"""The unit that does each kernel's work, and the summary's ``timeShares``, from the real H100 exports
(Nsight Compute 2025.3.1, basic set) and the older exports without pipe metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kratos_admit.domain.profile import RunnerSummary
from kratos_runner.parse import parse_report
from kratos_runner.summary import encode_summary, summarise
from kratos_runner.units import UNITS, round_shares
from tests.harness import require_fixtures


def summary_of(name: str) -> dict[str, Any]:
    path = require_fixtures() / "ncu" / name
    return summarise(parse_report(path.read_text(encoding="utf-8")))


# each single-unit program on the H100, and the unit that must hold at least 0.8 of its time
SINGLE_UNIT = [
    pytest.param("h100-ncu2025-compute.csv", "fp32", id="fma-loop-fp32"),
    pytest.param("h100-ncu2025-torch-sgemm.csv", "fp32", id="fp32-gemm-fp32"),
    pytest.param("h100-ncu2025-torch-bf16-gemm.csv", "tensor", id="bf16-gemm-tensor"),
    pytest.param("h100-ncu2025-stream.csv", "memory", id="triad-memory"),
    pytest.param("h100-ncu2025-torch-fp16-decode.csv", "memory", id="fp16-decode-memory"),
    pytest.param("h100-ncu2025-latency.csv", "latency", id="pointer-chase-latency"),
]


@pytest.mark.parametrize(("name", "unit"), SINGLE_UNIT)
def test_each_single_unit_h100_program_puts_at_least_0_8_of_its_time_on_its_unit(name: str, unit: str):
    s = summary_of(name)
    shares = s["timeShares"]
    assert set(shares) == set(UNITS) and s["timeSharesFrom"] == "pipes"
    assert float(shares[unit]) >= 0.8, shares
    assert sum(round(float(v) * 100) for v in shares.values()) == 100


def test_the_bf16_gemm_keeps_nsight_computes_own_bound_type_beside_its_tensor_share():
    """Its speed-of-light "memory" is shared memory (95 %), so ncu's rule calls it balanced; the
    tensor pipe at 94 % is what binds it."""
    s = summary_of("h100-ncu2025-torch-bf16-gemm.csv")
    assert s["boundType"] == "balanced" and s["timeShares"]["tensor"] == "1.00"


# exports without pipe metrics: the shares come from smThroughput/memoryThroughput, and say so
WITHOUT_PIPES = [
    pytest.param("superbench-sm100-cublaslt-details.csv", "latency", id="details-page-blackwell"),
    pytest.param("ykt-ampere-paddle-nvtx-details.csv", "latency", id="details-metrics-ampere"),
    pytest.param("mdinfo-t4-two-kernel-basic-text.txt", "memory", id="text-report-t4"),
    pytest.param("mdinfo-t4-rmsnorm-basic-text.txt", "latency", id="text-report-t4-one-kernel"),
    pytest.param("ykt-ampere-torch-gate-text.txt", "latency", id="text-metrics-ampere"),
]


@pytest.mark.parametrize(("name", "unit"), WITHOUT_PIPES)
def test_an_export_without_pipe_metrics_falls_back_to_speed_of_light_and_says_so(name: str, unit: str):
    s = summary_of(name)
    assert s["timeSharesFrom"] == "speed-of-light"
    assert s["timeShares"][unit] == "1.00" and s["timeShares"]["tensor"] == "0.00"


@pytest.mark.parametrize(
    "name",
    [
        "h100-ncu2025-torch-train-step.csv",
        "h100-ncu2025-train-pass1-durations.csv",
        "deepbench-v100-gemm-raw-page.csv",
        "dd2360-sm89-failed-launch-full-text.txt",
        "pfac-rtx4070laptop-windows-na-text.txt",
        "dphpc-gemm-prof-lines-only.txt",
    ],
)
def test_every_other_export_still_parses_and_its_shares_if_any_sum_to_one(name: str):
    s = summary_of(name)
    assert s["boundType"] in ("compute", "memory", "latency", "balanced", "unknown")
    if "timeShares" in s:
        assert sum(round(float(v) * 100) for v in s["timeShares"].values()) == 100
    else:
        assert "timeSharesFrom" not in s, "no unit is known for any kernel: no shares at all"


def test_the_first_pass_durations_alone_name_no_unit():
    s = summary_of("h100-ncu2025-train-pass1-durations.csv")
    assert s["kernels"] == 4140 and "timeShares" not in s and s["boundType"] == "unknown"


@pytest.mark.parametrize(
    ("fractions", "expected"),
    [
        ({"tensor": 1 / 3, "fp32": 1 / 3, "memory": 1 / 3}, ("0.34", "0.33", "0.00", "0.33", "0.00")),
        ({"tensor": 0.306, "memory": 0.274, "latency": 0.42}, ("0.31", "0.00", "0.00", "0.27", "0.42")),
        ({"latency": 2.0}, ("0.00", "0.00", "0.00", "0.00", "1.00")),
        ({"fp32": 0.996, "fp64": 0.002, "memory": 0.002}, ("0.00", "1.00", "0.00", "0.00", "0.00")),
    ],
)
def test_shares_are_rounded_to_two_decimals_that_sum_to_exactly_one(fractions, expected):
    shares = round_shares(fractions)
    assert tuple(shares[u] for u in UNITS) == expected
    assert sum(round(float(v) * 100) for v in shares.values()) == 100


def test_trimming_to_4096_bytes_never_drops_the_time_shares():
    s = summary_of("h100-ncu2025-torch-bf16-gemm.csv")
    s["reason"] = "x" * 10_000
    s["steadyState"] = {"note": "y" * 5_000}
    text = encode_summary(s)
    assert len(text.encode()) <= 4096
    assert json.loads(text)["timeShares"] == s["timeShares"]


def test_the_runners_summary_with_shares_and_coverage_reads_as_the_controllers_model():
    s = summary_of("h100-ncu2025-torch-bf16-gemm.csv")
    s["coverage"] = "0.93"
    model = RunnerSummary.model_validate_json(encode_summary(s))
    assert model.time_shares == s["timeShares"] and model.coverage == "0.93"
    assert model.bound_type == "balanced"


def test_old_names_of_the_tensor_pipe_are_read(tmp_path: Path):
    """Ampere's ncu names the FP16 tensor pipe ``sm__pipe_tensor_op_hmma_cycles_active``; where only the
    total ``sm__pipe_tensor_cycles_active`` exists, FP64 on the tensor cores is taken off it."""
    pct = ".avg.pct_of_peak_sustained_elapsed"
    header = ["ID", "Kernel Name", "gpu__time_duration.sum", "sm__pipe_fma_cycles_active" + pct,
              "sm__pipe_tensor_op_hmma_cycles_active" + pct, "sm__pipe_tensor_cycles_active" + pct,
              "sm__pipe_tensor_op_dmma_cycles_active" + pct, "gpu__dram_throughput" + pct]  # fmt: skip
    rows = [["0", "hmma", "100", "5", "90", "", "", "20"], ["1", "dmma", "100", "5", "", "88", "85", "20"]]
    text = "\n".join(",".join(f'"{c}"' for c in row) for row in [header, [""] * len(header), *rows])
    s: dict[str, Any] = summarise(parse_report(text))
    assert s["timeShares"]["tensor"] == "0.50" and s["timeShares"]["fp64"] == "0.50"
