"""`kratos-admit placement`: the report a person reads before trusting the hints (issue 11)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from kratos_admit.cli.common import ExitStatus
from kratos_admit.cli.main import main
from tests.harness import EXAMPLES

A100 = "NVIDIA-A100-SXM4-80GB"


def nodes_file(tmp_path: Path, *products: str) -> Path:
    nodes = [
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": f"gpu-{i}", "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": p}}}
        for i, p in enumerate(products)
    ]  # fmt: skip
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump_all(nodes))
    return path


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), stdout=out, stderr=err)
    return int(status), out.getvalue(), err.getvalue()


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
    assert first[0] == "NVIDIA-H100-80GB-HBM3" and first[-1] == "100" and first[-2] == "model"


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
    assert lines[2] == "source: nsight-compute" and lines[3:] == said
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
