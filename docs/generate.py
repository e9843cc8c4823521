"""Everything in the docs that the code produces, written by the code: one command rewrites it all, and
the suite (tests/test_docs_generated.py) fails where the docs and the code disagree.

    .venv/bin/python docs/generate.py            # rewrite every block, the plot and the field table
    .venv/bin/python docs/generate.py --check    # exit 1 naming each one that differs
    .venv/bin/python docs/generate.py --only readme-rankings --only training-hints

A generated block of a Markdown page sits between ``<!-- generated: NAME (docs/generate.py) -->`` and
``<!-- end: NAME -->``; the text around it is the author's. The simulator's blocks run the example
trace under five seeds (a few minutes on two CPUs); the plot needs the ``[plot]`` extra.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
SIMULATION = EXAMPLES / "simulation"
PLOT = REPO / "docs" / "placement-jct.png"
SEEDS = 5
# the example run as docs/placement.md shows the command (its --plot aside)
SIMULATE_ARGS = [
    "simulate",
    "--cluster", str(SIMULATION / "cluster.yaml"),
    "--trace", str(SIMULATION / "trace.yaml"),
    "--truth", str(SIMULATION / "truth.yaml"),
]  # fmt: skip
RANKED_EXAMPLES = ("vector-add", "nbody")  # README "Try it offline"


def _cli(*argv: str) -> str:
    """What ``kratos-admit ARGV`` prints on stdout (exit 0 or 1; anything else is a broken example)."""
    from kratos_admit.cli.main import main  # noqa: PLC0415 (docs/ is no package: its imports run late)

    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), stdout=out, stderr=err)
    if status not in (0, 1):
        raise SystemExit(f"kratos-admit {' '.join(argv)}: exit {int(status)}: {err.getvalue()}")
    return out.getvalue()


def fenced(text: str, language: str = "") -> str:
    return f"```{language}\n{text.rstrip()}\n```\n"


# --- the blocks ------------------------------------------------------------------------------------


def readme_rankings() -> str:
    """How each example profile weighs the products of examples/nodes.yaml, and which change places."""
    orders: dict[str, list[tuple[str, int]]] = {}
    lines = []
    for workload in RANKED_EXAMPLES:
        path = EXAMPLES / "profiles" / f"{workload}-profile.yaml"
        bound = yaml.safe_load(path.read_text("utf-8"))["status"]["boundType"]
        rows = json.loads(
            _cli("placement", "-p", str(path), "--nodes", str(EXAMPLES / "nodes.yaml"), "-o", "json")
        )
        orders[workload] = [(r["product"], r["weight"]) for r in rows]
        weights = ", ".join(f"{p} {w}" for p, w in orders[workload])
        lines.append(f"{workload} ({bound}-bound): {weights}")
    first, second = ([p for p, _ in orders[w]] for w in RANKED_EXAMPLES)
    swapped = [
        f"{a} and {b}"
        for i, a in enumerate(first)
        for b in first[i + 1 :]
        if b in second and a in second and second.index(b) < second.index(a)
    ]
    said = "; ".join(swapped) if swapped else "none"
    return fenced("\n".join(lines)) + f"\nProducts that change places from {RANKED_EXAMPLES[0]} to " \
        f"{RANKED_EXAMPLES[1]}: {said}.\n"  # fmt: skip


def training_hints() -> str:
    """The hints record of examples/llama-ddp-job.yaml, as review gives it."""
    reviewed = json.loads(
        _cli(
            "review",
            "-f",
            str(EXAMPLES / "llama-ddp-job.yaml"),
            "--nodes",
            str(EXAMPLES / "nodes.yaml"),
            "-o",
            "json",
        )
    )
    [job] = [r for r in reviewed if r["kind"] == "Job"]
    record = json.loads(job["object"]["metadata"]["annotations"]["gpu.scheduler.io/hints"])
    return fenced(json.dumps(record, indent=1), "json")


def simulate_example() -> str:
    """The example run's table, as the documented command prints it (seed 1)."""
    return fenced(_cli(*SIMULATE_ARGS))


@dataclass
class SimulatorRuns:
    """The example under seeds 1 to SEEDS, run once for the seeds block and the plot."""

    runs: list[tuple[int, Any]]

    @classmethod
    def run(cls) -> SimulatorRuns:
        from kratos_admit.domain.config import Config  # noqa: PLC0415
        from kratos_admit.model.catalog import load_catalog  # noqa: PLC0415
        from kratos_admit.simulation.inputs import load_cluster, load_trace, load_truth  # noqa: PLC0415
        from kratos_admit.simulation.replay import simulate  # noqa: PLC0415

        config = Config()
        catalog = load_catalog(config.catalog_file)
        nodes = load_cluster(SIMULATION / "cluster.yaml", catalog)
        trace = load_trace(SIMULATION / "trace.yaml", catalog)
        truth = load_truth(SIMULATION / "truth.yaml", catalog)
        runs = [
            (seed, simulate(trace, nodes, truth=truth, config=config, catalog=catalog, seed=seed))
            for seed in range(1, SEEDS + 1)
        ]
        return cls(runs)


