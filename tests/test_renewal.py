"""Issues 38 and 45, without a cluster: the controller's leader renews the webhook's serving certificate.

The PKI (kratos_admit/edge/pki.py) first: a renewal keeps the names, subject, key type and lifetime,
is valid from a few minutes back and lasts the old lifetime from now, whatever it is (2 minutes to a
year), renewal after renewal without the lifetime growing or shrinking, never outlives the CA, and
is checked before it is used. Then the controller against the API double, under the install's RBAC
(get and watch on the two Secrets by name, update on the serving one): it renews when due and only
then, judges a certificate replaced in a Secret at once through its watch (with the resync at its
default, 300 s), keeps renewing through the resync when the watch fails, says once why it will not
where it must not, and a write that fails leaves the old pair whole (certificate and key are
written in one update) and is retried.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import io
import json
import logging
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from kratos_admit.cli.main import main
from kratos_admit.domain.config import Config
from kratos_admit.edge.pki import (
    BACKDATE,
    Authority,
    PkiError,
    alt_names,
    authority_from_pem,
    cert_pem,
    check_pair,
    issue_serving,
    lifetime,
    load_cert,
    load_key,
    new_authority,
    renew,
    renew_ahead,
    renewal_due_at,
    signed_by,
    subject_alt_names,
)
from kratos_admit.webhook.certs import service_dns_names
from kratos_controller.manager import Manager
from kratos_controller.renewal import LIFETIME_ANNOTATION, lifetime_record, recorded_lifetime
from tests.harness import (
    SECRETS,
    api_server,
    controller_running,
    double_in_thread,
    eventually,
    install_rbac,
    kubeconfig_for,
    rendered_rbac,
    token_of,
    webhook_secrets,
)
from tests.kube_double import CONTROLLER, KubeDouble

SECOND, MINUTE, HOUR = dt.timedelta(seconds=1), dt.timedelta(minutes=1), dt.timedelta(hours=1)
YEAR = dt.timedelta(days=365)


def pem(secret: dict[str, Any], key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def authority_of(ca_secret: dict[str, Any]) -> Any:
    return authority_from_pem(
        pem(ca_secret, "ca.crt"), pem(ca_secret, "ca.key"), cert_where="ca.crt", key_where="ca.key"
    )


# --- the PKI ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("rsa_key", [False, True], ids=["ecdsa-p256", "rsa-2048"])
def test_a_renewal_keeps_names_subject_key_type_and_lifetime(rsa_key: bool):
    ca_secret, tls_secret = webhook_secrets(lifetime=365 * 24 * HOUR, remaining=HOUR, rsa_key=rsa_key)
    authority, current = authority_of(ca_secret), load_cert(pem(tls_secret, "tls.crt"), where="tls.crt")
    now = dt.datetime.now(dt.UTC)
    cert, key = renew(authority, current, now=now)
    renewed, renewed_key = load_cert(cert, where="new"), load_key(key, where="new")
    assert signed_by(renewed, authority) and renewed.subject == current.subject
    assert subject_alt_names(renewed, where="new") == subject_alt_names(current, where="old")
    assert renewed.not_valid_after_utc - renewed.not_valid_before_utc == lifetime(current) + BACKDATE
    kind = rsa.RSAPrivateKey if rsa_key else ec.EllipticCurvePrivateKey
    assert isinstance(renewed_key, kind) and renewed_key.public_key() == renewed.public_key()
    if not rsa_key:
        assert isinstance(renewed_key, ec.EllipticCurvePrivateKey) and renewed_key.curve.name == "secp256r1"
    assert renewed.serial_number != current.serial_number


def test_a_renewal_never_outlives_its_ca():
    ca_secret, tls_secret = webhook_secrets(lifetime=24 * HOUR, remaining=HOUR)
    authority, current = authority_of(ca_secret), load_cert(pem(tls_secret, "tls.crt"), where="tls.crt")
    near_the_end = authority.cert.not_valid_after_utc - 2 * HOUR
    cert, _ = renew(authority, current, now=near_the_end)
    assert load_cert(cert, where="new").not_valid_after_utc == authority.cert.not_valid_after_utc


def test_a_renewal_names_its_ca_by_the_cas_own_key_identifier():
    """Helm's genCA gives its CA a subjectKeyIdentifier that is not the SHA-1 of its key (seen on the real
    node: OpenSSL then could not find the issuer of a certificate whose authorityKeyIdentifier was
    computed from the key). A real TLS handshake verifies the renewed certificate against such a CA."""

    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kratos-webhook-ca")])
    ca = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(7).not_valid_before(now - HOUR).not_valid_after(now + 24 * HOUR)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier(b"\x36" * 20), critical=False)  # not derived from the key
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    authority = Authority(ca, key)
    _, tls_secret = webhook_secrets(lifetime=3 * HOUR, remaining=HOUR)
    cert, _ = renew(authority, load_cert(pem(tls_secret, "tls.crt"), where="tls"), now=now)
    assert (
        load_cert(cert, where="new")
        .extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
        .value.key_identifier
        == b"\x36" * 20
    )
    verify_with_openssl(cert, cert_pem(ca))


def verify_with_openssl(cert: bytes, ca: bytes) -> None:
    """``openssl verify`` of ``cert`` against ``ca`` alone, as a TLS client builds the chain."""

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "ca.pem").write_bytes(ca)
        (Path(d) / "cert.pem").write_bytes(cert)
        done = subprocess.run(["openssl", "verify", "-CAfile", f"{d}/ca.pem", f"{d}/cert.pem"],
                              capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_bad_pair_is_refused_before_it_is_used():
    ca_secret, tls_secret = webhook_secrets(lifetime=24 * HOUR, remaining=HOUR)
    other_ca, other_tls = webhook_secrets(lifetime=24 * HOUR, remaining=HOUR)
    authority, current = authority_of(ca_secret), load_cert(pem(tls_secret, "tls.crt"), where="tls.crt")
    now = dt.datetime.now(dt.UTC)
    cert, key = renew(authority, current, now=now)
    with pytest.raises(PkiError, match="its key is not the certificate's"):
        check_pair(cert, pem(tls_secret, "tls.key"), authority=authority, like=current, now=now)
    with pytest.raises(PkiError, match="the CA did not sign it"):
        check_pair(
            pem(other_tls, "tls.crt"), pem(other_tls, "tls.key"), authority=authority, like=current, now=now
        )
    check_pair(cert, key, authority=authority, like=current, now=now)
    assert not signed_by(current, authority_of(other_ca))


def test_renewal_is_due_once_a_third_of_the_lifetime_remains():
    _, tls_secret = webhook_secrets(lifetime=3 * HOUR, remaining=2 * HOUR)
    current = load_cert(pem(tls_secret, "tls.crt"), where="tls.crt")
    assert renewal_due_at(current, 1 / 3) == current.not_valid_after_utc - lifetime(current) / 3


@pytest.mark.parametrize(
    ("span", "ahead"),
    [
        pytest.param(2 * MINUTE, MINUTE, id="2-minutes-half-of-it"),  # a third (40 s) is less than 2 min
        pytest.param(5 * MINUTE, 2 * MINUTE, id="5-minutes-2-minutes"),  # a third (100 s) is less than 2 min
        pytest.param(HOUR, 20 * MINUTE, id="1-hour-a-third"),
        pytest.param(YEAR, YEAR / 3, id="1-year-a-third"),
    ],
)
def test_a_renewal_is_due_a_third_of_the_lifetime_ahead_at_least_2_minutes_at_most_half(span, ahead):
    """The kubelet takes up to about a minute to bring a renewed Secret into the webhook Pods (68 s
    measured on the real node): a short certificate is renewed 2 minutes ahead, never more than half
    its lifetime ahead."""
    assert renew_ahead(span, 1 / 3) == ahead
    with pytest.raises(PkiError, match="a certificate lifetime must be more than 0"):
        renew_ahead(dt.timedelta(0), 1 / 3)


def from_ca(
    authority: Authority, *, span: dt.timedelta, remaining: dt.timedelta, now: dt.datetime
) -> tuple[bytes, bytes]:
    """A serving certificate of ``authority`` for the webhook Service's names, not backdated: valid
    from ``now - (span - remaining)`` to ``now + remaining`` (a validity span of exactly ``span``)."""
    return issue_serving(
        authority,
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kratos-webhook.kratos-system.svc")]),
        names=alt_names(service_dns_names("kratos-webhook", "kratos-system")),
        not_after=now + remaining,
        now=now - (span - remaining) + BACKDATE,
    )


@pytest.mark.parametrize(
    ("span", "due_again_in"),
    [
        pytest.param(2 * MINUTE, MINUTE, id="2-minutes"),
        pytest.param(5 * MINUTE, 3 * MINUTE, id="5-minutes"),
        pytest.param(HOUR, 40 * MINUTE, id="1-hour"),
        pytest.param(YEAR, YEAR * 2 / 3, id="1-year"),
    ],
)
def test_a_renewed_certificate_is_valid_now_and_lasts_the_old_lifetime_from_now(span, due_again_in):
    """Issue 45: a 5-minute certificate renewed with the lifetime counted from 5 minutes back ended
    now and was refused; a 10-minute one was due again within 2 minutes. Each renewal here is at its
    due time, 5 in a row, the lifetime carried by the record the controller keeps with the Secret."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    authority = new_authority("kratos-system", now - HOUR)
    cert, _ = from_ca(authority, span=span, remaining=renew_ahead(span, 1 / 3) / 2, now=now)
    current = load_cert(cert, where="first")
    assert lifetime(current) == span and renewal_due_at(current, 1 / 3) < now, "due"
    secret: dict[str, Any] = {"metadata": {"annotations": {}}}
    for _ in range(5):
        carried = recorded_lifetime(secret, current) or lifetime(current)
        assert carried == span, "neither grown by the backdate nor shrunk"
        renewed = load_cert(renew(authority, current, now=now, span=carried)[0], where="renewed")
        assert renewed.not_valid_before_utc == now - BACKDATE, "valid from a few minutes back"
        assert renewed.not_valid_after_utc == now + span, "the old lifetime, from now"
        assert renewed.not_valid_before_utc <= now < renewed.not_valid_after_utc
        assert renewal_due_at(renewed, 1 / 3, span=span) == now + due_again_in, "not due again soon"
        assert recorded_lifetime(secret, renewed) is None, "a record of another certificate says nothing"
        secret["metadata"]["annotations"][LIFETIME_ANNOTATION] = lifetime_record(renewed, span)
        current, now = renewed, now + due_again_in


