"""The HTTPS webhook server: decode, call the admission layer, encode. Nothing else happens here."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from kratos_admit.admission.engine import AdmissionEngine, Webhook, review_live
from kratos_admit.admission.request import AdmissionRequestError
from kratos_admit.domain.config import Config, split_host_port
from kratos_admit.edge import process
from kratos_admit.webhook.metrics import (
    AdmissionMetrics,
    share_between_processes,
    shared_registry,
    worker_gone,
)
from kratos_admit.webhook.requestlog import RequestLog
from kratos_admit.webhook.tls import ServingCertificate

log = logging.getLogger("kratos.webhook")

EventLoop = Literal["asyncio", "uvloop"]
EVENT_LOOPS: tuple[EventLoop, ...] = ("asyncio", "uvloop")
_T = TypeVar("_T")


def run_loop(main: Coroutine[Any, Any, _T], event_loop: EventLoop = "asyncio") -> _T:
    """``asyncio.run`` on the event loop asked for: the stdlib's, or uvloop's (libuv, and its own
    TLS transport), which aiohttp runs on unchanged. The floor (``kratos_admit.webhook.floor``)
    takes the same choice, so a comparison of the two stays one of KRATOS's own work."""
    if event_loop == "uvloop":
        import uvloop  # noqa: PLC0415 (only when asked for)

        return uvloop.run(main)
    return asyncio.run(main)


@dataclass(slots=True)
class Probes:
    """What /healthz, /readyz, /metrics and the SIGTERM drain share, on every app the process serves."""

    exposition: CollectorRegistry  # what /metrics serves
    ready: Callable[[], bool]
    inflight: int = 0
    draining: bool = False


@dataclass(slots=True)
class WebhookState:
    engine: AdmissionEngine
    probes: Probes
    metrics: AdmissionMetrics
    max_body_bytes: int
    request_log: RequestLog


PROBES = web.AppKey("probes", Probes)
STATE = web.AppKey("state", WebhookState)


def error_body(message: str) -> dict[str, str]:
    """The one-line JSON error of a 400/413/415/500: the transport's answer, never a review."""
    return {"error": " ".join(message.split())}


def _json(status: int, body: object) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _handler(webhook: Webhook) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        state = request.app[STATE]
        state.probes.inflight += 1
        try:
            response = await _handle(request, state)
        finally:
            state.probes.inflight -= 1
        if state.probes.draining:  # the client reconnects, and endpoints send it to a pod that stays
            response.force_close()
        return response

    async def _handle(request: web.Request, state: WebhookState) -> web.Response:
        started = time.perf_counter()
        if request.content_type != "application/json":
            state.metrics.requests.labels(webhook, "unknown", "unknown", "error").inc()
            return _json(
                415, error_body(f"content type must be application/json, got {request.content_type}")
            )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            state.metrics.requests.labels(webhook, "unknown", "unknown", "error").inc()
            return _json(413, error_body(f"body larger than the limit of {state.max_body_bytes} bytes"))
        try:
            result = await review_live(body, webhook=webhook, engine=state.engine)
        except AdmissionRequestError as exc:
            state.metrics.requests.labels(webhook, "unknown", "unknown", "error").inc()
            log.warning("bad admission request", extra={"webhook": webhook, "reason": str(exc)})
            return _json(400, error_body(str(exc)))
        except Exception:
            # A KRATOS bug, not the caller's fault: log it with the request's uid and answer 500,
            # which the API server turns into a denial under failurePolicy: Fail.
            state.metrics.requests.labels(webhook, "unknown", "unknown", "error").inc()
            log.exception(
                "internal error answering an admission request", extra={"webhook": webhook, "uid": _uid(body)}
            )
            return _json(500, error_body("internal error in the KRATOS webhook; see its log"))
        elapsed = time.perf_counter() - started
        m = state.metrics
        m.observe(m.duration, webhook, elapsed)
        asked = result.request
        m.inc(m.requests, webhook, asked.kind_name, asked.operation, result.outcome)
        for error in result.decision.violations:
            m.inc(m.violations, error.rule)
        if webhook == "mutate":
            m.inc(m.mutations, result.decision.action)
            if result.decision.action == "hints":
                m.inc(m.hints, result.decision.ranking_source)
            if result.decision.explored and not asked.dry_run:
                m.inc(m.explorations, result.decision.explored)
        state.request_log.write(webhook, result, elapsed)
        return _json(200, result.body)

    return handle


