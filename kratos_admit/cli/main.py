"""``kratos-admit``: main(argv, stdout=, stderr=) -> ExitStatus, so tests call it directly (httpie style)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import enum
import gc
import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kratos_admit import __version__
from kratos_admit.admission.engine import AdmissionEngine, build_engine
from kratos_admit.admission.review import Batch, as_json, review_batches, review_body_size, review_namespace
from kratos_admit.cli.suite import SuiteError, find_suites, format_rows, run_suite
from kratos_admit.decisions.calibration import NO_CALIBRATION
from kratos_admit.decisions.placement import format_table, placement_header, placement_rows
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.catalog import Catalog, CatalogError, load_catalog
from kratos_admit.domain.config import Config, ConfigError, load_config
from kratos_admit.domain.manifests import Document, ManifestError, read_manifests
from kratos_admit.domain.signing import DEVELOPMENT_KEY, SigningKeyError, load_signing_key
from kratos_admit.edge.files import (
    FileNodeStore,
    FileProfileStore,
    StoreError,
    load_calibration,
    load_profiles,
)
from kratos_admit.edge.logs import configure_logging
from kratos_admit.simulation.inputs import SimFileError, load_cluster, load_trace, load_truth
from kratos_admit.simulation.replay import SimulationError, SimulationResult, Trace, Truth, simulate
from kratos_admit.simulation.report import PlotError, format_results, load_plotter
from kratos_admit.simulation.scheduling import SimNode
from kratos_admit.webhook.certs import (
    CA_CERT,
    SERVING_DAYS,
    SIGNING_KEY,
    CertsError,
    GeneratedCerts,
    generate,
    rotate,
)

if TYPE_CHECKING:
    from kratos_admit.edge.release import Release
    from kratos_admit.webhook.inject import Injected

# The commands that serve or talk to a cluster import aiohttp and kubernetes_asyncio when they run
# (a third of a second that review, test and placement never need): see LAZY_ERRORS.

log = logging.getLogger("kratos")


class ExitStatus(enum.IntEnum):
    OK = 0
    DENIED = 1  # review: some object was denied
    UNUSABLE = 2  # unusable input or start-up configuration, with a one-line reason
    FAILED = 3  # the webhook or controller could not keep running (a child died, leadership lost)


class UsageError(Exception):
    """Unusable input or start-up configuration: one line on stderr, exit status 2."""


class ArgumentsError(UsageError):
    """Bad command-line arguments: the usage of the command concerned, then one line."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


# Every error that means "unusable input or start-up configuration": exit 2 and the message as one
# line on stderr, from ``main`` alone. A subcommand reports such a problem by raising one of these
# (UsageError when no module-specific one fits); it never prints an error or exits by itself.
INPUT_ERRORS: tuple[type[Exception], ...] = (
    UsageError,
    ConfigError,
    CatalogError,
    StoreError,
    SigningKeyError,
    ManifestError,
    SuiteError,
    CertsError,
    SimFileError,
    PlotError,
)
# ... and these, from the modules only the cluster and server commands import (a module not
# imported cannot have raised its error)
LAZY_ERRORS = (
    ("kratos_admit.edge.kube", "KubeConfigError"),  # ApiUnreachable too
    ("kratos_admit.webhook.inject", "InjectError"),
    ("kratos_admit.edge.process", "ListenError"),
    ("kratos_admit.webhook.tls", "CertificateError"),
    ("kratos_admit.edge.release", "ReleaseError"),
)


def input_errors() -> tuple[type[Exception], ...]:
    loaded = [getattr(sys.modules[module], name) for module, name in LAZY_ERRORS if module in sys.modules]
    return INPUT_ERRORS + tuple(loaded)


class _HelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default, where it has one (argparse's own formatter would
    also print "(default: None)" for flags whose default comes from the config file)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS) and "default" not in text
        return f"{text} (default: %(default)s)" if shown and action.option_strings else text


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # argparse would print and call sys.exit itself
        raise ArgumentsError(f"{self.prog}: error: {message}", self.format_usage())


