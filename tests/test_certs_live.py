"""certs inject against the API test double, and certificate rotation under load."""

from __future__ import annotations

import asyncio
import base64
import io
import ssl
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from kratos_admit.certs import generate
from kratos_admit.cli import main
from kratos_admit.metrics import AdmissionMetrics
from kratos_admit.server import create_app, running_site
from kratos_admit.tls import ServingCertificate
from tests.builders import make_job, make_profile
from tests.harness import (
    HOSTNAME,
    REPO,
    double_in_thread,
    engine,
    free_port,
    kubeconfig_for,
    make_ctx,
    review_of,
)
from tests.kube_double import MUTATING, VALIDATING, KubeDouble


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
