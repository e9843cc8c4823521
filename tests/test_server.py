"""The HTTPS server end to end: real TLS with a freshly generated certificate, real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kratos_admit.decisions.stores import StaticProfileStore
from kratos_admit.domain import vocabulary as v
from kratos_admit.webhook.certs import generate
from kratos_admit.webhook.metrics import AdmissionMetrics
from kratos_admit.webhook.server import create_app, running_site
from kratos_admit.webhook.tls import CertificateError, ServingCertificate
from tests.builders import make_job, make_pod, make_profile
from tests.harness import (
    DATA,
    EXAMPLES,
    HOSTNAME,
    REPO,
    apply_patch,
    assert_valid_kubernetes,
    engine,
    free_port,
    make_ctx,
    require_fixtures,
    review_of,
)

SERVICE, NAMESPACE = "kratos-webhook", "kratos-system"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    generate(service=SERVICE, namespace=NAMESPACE, out=out)
    return out


def client_context(certs: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    return context


class Webhook:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        port: int,
        metrics: AdmissionMetrics,
        ssl_context: ssl.SSLContext,
    ):
        self.session, self.port, self.metrics, self.ssl = session, port, metrics, ssl_context

    async def post(
        self, path: str, body: Any, *, raw: bytes | None = None, content_type: str = "application/json"
    ):
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.session.post(
            f"https://127.0.0.1:{self.port}{path}",
            data=data,
            headers={"Content-Type": content_type},
            ssl=self.ssl,
            server_hostname=HOSTNAME,
        ) as response:
            return response.status, await response.json(content_type=None) if response.status != 404 else None

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(
            f"https://127.0.0.1:{self.port}{path}", ssl=self.ssl, server_hostname=HOSTNAME
        ) as r:
            return r.status, await r.text()


@contextlib.asynccontextmanager
async def serving(
    certs: Path, *, profiles=None, max_body_bytes: int = 64 * 1024, ready=lambda: True
) -> AsyncIterator[Webhook]:
    metrics = AdmissionMetrics()
    certificate = ServingCertificate(
        certs / "tls.crt", certs / "tls.key", on_load=metrics.certificate_expiry.set
    )
    eng = engine(make_ctx(), [make_profile()] if profiles is None else list(profiles))
    metrics.watch_profile_count(lambda: len(eng.profiles))
    app = create_app(eng, metrics=metrics, max_body_bytes=max_body_bytes, ready=ready)
    port = free_port()
    async with (
        running_site(app, "127.0.0.1", port, certificate=certificate),
        aiohttp.ClientSession() as session,
    ):
        yield Webhook(session, port, metrics, client_context(certs))


async def test_https_round_trip_hints_a_job(certs: Path):
    job = make_job().obj()
    async with serving(certs) as hook:
        status, body = await hook.post("/mutate", review_of(job))
        assert status == 200
        response = body["response"]
        assert (
            response["uid"] == "uid-1"
            and response["allowed"] is True
            and response["patchType"] == "JSONPatch"
        )
        mutated = apply_patch(job, json.loads(base64.b64decode(response["patch"])))
        assert_valid_kubernetes(mutated)
        assert mutated["metadata"]["annotations"][v.PROFILE_ANNOTATION] == "vector-add-profile@7"
        status, body = await hook.post("/validate", review_of(mutated, uid="uid-2"))
        assert status == 200 and body["response"] == {"uid": "uid-2", "allowed": True}


async def test_https_validate_denies_with_every_reason(certs: Path):
    pod = make_pod().limits({v.GPU_RESOURCE: "1.5"}).annotate(v.PRIORITY_ANNOTATION, "urgent").obj()
    async with serving(certs) as hook:
        status, body = await hook.post("/validate", review_of(pod))
    assert status == 200
    response = body["response"]
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert (
        "spec.containers[0].resources.limits[nvidia.com/gpu]: must be a positive integer, got '1.5' (gpu-count)"
        in message
    )
    assert "(hint-format)" in message


async def test_dry_run_is_answered_like_a_real_request(certs: Path):
    job = make_job().obj()
    async with serving(certs) as hook:
        _, real = await hook.post("/mutate", review_of(job))
        _, dry = await hook.post("/mutate", review_of(job, dry_run=True))
    assert real == dry


async def test_delete_and_connect_are_allowed_untouched(certs: Path):
    async with serving(certs) as hook:
        for operation in ("DELETE", "CONNECT"):
            review = review_of(make_job().no_resources().obj(), operation=operation)
            review["request"]["oldObject"] = review["request"].pop("object")
            for path in ("/mutate", "/validate"):
                status, body = await hook.post(path, review)
                assert status == 200 and body["response"] == {"uid": "uid-1", "allowed": True}


@pytest.mark.parametrize(
    ("raw", "status", "error"),
    [
        pytest.param(b"{not json", 400, "body is not JSON", id="malformed-json"),
        pytest.param(b"[]", 400, "not an AdmissionReview", id="not-a-review"),
        pytest.param(
            json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {"operation": "CREATE", "object": {}},
                }
            ).encode(),
            400,
            "request.uid is missing",
            id="missing-uid",
        ),
        pytest.param(
            json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {"uid": "u", "operation": "CREATE"},
                }
            ).encode(),
            400,
            "request.object is missing on CREATE",
            id="missing-object",
        ),
        pytest.param(
            json.dumps(
                {"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview", "request": {"uid": "u"}}
            ).encode(),
            400,
            "apiVersion must be",
            id="unknown-version",
        ),
        pytest.param(b"\xff\xfe", 400, "body is not JSON", id="not-utf8"),
    ],
)
async def test_bad_requests_get_400_with_a_one_line_json_error(
    certs: Path, raw: bytes, status: int, error: str
):
    async with serving(certs) as hook:
        got, body = await hook.post("/validate", None, raw=raw)
    assert got == status and error in body["error"] and "\n" not in body["error"]


async def test_body_over_the_limit_is_413_and_wrong_content_type_is_415(certs: Path):
    async with serving(certs, max_body_bytes=2048) as hook:
        status, body = await hook.post("/mutate", None, raw=b"{" + b" " * 4096 + b"}")
        assert status == 413 and "limit of 2048 bytes" in body["error"]
        status, body = await hook.post("/mutate", review_of(make_job().obj()), content_type="text/plain")
        assert status == 415 and "application/json" in body["error"]


async def test_health_readiness_and_metrics(certs: Path):
    ready = {"value": False}
    async with serving(certs, ready=lambda: ready["value"]) as hook:
        assert (await hook.get("/healthz"))[0] == 200
        assert (await hook.get("/readyz"))[0] == 503
        ready["value"] = True
        assert (await hook.get("/readyz"))[0] == 200
        await hook.post("/mutate", review_of(make_job().obj()))
        await hook.post("/validate", review_of(make_pod().limits({v.GPU_RESOURCE: 0}).obj()))
        await hook.post("/validate", None, raw=b"nope")
        status, text = await hook.get("/metrics")
    assert status == 200
    assert (
        'kratos_admission_requests_total{kind="Job",operation="CREATE",outcome="patched",webhook="mutate"} 1.0'
        in text
    )
    assert (
        'kratos_admission_requests_total{kind="Pod",operation="CREATE",outcome="denied",webhook="validate"} 1.0'
        in text
    )
    assert (
        'kratos_admission_requests_total{kind="unknown",operation="unknown",outcome="error",webhook="validate"} 1.0'
        in text
    )
    assert 'kratos_validation_violations_total{rule="gpu-count"} 1.0' in text
    assert 'kratos_mutations_total{action="hints"} 1.0' in text
    assert "kratos_admission_duration_seconds_bucket" in text
    assert "kratos_profile_cache_objects 1.0" in text
    expiry = [
        line
        for line in text.splitlines()
        if line.startswith("kratos_tls_certificate_expiry_timestamp_seconds ")
    ]
    assert expiry and float(expiry[0].split()[1]) > time.time() + 300 * 86400


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
async def test_tls_below_1_2_is_refused(certs: Path):
    async with serving(certs) as hook:
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.load_verify_locations(certs / "ca.crt")
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
        with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
            async with hook.session.get(
                f"https://127.0.0.1:{hook.port}/healthz", ssl=old, server_hostname=HOSTNAME
            ):
                pass


def test_a_key_that_does_not_match_its_certificate_stops_start_up(tmp_path: Path, certs: Path):
    other = tmp_path / "other"
    generate(service="x", namespace="y", out=other)
    with pytest.raises(CertificateError, match="does not match the certificate"):
        ServingCertificate(certs / "tls.crt", other / "tls.key")


# --- recorded AdmissionReviews: the project's own (tests/data/admissionreviews) and the real outside
# ones (../shared/fixtures/admissionreviews, skipped when absent), as the API server or a policy engine
# stores them -----------------------------------------------------------------------------------------

# file: (status, allowed when labelled for KRATOS, rules when labelled, /mutate patches when labelled)
ReviewExpectation = tuple[int, bool | None, set[str] | None, bool | None]
PROJECT_REVIEWS: dict[str, ReviewExpectation] = {
    # a ReplicaSet's Pod: generateName only, ownerReferences, two init containers, no GPU
    "v1-pod-create-from-replicaset.json": (200, False, {"no-gpu"}, False),
    # the old admission.k8s.io/v1beta1 wrapper (echoed in the answer), containers: []
    "v1beta1-pod-create-no-containers.json": (200, False, {"no-gpu"}, False),
    "v1-deployment-scale-update.json": (200, True, set(), False),  # a Scale subresource: not ours
    "v1-pod-create-no-uid-tabs.json": (400, None, None, None),  # no request.uid, tab-indented
    # bare AdmissionRequests, as policy engines store them (wrapped before sending)
    "request-only-pod-create-privileged-init.json": (200, False, {"no-gpu"}, False),
    "request-only-gpu-pod-delete-oldobject.json": (200, True, set(), False),  # DELETE: object null
    "request-only-job-create-minimal.json": (200, False, {"no-gpu"}, False),  # no apiVersion/kind in object
    "request-only-gpu-job-create-minimal.json": (200, True, set(), True),  # ... and with a GPU: hinted
}
OUTSIDE_REVIEWS: dict[str, ReviewExpectation] = {
    "salesforce-sidecar-injector-v1-pod-create.json": (200, False, {"no-gpu"}, False),
    "r0haaaan-v1beta1-pod-create.json": (200, False, {"no-gpu"}, False),
    "jpbetz-cel-webhook-v1-scale-update.json": (200, True, set(), False),  # a Scale subresource: not ours
    "rtisma-v1-pod-create-no-uid-tabs.json": (400, None, None, None),
    "kubewarden-pod-create-initcontainer-request-only.json": (200, False, {"no-gpu"}, False),
    "kubewarden-pod-delete-oldobject-request-only.json": (200, True, set(), False),  # DELETE
    "kubewarden-job-create-request-only.json": (200, False, {"no-gpu"}, False),
}


def recorded_reviews(source: str) -> list[tuple[str, dict[str, Any]]]:
    directory = DATA / "admissionreviews" if source == "project" else require_fixtures() / "admissionreviews"
    reviews = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        if "request" not in data:
            data = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": data}
        reviews.append((path.name, data))
    return reviews


@pytest.mark.parametrize(("source", "expected"), [("project", PROJECT_REVIEWS), ("outside", OUTSIDE_REVIEWS)])
def test_every_recorded_review_has_an_expectation(source: str, expected: dict[str, ReviewExpectation]):
    assert {name for name, _ in recorded_reviews(source)} == set(expected)


@pytest.mark.parametrize(("source", "expected"), [("project", PROJECT_REVIEWS), ("outside", OUTSIDE_REVIEWS)])
async def test_recorded_reviews_get_well_formed_answers_or_400(
    certs: Path, source: str, expected: dict[str, ReviewExpectation]
):
    reviews = recorded_reviews(source)
    async with serving(certs) as hook:
        for name, review in reviews:
            expected_status, labelled_allowed, labelled_rules, labelled_patched = expected[name]
            for path in ("/mutate", "/validate"):
                status, body = await hook.post(path, review)
                assert status == expected_status, (name, path, body)
                if status == 400:
                    assert set(body) == {"error"}
                    continue
                assert body["apiVersion"] == review["apiVersion"] and body["kind"] == "AdmissionReview"
                assert body["response"]["uid"] == review["request"]["uid"]
                assert body["response"]["allowed"] is True, (name, "unlabelled objects are never touched")
                assert "patch" not in body["response"], (name, "unlabelled objects are never touched")
            if expected_status != 200:
                continue
            labelled = json.loads(json.dumps(review))
            obj = labelled["request"].get("object")
            if isinstance(obj, dict) and "metadata" in obj:
                obj["metadata"].setdefault("labels", {})[v.WORKLOAD_LABEL] = "fixture"
            status, body = await hook.post("/validate", labelled)
            assert status == 200 and body["response"]["allowed"] is labelled_allowed, (name, body)
            if labelled_rules:
                assert all(f"({rule})" in body["response"]["status"]["message"] for rule in labelled_rules)
            status, body = await hook.post("/mutate", labelled)
            assert status == 200 and ("patch" in body["response"]) is labelled_patched, (name, body)


# --- graceful shutdown: SIGTERM finishes the request in flight, then exit 0 -----------------------


def test_sigterm_finishes_in_flight_requests_and_exits_0(certs: Path):
    port = free_port()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "KRATOS_LOG_LEVEL": "DEBUG",  # every admission logged
        "KRATOS_SHUTDOWN_GRACE_SECONDS": "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kratos_admit",
            "webhook",
            "--listen",
            f"127.0.0.1:{port}",
            "--tls-cert",
            str(certs / "tls.crt"),
            "--tls-key",
            str(certs / "tls.key"),
            "--signing-key",
            str(certs / "signing.key"),
            "--profiles",
            str(EXAMPLES / "profiles"),
            "--nodes",
            str(EXAMPLES / "nodes.yaml"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        context = client_context(certs)
        deadline = time.monotonic() + 20
        while True:
            try:
                raw = socket.create_connection(("127.0.0.1", port), timeout=10)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(
                        f"webhook did not start: {proc.stderr.read().decode() if proc.stderr else ''}"
                    )
                time.sleep(0.1)
        body = json.dumps(review_of(make_job().obj())).encode()
        with context.wrap_socket(raw, server_hostname=HOSTNAME) as tls:
            tls.sendall(
                b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body[:100]
            )
            time.sleep(0.3)
            proc.terminate()  # SIGTERM while the request is half sent
            time.sleep(0.3)
            tls.sendall(body[100:])
            response = b""
            while chunk := tls.recv(65536):
                response += chunk
        assert response.startswith(b"HTTP/1.1 200"), response[:200]
        assert b'"allowed":true' in response
        assert proc.wait(timeout=30) == 0
        logs = (
            [json.loads(line) for line in proc.stderr.read().decode().splitlines() if line.startswith("{")]
            if proc.stderr
            else []
        )
        admission = [entry for entry in logs if entry["msg"] == "admission"]
        assert admission and admission[0]["uid"] == "uid-1" and admission[0]["outcome"] == "patched"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_webhook_needs_tls_files(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "kratos_admit", "webhook", "--profiles", str(EXAMPLES / "profiles")],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "kratos-admit: --tls-cert and --tls-key are required (HTTPS only); kratos-admit certs generate makes them"
    )


@pytest.mark.parametrize("count", [20])
async def test_concurrent_requests_all_succeed(certs: Path, count: int):
    async with serving(certs) as hook:
        results = await asyncio.gather(
            *(hook.post("/mutate", review_of(make_job().obj(), uid=f"u{i}")) for i in range(count))
        )
    assert [r[1]["response"]["uid"] for r in results] == [f"u{i}" for i in range(count)]


async def test_requests_read_no_files_after_start_up(tmp_path: Path, certs: Path):
    """The stores answer from memory: with their files gone, requests still get the same hints."""
    import shutil

    from kratos_admit.admission.engine import AdmissionEngine
    from kratos_admit.edge.files import FileNodeStore, FileProfileStore

    shutil.copytree(EXAMPLES / "profiles", tmp_path / "profiles")
    shutil.copy(EXAMPLES / "nodes.yaml", tmp_path / "nodes.yaml")
    eng = AdmissionEngine(
        make_ctx(), FileProfileStore(tmp_path / "profiles"), FileNodeStore(tmp_path / "nodes.yaml")
    )
    shutil.rmtree(tmp_path / "profiles")
    (tmp_path / "nodes.yaml").unlink()
    app = create_app(eng, metrics=AdmissionMetrics(), max_body_bytes=1 << 20)
    port = free_port()
    certificate = ServingCertificate(certs / "tls.crt", certs / "tls.key")
    async with (
        running_site(app, "127.0.0.1", port, certificate=certificate),
        aiohttp.ClientSession() as session,
        session.post(
            f"https://127.0.0.1:{port}/mutate",
            json=review_of(make_job().obj()),
            ssl=client_context(certs),
            server_hostname=HOSTNAME,
        ) as response,
    ):
        answer = (await response.json())["response"]
    patch = json.loads(base64.b64decode(answer["patch"]))
    assert any(op["path"] == "/spec/template/spec/affinity" for op in patch)


class ExplodingProfiles(StaticProfileStore):
    """A store with a bug in it, to see what a KRATOS-side failure looks like from outside."""

    def get(self, namespace: str, workload: str):
        raise RuntimeError("bug")


async def test_an_internal_error_is_a_json_500_logged_with_the_uid(
    certs: Path, caplog: pytest.LogCaptureFixture
):
    from aiohttp.test_utils import TestClient, TestServer

    from kratos_admit.admission.engine import AdmissionEngine
    from kratos_admit.decisions.stores import StaticNodeStore

    app = create_app(
        AdmissionEngine(make_ctx(), ExplodingProfiles(), StaticNodeStore()),
        metrics=AdmissionMetrics(),
        max_body_bytes=1 << 20,
    )
    async with TestClient(TestServer(app)) as http:
        response = await http.post("/mutate", json=review_of(make_job().obj(), uid="uid-boom"))
        assert response.status == 500
        assert await response.json() == {"error": "internal error in the KRATOS webhook; see its log"}
        assert (await http.get("/healthz")).status == 200
    record = next(
        r for r in caplog.records if r.getMessage() == "internal error answering an admission request"
    )
    assert record.__dict__["uid"] == "uid-boom" and record.exc_info is not None


def test_metrics_on_a_plain_port_next_to_the_webhook(certs: Path):
    import urllib.request

    port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kratos_admit", "webhook", "--listen", f"127.0.0.1:{port}",
         "--metrics-listen", f"127.0.0.1:{metrics_port}", "--tls-cert", str(certs / "tls.crt"),
         "--tls-key", str(certs / "tls.key"), "--signing-key", str(certs / "signing.key"),
         "--profiles", str(EXAMPLES / "profiles")],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "KRATOS_SHUTDOWN_GRACE_SECONDS": "0"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{metrics_port}/metrics", timeout=1
                ) as response:
                    text = response.read().decode()
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("metrics port never answered")
                time.sleep(0.1)
        assert (  # the three profiles of examples/profiles
            "kratos_tls_certificate_expiry_timestamp_seconds" in text
            and "kratos_profile_cache_objects 3.0" in text
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=1) as response:
            assert response.status == 200
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
