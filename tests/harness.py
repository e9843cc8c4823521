"""What tests share, beside the object builders (tests/builders.py): paths and the test key,
schema validation, engines and one-call admission, AdmissionReviews, the API double served
in-process, API clients and waiting, the controller and the webhook running against the double,
the profiling Job, runner Pod and runner summary as the webhook and runner write them, and
dcgm-exporter's exposition with a Prometheus HTTP API that answers from it.
Test modules import from here and from builders, never from each other or from conftest."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime as dt
import functools
import glob
import importlib.util
import io
import json
import os
import random
import re
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import jsonpatch
import kubernetes_validate
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client

from kratos_admit.admission.engine import AdmissionEngine, ReviewResult, Webhook, answer, build_engine
from kratos_admit.admission.request import Operation, admission_review, parse_review
from kratos_admit.decisions.policy import PolicyContext
from kratos_admit.decisions.stores import StaticNodeStore, StaticProfileStore
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.raw import clone
from kratos_admit.edge.cluster import ClusterCalibrationStore, ClusterNodeStore, ClusterProfileStore
from kratos_admit.edge.pki import BACKDATE, alt_names, cert_pem, issue_serving, key_pem, new_authority
from kratos_admit.model.catalog import load_catalog
from kratos_admit.model.telemetry import (
    DRAM_ACTIVE,
    GR_ENGINE_ACTIVE,
    PIPE_FP32_ACTIVE,
    PIPE_TENSOR_ACTIVE,
    SM_ACTIVE,
    Sample,
    parse_exposition,
)
from kratos_admit.simulation.trace import Figures, Truth
from kratos_admit.webhook.certs import generate, service_dns_names
from kratos_admit.webhook.metrics import AdmissionMetrics
from kratos_admit.webhook.server import create_app, running_site
from kratos_admit.webhook.tls import ServingCertificate
from kratos_controller.manager import Manager
from kratos_controller.metrics import ControllerMetrics
from kratos_runner.failures import classify
from kratos_runner.launch import loader_failure, with_fix
from kratos_runner.parse import Report, parse_report
from kratos_runner.summary import encode_summary, summarise
from tests.builders import JobBuilder, make_job
from tests.kube_double import (
    ADMIN,
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    CONTROLLER,
    EVENTS,
    MUTATING,
    ROLEBINDINGS,
    ROLES,
    TOKENS,
    VALIDATING,
    WEBHOOK,
    Identity,
    KubeDouble,
)

REPO = Path(__file__).resolve().parents[1]


DATA = REPO / "tests" / "data"  # test data written for this project (tests/data/README.md)


# real outside data, only when it sits beside the clone (KRATOS_TEST_OUTSIDE_DATA moves it, for the test of a lone clone)
FIXTURES = Path(os.environ.get("KRATOS_TEST_OUTSIDE_DATA") or REPO.parent / "shared" / "fixtures")


EXAMPLES = REPO / "examples"


K8S_VERSION = "1.32"


TEST_KEY = b"0123456789abcdef0123456789abcdef-test-key"


CATALOG = load_catalog()


def make_ctx(**config: Any) -> PolicyContext:
    return PolicyContext(config=Config.model_validate(config), catalog=CATALOG, signing_key=TEST_KEY)


def assert_valid_kubernetes(obj: dict[str, Any]) -> None:
    """Strict validation against the official Kubernetes OpenAPI schema (kubernetes-validate)."""
    kubernetes_validate.validate(copy.deepcopy(obj), K8S_VERSION, strict=True)


def apply_patch(obj: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = jsonpatch.apply_patch(obj, patch)
    return result


def readme_overlay(registry: str = "registry.example.com/gpu") -> str:
    """The overlay of the README's install steps (``my-kratos/kustomization.yaml``), registry filled in."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(r"cat > my-kratos/kustomization.yaml <<YAML\n(.*?)\nYAML\n", text, re.S)
    assert found, "the README's install steps have the overlay"
    return found.group(1).replace("REGISTRY", registry)


