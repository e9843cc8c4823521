"""`kratos-admit placement`: the report a person reads before trusting the hints (issue 11)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import yaml

from kratos_admit.cli import ExitStatus, main
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
    assert lines[0].split()[:2] == ["PRODUCT", "LABELS"] and "WEIGHT" in lines[0]
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
    assert err.strip() == f"kratos-admit: {empty}: must hold exactly one WorkloadProfile, holds 0"