@pytest.mark.parametrize(
    "record",
    ["not json", '{"serial": "0", "seconds": 300}', '{"seconds": 300}', "[]", None],
    ids=["not-json", "another-serial", "no-serial", "not-an-object", "none"],
)
def test_a_lifetime_record_counts_only_for_the_certificate_it_names(record):
    _, tls_secret = webhook_secrets(lifetime=3 * HOUR, remaining=HOUR)
    current = load_cert(pem(tls_secret, "tls.crt"), where="tls.crt")
    tls_secret["metadata"]["annotations"] = {LIFETIME_ANNOTATION: record} if record else {}
    assert recorded_lifetime(tls_secret, current) is None
    tls_secret["metadata"]["annotations"] = {LIFETIME_ANNOTATION: lifetime_record(current, 2 * HOUR)}
    assert recorded_lifetime(tls_secret, current) == 2 * HOUR
    for seconds in (0, -5, "300", True):
        tls_secret["metadata"]["annotations"] = {
            LIFETIME_ANNOTATION: json.dumps({"serial": f"{current.serial_number:x}", "seconds": seconds})
        }
        assert recorded_lifetime(tls_secret, current) is None, seconds


# --- the controller, against the API double ---------------------------------------------------------


@contextlib.asynccontextmanager
async def controller_with(kube: KubeDouble, resync: float = 300.0, **config: Any) -> AsyncIterator[Manager]:
    async with (
        api_server(kube) as server,
        controller_running(server, config=Config(**config), resync=resync) as running,
    ):
        running.renewal.backoff.base = 0.2  # retried within the test, not in 10 s
        yield running


