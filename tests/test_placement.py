"""`kratos-admit placement`: the report a person reads before trusting the hints (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kratos_admit.cli.common import ExitStatus
from kratos_runner.parse import parse_report
from kratos_runner.summary import summarise
from tests.harness import EXAMPLES, nodes_file, require_fixtures, run_kratos

A100 = "NVIDIA-A100-SXM4-80GB"


run = run_kratos


def test_the_report_shows_each_products_figures_time_and_weight():
    status, out, err = run(
        "placement",
        "-p",
        str(EXAMPLES / "profiles" / "vector-add-profile.yaml"),
        "--nodes",
        str(EXAMPLES / "nodes.yaml"),
    )
    assert status == ExitStatus.OK, err
    header, table = out.split("\n\n", 1)
    assert "bound memory" in header and "memory 81.4% of peak" in header
    lines = table.splitlines()
    assert (
        lines[0].split()[:2] == ["PRODUCT", "SHARE"] and "WEIGHT" in lines[0]
    )  # LABELS would repeat PRODUCT
    first = lines[1].split()
    assert first[0] == "NVIDIA-H100-80GB-HBM3" and first[-1] == "100"
    assert first[-4:-1] == ["model", "NVIDIA-H100-80GB-HBM3:", "measured"], "what the H100's figures rest on"
    assert (
        "measured on NVIDIA-H100-80GB-HBM3, whose figures rest on the catalog's measurements "
        "(fp32 catalog, measured; memory catalog, measured)" in header
    )


def test_a_mig_node_is_reported_as_its_share_with_a_lower_weight(tmp_path: Path):
    mig = f"{A100}-MIG-1g.10gb"
    status, out, err = run(
        "placement", "-p", str(EXAMPLES / "profiles" / "vector-add-profile.yaml"),
        "--nodes", str(nodes_file(tmp_path, A100, mig)), "-o", "json",
    )  # fmt: skip
    assert status == ExitStatus.OK, err
    rows = {r["product"]: r for r in json.loads(out)}
    assert rows[mig]["share"].startswith("MIG 1g.10gb: 14% of compute, 12% of bandwidth")
    assert rows[mig]["weight"] < rows[A100]["weight"]
    assert rows[mig]["bandwidth_gbs"] < rows[A100]["bandwidth_gbs"] / 7
    assert rows[A100]["share"] == "whole GPU"


def test_a_file_without_a_profile_is_refused_with_a_reason(tmp_path: Path):
    empty = tmp_path / "none.yaml"
    empty.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    status, out, err = run("placement", "-p", str(empty))
    assert status == ExitStatus.UNUSABLE and out == ""
    assert (
        err.strip()
        == f"kratos-admit: {empty}: document 1 is a ConfigMap; -p expects a file holding one WorkloadProfile"
    )


L40S = "NVIDIA-L40S"


def observed(product: str, runs: int, seconds: str = "40.0") -> dict[str, object]:
    return {"product": product, "runs": runs, "meanSeconds": seconds}


@pytest.mark.parametrize(
    ("observations", "used", "said"),
    [
        pytest.param([], 0, [], id="none"),
        pytest.param([observed(A100, 3), observed(L40S, 4, "90.0")], 2,
                     [f"observed on {A100}: 3 runs, mean 40.0 s (used)", f"observed on {L40S}: 4 runs, mean 90.0 s (used)"], id="two-products"),
        pytest.param([observed(A100, 3)], 0, [f"observed on {A100}: 3 runs, mean 40.0 s (not used: no second product has 3 runs)"], id="one-product"),
        pytest.param([observed(A100, 3), observed(L40S, 2)], 0,
                     [f"observed on {A100}: 3 runs, mean 40.0 s (not used: no second product has 3 runs)",
                      f"observed on {L40S}: 2 runs, mean 40.0 s (not used: fewer than 3 runs)"], id="too-few-runs"),
        pytest.param([observed("NVIDIA-B200", 9)], 0, ["observed on NVIDIA-B200: 9 runs, mean 40.0 s (not in this cluster)"], id="elsewhere"),
    ],
)  # fmt: skip
def test_the_header_counts_the_observations_actually_used(tmp_path: Path, observations, used, said):
    profile = yaml.safe_load((EXAMPLES / "profiles" / "vector-add-profile.yaml").read_text())
    profile["status"]["observations"] = observations
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    status, out, err = run("placement", "-p", str(path), "--nodes", str(nodes_file(tmp_path, A100, L40S)))
    assert status == ExitStatus.OK, err
    header, table = out.split("\n\n", 1)
    lines = header.splitlines()
    assert f"observed runtimes used for {used} of 2 products" in lines[1]
    assert lines[2].startswith(
        "time shares: tensor 0%, fp32 0%, fp64 0%, memory 81%, latency 19% (a profile from before"
    )
    assert lines[3].startswith("measured on ") and lines[4] == "source: nsight-compute" and lines[5:] == said
    assert table.count(" observed ") == used


def test_a_product_with_fewer_runs_shows_them_weighed_with_the_model(tmp_path: Path):
    profile = yaml.safe_load((EXAMPLES / "profiles" / "vector-add-profile.yaml").read_text())
    profile["status"]["observations"] = [
        observed(A100, 3),
        observed(L40S, 4, "90.0"),
        observed("NVIDIA-L4", 1, "300.0"),
    ]
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    nodes = nodes_file(tmp_path, A100, L40S, "NVIDIA-L4")
    status, out, err = run("placement", "-p", str(path), "--nodes", str(nodes), "-o", "json")
    assert status == ExitStatus.OK, err
    rows = {r["product"]: r for r in json.loads(out)}
    assert [rows[p]["time_from"] for p in (A100, L40S, "NVIDIA-L4")] == [
        "observed",
        "observed",
        "model + 1 run",
    ]
    status, out, err = run("placement", "-p", str(path), "--nodes", str(nodes))
    header = out.split("\n\n", 1)[0].splitlines()
    assert (
        header[-1]
        == "observed on NVIDIA-L4: 1 runs, mean 300.0 s (weighed with the model, which counts as one run)"
    )


def header_of(profile: Path) -> list[str]:
    status, out, err = run("placement", "-p", str(profile), "--nodes", str(EXAMPLES / "nodes.yaml"))
    assert status == ExitStatus.OK, err
    return out.split("\n\n", 1)[0].splitlines()


def test_a_telemetry_profile_shows_its_source_and_the_counters_used():
    header = header_of(EXAMPLES / "profiles" / "embed-server-profile.yaml")
    assert "source: telemetry" in header
    assert f"telemetry on {A100}: 3 runs, 5400 GPU-seconds (the figures come from these)" in header
    [used] = [line for line in header if line.startswith("counters used: ")]
    # the pipes and DRAM give the throughputs, occupancy over active SMs; never GR_ENGINE_ACTIVE
    assert "DCGM_FI_PROF_PIPE_FP32_ACTIVE 0.21" in used and "DCGM_FI_PROF_DRAM_ACTIVE 0.62" in used
    assert "GR_ENGINE_ACTIVE" not in used


def test_an_nsight_compute_profile_with_telemetry_says_whose_figures_come_first(tmp_path: Path):
    profile = yaml.safe_load((EXAMPLES / "profiles" / "vector-add-profile.yaml").read_text())
    profile["status"]["telemetry"] = [
        {"product": A100, "runs": 2, "seconds": "900", "counters": {"DCGM_FI_PROF_DRAM_ACTIVE": "0.4"}}
    ]
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    header = header_of(path)
    assert "source: nsight-compute" in header
    assert (
        f"telemetry on {A100}: 2 runs, 900 GPU-seconds (kept as evidence; Nsight Compute's figures come first)"
        in header
    )
    assert not [line for line in header if line.startswith("counters used")]


def test_a_telemetry_profile_the_default_counters_cannot_settle_says_why(tmp_path: Path):
    counters = {
        "DCGM_FI_PROF_DRAM_ACTIVE": "0.3",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "0.95",
    }
    profile = {
        "apiVersion": "gpu.scheduler.io/v1alpha1", "kind": "WorkloadProfile",
        "metadata": {"name": "stencil-profile", "namespace": "team-a"}, "spec": {"workload": "stencil"},
        "status": {"phase": "Ready", "source": "telemetry", "boundType": "unknown", "gpu": {"product": A100},
                   "metrics": {"smThroughput": "0.00", "memoryThroughput": "30.00"},
                   "telemetry": [{"product": A100, "runs": 1, "seconds": "600", "counters": counters}]},
    }  # fmt: skip
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    header = header_of(path)
    [why] = [line for line in header if line.startswith("bound type unknown: ")]
    assert "CUDA-core (FP32/FP64) compute or latency" in why and "extended counters" in why


# --- each unit's figure, and a runner summary ranked as the controller's profile (issue 43) ---------

H100 = "NVIDIA-H100-80GB-HBM3"


def summary_file(tmp_path: Path, **changes: object) -> Path:
    """A runner summary as the runner prints it (``python3 -m kratos_runner parse``): a bf16 GEMM
    measured on an H100, its time on the tensor cores."""
    summary: dict[str, object] = {
        "boundType": "balanced",
        "metrics": {"smThroughput": "93.80", "memoryThroughput": "94.98", "kernelCount": "5"},
        "gpu": {"product": H100, "computeCapability": "9.0"},
        "kernels": 5,
        "exitCode": 0,
        "ncuVersion": "",
        "reason": "",
        "timeShares": {"tensor": "0.94", "fp32": "0.00", "fp64": "0.00", "memory": "0.00", "latency": "0.06"},
        "timeSharesFrom": "pipes",
    }
    summary.update(changes)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    return path


def test_each_row_shows_every_units_figure_and_where_it_comes_from(tmp_path: Path):
    status, out, err = run(
        "placement", "--summary", str(summary_file(tmp_path)), "--nodes", str(nodes_file(tmp_path, H100, L40S)),
        "-o", "json",
    )  # fmt: skip
    assert status == ExitStatus.OK, err
    rows = {r["product"]: r for r in json.loads(out)}
    h100, l40s = rows[H100], rows[L40S]
    assert (h100["tensor_tflops"], h100["fp32_tflops"], h100["fp64_tflops"], h100["bandwidth_gbs"]) == (
        789.0,
        56.2,
        62.1,
        2767,
    )
    assert {h100[f"{u}_from"] for u in ("tensor", "fp32", "fp64", "bandwidth")} == {"catalog, measured"}
    assert l40s["tensor_from"] == l40s["fp64_from"] == "catalog, datasheet x factor"
    assert l40s["fp64_tflops"] < 2  # FP64 at 1/64 of its FP32
    # 94 % of its H100 time on tensor cores: the L40S's are about a third as fast
    assert l40s["relative_time"] == pytest.approx(0.94 * 789 / l40s["tensor_tflops"] + 0.06, abs=0.001)


def test_a_runner_summary_is_ranked_as_the_profile_the_controller_would_write(tmp_path: Path):
    path = summary_file(tmp_path)
    status, out, err = run(
        "placement", "--summary", str(path), "--nodes", str(nodes_file(tmp_path, H100, L40S))
    )
    assert status == ExitStatus.OK, err
    header, table = out.split("\n\n", 1)
    lines = header.splitlines()
    assert lines[0] == f"runner summary {path}, as the controller would write it, phase Ready, bound balanced"
    assert lines[1].startswith(f"SM 93.8% and memory 95.0% of peak on {H100}")
    assert (
        lines[2]
        == "time shares: tensor 94%, fp32 0%, fp64 0%, memory 0%, latency 6% (the profile's timeShares)"
    )
    rows, footer = table.split("\n\n")
    assert [line.split()[0] for line in rows.splitlines()[1:]] == [H100, L40S]
    assert footer.startswith("maxSlowdown 5: every product is within 5x of the best"), footer


def test_a_summary_without_time_shares_is_ranked_from_its_throughputs(tmp_path: Path):
    path = summary_file(
        tmp_path, timeShares={}, metrics={"smThroughput": "90.00", "memoryThroughput": "10.00"}
    )
    status, out, err = run(
        "placement", "--summary", str(path), "-o", "json", "--nodes", str(nodes_file(tmp_path, H100, L40S))
    )
    assert status == ExitStatus.OK, err
    # FP32-bound by its throughputs: the L40S's FP32 lanes (40 sustained) against the H100's 56
    assert {r["product"]: r["relative_time"] for r in json.loads(out)}[L40S] == pytest.approx(
        1 + 0.9 * (56.2 / 40.3 - 1), abs=0.01
    )
    status, text, err = run("placement", "--summary", str(path))
    assert (
        "(a profile from before time shares, ranked by the roofline of its SM and memory throughputs)" in text
    )


@pytest.mark.parametrize(
    ("content", "said"),
    [
        pytest.param("{not json", "not JSON", id="not-json"),
        pytest.param(
            '{"metrics": {}}', "not a runner summary: boundType: Field required", id="no-bound-type"
        ),
        pytest.param(
            '{"boundType": "unknown", "failure": "no-kernels", "reason": "no kernel ran"}',
            "boundType unknown (no-kernels): the controller would mark the profile Failed, nothing to rank",
            id="failed-run",
        ),
    ],
)
def test_a_summary_that_cannot_be_ranked_is_refused_with_the_reason(tmp_path: Path, content, said):
    path = tmp_path / "summary.json"
    path.write_text(content)
    status, out, err = run("placement", "--summary", str(path))
    assert status == ExitStatus.UNUSABLE and out == ""
    assert err.startswith(f"kratos-admit: {path}: ") and said in err


def test_a_profile_and_a_summary_are_not_given_together(tmp_path: Path):
    profile = str(EXAMPLES / "profiles" / "vector-add-profile.yaml")
    status, _, err = run("placement", "-p", profile, "--summary", str(summary_file(tmp_path)))
    assert status == ExitStatus.UNUSABLE and "not allowed with argument" in err


def test_a_real_h100_bf16_gemm_summary_ranks_by_tensor_cores(tmp_path: Path):
    """The runner's summary of the real H100 export, through the CLI: the L40S's tensor cores are a
    third of the H100's (its FP32 lanes, by the old model, would have made it nearly as fast)."""
    export = require_fixtures() / "ncu" / "h100-ncu2025-torch-bf16-gemm.csv"
    summary = summarise(parse_report(export.read_text(encoding="utf-8")))
    path = tmp_path / "bf16.json"
    path.write_text(json.dumps(summary))
    status, out, err = run(
        "placement",
        "--summary",
        str(path),
        "--nodes",
        str(nodes_file(tmp_path, H100, A100, L40S)),
        "-o",
        "json",
    )
    assert status == ExitStatus.OK, err
    times = {r["product"]: r["relative_time"] for r in json.loads(out)}
    assert times[H100] == 1.0
    assert 989 / 362 / 1.6 < times[L40S] < 989 / 362 * 1.6
    assert 989 / 312 / 1.6 < times[A100] < 989 / 312 * 1.6
