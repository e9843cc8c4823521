"""What the end-to-end suite needs of a real cluster: kubectl as the admin, KRATOS installed from the
rendered ``webhook-config/`` with the webhook and controller running here under the tokens of their
own ServiceAccounts, fake GPU Nodes, a stand-in for the kubelet, and the GPU telemetry of those
Nodes: a dcgm-exporter stand-in per Node, scraped by a real Prometheus.

The cluster is any Kubernetes API server whose admin kubeconfig ``KRATOS_E2E_KUBECONFIG`` names
(a control plane without kubelets is enough: Nodes here are objects the suite creates). The
webhook answers the API server at ``https://127.0.0.1:PORT`` (its certificate carries that IP),
behind a kube-proxy-like forwarder so a rollout can replace it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import functools
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.domain import vocabulary as v
from kratos_admit.edge.kube import api_client
from kratos_admit.webhook.certs import generate
from tests.harness import (
    REPO,
    DcgmGpu,
    ScrapeJob,
    Service,
    dcgm_exporter_app,
    free_port,
    real_prometheus,
    render,
    runner_summary,
)
from tests.service_links import for_pod, with_cluster_ips

KUBECONFIG_VARIABLE = "KRATOS_E2E_KUBECONFIG"
NAMESPACE = "kratos-system"
A100, L40S, L4 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S", "NVIDIA-L4"
# (node, product, tainted nvidia.com/gpu=present:NoSchedule as the GPU operator's nodes often are)
GPU_NODES = (("e2e-a100-0", A100, False), ("e2e-l40s-0", L40S, True), ("e2e-l4-0", L4, True))
GPUS_PER_NODE = 8
RUNS_ON = "Always"  # the restartPolicy of a Pod that never ends by itself (a Deployment's)
Obj = dict[str, Any]
Counters = tuple[tuple[str, float], ...]  # (DCGM field, value), as DcgmGpu holds them
T = TypeVar("T")


def admin_kubeconfig() -> Path | None:
    value = os.environ.get(KUBECONFIG_VARIABLE, "")
    return Path(value) if value else None


def kubectl(*args: str, stdin: str | None = None, check: bool = True, timeout: float = 60) -> str:
    """kubectl as the cluster admin; a failure shows its stderr. A ``--timeout=Ns`` among ``args`` is
    kubectl's own wait, and the process is given that long and 30 s more (not killed first)."""
    kubeconfig = admin_kubeconfig()
    assert kubeconfig is not None
    for arg in args:
        if (own := re.fullmatch(r"--timeout=(\d+)s", arg)) is not None:
            timeout = max(timeout, int(own.group(1)) + 30)
    result = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args],
        input=stdin, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def apply(objects: list[Obj]) -> None:
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))


def service_account_kubeconfig(name: str, out: Path) -> Path:
    """A kubeconfig holding a token of ServiceAccount ``name`` (TokenRequest API), nothing more."""
    token = kubectl("create", "token", name, "-n", NAMESPACE, "--duration", "2h").strip()
    admin = yaml.safe_load(admin_kubeconfig().read_text())  # type: ignore[union-attr]
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    out.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [cluster],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": cluster["name"], "user": name}}],
    }))  # fmt: skip
    out.chmod(0o600)
    return out


@dataclass
class Process:
    """A KRATOS process started here, its log in a file (a pipe nobody reads would stall it)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def stop(self, timeout: float = 30) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=timeout)

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Installed:
    """KRATOS on the cluster: where its files are, its processes and the webhook's front port."""

    directory: Path
    front_port: int
    webhook_kubeconfig: Path
    controller_kubeconfig: Path
    processes: list[Process] = field(default_factory=list)
    controller_metrics: str = ""  # the controller's /metrics URL, once it runs

    def start(self, command: str, port: int, metrics_port: int, **env: str) -> Process:
        certs = self.directory / "certs"
        log = self.directory / f"{command}-{port or metrics_port}.log"
        if command == "webhook":
            args = ["--listen", f"127.0.0.1:{port}", "--tls-cert", str(certs / "tls.crt"),
                    "--tls-key", str(certs / "tls.key"), "--kubeconfig", str(self.webhook_kubeconfig)]  # fmt: skip
            env = {"KRATOS_METRICS_LISTEN": f"127.0.0.1:{metrics_port}", **env}
        else:
            args = ["--kubeconfig", str(self.controller_kubeconfig)]
            env = {"KRATOS_CONTROLLER_METRICS_LISTEN": f"127.0.0.1:{metrics_port}", **env}
        popen = subprocess.Popen(
            [sys.executable, "-m", "kratos_admit", command, *args, "--signing-key", str(certs / "signing.key")],
            cwd=REPO, env={**own_environment(), **kubelet_environment(f"kratos-{command}"), "PYTHONUNBUFFERED": "1", **env},
            stdout=subprocess.DEVNULL, stderr=log.open("wb"),
        )  # fmt: skip
        process = Process(f"{command}:{port or metrics_port}", popen, log)
        self.processes.append(process)
        return process


