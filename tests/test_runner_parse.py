"""The runner's parser on Nsight Compute outputs in every layout ncu prints.

Two sets of reports: the project's own (tests/data/ncu, written for these tests: invented kernels and
figures in ncu's exact layouts) always run; the real outside ones (../shared/fixtures/ncu) run when
that folder sits beside the clone and are skipped with a reason otherwise. Expected figures are
derived by hand from each file; the derivation sits next to the assertion.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from kratos_runner.parse import parse_number, parse_report
from kratos_runner.summary import classify, encode_summary, summarise, weighted_mean
from tests.harness import DATA, REPO, require_fixtures

PROJECT_NCU = DATA / "ncu"


def summary_of(path: Path) -> dict[str, Any]:
    return summarise(parse_report(path.read_text(encoding="utf-8")))


def outside(name: str) -> Path:
    return require_fixtures() / "ncu" / name


def weighted(rows: list[tuple[float, float]]) -> float:
    """sum(value x time) / sum(time), the GPU-time weighting DESIGN asks for."""
    return sum(v * t for v, t in rows) / sum(t for _, t in rows)


# --- the project's own reports (tests/data/ncu) --------------------------------------------------

# a100-two-rank-gemm-raw-page.csv: --page raw, a units row (usecond, %), thousands separators in the
# durations, two processes (ranks 3101 and 3102) of 4 kernels each, no CC column (compute capability
# from device__attribute_compute_capability_major/minor), the older lts__t_sectors and dram__throughput
# names, and n/a for L2 on the two init_weights kernels. (sm, mem, l2, duration us) per row:
A100_RAW = [
    (12.50, 48.00, None, 40.00), (91.20, 42.10, 55.00, 1204.48), (35.00, 71.40, 40.00, 96.00),
    (90.80, 41.90, 55.00, 1199.52), (12.30, 47.60, None, 40.00), (91.00, 42.30, 55.00, 1201.60),
    (34.60, 70.90, 40.00, 96.40), (90.60, 42.00, 55.00, 1202.00),
]  # fmt: skip


def test_raw_page_csv_two_processes_compute_bound():
    report = parse_report((PROJECT_NCU / "a100-two-rank-gemm-raw-page.csv").read_text())
    assert report.layout == "csv-raw"
    assert [k.key[0] for k in report.kernels] == ["3101"] * 4 + ["3102"] * 4, "both ranks, in order"
    s: dict[str, Any] = summarise(report)
    assert s["kernels"] == 8
    sm = weighted([(k[0], k[3]) for k in A100_RAW])  # = 87.54: gemm_tile is 95 % of the time
    mem = weighted([(k[1], k[3]) for k in A100_RAW])  # = 43.27
    l2 = weighted([(k[2], k[3]) for k in A100_RAW if k[2] is not None])  # = 54.42, n/a rows left out
    assert (s["metrics"]["smThroughput"], s["metrics"]["memoryThroughput"]) == (f"{sm:.2f}", f"{mem:.2f}")
    assert (f"{sm:.2f}", f"{mem:.2f}", s["metrics"]["l2Throughput"]) == ("87.54", "43.27", f"{l2:.2f}")
    # "1,204.48" usecond -> 1204480 ns; the durations sum to 5080.00 us
    assert s["metrics"]["gpuTimeNs"] == str(round(sum(k[3] for k in A100_RAW) * 1e3)) == "5080000"
    assert s["boundType"] == "compute"  # sm >= 60 and sm - mem = 44.3 >= 10
    assert s["gpu"] == {"product": "NVIDIA-A100-SXM4-80GB", "computeCapability": "8.0"}


def test_details_csv_newer_columns_balanced_ignores_other_sections():
    # two kernels, Duration in ns with thousands separators: flash_fwd SM 74.20 Memory 68.90 "512,384" ns,
    # flash_bwd_dq SM 61.30 Memory 66.70 "127,616" ns; each also has a Memory Workload Analysis
    # "Memory Throughput" in byte/second, which is not the Speed Of Light percentage. Program output and
    # an indented ==PROF== line precede the header.
    report = parse_report((PROJECT_NCU / "h100-attention-details.csv").read_text())
    assert report.layout == "csv-details"
    s: dict[str, Any] = summarise(report)
    sm = weighted([(74.20, 512384), (61.30, 127616)])  # 71.63
    mem = weighted([(68.90, 512384), (66.70, 127616)])  # 68.46
    assert s["kernels"] == 2
    assert s["metrics"] == {
        "achievedOccupancy": f"{weighted([(23.85, 512384), (44.10, 127616)]):.2f}",  # 27.89
        "smThroughput": f"{sm:.2f}",
        "memoryThroughput": f"{mem:.2f}",
        "l2Throughput": f"{weighted([(60.48, 512384), (64.32, 127616)]):.2f}",  # 61.25
        "dramThroughput": f"{weighted([(52.35, 512384), (58.20, 127616)]):.2f}",  # 53.52
        "kernelCount": "2",
        "gpuTimeNs": "640000",
    }
    assert (f"{sm:.2f}", f"{mem:.2f}") == ("71.63", "68.46")
    assert s["boundType"] == "balanced"  # both >= 60, gap 3.2 < 10
    assert s["gpu"] == {"computeCapability": "9.0"}  # the CC column; no device name in this layout


def test_details_csv_older_columns_with_nvtx_and_thousands_separators():
    # --metrics run, no CC column, NVTX range columns; (sm, mem, occupancy, time ns):
    # (3.12, 5.40, 12.48, "12,288"), (0.85, 9.75, 6.20, "4,096"), (7.60, 2.10, 24.96, "8,192"); no lts__ metric
    rows = [(3.12, 5.40, 12.48, 12288), (0.85, 9.75, 6.20, 4096), (7.60, 2.10, 24.96, 8192)]
    report = parse_report((PROJECT_NCU / "a100-nvtx-metrics-details.csv").read_text())
    assert report.layout == "csv-details"
    s: dict[str, Any] = summarise(report)
    assert s["kernels"] == 3
    assert s["metrics"]["gpuTimeNs"] == "24576"  # 12288 + 4096 + 8192
    assert s["metrics"]["smThroughput"] == f"{weighted([(r[0], r[3]) for r in rows]):.2f}" == "4.23"
    assert s["metrics"]["memoryThroughput"] == f"{weighted([(r[1], r[3]) for r in rows]):.2f}" == "5.03"
    assert s["metrics"]["achievedOccupancy"] == f"{weighted([(r[2], r[3]) for r in rows]):.2f}" == "15.59"
    assert "l2Throughput" not in s["metrics"]  # the run collected no lts__ metric
    assert s["boundType"] == "latency" and s["gpu"] == {}


def test_text_report_two_kernels_memory_bound():
    # stream_triad: SM 22.40, Memory 84.20, 210.24 us; block_reduce_sum: SM 45.80, Memory 66.50, 89.76 us;
    # program output before the report; Launch Statistics rows are not figures
    report = parse_report((PROJECT_NCU / "t4-two-kernel-memory-bound-text.txt").read_text())
    assert report.layout == "text"
    s: dict[str, Any] = summarise(report)
    sm = weighted([(22.40, 210.24), (45.80, 89.76)])  # 29.40
    mem = weighted([(84.20, 210.24), (66.50, 89.76)])  # 78.90
    assert s["kernels"] == 2
    assert s["metrics"] == {
        "achievedOccupancy": f"{weighted([(81.25, 210.24), (90.50, 89.76)]):.2f}",  # 84.02
        "smThroughput": f"{sm:.2f}",
        "memoryThroughput": f"{mem:.2f}",
        "l2Throughput": f"{weighted([(31.60, 210.24), (40.10, 89.76)]):.2f}",  # 34.14
        "dramThroughput": f"{weighted([(84.20, 210.24), (63.90, 89.76)]):.2f}",  # 78.13
        "kernelCount": "2",
        "gpuTimeNs": "300000",  # (210.24 + 89.76) us
    }
    assert (f"{sm:.2f}", f"{mem:.2f}") == ("29.40", "78.90")
    assert s["boundType"] == "memory"  # mem >= 60 and mem - sm = 49.5 >= 10
    assert s["gpu"] == {"computeCapability": "7.5"}  # from the kernel line


def test_text_report_metrics_without_header_row_two_processes():
    # --metrics tables with no "Metric Name" row, NVTX ranges, usecond, no CC on the kernel lines;
    # process 4410 ran two kernels, 4411 one: (sm, mem, time us) = (0.40, 1.20, 3.20), (0.90, 2.60, 4.80), (0.10, 0.70, 2.00)
    report = parse_report((PROJECT_NCU / "torch-two-process-metrics-text.txt").read_text())
    assert [k.key[0] for k in report.kernels] == ["4410", "4410", "4411"]
    s: dict[str, Any] = summarise(report)
    assert s["kernels"] == 3
    assert s["metrics"]["gpuTimeNs"] == "10000"  # (3.20 + 4.80 + 2.00) us
    assert (
        s["metrics"]["smThroughput"]
        == f"{weighted([(0.40, 3.20), (0.90, 4.80), (0.10, 2.00)]):.2f}"
        == "0.58"
    )
    assert (
        s["metrics"]["memoryThroughput"]
        == f"{weighted([(1.20, 3.20), (2.60, 4.80), (0.70, 2.00)]):.2f}"
        == "1.77"
    )
    assert s["boundType"] == "latency" and s["gpu"] == {}


UNUSABLE = [
    pytest.param(
        # ==ERROR== LaunchFailed; one kernel (0, 0, 0)x(0, 0, 0) whose every figure is "(!) nan"
        "ada-failed-launch-nan-text.txt", 1, ("LaunchFailed", "sm__throughput", "error code (719)"),
        {"kernelCount": "1"}, id="failed-launch-full-of-nan",
    ),
    pytest.param(
        # six kernels whose metric names lost their double underscores, every value "(!) n/a"
        "laptop-mangled-metrics-na-text.txt", 6, ("no usable sm__throughput and gpu__compute_memory_throughput",),
        {"kernelCount": "6"}, id="mangled-metric-names-all-na",
    ),
    pytest.param(
        # only ==PROF== lines: the report went to a file
        "profile-to-file-log.txt", 0, ("attention_sweep.ncu-rep", "--csv --page raw"),
        {"kernelCount": "0"}, id="log-with-no-tables-names-the-report-file",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("name", "kernels", "said", "metrics"), UNUSABLE)
def test_unusable_reports_are_unknown_with_the_reason(
    name: str, kernels: int, said: tuple[str, ...], metrics
):
    s = summary_of(PROJECT_NCU / name)
    assert (s["kernels"], s["boundType"], s["metrics"]) == (kernels, "unknown", metrics)
    assert all(part in s["reason"] for part in said), s["reason"]


def test_every_project_report_is_covered_here():
    covered = {
        "a100-two-rank-gemm-raw-page.csv", "h100-attention-details.csv", "a100-nvtx-metrics-details.csv",
        "t4-two-kernel-memory-bound-text.txt", "torch-two-process-metrics-text.txt",
        "ada-failed-launch-nan-text.txt", "laptop-mangled-metrics-na-text.txt", "profile-to-file-log.txt",
    }  # fmt: skip
    assert {p.name for p in PROJECT_NCU.iterdir()} == covered


# --- real outside reports (../shared/fixtures/ncu), skipped when absent ----------------------------

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


def test_real_raw_page_csv_v100_gemm():
    s = summary_of(outside("deepbench-v100-gemm-raw-page.csv"))
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
def test_real_one_kernel_reports(fixture: str, metrics: dict[str, str], compute_capability: str):
    s = summary_of(outside(fixture))
    assert s["kernels"] == 1
    assert s["metrics"] == metrics
    assert s["boundType"] == "latency"
    assert s["gpu"] == {"computeCapability": compute_capability}


def test_real_details_csv_older_schema_with_nvtx_and_thousands_separators():
    # two kernels from --metrics: kernel 0 sm 1.03 mem 2.45 time "8,192" ns; kernel 1 sm 0.07 mem 4.30 time "3,584" ns
    s = summary_of(outside("ykt-ampere-paddle-nvtx-details.csv"))
    assert s["kernels"] == 2
    assert s["metrics"]["gpuTimeNs"] == "11776"  # 8192 + 3584
    assert s["metrics"]["smThroughput"] == f"{weighted([(1.03, 8192), (0.07, 3584)]):.2f}" == "0.74"
    assert s["metrics"]["memoryThroughput"] == f"{weighted([(2.45, 8192), (4.30, 3584)]):.2f}" == "3.01"
    assert s["metrics"]["achievedOccupancy"] == f"{weighted([(8.32, 8192), (4.16, 3584)]):.2f}"
    assert "l2Throughput" not in s["metrics"]  # the run collected no lts__ metric
    assert s["boundType"] == "latency"


def test_real_text_report_metrics_without_header_row():
    # three kernels, usecond units: (sm, mem, time) = (0.02, 0.88, 2.59), (0.03, 1.52, 3.36), (0.02, 0.91, 3.07)
    s = summary_of(outside("ykt-ampere-torch-gate-text.txt"))
    assert s["kernels"] == 3
    assert s["metrics"]["gpuTimeNs"] == "9020"  # (2.59 + 3.36 + 3.07) us
    assert (
        s["metrics"]["memoryThroughput"]
        == f"{weighted([(0.88, 2.59), (1.52, 3.36), (0.91, 3.07)]):.2f}"
        == "1.13"
    )
    assert s["metrics"]["smThroughput"] == "0.02"
    assert s["boundType"] == "latency"


def test_real_text_report_two_kernels_memory_bound():
    # residual_add: SM 29.47, Memory 76.69, 154.56 us; normalize: SM 37.36, Memory 70.19, 141.06 us
    s = summary_of(outside("mdinfo-t4-two-kernel-basic-text.txt"))
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


def test_real_failed_launch_full_of_nan_is_unknown_with_the_reason():
    s = summary_of(outside("dd2360-sm89-failed-launch-full-text.txt"))
    assert s["kernels"] == 1 and s["boundType"] == "unknown"
    assert "LaunchFailed" in s["reason"] and "sm__throughput" in s["reason"]
    assert s["metrics"] == {"kernelCount": "1"}


def test_real_mangled_metric_names_all_na_is_unknown():
    s = summary_of(outside("pfac-rtx4070laptop-windows-na-text.txt"))
    assert s["kernels"] == 14 and s["boundType"] == "unknown"
    assert "no usable sm__throughput and gpu__compute_memory_throughput" in s["reason"]


def test_real_prof_lines_only_points_at_the_report_file():
    s = summary_of(outside("dphpc-gemm-prof-lines-only.txt"))
    assert s["kernels"] == 0 and s["boundType"] == "unknown"
    assert "ncu_analysis.ncu-rep" in s["reason"] and "--csv --page raw" in s["reason"]


def test_every_outside_ncu_report_is_covered_here():
    covered = {
        "deepbench-v100-gemm-raw-page.csv", "superbench-sm100-cublaslt-details.csv", "ykt-ampere-paddle-nvtx-details.csv",
        "ykt-ampere-torch-gate-text.txt", "mdinfo-t4-rmsnorm-basic-text.txt", "mdinfo-t4-two-kernel-basic-text.txt",
        "dd2360-sm89-failed-launch-full-text.txt", "pfac-rtx4070laptop-windows-na-text.txt", "dphpc-gemm-prof-lines-only.txt",
    }  # fmt: skip
    # the real H100 exports: tests/test_runner_units.py and tests/test_runner_steady.py
    covered |= {p.name for p in (require_fixtures() / "ncu").glob("h100-ncu2025-*")}
    on_disk = {p.name for p in (require_fixtures() / "ncu").iterdir() if p.name != "SOURCES.md"}
    assert on_disk == covered


# --- the rules themselves -----------------------------------------------------------------------


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
