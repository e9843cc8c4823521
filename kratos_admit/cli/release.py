"""release: let go of everything KRATOS holds in a cluster."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kratos_admit.cli.common import KUBECONFIG_HELP, Command, ExitStatus, add_command, add_path

if TYPE_CHECKING:
    from kratos_admit.edge.release import Release


def add_release_command(commands: Any) -> None:
    release = add_command(
        commands, "release", help="let go of everything KRATOS holds (finalizers, suspended Jobs, gated Pods)"
    )
    scope = release.add_mutually_exclusive_group(required=True)
    scope.add_argument("-n", "--namespace", metavar="NS", help="only this namespace")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    add_path(release, "--kubeconfig", "FILE", KUBECONFIG_HELP)
    release.add_argument(
        "--dry-run", action="store_true", help="print what would be let go of, change nothing"
    )
    release.add_argument(
        "--delete-webhooks",
        metavar="NAME",
        help="first delete the Mutating- and ValidatingWebhookConfiguration NAME (kratos-admit), so nothing "
        "new is held: the first step of an uninstall (the Helm chart's pre-delete hook runs this)",
    )


def cmd_release(args: argparse.Namespace, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> ExitStatus:
    deleted, released = asyncio.run(
        _release(args.kubeconfig, args.namespace, dry_run=args.dry_run, webhooks=args.delete_webhooks)
    )
    for line in deleted:
        print(line, file=stdout)
    for release in released:
        print(release.line(dry_run=args.dry_run), file=stdout)
    where = f"namespace {args.namespace}" if args.namespace else "any namespace"
    if not released:
        print(f"nothing held by KRATOS in {where}", file=stdout)
    return ExitStatus.OK


async def _release(
    kubeconfig: Path | None, namespace: str | None, *, dry_run: bool, webhooks: str | None
) -> tuple[list[str], list[Release]]:
    from kratos_admit.edge.kube import api_client, check_reachable  # noqa: PLC0415 (see LAZY_ERRORS)
    from kratos_admit.edge.release import Releaser, delete_webhook_configurations  # noqa: PLC0415

    api = await api_client(kubeconfig)
    try:
        await check_reachable(api)
        deleted = await delete_webhook_configurations(api, webhooks, dry_run=dry_run) if webhooks else []
        return deleted, await Releaser(api, namespace=namespace, dry_run=dry_run).run()
    finally:
        await api.close()


COMMANDS: dict[str, Command] = {"release": cmd_release}
