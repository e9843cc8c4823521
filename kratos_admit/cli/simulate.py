"""simulate: a trace replayed under each placement policy, on the model or on a real cluster."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any, TextIO

from kratos_admit.cli.common import (
    CONFIG_HELP,
    Command,
    ExitStatus,
    UsageError,
    add_command,
    add_path,
    config_of,
)
from kratos_admit.domain.config import Config
from kratos_admit.model.catalog import Catalog, load_catalog
from kratos_admit.simulation.inputs import load_cluster, load_trace, load_truth
from kratos_admit.simulation.report import ONE_SEED, format_results, format_spread, load_plotter, spread
from kratos_admit.simulation.result import SimulationResult
from kratos_admit.simulation.scheduling import SimNode
from kratos_admit.simulation.trace import Policy, Progress, SimulationError, Trace, Truth


def add_simulate_command(commands: Any) -> None:
    simulate = add_command(
        commands, "simulate", help="replay a trace of Jobs on a modelled cluster under each placement policy"
    )
    add_path(
        simulate, "--cluster", "FILE", "Node YAML of the cluster (product labels, nvidia.com/gpu capacity)"
    )
    add_path(simulate, "--trace", "FILE", "the trace: {jobs: [{name, workload, arrival, gpus, ...}]}")
    add_path(simulate, "--truth", "FILE", "each product's real sustained figures (default: the catalog's)")
    add_path(simulate, "--config", "FILE", CONFIG_HELP)
    simulate.add_argument(
        "--seed", type=int, default=1, metavar="N", help="seed of the runtime noise and ties"
    )
    simulate.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="run seeds --seed to --seed + N - 1 and add how far they move each policy (the table and the "
        "plot are the first seed's)",
    )
    simulate.add_argument(
        "--noise", type=float, default=0.05, metavar="F", help="runs vary within 1 +- F of the model"
    )
    simulate.add_argument(
        "--exploration-share",
        type=float,
        default=None,
        metavar="F",
        help="the share of each workload's Jobs kratos explores with (config explorationShare, 0.05); "
        "kratos-no-exploration is the same run with 0",
    )
    simulate.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="a table for people, or JSON"
    )
    add_path(simulate, "--plot", "FILE", "also draw each policy's JCT distribution into FILE (needs [plot])")
    add_path(
        simulate,
        "--kubeconfig",
        "FILE",
        "run on this cluster instead of the model: fake Nodes, its API server and kube-scheduler",
    )
    simulate.add_argument(
        "--time-scale",
        type=float,
        default=0.01,
        metavar="F",
        help="with --kubeconfig: real seconds per simulated second",
    )


def cmd_simulate(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    # the fit under the replay reads numpy arrays: imported by this command alone, so the webhook and
    # the other commands, which never fit, do not load numpy
    from kratos_admit.simulation.replay import simulate  # noqa: PLC0415

    for flag, value in (("--cluster", args.cluster), ("--trace", args.trace)):
        if value is None:
            raise UsageError(f"simulate needs {flag} FILE")
    if not 0 <= args.noise < 1:
        raise UsageError(f"--noise: {args.noise} is not a fraction from 0 to below 1")
    if args.seeds < 1:
        raise UsageError(f"--seeds: {args.seeds} is not a number of runs (1 or more)")
    if args.seeds > 1 and args.kubeconfig is not None:
        raise UsageError("--seeds: a run on a real cluster (--kubeconfig) takes one seed")
    plot = None
    if args.plot is not None:
        plot = load_plotter()  # before the run: a missing extra is said at once
    config = config_of(args)
    if args.exploration_share is not None:
        if not 0 <= args.exploration_share <= 1:
            raise UsageError(f"--exploration-share: {args.exploration_share} is not a fraction from 0 to 1")
        config = config.model_copy(update={"exploration_share": args.exploration_share})
    catalog = load_catalog(config.catalog_file)
    nodes = load_cluster(args.cluster, catalog)
    trace = load_trace(args.trace, catalog)
    truth = load_truth(args.truth, catalog)
    if not 0 < args.time_scale <= 1:
        raise UsageError(f"--time-scale: {args.time_scale} is not a fraction above 0 and at most 1")
    try:
        if args.kubeconfig is not None:
            result = asyncio.run(
                _simulate_on_cluster(
                    args.kubeconfig,
                    trace=trace,
                    nodes=nodes,
                    truth=truth,
                    config=config,
                    catalog=catalog,
                    seed=args.seed,
                    noise=args.noise,
                    time_scale=args.time_scale,
                )
            )
        else:
            line = ProgressLine(stderr) if stderr.isatty() and args.output != "json" else None
            try:
                runs = [
                    (seed, simulate(trace, nodes, truth=truth, config=config, catalog=catalog, seed=seed,
                                    noise=args.noise, progress=None if line is None else line.of(prefix)))
                    for seed, prefix in _seeds(args.seed, args.seeds)
                ]  # fmt: skip
            finally:  # the table, or the one line of an error, starts on a clean line
                if line is not None:
                    line.clear()
            result = runs[0][1]
    except SimulationError as exc:
        raise UsageError(str(exc)) from None
    if args.output == "json":
        found = result.as_dict()
        if args.kubeconfig is None and args.seeds > 1:
            found["seeds"] = spread(runs)  # beside DESIGN's keys, which hold the first seed's run
        stdout.write(json.dumps(found, indent=2) + "\n")
    else:
        stdout.write(format_results(result))
        if args.kubeconfig is None:
            stdout.write("\n" + (format_spread(runs) if args.seeds > 1 else ONE_SEED))
    if plot is not None:
        plot(result, args.plot)
        print(f"kratos-admit simulate: plot of seed {args.seed} written to {args.plot}", file=stderr)
    return ExitStatus.OK


def _seeds(first: int, count: int) -> list[tuple[int, str]]:
    """Each seed to run, and how its progress names it (nothing where there is one)."""
    return [
        (seed, f"seed {seed} ({n + 1} of {count}), " if count > 1 else "")
        for n, seed in enumerate(range(first, first + count))
    ]


class ProgressLine:
    """Where a long run stands, on a terminal: one line rewritten in place (each policy's Jobs finished
    against the trace's), at most ten times a second, cleared at the end so the table starts clean.
    Nothing of it reaches a file, a pipe or JSON output: the caller makes one only for a terminal."""

    def __init__(self, stream: TextIO, *, interval: float = 0.1) -> None:
        self.stream, self.interval, self.shown = stream, interval, 0.0

    def of(self, prefix: str) -> Progress:
        def told(policy: Policy, finished: int, total: int) -> None:
            now = time.monotonic()
            if finished < total and now - self.shown < self.interval:
                return
            self.shown = now
            self.stream.write(f"\r\x1b[Ksimulate: {prefix}{policy}: {finished}/{total} Jobs finished")
            self.stream.flush()

        return told

    def clear(self) -> None:
        self.stream.write("\r\x1b[K")
        self.stream.flush()


async def _simulate_on_cluster(
    kubeconfig: Path,
    *,
    trace: Trace,
    nodes: list[SimNode],
    truth: Truth,
    config: Config,
    catalog: Catalog,
    seed: int,
    noise: float,
    time_scale: float,
) -> SimulationResult:
    from aiohttp import ClientError  # noqa: PLC0415 (see LAZY_ERRORS)
    from kubernetes_asyncio.client.exceptions import ApiException  # noqa: PLC0415

    from kratos_admit.edge.kube import api_client, check_reachable  # noqa: PLC0415
    from kratos_admit.simulation.on_cluster import simulate_on_cluster  # noqa: PLC0415

    api = await api_client(kubeconfig)
    try:
        await check_reachable(api)
        return await simulate_on_cluster(
            api,
            trace,
            nodes,
            truth=truth,
            config=config,
            catalog=catalog,
            seed=seed,
            noise=noise,
            time_scale=time_scale,
        )
    except ApiException as exc:
        raise UsageError(
            f"--kubeconfig {kubeconfig}: the API server refused: {exc.status} {exc.reason}"
        ) from None
    except ClientError as exc:
        raise UsageError(f"--kubeconfig {kubeconfig}: cannot reach the API server: {exc}") from None
    finally:
        await api.close()


COMMANDS: dict[str, Command] = {"simulate": cmd_simulate}
