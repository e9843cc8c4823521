"""Decisions remembered for objects that differ only by who they are (a Job array, the Pods of one Job).

The API server sends a burst of creates whose objects are the same but for their name, uid and the
fields it stamps on each (``creationTimestamp``, ``managedFields``' times). The decision on such an
object is the same as on the first of them, so the webhook answers it from here: the patch, the
warnings and the verdict, with the new request's uid. The key is everything the decision reads:
the webhook, the kind, the operation, the namespace, the object and the old object as JSON less
their identity fields (which no rule reads), and, for a mutating review, whether the object's name
sends it to explore (ranking's ``exploring``: the one place a hint reads the name). An entry also
holds what the decision was made against: the profile, the calibration, the Nodes' GPU products and
counts and the policy context (config, catalog, signing key). The stores replace each of these with
a new object when it changes (a watch event, a reloaded file), so an entry is served only while
the profile, the calibration and the context are the very objects it was made with, and the Nodes'
products and counts are equal to those it was made with (a Node's status update rebuilds them
unchanged): never across a change of profile, calibration, config or node set. An answer that
embeds the object's name (a profiling rewrite's original template, a gang's Pods selected by their
Job's name) is served only for the same name and generateName.

A patch never touches the identity fields (``remember`` refuses one that would), so the answer
made for one name is the answer for another. Bounded in entries and in bytes: the oldest go first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from kratos_admit.admission.request import AdmissionRequest
from kratos_admit.admission.responses import Outcome
from kratos_admit.decisions.policy import Decision, PolicyContext
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.model.calibration import Calibration
from kratos_admit.model.exploration import exploring, object_key

# What the API server writes per object, and no rule reads (tests/test_decision_cache.py shows a change
# of any of them leaves the answer as it is)
IDENTITY: Final = frozenset(
    {"name", "generateName", "uid", "resourceVersion", "generation", "creationTimestamp", "managedFields"}
)
DEFAULT_SIZE: Final = 1024
DEFAULT_BYTES: Final = 32 * 2**20  # of keys and answers: a burst of large objects cannot grow it past this
Key = tuple[str, str, str, str, bytes, bytes | None, bool]


@dataclass(frozen=True, slots=True)
class Against:
    """What a decision was made against (a store replaces what changed, so identity is its version)."""

    profile: WorkloadProfile | None
    calibration: Calibration
    products: frozenset[str]
    product_nodes: Mapping[str, int]
    ctx: PolicyContext
    product_gpus: Mapping[str, int] = field(default_factory=dict)  # the most GPUs one Node of each has

    def same(self, other: Against) -> bool:
        """The very profile, calibration and context; the Nodes' products and counts equal (the
        node store rebuilds them on every Node event, most of which change neither)."""
        return (
            self.profile is other.profile
            and self.calibration is other.calibration
            and self.ctx is other.ctx
            and (self.products is other.products or self.products == other.products)
            and (self.product_nodes is other.product_nodes or self.product_nodes == other.product_nodes)
            and (self.product_gpus is other.product_gpus or self.product_gpus == other.product_gpus)
        )


@dataclass(frozen=True, slots=True)
class Remembered:
    against: Against
    identity: tuple[str, str] | None  # (name, generateName) where the answer embeds them
    decision: Decision  # its ``mutated`` is None: that object had another name
    # the patch as JSON: held as one string, not as operations whose values are subtrees of the
    # object decided on (a thousand of those in memory made the collector's every pass longer)
    patch_json: bytes
    response: dict[str, Any]  # the AdmissionReview response but its uid
    outcome: Outcome
    size: int  # bytes of its key's JSON and of its answer, what the byte bound counts


def _identity_free(obj: Mapping[str, Any] | None) -> bytes | None:
    if obj is None:
        return None
    meta = obj.get("metadata")
    if isinstance(meta, dict) and not IDENTITY.isdisjoint(meta):
        obj = {**obj, "metadata": {k: val for k, val in meta.items() if k not in IDENTITY}}
    return orjson.dumps(obj)


def identity_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return str(meta.get("name") or ""), str(meta.get("generateName") or "")


def key_of(
    request: AdmissionRequest, webhook: str, ctx: PolicyContext, profile: WorkloadProfile | None
) -> Key | None:
    """The key of an opted-in request, or None where it cannot have one (a value JSON cannot hold).
    Whether the name sends the object to explore is read only where a hint reads it: a mutating
    review with a Ready ``profile`` (the ranked hint, also when a hold is released)."""
    assert request.kind is not None and request.object is not None
    try:
        obj, old = _identity_free(request.object), _identity_free(request.old_object)
    except orjson.JSONEncodeError:
        return None
    assert obj is not None
    meta = request.object.get("metadata")
    explores = (
        webhook == "mutate"
        and profile is not None
        and profile.ready
        and exploring(
            object_key(meta if isinstance(meta, dict) else {}, request.namespace),
            ctx.config.exploration_share,
        )
    )
    return (webhook, request.kind, request.operation, request.namespace, obj, old, explores)


_IDENTITY_PATHS: Final = tuple(f"/metadata/{k}" for k in sorted(IDENTITY))


def _touches_identity(patch: list[dict[str, Any]]) -> bool:
    for op in patch:
        path = str(op.get("path", ""))
        if path in ("", "/metadata") or path.startswith(_IDENTITY_PATHS):
            return True
    return False


class DecisionCache:
    """Answers by key, at most ``size`` of them and ``max_bytes`` of their keys' JSON and answers
    (``size`` 0: nothing is remembered); the oldest go first."""

    def __init__(self, size: int = DEFAULT_SIZE, max_bytes: int = DEFAULT_BYTES) -> None:
        if size < 0:
            raise ValueError(f"size must be 0 or more, got {size}")
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be 0 or more, got {max_bytes}")
        self.size, self.max_bytes = size, max_bytes
        self.bytes = 0
        self._entries: dict[Key, Remembered] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key, against: Against, request: AdmissionRequest) -> Remembered | None:
        found = self._entries.get(key)
        if (
            found is None
            or not found.against.same(against)
            or (found.identity is not None and found.identity != identity_of(request.object or {}))
        ):
            self.misses += 1
            return None
        self.hits += 1
        return found

    def remember(
        self,
        key: Key,
        against: Against,
        request: AdmissionRequest,
        *,
        decision: Decision,
        patch: list[dict[str, Any]],
        response: dict[str, Any],
        outcome: Outcome,
    ) -> None:
        if not self.size or _touches_identity(patch):
            return
        assert request.object is not None
        identity = identity_of(request.object) if decision.named else None
        kept = Decision(
            allowed=decision.allowed,
            action=decision.action,
            violations=decision.violations,
            warnings=decision.warnings,
            ranking_source=decision.ranking_source,
            explored=decision.explored,
            gang=decision.gang,
            named=decision.named,
        )
        patch_json = orjson.dumps(patch)
        size = len(key[4]) + len(key[5] or b"") + 2 * len(patch_json) + len(str(response.get("status", "")))
        if size > self.max_bytes:
            return
        self._forget(key)
        while self._entries and (len(self._entries) >= self.size or self.bytes + size > self.max_bytes):
            self._forget(next(iter(self._entries)))
        response = {k: val for k, val in response.items() if k != "uid"}
        self._entries[key] = Remembered(against, identity, kept, patch_json, response, outcome, size)
        self.bytes += size

    def _forget(self, key: Key) -> None:
        gone = self._entries.pop(key, None)
        if gone is not None:
            self.bytes -= gone.size

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
