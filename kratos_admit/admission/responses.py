"""AdmissionReview responses: tiny pure constructors (controller-runtime's ``response.go``).

A bad object is a deny (``allowed: false``, status 403) in an HTTP 200 answer; a broken request is
not answered here at all: the server turns ``AdmissionRequestError`` into an HTTP 400.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal

import orjson

Response = dict[str, Any]
Outcome = Literal["allowed", "patched", "denied", "error"]


def allowed(uid: str) -> Response:
    return {"uid": uid, "allowed": True}


def denied(uid: str, message: str) -> Response:
    return {"uid": uid, "allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": message}}


def patched(uid: str, patch: list[dict[str, Any]]) -> Response:
    """Allowed with an RFC 6902 patch; with no operations it is a plain allow."""
    response = allowed(uid)
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    return response


def with_warnings(response: Response, warnings: Sequence[str]) -> Response:
    if warnings:
        response["warnings"] = list(warnings)
    return response


def review_envelope(api_version: str, response: Response) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}
