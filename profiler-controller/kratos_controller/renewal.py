"""The leader renews the webhook's serving certificate (DESIGN "Certificates that renew themselves").

Where the CA's key is in the cluster (the Secret ``kratos-webhook-ca``: the chart's, or ``certs
generate --in-cluster``'s) and it signed the certificate in ``kratos-webhook-tls``, the leader issues
a new one from it once less than ``certificateRenewBefore`` of the current one's lifetime remains
(at least 2 minutes, at most half of it: ``pki.renew_ahead``): the same names, subject and key type,
valid from a few minutes back and for the same lifetime from now, checked before it is used, written
into ``kratos-webhook-tls`` in one update (certificate and key together, conditional on the Secret's
resourceVersion), so the webhook Pods reload it and ``caBundle`` never changes. The lifetime it
carried is recorded on the Secret (``LIFETIME_ANNOTATION``, with the new certificate's serial), since
the renewed certificate's own span also holds its backdate: the next renewal reads it there, so
renewal after renewal keeps the lifetime exactly. A failed renewal is retried with backoff and
counted (the alert); the certificate in place stays as it is. Without the CA key, with a certificate
of another CA, or with cert-manager managing the Secret, it says once why it will not renew, and
looks again each resync and whenever either Secret changes. The CA's own end is only reported (a
metric and its alert): a CA roll is a person's decision.

It watches the two Secrets by name (``fieldSelector=metadata.name=<name>``, which is what lets RBAC's
``resourceNames`` authorise a watch), so a certificate replaced in them (``certs rotate``, a restore,
another tool) is judged at once rather than at the next resync. A watch that fails (refused, expired,
the API away) is reopened with backoff and never stops renewal: the resync still looks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from cryptography import x509
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.edge.kube import Backoff, is_status, list_raw, one_line
from kratos_admit.edge.pki import (
    Authority,
    PkiError,
    authority_from_pem,
    lifetime,
    load_cert,
    renew,
    renewal_due_at,
    signed_by,
)

log = logging.getLogger("kratos.controller")
CA_SECRET, TLS_SECRET = "kratos-webhook-ca", "kratos-webhook-tls"
CERT_MANAGER_ANNOTATION = "cert-manager.io/certificate-name"
# on kratos-webhook-tls, written with each renewal: {"serial": <the certificate's serial, hex>,
# "seconds": <its lifetime>}; read back only while that certificate is the one in the Secret
LIFETIME_ANNOTATION = "gpu.scheduler.io/certificate-lifetime"
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


def recorded_lifetime(secret: Obj, cert: x509.Certificate) -> dt.timedelta | None:
    """The lifetime the last renewal gave ``cert``, where the Secret records it for this very
    certificate (a certificate put there since, by a person or a restore, has a serial of its own)."""
    raw = ((secret.get("metadata") or {}).get("annotations") or {}).get(LIFETIME_ANNOTATION)
    try:
        record = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("serial") != f"{cert.serial_number:x}":
        return None
    seconds = record.get("seconds")
    if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds > 0:
        return dt.timedelta(seconds=seconds)
    return None


def lifetime_record(cert: x509.Certificate, span: dt.timedelta) -> str:
    """The ``LIFETIME_ANNOTATION`` value saying that ``cert`` was given the lifetime ``span``."""
    return json.dumps(
        {"serial": f"{cert.serial_number:x}", "seconds": round(span.total_seconds())}, separators=(",", ":")
    )


def _version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


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
        watch_timeout: int = 300,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.renew_before = renew_before
        self.resync_seconds = resync_seconds
        self.on_outcome, self.on_expiry, self.report = on_outcome, on_expiry, report
        self.clock = clock
        self.watch_timeout = watch_timeout
        self.said = ""  # why renewal is off, said once until it changes
        self.backoff = Backoff(base=10.0, cap=min(600.0, resync_seconds))
        # set by the watches when a Secret changed; the loop looks at once instead of sleeping on
        self.changed = asyncio.Event()
        # each Secret's resourceVersion as last judged (read, or written by a renewal): a watch event
        # of that very version (the one a watch opens with, the renewal's own write) is no news
        self.judged: dict[str, str] = {}
        self.watched: dict[str, str] = {}  # the last resourceVersion each watch saw, to resume from
        self.watch_said: dict[str, str] = {}  # why each watch fails, said once until it changes
        # while a renewal's write is in flight its resourceVersion is not known yet: the serving
        # Secret's watch keeps what it sees here and the write judges it once it answers
        self.writing = False
        self.seen_while_writing = ""

    async def _secret(self, name: str) -> Obj | None:
        try:
            found = await list_raw(self.core.read_namespaced_secret, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                self.judged[name] = ""
                return None
            raise
        self.judged[name] = _version(found)
        return found

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
        span = recorded_lifetime(tls_secret, current) or lifetime(current)
        due = renewal_due_at(current, self.renew_before, span=span)
        if now < due:
            return min((due - now).total_seconds(), self.resync_seconds)
        try:
            done = await self._renew(tls_secret, authority, current, now, span)
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
                "lifetimeSeconds": round(span.total_seconds()),
            },
        )
        await self.report(tls_secret, "CertificateRenewed", note, f"{done.new.serial_number:x}")
        next_due = renewal_due_at(done.new, self.renew_before, span=span)
        return min(max((next_due - now).total_seconds(), 1.0), self.resync_seconds)

    async def _renew(
        self,
        secret: Obj,
        authority: Authority,
        current: x509.Certificate,
        now: dt.datetime,
        span: dt.timedelta,
    ) -> Renewed:
        """Issue, check, and write certificate and key in one conditional update of the Secret, with
        the lifetime the new certificate carries recorded beside it."""
        cert, key = renew(authority, current, now=now, span=span)
        new = load_cert(cert, where="the renewed certificate")
        metadata = {k: val for k, val in (secret.get("metadata") or {}).items() if k != "managedFields"}
        metadata["annotations"] = {
            **(metadata.get("annotations") or {}),
            LIFETIME_ANNOTATION: lifetime_record(new, span),
        }
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
        self.writing, self.seen_while_writing = True, ""
        try:
            written = await self.core.replace_namespaced_secret(
                TLS_SECRET, self.namespace, body, field_manager=FIELD_MANAGER
            )
            self.judged[TLS_SECRET] = str(getattr(written.metadata, "resource_version", "") or "")
        finally:
            self.writing = False
            if self.seen_while_writing not in ("", self.judged.get(TLS_SECRET)):
                self.changed.set()  # someone else's change seen meanwhile: look again at once
        return Renewed(current, new)

    async def run(self) -> None:
        """Look now, then whenever a watched Secret changes, when a renewal is due, or each resync."""
        watches: list[asyncio.Task[None]] = []
        try:
            while True:
                self.changed.clear()  # before looking: a change while it looks wakes it again at once
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
                if not watches:  # after the first look: the Secrets as they are then are no news
                    watches = [asyncio.create_task(self.watch(name)) for name in (CA_SECRET, TLS_SECRET)]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), timeout=wait)
        finally:
            for task in watches:
                task.cancel()
            for task in watches:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def watch(self, name: str) -> None:
        """Watch Secret ``name`` for as long as the loop runs, waking it on each change. The watch
        names the Secret with ``fieldSelector=metadata.name=<name>``: the API server then takes the
        name as the request's, so RBAC ``resourceNames`` can allow it (a watch of the namespace's
        Secrets would need every Secret). It resumes from the last resourceVersion seen; an expired
        one (410 Gone) starts over from the current state; any other failure is retried with backoff,
        never raised: the resync still looks."""
        backoff = Backoff(base=1.0, cap=min(60.0, self.resync_seconds))
        while True:
            try:
                await self._watch_once(name)
                backoff.reset()
                self._watch_works(name)  # served until its timeout: whatever failed before works again
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # refused, expired, the API away, a connection cut
                if is_status(exc, 410):
                    log.info(
                        "certificate Secret watch expired, watching anew",
                        extra={"secret": f"{self.namespace}/{name}"},
                    )
                    self.watched.pop(name, None)
                    continue
                delay = backoff.next_delay()
                reason = one_line(exc)
                if self.watch_said.get(name) != reason:
                    log.warning(
                        "certificate Secret watch failed, retrying (the resync still looks)",
                        extra={
                            "secret": f"{self.namespace}/{name}",
                            "reason": reason,
                            "retryIn": round(delay, 1),
                        },
                    )
                    self.watch_said[name] = reason
                await asyncio.sleep(delay)

    async def _watch_once(self, name: str) -> None:
        """One watch request, from the last resourceVersion seen (none: the server first sends the
        Secret as it is now), until the server ends it."""
        since = {"resource_version": self.watched[name]} if self.watched.get(name) else {}
        async with watch.Watch() as stream:
            async for event in stream.stream(
                self.core.list_namespaced_secret,
                self.namespace,
                field_selector=f"metadata.name={name}",
                timeout_seconds=self.watch_timeout,
                allow_watch_bookmarks=True,
                **since,
            ):
                raw: Obj = event.get("raw_object") or {}
                if version := _version(raw):
                    self.watched[name] = version
                self._watch_works(name)
                if event["type"] in ("ADDED", "MODIFIED", "DELETED") and version != self.judged.get(name):
                    if name == TLS_SECRET and self.writing:  # the write judges it when it answers
                        self.seen_while_writing = version
                        continue
                    log.info(
                        "certificate Secret changed, looking at it now",
                        extra={"secret": f"{self.namespace}/{name}", "event": event["type"]},
                    )
                    self.changed.set()

    def _watch_works(self, name: str) -> None:
        if self.watch_said.pop(name, None) is not None:
            log.info("certificate Secret watch works again", extra={"secret": f"{self.namespace}/{name}"})
