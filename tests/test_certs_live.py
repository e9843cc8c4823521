"""certs inject against the API test double, and certificate rotation under load."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import shutil
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from kratos_admit.cli.main import main
from kratos_admit.domain import vocabulary as v
from kratos_admit.webhook.certs import generate
from kratos_admit.webhook.metrics import AdmissionMetrics
from kratos_admit.webhook.server import create_app, running_site
from kratos_admit.webhook.tls import ServingCertificate
from tests.builders import make_job, make_profile
from tests.harness import (
    HOSTNAME,
    REPO,
    SERVICE,
    double_in_thread,
    engine,
    eventually,
    free_port,
    kubeconfig_for,
    make_ctx,
    opted_in_cluster,
    review_of,
    token_of,
    update_secret_volume,
)
from tests.kube_double import ADMIN, MUTATING, VALIDATING, KubeDouble


def test_inject_writes_the_ca_into_both_configurations(tmp_path: Path):
    kube = KubeDouble()
    for doc in yaml.safe_load_all((REPO / "webhook-config" / "webhooks.yaml").read_text()):
        kube.put(*(MUTATING if doc["kind"].startswith("Mutating") else VALIDATING), doc)
    generate(service="kratos-webhook", namespace="kratos-system", out=tmp_path / "certs")
    ca = (tmp_path / "certs" / "ca.crt").read_bytes()
    with double_in_thread(kube) as url:
        out, err = io.StringIO(), io.StringIO()
        status = main(["certs", "inject", "--ca", str(tmp_path / "certs" / "ca.crt"),
                       "--kubeconfig", str(kubeconfig_for(url, tmp_path / "kubeconfig"))], stdout=out, stderr=err)  # fmt: skip
    assert status == 0, err.getvalue()
    assert "MutatingWebhookConfiguration kratos-admit: caBundle set on 1 webhook(s)" in out.getvalue()
    for resource in (MUTATING, VALIDATING):
        config = kube.get(*resource, "", "kratos-admit")
        assert config is not None
        hook = config["webhooks"][0]
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca
        assert hook["clientConfig"]["service"]["name"] == "kratos-webhook", "nothing else changed"
    assert [r.method for r in kube.requests if "webhookconfigurations" in r.path] == [
        "GET",
        "PATCH",
        "GET",
        "PATCH",
    ]


def _bundle(kube: KubeDouble) -> list[bytes]:
    """The DER certificates in the mutating webhook's caBundle, in order."""
    config = kube.get(*MUTATING, "", "kratos-admit")
    assert config is not None
    pem = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
    return [c.public_bytes(serialization.Encoding.DER) for c in x509.load_pem_x509_certificates(pem)]


def _der(path: Path) -> bytes:
    return x509.load_pem_x509_certificate(path.read_bytes()).public_bytes(serialization.Encoding.DER)


def test_inject_append_keeps_the_cas_already_there_once_each(tmp_path: Path):
    for name in ("old", "new"):
        generate(service="kratos-webhook", namespace="kratos-system", out=tmp_path / name)
    old, new = _der(tmp_path / "old" / "ca.crt"), _der(tmp_path / "new" / "ca.crt")
    kube = KubeDouble()
    opted_in_cluster(kube, (tmp_path / "old" / "ca.crt").read_bytes())
    steps = [  # (CA injected, --append, the bundle after it)
        ("new", True, [old, new]),
        ("new", True, [old, new]),
        ("old", True, [old, new]),
        ("new", False, [new]),
    ]
    with double_in_thread(kube) as url:
        kubeconfig = kubeconfig_for(url, tmp_path / "kubeconfig")
        for ca, append, expected in steps:
            out, err = io.StringIO(), io.StringIO()
            argv = ["certs", "inject", "--ca", str(tmp_path / ca / "ca.crt"), "--kubeconfig", str(kubeconfig)]
            assert main([*argv, "--append"] if append else argv, stdout=out, stderr=err) == 0, err.getvalue()
            assert _bundle(kube) == expected, (ca, append)
            validating = kube.get(*VALIDATING, "", "kratos-admit")
            assert validating is not None
            assert (
                validating["webhooks"][0]["clientConfig"]["caBundle"]
                == base64.b64encode(
                    b"".join(
                        x509.load_der_x509_certificate(d).public_bytes(serialization.Encoding.PEM)
                        for d in expected
                    )
                ).decode()
            ), "both configurations get the same bundle"
    assert "(2 CA certificate(s) in the bundle)" in out.getvalue() or not steps[-1][1]