def _command(commands: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand whose own usage is shown when its arguments are wrong."""
    parser: argparse.ArgumentParser = commands.add_parser(name, **kwargs)
    parser.set_defaults(usage_of=parser)
    return parser


def _path(parser: argparse.ArgumentParser, flag: str, metavar: str, help_text: str) -> None:
    """A flag naming a file or directory."""
    parser.add_argument(flag, type=Path, metavar=metavar, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    defaults = Config()
    parser = _Parser(prog="kratos-admit", description="Application-aware GPU admission for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"kratos-admit {__version__}")
    parser.set_defaults(usage_of=parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    config_help = "YAML configuration file (KRATOS_* environment variables override it; see README)"
    kubeconfig_help = "kubeconfig file (default: in-cluster account, else $KUBECONFIG, else ~/.kube/config)"
    webhook = _command(commands, "webhook", help="serve the HTTPS admission webhooks")
    _path(webhook, "--config", "FILE", config_help)
    webhook.add_argument(
        "--listen", metavar="HOST:PORT", help=f"where to serve HTTPS (default: {defaults.listen})"
    )
    webhook.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="also serve /metrics and probes over plain HTTP here"
    )
    _path(webhook, "--tls-cert", "FILE", "serving certificate (PEM); required")
    _path(webhook, "--tls-key", "FILE", "its private key (PEM); required")
    _path(
        webhook,
        "--signing-key",
        "FILE",
        "key for KRATOS-only annotations (required in a cluster; certs generate writes one)",
    )
    _path(webhook, "--kubeconfig", "FILE", kubeconfig_help)
    _path(webhook, "--profiles", "DIR", "read WorkloadProfile YAML from DIR instead of the cluster")
    _path(webhook, "--nodes", "FILE", "read Nodes from FILE instead of the cluster")
    webhook.add_argument(
        "--workers", type=int, default=1, metavar="N", help="serving processes sharing the port"
    )

    review = _command(commands, "review", help="run both webhooks offline on a manifest")
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
    _path(review, "--config", "FILE", config_help)
    _path(review, "--profiles", "DIR", "WorkloadProfile YAML files (default: none)")
    _path(review, "--nodes", "FILE", "Node YAML of the cluster (default: none)")
    review.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help="namespace to review in (default: the object's, else default)",
    )
    review.add_argument("--user", default="kratos-review", metavar="NAME", help="requesting user")
    _path(review, "--signing-key", "FILE", "signing key (default: the fixed development key)")
    review.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json", "patch"),
        default="yaml",
        help="the allowed objects as mutated, the full decisions, or the JSON patches",
    )

    test = _command(commands, "test", help="run declarative review suites (kratos-test.yaml) under DIR")
    test.add_argument(
        "directory", nargs="?", default=".", type=Path, metavar="DIR", help="where to look for suites"
    )

    placement = _command(
        commands,
        "placement",
        help="show how a profile ranks the cluster's GPU products, and from what figures",
    )
    placement.add_argument(
        "-p", "--profile", type=Path, required=True, metavar="FILE", help="a WorkloadProfile YAML file"
    )
    _path(placement, "--nodes", "FILE", "Node YAML of the cluster (default: all known GPUs)")
    _path(placement, "--config", "FILE", config_help)
    _path(
        placement,
        "--calibration",
        "FILE",
        "the cluster's calibration: ConfigMap kratos-gpu-calibration as YAML, or its calibration.json",
    )
    placement.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="a table for people, or JSON rows"
    )

    simulate = _command(
        commands, "simulate", help="replay a trace of Jobs on a modelled cluster under each placement policy"
    )
    _path(simulate, "--cluster", "FILE", "Node YAML of the cluster (product labels, nvidia.com/gpu capacity)")
    _path(simulate, "--trace", "FILE", "the trace: {jobs: [{name, workload, arrival, gpus, ...}]}")
    _path(simulate, "--truth", "FILE", "each product's real sustained figures (default: the catalog's)")
    _path(simulate, "--config", "FILE", config_help)
    simulate.add_argument(
        "--seed", type=int, default=1, metavar="N", help="seed of the runtime noise and ties"
    )
    simulate.add_argument(
        "--noise", type=float, default=0.05, metavar="F", help="runs vary within 1 +- F of the model"
    )
    simulate.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="a table for people, or JSON"
    )
    _path(simulate, "--plot", "FILE", "also draw each policy's JCT distribution into FILE (needs [plot])")
    _path(
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

    controller = _command(commands, "controller", help="run the profiler controller (leader-elected)")
    _path(controller, "--config", "FILE", config_help)
    _path(controller, "--kubeconfig", "FILE", kubeconfig_help)
    _path(controller, "--signing-key", "FILE", "the key shared with the webhook; required")

    certs = _command(commands, "certs", help="certificates for the webhook")
    certs_commands = certs.add_subparsers(
        dest="certs_command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    gen = _command(
        certs_commands,
        "generate",
        help="serving certificate, plus the CA and signing key where DIR has none (never replaced unless asked)",
    )
    gen.add_argument("--service", required=True, metavar="NAME", help="the webhook's Service name")
    gen.add_argument("--namespace", required=True, metavar="NS", help="the Service's namespace")
    gen.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory to write into")
    gen.add_argument(
        "--days",
        type=int,
        default=SERVING_DAYS,
        metavar="N",
        help="validity of the serving certificate (365)",
    )
    gen.add_argument(
        "--new-ca",
        action="store_true",
        help="replace the CA in DIR (the caBundle must then be rolled: certs inject --append)",
    )
    gen.add_argument(
        "--new-signing-key",
        action="store_true",
        help="replace signing.key in DIR (invalidates every object KRATOS signed)",
    )
    gen.add_argument(
        "--force",
        action="store_true",
        help="accepted where DIR holds no CA or signing key; it no longer replaces them (use --new-ca, --new-signing-key)",
    )
    rot = _command(
        certs_commands,
        "rotate",
        help="a new serving certificate from the CA in DIR; the CA and signing key stay",
    )
    rot.add_argument("--dir", type=Path, required=True, metavar="DIR", help="what certs generate wrote")
    rot.add_argument(
        "--days",
        type=int,
        default=SERVING_DAYS,
        metavar="N",
        help="validity of the serving certificate (365)",
    )
    inject = _command(certs_commands, "inject", help="write the CA into the webhook configurations' caBundle")
    inject.add_argument("--ca", type=Path, required=True, metavar="FILE", help="the CA certificate (PEM)")
    inject.add_argument(
        "--append", action="store_true", help="keep the CAs already in each caBundle (a CA roll)"
    )
    _path(inject, "--kubeconfig", "FILE", kubeconfig_help)
    inject.add_argument(
        "--name", default=v.WEBHOOK_CONFIGURATION, metavar="NAME", help="the webhook configurations' name"
    )
    release = _command(
        commands, "release", help="let go of everything KRATOS holds (finalizers, suspended Jobs, gated Pods)"
    )
    scope = release.add_mutually_exclusive_group(required=True)
    scope.add_argument("-n", "--namespace", metavar="NS", help="only this namespace")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    _path(release, "--kubeconfig", "FILE", kubeconfig_help)
    release.add_argument(
        "--dry-run", action="store_true", help="print what would be let go of, change nothing"
    )
    return parser


# the flag that sets each configuration key, so that a bad value names the flag the user typed
FLAGS = {
    "listen": "--listen",
    "metricsListen": "--metrics-listen",
    "tlsCertFile": "--tls-cert",
    "tlsKeyFile": "--tls-key",
    "signingKeyFile": "--signing-key",
    "profilesDir": "--profiles",
    "nodesFile": "--nodes",
}


def _config(args: argparse.Namespace, **overrides: Any) -> Config:
    return load_config(args.config, overrides=overrides, flags=FLAGS)


def _signing_key(path: Path | None, *, allow_development: bool) -> tuple[bytes, str]:
    """The key, and a warning to print once everything else has loaded (so that an input error
    stays the one line on stderr)."""
    if path is not None:
        return load_signing_key(path), ""
    if not allow_development:
        raise UsageError("no signing key: pass --signing-key FILE (kratos-admit certs generate writes one)")
    return (
        DEVELOPMENT_KEY,
        "warning: no --signing-key given; using the fixed development key (never in a cluster)",
    )


def _file_engine(config: Config, key: bytes) -> AdmissionEngine:
    return build_engine(
        config,
        signing_key=key,
        profiles=FileProfileStore(config.profiles_dir),
        nodes=FileNodeStore(config.nodes_file),
    )


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
    config = _config(args, profilesDir=args.profiles, nodesFile=args.nodes, source="files")
    with _without_cycle_collection():
        documents = read_manifests(args.filename, recursive=args.recursive, stdin=stdin)
        key, warning = _signing_key(args.signing_key or config.signing_key_file, allow_development=True)
        engine = _file_engine(config, key)
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


def cmd_webhook(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    files = args.profiles is not None or args.nodes is not None
    config = _config(
        args,
        listen=args.listen,
        metricsListen=args.metrics_listen,
        tlsCertFile=args.tls_cert,
        tlsKeyFile=args.tls_key,
        signingKeyFile=args.signing_key,
        profilesDir=args.profiles,
        nodesFile=args.nodes,
        source="files" if files else None,
    )
    if config.tls_cert_file is None or config.tls_key_file is None:
        raise UsageError(
            "--tls-cert and --tls-key are required (HTTPS only); kratos-admit certs generate makes them"
        )
    if not 1 <= args.workers <= 64:
        raise UsageError("--workers must be between 1 and 64")
    configure_logging(config.log_level, stderr)
    from kratos_admit.webhook.server import serve_processes  # noqa: PLC0415 (see LAZY_ERRORS)

    if config.source == "files":
        key, warning = _signing_key(config.signing_key_file, allow_development=True)
        engine = _file_engine(config, key)  # loaded once, shared by forks
        if warning:
            print(warning, file=stderr)
        status = serve_processes(lambda: engine, config=config, workers=args.workers)
        return ExitStatus.OK if status == 0 else ExitStatus.FAILED
    key, _ = _signing_key(config.signing_key_file, allow_development=False)
    if args.workers == 1:
        asyncio.run(_serve_cluster(config, key, args.kubeconfig))
        return ExitStatus.OK
    raise UsageError(
        "--workers above 1 serves file stores only; in a cluster, scale the Deployment's replicas"
    )


async def _serve_cluster(config: Config, key: bytes, kubeconfig: Path | None) -> None:
    from kratos_admit.edge.cluster import (  # noqa: PLC0415
        ClusterCalibrationStore,
        ClusterNodeStore,
        ClusterProfileStore,
    )
    from kratos_admit.edge.kube import api_client, check_reachable  # noqa: PLC0415
    from kratos_admit.webhook.server import serve  # noqa: PLC0415

    api = await api_client(kubeconfig)
    try:
        await check_reachable(api)
        engine = build_engine(
            config,
            signing_key=key,
            profiles=ClusterProfileStore(api),
            nodes=ClusterNodeStore(api),
            calibration=ClusterCalibrationStore(api, config.lease_namespace),
        )
        await serve(engine, config=config)
    finally:
        await api.close()


def cmd_placement(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    config = _config(args)
    profiles = load_profiles([args.profile], expected=f"-p expects a file holding one {v.PROFILE_KIND}")
    if len(profiles) != 1:
        raise UsageError(f"{args.profile}: must hold exactly one WorkloadProfile, holds {len(profiles)}")
    [profile] = profiles
    nodes = FileNodeStore(args.nodes).gpu_products()
    calibration = load_calibration(args.calibration) if args.calibration else NO_CALIBRATION
    rows = placement_rows(
        profile, nodes, catalog=load_catalog(config.catalog_file), config=config, calibration=calibration
    )
    if args.output == "json":
        stdout.write(as_json([dataclasses.asdict(r) for r in rows]) + "\n")
    else:
        stdout.write("\n".join(placement_header(profile, config, rows)) + "\n\n")
        stdout.write(format_table(rows) if rows else "no product to rank: the profile has no figures\n")
    return ExitStatus.OK


def cmd_simulate(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    for flag, value in (("--cluster", args.cluster), ("--trace", args.trace)):
        if value is None:
            raise UsageError(f"simulate needs {flag} FILE")
    if not 0 <= args.noise < 1:
        raise UsageError(f"--noise: {args.noise} is not a fraction from 0 to below 1")
    plot = None
    if args.plot is not None:
        plot = load_plotter()  # before the run: a missing extra is said at once
    config = _config(args)
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
            result = simulate(
                trace, nodes, truth=truth, config=config, catalog=catalog, seed=args.seed, noise=args.noise
            )
    except SimulationError as exc:
        raise UsageError(str(exc)) from None
    if args.output == "json":
        stdout.write(json.dumps(result.as_dict(), indent=2) + "\n")
    else:
        stdout.write(format_results(result))
    if plot is not None:
        plot(result, args.plot)
    return ExitStatus.OK


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


def cmd_controller(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    config = _config(args, signingKeyFile=args.signing_key)
    if config.signing_key_file is None:
        raise UsageError("the controller needs --signing-key FILE, the secret it shares with the webhook")
    key = load_signing_key(config.signing_key_file)
    configure_logging(config.log_level, stderr)
    # imported here: the webhook's commands never load the controller, nor it the webhook's server
    from kratos_controller.main import run_controller  # noqa: PLC0415

    status = asyncio.run(run_controller(config, key, args.kubeconfig))
    return ExitStatus.OK if status == 0 else ExitStatus.FAILED


def cmd_certs(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    if args.certs_command == "inject":
        from kratos_admit.webhook.inject import read_ca  # noqa: PLC0415 (see LAZY_ERRORS)

        ca = read_ca(args.ca)
        for done in asyncio.run(_inject(ca, args.kubeconfig, args.name, append=args.append)):
            held = f" ({done.certificates} CA certificate(s) in the bundle)" if args.append else ""
            print(f"{done.kind} {done.name}: caBundle set on {done.webhooks} webhook(s){held}", file=stdout)
        return ExitStatus.OK
    if args.certs_command == "rotate":
        result = rotate(args.dir, days=args.days)
        _say_written(result, stdout)
        print(
            "next: update the kratos-webhook-tls Secret from tls.crt and tls.key; the webhook reloads it, "
            "the caBundle stays",
            file=stdout,
        )
        return ExitStatus.OK
    if args.force and not (args.new_ca and args.new_signing_key):
        kept = [n for n in (CA_CERT, SIGNING_KEY) if (args.out / n).exists()]
        if kept:
            raise UsageError(
                f"--force: {args.out} holds {' and '.join(kept)}, which --force no longer replaces; pass "
                "--new-ca and/or --new-signing-key to replace them, or drop --force to keep them"
            )
    result = generate(
        service=args.service,
        namespace=args.namespace,
        out=args.out,
        days=args.days,
        new_ca=args.new_ca,
        new_signing_key=args.new_signing_key,
    )
    _say_written(result, stdout)
    return ExitStatus.OK


def _say_written(result: GeneratedCerts, stdout: TextIO) -> None:
    kept = f"; kept {', '.join(result.kept)}" if result.kept else ""
    print(
        f"wrote {', '.join(result.written)} to {result.directory}{kept} "
        f"(SANs: {', '.join(result.dns_names)}; valid until {result.not_after:%Y-%m-%d}, "
        f"CA until {result.ca_not_after:%Y-%m-%d})",
        file=stdout,
    )


async def _inject(ca: bytes, kubeconfig: Path | None, name: str, *, append: bool) -> list[Injected]:
    from kratos_admit.edge.kube import api_client, check_reachable  # noqa: PLC0415
    from kratos_admit.webhook.inject import inject_ca  # noqa: PLC0415 (see LAZY_ERRORS)

    api = await api_client(kubeconfig)
    try:
        await check_reachable(api)
        return await inject_ca(api, ca, name=name, append=append)
    finally:
        await api.close()


def cmd_release(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    released = asyncio.run(_release(args.kubeconfig, args.namespace, dry_run=args.dry_run))
    for release in released:
        print(release.line(dry_run=args.dry_run), file=stdout)
    where = f"namespace {args.namespace}" if args.namespace else "any namespace"
    if not released:
        print(f"nothing held by KRATOS in {where}", file=stdout)
    return ExitStatus.OK


async def _release(kubeconfig: Path | None, namespace: str | None, *, dry_run: bool) -> list[Release]:
    from kratos_admit.edge.kube import api_client, check_reachable  # noqa: PLC0415 (see LAZY_ERRORS)
    from kratos_admit.edge.release import Releaser  # noqa: PLC0415

    api = await api_client(kubeconfig)
    try:
        await check_reachable(api)
        return await Releaser(api, namespace=namespace, dry_run=dry_run).run()
    finally:
        await api.close()


Command = Callable[[argparse.Namespace, TextIO, TextIO, TextIO], ExitStatus]
COMMANDS: dict[str, Command] = {
    "review": cmd_review,
    "test": cmd_test,
    "webhook": cmd_webhook,
    "placement": cmd_placement,
    "simulate": cmd_simulate,
    "controller": cmd_controller,
    "certs": cmd_certs,
    "release": cmd_release,
}


def main(
    argv: list[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stdin: TextIO | None = None,
) -> ExitStatus:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        args, unknown = build_parser().parse_known_args(argv)
        if unknown:  # said by the subcommand's parser, so its usage is the one shown
            args.usage_of.error(f"unrecognized arguments: {' '.join(unknown)}")
        return COMMANDS[args.command](args, stdout, stderr, stdin or sys.stdin)
    except ArgumentsError as exc:
        stderr.write(exc.usage)
        print(exc, file=stderr)
        return ExitStatus.UNUSABLE
    except Exception as exc:
        if not isinstance(exc, input_errors()):
            raise
        print(f"kratos-admit: {exc}", file=stderr)
        return ExitStatus.UNUSABLE


def run() -> None:
    sys.exit(main())
