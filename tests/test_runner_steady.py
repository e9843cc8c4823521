"""The steady-state profile: a one-metric first pass finds the warm-up and the repeating step, and the
basic set profiles the launches of one step that hold the kernels with most of its time, weighted by
the first pass. Played back from the real H100 exports of Nsight Compute 2025.3.1: the first pass of
``train.py`` (4,140 launches with their durations) and the basic set's figures of real kernels."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kratos_runner.cli import main
from kratos_runner.parse import parse_report
from kratos_runner.steady import kernel_key, plan, repetition
from tests.harness import executable, require_fixtures

# A stand-in ncu for both passes. A profiling run plays launches of the recorded run FAKE_NCU_RUN (a
# first-pass export: name, grid, block, duration of every launch, in order) as ncu would see them: it
# skips --launch-skip launches, profiles the next --launch-count ones and, with --kill yes, ends the
# run there (status 9, as a killed workload leaves it). --metrics exports each profiled launch's row
# as recorded; --set exports the basic set's figures of a real kernel of the same kind (FAKE_NCU_DONORS:
# tensor, memory and latency rows of real exports) under the launch's own name, grid, block and
# duration. FAKE_NCU_HANG makes the first pass wait on a real process until something ends it.
FAKE_NCU = r"""#!{python}
import csv, io, json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_NCU_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.1.0 (build 36398880) (public-release)")
    sys.exit(0)
if args == ["--list-sets"]:
    sys.stdout.write(open(os.environ["FAKE_NCU_SETS"]).read())
    sys.exit(0)
if "--import" in args:
    sys.stdout.write(open(args[args.index("--import") + 1]).read())
    sys.exit(0)
takes_value = {{"--set", "--metrics", "--target-processes", "--launch-skip", "--launch-count", "--export", "--kill"}}
options, i = {{}}, 0
while args[i].startswith("-"):
    if args[i] in takes_value:
        options[args[i]], i = args[i + 1], i + 2
    else:
        i += 1
workload = args[i:]
skip, count = int(options.get("--launch-skip", "0")), int(options.get("--launch-count", "1000000"))
kill = options.get("--kill") == "yes"
rows = list(csv.reader(open(os.environ["FAKE_NCU_RUN"])))
read = ["ID", "Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum"]
at = [rows[0].index(c) for c in read]
header, units, launches = read, [rows[1][i] for i in at], [[row[i] for i in at] for row in rows[2:]]
if "--metrics" in options and os.environ.get("FAKE_NCU_HANG"):
    child = subprocess.Popen(["sleep", "600"])
    print("==PROF== Connected to process " + str(child.pid) + " (" + workload[0] + ")", flush=True)
    child.wait()
    launches = launches[:1400]
else:
    print("==PROF== Connected to process 4242 (" + workload[0] + ")", flush=True)
profiled = launches[skip : skip + count]
for n, row in enumerate(profiled):
    print("==PROF== Profiling \"" + row[1][:40] + "\" - " + str(n) + ": 0%....50%....100%", flush=True)
out = io.StringIO()
writer = csv.writer(out, quoting=csv.QUOTE_ALL)
if "--metrics" in options:
    writer.writerows([header, units] + [[str(n)] + row[1:] for n, row in enumerate(profiled)])
else:
    donors = json.load(open(os.environ["FAKE_NCU_DONORS"]))
    columns = donors["header"]
    writer.writerows([columns, donors["units"]])
    for n, row in enumerate(profiled):
        name = row[1]
        kind = "tensor" if name.startswith(("nvjet", "cudnn")) else "memory" if "elementwise" in name else "latency"
        values = dict(donors[kind])
        values.update({{"ID": str(n), "Kernel Name": name, "Grid Size": row[2], "Block Size": row[3],
                       "gpu__time_duration.sum": row[4]}})
        writer.writerow([values.get(c, "") for c in columns])
