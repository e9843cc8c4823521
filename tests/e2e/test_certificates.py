"""The certificates tier (issues 38 and 45): the serving certificate renews itself on the real node.

Runs where the real-node tier runs (``KRATOS_E2E_KUBECONFIG``, ``KRATOS_E2E_REAL_NODE``, podman and
``CONTAINERD_ADDRESS``). Twice, once installed by the Helm chart (Helm v4's engine) and once by the
README's kustomize steps (``certs generate --in-cluster``), each with its defaults: no test-only
setting (the resync stays at its 300 s, ``certificateRenewBefore`` at a third). As a new user would
try it (issue 45): a serving certificate from the install's own CA with 4 minutes left of a 5-minute
lifetime is written into ``kratos-webhook-tls``, and a steady stream of opted-in creates runs across
its end. Then: the leader renewed it before its end (its watch of the Secret saw the write; the
resync alone would have looked only after the end); both webhook Pods served the renewed
certificate before the old one's end, and again on a new TLS handshake with each Pod after it,
verified against the CA for the Service's name as the API server verifies it; the renewed
certificate lasts the old 5 minutes from its renewal; no create failed; ``caBundle`` unchanged; the
Event and the metric present. For the chart, a ``helm upgrade`` afterwards keeps the renewed
certificate. Each part uninstalls what it installed.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from kratos_admit.edge.pki import (
    BACKDATE,
    alt_names,
    authority_from_pem,
    issue_serving,
    load_cert,
    renewal_due_at,
    signed_by,
)
from kratos_admit.webhook.certs import service_dns_names
from tests.e2e.real_cluster import kubectl, namespace_gone
from tests.e2e.real_node import (
    NAMESPACE,
    Obj,
    SteadyCreates,
    Tier,
    build_images,
    chart_values,
    documented_uninstall,
    helm_config,
    pod_metric,
    pods,
    readme_install,
    sh,
    until,
    why_not,
    working_copy,
)
from tests.harness import REPO

pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))

SERVICE_NAME = f"kratos-webhook.{NAMESPACE}.svc"  # what the API server verifies the webhook's certificate for
LIFETIME = dt.timedelta(minutes=5)  # the written certificate's lifetime (a platform's short-lived policy)
LEFT = dt.timedelta(minutes=4)  # how much of it is left when it is written
RENEW_BEFORE = 1 / 3  # the chart's and the controller's default certificateRenewBefore
RELEASE = "kratos"
WEBHOOK_PODS = "app.kubernetes.io/name=kratos-webhook"


@dataclass
class CertTier:
    tier: Tier
    figures: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CertTier]:
    tier = working_copy(tmp_path_factory)
    build_images(tier)
    state = CertTier(tier)
    try:
        yield state
    finally:
        print("certificates tier figures:", json.dumps(state.figures))


def secret(name: str) -> Obj:
    found: Obj = json.loads(kubectl("-n", NAMESPACE, "get", "secret", name, "-o", "json"))
    return found


def data(obj: Obj, key: str) -> bytes:
    return base64.b64decode(obj["data"][key])


def ca_bundle() -> bytes:
    config = json.loads(kubectl("get", "mutatingwebhookconfiguration", "kratos-admit", "-o", "json"))
    return base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])


def authority() -> Any:
    ca = secret("kratos-webhook-ca")
    return authority_from_pem(data(ca, "ca.crt"), data(ca, "ca.key"), cert_where="ca.crt", key_where="ca.key")


def short_lived() -> x509.Certificate:
    """A serving certificate from the install's own CA (Secret kratos-webhook-ca) of LIFETIME with
    LEFT of it left (valid from LIFETIME - LEFT ago, not backdated beyond that), written into
    kratos-webhook-tls as a person or another tool would; returned as written."""
    now = dt.datetime.now(dt.UTC)
    cert, key = issue_serving(
        authority(),
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVICE_NAME)]),
        names=alt_names(service_dns_names("kratos-webhook", NAMESPACE)),
        not_after=now + LEFT,
        now=now - (LIFETIME - LEFT) + BACKDATE,  # issue_serving backdates notBefore by BACKDATE
    )
    tls = secret("kratos-webhook-tls")
    tls["data"].update(
        {"tls.crt": base64.b64encode(cert).decode(), "tls.key": base64.b64encode(key).decode()}
    )
    for server_set in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
        tls["metadata"].pop(server_set, None)
    kubectl("apply", "-f", "-", stdin=json.dumps(tls))
    return load_cert(cert, where="written")


def served(ca: bytes) -> dict[str, x509.Certificate]:
    """A new TLS connection to each webhook Pod, verified against ``ca`` for the Service's name as
    the API server verifies it: the certificate each one serves (a failed verification raises)."""
    context = ssl.create_default_context(cadata=ca.decode())
    found = {}
    for pod in pods(NAMESPACE, WEBHOOK_PODS):
        if pod["status"].get("phase") != "Running" or not pod["status"].get("podIP"):
            continue
        with (
            socket.create_connection((pod["status"]["podIP"], 8443), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=SERVICE_NAME) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        found[pod["metadata"]["name"]] = x509.load_der_x509_certificate(der)
    return found


def controller_metric(name: str) -> float:
    """The sum of a controller metric over both replicas (only the leader renews)."""
    return pod_metric(NAMESPACE, "app.kubernetes.io/name=kratos-controller", name)


def renews_across_the_end(state: CertTier, install: str) -> x509.Certificate:
    """The shared body: write a short-lived certificate, keep creating across its end, check; the
    renewed certificate both Pods served after the end."""
    bundle = ca_bundle()
    until(lambda: len(pods(NAMESPACE, WEBHOOK_PODS)) == 2, timeout=120, what="two webhook Pods")
    installed = {c.serial_number for c in served(bundle).values()}
    written = short_lived()
    assert written.not_valid_after_utc - written.not_valid_before_utc == LIFETIME
    due = renewal_due_at(written, RENEW_BEFORE)  # 2 minutes before its end (pki.renew_ahead)
    renewed_at: float | None = None  # when both Pods first served a certificate newer than the written one
    seen_written = False
    with SteadyCreates(f"kratos-{install}-renew") as load:
        while dt.datetime.now(dt.UTC) < written.not_valid_after_utc + dt.timedelta(seconds=30):
            now_served = served(bundle)
            seen_written = seen_written or any(
                c.serial_number == written.serial_number for c in now_served.values()
            )
            if (
                renewed_at is None
                and len(now_served) == 2
                and all(
                    c.serial_number not in installed | {written.serial_number} for c in now_served.values()
                )
            ):
                renewed_at = time.time()
            time.sleep(2)
    after_end = served(bundle)  # new connections after the old certificate's end: verified, and the new one
    assert len(after_end) == 2, f"both webhook Pods answer after the end: {sorted(after_end)}"
    assert all(c.serial_number not in installed | {written.serial_number} for c in after_end.values()), (
        after_end
    )
    assert len({c.serial_number for c in after_end.values()}) == 1, (
        "both Pods serve the same renewed certificate"
    )
    assert renewed_at is not None, "both webhook Pods served a renewed certificate"
    assert renewed_at < written.not_valid_after_utc.timestamp(), "renewed and served before the old one's end"
    assert load.failures == [], load.failures[:3]
    assert ca_bundle() == bundle, "caBundle unchanged"
    renewed = next(iter(after_end.values()))
    issued_at = renewed.not_valid_before_utc + BACKDATE  # valid from 5 minutes before its renewal
    assert renewed.not_valid_after_utc - issued_at == LIFETIME, "the old lifetime, from the renewal"
    assert due - dt.timedelta(seconds=5) <= issued_at < written.not_valid_after_utc, (issued_at, due)
    assert renewed.not_valid_after_utc > written.not_valid_after_utc
    assert signed_by(renewed, authority())
    assert (
        renewed.subject == written.subject
        and renewed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        == written.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    )
    events = json.loads(
        kubectl(
            "-n", NAMESPACE, "get", "events", "--field-selector", "reason=CertificateRenewed", "-o", "json"
        )
    )["items"]
    assert events, "the renewal Event"
    assert controller_metric('kratos_certificate_renewals_total{outcome="renewed"}') >= 1
    state.figures[install] = {
        "creates": load.answered, "failed": len(load.failures),
        "both Pods served the written certificate": seen_written,
        "due to renewed s": round(issued_at.timestamp() - due.timestamp(), 1),
        "due to the new certificate served by both Pods s": round(renewed_at - due.timestamp(), 1),
        "served before the old one's end by s": round(written.not_valid_after_utc.timestamp() - renewed_at, 1),
        "new certificate ends": renewed.not_valid_after_utc.isoformat(),
    }  # fmt: skip
    print(f"{install}: {load.answered} creates across the old certificate's end, 0 failed; renewed "
          f"{issued_at.timestamp() - due.timestamp():.1f} s after it was due; both Pods served the renewed one "
          f"{written.not_valid_after_utc.timestamp() - renewed_at:.1f} s before the old one's end; caBundle unchanged")  # fmt: skip
    return renewed


def test_1_installed_by_the_chart_the_certificate_renews_itself_and_an_upgrade_keeps_it(certs: CertTier):
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=180s", check=False)
    namespace_gone(NAMESPACE)
    chart = str(REPO / "webhook-config" / "chart")
    values = chart_values("0.1.0")  # the chart's defaults
    helm_config().install(chart, RELEASE, values, namespace=NAMESPACE, create_namespace=True,
                          wait="watcher", timeout=300)  # fmt: skip
    try:
        renewed = renews_across_the_end(certs, "chart")
        ca_before = secret("kratos-webhook-ca")["data"]
        values["config"] = {"maxGpusPerPod": 4}
        helm_config().upgrade(chart, RELEASE, values, namespace=NAMESPACE, wait="watcher", timeout=300)
        # kept: the renewed certificate, or (its 5 minutes run on) the leader's next renewal of it,
        # never one the chart made anew (a servingDays certificate) nor another CA
        assert secret("kratos-webhook-ca")["data"] == ca_before, "the upgrade kept the CA"
        kept = load_cert(data(secret("kratos-webhook-tls"), "tls.crt"), where="tls.crt")
        assert signed_by(kept, authority()) and kept.not_valid_after_utc >= renewed.not_valid_after_utc
        assert kept.not_valid_after_utc - kept.not_valid_before_utc < dt.timedelta(hours=1), (
            "the upgrade kept the renewed certificate"
        )
    finally:
        helm_config().uninstall(RELEASE, wait="watcher", timeout=300)
        kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        namespace_gone(NAMESPACE)


def test_2_installed_by_the_readme_the_certificate_renews_itself(certs: CertTier):
    readme_install(certs.tier)
    try:
        sh(
            f"kubectl -n {NAMESPACE} get secret kratos-webhook-ca", certs.tier
        )  # step 2's --in-cluster wrote it
        renews_across_the_end(certs, "kustomize")  # the README's install as it is: no test-only setting
    finally:
        documented_uninstall(certs.tier)
        namespace_gone(NAMESPACE)
