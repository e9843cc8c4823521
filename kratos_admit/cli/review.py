"""review, test and placement: the offline commands, which read manifests, profiles and Nodes from files."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from kratos_admit.admission.review import Batch, as_json, review_batches, review_body_size, review_namespace
from kratos_admit.cli.common import (
    CONFIG_HELP,
    Command,
    ExitStatus,
    UsageError,
    add_command,
    add_path,
    config_of,
    file_engine,
    signing_key_of,
)
from kratos_admit.cli.placement import cut_line, format_table, placement_header, placement_rows
from kratos_admit.cli.suite import find_suites, format_rows, run_suite
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.manifests import Document, read_manifests
from kratos_admit.domain.profile import RunnerSummary, WorkloadProfile, ready_status
from kratos_admit.edge.files import FileNodeStore, load_calibration, load_profiles
from kratos_admit.model.calibration import NO_CALIBRATION
from kratos_admit.model.catalog import load_catalog


def add_review_command(commands: Any) -> None:
    review = add_command(commands, "review", help="run both webhooks offline on a manifest")
    review.add_argument(
        "-f",
        "--filename",
        required=True,
        action="append",
        metavar="FILE",
        help="manifest (Job, Pod, List, multi-document), a directory of them, or - for stdin; repeatable",
    )
    review.add_argument(
        "-R", "--recursive", action="store_true", help="with -f DIR, also the files in its subdirectories"
    )
    add_path(review, "--config", "FILE", CONFIG_HELP)
    add_path(review, "--profiles", "DIR", "WorkloadProfile YAML files (default: none)")
    add_path(review, "--nodes", "FILE", "Node YAML of the cluster (default: none)")
    review.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help="namespace to review in (default: the object's, else default)",
    )
    review.add_argument("--user", default="kratos-review", metavar="NAME", help="requesting user")
    add_path(review, "--signing-key", "FILE", "signing key (default: the fixed development key)")
    review.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json", "patch"),
        default="yaml",
        help="the allowed objects as mutated, the full decisions, or the JSON patches",
    )


def add_test_command(commands: Any) -> None:
    test = add_command(commands, "test", help="run declarative review suites (kratos-test.yaml) under DIR")
    test.add_argument(
        "directory", nargs="?", default=".", type=Path, metavar="DIR", help="where to look for suites"
    )


def add_placement_command(commands: Any) -> None:
    placement = add_command(
        commands,
        "placement",
        help="show how a profile ranks the cluster's GPU products, and from what figures",
    )
    given = placement.add_mutually_exclusive_group(required=True)
    given.add_argument("-p", "--profile", type=Path, metavar="FILE", help="a WorkloadProfile YAML file")
    given.add_argument(
        "--summary",
        type=Path,
        metavar="FILE",
        help="a runner summary (JSON, as `python3 -m kratos_runner parse` prints it), ranked as the "
        "profile the controller would write from it",
    )
    add_path(placement, "--nodes", "FILE", "Node YAML of the cluster (default: all known GPUs)")
    add_path(placement, "--config", "FILE", CONFIG_HELP)
    add_path(
        placement,
        "--calibration",
        "FILE",
        "the cluster's calibration: ConfigMap kratos-gpu-calibration as YAML, or its calibration.json",
    )
    placement.add_argument(
        "--gpus",
        type=_gpu_count,
        default=1,
        metavar="N",
        help="the GPUs the workload runs on together (a gang's: Pods x GPUs each); its interconnect time "
        "scales by the link it gets on each product (default: 1, no link)",
    )
    placement.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="a table for people, or JSON rows"
    )


def _gpu_count(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a GPU count (a whole number, 1 or more)")
    return int(value)


def _check_body_sizes(documents: list[Document], *, config: Config, namespace: str | None, user: str) -> None:
    """A document whose AdmissionReview the webhook would refuse (413) is refused here too."""
    for document in documents:
        ns = review_namespace(document.object, namespace)
        size = review_body_size(document.object, namespace=ns, user=user)
        if size > config.max_body_bytes:
            raise UsageError(
                f"{document.where}: its AdmissionReview would be {size} bytes, over maxBodyBytes "
                f"({config.max_body_bytes}): the webhook answers 413 and the API server refuses the object"
            )


def _write_batches(
    batches: Iterator[Batch], form: str, *, several: bool, stdout: TextIO, stderr: TextIO
) -> bool:
    """The batches' output in order (YAML documents separated by ``---``; JSON as one value, or an
    array when there are several documents) and their notes on stderr; True when all were allowed."""
    allowed, written = True, 0
    for batch in batches:
        for note in batch.notes:
            print(note, file=stderr)
        allowed = allowed and batch.allowed
        if batch.entries:
            if form == "yaml":
                stdout.write(("---\n" if written else "") + batch.text)
            else:
                stdout.write(("[\n  " if several else "") if not written else ",\n  ")
                stdout.write(batch.text)
            written += batch.entries
    if form != "yaml" and written:
        stdout.write("\n]\n" if several else "\n")
    return allowed


@contextlib.contextmanager
def _without_cycle_collection() -> Iterator[None]:
    """The cyclic collector paused for a review: parsed manifests and the review's objects hold no
    cycles (plain JSON values; the decision code keeps none), yet with a 12,000-Job file loaded
    the collector's passes cost a third of the review's time and find nothing (docs/benchmarks.md,
    "Offline review"); forked review workers also share the loaded pages instead of copying them."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def cmd_review(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    config = config_of(args, profilesDir=args.profiles, nodesFile=args.nodes, source="files")
    with _without_cycle_collection():
        documents = read_manifests(args.filename, recursive=args.recursive, stdin=stdin)
        key, warning = signing_key_of(args.signing_key or config.signing_key_file, allow_development=True)
        engine = file_engine(config, key)
        _check_body_sizes(documents, config=config, namespace=args.namespace, user=args.user)
        if warning:
            print(warning, file=stderr)
        batches = review_batches(
            [d.object for d in documents],
            engine=engine,
            namespace=args.namespace,
            user=args.user,
            form=args.output,
        )
        allowed = _write_batches(
            batches, args.output, several=len(documents) > 1, stdout=stdout, stderr=stderr
        )
    return ExitStatus.OK if allowed else ExitStatus.DENIED