open(options["--export"] + ".ncu-rep", "w").write(out.getvalue())
print("==PROF== Disconnected from process 4242", flush=True)
sys.exit(9 if kill and len(launches) > skip + count else 0)
"""


def fixture(name: str) -> Path:
    return require_fixtures() / "ncu" / name


def donors(path: Path) -> Path:
    """One real kernel's basic-set row per kind: the bf16 GEMM (tensor), the triad (memory), the pointer
    chase (latency), keyed by the columns of the bf16 GEMM's export."""

    def first_row(name: str) -> tuple[list[str], list[str], dict[str, str]]:
        rows = list(csv.reader(fixture(name).open()))
        return rows[0], rows[1], dict(zip(rows[0], rows[2], strict=True))

    header, units, tensor = first_row("h100-ncu2025-torch-bf16-gemm.csv")
    _, _, memory = first_row("h100-ncu2025-stream.csv")
    _, _, latency = first_row("h100-ncu2025-latency.csv")
    path.write_text(
        json.dumps({"header": header, "units": units, "tensor": tensor, "memory": memory, "latency": latency})
    )
    return path


@pytest.fixture
def bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "ncu", FAKE_NCU.format(python=sys.executable))
    executable(tmp_path / "train", "#!/bin/sh\nexit 0\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("FAKE_NCU_LOG", str(tmp_path / "ncu-calls.log"))
    monkeypatch.setenv("FAKE_NCU_RUN", str(fixture("h100-ncu2025-train-pass1-durations.csv")))
    monkeypatch.setenv("FAKE_NCU_SETS", str(fixture("h100-ncu2025-list-sets.txt")))
    monkeypatch.setenv("FAKE_NCU_DONORS", str(donors(tmp_path / "donors.json")))
    monkeypatch.setenv("KRATOS_TERMINATION_LOG", str(tmp_path / "termination-log"))
    return tmp_path


def run(bench: Path, argv: list[str]) -> tuple[int, dict[str, Any], list[list[str]]]:
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, stdout=out, stderr=err)
    summary = json.loads((bench / "termination-log").read_text())
    calls = [json.loads(line) for line in (bench / "ncu-calls.log").read_text().splitlines()]
    return status, summary, [c for c in calls if "--export" in c]


def first_pass_of_train_py() -> tuple[list[tuple[str, str, str]], list[float]]:
    kernels = parse_report(fixture("h100-ncu2025-train-pass1-durations.csv").read_text()).kernels
    return [kernel_key(k) for k in kernels], [k.metrics["duration"] for k in kernels]


def test_the_first_pass_of_train_py_finds_the_warm_up_and_the_311_launch_step():
    keys, durations = first_pass_of_train_py()
    assert len(keys) == 4140
    assert repetition(keys) == (384, 311)
    found, why = plan(keys, durations, target=0.9, max_kernels=45, max_launches=120)
    assert found is not None, why
    assert (found.warmup, found.period, len(found.totals)) == (384, 311, 66)
    # the acceptance: chosen after the warm-up, at most 45 distinct kernels, >= 90 % of a steady step
    assert found.skip >= found.warmup
    assert len(found.chosen) <= 45
    step_time = sum(found.totals.values())
    assert sum(found.totals[k] for k in found.chosen) >= 0.9 * step_time
    assert set(found.chosen) <= set(found.expected), "one launch of each chosen kernel is profiled"
    assert found.span <= 120
    # the profiled launches are the run's own: launch skip + i of the first pass is expected[i]
    assert [keys[found.skip + i] for i in range(found.span)] == found.expected


def test_a_window_of_1200_launches_finds_the_same_step():
    keys, durations = first_pass_of_train_py()
    found, _ = plan(keys[:1200], durations[:1200], target=0.9, max_kernels=45, max_launches=120)
    assert found is not None and (found.warmup, found.period) == (384, 311)


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        pytest.param("abcabcabc", (0, 3), id="repeats-from-the-start"),
        pytest.param("xyzabab" + "cab" * 4, (5, 3), id="warm-up-then-a-step"),
        pytest.param("abcdefghijkl" + "mm", None, id="a-kernel-repeated-at-the-end-is-no-step"),
        pytest.param("abcdefgh", None, id="never-repeats"),
        pytest.param("abcabcab", (0, 3), id="a-step-cut-by-the-window"),
        pytest.param("aaaa", (0, 1), id="one-kernel"),
    ],
)
def test_repetition_is_the_earliest_start_then_the_shortest_period(sequence: str, expected):
    keys = [(c, "(1, 1, 1)", "(32, 1, 1)") for c in sequence]
    assert repetition(keys) == expected