def seeded(
    kube: KubeDouble, *, remaining: dt.timedelta, lifetime: dt.timedelta = 3 * HOUR
) -> tuple[dict[str, Any], dict[str, Any]]:
    ca_secret, tls_secret = webhook_secrets(lifetime=lifetime, remaining=remaining)
    return kube.put(*SECRETS, ca_secret), kube.put(*SECRETS, tls_secret)


def tls_now(kube: KubeDouble) -> dict[str, Any]:
    found = kube.get(*SECRETS, "kratos-system", "kratos-webhook-tls")
    assert found is not None
    return found


def refusals(kube: KubeDouble) -> list[Any]:
    return [d.attributes for d in kube.decisions if not d.allowed and d.attributes.user == CONTROLLER.user]


async def test_the_leader_renews_a_certificate_that_is_due_in_one_update_under_its_rbac():
    kube = KubeDouble()
    ca_secret, before = seeded(kube, remaining=30 * dt.timedelta(minutes=1))  # less than a third of 3 h
    async with controller_with(kube) as controller:
        after = await eventually(
            lambda: (s := tls_now(kube)) and s["data"]["tls.crt"] != before["data"]["tls.crt"] and s
        )
        await eventually(lambda: controller.metrics.certificate_renewals.labels("renewed")._value.get() == 1)
        await eventually(lambda: kube.items("apis/events.k8s.io/v1", "events"))  # told after the count
    authority = authority_of(ca_secret)
    old, new = load_cert(pem(before, "tls.crt"), where="old"), load_cert(pem(after, "tls.crt"), where="new")
    check_pair(
        pem(after, "tls.crt"),
        pem(after, "tls.key"),
        authority=authority,
        like=old,
        now=dt.datetime.now(dt.UTC),
    )
    assert new.not_valid_after_utc - old.not_valid_after_utc > 2 * HOUR, "a whole lifetime from now"
    assert after["metadata"]["annotations"][LIFETIME_ANNOTATION] == lifetime_record(new, 3 * HOUR)
    assert after["data"]["ca.crt"] == before["data"]["ca.crt"], "the CA, and so caBundle, unchanged"
    assert kube.get(*SECRETS, "kratos-system", "kratos-webhook-ca") == ca_secret
    [put] = kube.calls("PUT", r"/secrets/kratos-webhook-tls$")
    assert put.query.get("fieldManager") == "kratos-controller"
    events = [e for e in kube.items("apis/events.k8s.io/v1", "events") if e["reason"] == "CertificateRenewed"]
    assert (
        len(events) == 1
        and events[0]["regarding"]["kind"] == "Secret"
        and "renewed from the CA" in events[0]["note"]
    )
    assert refusals(kube) == [], "get and watch on the two Secrets, update on the serving one: enough"
    secret_calls = {
        (d.attributes.verb, d.attributes.name) for d in kube.decisions if d.attributes.resource == "secrets"
    }
    assert secret_calls <= {
        ("get", "kratos-webhook-ca"),
        ("get", "kratos-webhook-tls"),
        ("watch", "kratos-webhook-ca"),
        ("watch", "kratos-webhook-tls"),
        ("update", "kratos-webhook-tls"),
    }


