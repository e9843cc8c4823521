"""The Events that tell what the controller did (``kubectl describe``, ``kubectl events``): pure
builders of ``events.k8s.io/v1`` Event objects. Writing them is ``KubeIO.record``'s, best effort.

An Event's name is derived from what it reports (the object's uid, the reason and the detail), so
the same report made twice (a resync, a restart, a replayed watch event) is one Event: the second
create is answered 409 AlreadyExists and dropped.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kratos_admit.domain.raw import as_mapping

REPORTING_CONTROLLER = "gpu.scheduler.io/kratos-controller"
Reason = Literal[
    "ProfilingStarted",
    "AwaitingProfile",
    "Released",
    "ProfileReady",
    "ProfileFailed",
    "ExecutionJobCreated",
    "Observed",
    "TelemetryUnavailable",
    "CertificateRenewed",
    "CertificateRenewalFailed",
    "WaitingForProduct",
    "EscapedToProduct",
    "CalibrationNotWritten",
]
# what the controller was doing when it reported each reason (the Event's ``action``)
ACTIONS: dict[Reason, str] = {
    "ProfilingStarted": "Profile",
    "AwaitingProfile": "Hold",
    "Released": "Release",
    "ProfileReady": "Publish",
    "ProfileFailed": "Publish",
    "ExecutionJobCreated": "Create",
    "Observed": "Observe",
    "TelemetryUnavailable": "Observe",
    "CertificateRenewed": "Renew",
    "CertificateRenewalFailed": "Renew",
    "WaitingForProduct": "Wait",
    "EscapedToProduct": "Widen",
    "CalibrationNotWritten": "Calibrate",
}
WARNINGS: frozenset[Reason] = frozenset(
    {"ProfileFailed", "TelemetryUnavailable", "CertificateRenewalFailed", "CalibrationNotWritten"}
)
NOTE_LIMIT = 1024  # the API server refuses a longer note


@dataclass(frozen=True, slots=True)
class Regarding:
    """The object an Event is about (an ObjectReference)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def of(cls, obj: Mapping[str, Any], *, api_version: str, kind: str) -> Regarding:
        meta = as_mapping(obj.get("metadata"))
        return cls(
            api_version,
            kind,
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
            str(meta.get("uid") or ""),
        )


def event_name(regarding: Regarding, reason: Reason, detail: str) -> str:
    digest = hashlib.sha256(f"{regarding.uid or regarding.name}/{reason}/{detail}".encode()).hexdigest()[:16]
    return f"{regarding.name[:200]}.{digest}"


def event_body(
    regarding: Regarding, reason: Reason, note: str, *, instance: str, now: dt.datetime, detail: str = ""
) -> dict[str, Any]:
    """The Event object; ``detail`` tells apart reports of the same reason on one object (two runs)."""
    reference = {
        "apiVersion": regarding.api_version,
        "kind": regarding.kind,
        "namespace": regarding.namespace,
        "name": regarding.name,
    }
    if regarding.uid:
        reference["uid"] = regarding.uid
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": event_name(regarding, reason, detail), "namespace": regarding.namespace},
        "eventTime": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance[:128],
        "action": ACTIONS[reason],
        "reason": reason,
        "regarding": reference,
        "note": note.encode()[:NOTE_LIMIT].decode(errors="ignore"),  # the limit is in bytes
        "type": "Warning" if reason in WARNINGS else "Normal",
    }