def test_fewer_launches_are_profiled_where_the_bound_is_lower_and_the_best_covered_are_kept():
    keys, durations = first_pass_of_train_py()
    found, _ = plan(keys, durations, target=0.9, max_kernels=45, max_launches=20)
    assert found is not None and found.span == 20
    covered = sum(found.totals[k] for k in set(found.expected)) / sum(found.totals.values())
    assert 0.3 < covered < 0.9


def test_train_py_is_profiled_in_its_steady_state_with_the_runners_defaults(bench: Path):
    status, summary, calls = run(bench, ["--", str(bench / "train")])
    first, second = calls
    assert first[:9] == [
        "--metrics", "gpu__time_duration.sum", "--target-processes", "all", "--launch-count", "2000",
        "--kill", "yes", "--export",
    ]  # fmt: skip
    assert second[:10] == [
        "--set", "basic", "--target-processes", "all", "--launch-skip", "653", "--launch-count", "92",
        "--kill", "yes",
    ]  # fmt: skip
    assert status == 0 and summary["killed"] is True and summary["kernels"] == 92
    assert summary["selection"] == "steady-state" and summary["ncuVersion"] == "2025.3.1.0"
    steady = summary["steadyState"]
    assert (steady["window"], steady["warmupLaunches"], steady["period"]) == (2000, 384, 311)
    assert (steady["launchSkip"], steady["launchCount"], steady["kernelsChosen"]) == (653, 92, 30)
    assert steady["launchSkip"] >= steady["warmupLaunches"] and steady["kernelsChosen"] <= 45
    assert float(summary["coverage"]) >= 0.9 and summary["coverage"] == steady["coverage"]
    # the shares are the first pass's: each kernel's unit (from its kind here) weighted by its step time
    keys, durations = first_pass_of_train_py()
    found, _ = plan(keys[:2000], durations[:2000], target=0.9, max_kernels=45, max_launches=120)
    assert found is not None
    profiled = set(found.expected)
    tensor = sum(found.totals[k] for k in profiled if k[0].startswith(("nvjet", "cudnn")))
    memory = sum(found.totals[k] for k in profiled if "elementwise" in k[0])
    total = sum(found.totals[k] for k in profiled)
    shares = summary["timeShares"]
    assert abs(float(shares["tensor"]) - tensor / total) <= 0.01
    assert abs(float(shares["memory"]) - memory / total) <= 0.01
    assert sum(round(float(v) * 100) for v in shares.values()) == 100
    assert len((bench / "termination-log").read_bytes()) <= 4096


@pytest.mark.parametrize(
    "argv",
    [["--launch-skip", "300"], ["--launch-count", "20"], ["--window", "0"]],
    ids=["skip-kernels-annotation", "launch-count", "window-0"],
)
def test_explicit_launches_or_window_0_keep_todays_first_launches(bench: Path, argv: list[str]):
    status, summary, calls = run(bench, [*argv, "--", str(bench / "train")])
    assert len(calls) == 1 and "--metrics" not in calls[0]
    skip = argv[1] if argv[0] == "--launch-skip" else "0"
    count = argv[1] if argv[0] == "--launch-count" else "20"
    assert calls[0][4:8] == ["--launch-skip", skip, "--launch-count", count]
    assert summary["selection"] == "first-launches" and "coverage" not in summary
    assert status == 0 and summary["kernelsSkipped"] == int(skip)


@pytest.mark.parametrize(
    ("recorded", "says"),
    [
        pytest.param("h100-ncu2025-compute.csv", "one kernel in the first 3 launches", id="single-kernel"),
        pytest.param("", "does not repeat within the first 200 launches", id="no-repetition"),
    ],
)
def test_a_program_without_a_repeating_step_keeps_the_first_launches(
    bench: Path, monkeypatch: pytest.MonkeyPatch, recorded: str, says: str
):
    path = fixture(recorded) if recorded else bench / "initialisation-only.csv"
    if not recorded:  # train.py's first 200 launches: weight initialisation, which does not repeat
        lines = fixture("h100-ncu2025-train-pass1-durations.csv").read_text().splitlines(True)
        path.write_text("".join(lines[:202]))
    monkeypatch.setenv("FAKE_NCU_RUN", str(path))
    _, summary, calls = run(bench, ["--", str(bench / "train")])
    assert "--metrics" in calls[0] and calls[1][4:8] == ["--launch-skip", "0", "--launch-count", "20"]
    assert summary["selection"] == "first-launches" and says in summary["selectionNote"]
    assert "steadyState" not in summary


