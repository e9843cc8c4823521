"""The webhook's PKI, shared by ``certs generate``/``rotate`` and the controller's renewal (DESIGN
"Certificates that renew themselves"), with cryptography: the CA, a serving certificate issued from
it, and a renewal of one (the same names, subject, key type and lifetime), checked before it is used.

A renewed certificate is valid from ``BACKDATE`` before now (clock skew) and lasts the old lifetime
from now, whatever that lifetime is, so it has its whole lifetime ahead. Its validity span
(notAfter - notBefore) is then its lifetime plus the backdate, which the certificate cannot say:
whoever renews again passes the lifetime it recorded (``span=``), or the span stands for it.

Certificates and keys go in and out as PEM bytes: where they are kept (files, a Secret) is the
caller's business.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
SERVING_DAYS = 365
BACKDATE = dt.timedelta(minutes=5)  # clock skew between the issuer and the API servers
# how long a Secret's change takes to be served: the kubelet brings it into the webhook Pods' volume
# on its periodic sync of the Pod (up to about a minute, 68 s measured on the real node), then the
# webhook's 2 s look at the files. A renewal is due at least this long before the end (never more
# than half the lifetime before it, so a short certificate is not renewed over and over).
REACH = dt.timedelta(minutes=2)


class PkiError(ValueError):
    """A certificate or key that cannot be used as asked; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def new_authority(namespace: str, now: dt.datetime) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kratos-admit CA ({namespace})")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
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
    return Authority(cert, key)