def _uid(body: bytes) -> str:
    try:
        return str(orjson.loads(body)["request"]["uid"])
    except Exception:
        return ""


healthz = process.ok


async def readyz(request: web.Request) -> web.Response:
    probes = request.app[PROBES]
    if not probes.draining and probes.ready():
        return web.Response(text="ok\n")
    return web.Response(status=503, text="caches not synced or certificate not loaded\n")


metrics_handler = process.metrics_handler(lambda request: request.app[PROBES].exposition)


def create_app(
    engine: AdmissionEngine,
    *,
    metrics: AdmissionMetrics,
    max_body_bytes: int,
    ready: Callable[[], bool] = lambda: True,
) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes)
    app[PROBES] = Probes(metrics.exposition, ready)
    app[STATE] = WebhookState(engine, app[PROBES], metrics, max_body_bytes, RequestLog(log))
    app.router.add_post("/mutate", _handler("mutate"))
    app.router.add_post("/validate", _handler("validate"))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return app


def create_metrics_app(probes: Probes) -> web.Application:
    """/metrics (and probes) on a plain-HTTP port, for scrapers that do not speak the webhook's TLS;
    it shares the webhook's Probes, so its /readyz also turns 503 while the webhook drains."""
    app = web.Application()
    app[PROBES] = probes
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


@contextlib.asynccontextmanager
async def running_site(
    app: web.Application,
    host: str,
    port: int,
    *,
    certificate: ServingCertificate | None,
    reuse_port: bool = False,
) -> AsyncIterator[web.AppRunner]:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=DRAIN_SECONDS)
    await runner.setup()
    site = web.TCPSite(
        runner,
        host,
        port,
        ssl_context=certificate.context if certificate else None,
        reuse_port=reuse_port or None,
    )
    try:
        await process.start_site(site, f"{host}:{port}")
    except process.ListenError:
        await runner.cleanup()
        raise
    try:
        yield runner
    finally:
        await drain(runner, app[PROBES])
        await runner.cleanup()


DRAIN_SECONDS = 10.0  # the longest a request in a handler is waited for; the API server gives up at 5


async def drain(runner: web.AppRunner, state: Probes, timeout: float = DRAIN_SECONDS) -> None:
    """Stop accepting connections, then wait for requests already in a handler to finish.

    aiohttp's own cleanup drops body bytes that arrive after shutdown starts, so a request whose
    body was still on the wire at SIGTERM would be lost; waiting here first finishes it.
    """
    state.draining = True
    for site in list(runner.sites):
        await site.stop()
    deadline = time.monotonic() + timeout
    while state.inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def serve(engine: AdmissionEngine, *, config: Config, reuse_port: bool = False) -> None:
    """Serve until SIGTERM/SIGINT; then turn unready and serve on for ``shutdownGraceSeconds``
    (endpoints are still dropping this pod, and the API server's calls must not meet a closed port),
    answering with ``Connection: close`` so keep-alive clients move on; then stop listening, finish
    the requests in flight and return."""
    assert config.tls_cert_file is not None and config.tls_key_file is not None
    metrics = AdmissionMetrics()
    metrics.watch_profile_count(lambda: len(engine.profiles))
    certificate = ServingCertificate(
        config.tls_cert_file, config.tls_key_file, on_load=metrics.certificate_expiry.set
    )

    def ready() -> bool:
        return certificate.loaded and engine.profiles.ready() and engine.nodes.ready()

    app = create_app(engine, metrics=metrics, max_body_bytes=config.max_body_bytes, ready=ready)
    host, port = split_host_port(config.listen)
    # Everything imported and loaded so far lives as long as the process: take it out of the
    # cyclic collector's view (90k objects, ~50 ms per full collection, paid by requests otherwise).
    gc.collect()
    gc.freeze()
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(
            running_site(app, host, port, certificate=certificate, reuse_port=reuse_port)
        )
        if config.metrics_listen and not reuse_port:
            m_host, m_port = split_host_port(config.metrics_listen)
            await stack.enter_async_context(
                running_site(
                    create_metrics_app(app[PROBES]),
                    m_host,
                    m_port,
                    certificate=None,
                )
            )
        watcher = asyncio.create_task(certificate.watch())
        request_log = asyncio.create_task(app[STATE].request_log.run())
        stores = [
            asyncio.create_task(engine.profiles.run()),
            asyncio.create_task(engine.nodes.run()),
            asyncio.create_task(engine.calibration.run()),
        ]
        log.info(
            "serving",
            extra={"listen": config.listen, "metricsListen": config.metrics_listen},
        )
        try:
            await process.wait_for_termination()
            app[PROBES].draining = True
            log.info(
                "SIGTERM: unready, serving on while endpoints drop this pod",
                extra={"seconds": config.shutdown_grace_seconds},
            )
            await asyncio.sleep(config.shutdown_grace_seconds)
            log.info("grace over: finishing in-flight requests", extra={"inflight": app[PROBES].inflight})
        finally:
            for task in (watcher, *stores):
                task.cancel()
            request_log.cancel()
    app[STATE].request_log.flush(everything=True)  # after the drain: the counts not yet written
    log.info("stopped")


