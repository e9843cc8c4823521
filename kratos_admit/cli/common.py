"""What every command shares: exit statuses, usage errors, the argument parser's house rules, and
the configuration and signing key as flags and files give them."""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from kratos_admit.admission.engine import AdmissionEngine, build_engine
from kratos_admit.domain.config import Config, load_config
from kratos_admit.domain.signing import DEVELOPMENT_KEY, load_signing_key
from kratos_admit.edge.files import FileNodeStore, FileProfileStore


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


class HelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default, where it has one (argparse's own formatter would
    also print "(default: None)" for flags whose default comes from the config file)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS) and "default" not in text
        return f"{text} (default: %(default)s)" if shown and action.option_strings else text


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # argparse would print and call sys.exit itself
        raise ArgumentsError(f"{self.prog}: error: {message}", self.format_usage())


def add_command(commands: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand whose own usage is shown when its arguments are wrong."""
    parser: argparse.ArgumentParser = commands.add_parser(name, **kwargs)
    parser.set_defaults(usage_of=parser)
    return parser


def add_path(parser: argparse.ArgumentParser, flag: str, metavar: str, help_text: str) -> None:
    """A flag naming a file or directory."""
    parser.add_argument(flag, type=Path, metavar=metavar, help=help_text)


CONFIG_HELP = "YAML configuration file (KRATOS_* environment variables override it; see docs/reference.md)"
KUBECONFIG_HELP = "kubeconfig file (default: in-cluster account, else $KUBECONFIG, else ~/.kube/config)"

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


def config_of(args: argparse.Namespace, **overrides: Any) -> Config:
    return load_config(args.config, overrides=overrides, flags=FLAGS)


def signing_key_of(path: Path | None, *, allow_development: bool) -> tuple[bytes, str]:
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


def file_engine(config: Config, key: bytes) -> AdmissionEngine:
    return build_engine(
        config,
        signing_key=key,
        profiles=FileProfileStore(config.profiles_dir),
        nodes=FileNodeStore(config.nodes_file),
    )


Command = Callable[[argparse.Namespace, TextIO, TextIO, TextIO], ExitStatus]