def own_environment() -> dict[str, str]:
    """This process's environment less the suite's own KRATOS_E2E_* and KRATOS_TEST_* variables: a
    KRATOS process refuses a KRATOS_* name that is not a setting, and a Pod never has them."""
    return {k: val for k, val in os.environ.items() if not k.startswith(("KRATOS_E2E_", "KRATOS_TEST_"))}


@functools.cache
def kubelet_environment(deployment: str) -> dict[str, str]:
    """The service-link variables a kubelet gives the Deployment's container in the KRATOS namespace
    (tests/service_links.py), from the rendered Services with the prometheus component's, as its Pod
    spec asks for them: the processes here meet what a Pod of that Deployment meets (issue 33)."""
    objects = render(REPO / "webhook-config") + render(REPO / "webhook-config" / "components" / "prometheus")
    [pod] = [o["spec"]["template"]["spec"] for o in objects
             if o["kind"] == "Deployment" and o["metadata"]["name"] == deployment]  # fmt: skip
    return for_pod(pod, with_cluster_ips(o for o in objects if o["kind"] == "Service"))


def wait_ready(process: Process, url: str, *, context: Any = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert process.popen.poll() is None, f"{process.name} exited:\n{process.tail()}"
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url, timeout=2, context=context) as response,
        ):
            if response.status == 200:
                return
        assert time.monotonic() < deadline, f"{process.name} not ready at {url}:\n{process.tail()}"
        time.sleep(0.2)


def install_objects(front_port: int, ca: bytes) -> tuple[list[Obj], list[Obj]]:
    """The rendered install, split: what is applied as it is (Namespace, CRD, ServiceAccounts, RBAC,
    PriorityClass), and the two webhook configurations pointed at the local webhook."""
    plain, webhooks = [], []
    for obj in render(REPO / "webhook-config"):
        kind = obj["kind"]
        if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for hook in obj["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {
                    "url": f"https://127.0.0.1:{front_port}{path}",
                    "caBundle": base64.b64encode(ca).decode(),
                }
            webhooks.append(obj)
        elif kind not in ("Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Secret"):
            plain.append(obj)
    return plain, webhooks


