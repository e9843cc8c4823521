"""``kratos-admit certs inject``: write the CA into the live webhook configurations' caBundle."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.vocabulary import WEBHOOK_CONFIGURATION


class InjectError(ValueError):
    """The CA cannot be read or the webhook configurations cannot be updated."""


@dataclass(frozen=True, slots=True)
class Injected:
    kind: str
    name: str
    webhooks: int


def read_ca(path: Path) -> bytes:
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise InjectError(f"{path}: {exc.strerror}") from None
    try:
        certificate = x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise InjectError(f"{path}: not a PEM certificate") from None
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    if not constraints.ca:
        raise InjectError(f"{path}: is not a CA certificate (pass the ca.crt that signed tls.crt)")
    return pem


async def inject_ca(
    api: client.ApiClient, ca_pem: bytes, *, name: str = WEBHOOK_CONFIGURATION
) -> list[Injected]:
    """One JSON patch per configuration: every webhook's clientConfig.caBundle, nothing else touched."""
    admission = client.AdmissionregistrationV1Api(api)
    bundle = base64.b64encode(ca_pem).decode()
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
        count = len(current.webhooks or [])
        ops = [
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
            for i in range(count)
        ]
        try:
            await patch(name, ops)
        except ApiException as exc:
            raise InjectError(f"{kind} {name}: API error {exc.status} {exc.reason}") from None
        done.append(Injected(kind, name, count))
    return done
