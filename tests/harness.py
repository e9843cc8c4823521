"""What tests share that is not an object builder: the API double served in-process, API clients,
waiting, the controller and the webhook running against the double."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from kratos_admit.admission import AdmissionEngine, build_engine
from kratos_admit.certs import generate
from kratos_admit.cluster import ClusterNodeStore, ClusterProfileStore
from kratos_admit.config import Config
from kratos_admit.metrics import AdmissionMetrics
from kratos_admit.server import create_app, running_site
from kratos_admit.tls import ServingCertificate
from kratos_controller.controller import ControllerMetrics, ProfilerController
from tests.conftest import CATALOG, REPO, TEST_KEY
from tests.kube_double import MUTATING, VALIDATING, KubeDouble

JOBS, PODS, PROFILES = (
    ("apis/batch/v1", "jobs"),
    ("api/v1", "pods"),
    ("apis/gpu.scheduler.io/v1alpha1", "workloadprofiles"),
)
CONFIGMAPS, LEASES = ("api/v1", "configmaps"), ("apis/coordination.k8s.io/v1", "leases")
NAMESPACES, NODES = ("api/v1", "namespaces"), ("api/v1", "nodes")
RUNTIMECLASSES = ("apis/node.k8s.io/v1", "runtimeclasses")
SERVICE = ("kratos-system", "kratos-webhook")


@contextlib.asynccontextmanager
async def api_server(kube: KubeDouble) -> AsyncIterator[TestServer]:
    server = TestServer(kube.app())
    await server.start_server()
    try:
        yield server
    finally:
        kube.stop()
        await server.close()


def api_for(server: TestServer, agent: str = "kratos-test") -> client.ApiClient:
    configuration = client.Configuration(host=str(server.make_url("")).rstrip("/"))
    api = client.ApiClient(configuration)
    api.user_agent = agent
    return api


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail("condition not met in time")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def controller_running(
    server: TestServer,
    *,
    agent: str = "controller-a",
    resync: float = 300.0,
    signing_key: bytes = TEST_KEY,
    config: Config | None = None,
) -> AsyncIterator[ProfilerController]:
    api = api_for(server, agent)
    controller = ProfilerController(
        api, signing_key=signing_key, metrics=ControllerMetrics(), resync_seconds=resync, watch_timeout=5,
        config=config, catalog=CATALOG,
    )  # fmt: skip
    task = asyncio.create_task(controller.run())
    try:
        yield controller
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def opted_in_cluster(kube: KubeDouble, ca: bytes, *products: str) -> None:
    """A cluster as the README sets it up: team-a opted in, the nvidia RuntimeClass, GPU Nodes, and
    the webhook configurations of webhook-config/ trusting ``ca``."""
    kube.put(*NAMESPACES, {"metadata": {"name": "team-a", "labels": {"gpu.scheduler.io/kratos": "enabled"}}})
    kube.put(
        *RUNTIMECLASSES,
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        },
    )
    for i, product in enumerate(products):
        labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product}
        kube.put(*NODES, {"metadata": {"name": f"gpu-{i}", "labels": labels}})
    for doc in yaml.safe_load_all((REPO / "webhook-config" / "webhooks.yaml").read_text()):
        for hook in doc["webhooks"]:
            hook["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()
        kube.put(*(MUTATING if doc["kind"].startswith("Mutating") else VALIDATING), doc)


@contextlib.asynccontextmanager
async def webhook_serving(
    kube: KubeDouble, server: TestServer, tmp_path: Path, **config: Any
) -> AsyncIterator[AdmissionEngine]:
    """The webhook in cluster mode (live stores over the double), serving HTTPS on 127.0.0.1, and the
    double told where the kratos-webhook Service answers."""
    certs = tmp_path / "certs"
    if not (certs / "ca.crt").exists():
        generate(service=SERVICE[1], namespace=SERVICE[0], out=certs)
    api = api_for(server, "kratos-webhook")
    engine = build_engine(
        Config.model_validate(config), signing_key=TEST_KEY, profiles=ClusterProfileStore(api),
        nodes=ClusterNodeStore(api), catalog=CATALOG,
    )  # fmt: skip
    stores = [asyncio.create_task(engine.profiles.run()), asyncio.create_task(engine.nodes.run())]
    port = free_port()
    app = create_app(engine, metrics=AdmissionMetrics(), max_body_bytes=1 << 22)
    certificate = ServingCertificate(certs / "tls.crt", certs / "tls.key")
    try:
        async with running_site(app, "127.0.0.1", port, certificate=certificate, shutdown_timeout=1):
            kube.services[SERVICE] = ("127.0.0.1", port)
            await eventually(lambda: engine.profiles.ready() and engine.nodes.ready())
            yield engine
    finally:
        for task in stores:
            task.cancel()
        await asyncio.gather(*stores, return_exceptions=True)
        await api.close()
