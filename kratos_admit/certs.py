"""CA and serving certificate (ECDSA P-256) plus the signing key, with cryptography."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
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


class CertsError(ValueError):
    """The certificates cannot be written as asked."""


@dataclass(frozen=True, slots=True)
class GeneratedCerts:
    directory: Path
    dns_names: tuple[str, ...]
    not_after: dt.datetime


def service_dns_names(service: str, namespace: str) -> tuple[str, ...]:
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )


def _write(path: Path, data: bytes, *, private: bool) -> None:
    mode = 0o600 if private else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def generate(
    *,
    service: str,
    namespace: str,
    out: Path,
    days: int = 365,
    force: bool = False,
    extra_names: tuple[str, ...] = (),
    now: dt.datetime | None = None,
) -> GeneratedCerts:
    if days < 1:
        raise CertsError("--days must be at least 1")
    existing = [name for name in FILES if (out / name).exists()]
    if existing and not force:
        raise CertsError(f"{out}: {', '.join(existing)} already exist; pass --force to overwrite")
    out.mkdir(parents=True, exist_ok=True)
    now = now or dt.datetime.now(dt.UTC)
    not_after = now + dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kratos-admit CA ({namespace})")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after + dt.timedelta(days=1))
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    names = (*service_dns_names(service, namespace), *extra_names)
    alt_names: list[x509.GeneralName] = []
    for name in names:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{service}.{namespace}.svc")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(out / CA_CERT, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(out / CA_KEY, _key_pem(ca_key), private=True)
    _write(out / TLS_CERT, cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(out / TLS_KEY, _key_pem(key), private=True)
    _write(out / SIGNING_KEY, secrets.token_hex(32).encode() + b"\n", private=True)
    return GeneratedCerts(out, names, not_after)
