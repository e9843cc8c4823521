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


def test_re_rendering_the_page_keeps_the_sections_other_benchmarks_wrote(tmp_path: Path):
    docs = tmp_path / "docs"
    docs.mkdir()
    kept = "<!-- kept: sections below are written by other benchmarks (bench/review_bench.py) -->\n\n## Offline review\n\nfigures\n"
    (docs / "benchmarks.md").write_text("# old page\n\n" + kept)
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "admission_bench.py"), "--from-json", str(REPO / "bench" / "results" / "latest.json"),
         "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    page = (docs / "benchmarks.md").read_text()
    assert page.startswith("# Admission benchmark") and page.endswith(kept) and "# old page" not in page


def test_review_benchmark_smoke_run_reviews_its_file_with_both_outputs():
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "review_bench.py"), "--jobs", "30", "--repeat", "1"],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("input: 30 Jobs")
    assert [line.split()[:3] for line in lines[1:]] == [["review", "-o", "json"], ["review", "-o", "yaml"]]


def test_instruction_count_driver_runs_the_scenario_it_names_and_refuses_others():
    script = str(REPO / "bench" / "count_reviews.py")
    ran = subprocess.run(
        [sys.executable, script, "profiling", "3"], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("3 profiling reviews after 20 warm-up ones, last patched, ")
    refused = subprocess.run(
        [sys.executable, script, "nope", "3"], capture_output=True, text=True, timeout=120, check=False
    )
    assert refused.returncode == 2 and "invalid choice: 'nope'" in refused.stderr