async def test_a_renewal_carries_the_lifetime_recorded_on_the_secret_not_the_backdated_span():
    """A certificate KRATOS renewed spans its lifetime plus the 5 minutes it is backdated: the next
    renewal takes the lifetime recorded for it, so the lifetime stays what it was."""
    kube = KubeDouble()
    ca_secret, tls_secret = webhook_secrets(lifetime=HOUR + BACKDATE, remaining=10 * MINUTE)
    current = load_cert(pem(tls_secret, "tls.crt"), where="tls.crt")
    tls_secret["metadata"]["annotations"] = {LIFETIME_ANNOTATION: lifetime_record(current, HOUR)}
    kube.put(*SECRETS, ca_secret)
    before = kube.put(*SECRETS, tls_secret)
    async with controller_with(kube):
        after = await eventually(
            lambda: (s := tls_now(kube)) and s["data"]["tls.crt"] != before["data"]["tls.crt"] and s
        )
    new = load_cert(pem(after, "tls.crt"), where="new")
    issued_at = new.not_valid_before_utc + BACKDATE
    assert new.not_valid_after_utc - issued_at == HOUR
    assert abs(issued_at - dt.datetime.now(dt.UTC)) < MINUTE
    assert after["metadata"]["annotations"][LIFETIME_ANNOTATION] == lifetime_record(new, HOUR)


