"""AdmissionReview in, AdmissionReview out. No aiohttp here: the server only moves bytes.

Two channels, never mixed (controller-runtime): a broken request is an ``AdmissionRequestError``
(HTTP 400, raised while decoding); a bad object is a deny (HTTP 200, ``allowed: false``, 403).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from kratos_admit.admission import responses
from kratos_admit.admission.cache import Against, DecisionCache, key_of
from kratos_admit.admission.patch import diff
from kratos_admit.admission.request import AdmissionRequest, decode_review
from kratos_admit.admission.responses import Outcome
from kratos_admit.decisions.policy import Decision, PolicyContext, mutate, parent_warnings, validate
from kratos_admit.decisions.stores import CalibrationStore, NodeStore, ProfileStore, StaticCalibrationStore
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import ObjectMeta, ProfileSpec, ProfileStatus, WorkloadProfile
from kratos_admit.domain.raw import as_mapping
from kratos_admit.domain.signing import signed_role
from kratos_admit.model.catalog import Catalog, load_catalog

Webhook = Literal["mutate", "validate"]


@dataclass(slots=True)
class ReviewResult:
    """The answer, plus what metrics and the request log need."""

    body: dict[str, Any]
    request: AdmissionRequest
    outcome: Outcome
    decision: Decision
    ops: list[dict[str, Any]] | None = None  # the patch, or None: decoded from ``ops_json`` when read
    ops_json: bytes = b""  # the patch as JSON, where the answer came from the decision cache

    @property
    def patch(self) -> list[dict[str, Any]]:
        """The RFC 6902 operations of the answer (its ``patch``, decoded)."""
        if self.ops is None:
            self.ops = orjson.loads(self.ops_json) if self.ops_json else []
        return self.ops


class RunsUnderWay:
    """Profiling runs this webhook process admitted a moment ago, by (namespace, workload).

    The controller marks a run (phase ``Profiling``) as soon as it sees the profiling Job, but Jobs
    created back to back reach the webhook before that mark does. Until it arrives (or ``ttl``
    passes: the API server may still have refused the Job), later Jobs of the workload are held
    as followers of this run instead of being profiled again. Memory only, and never written for
    a dry run, so the webhook keeps ``sideEffects: None``. Another replica does not see it: see
    docs/profiling.md "One profiling run per workload" for the race that remains.
    """

    def __init__(self, ttl: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.clock = ttl, clock
        self._runs: dict[tuple[str, str], tuple[WorkloadProfile, float]] = {}

    def note(self, namespace: str, workload: str, job: str) -> None:
        status = ProfileStatus(
            phase="Profiling", sourceJob=job, message=f"profiling Job {job} was just admitted"
        )
        marker = WorkloadProfile(
            metadata=ObjectMeta(name=v.profile_name(workload), namespace=namespace),
            spec=ProfileSpec(workload=workload),
            status=status,
        )
        self._runs[(namespace, workload)] = (marker, self.clock() + self.ttl)

    def get(self, namespace: str, workload: str, *, job: str = "") -> WorkloadProfile | None:
        """The run remembered for the workload. A Job of the very name of that run is not its
        follower: its first create was refused after this webhook answered (another webhook, such as
        Kueue's while Kueue is down, or a quota), so this is the same Job submitted again, and the
        memory is forgotten (were the first one stored, this create fails AlreadyExists anyway)."""
        found = self._runs.get((namespace, workload))
        if found is None:
            return None
        if self.clock() > found[1] or (
            job and found[0].status is not None and found[0].status.source_job == job
        ):
            del self._runs[(namespace, workload)]
            return None
        return found[0]


@dataclass(frozen=True, slots=True)
class AdmissionEngine:
    ctx: PolicyContext
    profiles: ProfileStore
    nodes: NodeStore
    runs: RunsUnderWay = field(default_factory=RunsUnderWay)
    calibration: CalibrationStore = field(default_factory=StaticCalibrationStore)
    # answers of the online path (``review``, ``review_live``) for objects that differ only by name
    decisions: DecisionCache = field(default_factory=DecisionCache)


def build_engine(
    config: Config,
    *,
    signing_key: bytes,
    profiles: ProfileStore,
    nodes: NodeStore,
    catalog: Catalog | None = None,
    calibration: CalibrationStore | None = None,
) -> AdmissionEngine:
    """The one engine factory: the config's catalog (or the one given) over the given stores."""
    ctx = PolicyContext(
        config=config, catalog=catalog or load_catalog(config.catalog_file), signing_key=signing_key
    )
    return AdmissionEngine(
        ctx=ctx, profiles=profiles, nodes=nodes, calibration=calibration or StaticCalibrationStore()
    )


def review(body: bytes, *, webhook: Webhook, engine: AdmissionEngine) -> ReviewResult:
    """Answer one AdmissionReview. Raises AdmissionRequestError only for a broken request.

    Online: an answer may come from ``engine.decisions`` (see ``cache``), and then its
    ``decision.mutated`` is None; the patch is the answer."""
    return answer(decode_review(body), webhook=webhook, engine=engine, remember=True)


async def review_live(body: bytes, *, webhook: Webhook, engine: AdmissionEngine) -> ReviewResult:
    """The server's path: as ``review``, but a profile cache miss first asks the store to refresh."""
    request = decode_review(body)
    key = request.profile_key
    if key is not None and _stale(engine.profiles.get(*key), request):
        await engine.profiles.refresh(*key)
    return answer(request, webhook=webhook, engine=engine, remember=True)


def _stale(cached: WorkloadProfile | None, request: AdmissionRequest) -> bool:
    """A miss, or an execution Job meeting a run still marked Profiling: the controller publishes the
    profile and creates the execution Job a moment later, so the watch may not have caught up."""
    if cached is None:
        return True
    labels = as_mapping(as_mapping(as_mapping(request.object).get("metadata")).get("labels"))
    return (
        cached.status is not None
        and cached.status.phase == "Profiling"
        and labels.get(v.ROLE_LABEL) == "execution"
    )


def answer(
    request: AdmissionRequest, *, webhook: Webhook, engine: AdmissionEngine, remember: bool = False
) -> ReviewResult:
    """The answer to a decoded request; ``remember``: from and into ``engine.decisions`` (the
    offline review, which reads ``decision.mutated``, does not)."""
    if remember and request.opted_in and engine.decisions.size:
        return _answer_remembered(request, webhook=webhook, engine=engine)
    decision = Decision(allowed=True)
    if request.opted_in:
        decision = decide(request, webhook=webhook, engine=engine)
    elif request.labelled_parent and webhook == "validate" and request.object is not None:
        assert request.parent_kind is not None
        decision.warnings = parent_warnings(request.object, request.parent_kind)
    return _result(request, decision)


def _result(request: AdmissionRequest, decision: Decision) -> ReviewResult:
    patch: list[dict[str, Any]] = []
    if not decision.allowed:
        response = responses.denied(request.uid, "; ".join(str(e) for e in decision.violations))
    else:
        if decision.mutated is not None and request.object is not None:
            patch = diff(request.object, decision.mutated)
        response = responses.patched(request.uid, patch)
    responses.with_warnings(response, decision.warnings)
    outcome: Outcome = "denied" if not decision.allowed else "patched" if patch else "allowed"
    return ReviewResult(
        body=responses.review_envelope(request.api_version, response),
        request=request,
        outcome=outcome,
        decision=decision,
        ops=patch,
    )


def _against(
    request: AdmissionRequest, *, webhook: Webhook, engine: AdmissionEngine
) -> tuple[WorkloadProfile | None, Against]:
    """The profile the request's key names, and everything its decision is made against."""
    profile = _profile(request, webhook=webhook, engine=engine)
    nodes = engine.nodes
    return profile, Against(
        profile,
        engine.calibration.current(),
        nodes.gpu_products(),
        nodes.product_nodes(),
        engine.ctx,
        nodes.product_gpus(),
    )


def _answer_remembered(
    request: AdmissionRequest, *, webhook: Webhook, engine: AdmissionEngine
) -> ReviewResult:
    profile, against = _against(request, webhook=webhook, engine=engine)
    key = key_of(request, webhook, engine.ctx, profile)
    found = engine.decisions.get(key, against, request) if key is not None else None
    if found is not None:
        _note_run(request, found.decision, engine)
        response = {"uid": request.uid, **found.response}
        return ReviewResult(
            body=responses.review_envelope(request.api_version, response),
            request=request,
            outcome=found.outcome,
            decision=found.decision,
            ops_json=found.patch_json,
        )
    result = _result(
        request, _decide(request, webhook=webhook, engine=engine, profile=profile, against=against)
    )
    if key is not None:
        response = result.body["response"]
        engine.decisions.remember(
            key,
            against,
            request,
            decision=result.decision,
            patch=result.patch,
            response=response,
            outcome=result.outcome,
        )
    return result


def _profile_for(key: tuple[str, str], engine: AdmissionEngine, job: str) -> WorkloadProfile | None:
    """The stored profile, unless it says less than this process knows: the controller creates the
    profile first and publishes its status (``Profiling``) in a second write, and a Job admitted in
    between must still be held as a follower of the run this process just admitted (``job`` is the
    name of the object under review)."""
    stored = engine.profiles.get(*key)
    if stored is not None and stored.status is not None:
        return stored
    return engine.runs.get(*key, job=job) or stored


def _signed_role(request: AdmissionRequest, engine: AdmissionEngine) -> str | None:
    meta = as_mapping(as_mapping(request.object).get("metadata"))
    return signed_role(meta, namespace=request.namespace, key=engine.ctx.signing_key)


def _profile(
    request: AdmissionRequest, *, webhook: Webhook, engine: AdmissionEngine
) -> WorkloadProfile | None:
    """The profile the request's key names, or the run this process just admitted for it."""
    key = request.profile_key
    if key is None:
        return None
    # a user's Job under the name of the run remembered is that Job again; KRATOS's own rewrite of it
    # (reinvoked after another webhook) and the validating call after it are not
    again = webhook == "mutate" and request.kind == "Job" and not _signed_role(request, engine)
    return _profile_for(key, engine, request.name if again else "")


def decide(request: AdmissionRequest, *, webhook: Webhook, engine: AdmissionEngine) -> Decision:
    """The policy's decision on an opted-in request, with the profile its key names."""
    profile, against = _against(request, webhook=webhook, engine=engine)
    return _decide(request, webhook=webhook, engine=engine, profile=profile, against=against)


def _note_run(request: AdmissionRequest, decision: Decision, engine: AdmissionEngine) -> None:
    """A profiling rewrite admitted for real: later Jobs of the workload follow its run."""
    if decision.action == "profiling" and request.profile_key is not None and not request.dry_run:
        engine.runs.note(*request.profile_key, request.name)


def _decide(
    request: AdmissionRequest,
    *,
    webhook: Webhook,
    engine: AdmissionEngine,
    profile: WorkloadProfile | None,
    against: Against,
) -> Decision:
    assert request.kind is not None and request.object is not None, "only opted-in requests reach here"
    if webhook == "mutate":
        decision = mutate(
            request.object,
            request.kind,
            operation=request.operation,
            namespace=request.namespace,
            profile=profile,
            node_products=against.products,
            ctx=engine.ctx,
            calibration=against.calibration,
            product_nodes=against.product_nodes,
            product_gpus=against.product_gpus,
        )
        _note_run(request, decision, engine)
        return decision
    return validate(
        request.object,
        request.kind,
        old=request.old_object,
        operation=request.operation,
        namespace=request.namespace,
        profile=profile,
        ctx=engine.ctx,
    )