_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def markdown_prose(text: str) -> list[str]:
    """The lines of a Markdown page outside fenced code blocks (a ``# 1.`` in a shell block is no heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading's text: the rendered text (code marks, emphasis and link targets
    gone) in lower case, every character but letters, digits, spaces, ``-`` and ``_`` dropped, and
    each space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def markdown_anchors(path: Path) -> set[str]:
    """Every anchor a Markdown page has on GitHub: one per heading (``-1``, ``-2`` after a repeat) and
    each HTML ``id``/``name``."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in markdown_prose(path.read_text(encoding="utf-8")):
        heading = _HEADING.match(line)
        if heading:
            anchor = github_anchor(heading.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            anchors.add(anchor if count == 0 else f"{anchor}-{count}")
        anchors.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
    return anchors


def markdown_links(path: Path) -> list[str]:
    """The targets of a Markdown page's inline links and images, outside code blocks and code spans."""
    targets = []
    for line in markdown_prose(path.read_text(encoding="utf-8")):
        targets += _LINK.findall(re.sub(r"`[^`]*`", "", line))
    return targets


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail(
            "kubectl is needed: tests render webhook-config/ and run the README's kubectl commands client-side"
        )
    return found


def render(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a directory, as objects."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def require_fixtures() -> Path:
    """The outside data folder, or a skip: a lone clone tests the same behaviours on tests/data."""
    if not FIXTURES.is_dir():
        pytest.skip(
            f"outside data not found at {FIXTURES}: the tests of real Nsight Compute exports, manifests "
            "and AdmissionReviews need ../shared/fixtures beside the clone (tests/data covers the same behaviours)"
        )
    return FIXTURES


MIXED_CLUSTER = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S", "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3")


def engine(
    ctx: PolicyContext, profiles: Iterable[WorkloadProfile] = (), products: Iterable[str] = MIXED_CLUSTER
) -> AdmissionEngine:
    return AdmissionEngine(ctx=ctx, profiles=StaticProfileStore(profiles), nodes=StaticNodeStore(products))


def admit(
    obj: dict[str, Any],
    eng: AdmissionEngine,
    *,
    webhook: Webhook = "mutate",
    operation: Operation = "CREATE",
    old: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> ReviewResult:
    review = admission_review(
        clone(obj),
        operation=operation,
        uid="test-uid",
        old=clone(old) if old is not None else None,
        dry_run=dry_run,
    )
    return answer(parse_review(review), webhook=webhook, engine=eng)


def mutate_and_check(obj: dict[str, Any], eng: AdmissionEngine) -> tuple[ReviewResult, dict[str, Any]]:
    """Run the mutating webhook and check every property DESIGN asks of its output: allowed, the
    patch gives the returned object, valid against the Kubernetes schema, idempotent (mutating its
    own output yields no patch), and admitted by the validating webhook."""
    result = admit(obj, eng)
    assert result.decision.allowed, result.decision.violations
    mutated = result.decision.mutated
    assert mutated is not None
    assert apply_patch(obj, result.patch) == mutated, (
        "the patch applied to the input gives the returned object"
    )
    assert_valid_kubernetes(mutated)
    again = admit(mutated, eng)
    assert again.patch == [] and again.outcome == "allowed", "mutating its own output yields no patch"
    validated = admit(mutated, eng, webhook="validate")
    assert validated.decision.allowed, validated.decision.violations
    return result, mutated


HOSTNAME = "kratos-webhook.kratos-system.svc"  # the serving certificate's name in tests


def review_of(
    obj: dict[str, Any], *, uid: str = "uid-1", operation: Operation = "CREATE", dry_run: bool = False
) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it, from alice in the object's namespace (team-a)."""
    namespace = obj["metadata"].get("namespace", "team-a")
    return admission_review(
        obj, uid=uid, operation=operation, namespace=namespace, user="alice", dry_run=dry_run
    )


def profiling_job(
    name: str = "vector-add", namespace: str = "team-a", workload: str | None = None
) -> dict[str, Any]:
    """The user's Job after the mutating webhook rewrote it (signed with TEST_KEY)."""
    user = make_job(name, namespace).label(v.WORKLOAD_LABEL, workload or name).args("--n", "4096").obj()
    result = admit(user, engine(make_ctx()))
    assert result.decision.action == "profiling"
    job = copy.deepcopy(result.decision.mutated)
    assert job is not None
    job["metadata"]["uid"] = f"uid-{name}"
    return job


def finish(
    job: dict[str, Any], condition: str = "Complete", *, reason: str = "", message: str = ""
) -> dict[str, Any]:
    """A copy of ``job`` (as the webhook or a builder made it) ended as the Job controller ends it."""
    return JobBuilder.of(job).finished(condition, reason=reason, message=message).obj()


T4_REPORT = DATA / "ncu" / "t4-two-kernel-memory-bound-text.txt"  # memory-bound: 78.90 % memory, 29.40 % SM


def runner_summary(report: Path = T4_REPORT, exit_code: int = 0) -> str:
    """What the profiling-runner writes to its termination log, from an ncu text report or CSV export."""
    text = report.read_text(encoding="utf-8")
    return encode_summary(summarise(parse_report(text), exit_code=exit_code, ncu_version="2024.3.2.0"))


# DESIGN's memory-bound example as DCGM's extended counters show it (which include the default ones)
MEMORY_BOUND = (
    (DRAM_ACTIVE, 0.8),
    (PIPE_FP32_ACTIVE, 0.15),
    (PIPE_TENSOR_ACTIVE, 0.0),
    (SM_ACTIVE, 0.95),
    (GR_ENGINE_ACTIVE, 0.97),
)


# Nsight Compute 2022.3's words when DCGM holds the GPU's performance counters (the string in Debian's
# nsight-compute 2022.3.0.22, target/linux-desktop-glibc_2_11_3-x64/libcuda-injection.so, as ncu prints it)
COUNTERS_IN_USE_OUTPUT = (
    "==PROF== Connected to process 4242 (/opt/app/train)\n"
    "==ERROR== Profiling failed because a driver resource was unavailable. Ensure that no other tool (like "
    "DCGM) is concurrently collecting profiling data. See "
    "https://docs.nvidia.com/nsight-compute/ProfilingGuide/index.html#faq for more details.\n"
    "==WARNING== No kernels were profiled.\n"
)


def runner_summary_failed(output: str = COUNTERS_IN_USE_OUTPUT, exit_code: int = 1) -> str:
    """What the runner writes for a run that profiled nothing: its failure class and reason read from
    ``output`` by the runner's own classifier."""
    failure, reason = classify(output)
    summary = summarise(Report("none"), exit_code=exit_code, ncu_version="2022.3.0.0", reason=reason)
    return encode_summary({**summary, "failure": failure, "ncuSet": "default"})


# glibc's dynamic loader refusing a staged CUDA program whose runtime library stayed in its own image
MISSING_LIBRARY_OUTPUT = (
    "==PROF== Connected to process 4242 (/kratos/stage/vectorAdd)\n"
    "/kratos/stage/vectorAdd: error while loading shared libraries: libcudart.so.12: cannot open shared "
    "object file: No such file or directory\n"
    "==WARNING== No kernels were profiled.\n"
)


def runner_summary_cannot_start(
    output: str = MISSING_LIBRARY_OUTPUT, exe: str = "/kratos/stage/vectorAdd"
) -> str:
    """What the runner writes when the staged executable could not start: its reason read from the
    run's output by the runner's own functions, status 127 (the loader's)."""
    reason = with_fix(loader_failure(output), exe)
    assert reason, "the output holds no refusal of the dynamic loader"
    return encode_summary(summarise(Report("none"), exit_code=127, ncu_version="2024.3.2.0", reason=reason))


def runner_pod(
    job: dict[str, Any], message: str | None, *, exit_code: int = 0, name: str | None = None
) -> dict[str, Any]:
    meta = job["metadata"]
    terminated: dict[str, Any] = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
    if message is not None:
        terminated["message"] = message
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or f"{meta['name']}-abcde",
            "namespace": meta["namespace"],
            "labels": {"job-name": meta["name"], "batch.kubernetes.io/job-name": meta["name"]},
            "creationTimestamp": "2026-11-22T10:00:00Z",
        },
        "spec": {"containers": [{"name": v.RUNNER_CONTAINER, "image": "kratos-nsight-compute-poc:latest"}]},
        "status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": v.RUNNER_CONTAINER,
                    "ready": False,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "state": {"terminated": terminated},
                }
            ],
        },
    }