def load_cert(pem: bytes, *, where: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise PkiError(f"{where}: not a PEM certificate") from None


def load_key(pem: bytes, *, where: str) -> ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        raise PkiError(f"{where}: not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise PkiError(f"{where}: an ECDSA or RSA key is needed, not {type(key).__name__}")
    return key


def authority_from_pem(cert: bytes, key: bytes, *, cert_where: str, key_where: str) -> Authority:
    ca, ca_key = load_cert(cert, where=cert_where), load_key(key, where=key_where)
    if ca_key.public_key() != ca.public_key():
        raise PkiError(f"{key_where} is not the key of {cert_where}")
    return Authority(ca, ca_key)


def alt_names(names: tuple[str, ...]) -> list[x509.GeneralName]:
    found: list[x509.GeneralName] = []
    for name in names:
        try:
            found.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            found.append(x509.DNSName(name))
    return found


def _same_kind_of_key(
    like: ec.EllipticCurvePublicKey | rsa.RSAPublicKey | None,
) -> ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey:
    if isinstance(like, rsa.RSAPublicKey):
        return rsa.generate_private_key(public_exponent=65537, key_size=like.key_size)
    curve = like.curve if isinstance(like, ec.EllipticCurvePublicKey) else ec.SECP256R1()
    return ec.generate_private_key(curve)


def issue_serving(
    authority: Authority,
    *,
    subject: x509.Name,
    names: list[x509.GeneralName],
    not_after: dt.datetime,
    now: dt.datetime,
    like: ec.EllipticCurvePublicKey | rsa.RSAPublicKey | None = None,
) -> tuple[bytes, bytes]:
    """A serving certificate and its new key (PEM), the key of the kind of ``like`` (ECDSA P-256
    when none). Refused when it would outlive its CA."""
    if not_after > authority.cert.not_valid_after_utc:
        raise PkiError(
            f"the CA expires {authority.cert.not_valid_after_utc:%Y-%m-%d %H:%M}, before the serving certificate "
            f'would ({not_after:%Y-%m-%d %H:%M}): roll the CA first (--new-ca, docs/operations.md "Rotating certificates")'
        )
    key = _same_kind_of_key(like)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(authority_key_identifier(authority.cert), critical=False)
        .sign(authority.key, hashes.SHA256())
    )
    return cert_pem(cert), key_pem(key)


def authority_key_identifier(ca: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    """The CA's own subjectKeyIdentifier, where it has one: TLS clients (OpenSSL) find the issuer by
    it, and not every issuer derives it from the key the same way (Helm's ``genCA`` does not)."""
    try:
        ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        public = ca.public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey | rsa.RSAPublicKey)
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(public)
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def subject_alt_names(cert: x509.Certificate, *, where: str) -> list[x509.GeneralName]:
    try:
        return list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        raise PkiError(f"{where}: has no subjectAltName to carry over") from None


def signed_by(cert: x509.Certificate, authority: Authority) -> bool:
    """Whether the CA signed ``cert`` (its issuer, and its signature under the CA's key)."""
    if cert.issuer != authority.cert.subject:
        return False
    try:
        cert.verify_directly_issued_by(authority.cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def lifetime(cert: x509.Certificate) -> dt.timedelta:
    """The certificate's validity span, notAfter - notBefore (a renewed one's lifetime plus its backdate)."""
    return cert.not_valid_after_utc - cert.not_valid_before_utc


def renew_ahead(span: dt.timedelta, renew_before: float) -> dt.timedelta:
    """How long before its end a certificate of lifetime ``span`` is renewed: ``renew_before`` of it
    (a share), and at least ``REACH``, but never more than half of it."""
    if span <= dt.timedelta(0):
        raise PkiError(f"a certificate lifetime must be more than 0, not {span}")
    return max(span * renew_before, min(REACH, span / 2))


def renewal_due_at(
    cert: x509.Certificate, renew_before: float, *, span: dt.timedelta | None = None
) -> dt.datetime:
    """When less than ``renew_ahead`` of the certificate's lifetime remains: ``span`` where the
    renewer recorded it, else the certificate's validity span."""
    return cert.not_valid_after_utc - renew_ahead(span or lifetime(cert), renew_before)


def renew(
    authority: Authority,
    current: x509.Certificate,
    *,
    now: dt.datetime,
    span: dt.timedelta | None = None,
) -> tuple[bytes, bytes]:
    """The renewal of ``current``: a new key of the same kind, the same subject and names, valid from
    ``BACKDATE`` before ``now`` and for the same lifetime (``span`` where the renewer recorded it, else
    the validity span of ``current``) from ``now``, never past the CA's own end; checked before it is
    handed back."""
    names = subject_alt_names(current, where="the serving certificate")
    not_after = min(now + (span or lifetime(current)), authority.cert.not_valid_after_utc)
    public = current.public_key()
    like = public if isinstance(public, ec.EllipticCurvePublicKey | rsa.RSAPublicKey) else None
    cert, key = issue_serving(
        authority, subject=current.subject, names=names, not_after=not_after, now=now, like=like
    )
    check_pair(cert, key, authority=authority, like=current, now=now)
    return cert, key


def check_pair(
    cert: bytes, key: bytes, *, authority: Authority, like: x509.Certificate, now: dt.datetime
) -> None:
    """Never a bad certificate in place of a good one: the key is the certificate's, the CA signed
    it, it is valid now and later than ``like``, with ``like``'s names."""
    issued, issued_key = (
        load_cert(cert, where="the renewed certificate"),
        load_key(key, where="the renewed key"),
    )
    problems = []
    if issued_key.public_key() != issued.public_key():
        problems.append("its key is not the certificate's")
    if not signed_by(issued, authority):
        problems.append("the CA did not sign it")
    try:
        named = issued.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    except x509.ExtensionNotFound:
        named = None
    if named is not None and named != authority_key_identifier(authority.cert).key_identifier:
        problems.append(
            "its authorityKeyIdentifier is not the CA's key identifier (clients could not find the CA)"
        )
    if not issued.not_valid_before_utc <= now < issued.not_valid_after_utc:
        problems.append("it is not valid now")
    if issued.not_valid_after_utc <= like.not_valid_after_utc:
        problems.append("it ends no later than the certificate it renews")
    if subject_alt_names(issued, where="the renewed certificate") != subject_alt_names(
        like, where="the current"
    ):
        problems.append("its names differ")
    if problems:
        raise PkiError(f"the renewed certificate is not used: {'; '.join(problems)}")
