"""certs generate, rotate and inject: the webhook's serving certificate, its CA and the signing key."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kratos_admit.cli.common import (
    KUBECONFIG_HELP,
    Command,
    ExitStatus,
    Parser,
    UsageError,
    add_command,
    add_path,
)
from kratos_admit.domain import vocabulary as v
from kratos_admit.edge.pki import SERVING_DAYS
from kratos_admit.webhook.certs import CA_CERT, SIGNING_KEY, GeneratedCerts, generate, rotate

if TYPE_CHECKING:
    from kratos_admit.webhook.inject import Injected
    from kratos_admit.webhook.secrets import Written


def add_certs_command(commands: Any) -> None:
    certs = add_command(commands, "certs", help="certificates for the webhook")
    certs_commands = certs.add_subparsers(
        dest="certs_command", required=True, metavar="COMMAND", parser_class=Parser
    )
    gen = add_command(
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
        "--in-cluster",
        action="store_true",
        help="also write them into NS as the Secrets the install mounts: kratos-webhook-ca (where the controller renews "
        "the serving certificate from), kratos-webhook-tls and kratos-signing-key",
    )
    add_path(gen, "--kubeconfig", "FILE", KUBECONFIG_HELP)
    gen.add_argument(
        "--force",
        action="store_true",
        help="accepted where DIR holds no CA or signing key; it no longer replaces them (use --new-ca, --new-signing-key)",
    )
    rot = add_command(
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
    inject = add_command(
        certs_commands, "inject", help="write the CA into the webhook configurations' caBundle"
    )
    inject.add_argument("--ca", type=Path, required=True, metavar="FILE", help="the CA certificate (PEM)")
    inject.add_argument(
        "--append", action="store_true", help="keep the CAs already in each caBundle (a CA roll)"
    )
    add_path(inject, "--kubeconfig", "FILE", KUBECONFIG_HELP)
    inject.add_argument(
        "--name", default=v.WEBHOOK_CONFIGURATION, metavar="NAME", help="the webhook configurations' name"
    )


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
    if args.in_cluster:
        for secret in asyncio.run(_write_secrets(args)):
            print(f"secret/{secret.name} in {args.namespace}: {secret.outcome}", file=stdout)
    return ExitStatus.OK


async def _write_secrets(args: argparse.Namespace) -> list[Written]:
    from kratos_admit.edge.kube import api_client, check_reachable  # noqa: PLC0415
    from kratos_admit.webhook.secrets import write_secrets  # noqa: PLC0415 (see LAZY_ERRORS)

    api = await api_client(args.kubeconfig)
    try:
        await check_reachable(api)
        return await write_secrets(
            api, args.out, args.namespace, new_ca=args.new_ca, new_signing_key=args.new_signing_key
        )
    finally:
        await api.close()


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


COMMANDS: dict[str, Command] = {"certs": cmd_certs}
