"""A short smoke run of the benchmark so it keeps working (figures are not asserted: this is no timed test)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    scenario_names = {"hints", "profiling", "denied-pod", "validate"}
    assert (
        set(data["decision_path"])
        == set(data["decision_path_array"])
        == set(data["decision_path_cold"])
        == scenario_names
    )
    commit = data["machine"]["commit"]
    assert commit and all(r["commit"] == commit for r in data["load"] + data["paced"])
    assert f"[{commit}] decision path      hints:" in result.stdout, "each result printed with its commit"
    markdown = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert (
        "| hints | 4 |" in markdown
        and "## Targets (issue 44)" in markdown
        and f"(commit {commit})" in markdown
    )
    assert "achieved within 5 %" in markdown and "| hints | " in markdown.split("## Decision path")[1]


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


def test_memory_benchmark_fills_each_cache_and_reports_the_resident_set():
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "memory_bench.py"), "--nodes", "40", "--profiles", "60", "--decisions", "8"],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert any("40 GPU Nodes" in row for row in rows) and any(
        "decision cache full (8 hinted Jobs)" in row for row in rows
    )
    totals = [row for row in rows if row.startswith("| **the webhook's resident set")]
    assert len(totals) == 2 and all(float(row.split("**")[-2]) > 50 for row in totals), totals


def test_flame_summary_counts_each_sample_once_in_the_first_group_that_claims_it(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # bench/ is no package
    summarise = importlib.import_module("flame").summarise

    collapsed = "\n".join([
        "process 1;handle (kratos_admit/webhook/server.py:90);decide (kratos_admit/admission/engine.py:10);loads (orjson) 6",
        "process 1;_run (asyncio/events.py:80);write (asyncio/selector_events.py:1000) 3",
        "process 1;handle (kratos_admit/webhook/server.py:95);inc (prometheus_client/metrics.py:300) 1",
    ])  # fmt: skip
    summary = summarise("hints", collapsed)
    shares = dict(summary.groups)
    assert summary.samples == 10
    assert shares["decision (admission, decisions, domain)"] == 0.6
    assert shares["TLS and socket (ssl, sslproto, transport write/read)"] == 0.3
    assert shares["metrics (prometheus_client)"] == 0.1
    assert sum(shares.values()) == 1.0
    assert summary.own[0] == ("loads (orjson)", 0.6)


def test_the_paced_pause_is_the_cycle_the_rate_needs_less_the_time_a_request_takes_in_the_loop():
    bench = importlib.import_module("bench.admission_bench")
    # 64 connections at 4,000 req/s: a 16 ms cycle; the probe (pause 16 ms) got 3,765 req/s, a
    # 17 ms cycle, so a request spends 1 ms in the loop and the pause asked for is 15 ms
    probe = bench.LoadResult("floor", "hints", 64, 0, 0.0, 0, 3764.7, 0, 0, 0, 0, 0)
    assert bench.paced_pause(64, 4000.0, probe) == pytest.approx(15.0, abs=0.01)
    fast = bench.LoadResult("floor", "hints", 64, 0, 0.0, 0, 4100.0, 0, 0, 0, 0, 0)  # over the rate
    assert bench.paced_pause(64, 4000.0, fast) == pytest.approx(16.0)
    stalled = bench.LoadResult("floor", "hints", 64, 0, 0.0, 0, 100.0, 0, 0, 0, 0, 0)
    assert bench.paced_pause(64, 4000.0, stalled) == 0.0