def seeds_table(runs: Sequence[tuple[int, Any]]) -> str:
    """Each policy's mean JCT in seconds under each seed, and their mean."""
    seeds = [seed for seed, _ in runs]
    lines = [
        "| policy | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
        "|---" * (len(seeds) + 2) + "|",
    ]
    for name in runs[0][1].policies:
        means = [r.policies[name].mean_jct for _, r in runs]
        cells = [f"{m:.0f}" for m in means] + [f"{sum(means) / len(means):.0f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def seed_one_column(block: str) -> dict[str, str]:
    """The seed 1 column of a seeds table: the figures the example's table also shows."""
    rows = [line.split("|")[1:-1] for line in block.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): cells[1].strip() for cells in rows[1:]}


def plot_description(path: Path) -> str:
    """The legend a plot was drawn with, from the PNG's tEXt chunk (report.PLOT_METADATA_KEY): what
    figures a picture shows, read without drawing it again."""
    from kratos_admit.simulation.report import PLOT_METADATA_KEY  # noqa: PLC0415

    data = path.read_bytes()
    for match in re.finditer(rb"tEXt" + re.escape(PLOT_METADATA_KEY.encode()) + rb"\x00", data):
        length = int.from_bytes(data[match.start() - 4 : match.start()], "big")
        return data[match.end() : match.start() + 4 + length].decode("latin-1")
    return ""


# --- where each block goes -------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    name: str
    page: str  # relative to the repository
    make: Callable[[], str]


CHEAP_BLOCKS = [
    Block("readme-rankings", "README.md", readme_rankings),
    Block("training-hints", "docs/distributed-training.md", training_hints),
]
SIMULATOR_BLOCKS = ["simulate-example", "simulate-seeds"]


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- generated: {name} (docs/generate.py) -->\n", f"<!-- end: {name} -->"


def block_in(page: str, name: str) -> str:
    """The text of block ``name`` in ``page`` now."""
    text = (REPO / page).read_text("utf-8")
    start, end = _markers(name)
    if start not in text or end not in text:
        raise SystemExit(f"{page}: no block {name} (markers {start.strip()} ... {end})")
    return text.split(start, 1)[1].split(end, 1)[0]


def write_block(page: str, name: str, content: str) -> bool:
    """Block ``name`` of ``page`` made ``content``; True where that changed the page."""
    path = REPO / page
    text = path.read_text("utf-8")
    start, end = _markers(name)
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    new = before + start + content + end + after
    path.write_text(new, "utf-8")
    return new != text


def field_table_text() -> str:
    from kubernetes_asyncio.client import models  # noqa: PLC0415 (about a second: only here)

    from kratos_admit.admission.strict import derive_field_table  # noqa: PLC0415

    return json.dumps(derive_field_table(models), indent=1) + "\n"


FIELD_TABLE = REPO / "kratos_admit" / "admission" / "data" / "kubernetes_fields.json"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming what differs")
    parser.add_argument("--only", action="append", metavar="NAME", help="only this block (repeatable)")
    args = parser.parse_args(argv)
    wanted = set(args.only or [b.name for b in CHEAP_BLOCKS] + SIMULATOR_BLOCKS + ["kubernetes-fields"])
    differ: list[str] = []
    for block in CHEAP_BLOCKS:
        if block.name in wanted:
            content = block.make()
            if block_in(block.page, block.name) != content:
                differ.append(f"{block.page}: {block.name}")
                if not args.check:
                    write_block(block.page, block.name, content)
    if "kubernetes-fields" in wanted:
        table = field_table_text()
        if FIELD_TABLE.read_text("utf-8") != table:
            differ.append(str(FIELD_TABLE.relative_to(REPO)))
            if not args.check:
                FIELD_TABLE.write_text(table, "utf-8")
    if wanted & set(SIMULATOR_BLOCKS):
        differ += _simulator(check=args.check)
    for what in differ:
        print(f"{'differs' if args.check else 'rewrote'}: {what}", file=sys.stderr)
    return 1 if args.check and differ else 0


def _simulator(*, check: bool) -> list[str]:
    from kratos_admit.simulation.report import load_plotter, plot_labels  # noqa: PLC0415

    runs = SimulatorRuns.run().runs
    page = "docs/placement.md"
    differ = []
    for name, content in (("simulate-example", simulate_example()), ("simulate-seeds", seeds_table(runs))):
        if block_in(page, name) != content:
            differ.append(f"{page}: {name}")
            if not check:
                write_block(page, name, content)
    if plot_description(PLOT) != "\n".join(plot_labels(runs[0][1])):
        differ.append(str(PLOT.relative_to(REPO)))
        if not check:
            load_plotter()(runs[0][1], PLOT)
    return differ


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
