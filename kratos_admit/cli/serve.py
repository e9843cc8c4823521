"""webhook and controller: the two long-running processes, started from flags, files and the cluster."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any, TextIO

from kratos_admit.admission.engine import build_engine
from kratos_admit.cli.common import (
    CONFIG_HELP,
    KUBECONFIG_HELP,
    Command,
    ExitStatus,
    UsageError,
    add_command,
    add_path,
    config_of,
    file_engine,
    signing_key_of,
)
from kratos_admit.domain.config import Config
from kratos_admit.domain.signing import load_signing_key
from kratos_admit.edge.logs import configure_logging


def add_webhook_command(commands: Any, defaults: Config) -> None:
    webhook = add_command(commands, "webhook", help="serve the HTTPS admission webhooks")
    add_path(webhook, "--config", "FILE", CONFIG_HELP)
    webhook.add_argument(
        "--listen", metavar="HOST:PORT", help=f"where to serve HTTPS (default: {defaults.listen})"
    )
    webhook.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="also serve /metrics and probes over plain HTTP here"
    )
    add_path(webhook, "--tls-cert", "FILE", "serving certificate (PEM); required")
    add_path(webhook, "--tls-key", "FILE", "its private key (PEM); required")
    add_path(
        webhook,
        "--signing-key",
        "FILE",
        "key for KRATOS-only annotations (required in a cluster; certs generate writes one)",
    )
    add_path(webhook, "--kubeconfig", "FILE", KUBECONFIG_HELP)
    add_path(webhook, "--profiles", "DIR", "read WorkloadProfile YAML from DIR instead of the cluster")
    add_path(webhook, "--nodes", "FILE", "read Nodes from FILE instead of the cluster")
    webhook.add_argument(
        "--workers", type=int, default=1, metavar="N", help="serving processes sharing the port"
    )
    webhook.add_argument(
        "--event-loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop to serve on (uvloop: libuv's; docs/benchmarks.md)",
    )


def add_controller_command(commands: Any) -> None:
    controller = add_command(commands, "controller", help="run the profiler controller (leader-elected)")
    add_path(controller, "--config", "FILE", CONFIG_HELP)
    add_path(controller, "--kubeconfig", "FILE", KUBECONFIG_HELP)
    add_path(controller, "--signing-key", "FILE", "the key shared with the webhook; required")


def cmd_webhook(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    files = args.profiles is not None or args.nodes is not None
    config = config_of(
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
    from kratos_admit.webhook.server import run_loop, serve_processes  # noqa: PLC0415 (see LAZY_ERRORS)

    if config.source == "files":
        key, warning = signing_key_of(config.signing_key_file, allow_development=True)
        engine = file_engine(config, key)  # loaded once, shared by forks
        if warning:
            print(warning, file=stderr)
        status = serve_processes(
            lambda: engine, config=config, workers=args.workers, event_loop=args.event_loop
        )
        return ExitStatus.OK if status == 0 else ExitStatus.FAILED
    key, _ = signing_key_of(config.signing_key_file, allow_development=False)
    if args.workers == 1:
        run_loop(_serve_cluster(config, key, args.kubeconfig), args.event_loop)
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


def cmd_controller(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    config = config_of(args, signingKeyFile=args.signing_key)
    if config.signing_key_file is None:
        raise UsageError("the controller needs --signing-key FILE, the secret it shares with the webhook")
    key = load_signing_key(config.signing_key_file)
    configure_logging(config.log_level, stderr)
    # imported here: the webhook's commands never load the controller, nor it the webhook's server
    from kratos_controller.main import run_controller  # noqa: PLC0415

    status = asyncio.run(run_controller(config, key, args.kubeconfig))
    return ExitStatus.OK if status == 0 else ExitStatus.FAILED


COMMANDS: dict[str, Command] = {"webhook": cmd_webhook, "controller": cmd_controller}
