"""The calibration's fit at scale, in process: what the controller's ``CalibrationController`` pays when
it starts, and when one finished run changes one profile (issue 59).

    .venv/bin/python bench/fit_bench.py                         # 20,000 workloads on three products
    .venv/bin/python bench/fit_bench.py --workloads 5000 --runs 3

Each workload is a mature WorkloadProfile as the controller writes it: time shares drawn per workload
(memory 5-85 %, FP32 2-95 % of what memory leaves), profiled on one of the A100, L40S and L4, observed
on all three with 5 runs each, each product's mean within 5 % of a fixed speed ratio (1 : 1.6 : 3.1).
The samples are the controller's own (``profile_samples``). It prints, in CPU seconds of this process:
the first fit (the factors' fit alone, and its rounds; then the whole ``fit_calibration`` with an
empty ``FitMemo``), then for each of ``--runs`` finished runs (one more run on one workload's sample,
2 % slower) the incremental fit with the memo, the workloads whose shares it re-fitted, and whether
its calibration is byte for byte the one a fit from nothing gives (``--check``: that full fit again).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "profiler-controller"))

from kratos_admit.domain.config import Config
from kratos_admit.model import calibration_fit
from kratos_admit.model.calibration import Sample
from kratos_admit.model.calibration_fit import FitMemo, fit_calibration
from kratos_admit.model.catalog import load_catalog
from kratos_controller.learning import profile_samples

A100, L40S, L4 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S", "NVIDIA-L4"
PRODUCTS = (A100, L40S, L4)
SPEED = {A100: 1.0, L40S: 1.6, L4: 3.1}


def profile(index: int, rng: random.Random) -> dict[str, Any]:
    """A mature profile observed on the three products."""
    memory = rng.uniform(0.05, 0.85)
    fp32 = rng.uniform(0.02, 0.95 - memory)
    profiled = PRODUCTS[index % len(PRODUCTS)]
    return {
        "apiVersion": "gpu.scheduler.io/v1alpha1", "kind": "WorkloadProfile",
        "metadata": {"name": f"w{index}-profile", "namespace": f"team-{index % 50}", "resourceVersion": "1"},
        "spec": {"workload": f"w{index}"},
        "status": {
            "phase": "Ready", "boundType": "memory" if memory > fp32 else "compute",
            "metrics": {"smThroughput": f"{fp32 * 100:.2f}", "memoryThroughput": f"{memory * 100:.2f}"},
            "timeShares": {"tensor": "0.00", "fp32": f"{fp32:.2f}", "fp64": "0.00", "memory": f"{memory:.2f}",
                           "latency": f"{1 - fp32 - memory:.2f}"},
            "gpu": {"product": profiled},
            "observations": [
                {"product": p, "runs": 5,
                 "meanSeconds": f"{100 * SPEED[p] / SPEED[profiled] * rng.uniform(0.95, 1.05):.1f}"}
                for p in PRODUCTS
            ],
        },
    }  # fmt: skip


def cpu() -> float:
    return time.process_time()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=2, help="finished runs, one after another")
    parser.add_argument("--check", action="store_true", help="compare each incremental fit with a full one")
    args = parser.parse_args(argv)
    catalog = load_catalog(Config().catalog_file)
    rng = random.Random(59)
    samples: list[Sample] = [
        s
        for i in range(args.workloads)
        for s in profile_samples([profile(i, rng)], catalog=catalog, reference_product=A100)
    ]
    print(f"{args.workloads} workloads, {len(samples)} samples")
    by_workload: dict[str, list[Sample]] = {}
    for s in samples:
        by_workload.setdefault(s.workload, []).append(s)
    prior = {w: calibration_fit.profile_shares_of(g[0]) for w, g in by_workload.items()}
    start = cpu()
    factors = calibration_fit._fit_factors(samples, catalog, prior, {})
    print(f"the factors' fit: {cpu() - start:.1f} s CPU, {factors.rounds} rounds")
    memo = FitMemo()
    start = cpu()
    fit_calibration(samples, catalog, memo=memo)
    print(f"the first fit (factors and every workload's shares): {cpu() - start:.1f} s CPU")
    for run in range(args.runs):
        i = next(k for k, s in enumerate(samples) if s.product != s.profiled and k >= 7 * run)
        s = samples[i]
        samples[i] = dataclasses.replace(
            s, runs=s.runs + 1, seconds=s.seconds * (s.runs + 1.02) / (s.runs + 1)
        )
        start = cpu()
        incremental = fit_calibration(samples, catalog, memo=memo)
        line = f"run {run + 1} ({s.workload} on {s.product}): {cpu() - start:.1f} s CPU, {memo.refits} shares re-fitted"
        if args.check:
            line += ", equal to a full fit: " + str(
                incremental.to_json() == fit_calibration(samples, catalog).to_json()
            )
        print(line)
    print(f"resident peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