@dataclasses.dataclass
class Admissions:
    """Jobs created through the API double while the test runs: each create makes the double call
    /mutate and /validate over a new TLS connection trusting the caBundle it holds at that moment,
    as the API server does."""

    created: int = 0
    failed: list[str] = dataclasses.field(default_factory=list)
    stop: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


async def _create_jobs(url: str, admissions: Admissions) -> None:
    headers = {"Authorization": f"Bearer {token_of(ADMIN)}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        while not admissions.stop.is_set():
            name = f"vector-add-{admissions.created + len(admissions.failed)}"
            job = make_job(name, "team-a").label(v.WORKLOAD_LABEL, "vector-add").obj()
            async with session.post(f"{url}/apis/batch/v1/namespaces/team-a/jobs", json=job) as r:
                if r.status == 201:
                    admissions.created += 1
                else:
                    admissions.failed.append(f"{r.status}: {await r.text()}")


async def _served_certificate(port: int) -> bytes:
    """The certificate a new connection is served (DER), whoever signed it."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=HOSTNAME)
    try:
        der: bytes = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return der
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()


def _serve_from(volume: Path, certs: Path) -> None:
    update_secret_volume(volume, {n: (certs / n).read_bytes() for n in ("tls.crt", "tls.key")})


@contextlib.asynccontextmanager
async def _webhook_admitting(tmp_path: Path, certs: Path) -> AsyncIterator[tuple[str, int, Path, Admissions]]:
    """The webhook serving from a Secret volume (``tmp_path``/secret) filled from ``certs``, the API
    double trusting ``certs``'s CA, and Jobs created through the double without pause."""
    volume = tmp_path / "secret"
    _serve_from(volume, certs)
    kube = KubeDouble()
    opted_in_cluster(kube, (certs / "ca.crt").read_bytes())
    certificate = ServingCertificate(volume / "tls.crt", volume / "tls.key")
    app = create_app(engine(make_ctx(), [make_profile()]), metrics=AdmissionMetrics(), max_body_bytes=1 << 20)
    port = free_port()
    admissions = Admissions()
    with double_in_thread(kube) as url:
        async with running_site(app, "127.0.0.1", port, certificate=certificate):
            kube.services[SERVICE] = ("127.0.0.1", port)
            watcher = asyncio.create_task(certificate.watch(interval=0.05))
            load = asyncio.create_task(_create_jobs(url, admissions))
            try:
                await eventually(lambda: admissions.created + len(admissions.failed) >= 5)
                yield url, port, kubeconfig_for(url, tmp_path / "kubeconfig"), admissions
                await asyncio.sleep(0.5)  # and a little more under the final state
            finally:
                admissions.stop.set()
                await load
                watcher.cancel()


async def _cli(*argv: str) -> str:
    """The CLI in a thread of its own (it runs its own event loop, as from a shell)."""
    out, err = io.StringIO(), io.StringIO()
    status = await asyncio.to_thread(main, list(argv), stdout=out, stderr=err)
    assert status == 0, err.getvalue()
    return out.getvalue()


async def _until_served(port: int, cert: Path) -> None:
    expected = _der(cert)
    deadline = time.monotonic() + 10
    while await _served_certificate(port) != expected:
        assert time.monotonic() < deadline, "the webhook did not reload the new certificate"
        await asyncio.sleep(0.05)


async def test_certs_rotate_under_load_fails_no_admission_and_new_connections_get_the_new_certificate(
    tmp_path: Path,
):
    certs = tmp_path / "certs"
    generate(service=SERVICE[1], namespace=SERVICE[0], out=certs)
    ca, signing = (certs / "ca.crt").read_bytes(), (certs / "signing.key").read_bytes()
    old = _der(certs / "tls.crt")
    async with _webhook_admitting(tmp_path, certs) as (_, port, _, admissions):
        await _cli("certs", "rotate", "--dir", str(certs))
        assert _der(certs / "tls.crt") != old
        _serve_from(tmp_path / "secret", certs)  # the Secret updated: kubelet swaps the volume
        await _until_served(port, certs / "tls.crt")
        created_before_the_end = admissions.created
    assert admissions.failed == [], admissions.failed[:3]
    assert admissions.created > created_before_the_end > 5, "admissions went on across the rotation"
    assert (certs / "ca.crt").read_bytes() == ca and (certs / "signing.key").read_bytes() == signing


async def test_a_ca_roll_with_inject_append_fails_no_admission(tmp_path: Path):
    certs, following = tmp_path / "certs", tmp_path / "certs-next"
    generate(service=SERVICE[1], namespace=SERVICE[0], out=certs)
    async with _webhook_admitting(tmp_path, certs) as (_, port, kubeconfig, admissions):
        shutil.copytree(certs, following)
        await _cli(
            "certs", "generate", "--service", SERVICE[1], "--namespace", SERVICE[0], "--out", str(following),
            "--new-ca",
        )  # fmt: skip
        # 1. trust both CAs; 2. serve the new CA's certificate; 3. drop the old CA
        await _cli(
            "certs", "inject", "--ca", str(following / "ca.crt"), "--append", "--kubeconfig", str(kubeconfig)
        )
        counted = admissions.created
        await eventually(lambda: admissions.created > counted + 3)
        _serve_from(tmp_path / "secret", following)
        await _until_served(port, following / "tls.crt")
        counted = admissions.created
        await eventually(lambda: admissions.created > counted + 3)
        await _cli("certs", "inject", "--ca", str(following / "ca.crt"), "--kubeconfig", str(kubeconfig))
        counted = admissions.created
        await eventually(lambda: admissions.created > counted + 3)
    assert admissions.failed == [], admissions.failed[:3]
    assert (following / "signing.key").read_bytes() == (certs / "signing.key").read_bytes()
    assert (following / "ca.crt").read_bytes() != (certs / "ca.crt").read_bytes()


def test_inject_without_the_configurations_says_apply_first(tmp_path: Path):
    generate(service="s", namespace="n", out=tmp_path / "certs")
    with double_in_thread(KubeDouble()) as url:
        err = io.StringIO()
        status = main(["certs", "inject", "--ca", str(tmp_path / "certs" / "ca.crt"),
                       "--kubeconfig", str(kubeconfig_for(url, tmp_path / "kubeconfig"))], stdout=io.StringIO(), stderr=err)  # fmt: skip
    assert status == 2 and "apply webhook-config/ first" in err.getvalue()


@pytest.mark.parametrize(
    ("name", "message"),
    [("tls.crt", "is not a CA certificate"), ("tls.key", "not a PEM certificate"), ("nope", "No such file")],
)
def test_inject_checks_the_ca_file(tmp_path: Path, name: str, message: str):
    generate(service="s", namespace="n", out=tmp_path)
    err = io.StringIO()
    assert main(["certs", "inject", "--ca", str(tmp_path / name)], stdout=io.StringIO(), stderr=err) == 2
    assert message in err.getvalue()


def _rotate(target: Path, source: Path) -> None:
    """Replace tls.crt and tls.key the way kubelet updates a Secret volume: new files, then a rename."""
    for name in ("tls.crt", "tls.key"):
        staged = target / f".{name}.new"
        staged.write_bytes((source / name).read_bytes())
        staged.replace(target / name)


async def test_running_server_picks_up_a_rotated_certificate_with_no_failed_request(tmp_path: Path):
    old, new, serving = tmp_path / "old", tmp_path / "new", tmp_path / "serving"
    for directory in (old, new):
        generate(service="kratos-webhook", namespace="kratos-system", out=directory)
    serving.mkdir()
    _rotate(serving, old)
    metrics = AdmissionMetrics()
    certificate = ServingCertificate(
        serving / "tls.crt", serving / "tls.key", on_load=metrics.certificate_expiry.set
    )
    first_expiry = metrics.certificate_expiry._value.get()
    app = create_app(engine(make_ctx(), [make_profile()]), metrics=metrics, max_body_bytes=1 << 20)
    trust = ssl.create_default_context(cadata=(old / "ca.crt").read_text() + (new / "ca.crt").read_text())
    only_new = ssl.create_default_context(cafile=str(new / "ca.crt"))
    port = free_port()
    body = review_of(make_job().obj())
    failures, answered = 0, 0
    async with running_site(app, "127.0.0.1", port, certificate=certificate):
        watcher = asyncio.create_task(certificate.watch(interval=0.1))
        async with aiohttp.ClientSession() as session:

            async def send(context: ssl.SSLContext) -> bool:
                try:
                    async with session.post(
                        f"https://127.0.0.1:{port}/mutate", json=body, ssl=context, server_hostname=HOSTNAME
                    ) as r:
                        return r.status == 200
                except (aiohttp.ClientError, ssl.SSLError):
                    return False

            deadline = time.monotonic() + 3.0
            rotated_at = time.monotonic() + 0.5
            rotated = False
            while time.monotonic() < deadline:
                if not rotated and time.monotonic() >= rotated_at:
                    _rotate(serving, new)
                    rotated = True
                ok = await send(trust)
                answered += ok
                failures += not ok
            picked_up = None
            for _ in range(50):  # a fresh connection that trusts only the new CA
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                    try:
                        async with fresh.get(
                            f"https://127.0.0.1:{port}/healthz", ssl=only_new, server_hostname=HOSTNAME
                        ) as r:
                            picked_up = r.status
                            break
                    except (aiohttp.ClientError, ssl.SSLError):
                        await asyncio.sleep(0.1)
        watcher.cancel()
    assert failures == 0 and answered > 20
    assert picked_up == 200, "new connections are served with the rotated certificate"
    assert metrics.certificate_expiry._value.get() >= first_expiry


async def test_a_bad_rotated_pair_keeps_the_old_certificate_serving(tmp_path: Path):
    good, other = tmp_path / "good", tmp_path / "other"
    generate(service="kratos-webhook", namespace="kratos-system", out=good)
    generate(service="x", namespace="y", out=other)
    serving = tmp_path / "serving"
    serving.mkdir()
    _rotate(serving, good)
    certificate = ServingCertificate(serving / "tls.crt", serving / "tls.key")
    watcher = asyncio.create_task(certificate.watch(interval=0.05))
    (serving / "tls.key").write_bytes((other / "tls.key").read_bytes())  # mismatched half-rotation
    await asyncio.sleep(0.3)
    watcher.cancel()
    port = free_port()
    app = create_app(engine(make_ctx()), metrics=AdmissionMetrics(), max_body_bytes=1 << 20)
    async with (
        running_site(app, "127.0.0.1", port, certificate=certificate),
        aiohttp.ClientSession() as session,
    ):
        context = ssl.create_default_context(cafile=str(good / "ca.crt"))
        async with session.get(
            f"https://127.0.0.1:{port}/healthz", ssl=context, server_hostname=HOSTNAME
        ) as r:
            assert r.status == 200
