"""What every KRATOS process shares, the webhook's and the controller's: the signal wait and the
Prometheus endpoint. Small on purpose: the controller imports this, never the webhook's server."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import signal
import socket
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


class ListenError(ValueError):
    """An address this process was told to listen on cannot be used; one line naming it."""


_WHY = {
    errno.EADDRINUSE: "address already in use (another process listens there: stop it or choose another port)",
    errno.EADDRNOTAVAIL: "no such address on this machine",
    errno.EACCES: "permission denied (a port below 1024 needs privileges)",
}


def listen_error(address: str, exc: OSError) -> ListenError:
    why = _WHY.get(exc.errno or 0) or exc.strerror or str(exc)
    return ListenError(f"cannot listen on {address}: {why}")


async def start_site(site: web.BaseSite, address: str) -> None:
    """``site.start()``, with a bind failure said in one line naming the address."""
    try:
        await site.start()
    except OSError as exc:
        raise listen_error(address, exc) from None


def check_can_listen(host: str, port: int, *, reuse_port: bool) -> None:
    """Bind and let go at once: run before forking workers, so a port in use is said once by the
    parent rather than by each worker as it dies."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            with contextlib.suppress(AttributeError, OSError):
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise listen_error(f"{host}:{port}", exc) from None


async def ok(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")
