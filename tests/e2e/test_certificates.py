"""The certificates tier (issue 38): the serving certificate renews itself on the real node.

Runs where the real-node tier runs (``KRATOS_E2E_KUBECONFIG``, ``KRATOS_E2E_REAL_NODE``, podman and
``CONTAINERD_ADDRESS``). Twice, once installed by the Helm chart (Helm v4's engine) and once by the
README's kustomize steps (``certs generate --in-cluster``): a serving certificate from the install's
own CA that ends a few minutes from now is written into ``kratos-webhook-tls`` (as a renewal a year
on would find it), and a steady stream of opted-in creates runs across its end. Then: no create
failed; every webhook Pod serves the renewed certificate, read from a new TLS handshake with each Pod
verified against the CA for the Service's name as the API server verifies it, made after the old
certificate's end; ``caBundle`` unchanged; the Event and the metric present. For the chart, a ``helm
upgrade`` afterwards keeps the renewed certificate. Each part uninstalls what it installed.
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

from kratos_admit.edge.pki import alt_names, authority_from_pem, issue_serving, load_cert
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
ENDS_IN = dt.timedelta(minutes=6)  # the written certificate's end, from when it is written
RELEASE = "kratos"
# the controller looks at the certificate each resync (and when a renewal is due): a year-long
# certificate never notices 5 minutes, but one written to end in 6 does
RESYNC = 20


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


def short_lived() -> x509.Certificate:
    """A serving certificate from the install's own CA (Secret kratos-webhook-ca) ending ENDS_IN from
    now, written into kratos-webhook-tls as a renewal a year on finds it; returned as written."""
    ca = secret("kratos-webhook-ca")
    authority = authority_from_pem(
        data(ca, "ca.crt"), data(ca, "ca.key"), cert_where="ca.crt", key_where="ca.key"
    )
    now = dt.datetime.now(dt.UTC)
    cert, key = issue_serving(
        authority,
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVICE_NAME)]),
        names=alt_names(service_dns_names("kratos-webhook", NAMESPACE)),
        not_after=now + ENDS_IN,
        now=now,
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
    for pod in pods(NAMESPACE, "app.kubernetes.io/name=kratos-webhook"):
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
    total = 0.0
    script = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9090/metrics').read().decode())"
    for pod in pods(NAMESPACE, "app.kubernetes.io/name=kratos-controller"):
        text = kubectl("-n", NAMESPACE, "exec", pod["metadata"]["name"], "--", "python3", "-c", script)
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))
    return total


def renews_across_the_end(state: CertTier, install: str) -> None:
    """The shared body: write a short-lived certificate, keep creating across its end, check."""
    bundle = ca_bundle()
    until(
        lambda: len(pods(NAMESPACE, "app.kubernetes.io/name=kratos-webhook")) == 2,
        timeout=120,
        what="two webhook Pods",
    )
    written = short_lived()
    threshold = written.not_valid_after_utc - (written.not_valid_after_utc - written.not_valid_before_utc) / 3
    until(lambda: all(c.serial_number == written.serial_number for c in served(bundle).values()),
          timeout=180, what="both webhook Pods serving the short-lived certificate", every=2)  # fmt: skip
    renewed_at: float | None = None
    with SteadyCreates(f"kratos-{install}-renew") as load:
        while dt.datetime.now(dt.UTC) < written.not_valid_after_utc + dt.timedelta(seconds=30):
            now_served = served(bundle)
            if (
                renewed_at is None
                and now_served
                and all(c.serial_number != written.serial_number for c in now_served.values())
            ):
                renewed_at = time.time()
            time.sleep(2)
    after_end = served(bundle)  # new connections after the old certificate's end: verified, and the new one
    assert after_end and all(c.serial_number != written.serial_number for c in after_end.values()), after_end
    assert all(c.not_valid_after_utc > written.not_valid_after_utc for c in after_end.values())
    assert load.failures == [], load.failures[:3]
    assert ca_bundle() == bundle, "caBundle unchanged"
    current = load_cert(data(secret("kratos-webhook-tls"), "tls.crt"), where="tls.crt")
    assert {c.serial_number for c in after_end.values()} == {current.serial_number}
    assert (
        current.subject == written.subject
        and current.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        == written.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    )
    assert abs(
        (current.not_valid_after_utc - current.not_valid_before_utc)
        - (written.not_valid_after_utc - written.not_valid_before_utc)
    ) < dt.timedelta(seconds=2)
    events = json.loads(
        kubectl(
            "-n", NAMESPACE, "get", "events", "--field-selector", "reason=CertificateRenewed", "-o", "json"
        )
    )["items"]
    assert events, "the renewal Event"
    assert controller_metric('kratos_certificate_renewals_total{outcome="renewed"}') >= 1
    assert renewed_at is not None
    state.figures[install] = {
        "creates": load.answered, "failed": len(load.failures),
        "threshold to the new certificate served by both Pods s": round(renewed_at - threshold.timestamp(), 1),
        "new certificate ends": current.not_valid_after_utc.isoformat(),
    }  # fmt: skip
    print(f"{install}: {load.answered} creates across the old certificate's end, 0 failed; both Pods served the "
          f"renewed one {renewed_at - threshold.timestamp():.1f} s after the renewal threshold; caBundle unchanged")  # fmt: skip


def test_1_installed_by_the_chart_the_certificate_renews_itself_and_an_upgrade_keeps_it(certs: CertTier):
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=180s", check=False)
    namespace_gone(NAMESPACE)
    chart = str(REPO / "webhook-config" / "chart")
    values = chart_values("0.1.0", config={"resyncSeconds": RESYNC})
    helm_config().install(chart, RELEASE, values, namespace=NAMESPACE, create_namespace=True,
                          wait="watcher", timeout=300)  # fmt: skip
    try:
        renews_across_the_end(certs, "chart")
        renewed = secret("kratos-webhook-tls")["data"]
        values["config"]["maxGpusPerPod"] = 4
        helm_config().upgrade(chart, RELEASE, values, namespace=NAMESPACE, wait="watcher", timeout=300)
        assert secret("kratos-webhook-tls")["data"] == renewed, "the upgrade kept the renewed certificate"
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
        sh(f"kubectl -n {NAMESPACE} set env deploy/kratos-controller KRATOS_RESYNC_SECONDS={RESYNC} && "
           f"kubectl -n {NAMESPACE} rollout status deploy/kratos-controller --timeout=180s", certs.tier, timeout=240)  # fmt: skip
        renews_across_the_end(certs, "kustomize")
    finally:
        documented_uninstall(certs.tier)
        namespace_gone(NAMESPACE)
