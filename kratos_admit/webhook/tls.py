"""The serving certificate: TLS 1.2+ context, reload on change without a restart, expiry for metrics.

Reloading calls ``load_cert_chain`` again on the same SSLContext: new handshakes get the new
certificate, connections already up keep theirs, so a rotation fails no request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

from cryptography import x509

log = logging.getLogger("kratos.tls")


class CertificateError(ValueError):
    """The certificate or key cannot be served; the message says which file and why."""


def _fingerprint(cert: Path, key: Path) -> str:
    digest = hashlib.sha256()
    for path in (cert, key):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def certificate_expiry(cert: Path) -> float:
    certificate = x509.load_pem_x509_certificate(cert.read_bytes())
    return certificate.not_valid_after_utc.timestamp()


class ServingCertificate:
    def __init__(self, cert: Path, key: Path, *, on_load: Callable[[float], None] = lambda _: None) -> None:
        self.cert, self.key = cert, key
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._on_load = on_load
        self._fingerprint = ""
        self.loaded = False
        self.load()

    def load(self) -> None:
        try:
            fingerprint = _fingerprint(self.cert, self.key)
            self.context.load_cert_chain(self.cert, self.key)
            expiry = certificate_expiry(self.cert)
        except FileNotFoundError as exc:
            raise CertificateError(f"{exc.filename}: no such file") from None
        except ssl.SSLError as exc:
            if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
                raise CertificateError(f"{self.key} does not match the certificate {self.cert}") from None
            raise CertificateError(f"{self.cert} / {self.key}: cannot load: {exc.reason or exc}") from None
        except (OSError, ValueError) as exc:
            raise CertificateError(f"{self.cert} / {self.key}: cannot load: {exc}") from None
        self._fingerprint = fingerprint
        self.loaded = True
        self._on_load(expiry)

    def changed(self) -> bool:
        try:
            return _fingerprint(self.cert, self.key) != self._fingerprint
        except OSError:
            return False  # a Secret volume mid-swap: try again on the next tick

    async def watch(self, interval: float = 2.0) -> None:
        """Reload when the files change; a bad new pair is logged and the old one kept serving."""
        while True:
            await asyncio.sleep(interval)
            if not self.changed():
                continue
            try:
                self.load()
                log.info("serving certificate reloaded", extra={"cert": str(self.cert)})
            except CertificateError as exc:
                log.error("new certificate not loaded, keeping the old one", extra={"reason": str(exc)})
