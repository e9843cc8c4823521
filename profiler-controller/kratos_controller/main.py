"""``kratos-admit controller``: credentials, leader election, metrics port, run until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from pathlib import Path

from aiohttp import web

from kratos_admit.domain.config import Config, split_host_port
from kratos_admit.edge import process
from kratos_admit.edge.kube import ApiUnreachable, api_client, check_reachable
from kratos_admit.model.catalog import load_catalog
from kratos_controller.leader import LeaderElector
from kratos_controller.manager import Manager, run_when_leading
from kratos_controller.metrics import ControllerMetrics

log = logging.getLogger("kratos.controller")


def controller_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


READY_TOLERANCE_SECONDS = 5.0  # a watch may fail and come back this long before the Pod turns unready


def readiness(manager: Manager, elector: LeaderElector) -> process.Handler:
    """``/readyz``: 503 while the Lease calls, or (when leading) the Job and Pod watches, have failed
    for longer than a few seconds; a standby that reaches its Lease is ready (it waits to lead)."""

    async def readyz(_: web.Request) -> web.Response:
        reason = (
            f"lease {elector.namespace}/{elector.name} calls failing: {elector.failing.reason}"
            if elector.failing.longer_than(READY_TOLERANCE_SECONDS)
            else manager.unready_reason(READY_TOLERANCE_SECONDS)
            if elector.leading.is_set()
            else ""
        )
        if reason:
            return web.Response(status=503, text=f"not ready: {reason}\n")
        return web.Response(text="ok\n")

    return readyz


def metrics_app(metrics: ControllerMetrics, readyz: process.Handler) -> web.Application:
    app = web.Application()
    app.router.add_get("/metrics", process.metrics_handler(lambda _: metrics.registry))
    app.router.add_get("/healthz", process.ok)
    app.router.add_get("/readyz", readyz)
    return app


async def run_controller(config: Config, signing_key: bytes, kubeconfig: Path | None) -> int:
    """0 after SIGTERM; 1 when leadership is lost (the Pod restarts and campaigns again)."""
    api = await api_client(kubeconfig)
    try:
        await check_reachable(api)
    except ApiUnreachable:
        await api.close()
        raise
    metrics = ControllerMetrics()
    identity = controller_identity()
    elector = LeaderElector(
        api,
        namespace=config.lease_namespace,
        name=config.lease_name,
        identity=identity,
        lease_seconds=config.lease_duration_seconds,
    )
    manager = Manager(
        api,
        signing_key=signing_key,
        metrics=metrics,
        resync_seconds=config.resync_seconds,
        config=config,
        catalog=load_catalog(config.catalog_file),
        identity=identity,
    )
    runner = web.AppRunner(metrics_app(metrics, readiness(manager, elector)), access_log=None)
    await runner.setup()
    host, port = split_host_port(config.controller_metrics_listen)
    try:
        await process.start_site(web.TCPSite(runner, host, port), config.controller_metrics_listen)
    except process.ListenError:
        await runner.cleanup()
        await api.close()
        raise
    log.info(
        "controller started",
        extra={"identity": identity, "lease": f"{config.lease_namespace}/{config.lease_name}"},
    )
    leading = asyncio.create_task(run_when_leading(manager, elector))
    stop = asyncio.create_task(process.wait_for_termination())
    try:
        await asyncio.wait({leading, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (leading, stop):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await runner.cleanup()
        await api.close()
    return 1 if elector.lost.is_set() else 0