def replaced(
    kube: KubeDouble, ca_secret: dict[str, Any], *, span: dt.timedelta, remaining: dt.timedelta
) -> x509.Certificate:
    """Put into kratos-webhook-tls a certificate of the CA in ``ca_secret`` (as ``certs rotate`` and
    ``kubectl apply`` would); the certificate put there."""
    cert, key = from_ca(authority_of(ca_secret), span=span, remaining=remaining, now=dt.datetime.now(dt.UTC))
    secret = tls_now(kube)
    secret["data"].update(
        {"tls.crt": base64.b64encode(cert).decode(), "tls.key": base64.b64encode(key).decode()}
    )
    kube.put(*SECRETS, secret)
    return load_cert(cert, where="replaced")


def ca_secret_of(kube: KubeDouble) -> dict[str, Any]:
    found = kube.get(*SECRETS, "kratos-system", "kratos-webhook-ca")
    assert found is not None
    return found


def watching(kube: KubeDouble, *names: str) -> bool:
    """A watch of each named Secret has been asked for, by its name."""
    asked = {c.query.get("fieldSelector") for c in kube.calls("GET", r"/namespaces/kratos-system/secrets$")
             if c.query.get("watch", "").lower() == "true"}  # fmt: skip
    return all(f"metadata.name={name}" in asked for name in names)


async def test_a_certificate_replaced_in_the_secret_is_judged_at_once_with_the_resync_at_its_default():
    """Issue 45: after its first look the leader slept until the resync (300 s by default); a
    certificate replaced in the Secret meanwhile with one due for renewal expired unseen. Its watch
    of the two Secrets by name sees the change: renewed within seconds."""
    kube = KubeDouble()
    ca_secret, _ = seeded(kube, remaining=2 * HOUR + 30 * MINUTE)  # not due for an hour and a half
    async with controller_with(kube) as controller:
        assert controller.renewal.resync_seconds == 300
        await eventually(lambda: controller.metrics.certificate_expiry.labels("serving")._value.get() > 0)
        await eventually(lambda: watching(kube, "kratos-webhook-ca", "kratos-webhook-tls"))
        await asyncio.sleep(0.5)  # the first look is done and the loop sleeps on
        assert kube.calls("PUT", r"/secrets/") == []
        started = time.monotonic()
        written = replaced(kube, ca_secret, span=5 * MINUTE, remaining=90 * SECOND)  # due: < 2 min left
        after = await eventually(
            lambda: (s := tls_now(kube)) and pem(s, "tls.crt") != cert_pem(written) and s, timeout=5
        )
        took = time.monotonic() - started
    new = load_cert(pem(after, "tls.crt"), where="new")
    assert took < 5 and signed_by(new, authority_of(ca_secret))
    assert new.not_valid_after_utc - (new.not_valid_before_utc + BACKDATE) == 5 * MINUTE
    assert new.not_valid_after_utc > written.not_valid_after_utc
    assert len(kube.calls("PUT", r"/secrets/kratos-webhook-tls$")) == 1, "its own write is no news"
    assert refusals(kube) == []


