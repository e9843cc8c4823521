"""The leader renews the webhook's serving certificate (DESIGN "Certificates that renew themselves").

Where the CA's key is in the cluster (the Secret ``kratos-webhook-ca``: the chart's, or ``certs
generate --in-cluster``'s) and it signed the certificate in ``kratos-webhook-tls``, the leader issues
a new one from it once less than ``certificateRenewBefore`` of the current one's lifetime remains:
the same names, subject, key type and lifetime, checked before it is used, written into
``kratos-webhook-tls`` in one update (certificate and key together, conditional on the Secret's
resourceVersion), so the webhook Pods reload it and ``caBundle`` never changes. A failed renewal is
retried with backoff and counted (the alert); the certificate in place stays as it is. Without the
CA key, with a certificate of another CA, or with cert-manager managing the Secret, it says once
why it will not renew, and looks again each resync. The CA's own end is only reported (a metric and
its alert): a CA roll is a person's decision.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from cryptography import x509
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.edge.kube import Backoff, list_raw, one_line
from kratos_admit.edge.pki import (
    Authority,
    PkiError,
    authority_from_pem,
    load_cert,
    renew,
    renewal_due_at,
    signed_by,
)

log = logging.getLogger("kratos.controller")
CA_SECRET, TLS_SECRET = "kratos-webhook-ca", "kratos-webhook-tls"
CERT_MANAGER_ANNOTATION = "cert-manager.io/certificate-name"
FIELD_MANAGER = "kratos-controller"
Obj = dict[str, Any]
Outcome = Literal["renewed", "failed"]


@dataclass(frozen=True, slots=True)
class Renewed:
    """A renewal that was written: the certificate it replaced, and the new one."""

    old: x509.Certificate
    new: x509.Certificate


def _data(secret: Obj, key: str) -> bytes | None:
    value = (secret.get("data") or {}).get(key)
    return base64.b64decode(value) if isinstance(value, str) else None


class CertificateRenewal:
    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str,
        renew_before: float,
        resync_seconds: float,
        on_outcome: Callable[[Outcome], None],
        on_expiry: Callable[[str, float], None],
        report: Callable[
            [Obj, Literal["CertificateRenewed", "CertificateRenewalFailed"], str, str], Awaitable[None]
        ],
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.renew_before = renew_before
        self.resync_seconds = resync_seconds
        self.on_outcome, self.on_expiry, self.report = on_outcome, on_expiry, report
        self.clock = clock
        self.said = ""  # why renewal is off, said once until it changes
        self.backoff = Backoff(base=10.0, cap=min(600.0, resync_seconds))

    async def _secret(self, name: str) -> Obj | None:
        try:
            return await list_raw(self.core.read_namespaced_secret, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _off(self, why: str) -> float:
        if why != self.said:
            log.info("serving certificate not renewed by KRATOS", extra={"reason": why})
            self.said = why
        return self.resync_seconds

    async def check(self) -> float:
        """Renew when due; the seconds until it should look again."""
        where = f"{self.namespace}/{CA_SECRET}"
        ca_secret = await self._secret(CA_SECRET)
        if ca_secret is None or _data(ca_secret, "ca.key") is None:
            return self._off(
                f"Secret {where} with the CA's key (ca.key) is not in the cluster: the serving certificate is renewed "
                "by whoever made it (certs rotate; the KratosCertificateExpiringSoon alert warns)"
            )
        tls_secret = await self._secret(TLS_SECRET)
        if tls_secret is None:
            return self._off(f"Secret {self.namespace}/{TLS_SECRET} is not there yet")
        if CERT_MANAGER_ANNOTATION in ((tls_secret.get("metadata") or {}).get("annotations") or {}):
            return self._off(
                f"cert-manager manages Secret {self.namespace}/{TLS_SECRET}: cert-manager renews it"
            )
        authority = authority_from_pem(
            _data(ca_secret, "ca.crt") or b"", _data(ca_secret, "ca.key") or b"",
            cert_where=f"{where} ca.crt", key_where=f"{where} ca.key",
        )  # fmt: skip
        current = load_cert(
            _data(tls_secret, "tls.crt") or b"", where=f"{self.namespace}/{TLS_SECRET} tls.crt"
        )
        self.on_expiry("ca", authority.cert.not_valid_after_utc.timestamp())
        self.on_expiry("serving", current.not_valid_after_utc.timestamp())
        if not signed_by(current, authority):
            return self._off(
                f"the certificate in {self.namespace}/{TLS_SECRET} was not issued by the CA in {where} (a PKI of "
                "your own): renew it as you issued it"
            )
        if self.said:
            log.info("serving certificate renewal on", extra={"secret": f"{self.namespace}/{TLS_SECRET}"})
            self.said = ""
        now = self.clock()
        due = renewal_due_at(current, self.renew_before)
        if now < due:
            return min((due - now).total_seconds(), self.resync_seconds)
        try:
            done = await self._renew(tls_secret, authority, current, now)
        except Exception as exc:
            delay = self.backoff.next_delay()
            reason = one_line(exc) if not isinstance(exc, PkiError) else str(exc)
            self.on_outcome("failed")
            log.warning(
                "serving certificate renewal failed, retrying",
                extra={"reason": reason, "retryIn": round(delay, 1)},
            )
            await self.report(
                tls_secret,
                "CertificateRenewalFailed",
                f"renewal failed, retrying in {delay:.0f} s: {reason}",
                reason[:60],
            )
            return delay
        self.backoff.reset()
        self.on_outcome("renewed")
        self.on_expiry("serving", done.new.not_valid_after_utc.timestamp())
        note = (
            f"serving certificate renewed from the CA in {where}: valid until "
            f"{done.new.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ} (was {done.old.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}), "
            f"serial {done.new.serial_number:x}"
        )
        log.info(
            "serving certificate renewed",
            extra={
                "notAfter": done.new.not_valid_after_utc.isoformat(),
                "serial": f"{done.new.serial_number:x}",
            },
        )
        await self.report(tls_secret, "CertificateRenewed", note, f"{done.new.serial_number:x}")
        next_due = renewal_due_at(done.new, self.renew_before)
        return min(max((next_due - now).total_seconds(), 1.0), self.resync_seconds)

    async def _renew(
        self, secret: Obj, authority: Authority, current: x509.Certificate, now: dt.datetime
    ) -> Renewed:
        """Issue, check, and write certificate and key in one conditional update of the Secret."""
        cert, key = renew(authority, current, now=now)
        metadata = {k: val for k, val in (secret.get("metadata") or {}).items() if k != "managedFields"}
        body: Any = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,  # with its resourceVersion: a concurrent change gives 409, retried
            "type": secret.get("type", "kubernetes.io/tls"),
            "data": {
                **(secret.get("data") or {}),
                "tls.crt": base64.b64encode(cert).decode(),
                "tls.key": base64.b64encode(key).decode(),
            },
        }
        await self.core.replace_namespaced_secret(
            TLS_SECRET, self.namespace, body, field_manager=FIELD_MANAGER
        )
        return Renewed(current, load_cert(cert, where="the renewed certificate"))

    async def run(self) -> None:
        while True:
            try:
                wait = await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API away, a Secret that cannot be read: look again later
                wait = self.backoff.next_delay()
                log.warning(
                    "serving certificate check failed, retrying",
                    extra={
                        "reason": one_line(exc) if not isinstance(exc, PkiError) else str(exc),
                        "retryIn": round(wait, 1),
                    },
                )
            await asyncio.sleep(wait)
