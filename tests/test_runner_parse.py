"""The runner's parser on every real Nsight Compute output in ../shared/fixtures/ncu.

Expected figures are derived by hand from each file; the derivation sits next to the assertion.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest

from kratos_runner.parse import parse_number, parse_report
from kratos_runner.summary import classify, encode_summary, summarise, weighted_mean
from tests.harness import REPO, require_fixtures


def summary_of(name: str) -> dict[str, Any]:
    text = (require_fixtures() / "ncu" / name).read_text(encoding="utf-8")
    return summarise(parse_report(text))


def weighted(rows: list[tuple[float, float]]) -> float:
    """sum(value x time) / sum(time), the GPU-time weighting DESIGN asks for."""
    return sum(v * t for v, t in rows) / sum(t for _, t in rows)


# deepbench-v100-gemm-raw-page.csv: --page raw, 18 kernels; columns sm__throughput..., gpu__compute_memory_throughput...,
# gpu__time_duration.sum (unit row: msecond), read off each data row:
DEEPBENCH = [
    (5.023967, 35.088000, 1.183136), (15.646603, 57.901893, 0.124704), (14.818158, 80.891149, 0.137120),
    (2.422134, 16.231982, 0.004736), (2.896269, 10.131527, 0.003488), (3.029665, 3.089789, 0.002944),
    (38.438556, 25.304959, 0.226304), (38.432514, 25.300309, 0.226336), (38.482511, 25.332962, 0.226368),
    (38.449395, 25.311934, 0.226176), (38.450711, 25.312567, 0.226688), (38.427625, 25.300684, 0.226752),
    (38.480080, 25.332364, 0.226272), (38.482201, 25.333115, 0.226112), (38.429716, 25.301393, 0.226304),
    (38.475088, 25.331087, 0.226304), (38.452663, 25.313807, 0.226176), (38.465879, 25.326392, 0.226592),
]  # fmt: skip


def test_raw_page_csv_v100_gemm():
    s = summary_of("deepbench-v100-gemm-raw-page.csv")
    assert s["kernels"] == 18
    sm = weighted([(k[0], k[2]) for k in DEEPBENCH])  # = 27.42: the 12 gemm kernels dominate the time
    mem = weighted([(k[1], k[2]) for k in DEEPBENCH])  # = 30.85
    assert s["metrics"]["smThroughput"] == f"{sm:.2f}" == "27.42"
    assert s["metrics"]["memoryThroughput"] == f"{mem:.2f}" == "30.85"
    # gpuTimeNs = sum of durations in ms x 1e6 (the unit row says msecond)
    assert s["metrics"]["gpuTimeNs"] == str(round(sum(k[2] for k in DEEPBENCH) * 1e6)) == "4172512"
    assert s["boundType"] == "latency"  # both under 60 % of peak
    assert s["gpu"] == {
        "product": "Tesla-V100-PCIE-32GB",
        "computeCapability": "7.0",
    }  # device__attribute_display_name, CC


ONE_KERNEL = [
    pytest.param(
        # SpeedOfLight rows: Compute (SM) Throughput 23.59 %, Memory Throughput 21.68 %, L2 15.12 %,
        # DRAM 0.74 %, Duration 406240 ns; Occupancy section: Achieved Occupancy 15.53 %. Program
        # output and an 8-space indent precede the header. 23.59 and 21.68 are both < 60: latency
        # (ncu's own SOLBottleneck row says the same).
        "superbench-sm100-cublaslt-details.csv",
        {"achievedOccupancy": "15.53", "smThroughput": "23.59", "memoryThroughput": "21.68",
         "l2Throughput": "15.12", "dramThroughput": "0.74", "kernelCount": "1", "gpuTimeNs": "406240"},
        "10.0",
        id="details-csv-blackwell-cublaslt",
    ),
    pytest.param(
        # SOL table: Memory 1.35 %, DRAM 0.84 %, Duration 5.66 us, L2 1.35 %, Compute (SM) 0.35 %;
        # Occupancy 20.37 %; the program's own output comes first
        "mdinfo-t4-rmsnorm-basic-text.txt",
        {"achievedOccupancy": "20.37", "smThroughput": "0.35", "memoryThroughput": "1.35",
         "l2Throughput": "1.35", "dramThroughput": "0.84", "kernelCount": "1", "gpuTimeNs": "5660"},
        "7.5",
        id="text-report-basic-set-after-program-output",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("fixture", "metrics", "compute_capability"), ONE_KERNEL)
def test_one_kernel_reports(fixture: str, metrics: dict[str, str], compute_capability: str):
    s = summary_of(fixture)
    assert s["kernels"] == 1
    assert s["metrics"] == metrics
    assert s["boundType"] == "latency"
    assert s["gpu"] == {"computeCapability": compute_capability}


def test_details_csv_older_schema_with_nvtx_and_thousands_separators():
    # two kernels from --metrics: kernel 0 sm 1.03 mem 2.45 time "8,192" ns; kernel 1 sm 0.07 mem 4.30 time "3,584" ns
    s = summary_of("ykt-ampere-paddle-nvtx-details.csv")
    assert s["kernels"] == 2
    assert s["metrics"]["gpuTimeNs"] == "11776"  # 8192 + 3584
    assert s["metrics"]["smThroughput"] == f"{weighted([(1.03, 8192), (0.07, 3584)]):.2f}" == "0.74"
    assert s["metrics"]["memoryThroughput"] == f"{weighted([(2.45, 8192), (4.30, 3584)]):.2f}" == "3.01"
    assert s["metrics"]["achievedOccupancy"] == f"{weighted([(8.32, 8192), (4.16, 3584)]):.2f}"
    assert "l2Throughput" not in s["metrics"]  # the run collected no lts__ metric
    assert s["boundType"] == "latency"


def test_text_report_metrics_without_header_row():
    # three kernels, usecond units: (sm, mem, time) = (0.02, 0.88, 2.59), (0.03, 1.52, 3.36), (0.02, 0.91, 3.07)
    s = summary_of("ykt-ampere-torch-gate-text.txt")
    assert s["kernels"] == 3
    assert s["metrics"]["gpuTimeNs"] == "9020"  # (2.59 + 3.36 + 3.07) us
    assert (
        s["metrics"]["memoryThroughput"]
        == f"{weighted([(0.88, 2.59), (1.52, 3.36), (0.91, 3.07)]):.2f}"
        == "1.13"
    )
    assert s["metrics"]["smThroughput"] == "0.02"
    assert s["boundType"] == "latency"


def test_text_report_two_kernels_memory_bound():
    # residual_add: SM 29.47, Memory 76.69, 154.56 us; normalize: SM 37.36, Memory 70.19, 141.06 us
    s = summary_of("mdinfo-t4-two-kernel-basic-text.txt")
    sm = weighted([(29.47, 154.56), (37.36, 141.06)])  # 33.23
    mem = weighted([(76.69, 154.56), (70.19, 141.06)])  # 73.59
    assert s["kernels"] == 2
    assert (
        (s["metrics"]["smThroughput"], s["metrics"]["memoryThroughput"])
        == (f"{sm:.2f}", f"{mem:.2f}")
        == ("33.23", "73.59")
    )
    assert s["metrics"]["gpuTimeNs"] == "295620"
    assert s["boundType"] == "memory"  # mem >= 60 and mem - sm = 40.4 >= 10


def test_failed_launch_full_of_nan_is_unknown_with_the_reason():
    s = summary_of("dd2360-sm89-failed-launch-full-text.txt")
    assert s["kernels"] == 1 and s["boundType"] == "unknown"
    assert "LaunchFailed" in s["reason"] and "sm__throughput" in s["reason"]
    assert s["metrics"] == {"kernelCount": "1"}


def test_mangled_metric_names_all_na_is_unknown():
    s = summary_of("pfac-rtx4070laptop-windows-na-text.txt")
    assert s["kernels"] == 14 and s["boundType"] == "unknown"
    assert "no usable sm__throughput and gpu__compute_memory_throughput" in s["reason"]


def test_prof_lines_only_points_at_the_report_file():
    s = summary_of("dphpc-gemm-prof-lines-only.txt")
    assert s["kernels"] == 0 and s["boundType"] == "unknown"
    assert "ncu_analysis.ncu-rep" in s["reason"] and "--csv --page raw" in s["reason"]


def test_every_ncu_fixture_is_covered_here():
    covered = {
        "deepbench-v100-gemm-raw-page.csv", "superbench-sm100-cublaslt-details.csv", "ykt-ampere-paddle-nvtx-details.csv",
        "ykt-ampere-torch-gate-text.txt", "mdinfo-t4-rmsnorm-basic-text.txt", "mdinfo-t4-two-kernel-basic-text.txt",
        "dd2360-sm89-failed-launch-full-text.txt", "pfac-rtx4070laptop-windows-na-text.txt", "dphpc-gemm-prof-lines-only.txt",
    }  # fmt: skip
    on_disk = {p.name for p in (require_fixtures() / "ncu").iterdir() if p.name != "SOURCES.md"}
    assert on_disk == covered


@pytest.mark.parametrize(
    ("sm", "mem", "bound"),
    [(59.9, 59.9, "latency"), (60.0, 20.0, "compute"), (20.0, 75.0, "memory"), (65.0, 72.0, "balanced"),
     (70.0, 60.0, "compute"), (None, 50.0, "unknown")],
)  # fmt: skip
def test_speed_of_light_rule(sm, mem, bound):
    assert classify(sm, mem)[0] == bound


@pytest.mark.parametrize(
    ("text", "value"),
    [("8,192", 8192.0), ("1.5", 1.5), ("(!) nan", None), ("(!) n/a", None), ("nan", None), ("n/a", None),
     ("no data", None), ("", None), ("inf", None)],
)  # fmt: skip
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_kernel_names_with_commas_and_ragged_rows():
    text = (
        'app output, with commas\n"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
        '"0","7","void k<int, 2>(int, float)","GPU Speed Of Light Throughput","Compute (SM) Throughput","%","80.5"\n'
        '"0","7","void k<int, 2>(int, float)","GPU Speed Of Light Throughput","Memory Throughput","%","12.0"\n'
        '"0","7","void k<int, 2>(int, float)","GPU Speed Of Light Throughput","Duration","msecond","1.5"\n'
        '"1","7","short"\n'
        '"2","8","void k<int, 2>(int, float)","Memory Workload Analysis","Memory Throughput","byte/second","9,000,000"\n'
    )
    report = parse_report(text)
    assert [k.name for k in report.kernels] == ["void k<int, 2>(int, float)", "void k<int, 2>(int, float)"]
    first = report.kernels[0].metrics
    assert first == {"sm": 80.5, "mem": 12.0, "duration": 1.5e6}  # msecond scaled to ns
    assert report.kernels[1].metrics == {}  # a byte/second "Memory Throughput" is not the SOL percentage
    assert weighted_mean(report.kernels, "sm") == 80.5


def test_summary_is_trimmed_to_4096_bytes_deterministically():
    summary = summarise(parse_report(""), reason="x" * 10_000)
    first = encode_summary(summary)
    assert len(first.encode()) <= 4096 and first == encode_summary(summary)
    assert '"boundType":"unknown"' in first


def test_runner_sources_are_python_3_8_syntax():
    for path in sorted((REPO / "runner" / "kratos_runner").glob("*.py")):
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


def test_runner_imports_only_the_standard_library():
    import sys

    for path in sorted((REPO / "runner" / "kratos_runner").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in ("kratos_runner", "__future__"), (
                    path.name,
                    name,
                )
