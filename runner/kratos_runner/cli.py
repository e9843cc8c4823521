"""``python3 -m kratos_runner`` (or the one-file ``kratos-runner``): run a workload under ncu, or
``parse FILE`` for an existing export."""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Sequence, TextIO

from kratos_runner.failures import classify
from kratos_runner.launch import cannot_start, child_environment, loader_failure, with_fix
from kratos_runner.parse import Report, parse_report
from kratos_runner.steady import Plan, describe, kernel_key, plan, weights_for
from kratos_runner.summary import encode_summary, summarise

DEFAULT_TERMINATION_LOG = "/dev/termination-log"
NOT_RUN = 127  # exit status when the workload could not be started at all
_NCU_GLOBS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda-*/bin/ncu")
# the one-file executable (PyInstaller) sets sys.frozen; the staged form runs ``python3 -m kratos_runner``
FROZEN = bool(getattr(sys, "frozen", False))
PROG = "kratos-runner" if FROZEN else "python3 -m kratos_runner"
# ncu --help: "--target-processes arg (=all)  Select the processes you want to profile: application-only
# (profile only the application process), all (profile the application and its child processes)"
TARGET_PROCESSES = ("all", "application-only")
DEFAULT_LAUNCH_COUNT = 20  # the first launches profiled when no steady state is found or asked for
FIRST_PASS_METRIC = "gpu__time_duration.sum"
_CONNECTED = re.compile(r"==PROF== Connected to process (\d+)")


def find_ncu(explicit: str | None) -> str | None:
    if explicit:
        return (
            explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else shutil.which(explicit)
        )
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in _NCU_GLOBS:
        matches = sorted(glob.glob(pattern))
        if matches:
            return matches[-1]
    return None


def ask_ncu(ncu: str, option: str, env: dict[str, str]) -> str | None:
    """What ``ncu OPTION`` prints (stdout and stderr), None when it cannot run or fails; never waits
    more than a minute."""
    try:
        out = subprocess.run(
            [ncu, option], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60, check=False, env=env
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None


def ncu_version(ncu: str, env: dict[str, str]) -> str:
    match = re.search(r"Version (\S+)", ask_ncu(ncu, "--version", env) or "")
    return match.group(1) if match else ""


# Section sets: ncu 2022.3 (Debian's nsight-compute, CUDA 11.8) lists default, detailed, full, roofline and
# source; later versions call the set with LaunchStats, Occupancy and SpeedOfLight "basic". Both hold
# every metric the parser reads (SpeedOfLight: sm__throughput, gpu__compute_memory_throughput,
# gpu__dram_throughput, lts__throughput, gpu__time_duration; Occupancy: sm__warps_active), so a request
# for one is served by the other where this ncu has only that one.
EQUIVALENT_SETS = ("basic", "default")
_SETS_RULE = re.compile(r"^-+(?: +-+)+ *$")


def section_sets(ncu: str, env: dict[str, str]) -> dict[str, bool] | None:
    """The section sets this ``ncu`` has (``ncu --list-sets``): identifier -> enabled by default; None
    when the list cannot be read. The table's columns are as wide as its rule of dashes; a long
    Sections cell wraps onto rows with an empty Identifier."""
    listed = ask_ncu(ncu, "--list-sets", env)
    return parse_section_sets(listed) if listed is not None else None


def parse_section_sets(text: str) -> dict[str, bool] | None:
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if _SETS_RULE.match(line)]
    if len(rules) < 2:
        return None
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[rules[0]])]
    if len(spans) < 3:
        return None
    sets: dict[str, bool] = {}
    for line in lines[rules[1] + 1 :]:
        identifier = line[spans[0][0] : spans[0][1]].strip()
        if identifier and not _SETS_RULE.match(line):
            sets[identifier] = line[spans[2][0] : spans[2][1] + 1].strip() == "yes"
    return sets or None


def choose_set(requested: str, sets: dict[str, bool] | None) -> tuple[str, str]:
    """The set to ask for, and a note when it is not the one requested ("" when it is)."""
    if sets is None or requested in sets:
        return requested, ""
    if requested in EQUIVALENT_SETS:
        for other in EQUIVALENT_SETS:
            if other in sets:
                return other, f"this ncu has no section set {requested!r}; using its equivalent {other!r}"
    enabled = [name for name, on in sets.items() if on]
    if enabled:
        return enabled[0], f"this ncu has no section set {requested!r}; using its default set {enabled[0]!r}"
    return requested, ""


