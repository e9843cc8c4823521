"""Writes tests/data/simulation-units/trace.yaml: the held-out trace of the units model (issue 43),
reproducibly.

    .venv/bin/python tests/data/simulation-units/make_trace.py > tests/data/simulation-units/trace.yaml

Ten workloads whose GPU time goes to different units, with their time shares and SM/memory
throughputs as the runner would report them on an H100 80GB HBM3 (tensor-core training steps, an
FP64 GEMM and an FP64 solver, an FP32 n-body and Monte Carlo, memory-bound triad and decode, a transformer step as
mixed as the one measured for the issue, and a pointer chase), 300 Jobs arriving as a Poisson
process about one every 75 s, 1 or 2 GPUs each, runtimes on the H100 within 5 % of each workload's
typical length. Seeded: the same file every time.
"""

from __future__ import annotations

import random
import sys

import yaml

REFERENCE = "NVIDIA-H100-80GB-HBM3"
JOBS = 300
MEAN_GAP_SECONDS = 75.0
# name: (time shares on the H100, smThroughput, memoryThroughput, typical seconds on the H100)
WORKLOADS: dict[str, tuple[dict[str, float], float, float, float]] = {
    "bf16-pretrain": ({"tensor": 0.86, "memory": 0.06, "latency": 0.08}, 88.0, 35.0, 2400.0),
    "llm-finetune": ({"tensor": 0.55, "memory": 0.27, "latency": 0.18}, 62.0, 55.0, 1800.0),
    "transformer-step": ({"tensor": 0.30, "memory": 0.27, "latency": 0.43}, 45.0, 40.0, 1200.0),
    "dgemm": ({"fp64": 0.94, "latency": 0.06}, 92.0, 12.0, 1200.0),
    "cfd-fp64": ({"fp64": 0.55, "memory": 0.35, "latency": 0.10}, 70.0, 60.0, 1500.0),
    "nbody": ({"fp32": 0.90, "latency": 0.10}, 90.0, 8.0, 1500.0),
    "monte-carlo": ({"fp32": 0.85, "memory": 0.05, "latency": 0.10}, 88.0, 6.0, 900.0),
    "stream-triad": ({"memory": 0.90, "latency": 0.10}, 8.0, 90.0, 900.0),
    "llm-decode": ({"memory": 0.72, "tensor": 0.12, "latency": 0.16}, 25.0, 80.0, 1800.0),
    "pointer-chase": ({"latency": 0.95, "memory": 0.05}, 5.0, 10.0, 600.0),
}


def trace(seed: int = 43) -> dict[str, object]:
    rng = random.Random(seed)
    names = sorted(WORKLOADS)
    arrival, jobs = 0.0, []
    for i in range(JOBS):
        workload = names[i % len(names)] if i < len(names) else rng.choice(names)
        shares, sm, mem, typical = WORKLOADS[workload]
        jobs.append(
            {
                "name": f"{workload}-{i:03d}",
                "workload": workload,
                "arrival": round(arrival, 1),
                "gpus": rng.choice([1, 1, 1, 2]),
                "referenceProduct": REFERENCE,
                "referenceSeconds": round(typical * rng.uniform(0.95, 1.05), 1),
                "metrics": {"smThroughput": str(sm), "memoryThroughput": str(mem)},
                "timeShares": {unit: f"{share:.2f}" for unit, share in shares.items()},
            }
        )
        arrival += rng.expovariate(1 / MEAN_GAP_SECONDS)
    return {"jobs": jobs}


if __name__ == "__main__":
    sys.stdout.write("# written by make_trace.py beside it; do not edit by hand\n")
    yaml.safe_dump(trace(), sys.stdout, sort_keys=False, width=120)
    sys.exit(0)
