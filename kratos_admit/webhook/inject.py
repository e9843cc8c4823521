"""``kratos-admit certs inject``: write the CA into the live webhook configurations' caBundle.

With ``append`` the CAs already in each bundle stay (a CA roll: the API server trusts the old and
the new CA until every webhook Pod serves a certificate from the new one); identical certificates
are kept once.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.domain.vocabulary import WEBHOOK_CONFIGURATION


class InjectError(ValueError):
    """The CA cannot be read or the webhook configurations cannot be updated."""


@dataclass(frozen=True, slots=True)
class Injected:
    kind: str
    name: str
    webhooks: int
    certificates: int = 1  # in the largest bundle written


def merged_bundle(current: bytes, ca_pem: bytes) -> bytes:
    """``current``'s certificates, then ``ca_pem``'s, each distinct certificate once (PEM).
    A bundle that does not parse is dropped: it verified nothing, keeping it would keep the error."""
    found: list[x509.Certificate] = []
    for pem in (current, ca_pem):
        try:
            found += x509.load_pem_x509_certificates(pem) if pem.strip() else []
        except ValueError:
            continue
    seen: set[bytes] = set()
    out: list[bytes] = []
    for certificate in found:
        der = certificate.public_bytes(serialization.Encoding.DER)
        if der not in seen:
            seen.add(der)
            out.append(certificate.public_bytes(serialization.Encoding.PEM))
    return b"".join(out)


def _current_bundle(webhook: object) -> bytes:
    config = getattr(webhook, "client_config", None)
    encoded = getattr(config, "ca_bundle", None) or ""
    try:
        return base64.b64decode(encoded, validate=True)
    except ValueError:
        return b""


def read_ca(path: Path) -> bytes:
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise InjectError(f"{path}: {exc.strerror}") from None
    try:
        certificate = x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise InjectError(f"{path}: not a PEM certificate") from None
    try:
        is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise InjectError(f"{path}: is not a CA certificate (pass the ca.crt that signed tls.crt)")
    return pem


async def inject_ca(
    api: client.ApiClient, ca_pem: bytes, *, name: str = WEBHOOK_CONFIGURATION, append: bool = False
) -> list[Injected]:
    """One JSON patch per configuration: every webhook's clientConfig.caBundle, nothing else touched."""
    admission = client.AdmissionregistrationV1Api(api)
    done = []
    pairs = (
        (
            "MutatingWebhookConfiguration",
            admission.read_mutating_webhook_configuration,
            admission.patch_mutating_webhook_configuration,
        ),
        (
            "ValidatingWebhookConfiguration",
            admission.read_validating_webhook_configuration,
            admission.patch_validating_webhook_configuration,
        ),
    )
    for kind, read, patch in pairs:
        try:
            current = await read(name)
        except ApiException as exc:
            if exc.status == 404:
                raise InjectError(
                    f"{kind} {name} not found: apply webhook-config/ first (kubectl apply -k webhook-config/)"
                ) from None
            raise InjectError(f"{kind} {name}: API error {exc.status} {exc.reason}") from None
        webhooks = current.webhooks or []
        bundles = [merged_bundle(_current_bundle(w), ca_pem) if append else ca_pem for w in webhooks]
        ops = [
            {
                "op": "add",
                "path": f"/webhooks/{i}/clientConfig/caBundle",
                "value": base64.b64encode(b).decode(),
            }
            for i, b in enumerate(bundles)
        ]
        try:
            await patch(name, ops)
        except ApiException as exc:
            raise InjectError(f"{kind} {name}: API error {exc.status} {exc.reason}") from None
        sizes = [len(x509.load_pem_x509_certificates(b)) for b in bundles]
        done.append(Injected(kind, name, len(webhooks), max(sizes, default=0)))
    return done
