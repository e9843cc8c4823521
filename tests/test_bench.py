"""A short smoke run of the benchmark so it keeps working (figures are not asserted: this is no timed test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.harness import REPO


def test_benchmark_smoke_run_writes_its_results(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "admission_bench.py"), "--smoke", "--client", "python", "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "bench" / "results" / "latest.json").read_text())
    scenarios = {(r["server"], r["scenario"]) for r in data["load"]}
    assert scenarios == {
        (s, n) for s in ("floor", "kratos") for n in ("hints", "profiling", "denied-pod", "validate")
    }
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in data["load"] + data["paced"])
    assert set(data["decision_path"]) == {"hints", "profiling", "denied-pod", "validate"}
    markdown = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "| hints | 4 |" in markdown and "## Targets (issue 5)" in markdown