def summary_json(message: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(message)
    return parsed


JOBS, PODS, PROFILES = (
    ("apis/batch/v1", "jobs"),
    ("api/v1", "pods"),
    ("apis/gpu.scheduler.io/v1alpha1", "workloadprofiles"),
)
CONFIGMAPS, LEASES = ("api/v1", "configmaps"), ("apis/coordination.k8s.io/v1", "leases")
SECRETS = ("api/v1", "secrets")
NAMESPACES, NODES = ("api/v1", "namespaces"), ("api/v1", "nodes")
RUNTIMECLASSES = ("apis/node.k8s.io/v1", "runtimeclasses")
SERVICE = ("kratos-system", "kratos-webhook")


RBAC_KINDS = {
    "Role": ROLES,
    "RoleBinding": ROLEBINDINGS,
    "ClusterRole": CLUSTERROLES,
    "ClusterRoleBinding": CLUSTERROLEBINDINGS,
}


@functools.cache
def _rendered_install() -> tuple[dict[str, Any], ...]:
    return tuple(render(REPO / "webhook-config"))


def rendered_rbac() -> list[dict[str, Any]]:
    """The Roles, ClusterRoles and bindings that ``kubectl kustomize webhook-config/`` renders."""
    return [copy.deepcopy(o) for o in _rendered_install() if o.get("kind") in RBAC_KINDS]


def install_rbac(kube: KubeDouble, objects: Iterable[dict[str, Any]] | None = None) -> None:
    """Store the install's RBAC in the double, which then authorises every request against it."""
    for obj in rendered_rbac() if objects is None else objects:
        kube.put(*RBAC_KINDS[obj["kind"]], obj)


def token_of(identity: Identity) -> str:
    return next(token for token, known in TOKENS.items() if known == identity)


@contextlib.asynccontextmanager
async def api_server(kube: KubeDouble) -> AsyncIterator[TestServer]:
    """The double served in-process, with the install's RBAC unless the test stored its own."""
    if not kube.objects[CLUSTERROLES]:
        install_rbac(kube)
    server = TestServer(kube.app())
    await server.start_server()
    try:
        yield server
    finally:
        kube.stop()
        await server.close()


def api_for(
    server: TestServer, agent: str = "kratos-test", *, identity: Identity = ADMIN
) -> client.ApiClient:
    """A client of the double presenting ``identity``'s bearer token (the cluster admin by default,
    as a user's kubectl; the webhook and controller run as their ServiceAccounts)."""
    configuration = client.Configuration(host=str(server.make_url("")).rstrip("/"))
    configuration.api_key = {"BearerToken": token_of(identity)}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
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
) -> AsyncIterator[Manager]:
    api = api_for(server, agent, identity=CONTROLLER)
    controller = Manager(
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
async def kratos_cluster(
    tmp_path: Path,
    *products: str,
    controller: bool = True,
    kube: KubeDouble | None = None,
    controller_config: Config | None = None,
    **config: Any,
) -> AsyncIterator[tuple[KubeDouble, TestServer, client.ApiClient]]:
    """KRATOS installed on the API double as the README installs it (``opted_in_cluster``), the
    webhook serving and, unless told not to, the controller running (with ``controller_config`` when
    given); yields the double, its server and an admin client (kubectl)."""
    kube = kube if kube is not None else KubeDouble()
    async with api_server(kube) as server, webhook_serving(kube, server, tmp_path, **config):
        opted_in_cluster(kube, (tmp_path / "certs" / "ca.crt").read_bytes(), *products)
        api = api_for(server, "kubectl")
        try:
            if controller:
                async with controller_running(server, config=controller_config) as running:
                    await eventually(running.informer.synced.is_set)
                    yield kube, server, api
            else:
                yield kube, server, api
        finally:
            await api.close()


@contextlib.asynccontextmanager
async def webhook_serving(
    kube: KubeDouble, server: TestServer, tmp_path: Path, **config: Any
) -> AsyncIterator[AdmissionEngine]:
    """The webhook in cluster mode (live stores over the double), serving HTTPS on 127.0.0.1, and the
    double told where the kratos-webhook Service answers."""
    certs = tmp_path / "certs"
    if not (certs / "ca.crt").exists():
        generate(service=SERVICE[1], namespace=SERVICE[0], out=certs)
    api = api_for(server, "kratos-webhook", identity=WEBHOOK)
    settings = Config.model_validate(config)
    engine = build_engine(
        settings, signing_key=TEST_KEY, profiles=ClusterProfileStore(api), nodes=ClusterNodeStore(api),
        catalog=CATALOG, calibration=ClusterCalibrationStore(api, settings.lease_namespace),
    )  # fmt: skip
    stores = [asyncio.create_task(engine.profiles.run()), asyncio.create_task(engine.nodes.run()),
              asyncio.create_task(engine.calibration.run())]  # fmt: skip
    port = free_port()
    app = create_app(engine, metrics=AdmissionMetrics(), max_body_bytes=1 << 22)
    certificate = ServingCertificate(certs / "tls.crt", certs / "tls.key")
    try:
        async with running_site(app, "127.0.0.1", port, certificate=certificate):
            kube.services[SERVICE] = ("127.0.0.1", port)
            await eventually(lambda: engine.profiles.ready() and engine.nodes.ready())
            yield engine
    finally:
        for task in stores:
            task.cancel()
        await asyncio.gather(*stores, return_exceptions=True)
        await api.close()


@contextlib.contextmanager
def double_in_thread(kube: KubeDouble) -> Iterator[str]:
    """Serve the double from its own event loop, so a CLI that runs asyncio.run() can call it."""
    if not kube.objects[CLUSTERROLES]:
        install_rbac(kube)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, TestServer] = {}

    async def start() -> None:
        holder["server"] = TestServer(kube.app())
        await holder["server"].start_server()
        started.set()

    thread = threading.Thread(
        target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True
    )
    thread.start()
    assert started.wait(10)
    try:
        yield str(holder["server"].make_url("")).rstrip("/")
    finally:
        asyncio.run_coroutine_threadsafe(holder["server"].close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


_VOLUME_GENERATION = iter(range(1 << 30))


def webhook_secrets(
    *,
    lifetime: dt.timedelta,
    remaining: dt.timedelta,
    namespace: str = "kratos-system",
    rsa_key: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chart's two Secrets: ``kratos-webhook-ca`` (the CA and its key) and ``kratos-webhook-tls``
    (a serving certificate from that CA for the webhook Service's names, of ``lifetime`` with
    ``remaining`` left, ECDSA P-256 or RSA 2048)."""
    now = dt.datetime.now(dt.UTC)
    authority = new_authority(namespace, now)
    issued_at = now - (lifetime - remaining)
    like = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key() if rsa_key else None
    cert, key = issue_serving(
        authority,
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kratos-webhook.{namespace}.svc")]),
        names=alt_names(service_dns_names("kratos-webhook", namespace)),
        not_after=now + remaining,
        now=issued_at + BACKDATE,
        like=like,
    )
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    ca_secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                 "metadata": {"name": "kratos-webhook-ca", "namespace": namespace},
                 "data": {"ca.crt": b64(cert_pem(authority.cert)), "ca.key": b64(key_pem(authority.key))}}  # fmt: skip
    tls_secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                  "metadata": {"name": "kratos-webhook-tls", "namespace": namespace},
                  "data": {"tls.crt": b64(cert), "tls.key": b64(key), "ca.crt": b64(cert_pem(authority.cert))}}  # fmt: skip
    return ca_secret, tls_secret


def update_secret_volume(volume: Path, files: dict[str, bytes]) -> None:
    """Write a Secret volume as kubelet's AtomicWriter does: the files in a new timestamped
    directory, ``..data`` re-pointed at it by one rename, each file a link through ``..data``;
    a reader sees the old set of files or the new one, never a mix."""
    volume.mkdir(parents=True, exist_ok=True)
    generation = f"..{next(_VOLUME_GENERATION):06d}"
    (volume / generation).mkdir()
    for name, data in files.items():
        (volume / generation / name).write_bytes(data)
    old = (volume / "..data").readlink() if (volume / "..data").is_symlink() else None
    (volume / "..data_tmp").symlink_to(generation)
    (volume / "..data_tmp").replace(volume / "..data")
    for name in files:
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(Path("..data") / name)
    if old is not None:
        shutil.rmtree(volume / old)


def kubeconfig_for(url: str, path: Path, identity: Identity = ADMIN) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "double",
        "clusters": [{"name": "double", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": token_of(identity)}}],
        "contexts": [{"name": "double", "context": {"cluster": "double", "user": "u"}}],
    }))  # fmt: skip
    return path


def profile(
    workload: str, namespace: str = "team-a", *, phase: str = "Ready", bound: str = "memory"
) -> dict[str, Any]:
    return {
        "apiVersion": v.API_VERSION,
        "kind": v.PROFILE_KIND,
        "metadata": {"name": f"{workload}-profile", "namespace": namespace},
        "spec": {"workload": workload},
        "status": {
            "phase": phase,
            "boundType": bound,
            "metrics": {"smThroughput": "12.0", "memoryThroughput": "85.0"},
        },
    }


def node(name: str, product: str, *, gpu: bool = True) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if gpu:
        labels |= {v.GPU_PRESENT_LABEL: "true", v.GPU_PRODUCT_LABEL: product}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def seed_finished(
    kube: KubeDouble,
    name: str,
    message: str | None,
    condition: str = "Complete",
    *,
    exit_code: int | None = None,
    reason: str = "",
) -> dict[str, Any]:
    """A profiling Job ``name`` ended as ``condition`` (with the Job controller's ``reason``), whose
    runner left ``message`` and ended with ``exit_code`` (0 with a message, 1 without, by default)."""
    job = finish(profiling_job(name), condition, reason=reason)
    status = exit_code if exit_code is not None else 0 if message else 1
    kube.put(*PODS, runner_pod(job, message, exit_code=status))
    return kube.put(*JOBS, job)


def execution_jobs(kube: KubeDouble) -> list[dict[str, Any]]:
    return [j for j in kube.items(*JOBS) if j["metadata"].get("labels", {}).get(v.ROLE_LABEL) == "execution"]


async def controller_outcome(
    profiling_job: dict[str, Any], termination_message: str, *, signing_key: bytes, exit_code: int = 0
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """What the controller, against the API double, makes of a profiling Job whose runner ended with
    ``exit_code`` and ``termination_message`` (a non-zero status fails the Job: backoffLimit 0): the
    WorkloadProfile it published and the execution Jobs."""
    kube = KubeDouble()
    job = clone(profiling_job)
    job["metadata"]["uid"] = f"uid-{job['metadata']['name']}"
    if exit_code == 0:
        done = finish(job)
    else:
        done = finish(
            job,
            "Failed",
            reason="BackoffLimitExceeded",
            message="Job has reached the specified backoff limit",
        )
    kube.put(*JOBS, done)
    kube.put(*PODS, runner_pod(done, termination_message, exit_code=exit_code))
    async with api_server(kube) as server, controller_running(server, signing_key=signing_key):
        created = await eventually(lambda: execution_jobs(kube))
    workload = job["metadata"]["labels"][v.WORKLOAD_LABEL]
    return kube.get(*PROFILES, job["metadata"]["namespace"], v.profile_name(workload)), created


ENDPOINT_PERIOD = 0.2  # how fast endpoints follow a pod's readiness
PROBE_TIMEOUT = 1.0  # the kubelet's default timeoutSeconds
FAILURE_THRESHOLD = (
    2  # failed probes in a row before an endpoint is dropped (the Deployment's readinessProbe)
)


async def probe(session: aiohttp.ClientSession, port: int, path: str, context: ssl.SSLContext) -> bool:
    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
        async with session.get(
            f"https://127.0.0.1:{port}{path}",
            ssl=context,
            server_hostname=HOSTNAME,
            timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT),
        ) as response:
            return response.status == 200
    return False


@dataclass
class Service:
    """A ClusterIP Service over the webhook pods' ports, as kube-proxy and the endpoints controller
    make one: each new connection goes to a ready endpoint; when none is ready, to one that is
    terminating but still serving (kube-proxy's fallback to terminating endpoints, GA in 1.28); an
    open connection stays where it is (conntrack). Endpoints follow each pod's ``/readyz`` and
    ``/healthz`` every ``ENDPOINT_PERIOD`` seconds. ``port`` may be fixed (a webhook configuration
    names it); 0 takes a free one."""

    context: ssl.SSLContext
    pods: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    serving: list[int] = field(default_factory=list)
    port: int = 0
    picks: int = 0

    def backend(self) -> int | None:
        chosen = self.ready or self.serving
        if not chosen:
            return None
        self.picks += 1
        return chosen[self.picks % len(chosen)]

    async def follow_endpoints(self) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            failed: dict[tuple[int, str], int] = {}  # (port, path) -> probes failed in a row

            async def passes(port: int, path: str, listed: list[int]) -> bool:
                """A probe that fails once is not yet a verdict: an endpoint leaves after
                FAILURE_THRESHOLD failures in a row, as the kubelet's readiness probe decides."""
                if await probe(session, port, path, self.context):
                    failed[(port, path)] = 0
                    return True
                failed[(port, path)] = failed.get((port, path), 0) + 1
                return port in listed and failed[(port, path)] < FAILURE_THRESHOLD

            while True:
                ready, serving = [], []
                for port in list(self.pods):
                    if await passes(port, "/readyz", self.ready):
                        ready.append(port)
                    elif await passes(port, "/healthz", self.serving + self.ready):
                        serving.append(port)
                self.ready, self.serving = ready, serving
                await asyncio.sleep(ENDPOINT_PERIOD)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = self.backend()
        if port is None:  # no endpoint at all: the client's connection is refused
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while chunk := await source.read(65536):
                    sink.write(chunk)
                    await sink.drain()
            with contextlib.suppress(OSError):
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Service]:
        server = await asyncio.start_server(self._forward, "127.0.0.1", self.port)
        self.port = server.sockets[0].getsockname()[1]
        follower = asyncio.create_task(self.follow_endpoints())
        try:
            yield self
        finally:
            follower.cancel()
            server.close()


STAND_IN_NCU = r'''#!{python}
"""Stand-in for Nsight Compute's ncu: runs the workload and 'exports' the recorded report FAKE_NCU_EXPORT.

It honours --launch-skip S, --launch-count N and --kill as ncu does: a workload that announces each
kernel launch with a line "kernel" gets launches S+1..S+N profiled (the export keeps that many of
the recorded report's kernels) and, with --kill on, is killed once they are; a workload that announces
nothing plays the whole recorded report back, unless it ended with 127 (the status of a program that
never ran: not found, or refused by the dynamic loader), which leaves no report, as nothing connected.
Every option it logs is written to FAKE_NCU_LOG, so a test sees the command line ncu got."""
import os, shutil, signal, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_NCU_LOG"], "a") as log:
    log.write(repr(args) + "\n")
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2024.3.2.0 (build 34861637) (public-release)")
    sys.exit(0)
if args == ["--list-sets"]:
    # FAKE_NCU_SETS: a real ncu's table (tests/data/ncu-2022.3/list-sets.txt); else one in its layout
    # with the later versions' set names
    if os.environ.get("FAKE_NCU_SETS"):
        sys.stdout.write(open(os.environ["FAKE_NCU_SETS"]).read())
    else:
        rule = "-" * 10 + " " + "-" * 40 + " " + "-" * 7 + " " + "-" * 17
        print(rule + "\n" + "Identifier Sections".ljust(52) + "Enabled Estimated Metrics\n" + rule)
        for name, sections, on in (("basic", "LaunchStats, Occupancy, SpeedOfLight", "yes"), ("detailed", "ComputeWorkloadAnalysis, LaunchStats", "no"), ("full", "ComputeWorkloadAnalysis, InstructionStats", "no")):
            print(name.ljust(11) + sections.ljust(41) + on.ljust(8) + "40")
    sys.exit(0)
if "--import" in args:
    sys.stdout.write(open(args[args.index("--import") + 1]).read())
    sys.exit(0)
takes_value = {{"--set", "--metrics", "--target-processes", "--launch-skip", "--launch-count", "--export", "--kill", "--section", "--cache-control"}}
options = {{}}
i = 0
while args[i].startswith("-"):
    if args[i] in takes_value:
        options[args[i]] = args[i + 1]
        i += 2
    else:
        i += 1
workload = args[i:]
export = options["--export"]
skip, count = int(options.get("--launch-skip", "0")), int(options.get("--launch-count", "1000000"))
kill = options.get("--kill", "no") in ("yes", "on", "1", "true")
if os.environ.get("FAKE_NCU_OUTPUT"):  # a real ncu's words for a run that profiled nothing, played back
    sys.stdout.write(open(os.environ["FAKE_NCU_OUTPUT"]).read())
    sys.exit(int(os.environ.get("FAKE_NCU_STATUS", "1")))
print("==PROF== Connected to process 4242 (" + workload[0] + ")", flush=True)
if os.environ.get("FAKE_NCU_MODE") == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters on the target device 0.", flush=True)
    sys.exit(subprocess.call(workload))
process = subprocess.Popen(workload, stdout=subprocess.PIPE, text=True)
launches = 0
for line in process.stdout:
    if line.strip() != "kernel":
        sys.stdout.write(line)
        continue
    launches += 1
    if skip < launches <= skip + count:
        print("==PROF== Profiling kernel " + str(launches - skip), flush=True)
    if kill and launches == skip + count:
        process.send_signal(signal.SIGKILL)
        break
code = process.wait()
if not launches and code == 127:
    print("==WARNING== No kernels were profiled.", flush=True)
    sys.exit(code)
lines = open(os.environ["FAKE_NCU_EXPORT"]).read().splitlines(True)
profiled = min(max(0, launches - skip), count) if launches else len(lines) - 2
with open(export + ".ncu-rep", "w") as out:
    out.writelines(lines[: 2 + profiled])
print("==PROF== Disconnected from process 4242", flush=True)
sys.exit(128 - code if code < 0 else code)
'''


def executable(path: Path, content: str | bytes) -> Path:
    """``path`` written with ``content`` and made executable by everyone."""
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def program_missing_a_library(path: Path) -> Path:
    """A real dynamically linked program (this machine's ``true``) whose needed ``libc.so.6`` is renamed
    to ``libq.so.6`` in place: running it gets the dynamic loader's own refusal ("error while loading
    shared libraries: libq.so.6: cannot open shared object file") and status 127, as a staged binary
    that needs a library of its own image does in the Nsight Compute image."""
    true = shutil.which("true")
    data = Path(true).read_bytes() if true else b""
    if data.count(b"libc.so.6\0") != 1:
        pytest.skip(
            "no dynamically linked `true` needing libc.so.6 on this machine to make a program missing a library"
        )
    return executable(path, data.replace(b"libc.so.6\0", b"libq.so.6\0"))


def build_onefile_runner(out: Path) -> Path:
    """The runner as one self-contained executable, built by runner/build_onefile.py (PyInstaller) as
    runner/Dockerfile builds it; skips the calling test where PyInstaller is not installed."""
    pytest.importorskip(
        "PyInstaller",
        reason="PyInstaller is not installed (pip install -e '.[test]' brings it): the one-file runner cannot be built",
    )
    built = subprocess.run(
        [sys.executable, str(REPO / "runner" / "build_onefile.py"), "--out", str(out)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    path = out / "kratos-runner"
    assert built.stdout.strip() == f"{path}: {path.stat().st_size} bytes"
    return path


# --- dcgm-exporter, as the GPU Operator runs it in Kubernetes mode ------------------------------------

_DCGM_HELP = {
    "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %).", "gauge"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("Ratio of time the graphics engine is active (in %).", "gauge"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("Ratio of cycles the tensor (HMMA) pipe is active (in %).", "gauge"),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("Ratio of cycles the device memory interface is active sending or receiving data (in %).", "gauge"),
    "DCGM_FI_PROF_SM_ACTIVE": ("The ratio of cycles an SM has at least 1 warp assigned (in %).", "gauge"),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("The ratio of number of warps resident on an SM (in %).", "gauge"),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("Ratio of cycles the fp64 pipes are active (in %).", "gauge"),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("Ratio of cycles the fp32 pipes are active (in %).", "gauge"),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("Ratio of cycles the fp16 pipes are active (in %).", "gauge"),
    # the links, as dcgm-exporter 4.x's counters files word and type them (PROF_NVLINK_* as users add them)
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("Total number of NVLink bandwidth counters for all lanes.", "counter"),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", "gauge"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", "gauge"),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("The number of bytes of active NvLink tx (transmit) data including both header and payload.", "gauge"),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("The number of bytes of active NvLink rx (read) data including both header and payload.", "gauge"),
}  # fmt: skip


@dataclass(frozen=True)
class DcgmGpu:
    """One GPU (or MIG instance, with ``instance``) as dcgm-exporter labels it; ``pod`` empty when no
    Pod holds it (4.x then prints no pod labels at all)."""

    index: int
    uuid: str
    namespace: str = ""
    pod: str = ""
    container: str = "main"
    counters: tuple[tuple[str, float], ...] = ()  # (DCGM field name, value); GPU_UTIL is always printed
    model: str = "NVIDIA A100-SXM4-80GB"
    hostname: str = "gpu-0"
    instance: tuple[str, str] | None = None  # (GPU_I_PROFILE, GPU_I_ID)

    def labels(self) -> str:
        pairs = [("gpu", str(self.index)), ("UUID", self.uuid), ("pci_bus_id", f"00000000:{0x10 + self.index:02X}:00.0"),
                 ("device", f"nvidia{self.index}"), ("modelName", self.model)]  # fmt: skip
        if self.instance:
            pairs += [("GPU_I_PROFILE", self.instance[0]), ("GPU_I_ID", self.instance[1])]
        pairs += [("Hostname", self.hostname), ("DCGM_FI_DRIVER_VERSION", "580.105.08")]
        if self.pod:
            pairs += [
                ("container", self.container),
                ("namespace", self.namespace),
                ("pod", self.pod),
                ("pod_uid", ""),
            ]
        return ",".join(f'{k}="{val}"' for k, val in pairs)


def dcgm_exposition(gpus: Iterable[DcgmGpu]) -> str:
    """``/metrics`` as dcgm-exporter 4.x prints it (the shape of tests/data/dcgm): per family its
    HELP and TYPE lines, then one sample per GPU that has the field, values with six decimals."""
    gpus = list(gpus)
    lines: list[str] = []
    for name, (help_text, kind) in _DCGM_HELP.items():
        rows = []
        for gpu in gpus:
            values = dict(gpu.counters) | {
                "DCGM_FI_DEV_GPU_UTIL": 100.0 * dict(gpu.counters).get("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.0)
            }
            if name in values:
                value = f"{values[name]:.0f}" if name == "DCGM_FI_DEV_GPU_UTIL" else f"{values[name]:.6f}"
                rows.append(f"{name}{{{gpu.labels()}}} {value}")
        if rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *rows]
    return "\n".join(lines) + "\n"


def dcgm_exporter_app(gpus: Callable[[], Iterable[DcgmGpu]]) -> web.Application:
    """A stand-in for dcgm-exporter's ``/metrics`` (port 9400) that a real Prometheus can scrape:
    what ``gpus()`` says at each scrape, so a test moves Pods on and off GPUs as its kubelet
    stand-in runs them."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=dcgm_exposition(gpus()), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


# --- Prometheus, as the controller's telemetry asks it ------------------------------------------------

_AVG_OVER_TIME = re.compile(r"avg_over_time\((\w+)\{([^}]*)\}\[(\d+)s\]\)")
_MATCHER = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class FakePrometheus:
    """Prometheus's ``/api/v1/query`` for the PromQL the telemetry client writes
    (``avg_over_time(NAME{l="v",...}[Ns]) or ...``): it answers each alternative with the held
    samples of that name whose labels match, as Prometheus answers (``__name__`` dropped by
    ``avg_over_time``, values as strings, ``[time, value]``), in the exact JSON shape of the HTTP
    API. Any other query is a 400 ``bad_data``, as Prometheus says of a parse error. ``samples``
    stand for the averages Prometheus would compute; ``delay``, ``fail`` and ``token`` make it slow,
    failing or behind authentication; ``queries`` records what was asked."""

    samples: list[Sample] = field(default_factory=list)
    delay: float = 0.0
    fail: tuple[int, str] | None = None  # (HTTP status, body) answered to every query
    token: str | None = None  # the bearer token it demands
    queries: list[dict[str, str]] = field(default_factory=list)

    def load(self, path: Path) -> FakePrometheus:
        return self.load_text(path.read_text("utf-8"))

    def load_text(self, text: str) -> FakePrometheus:
        self.samples += parse_exposition(text).samples
        return self

    def _answer(self, query: str) -> list[dict[str, Any]] | None:
        alternatives = [a.strip() for a in query.split(" or ")]
        found: list[dict[str, Any]] = []
        seen: set[tuple[tuple[str, str], ...]] = set()
        for alternative in alternatives:
            parsed = _AVG_OVER_TIME.fullmatch(alternative)
            if parsed is None:
                return None
            name, matchers = parsed.group(1), dict(_MATCHER.findall(parsed.group(2)))
            matchers = {k: val.replace('\\"', '"').replace("\\\\", "\\") for k, val in matchers.items()}
            for sample in self.samples:
                if sample.name == name and all(sample.labels.get(k) == val for k, val in matchers.items()):
                    key = tuple(sorted(sample.labels.items()))
                    if key not in seen:  # `or` keeps the left side's series, and the right's others
                        seen.add(key)
                        found.append({"metric": dict(sample.labels), "value": [0.0, repr(sample.value)]})
        return found

    async def _query(self, request: web.Request) -> web.Response:
        params = dict(request.query)
        if request.method == "POST":
            params.update({k: str(val) for k, val in (await request.post()).items()})
        self.queries.append(params)
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.Response(status=401, text="Unauthorized\n")
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail is not None:
            return web.Response(status=self.fail[0], text=self.fail[1], content_type="application/json")
        result = self._answer(params.get("query", ""))
        if result is None:
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": "1:1: parse error: unexpected query"},
                status=400,
            )
        at = float(params.get("time", "0"))
        for item in result:
            item["value"][0] = at
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/api/v1/query", self._query)
        return app


@contextlib.asynccontextmanager
async def prometheus_serving(fake: FakePrometheus) -> AsyncIterator[str]:
    """The fake served on 127.0.0.1; yields its URL."""
    server = TestServer(fake.app())
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@dataclass(frozen=True)
class ScrapeJob:
    """One scrape job of a real Prometheus: a target, and how its labels meet the target's own.
    ``target_labels`` with ``honor_labels`` off is what a ServiceMonitor does: the exporter's
    ``namespace``/``pod``/``container`` clash with the target's and become ``exported_*``."""

    name: str
    target: str  # host:port
    honor_labels: bool = True
    target_labels: tuple[tuple[str, str], ...] = ()


def prometheus_binary() -> str:
    """Debian's ``prometheus`` package (the end-to-end suite's real server), or a skip."""
    found = shutil.which("prometheus")
    if found is None:
        pytest.skip(
            "no prometheus binary on PATH: the tests against a real Prometheus need Debian's prometheus package"
        )
    return found


@contextlib.asynccontextmanager
async def real_prometheus(
    jobs: Iterable[ScrapeJob],
    tmp_path: Path,
    *,
    interval: float = 0.5,
    port: int | None = None,
    host: str = "127.0.0.1",
) -> AsyncIterator[str]:
    """A real Prometheus scraping ``jobs`` every ``interval`` seconds, on ``host`` (``port``, else a
    free one); yields its URL once it is ready. Its own storage lives under ``tmp_path``, so one
    started again there on the same port has the samples of the first; it is stopped on the way out."""
    binary = prometheus_binary()
    scrape = [
        {
            "job_name": job.name,
            "honor_labels": job.honor_labels,
            "static_configs": [{"targets": [job.target], "labels": dict(job.target_labels)}],
        }
        for job in jobs
    ]
    config = {
        # Prometheus durations have no fractions
        "global": {
            "scrape_interval": f"{round(interval * 1000)}ms",
            "scrape_timeout": f"{round(interval * 1000)}ms",
        },
        "scrape_configs": scrape,
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = port or free_port()
    log = (tmp_path / "prometheus.log").open("ab")
    process = await asyncio.create_subprocess_exec(
        binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address={host}:{port}", "--log.level=warn",
        stdout=asyncio.subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    url = f"http://{host}:{port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                try:
                    async with session.get(f"{url}/-/ready") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            deadline = asyncio.get_running_loop().time() + 30
            while not await ready():
                if process.returncode is not None or asyncio.get_running_loop().time() > deadline:
                    said = (tmp_path / "prometheus.log").read_text(errors="replace")[-500:]
                    pytest.fail(
                        f"prometheus did not become ready at {url} (exit {process.returncode}): {said}"
                    )
                await asyncio.sleep(0.2)
        yield url
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()
        log.close()


def python38() -> str:
    """A working Python 3.8 (the oldest python3 the Nsight Compute image may have), or skip."""
    found = shutil.which("python3.8")
    candidates = [found] if found else []
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    for candidate in candidates:
        done = subprocess.run([candidate, "--version"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and "Python 3.8" in done.stdout + done.stderr:
            return candidate
    pytest.skip(
        "no working python3.8 on this machine to run the runner as the oldest Nsight Compute image would"
    )


# --- the CLI, and what a test reads back from the API double -----------------------------------------


def nodes_file(tmp_path: Path, *products: str) -> Path:
    """A Nodes YAML file (``--nodes``) of one GPU Node per product."""
    nodes = [
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": f"gpu-{i}", "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": p}}}
        for i, p in enumerate(products)
    ]  # fmt: skip
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump_all(nodes))
    return path


def run_kratos(*argv: str) -> tuple[int, str, str]:
    """``kratos-admit ARGV`` in process: its exit status, stdout and stderr."""
    from kratos_admit.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), stdout=out, stderr=err)
    return int(status), out.getvalue(), err.getvalue()


def events_of(kube: KubeDouble, reason: str) -> list[dict[str, Any]]:
    """The Events the double holds with ``reason``."""
    return [e for e in kube.items(*EVENTS) if e.get("reason") == reason]


def status_of(kube: KubeDouble, workload: str = "infer", namespace: str = "team-a") -> dict[str, Any]:
    """The status of ``workload``'s WorkloadProfile as the double holds it ({} when it has none)."""
    found = kube.get(*PROFILES, namespace, f"{workload}-profile")
    return dict((found or {}).get("status") or {})


@functools.cache
def docs_generator() -> ModuleType:
    """docs/generate.py, which is no package module: what writes the docs' figures from the code."""
    spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def drawn_truth(seed: int, spread: float = 0.4) -> Truth:
    """Every product's sustained FP32 and bandwidth off the catalog's by up to +-``spread``: the A100,
    L40S, L4 and T4, drawn in that order (the calibration tests' truths)."""
    rng = random.Random(seed)
    figures = {}
    for product in ("NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S", "NVIDIA-L4", "Tesla-T4"):
        entry = CATALOG.lookup(product)
        assert entry is not None
        figures[product] = Figures(
            entry.sustained_fp32_tflops * rng.uniform(1 - spread, 1 + spread),
            entry.sustained_bandwidth_gbs * rng.uniform(1 - spread, 1 + spread),
        )
    return Truth(CATALOG, figures)