def test_the_first_pass_is_bounded_in_time_and_uses_the_launches_it_saw(
    bench: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAKE_NCU_HANG", "1")
    started = time.monotonic()
    status, summary, _ = run(bench, ["--first-pass-seconds", "1", "--", str(bench / "train")])
    assert time.monotonic() - started < 60, "the workload the first pass waited on was ended"
    assert summary["selection"] == "steady-state" and summary["steadyState"]["window"] == 1400
    assert status == 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--window", "-1"], "--window must be 0 or more"),
        (["--coverage", "1.5"], "--coverage must be more than 0 and at most 1"),
        (["--max-kernels", "0"], "--max-kernels must be at least 1"),
        (["--max-launches", "0"], "--max-launches must be at least 1"),
        (["--first-pass-seconds", "0"], "--first-pass-seconds must be more than 0"),
    ],
)
def test_bad_steady_state_bounds_are_refused_naming_the_flag(argv: list[str], says: str):
    err = io.StringIO()
    assert main([*argv, "--", "/bin/true"], stdout=io.StringIO(), stderr=err) == 2
    assert says in err.getvalue()


def test_the_two_passes_run_on_python_3_8_as_the_staged_form_does(bench: Path):
    from tests.harness import python38

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "runner")}
    ran = subprocess.run(
        [python38(), "-m", "kratos_runner", "--", str(bench / "train")],
        env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr[-2000:]
    summary = json.loads((bench / "termination-log").read_text())
    assert summary["selection"] == "steady-state" and summary["steadyState"]["launchSkip"] == 653


def test_a_real_second_pass_profiles_the_launches_the_first_pass_numbered_so():
    """On the H100, the basic set with --launch-skip 300 --launch-count 20 (the train-step export) and the
    one-metric pass of a separate run of the same script agree launch for launch, though the two
    exports print the names differently (``native::vectorized_elementwise_kernel`` beside
    ``vectorized_elementwise_kernel``): the positions the second pass relies on are the first pass's."""
    keys, _ = first_pass_of_train_py()
    second = parse_report(fixture("h100-ncu2025-torch-train-step.csv").read_text()).kernels
    assert [kernel_key(k) for k in second] == keys[300:320]
    assert (
        second[0].name
        != parse_report(fixture("h100-ncu2025-train-pass1-durations.csv").read_text()).kernels[300].name
    )


def test_a_second_run_that_went_otherwise_is_weighted_by_its_own_time_and_says_so(
    bench: Path, monkeypatch: pytest.MonkeyPatch
):
    """The second pass replays another program than the first saw: none of its kernels is in the
    steady state, so no first-pass weight applies."""
    rows = list(csv.reader(fixture("h100-ncu2025-train-pass1-durations.csv").open()))
    other = bench / "other-run.csv"
    with other.open("w", newline="") as handle:  # every launch with a block of 1023 threads
        csv.writer(handle, quoting=csv.QUOTE_ALL).writerows(
            rows[:2] + [[*r[:3], "(1023, 1, 1)", r[4]] for r in rows[2:]]
        )
    script = bench / "bin" / "ncu"
    script.write_text(script.read_text().replace(
        'rows = list(csv.reader(open(os.environ["FAKE_NCU_RUN"])))',
        'rows = list(csv.reader(open(os.environ["FAKE_NCU_RUN"] if "--metrics" in args else os.environ["OTHER_RUN"])))',
    ))  # fmt: skip
    monkeypatch.setenv("OTHER_RUN", str(other))
    status, summary, _ = run(bench, ["--", str(bench / "train")])
    assert status == 0 and summary["kernels"] == 92
    assert summary["selection"] == "first-launches" and "none of the first pass's" in summary["selectionNote"]
    assert "timeShares" in summary and "coverage" not in summary
