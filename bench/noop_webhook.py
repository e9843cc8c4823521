"""The floor: the fastest answer an aiohttp HTTPS webhook can give (parse, echo the uid, allow).

Same TLS settings, same aiohttp, same --workers model as kratos-admit, so the ratio measures
KRATOS's own work and nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl

from aiohttp import web


async def admit(request: web.Request) -> web.Response:
    review = json.loads(await request.read())
    body = {
        "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": True},
    }
    return web.Response(body=json.dumps(body, separators=(",", ":")), content_type="application/json")


async def healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def serve(host: str, port: int, context: ssl.SSLContext, reuse_port: bool) -> None:
    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_post("/mutate", admit)
    app.router.add_post("/validate", admit)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=context, reuse_port=reuse_port or None).start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(args.tls_cert, args.tls_key)
    if args.workers == 1:
        asyncio.run(serve(host, int(port), context, False))
        return
    children = []
    for _ in range(args.workers):
        pid = os.fork()
        if pid == 0:
            asyncio.run(serve(host, int(port), context, True))
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