async def test_the_renewals_own_write_seen_by_the_watch_before_it_answers_is_no_news(
    caplog: pytest.LogCaptureFixture,
):
    """Seen on the real node: the watch delivered the renewal's own write before the write's answer,
    so the leader logged "certificate Secret changed" for its own renewal and looked again. The
    write's answer is awaited here until the watch has seen the new version, every time."""
    kube = KubeDouble()
    seeded(kube, remaining=2 * HOUR + 30 * MINUTE)
    with caplog.at_level(logging.INFO, logger="kratos.controller"):
        async with controller_with(kube) as controller:
            renewal = controller.renewal
            await eventually(lambda: renewal.watched.get("kratos-webhook-tls"))
            replace = renewal.core.replace_namespaced_secret

            async def answered_after_the_watch(*args: Any, **kwargs: Any) -> Any:
                before = renewal.watched.get("kratos-webhook-tls")
                written = await replace(*args, **kwargs)
                await eventually(lambda: renewal.watched.get("kratos-webhook-tls") != before)
                return written

            renewal.core.replace_namespaced_secret = answered_after_the_watch  # type: ignore[method-assign]
            reads = len(kube.calls("GET", r"/secrets/kratos-webhook-tls$"))
            replaced(kube, ca_secret_of(kube), span=5 * MINUTE, remaining=90 * SECOND)
            await eventually(
                lambda: controller.metrics.certificate_renewals.labels("renewed")._value.get() == 1
            )
            await asyncio.sleep(0.5)
            looks = len(kube.calls("GET", r"/secrets/kratos-webhook-tls$")) - reads
    changed = [r for r in caplog.records if "certificate Secret changed" in r.getMessage()]
    assert len(changed) == 1, "the replacement is news, the renewal's own write is not"
    assert looks == 1, "one look, at the replaced certificate"


async def test_an_expired_watch_is_opened_anew_and_still_sees_a_replaced_certificate(
    caplog: pytest.LogCaptureFixture,
):
    kube = KubeDouble()
    ca_secret, _ = seeded(kube, remaining=2 * HOUR + 30 * MINUTE)
    with caplog.at_level(logging.INFO, logger="kratos.controller"):
        async with controller_with(kube) as controller:
            await eventually(lambda: watching(kube, "kratos-webhook-ca", "kratos-webhook-tls"))
            await eventually(lambda: controller.renewal.watched.get("kratos-webhook-tls"))
            kube.put(*SECRETS, {"metadata": {"name": "unrelated", "namespace": "kratos-system"}})
            kube.compact()  # the watches end; resumed from their resourceVersion, now compacted: 410 Gone
            await eventually(lambda: any("watch expired" in r.getMessage() for r in caplog.records))
            written = replaced(kube, ca_secret, span=HOUR, remaining=10 * MINUTE)
            await eventually(lambda: pem(tls_now(kube), "tls.crt") != cert_pem(written), timeout=5)
    assert refusals(kube) == []


async def test_a_refused_watch_never_stops_renewal_the_resync_still_looks(caplog: pytest.LogCaptureFixture):
    """An install whose RBAC predates the watch: the watch is refused (said once per Secret, retried
    with backoff), and the resync still finds the replaced certificate and renews it."""
    kube = KubeDouble()
    install = rendered_rbac()
    for obj in install:
        if obj["kind"] == "Role" and obj["metadata"]["name"] == "kratos-controller-certificates":
            for rule in obj["rules"]:
                rule["verbs"] = [verb for verb in rule["verbs"] if verb != "watch"]
    install_rbac(kube, install)
    ca_secret, _ = seeded(kube, remaining=2 * HOUR + 30 * MINUTE)
    with caplog.at_level(logging.INFO, logger="kratos.controller"):
        async with controller_with(kube, resync=1):
            await eventually(lambda: {a.name for a in refusals(kube) if a.verb == "watch"} == {
                "kratos-webhook-ca", "kratos-webhook-tls"})  # fmt: skip
            written = replaced(kube, ca_secret, span=HOUR, remaining=10 * MINUTE)
            await eventually(lambda: pem(tls_now(kube), "tls.crt") != cert_pem(written), timeout=5)
            await eventually(lambda: len([a for a in refusals(kube) if a.verb == "watch"]) >= 4)
    said = [r for r in caplog.records if r.getMessage().startswith("certificate Secret watch failed")]
    assert sorted(getattr(r, "secret", "") for r in said) == [
        "kratos-system/kratos-webhook-ca", "kratos-system/kratos-webhook-tls"], "once per Secret"  # fmt: skip
    assert all("403" in getattr(r, "reason", "") for r in said)
    assert {(a.verb, a.name) for a in refusals(kube)} == {
        ("watch", "kratos-webhook-ca"),
        ("watch", "kratos-webhook-tls"),
    }


