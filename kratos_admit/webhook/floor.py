"""The floor: the fastest answer an aiohttp HTTPS webhook can give (parse, echo the uid, allow).

    python -m kratos_admit.webhook.floor --listen 0.0.0.0:8443 --tls-cert tls.crt --tls-key tls.key [--event-loop uvloop]
        [--patch-annotation KEY=VALUE]   # answer /mutate with one annotation set: the floor of a webhook that patches

Same TLS settings, same aiohttp, the same --workers model and the same --event-loop choice as
``kratos-admit webhook``, so a comparison measures KRATOS's own work and nothing else: the
benchmark (bench/admission_bench.py) runs it beside the webhook, and it runs from the KRATOS image
as a Pod (the command above) to give the API server's latency of a webhook that does nothing.
It imports nothing of KRATOS.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import ssl
from collections.abc import Sequence

from aiohttp import web

PATCH = web.AppKey("patch", tuple)  # (key, value) of the annotation a patching floor adds, or ()


async def admit(request: web.Request) -> web.Response:
    review = json.loads(await request.read())
    response = {"uid": review["request"]["uid"], "allowed": True}
    if request.app[PATCH] and request.path == "/mutate":
        response |= {"patchType": "JSONPatch", "patch": _annotate(review["request"], *request.app[PATCH])}
    body = {
        "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }
    return web.Response(body=json.dumps(body, separators=(",", ":")), content_type="application/json")


def _annotate(request: dict[str, object], key: str, value: str) -> str:
    """A JSON patch (base64) setting one annotation: the least change a mutating webhook can make,
    so the API server's cost of applying any patch is measured apart from what a patch says."""
    obj = request.get("object")
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    op: dict[str, object]
    if isinstance(meta, dict) and isinstance(meta.get("annotations"), dict):
        op = {
            "op": "add",
            "path": "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1"),
            "value": value,
        }
    else:
        op = {"op": "add", "path": "/metadata/annotations", "value": {key: value}}
    return base64.b64encode(json.dumps([op]).encode()).decode()


async def healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def create_app(patch: tuple[str, str] | tuple[()] = ()) -> web.Application:
    app = web.Application(client_max_size=4 * 1024 * 1024)
    app[PATCH] = patch
    app.router.add_post("/mutate", admit)
    app.router.add_post("/validate", admit)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", healthz)
    return app


async def serve(
    host: str, port: int, context: ssl.SSLContext, reuse_port: bool, patch: tuple[str, str] | tuple[()] = ()
) -> None:
    runner = web.AppRunner(create_app(patch), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=context, reuse_port=reuse_port or None).start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def run(
    host: str,
    port: int,
    context: ssl.SSLContext,
    *,
    reuse_port: bool,
    event_loop: str,
    patch: tuple[str, str] | tuple[()] = (),
) -> None:
    """As ``kratos_admit.webhook.server.run_loop`` (not imported: the floor imports nothing of KRATOS)."""
    if event_loop == "uvloop":
        import uvloop  # noqa: PLC0415 (only when asked for)

        uvloop.run(serve(host, port, context, reuse_port, patch))
    else:
        asyncio.run(serve(host, port, context, reuse_port, patch))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m kratos_admit.webhook.floor", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--event-loop", choices=("asyncio", "uvloop"), default="asyncio", help="as kratos-admit webhook's"
    )
    parser.add_argument(
        "--patch-annotation",
        metavar="KEY=VALUE",
        help="answer /mutate with a JSON patch setting this annotation (the floor of a webhook that changes the object)",
    )
    args = parser.parse_args(argv)
    patch: tuple[str, str] | tuple[()] = ()
    if args.patch_annotation:
        key, sep, value = args.patch_annotation.partition("=")
        if not sep or not key:
            parser.error(f"--patch-annotation: want KEY=VALUE, got {args.patch_annotation!r}")
        patch = (key, value)
    host, _, port = args.listen.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(args.tls_cert, args.tls_key)
    if args.workers == 1:
        run(host, int(port), context, reuse_port=False, event_loop=args.event_loop, patch=patch)
        return
    children = []
    for _ in range(args.workers):
        pid = os.fork()
        if pid == 0:
            run(host, int(port), context, reuse_port=True, event_loop=args.event_loop, patch=patch)
            os._exit(0)
        children.append(pid)

    def forward(signum: int, _: object) -> None:
        for child in children:
            os.kill(child, signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    for child in children:
        os.waitpid(child, 0)


if __name__ == "__main__":
    main()
