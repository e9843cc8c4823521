"""CA and serving certificate (ECDSA P-256) plus the signing key, with cryptography.

kubeadm's split: a CA of 10 years and a serving certificate of 1 year, so the serving certificate
rotates (``rotate``) many times under one CA and the webhook configurations' ``caBundle`` stays
put. What outlives a rotation is never replaced unless asked: a new CA needs a ``caBundle`` roll,
and a new signing key invalidates every object KRATOS signed (docs/operations.md "Rotating certificates").
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from kratos_admit.edge.pki import (
    SERVING_DAYS,
    Authority,
    PkiError,
    alt_names,
    authority_from_pem,
    cert_pem,
    issue_serving,
    key_pem,
    load_cert,
    new_authority,
    subject_alt_names,
)

CA_CERT, CA_KEY = "ca.crt", "ca.key"
TLS_CERT, TLS_KEY = "tls.crt", "tls.key"
SIGNING_KEY = "signing.key"
FILES = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, SIGNING_KEY)
CertsError = PkiError  # the certificates cannot be written as asked


@dataclass(frozen=True, slots=True)
class GeneratedCerts:
    directory: Path
    dns_names: tuple[str, ...]
    not_after: dt.datetime
    written: tuple[str, ...]  # file names written; the others in FILES were kept as they were
    ca_not_after: dt.datetime

    @property
    def kept(self) -> tuple[str, ...]:
        return tuple(name for name in FILES if name not in self.written)


def service_dns_names(service: str, namespace: str) -> tuple[str, ...]:
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )


def _write(path: Path, data: bytes, *, private: bool) -> None:
    """Write to a temporary file beside ``path``, then rename it over ``path``: a reader (the
    webhook watching the directory) sees the old file or the new one, never half of one."""
    mode = 0o600 if private else 0o644
    fd, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(staged, mode)
        os.replace(staged, path)
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise


def _load_authority(directory: Path) -> Authority:
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    missing = [p.name for p in (cert_path, key_path) if not p.exists()]
    if missing:
        raise CertsError(
            f"{directory}: {' and '.join(missing)} missing: a serving certificate needs the CA's certificate and key"
        )
    return authority_from_pem(
        cert_path.read_bytes(), key_path.read_bytes(), cert_where=str(cert_path), key_where=str(key_path)
    )


def _issue_serving(
    authority: Authority,
    *,
    subject: x509.Name,
    names: list[x509.GeneralName],
    not_after: dt.datetime,
    now: dt.datetime,
    directory: Path,
) -> None:
    try:
        cert, key = issue_serving(authority, subject=subject, names=names, not_after=not_after, now=now)
    except PkiError as exc:
        raise CertsError(f"{directory / CA_CERT}: {exc}") from None
    # the key first: a watcher that reads the new key with the old certificate fails to load the
    # pair and keeps serving the old one until the certificate lands a moment later
    _write(directory / TLS_KEY, key, private=True)
    _write(directory / TLS_CERT, cert, private=False)


def generate(
    *,
    service: str,
    namespace: str,
    out: Path,
    days: int = SERVING_DAYS,
    new_ca: bool = False,
    new_signing_key: bool = False,
    extra_names: tuple[str, ...] = (),
    now: dt.datetime | None = None,
) -> GeneratedCerts:
    """A serving certificate for the Service, from the CA in ``out`` when there is one (a new CA
    otherwise, or with ``new_ca``), and a signing key when ``out`` has none (or ``new_signing_key``)."""
    if days < 1:
        raise CertsError("--days must be at least 1")
    if out.exists() and not out.is_dir():
        raise CertsError(f"{out}: not a directory")
    out.mkdir(parents=True, exist_ok=True)
    now = now or dt.datetime.now(dt.UTC)
    written: list[str] = []
    has_ca = (out / CA_CERT).exists() or (out / CA_KEY).exists()
    authority = _load_authority(out) if has_ca and not new_ca else new_authority(namespace, now)
    names = (*service_dns_names(service, namespace), *extra_names)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{service}.{namespace}.svc")])
    not_after = now + dt.timedelta(days=days)
    _issue_serving(
        authority, subject=subject, names=alt_names(names), not_after=not_after, now=now, directory=out
    )
    written += [TLS_CERT, TLS_KEY]
    if not has_ca or new_ca:
        _write(out / CA_KEY, key_pem(authority.key), private=True)
        _write(out / CA_CERT, cert_pem(authority.cert), private=False)
        written += [CA_CERT, CA_KEY]
    if new_signing_key or not (out / SIGNING_KEY).exists():
        _write(out / SIGNING_KEY, secrets.token_hex(32).encode() + b"\n", private=True)
        written.append(SIGNING_KEY)
    return GeneratedCerts(
        out, names, not_after, tuple(n for n in FILES if n in written), authority.cert.not_valid_after_utc
    )


def rotate(directory: Path, *, days: int = SERVING_DAYS, now: dt.datetime | None = None) -> GeneratedCerts:
    """A new serving certificate and key from the CA in ``directory``, for the same names as the
    current ``tls.crt``; the CA, its key and the signing key are not touched."""
    if days < 1:
        raise CertsError("--days must be at least 1")
    if not directory.is_dir():
        raise CertsError(f"{directory}: no such directory (certs generate writes one)")
    current_path = directory / TLS_CERT
    try:
        current = load_cert(current_path.read_bytes(), where=str(current_path))
    except FileNotFoundError:
        raise CertsError(
            f"{current_path}: no such file: nothing to rotate (certs generate writes one)"
        ) from None
    sans = subject_alt_names(current, where=str(current_path))
    authority = _load_authority(directory)
    now = now or dt.datetime.now(dt.UTC)
    not_after = now + dt.timedelta(days=days)
    _issue_serving(
        authority, subject=current.subject, names=sans, not_after=not_after, now=now, directory=directory
    )
    names = tuple(str(getattr(name, "value", name)) for name in sans)
    return GeneratedCerts(
        directory, names, not_after, (TLS_CERT, TLS_KEY), authority.cert.not_valid_after_utc
    )
