"""CA and serving certificate (ECDSA P-256) plus the signing key, with cryptography.

kubeadm's split: a CA of 10 years and a serving certificate of 1 year, so the serving certificate
rotates (``rotate``) many times under one CA and the webhook configurations' ``caBundle`` stays
put. What outlives a rotation is never replaced unless asked: a new CA needs a ``caBundle`` roll,
and a new signing key invalidates every object KRATOS signed (docs/operations.md "Rotating certificates").
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY = "ca.crt", "ca.key"
TLS_CERT, TLS_KEY = "tls.crt", "tls.key"
SIGNING_KEY = "signing.key"
FILES = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, SIGNING_KEY)
CA_DAYS = 3650
SERVING_DAYS = 365
_BACKDATE = dt.timedelta(minutes=5)  # clock skew between this machine and the API servers


class CertsError(ValueError):
    """The certificates cannot be written as asked."""


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


@dataclass(frozen=True, slots=True)
class _Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


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


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _new_authority(namespace: str, now: dt.datetime) -> _Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kratos-admit CA ({namespace})")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _Authority(cert, key)


def _load_authority(directory: Path) -> _Authority:
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    missing = [p.name for p in (cert_path, key_path) if not p.exists()]
    if missing:
        raise CertsError(
            f"{directory}: {' and '.join(missing)} missing: a serving certificate needs the CA's certificate and key"
        )
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError:
        raise CertsError(f"{cert_path}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError):
        raise CertsError(f"{key_path}: not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise CertsError(f"{key_path} is not the key of {cert_path}")
    return _Authority(cert, key)


def _issue_serving(
    authority: _Authority,
    *,
    subject: x509.Name,
    alt_names: list[x509.GeneralName],
    not_after: dt.datetime,
    now: dt.datetime,
    directory: Path,
) -> None:
    if not_after > authority.cert.not_valid_after_utc:
        raise CertsError(
            f"{directory / CA_CERT} expires {authority.cert.not_valid_after_utc:%Y-%m-%d}, before the serving "
            f'certificate would ({not_after:%Y-%m-%d}): roll the CA first (--new-ca, docs/operations.md "Rotating certificates")'
        )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()), critical=False
        )
        .sign(authority.key, hashes.SHA256())
    )
    # the key first: a watcher that reads the new key with the old certificate fails to load the
    # pair and keeps serving the old one until the certificate lands a moment later
    _write(directory / TLS_KEY, _key_pem(key), private=True)
    _write(directory / TLS_CERT, cert.public_bytes(serialization.Encoding.PEM), private=False)


def _alt_names(names: tuple[str, ...]) -> list[x509.GeneralName]:
    alt_names: list[x509.GeneralName] = []
    for name in names:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    return alt_names


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
    authority = _load_authority(out) if has_ca and not new_ca else _new_authority(namespace, now)
    names = (*service_dns_names(service, namespace), *extra_names)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{service}.{namespace}.svc")])
    not_after = now + dt.timedelta(days=days)
    _issue_serving(
        authority, subject=subject, alt_names=_alt_names(names), not_after=not_after, now=now, directory=out
    )
    written += [TLS_CERT, TLS_KEY]
    if not has_ca or new_ca:
        _write(out / CA_KEY, _key_pem(authority.key), private=True)
        _write(out / CA_CERT, authority.cert.public_bytes(serialization.Encoding.PEM), private=False)
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
        current = x509.load_pem_x509_certificate(current_path.read_bytes())
    except FileNotFoundError:
        raise CertsError(
            f"{current_path}: no such file: nothing to rotate (certs generate writes one)"
        ) from None
    except ValueError:
        raise CertsError(f"{current_path}: not a PEM certificate") from None
    try:
        sans = current.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CertsError(f"{current_path}: has no subjectAltName to carry over") from None
    authority = _load_authority(directory)
    now = now or dt.datetime.now(dt.UTC)
    not_after = now + dt.timedelta(days=days)
    _issue_serving(
        authority,
        subject=current.subject,
        alt_names=list(sans),
        not_after=not_after,
        now=now,
        directory=directory,
    )
    names = tuple(str(getattr(name, "value", name)) for name in sans)
    return GeneratedCerts(
        directory, names, not_after, (TLS_CERT, TLS_KEY), authority.cert.not_valid_after_utc
    )
