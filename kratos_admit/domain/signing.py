"""HMAC-SHA256 signatures over the KRATOS-only keys of one metadata block (DESIGN "Who may write").

The validating webhook sees the same user as the mutating one, so it cannot tell our additions from
a user's by identity; a signature keyed by a secret shared by webhook and controller can.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_mapping, child

SIGNATURE_PREFIX: Final = "hmac-sha256:"
MIN_KEY_BYTES: Final = 32
# For offline `review` and `webhook --profiles` only; both say so in a warning. Never for a cluster.
DEVELOPMENT_KEY: Final = b"kratos-development-signing-key-not-for-clusters-000"


class SigningKeyError(ValueError):
    """The signing key file is missing, unreadable or too short."""


def load_signing_key(path: Path) -> bytes:
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise SigningKeyError(f"signing key {path}: {exc.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise SigningKeyError(f"signing key {path}: must hold at least {MIN_KEY_BYTES} bytes, has {len(key)}")
    return key


def reserved_keys(meta: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The KRATOS-only labels and annotations of a block (signature excluded), as found."""
    labels, annotations = as_mapping(meta.get("labels")), as_mapping(meta.get("annotations"))
    return (
        {k: str(val) for k, val in labels.items() if k in v.RESERVED_LABELS},
        {
            k: str(val)
            for k, val in annotations.items()
            if k in v.RESERVED_ANNOTATIONS and k != v.SIGNATURE_ANNOTATION
        },
    )


def compute_signature(meta: Mapping[str, Any], *, namespace: str, key: bytes) -> str:
    labels, annotations = reserved_keys(meta)
    return _signature(namespace, tuple(sorted(labels.items())), tuple(sorted(annotations.items())), key)


@functools.lru_cache(maxsize=4096)
def _signature(
    namespace: str, labels: tuple[tuple[str, str], ...], annotations: tuple[tuple[str, str], ...], key: bytes
) -> str:
    """Memoised: the Job and its template carry the same keys, and hinted workloads repeat."""
    message = json.dumps(
        {"namespace": namespace, "labels": dict(labels), "annotations": dict(annotations)},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return SIGNATURE_PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()


def has_reserved_keys(meta: Mapping[str, Any]) -> bool:
    labels, annotations = reserved_keys(meta)
    signed = v.SIGNATURE_ANNOTATION in as_mapping(meta.get("annotations"))
    return bool(labels or annotations or signed)


def signature_valid(meta: Mapping[str, Any], *, namespace: str, key: bytes) -> bool:
    given = as_mapping(meta.get("annotations")).get(v.SIGNATURE_ANNOTATION)
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(given, compute_signature(meta, namespace=namespace, key=key))


def sign_block(meta: dict[str, Any], *, namespace: str, key: bytes) -> None:
    """Write (or refresh) the signature of a block the caller has just given KRATOS-only keys."""
    child(meta, "annotations")[v.SIGNATURE_ANNOTATION] = compute_signature(meta, namespace=namespace, key=key)


def signed_role(meta: Mapping[str, Any], *, namespace: str, key: bytes) -> str | None:
    """The block's ``gpu.scheduler.io/role`` when KRATOS signed it; a forged role counts as none."""
    role = as_mapping(meta.get("labels")).get(v.ROLE_LABEL)
    return role if isinstance(role, str) and signature_valid(meta, namespace=namespace, key=key) else None