def serve_processes(
    make_engine: Callable[[], AdmissionEngine],
    *,
    config: Config,
    workers: int,
    event_loop: EventLoop = "asyncio",
) -> int:
    """Serve from ``workers`` processes sharing one port (SO_REUSEPORT; the kernel spreads connections).

    The parent forks before any event loop exists, then supervises: it forwards SIGTERM/SIGINT,
    logs each worker that fails (a worker that cannot bind or crashes takes the others down, so
    the Pod restarts instead of serving at a fraction of its capacity), serves ``metricsListen``
    with every worker's samples summed (prometheus-client multiprocess mode), and returns 0 only
    when every worker drained and exited cleanly.
    """
    if workers == 1:
        run_loop(serve(make_engine(), config=config), event_loop)
        return 0
    process.check_can_listen(*split_host_port(config.listen), reuse_port=True)
    if config.metrics_listen:
        process.check_can_listen(*split_host_port(config.metrics_listen), reuse_port=False)
    shared = Path(tempfile.mkdtemp(prefix="kratos-metrics-"))
    share_between_processes(shared)
    try:
        children: list[int] = []
        parent = os.getpid()
        for _ in range(workers):
            pid = os.fork()
            if pid == 0:  # the worker: serve, then leave without running the parent's cleanup
                os._exit(_worker(make_engine, config, parent, event_loop))
            children.append(pid)
        return asyncio.run(_supervise(children, config=config, shared=shared))
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this worker when its parent dies (PR_SET_PDEATHSIG), so a supervisor
    that is SIGKILLed (OOM, kubelet) leaves no worker serving unsupervised; elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _worker(
    make_engine: Callable[[], AdmissionEngine], config: Config, parent: int, event_loop: EventLoop
) -> int:
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the line above took effect
        return 1
    try:
        run_loop(serve(make_engine(), config=config, reuse_port=True), event_loop)
    except BaseException as exc:  # whatever ends a worker is logged; its exit code says so
        log.error(
            "worker failed",
            extra={"error": f"{type(exc).__name__}: {exc}"},
            exc_info=not isinstance(exc, OSError | KeyboardInterrupt),
        )
        return 1
    return 0


async def _supervise(children: list[int], *, config: Config, shared: Path) -> int:
    loop = asyncio.get_running_loop()
    alive = set(children)
    stopping = False

    def signal_workers(signum: int) -> None:
        nonlocal stopping
        stopping = stopping or signum in (signal.SIGTERM, signal.SIGINT)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signal_workers, sig)
    log.info("workers started", extra={"pids": children, "listen": config.listen})
    async with contextlib.AsyncExitStack() as stack:
        if config.metrics_listen:
            m_host, m_port = split_host_port(config.metrics_listen)
            probes = Probes(shared_registry(shared), ready=lambda: not stopping)
            await stack.enter_async_context(
                running_site(create_metrics_app(probes), m_host, m_port, certificate=None)
            )
        failed = False
        waits = {asyncio.ensure_future(asyncio.to_thread(os.waitpid, pid, 0)): pid for pid in children}
        while waits:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for finished in done:
                pid = waits.pop(finished)
                alive.discard(pid)
                worker_gone(shared, pid)
                code = os.waitstatus_to_exitcode(finished.result()[1])
                if code != 0:
                    failed = True
                    log.error("worker exited", extra={"worker": pid, "exitCode": code})
                    if not stopping:  # stop the rest: a Pod at part capacity must not look healthy
                        signal_workers(signal.SIGTERM)
    log.info("workers stopped", extra={"failed": failed})
    return 1 if failed else 0