@pytest.mark.parametrize(
    ("field_selector", "allowed"),
    [
        pytest.param("metadata.name=kratos-webhook-tls", True, id="named"),
        pytest.param("metadata.name==kratos-webhook-ca", True, id="named-with-double-equals"),
        pytest.param(None, False, id="every-secret"),
        pytest.param("metadata.name=kratos-signing-key", False, id="another-secret"),
        pytest.param("metadata.name!=kratos-webhook-tls", False, id="all-but-one"),
    ],
)
async def test_the_double_allows_the_controllers_secret_watch_only_by_name_as_the_api_server_does(
    field_selector: str | None, allowed: bool
):
    """RBAC resourceNames authorise a list or watch only where its fieldSelector requires
    metadata.name to be one of them (requestinfo.go takes that name as the request's)."""
    kube = KubeDouble()
    seeded(kube, remaining=HOUR)
    query = {
        "watch": "true",
        "timeoutSeconds": "1",
        **({"fieldSelector": field_selector} if field_selector else {}),
    }
    async with (
        api_server(kube) as server,
        aiohttp.ClientSession() as session,
        session.get(
            server.make_url("/api/v1/namespaces/kratos-system/secrets"),
            params=query,
            headers={"Authorization": f"Bearer {token_of(CONTROLLER)}"},
        ) as response,
    ):
        status, first = response.status, json.loads(await response.content.readline())
    if allowed:
        assert status == 200
        assert first["type"] == "ADDED", "the Secret as it is now, first"
        assert field_selector and field_selector.endswith(f"={first['object']['metadata']['name']}")
    else:
        assert status == 403 and first["reason"] == "Forbidden"
        assert 'cannot watch resource "secrets"' in first["message"]


async def test_a_certificate_not_yet_due_is_left_as_it_is():
    kube = KubeDouble()
    _, before = seeded(kube, remaining=2 * HOUR + 30 * dt.timedelta(minutes=1))
    async with controller_with(kube) as controller:
        await eventually(lambda: controller.metrics.certificate_expiry.labels("serving")._value.get() > 0)
    assert tls_now(kube)["data"] == before["data"] and kube.calls("PUT", r"/secrets/") == []


async def test_a_failed_write_leaves_the_old_pair_whole_and_is_retried():
    """A renewal cut off at its write (the controller restarted, the API refusing): the Secret holds
    the old certificate and its key, never one without the other; the next attempt renews."""
    kube = KubeDouble()
    ca_secret, before = seeded(kube, remaining=10 * dt.timedelta(minutes=1))
    kube.fail("PUT", r"/secrets/kratos-webhook-tls$", 500)
    async with controller_with(kube) as controller:
        await eventually(lambda: controller.metrics.certificate_renewals.labels("failed")._value.get() >= 1)
        # the metric counts the failure before the Event is written (an API call of its own, best
        # effort): on a loaded machine the test read the events in between, and found none
        failed = await eventually(
            lambda: [
                e
                for e in kube.items("apis/events.k8s.io/v1", "events")
                if e["reason"] == "CertificateRenewalFailed"
            ]
        )
        assert failed[0]["type"] == "Warning"
        after = await eventually(
            lambda: (s := tls_now(kube)) and s["data"]["tls.crt"] != before["data"]["tls.crt"] and s
        )
    for secret in (before, after):  # every state the Secret was in: a certificate with its own key
        assert (
            load_key(pem(secret, "tls.key"), where="key").public_key()
            == load_cert(pem(secret, "tls.crt"), where="crt").public_key()
        )
    assert len(kube.calls("PUT", r"/secrets/kratos-webhook-tls$")) == 2
    assert signed_by(load_cert(pem(after, "tls.crt"), where="new"), authority_of(ca_secret))


