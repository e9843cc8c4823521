"""What every KRATOS process shares, the webhook's and the controller's: the signal wait and the
Prometheus endpoint. Small on purpose: the controller imports this, never the webhook's server."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Handler = Callable[[web.Request], Awaitable[web.Response]]


async def wait_for_termination() -> None:
    """Return on SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def metrics_handler(registry: Callable[[web.Request], CollectorRegistry]) -> Handler:
    """``GET /metrics`` in the Prometheus text format, from the registry the request's app holds."""

    async def serve_metrics(request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry(request)))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    return serve_metrics


async def ok(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")
