"""How ``kratos-admit simulate`` shows its results: a table, and a plot of each policy's JCT
distribution. matplotlib is the optional ``[plot]`` extra, imported only when a plot is asked for,
so the base install stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kratos_admit.simulation.result import SimulationResult
from kratos_admit.simulation.trace import FIGURES

Plotter = Callable[[SimulationResult, Path], None]
PLOT_METADATA_KEY = "Description"  # a PNG tEXt keyword matplotlib writes


class PlotError(ValueError):
    """No plot can be drawn (the extra is not installed, or the file cannot be written)."""


def _versus(default_jct: float, jct: float) -> str:
    """How a policy's mean JCT compares with the default's, in words a reader cannot misread."""
    if not jct or not default_jct:
        return "-"
    if default_jct >= jct:
        return f"{default_jct / jct:.2f}x faster"
    return f"{jct / default_jct:.2f}x slower"


def format_results(result: SimulationResult) -> str:
    header = ["POLICY", "MEAN JCT s", "P95 JCT s", "MAKESPAN s", "GPU-HOURS", "MEAN JCT VS DEFAULT"]
    default = result.policies.get("default")
    gangs = any(r.gangs for r in result.policies.values())
    if gangs:  # a trace with gangs: their JCT and the single-GPU Jobs' apart
        header += ["GANGS MEAN JCT s", "SINGLE-GPU MEAN JCT s"]
    rows = []
    for name, r in result.policies.items():
        ratio = _versus(default.mean_jct, r.mean_jct) if default and name != "default" else "-"
        rows.append(
            [
                name,
                f"{r.mean_jct:.0f}",
                f"{r.p95_jct:.0f}",
                f"{r.makespan:.0f}",
                f"{r.gpu_seconds / 3600:.1f}",
                ratio,
            ]
            + ([_seconds(r.mean_jct_of(True)), _seconds(r.mean_jct_of(False))] if gangs else [])
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    ]
    explored, plain = result.policies.get("kratos"), result.policies.get("kratos-no-exploration")
    if explored is not None and plain is not None and plain.mean_jct and plain.makespan:
        lines.append("")
        lines.append(
            f"exploration: mean JCT {explored.mean_jct:.0f} s against {plain.mean_jct:.0f} s without "
            f"({explored.mean_jct / plain.mean_jct - 1:+.1%}), makespan {explored.makespan:.0f} s against "
            f"{plain.makespan:.0f} s ({explored.makespan / plain.makespan - 1:+.1%})"
        )
    if result.products:
        lines.append("")
        lines.append(
            "what kratos knew after the trace (prediction error: worst |predicted/true - 1| over the workloads;"
        )
        without = result.without_exploration
        # FP32 and bandwidth always (what a trace by throughputs exercises); tensor and FP64 where a
        # workload's largest unit is theirs
        shown = [
            f
            for f in FIGURES
            if f in ("fp32", "bandwidth") or any(f in k.figure_errors for k in result.products.values())
        ]
        lines.append(
            "each figure: over the workloads whose largest unit it is, FP32 the compute-bound ones and "
            "BANDWIDTH the memory-bound ones by throughputs"
            + ("; in brackets, kratos-no-exploration's):" if without else "):")
        )
        table = [["PRODUCT", "RUNS", "EXPLORED", "FIGURES", "PREDICTION ERROR", *(f.upper() for f in shown)]]
        for p, k in sorted(result.products.items()):
            unexplored = without.get(p)
            table.append(
                [
                    p,
                    str(k.runs),
                    str(k.explored),
                    "calibrated" if k.calibrated else "catalog",
                    _percent(k.prediction_error),
                    *(
                        _percent(k.figure_errors.get(f))
                        + (
                            f" ({_percent(unexplored.figure_errors.get(f))})"
                            if unexplored is not None
                            else ""
                        )
                        for f in shown
                    ),
                ]
            )
        w = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines += ["  " + "  ".join(c.ljust(x) for c, x in zip(row, w, strict=True)).rstrip() for row in table]
    for what, errors in (
        ("gangs", result.gang_prediction_error),
        ("single-GPU Jobs", result.single_prediction_error),
    ):
        if errors:
            worst = max(errors, key=lambda p: errors[p])
            lines.append(
                f"prediction error over the {what}' workloads alone: worst {errors[worst]:.1%} ({worst}); "
                + ", ".join(f"{p} {e:.1%}" for p, e in sorted(errors.items()))
            )
    return "\n".join(lines) + "\n"


ONE_SEED = (
    "one seed: other runtime draws and scheduler tie-breaks move these figures by several percent, "
    "and a policy's lead over another can turn (docs/placement.md, \"What is signal and what is "
    'noise"); --seeds 5 adds their spread\n'
)


def spread(runs: Sequence[tuple[int, SimulationResult]]) -> dict[str, Any]:
    """Each policy's mean JCT under each seed, for JSON beside DESIGN's keys (which hold the first
    seed's run)."""
    return {
        "seeds": [seed for seed, _ in runs],
        "meanJctSeconds": {
            name: [round(r.policies[name].mean_jct, 1) for _, r in runs] for name in runs[0][1].policies
        },
    }


def format_spread(runs: Sequence[tuple[int, SimulationResult]]) -> str:
    """How far the seeds move each policy: its mean JCT under each, and its range against the default's
    under the same seed."""
    seeds = [seed for seed, _ in runs]
    lines = [
        f"over seeds {seeds[0]} to {seeds[-1]} (the table above is seed {seeds[0]}'s), mean JCT s and "
        "against the default under the same seed:"
    ]
    names = list(runs[0][1].policies)
    table = [["POLICY", *(f"SEED {seed}" for seed in seeds), "MEAN", "VS DEFAULT"]]
    for name in names:
        means = [r.policies[name].mean_jct for _, r in runs]
        ratios = [
            r.policies["default"].mean_jct / r.policies[name].mean_jct
            for _, r in runs
            if "default" in r.policies and r.policies[name].mean_jct
        ]
        versus = "-"
        if name != "default" and ratios:
            low, high = min(ratios), max(ratios)
            versus = (
                _versus(1.0, 1 / low)
                if low == high
                else f"{_versus(1.0, 1 / low)} to {_versus(1.0, 1 / high)}"
            )
        table.append([name, *(f"{m:.0f}" for m in means), f"{sum(means) / len(means):.0f}", versus])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    ]
    return "\n".join(lines) + "\n"