def cmd_test(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    rows = [row for path in find_suites(args.directory) for row in run_suite(path)]
    stdout.write(format_rows(rows))
    return ExitStatus.OK if all(row.passed for row in rows) else ExitStatus.DENIED


def cmd_placement(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    config = config_of(args)
    if args.summary is not None:
        profile = summary_profile(args.summary)
    else:
        profiles = load_profiles([args.profile], expected=f"-p expects a file holding one {v.PROFILE_KIND}")
        if len(profiles) != 1:
            raise UsageError(f"{args.profile}: must hold exactly one WorkloadProfile, holds {len(profiles)}")
        [profile] = profiles
    store = FileNodeStore(args.nodes)
    nodes = store.gpu_products()
    calibration = load_calibration(args.calibration) if args.calibration else NO_CALIBRATION
    catalog = load_catalog(config.catalog_file)
    rows = placement_rows(
        profile,
        nodes,
        catalog=catalog,
        config=config,
        calibration=calibration,
        gpus=args.gpus,
        product_gpus=store.product_gpus(),
    )
    if args.output == "json":
        stdout.write(as_json([dataclasses.asdict(r) for r in rows]) + "\n")
    else:
        summary = str(args.summary) if args.summary is not None else None
        header = placement_header(
            profile, config, rows, summary=summary, catalog=catalog, calibration=calibration, gpus=args.gpus
        )
        stdout.write("\n".join(header) + "\n\n")
        stdout.write(format_table(rows) if rows else "no product to rank: the profile has no figures\n")
        if rows:
            stdout.write("\n" + cut_line(rows, config.max_slowdown) + "\n")
    return ExitStatus.OK


def summary_profile(path: Path) -> WorkloadProfile:
    """The WorkloadProfile the controller would write from the runner summary in ``path`` (its Ready
    status, ``ready_status``), for workload ``summary``; a summary with no bound type (a failed run)
    or that is not a runner summary is refused, naming why."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        summary = RunnerSummary.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            raise UsageError(f"{path}: not JSON: {first['msg']}") from None
        where = ".".join(str(p) for p in first["loc"]) or "summary"
        raise UsageError(f"{path}: not a runner summary: {where}: {first['msg']}") from None
    if summary.bound_type == "unknown":
        why = summary.failure or summary.reason or "no bound type"
        raise UsageError(
            f"{path}: boundType unknown ({why}): the controller would mark the profile Failed, nothing to rank"
        )
    status = ready_status(summary, profiled_at="", source_job="")
    return WorkloadProfile.model_validate(
        {
            "metadata": {"name": "summary", "namespace": "default"},
            "spec": {"workload": "summary"},
            "status": status.as_status(),
        }
    )


COMMANDS: dict[str, Command] = {"review": cmd_review, "test": cmd_test, "placement": cmd_placement}
