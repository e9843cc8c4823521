"""``kratos-admit certs generate --in-cluster``: the files it wrote, as the Secrets the install mounts
and the controller renews from (DESIGN "Certificates that renew themselves"): ``kratos-webhook-ca``
(the CA and its key: where the controller's leader renews from), ``kratos-webhook-tls`` (the serving
certificate and key, and ``ca.crt``) and ``kratos-signing-key``, the same three the chart makes.

As with the files, what outlives a rotation is never replaced unless asked: a CA or a signing key
already in the cluster that differs from the files is refused (``--new-ca``, ``--new-signing-key``
replace it), so a second run cannot silently split the cluster from the ``caBundle`` or invalidate
every signed object.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.edge.kube import list_raw, one_line
from kratos_admit.webhook.certs import CA_CERT, CA_KEY, SIGNING_KEY, TLS_CERT, TLS_KEY

CA_SECRET, TLS_SECRET, SIGNING_SECRET = "kratos-webhook-ca", "kratos-webhook-tls", "kratos-signing-key"
FIELD_MANAGER = "kratos-admit-certs"


class SecretsError(ValueError):
    """The Secrets cannot be written as asked; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Written:
    name: str
    outcome: str  # "created", "updated", "unchanged"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def desired(directory: Path, namespace: str) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
    """Each Secret as the files make it, with the keys that must not change without being asked."""
    labels = {"app.kubernetes.io/part-of": "kratos-admit"}

    def secret(name: str, kind: str, data: dict[str, str]) -> dict[str, Any]:
        meta = {"name": name, "namespace": namespace, "labels": labels}
        return {"apiVersion": "v1", "kind": "Secret", "type": kind, "metadata": meta, "data": data}

    ca = {"ca.crt": _b64(directory / CA_CERT), "ca.key": _b64(directory / CA_KEY)}
    tls = {
        "tls.crt": _b64(directory / TLS_CERT),
        "tls.key": _b64(directory / TLS_KEY),
        "ca.crt": ca["ca.crt"],
    }
    return [
        (secret(CA_SECRET, "Opaque", ca), ("ca.crt", "ca.key")),
        (secret(TLS_SECRET, "kubernetes.io/tls", tls), ()),
        (secret(SIGNING_SECRET, "Opaque", {"signing.key": _b64(directory / SIGNING_KEY)}), ("signing.key",)),
    ]


async def write_secrets(
    api: client.ApiClient, directory: Path, namespace: str, *, new_ca: bool, new_signing_key: bool
) -> list[Written]:
    core = client.CoreV1Api(api)
    allowed = {CA_SECRET: new_ca, SIGNING_SECRET: new_signing_key}
    plan = desired(directory, namespace)
    found: dict[str, dict[str, Any] | None] = {}
    for wanted, kept in plan:  # every refusal before any write
        name = wanted["metadata"]["name"]
        try:
            found[name] = await list_raw(core.read_namespaced_secret, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise SecretsError(f"Secret {namespace}/{name}: {one_line(exc)}") from None
            found[name] = None
        current = found[name]
        changed = [
            k for k in kept if current is not None and (current.get("data") or {}).get(k) != wanted["data"][k]
        ]
        if changed and not allowed.get(name, False):
            flag = "--new-ca" if name == CA_SECRET else "--new-signing-key"
            raise SecretsError(
                f"Secret {namespace}/{name} holds another {' and '.join(changed)} than {directory}: pass {flag} to "
                "replace it in the cluster, or generate from the one there"
            )
    written = []
    for secret, _ in plan:
        body: Any = secret  # kubernetes_asyncio serialises a plain dict as it is
        name = body["metadata"]["name"]
        current = found[name]
        try:
            if current is None:
                await core.create_namespaced_secret(namespace, body, field_manager=FIELD_MANAGER)
                written.append(Written(name, "created"))
            elif current.get("data") == body["data"]:
                written.append(Written(name, "unchanged"))
            else:
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                await core.replace_namespaced_secret(name, namespace, body, field_manager=FIELD_MANAGER)
                written.append(Written(name, "updated"))
        except ApiException as exc:
            raise SecretsError(f"Secret {namespace}/{name}: {one_line(exc)}") from None
    return written