@pytest.mark.parametrize(
    ("case", "words"),
    [
        pytest.param(
            "no-ca", "with the CA's key (ca.key) is not in the cluster", id="no-ca-key-in-the-cluster"
        ),
        pytest.param("cert-manager", "cert-manager renews it", id="cert-manager"),
        pytest.param("other-ca", "was not issued by the CA", id="a-pki-of-your-own"),
    ],
)
async def test_where_it_must_not_renew_it_says_once_why_and_writes_nothing(
    case: str, words: str, caplog: pytest.LogCaptureFixture
):
    kube = KubeDouble()
    ca_secret, tls_secret = webhook_secrets(lifetime=3 * HOUR, remaining=dt.timedelta(minutes=5))
    if case == "cert-manager":
        tls_secret["metadata"]["annotations"] = {"cert-manager.io/certificate-name": "kratos-webhook"}
    if case == "other-ca":
        ca_secret = webhook_secrets(lifetime=3 * HOUR, remaining=HOUR)[0]
    if case != "no-ca":
        kube.put(*SECRETS, ca_secret)
    kube.put(*SECRETS, tls_secret)
    with caplog.at_level(logging.INFO, logger="kratos.controller"):
        async with controller_with(kube, resync=1):
            await eventually(lambda: any(words in str(getattr(r, "reason", "")) for r in caplog.records))
            await eventually(
                lambda: (
                    len([c for c in kube.calls("GET", r"/secrets/") if "tls" in c.path or case == "no-ca"])
                    >= 2
                ),
                timeout=5,
            )
    said = [r for r in caplog.records if words in str(getattr(r, "reason", ""))]
    assert len(said) == 1, "said once, however often it looks"
    assert kube.calls("PUT", r"/secrets/") == []


# --- certs generate --in-cluster: the Secrets the renewal reads ---------------------------------------


def generate_in_cluster(url: str, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(
        ["certs", "generate", "--service", "kratos-webhook", "--namespace", "kratos-system",
         "--out", str(tmp_path / "certs"), "--in-cluster", "--kubeconfig", str(kubeconfig_for(url, tmp_path / "kubeconfig")), *extra],
        stdout=out, stderr=err,
    )  # fmt: skip
    return status, out.getvalue(), err.getvalue()


def test_generate_in_cluster_writes_the_three_secrets_and_a_second_run_renews_only_the_serving_one(
    tmp_path: Path,
):
    kube = KubeDouble()
    with double_in_thread(kube) as url:
        status, out, err = generate_in_cluster(url, tmp_path)
        assert status == 0, err
        for name in ("kratos-webhook-ca", "kratos-webhook-tls", "kratos-signing-key"):
            assert f"secret/{name} in kratos-system: created" in out
        ca_secret = kube.get(*SECRETS, "kratos-system", "kratos-webhook-ca")
        tls_secret = kube.get(*SECRETS, "kratos-system", "kratos-webhook-tls")
        assert ca_secret is not None and tls_secret is not None and tls_secret["type"] == "kubernetes.io/tls"
        assert pem(ca_secret, "ca.key") == (tmp_path / "certs" / "ca.key").read_bytes()
        assert signed_by(load_cert(pem(tls_secret, "tls.crt"), where="tls"), authority_of(ca_secret)), (
            "renewable"
        )
        status, out, err = generate_in_cluster(url, tmp_path)
        assert status == 0, err
        assert "secret/kratos-webhook-ca in kratos-system: unchanged" in out
        assert "secret/kratos-signing-key in kratos-system: unchanged" in out
        assert "secret/kratos-webhook-tls in kratos-system: updated" in out


def test_generate_in_cluster_refuses_to_replace_another_ca_unless_asked(tmp_path: Path):
    kube = KubeDouble()
    kube.put(*SECRETS, webhook_secrets(lifetime=3 * HOUR, remaining=HOUR)[0])  # someone else's CA
    with double_in_thread(kube) as url:
        status, _, err = generate_in_cluster(url, tmp_path)
        assert status == 2 and err.count("\n") == 1
        assert (
            "Secret kratos-system/kratos-webhook-ca holds another ca.crt and ca.key than" in err
            and "--new-ca" in err
        )
        assert kube.get(*SECRETS, "kratos-system", "kratos-webhook-tls") is None, "nothing written"
        status, out, err = generate_in_cluster(url, tmp_path, "--new-ca")
        assert status == 0 and "secret/kratos-webhook-ca in kratos-system: updated" in out, err
