"""Wait or run slow (docs/placement.md): KRATOS's cap on the predicted slowdown, on contended traces.

    .venv/bin/python bench/wait_or_run_slow.py                 # the traces, seeds 1-5, the chosen default
    .venv/bin/python bench/wait_or_run_slow.py --caps 0 2 3 4 6 10 --seeds 1 2 3 4 5
    .venv/bin/python bench/wait_or_run_slow.py --json          # one JSON object, for the docs

Each trace is a Poisson stream of single-GPU Jobs of five workloads whose GPU time goes to one unit
above all (tensor, FP64, FP32, DRAM) or to a mix (a training step), on a cluster whose fast GPUs are
few and slow ones many; the truth is the catalog within a few percent. For every cap it replays the
trace under ``default`` (no KRATOS), ``kratos`` (the admission engine with ``maxSlowdown`` set to the
cap, 0: no cap; and a Job that finds no acceptable product free escapes onto a kept-off one with room
where it is predicted to finish sooner than by waiting, as the controller lets it), ``kratos-cap``
(the cap alone, without the escape: kratos before it), ``kratos-eft`` (a load-aware rule, modelled
only: each Job waits for the product where it is predicted to finish first, the wait counted), the
greedy ``oracle`` (every Job on the truly fastest free
product) and ``oracle-wait`` (the truth with the same cap), and prints the mean and p95 JCT of each,
averaged over the seeds, with the ratios the docs quote. A few minutes on 2 CPUs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kratos_admit.domain import vocabulary as v  # noqa: E402
from kratos_admit.domain.config import MAX_SLOWDOWN_DEFAULT, Config  # noqa: E402
from kratos_admit.domain.vocabulary import Unit  # noqa: E402
from kratos_admit.model.catalog import load_catalog  # noqa: E402
from kratos_admit.simulation.replay import simulate  # noqa: E402
from kratos_admit.simulation.scheduling import SimNode  # noqa: E402
from kratos_admit.simulation.trace import Figures, Policy, Trace, TraceJob, Truth  # noqa: E402

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
A10 = "NVIDIA-A10"
L4 = "NVIDIA-L4"
T4 = "Tesla-T4"

# workload: (time shares on the A100, as a profile's status.timeShares; sm and memory throughput in %;
# seconds on the A100)
Workloads = dict[str, tuple[dict[Unit, float], float, float, float]]
WORKLOADS: Workloads = {
    "llm-train": ({"tensor": 0.62, "memory": 0.18, "latency": 0.20}, 71.0, 42.0, 1200.0),
    "cfd-fp64": ({"fp64": 0.80, "memory": 0.12, "latency": 0.08}, 86.0, 30.0, 900.0),
    "nbody-fp32": ({"fp32": 0.78, "memory": 0.10, "latency": 0.12}, 88.0, 12.0, 600.0),
    "stream-dram": ({"memory": 0.85, "latency": 0.15}, 9.0, 90.0, 600.0),
    "resnet-step": ({"tensor": 0.40, "fp32": 0.15, "memory": 0.30, "latency": 0.15}, 62.0, 58.0, 900.0),
}
# only tensor, training and decode work: no product many times slower than another for it (DESIGN
# "Do no harm")
TENSOR_ONLY: Workloads = {
    "llm-train": WORKLOADS["llm-train"],
    "resnet-step": WORKLOADS["resnet-step"],
    "llm-decode": ({"memory": 0.70, "tensor": 0.10, "latency": 0.20}, 20.0, 80.0, 900.0),
}


@dataclass(frozen=True)
class Shape:
    name: str
    cluster: dict[str, tuple[int, int]]  # product -> (nodes, GPUs per node)
    workloads: Workloads
    every: float  # mean seconds between arrivals
    jobs: int
    gangs: int = 0  # every gangs-th Job a gang of two single-GPU Pods, of a workload of its own (0: none)


SHAPES: tuple[Shape, ...] = (
    Shape("few-fast-20s", {H100: (1, 4), A100: (1, 4), L40S: (4, 4), A10: (4, 4)}, WORKLOADS, 20.0, 300),
    Shape("few-fast-40s", {H100: (1, 4), A100: (1, 4), L40S: (4, 4), A10: (4, 4)}, WORKLOADS, 40.0, 300),
    Shape("a100-fleet-a10s-25s", {A100: (2, 8), A10: (8, 4)}, WORKLOADS, 25.0, 300),
    Shape("h100-l4-tensor-15s", {H100: (1, 8), L4: (6, 4)}, TENSOR_ONLY, 15.0, 300),
    # tensor work where the slow product is many times slower and the fast GPUs cannot carry the load
    # alone: where a fixed cap harms and only a load-aware rule gains
    Shape("h100-t4-tensor-15s", {H100: (1, 8), T4: (6, 4)}, TENSOR_ONLY, 15.0, 300),
    # the same tensor work with every third Job a 2-Pod gang: gangs wait whole and never escape, so a
    # cap tighter than their slowdown on the L4 keeps them waiting for the one H100 server
    Shape("h100-l4-gangs-15s", {H100: (1, 8), L4: (6, 4)}, TENSOR_ONLY, 15.0, 300, gangs=3),
)


def trace_of(shape: Shape, seed: int) -> tuple[Trace, list[SimNode], Truth]:
    catalog = load_catalog()
    rng = random.Random(seed)
    names = sorted(shape.workloads)
    arrival, jobs = 0.0, []
    for i in range(shape.jobs):
        workload = names[i % len(names)] if i < len(names) else rng.choice(names)
        shares, sm, mem, seconds = shape.workloads[workload]
        metrics = {
            "smThroughput": f"{sm:.2f}",
            "memoryThroughput": f"{mem:.2f}",
            "achievedOccupancy": "60.00",
        }
        gang = shape.gangs > 0 and i % shape.gangs == shape.gangs - 1
        jobs.append(
            TraceJob(
                f"{workload}-{i:03d}",
                f"{workload}-gang" if gang else workload,
                round(arrival, 1),
                1,
                A100,
                round(seconds * rng.uniform(0.9, 1.1), 1),
                metrics,
                shares,
                pods=2 if gang else 1,
            )
        )
        arrival += rng.expovariate(1 / shape.every)
    nodes = [
        SimNode(
            f"{product.lower()}-{i}",
            {v.GPU_PRESENT_LABEL: "true", v.GPU_PRODUCT_LABEL: product},
            gpus,
            64000,
            512 << 30,
        )
        for product, (count, gpus) in shape.cluster.items()
        for i in range(count)
    ]
    truth_rng = random.Random(1000 + seed)
    figures = {}
    for product in shape.cluster:
        entry = catalog.lookup(product)
        assert entry is not None
        figures[product] = Figures(
            entry.sustained_fp32_tflops * truth_rng.uniform(0.97, 1.03),
            entry.sustained_bandwidth_gbs * truth_rng.uniform(0.97, 1.03),
        )
    return Trace(tuple(jobs)), nodes, Truth(catalog, figures)


POLICIES: tuple[Policy, ...] = ("default", "kratos", "kratos-cap", "kratos-eft", "oracle", "oracle-wait")


def run(shape: Shape, cap: float, seed: int) -> dict[str, Any]:
    trace, nodes, truth = trace_of(shape, seed)
    config = Config(max_slowdown=cap)
    result = simulate(
        trace, nodes, truth=truth, config=config, catalog=load_catalog(), seed=seed, policies=POLICIES
    )
    found: dict[str, Any] = {
        name: {"mean": r.mean_jct, "p95": r.p95_jct, "gangs": r.mean_jct_of(True) or 0.0}
        for name, r in result.policies.items()
    }
    found["predictionError"] = max(result.prediction_error.values(), default=0.0)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--caps", type=float, nargs="+", default=[0.0, MAX_SLOWDOWN_DEFAULT])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--shapes", nargs="+", default=[s.name for s in SHAPES])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    rows = []
    for shape in (s for s in SHAPES if s.name in args.shapes):
        for cap in args.caps:
            runs = [run(shape, cap, seed) for seed in args.seeds]

            def mean_of(policy: str, key: str, runs: list[dict[str, Any]] = runs) -> float:
                return statistics.fmean(float(r[policy][key]) for r in runs if policy in r)

            row: dict[str, Any] = {
                "trace": shape.name,
                "cap": cap,
                "seeds": list(args.seeds),
                **{
                    f"{p}.{k}": round(mean_of(p, k), 1)
                    for p in POLICIES
                    for k in ("mean", "p95", *(("gangs",) if shape.gangs else ()))
                    if cap or p != "oracle-wait"
                },
                "worstPredictionError": round(max(float(r["predictionError"]) for r in runs), 4),
                # the ratios per seed, then their range: one seed is an anecdote
                "kratosVsOracle": [
                    round(float(r["kratos"]["mean"]) / float(r["oracle"]["mean"]), 3) for r in runs
                ],
                "kratosVsDefault": [
                    round(float(r["kratos"]["mean"]) / float(r["default"]["mean"]), 3) for r in runs
                ],
            }
            rows.append(row)
            if not args.json:
                print(
                    f"{shape.name:22} cap {cap:>4g}: kratos mean {row['kratos.mean']:>7.0f} p95 {row['kratos.p95']:>7.0f} | "
                    f"oracle {row['oracle.mean']:>7.0f}/{row['oracle.p95']:>7.0f} | default {row['default.mean']:>7.0f} | "
                    + (f"oracle-wait {row['oracle-wait.mean']:>7.0f} | " if cap else "")
                    + f"eft {row['kratos-eft.mean']:>7.0f}/{row['kratos-eft.p95']:>7.0f} | "
                    + f"cap alone {row['kratos-cap.mean']:>7.0f}/{row['kratos-cap.p95']:>7.0f} | "
                    + (
                        f"gangs kratos {row['kratos.gangs']:.0f} oracle {row['oracle.gangs']:.0f} "
                        f"default {row['default.gangs']:.0f} | "
                        if shape.gangs
                        else ""
                    )
                    + f"k/oracle {min(row['kratosVsOracle']):.2f}-{max(row['kratosVsOracle']):.2f} "
                    f"k/default {min(row['kratosVsDefault']):.2f}-{max(row['kratosVsDefault']):.2f} "
                    f"err {row['worstPredictionError']:.1%}",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"commit": commit, "rows": rows}))
    else:
        print(f"commit {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