def gpu_node(name: str, product: str, tainted: bool) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kratos-e2e": "true",
                v.GPU_PRESENT_LABEL: "true",
                v.GPU_PRODUCT_LABEL: product,
            },
        },
        "spec": {"taints": [{"key": v.GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"}]}
        if tainted
        else {},
    }


def mark_node_ready(name: str, room: dict[str, str]) -> None:
    """What a kubelet posts for its Node: Ready, with ``room`` (plus 110 Pods) as capacity and allocatable."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {"pods": "110", **room}
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "e2e",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
    }
    kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status))


def make_nodes_ready() -> None:
    """No kubelet posts their status: the suite does, once, with room for many Pods and GPUs."""
    for name, _, _ in GPU_NODES:
        mark_node_ready(name, {"cpu": "64", "memory": "512Gi", v.GPU_RESOURCE: str(GPUS_PER_NODE)})


# --- the GPUs' telemetry -------------------------------------------------------------------------------------

IDLE: Counters = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.0),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.0),
    ("DCGM_FI_PROF_DRAM_ACTIVE", 0.0),
)  # dcgm-exporter's default profiling counters on a GPU nothing runs on


class Dcgm:
    """The GPUs of the fake Nodes as dcgm-exporter 4.x in its Kubernetes mode sees them: every GPU of
    every Node, idle (no pod labels, counters at 0) until the kubelet stand-in runs a Pod on it, then
    labelled with the Pod's ``namespace``, ``pod`` and ``container`` and serving the counters the test
    chose for the Pods of its namespace; when the Pod ends its GPUs lose the pod labels again. The
    kubelet (a test's event loop) writes it, each Node's exporter stand-in (another thread) reads it."""

    def __init__(self, nodes: Mapping[str, str]) -> None:
        self.products = dict(nodes)  # node -> its GPU product
        self.lock = threading.Lock()
        self.chosen: dict[str, Counters] = {}  # namespace -> counters
        self.held: dict[tuple[str, int], tuple[str, str, str, Counters]] = {}  # (node, gpu) -> the Pod's

    def serve(self, namespace: str, counters: Mapping[str, float]) -> None:
        """The counters every GPU of a Pod in ``namespace`` shows while it runs."""
        with self.lock:
            self.chosen[namespace] = tuple(counters.items())

    def attach(self, pod: Obj) -> None:
        """The Pod runs: each of its containers gets the GPUs it asked for, free ones of its Node."""
        meta, spec = pod["metadata"], pod["spec"]
        namespace, name, node = meta["namespace"], meta["name"], spec["nodeName"]
        with self.lock:
            counters = self.chosen.get(namespace, ())
            for container in spec["containers"]:
                wanted = int(((container.get("resources") or {}).get("limits") or {}).get(v.GPU_RESOURCE, 0))
                free = [i for i in range(GPUS_PER_NODE) if (node, i) not in self.held]
                for index in free[:wanted]:
                    self.held[(node, index)] = (namespace, name, container["name"], counters)

    def detach(self, namespace: str, name: str) -> None:
        with self.lock:
            for key in [k for k, held in self.held.items() if held[:2] == (namespace, name)]:
                del self.held[key]

    def gpus(self, node: str) -> list[DcgmGpu]:
        """What the Node's dcgm-exporter prints now: a Pod's GPUs with its labels and counters."""
        product = self.products[node]
        found = []
        with self.lock:
            for index in range(GPUS_PER_NODE):
                namespace, pod, container, counters = self.held.get((node, index), ("", "", "main", IDLE))
                gpu_uuid = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}')}"
                model = product.replace("-", " ", 1)  # modelName: "NVIDIA A100-SXM4-80GB"
                found.append(DcgmGpu(index, gpu_uuid, namespace, pod, container, counters, model, node))
        return found


# --- in the tests' event loop ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def admin_api() -> AsyncIterator[client.ApiClient]:
    api = await api_client(admin_kubeconfig())
    try:
        yield api
    finally:
        await api.close()


Outcome = Callable[[Obj], tuple[int, str | None]]  # a Pod -> (its exit code, the runner's message)


def succeed_with_summary(pod: Obj) -> tuple[int, str | None]:
    """Every Pod succeeds; a profiling run's runner leaves its summary, as the real one does."""
    containers = [c["name"] for c in pod["spec"]["containers"]]
    return 0, runner_summary() if v.RUNNER_CONTAINER in containers else None


def profiling_fails(pod: Obj) -> tuple[int, str | None]:
    containers = [c["name"] for c in pod["spec"]["containers"]]
    return (1, None) if v.RUNNER_CONTAINER in containers else (0, None)


def _container_statuses(pod: Obj, key: str, state: Obj) -> list[Obj]:
    return [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": "running" in state,
            "restartCount": 0,
            "started": "running" in state,
            "state": state,
        }
        for c in pod["spec"].get(key) or []
    ]


@contextlib.asynccontextmanager
async def kubelet(api: client.ApiClient, namespace: str, outcome: Outcome = succeed_with_summary,
                  *, seconds: float = 1.0, dcgm: Dcgm | None = None) -> AsyncIterator[list[str]]:  # fmt: skip
    """The kubelet of every fake Node, for one namespace: a Pod the scheduler bound is marked Running,
    then, ``seconds`` later, Succeeded or Failed with its containers terminated (the runner's
    termination message included); a Pod with ``restartPolicy: Always`` (a Deployment's) runs on,
    as its restarted containers would. With ``dcgm`` a running Pod holds GPUs of its Node there,
    and lets go of them when it ends. Yields the names of the Pods it finished."""
    core = client.CoreV1Api(api)
    finished: list[str] = []
    running: dict[str, float] = {}

    async def loop() -> None:
        while True:
            pods: Any = await core.list_namespaced_pod(namespace, _preload_content=False)
            body = json.loads(await pods.read())
            pods.release()
            for pod in body.get("items") or []:
                name, phase = pod["metadata"]["name"], (pod.get("status") or {}).get("phase")
                if pod["metadata"].get("deletionTimestamp"):
                    # the kubelet stops the containers, then confirms the deletion (grace 0)
                    if dcgm is not None:
                        dcgm.detach(namespace, name)
                    with contextlib.suppress(ApiException):
                        await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
                    continue
                if not pod["spec"].get("nodeName") or phase not in ("Pending", "Running"):
                    continue
                now = dt.datetime.now(dt.UTC)
                stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
                if name not in running:
                    running[name] = time.monotonic()
                    if dcgm is not None:
                        dcgm.attach(pod)
                    status = {"phase": "Running", "startTime": stamp, "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": stamp}],
                        "initContainerStatuses": _container_statuses(pod, "initContainers", {"terminated": {
                            "exitCode": 0, "reason": "Completed", "startedAt": stamp, "finishedAt": stamp}}),
                        "containerStatuses": _container_statuses(pod, "containers", {"running": {"startedAt": stamp}})}  # fmt: skip
                elif (
                    time.monotonic() - running[name] >= seconds
                    and pod["spec"].get("restartPolicy") != RUNS_ON
                ):
                    if dcgm is not None:
                        dcgm.detach(namespace, name)
                    code, message = outcome(pod)
                    started = (pod.get("status") or {}).get("startTime", stamp)
                    terminated: Obj = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                       "startedAt": started, "finishedAt": stamp}  # fmt: skip
                    statuses = _container_statuses(pod, "containers", {"terminated": terminated})
                    for status_of in statuses:
                        if message is not None and status_of["name"] == v.RUNNER_CONTAINER:
                            status_of["state"]["terminated"]["message"] = message
                    status = {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": statuses,
                              "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": stamp}]}  # fmt: skip
                    finished.append(name)
                else:
                    continue
                with contextlib.suppress(ApiException):  # gone meanwhile
                    await core.patch_namespaced_pod_status(name, namespace, {"status": status})
            await asyncio.sleep(0.3)

    task = asyncio.create_task(loop())
    try:
        yield finished
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(check: Callable[[], Any], *, timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll an async or plain check until it returns something true."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not met within {timeout} s"
        await asyncio.sleep(0.25)


# The RuntimeClass KRATOS sets (config runtimeClassName): the API server's RuntimeClass admission
# plugin refuses a Pod that names one that does not exist ("pod rejected: RuntimeClass ... not found").
RUNTIME_CLASS = {
    "apiVersion": "node.k8s.io/v1",
    "kind": "RuntimeClass",
    "metadata": {"name": "nvidia"},
    "handler": "nvidia",
}


def namespace_gone(name: str, timeout: float = 180) -> None:
    """Wait until namespace ``name`` is gone (a terminating one deletes its contents first): a module
    that deleted it leaves the cluster as it found it, and one about to create it meets no
    "being terminated" refusal."""
    deadline = time.monotonic() + timeout
    while kubectl("get", "namespace", name, "--ignore-not-found", "-o", "name").strip():
        assert time.monotonic() < deadline, f"namespace {name} still there after {timeout} s"
        time.sleep(1)


def remove_install() -> None:
    """Delete what ``install`` applied (the rendered install's objects, the webhook configurations
    first) and wait until kratos-system is gone."""
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        kubectl("delete", kind, "kratos-admit", "--ignore-not-found", check=False)
    kubectl(
        "delete",
        "-f",
        "-",
        "--ignore-not-found",
        "--wait=false",
        stdin=kubectl("kustomize", str(REPO / "webhook-config")),
        check=False,
    )
    namespace_gone(NAMESPACE)


def install(directory: Path) -> Generator[Installed, None, None]:
    """Install KRATOS (the session fixture's body): applied objects, the two processes, the Nodes;
    afterwards all of it removed, kratos-system gone, and the RuntimeClass only if it made it."""
    kubectl("delete", "namespaces", "-l", "kratos-e2e=true", "--wait=false")  # an earlier run's, if any
    namespace_gone(NAMESPACE)  # an earlier module's uninstall may still be under way
    had_runtime_class = bool(
        kubectl("get", "runtimeclass", "nvidia", "--ignore-not-found", "-o", "name").strip()
    )
    certs = directory / "certs"
    generate(service="kratos-webhook", namespace=NAMESPACE, out=certs, extra_names=("127.0.0.1",))
    front = free_port()
    plain, webhooks = install_objects(front, (certs / "ca.crt").read_bytes())
    apply(plain)
    kubectl("wait", "--for=condition=Established", "crd/workloadprofiles.gpu.scheduler.io", "--timeout=60s")
    apply([RUNTIME_CLASS])
    apply([gpu_node(*node) for node in GPU_NODES])
    make_nodes_ready()
    installed = Installed(
        directory, front, service_account_kubeconfig("kratos-webhook", directory / "webhook.kubeconfig"),
        service_account_kubeconfig("kratos-controller", directory / "controller.kubeconfig"),
    )  # fmt: skip
    try:
        apply(webhooks)
        yield installed
    finally:
        for process in installed.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.stop(timeout=20)
        kubectl("delete", "nodes", "-l", "kratos-e2e=true", "--ignore-not-found", check=False)
        remove_install()
        if not had_runtime_class:
            kubectl("delete", "runtimeclass", "nvidia", "--ignore-not-found", check=False)


class Front:
    """The Service in front of the webhook pods (the harness's kube-proxy-like forwarder) on the port
    the webhook configurations name, served by an event loop of its own in a thread."""

    def __init__(self, port: int, context: ssl.SSLContext, pods: list[int]) -> None:
        self.service = Service(context, pods=list(pods), port=port)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.stop: asyncio.Event | None = None

    def __enter__(self) -> Front:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._started(), self.loop).result(10)
        return self

    async def _started(self) -> None:
        self.stop = asyncio.Event()
        started = asyncio.Event()

        async def serve() -> None:
            async with self.service.running():
                started.set()
                assert self.stop is not None
                await self.stop.wait()

        self.task = asyncio.create_task(serve())
        await started.wait()

    def __exit__(self, *_: object) -> None:
        assert self.stop is not None
        self.loop.call_soon_threadsafe(self.stop.set)
        asyncio.run_coroutine_threadsafe(asyncio.wait_for(self._finished(), 10), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _finished(self) -> None:
        await self.task


class Telemetry:
    """The fake Nodes' GPU telemetry as the GPU Operator and a monitoring stack publish it: a
    dcgm-exporter stand-in per Node serving what ``dcgm`` holds for it, and a real Prometheus
    (Debian's) scraping them every second, all served by an event loop of its own in a thread (each
    test has its own loop). Prometheus can be stopped and started again at the same URL, on the same
    storage."""

    def __init__(
        self, directory: Path, nodes: Mapping[str, str] | None = None, host: str = "127.0.0.1"
    ) -> None:
        """``nodes``: node -> GPU product (default: the fake Nodes); ``host``: where Prometheus listens
        (a real node's Pods reach the host at the node's bridge address)."""
        self.nodes = dict(nodes) if nodes is not None else {n: p for n, p, _ in GPU_NODES}
        self.dcgm = Dcgm(self.nodes)
        self.directory = directory
        self.host = host
        self.url = f"http://{host}:{free_port()}"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.exporters: list[TestServer] = []
        self.prometheus: contextlib.AbstractAsyncContextManager[str] | None = None

    def _run(self, work: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    def __enter__(self) -> Telemetry:
        self.thread.start()
        try:
            self._run(self._exporters())
            self.start_prometheus()
        except BaseException:
            self.__exit__()
            raise
        return self

    async def _exporters(self) -> None:
        for node in self.nodes:
            server = TestServer(dcgm_exporter_app(functools.partial(self.dcgm.gpus, node)))
            await server.start_server()
            self.exporters.append(server)

    def start_prometheus(self) -> None:
        jobs = [
            ScrapeJob(f"dcgm-exporter-{node}", f"127.0.0.1:{server.port}")
            for node, server in zip(self.nodes, self.exporters, strict=True)
        ]
        port = int(self.url.rsplit(":", 1)[1])
        running = real_prometheus(jobs, self.directory, interval=1.0, port=port, host=self.host)
        assert self._run(running.__aenter__()) == self.url
        self.prometheus = running

    def stop_prometheus(self) -> None:
        running, self.prometheus = self.prometheus, None
        if running is not None:
            self._run(running.__aexit__(None, None, None))

    def __exit__(self, *_: object) -> None:
        try:
            self.stop_prometheus()
            for server in self.exporters:
                self._run(server.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def scraped(self, namespace: str, pod: str) -> int:
        """How many DRAM_ACTIVE samples of the Pod's GPUs Prometheus holds (its HTTP API, as anyone asks)."""
        query = f'count_over_time(DCGM_FI_PROF_DRAM_ACTIVE{{namespace="{namespace}",pod="{pod}"}}[10m])'
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        with urllib.request.urlopen(url, timeout=5) as response:
            found = json.load(response)["data"]["result"]
        return sum(int(series["value"][1]) for series in found)
