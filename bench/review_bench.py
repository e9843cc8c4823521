"""The offline review on a big file: ``kratos-admit review`` of N Jobs, wall time, CPU and peak memory.

    .venv/bin/python bench/review_bench.py              # 12,000 Jobs, -o json and -o yaml, best of 3
    .venv/bin/python bench/review_bench.py --jobs 200 --repeat 1   # a quick look

The input is the three example Jobs in turn (vector-add and nbody get ranked hints from their
profiles, matrix-mul the profiling rewrite), each with its own name, written as one multi-document
YAML file. Each run is a fresh ``python -m kratos_admit review`` process: its time is the wall
clock from start to exit, its CPU the user + system time of it and its review workers, and its
peak memory the largest sum over it and its workers of the proportional set size (PSS: a page
shared copy-on-write by n processes counts 1/n in each, so the sum is the memory really in use),
sampled every 10 ms, or the largest single resident set (wait4) if that is more. On a machine
shared with other work the best of ``--repeat`` runs is reported, as timeit does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
JOBS = ("vector-add-job.yaml", "nbody-job.yaml", "new-workload-job.yaml")


@dataclass(frozen=True)
class Run:
    seconds: float
    cpu: float
    peak_mib: float
    status: int
    written: int


def write_input(path: Path, jobs: int) -> int:
    """``jobs`` Jobs, the examples in turn with numbered names; returns the file's size in bytes."""
    templates = [yaml.safe_load((EXAMPLES / name).read_text("utf-8")) for name in JOBS]
    with path.open("w", encoding="utf-8") as out:
        for i in range(jobs):
            job = templates[i % len(templates)]
            job["metadata"]["name"] = f"{job['metadata']['labels']['gpu.scheduler.io/workload']}-{i:05d}"
            out.write("---\n" + yaml.safe_dump(job, sort_keys=False))
    return path.stat().st_size


def tree_pss_kib(pid: int) -> int:
    """Proportional set size of ``pid`` and every descendant, from /proc (0 once it has gone)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/smaps_rollup").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Pss:")), 0)
        pending += [int(child) for child in children]
    return total


def timed_review(manifest: Path, output: str) -> Run:
    command = [sys.executable, "-m", "kratos_admit", "review", "-f", str(manifest), "-o", output,
               "--profiles", str(EXAMPLES / "profiles"), "--nodes", str(EXAMPLES / "nodes.yaml")]  # fmt: skip
    peak = 0
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, cwd=REPO)
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.01):
                peak = max(peak, tree_pss_kib(process.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        done.set()
        sampler.join()
        process.returncode = os.waitstatus_to_exitcode(status)
        written = out.seek(0, os.SEEK_END)
    peak = max(peak, usage.ru_maxrss)  # the largest single process, should sampling have missed it
    return Run(seconds, usage.ru_utime + usage.ru_stime, peak / 1024, process.returncode, written)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=12_000, help="Jobs in the file (12000)")
    parser.add_argument("--output", action="append", choices=("json", "yaml", "patch"), help="(json, yaml)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, the best reported (3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kratos-review-bench-") as tmp:
        manifest = Path(tmp) / "jobs.yaml"
        size = write_input(manifest, args.jobs)
        print(
            f"input: {args.jobs} Jobs, {size / 1e6:.1f} MB; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
        )
        failed = 0
        for output in args.output or ["json", "yaml"]:
            runs = [timed_review(manifest, output) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r.seconds)
            print(
                f"review -o {output:<5} {best.seconds:6.2f} s  (CPU {best.cpu:5.2f} s)  "
                f"peak {max(r.peak_mib for r in runs):6.0f} MiB  output {best.written / 1e6:6.1f} MB  "
                f"exit {best.status}  (all runs: {', '.join(f'{r.seconds:.2f}' for r in runs)} s)"
            )
            failed += any(r.status != 0 for r in runs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