def write_summary(summary: dict[str, object], stdout: TextIO, stderr: TextIO) -> None:
    text = encode_summary(summary)
    path = os.environ.get("KRATOS_TERMINATION_LOG", DEFAULT_TERMINATION_LOG)
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        print(f"kratos-runner: cannot write the summary to {path}: {exc.strerror}", file=stderr)
    print(text, file=stdout)
    stdout.flush()


def _failed(reason: str, exit_code: int, version: str = "", failure: str = "ncu-error") -> dict[str, object]:
    """The summary of a run that profiled nothing, for the stated reason and failure class."""
    summary = summarise(Report("none"), exit_code=exit_code, ncu_version=version, reason=reason)
    summary["failure"] = failure
    return summary


def _end_workload(pids: list[int]) -> None:
    """End the processes ncu connected to (the workload), as ``--kill`` does: ncu then writes its report."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


def _run_streaming(
    command: list[str], stdout: TextIO, env: dict[str, str], limit_s: float | None = None
) -> tuple[int, str, bool]:
    """Run, copying the output through line by line (the Job's log), and keep it for inspection. With
    ``limit_s``, the workload (the processes ncu says it connected to) is ended after that many
    seconds; the third value says whether that happened."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    seen: list[str] = []
    pids: list[int] = []
    ended = threading.Event()

    def end() -> None:
        ended.set()
        _end_workload(list(pids))

    timer = threading.Timer(limit_s, end) if limit_s else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.decode("utf-8", "replace")
        connected = _CONNECTED.search(line)
        if connected:
            pids.append(int(connected.group(1)))
            if ended.is_set():
                _end_workload(pids[-1:])
        seen.append(line)
        stdout.write(line)
    stdout.flush()
    code = process.wait()
    if timer is not None:
        timer.cancel()
    return code, "".join(seen), ended.is_set()


def _import(ncu: str, report_file: str, env: dict[str, str]) -> tuple[str, str]:
    """The raw page of an exported report as CSV, and why it could not be read ("" when it could)."""
    export = subprocess.run(
        [ncu, "--import", report_file, "--csv", "--page", "raw", "--print-units", "base"],
        capture_output=True, check=False, env=env,
    )  # fmt: skip
    text = export.stdout.decode("utf-8", "replace")
    if export.returncode != 0 and not text.strip():
        return text, "ncu --import failed: " + export.stderr.decode("utf-8", "replace").strip()[:300]
    return text, ""


def first_pass(
    ncu: str,
    command: list[str],
    args: argparse.Namespace,
    *,
    workdir: str,
    stdout: TextIO,
    env: dict[str, str],
) -> tuple[Plan | None, str]:
    """One metric (each launch's GPU time) over the first ``--window`` launches, and the second pass it
    leads to; (None, why) when the first launches are kept."""
    base = os.path.join(workdir, "first-pass")
    run = [
        ncu, "--metrics", FIRST_PASS_METRIC, "--target-processes", args.target_processes,
        "--launch-count", str(args.window), "--kill", "yes", "--export", base, "--force-overwrite",
        *args.ncu_arg, *command,
    ]  # fmt: skip
    stdout.write(f"kratos-runner: first pass, {FIRST_PASS_METRIC} over at most {args.window} launches\n")
    try:
        _, _, ended = _run_streaming(run, stdout, env, args.first_pass_seconds)
    except OSError as exc:
        return None, f"the first pass could not start ncu: {exc.strerror}"
    if not os.path.exists(base + ".ncu-rep"):
        return None, "the first pass profiled no kernel"
    text, failed = _import(ncu, base + ".ncu-rep", env)
    kernels = parse_report(text).kernels
    if failed or not kernels:
        return None, failed or "the first pass profiled no kernel"
    keys = [kernel_key(k) for k in kernels]
    durations = [k.metrics.get("duration", 0.0) for k in kernels]
    found, why = plan(
        keys, durations, target=args.coverage, max_kernels=args.max_kernels, max_launches=args.max_launches
    )
    if ended and found is None:
        why += f" (the first pass was ended after {args.first_pass_seconds:g} s)"
    return found, why


def profile(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            f"kratos-runner: no workload given: {PROG} [options] -- EXE [ARGS...]",
            file=stderr,
        )
        return 2
    ncu = find_ncu(args.ncu)
    if ncu is None:
        where = f"at {args.ncu}" if args.ncu else "on PATH or in /opt/nvidia/nsight-compute"
        write_summary(
            _failed(
                f"ncu not found {where}: run the profiling-runner with the Nsight Compute image",
                NOT_RUN,
            ),
            stdout,
            stderr,
        )
        return NOT_RUN
    env = child_environment(os.environ, FROZEN)
    unusable, status = cannot_start(ncu, "ncu")
    if unusable:
        write_summary(_failed(f"cannot start ncu: {unusable}", status), stdout, stderr)
        return status
    exe = command[0]
    # the checks execve makes, before ncu runs: ncu's own words for a target it cannot launch are not
    # documented, the kernel's rules are (execve(2)); the workload's PATH is the runner's environment
    unusable, status = cannot_start(exe)
    if unusable:
        write_summary(_failed(with_fix(unusable, exe), status, failure="cannot-start"), stdout, stderr)
        return status
    version = ncu_version(ncu, env)
    chosen, note = choose_set(args.set, section_sets(ncu, env))
    if note:
        print(f"kratos-runner: {note} (sets: ncu --list-sets)", file=stderr)
    explicit = args.launch_skip is not None or args.launch_count is not None
    skip = args.launch_skip if args.launch_skip is not None else 0
    count = args.launch_count if args.launch_count is not None else DEFAULT_LAUNCH_COUNT
    with tempfile.TemporaryDirectory(prefix="kratos-") as workdir:
        steady: Plan | None = None
        if explicit:
            selection_note = "--launch-skip/--launch-count given: the launches asked for"
        elif args.window <= 0:
            selection_note = "--window 0: the first launches"
        else:
            steady, selection_note = first_pass(ncu, command, args, workdir=workdir, stdout=stdout, env=env)
            if steady is not None:
                skip, count = steady.skip, steady.span
        report_base = os.path.join(workdir, "profile")
        # --kill: ncu ends the workload once --launch-count kernels are profiled (Nsight Compute CLI,
        # "Profile" options; a boolean read by boost program_options, so yes/no, on/off, 1/0 all work):
        # the profiling run measures, the execution Job does the work.
        # --target-processes all (the default): child processes are profiled too, so a launcher or a
        # wrapper (torchrun, mpirun, a shell script) has its workers' kernels measured
        run = [
            ncu, "--set", chosen, "--target-processes", args.target_processes,
            "--launch-skip", str(skip), "--launch-count", str(count), "--kill", "yes",
            "--export", report_base, "--force-overwrite", *args.ncu_arg, *command,
        ]  # fmt: skip
        try:
            exit_code, output, _ = _run_streaming(run, stdout, env)
        except OSError as exc:
            write_summary(
                _failed(f"cannot start ncu at {ncu}: {exc.strerror}", NOT_RUN, version), stdout, stderr
            )
            return NOT_RUN
        reason, failure = "", ""
        report_file = report_base + ".ncu-rep"
        if not os.path.exists(report_file):
            report = parse_report(output)
        else:
            text, reason = _import(ncu, report_file, env)
            report = parse_report(text)
        if not report.kernels:
            # nothing profiled: the dynamic loader's refusal of the workload, else ncu's own words
            failed_launch = loader_failure(output)
            if failed_launch:
                failure, reason = "cannot-start", with_fix(failed_launch, exe)
            elif reason:
                failure = "ncu-error"
            else:
                failure, reason = classify(output)
        weights, coverage = weights_for(report.kernels, steady) if steady and report.kernels else (None, 0.0)
        if steady is not None and report.kernels and coverage <= 0:
            weights = None  # not one result is a kernel of the steady state: the run went otherwise
            selection_note = "the second pass found none of the first pass's steady-state kernels"
        summary = summarise(report, exit_code=exit_code, ncu_version=version, reason=reason, weights=weights)
        summary["ncuSet"] = chosen
        if steady is not None and report.kernels and coverage > 0:
            summary["selection"] = "steady-state"
            summary["steadyState"] = describe(steady, coverage)
            summary["coverage"] = f"{coverage:.2f}"
        else:
            summary["selection"] = "first-launches"
            summary["selectionNote"] = selection_note or "the steady state's launches were not profiled"
        if failure:
            summary["failure"] = failure
    return _finish(summary, skip, count, stdout, stderr)


def _finish(summary: dict[str, object], skip: int, count: int, stdout: TextIO, stderr: TextIO) -> int:
    """Write the summary and choose the runner's exit status.

    Once every requested kernel is profiled ncu ends the workload (--kill), so its status then is the
    kill's, not its own: such a run is a success (exit 0, ``killed`` true). A workload that ended by
    itself before that keeps its own status, in ``exitCode`` and as the runner's exit status.
    """
    exit_code = int(str(summary["exitCode"]))
    complete = int(str(summary["kernels"])) >= count
    summary["kernelsSkipped"] = skip
    summary["killed"] = complete and exit_code != 0
    write_summary(summary, stdout, stderr)
    return 0 if complete else exit_code


def parse_file(path: str, stdout: TextIO, stderr: TextIO) -> int:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError as exc:
        print(f"kratos-runner: {path}: {exc.strerror}", file=stderr)
        return 2
    print(encode_summary(summarise(parse_report(text))), file=stdout)
    return 0


def join_ncu_args(argv: list[str]) -> list[str]:
    """``--ncu-arg VALUE`` as DESIGN writes it, even when VALUE starts with ``-`` (``--ncu-arg --kill``),
    which argparse alone would read as an option: rewrite it to ``--ncu-arg=VALUE`` before parsing."""
    out: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        if token == "--":
            out.append(token)
            out.extend(tokens)
            break
        if token == "--ncu-arg":
            value = next(tokens, None)
            out.append(token if value is None else f"--ncu-arg={value}")
        else:
            out.append(token)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run a CUDA workload under Nsight Compute and summarise its bottleneck; "
        "or 'parse FILE' to summarise an existing ncu export.",
    )
    parser.add_argument("--ncu", help="path to ncu (default: PATH, then /opt/nvidia/nsight-compute)")
    parser.add_argument(
        "--set",
        default="basic",
        help="ncu section set (default: basic); one this ncu lacks is served by its equivalent "
        "(basic and default are the same sections) or its default set, named in the summary's ncuSet",
    )
    parser.add_argument(
        "--target-processes",
        choices=TARGET_PROCESSES,
        default="all",
        help="ncu --target-processes: 'all' follows child processes (torchrun, mpirun, a shell wrapper), "
        "'application-only' profiles the root process alone (default: all)",
    )
    parser.add_argument(
        "--launch-skip",
        type=int,
        help="kernel launches to let run first, e.g. warm-up (default: 0); with --launch-count, either "
        "one turns the steady-state profile off and profiles exactly the launches asked for",
    )
    parser.add_argument(
        "--launch-count",
        type=int,
        help=f"kernel launches to profile (default: {DEFAULT_LAUNCH_COUNT} where no steady state is profiled)",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=2000,
        help="steady-state profile: launches the one-metric first pass sees, to find the warm-up and the "
        "repeating step (default: 2000, about 30 s at 15 ms a launch; 0: no first pass, the first launches)",
    )
    parser.add_argument(
        "--coverage",
        type=float,
        default=0.9,
        help="steady-state profile: the share of the step's GPU time the chosen kernels cover (default: 0.9)",
    )
    parser.add_argument(
        "--max-kernels",
        type=int,
        default=45,
        help="steady-state profile: at most this many distinct kernels chosen (default: 45)",
    )
    parser.add_argument(
        "--max-launches",
        type=int,
        default=120,
        help="steady-state profile: at most this many launches in the second pass, about 0.5 s each "
        "with the basic set (default: 120)",
    )
    parser.add_argument(
        "--first-pass-seconds",
        type=float,
        default=300.0,
        help="steady-state profile: the first pass ends the workload after this long, and uses the "
        "launches it saw (default: 300)",
    )
    parser.add_argument(
        "--ncu-arg",
        action="append",
        default=[],
        help="extra argument for ncu (repeatable; values may start with -)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- EXE [ARGS...]")
    return parser


def main(argv: Sequence[str], stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    argv = list(argv)
    if argv[:1] == ["parse"]:
        if len(argv) != 2:
            print(f"usage: {PROG} parse FILE", file=stderr)
            return 2
        return parse_file(argv[1], stdout, stderr)
    args = build_parser().parse_args(join_ncu_args(argv))
    problems = [
        ("--launch-count", "must be at least 1", args.launch_count is not None and args.launch_count < 1),
        ("--launch-skip", "must be 0 or more", args.launch_skip is not None and args.launch_skip < 0),
        ("--window", "must be 0 or more", args.window < 0),
        ("--coverage", "must be more than 0 and at most 1", not 0 < args.coverage <= 1),
        ("--max-kernels", "must be at least 1", args.max_kernels < 1),
        ("--max-launches", "must be at least 1", args.max_launches < 1),
        ("--first-pass-seconds", "must be more than 0", args.first_pass_seconds <= 0),
    ]
    for flag, rule, broken in problems:
        if broken:
            print(f"kratos-runner: {flag} {rule}", file=stderr)
            return 2
    return profile(args, stdout, stderr)