def plot_labels(result: SimulationResult) -> list[str]:
    """The plot's legend, one label per policy: also written into the PNG's metadata, so a reader (and
    the suite, docs/generate.py) can tell what figures a picture shows without looking at it."""
    return [f"{name} (mean {r.mean_jct / 60:.0f} min)" for name, r in result.policies.items()]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def load_plotter() -> Plotter:
    """The plotting function, or a PlotError saying how to install the extra."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
    except ImportError:
        raise PlotError(
            "--plot needs matplotlib, which is not installed: pip install 'kratos-admit[plot]'"
        ) from None
    matplotlib.use("Agg")
    pyplot: Any = importlib.import_module("matplotlib.pyplot")

    def plot(result: SimulationResult, path: Path) -> None:
        figure, axes = pyplot.subplots(figsize=(7.5, 4.2), dpi=120)
        labels = plot_labels(result)
        for label, r in zip(labels, result.policies.values(), strict=True):
            ordered = sorted(s / 60 for s in r.jct)
            share = [(i + 1) / len(ordered) for i in range(len(ordered))]
            axes.step(ordered, share, where="post", label=label)
        axes.set_xscale("log")
        axes.set_xlabel("job completion time (minutes, log scale)")
        axes.set_ylabel("share of Jobs finished")
        axes.set_title("JCT distribution per placement policy")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(loc="lower right")
        figure.tight_layout()
        try:
            figure.savefig(path, metadata={PLOT_METADATA_KEY: "\n".join(labels)})
        except (OSError, ValueError) as exc:
            raise PlotError(f"--plot {path}: cannot write: {exc}") from None
        finally:
            pyplot.close(figure)

    return plot
