"""``kratos-admit``: main(argv, stdout=, stderr=) -> ExitStatus, so tests call it directly (httpie style).

Each command group lives in its own module (review, serve, simulate, certs, release), which adds its
parser and maps its command names to functions; this module puts them together and turns input
errors into one line and exit status 2."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import TextIO

from kratos_admit import __version__
from kratos_admit.cli import certs, release, review, serve, simulate
from kratos_admit.cli.common import ArgumentsError, Command, ExitStatus, Parser, UsageError
from kratos_admit.cli.suite import SuiteError
from kratos_admit.domain.config import Config, ConfigError
from kratos_admit.domain.manifests import ManifestError
from kratos_admit.domain.signing import SigningKeyError
from kratos_admit.edge.files import StoreError
from kratos_admit.model.catalog import CatalogError
from kratos_admit.simulation.inputs import SimFileError
from kratos_admit.simulation.report import PlotError
from kratos_admit.webhook.certs import CertsError

# The commands that serve or talk to a cluster import aiohttp and kubernetes_asyncio when they run
# (a third of a second that review, test and placement never need): see LAZY_ERRORS.

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
    ("kratos_admit.webhook.secrets", "SecretsError"),
    ("kratos_admit.edge.process", "ListenError"),
    ("kratos_admit.webhook.tls", "CertificateError"),
    ("kratos_admit.edge.release", "ReleaseError"),
)


def input_errors() -> tuple[type[Exception], ...]:
    loaded = [getattr(sys.modules[module], name) for module, name in LAZY_ERRORS if module in sys.modules]
    return INPUT_ERRORS + tuple(loaded)


def build_parser() -> argparse.ArgumentParser:
    defaults = Config()
    parser = Parser(prog="kratos-admit", description="Application-aware GPU admission for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"kratos-admit {__version__}")
    parser.set_defaults(usage_of=parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    serve.add_webhook_command(commands, defaults)
    review.add_review_command(commands)
    review.add_test_command(commands)
    review.add_placement_command(commands)
    simulate.add_simulate_command(commands)
    serve.add_controller_command(commands)
    certs.add_certs_command(commands)
    release.add_release_command(commands)
    return parser


COMMANDS: dict[str, Command] = {
    **serve.COMMANDS,
    **review.COMMANDS,
    **simulate.COMMANDS,
    **certs.COMMANDS,
    **release.COMMANDS,
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


# A reader that stops early (`kratos-admit placement ... | head -1`) closes the pipe: the shell's
# convention for a command a closed pipe ended is 128 + SIGPIPE, as `yes | head -1` gives
CLOSED_PIPE = 128 + signal.SIGPIPE


def run() -> None:
    """The console script. A closed stdout ends the command quietly, as Python's documentation
    recommends ("Note on SIGPIPE"): stdout pointed at devnull, so the interpreter's final flush of
    what is still buffered finds no broken pipe either, and no traceback."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(CLOSED_PIPE)
    sys.exit(status)
