"""The online path's remembered decisions (kratos_admit/admission/cache.py): the same answer as a
fresh decision for every object that differs only by name and uid, and never an answer made
against another profile, calibration, config or node set."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from kratos_admit.admission.cache import DecisionCache, key_of
from kratos_admit.admission.engine import AdmissionEngine, ReviewResult, Webhook, answer, review
from kratos_admit.admission.request import admission_review, parse_review
from kratos_admit.decisions.stores import StaticCalibrationStore, StaticNodeStore, StaticProfileStore
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.model.calibration import Calibration, FactorSupport, ProductCalibration
from tests.builders import llama_ddp, make_job, make_pod, make_profile
from tests.harness import CATALOG, DATA, EXAMPLES, MIXED_CLUSTER, apply_patch, engine, make_ctx

WEBHOOKS: tuple[Webhook, ...] = ("mutate", "validate")


class SwappableNodes(StaticNodeStore):
    """A node store whose GPU products change when the test says so (as a watch event would: a new
    set of products and a new count per product)."""

    def set(self, products: frozenset[str]) -> None:
        super().__init__(products)


def body_of(obj: dict[str, Any], *, uid: str, dry_run: bool = True) -> bytes:
    envelope = admission_review(obj, uid=uid, user="alice", dry_run=dry_run)
    return orjson.dumps(envelope)


def fresh(obj: dict[str, Any], eng: AdmissionEngine, webhook: Webhook, *, uid: str) -> ReviewResult:
    """The decision made anew (the offline path, which never remembers)."""
    return answer(parse_review(orjson.loads(body_of(obj, uid=uid))), webhook=webhook, engine=eng)


def renamed(obj: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    meta["name"] = name
    meta["uid"] = f"uid-of-{name}"
    meta["creationTimestamp"] = f"2026-11-27T10:{len(name) % 60:02d}:00Z"
    return out


def same_answer(got: ReviewResult, want: ReviewResult) -> None:
    assert got.body == want.body
    assert got.patch == want.patch
    assert got.outcome == want.outcome
    assert got.decision.action == want.decision.action
    assert got.decision.violations == want.decision.violations
    assert got.decision.ranking_source == want.decision.ranking_source
    assert got.decision.explored == want.decision.explored


def example_objects() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object of the examples and of the project's manifests and recorded reviews, with the
    workload label where it had none (so each is opted in)."""
    paths = sorted(EXAMPLES.glob("*-job.yaml")) + sorted((DATA / "manifests").glob("*.yaml"))
    for path in paths:
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if isinstance(doc, dict) and doc.get("kind") in ("Job", "Pod"):
                doc.setdefault("metadata", {}).setdefault("labels", {}).setdefault(
                    v.WORKLOAD_LABEL, "fixture"
                )
                yield f"{path.name}#{index}", doc
    for path in sorted((DATA / "admissionreviews").glob("*.json")):
        data = json.loads(path.read_text())
        obj = (data.get("request", data) or {}).get("object")
        if (
            isinstance(obj, dict)
            and isinstance(obj.get("metadata"), dict)
            and obj.get("kind") in ("Job", "Pod")
        ):
            obj.setdefault("apiVersion", "batch/v1" if obj["kind"] == "Job" else "v1")
            obj["metadata"].setdefault("labels", {}).setdefault(v.WORKLOAD_LABEL, "fixture")
            yield path.name, obj


def example_engine(**config: Any) -> AdmissionEngine:
    profiles = [
        WorkloadProfile.model_validate(doc)
        for path in sorted((EXAMPLES / "profiles").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    return dataclasses.replace(engine(make_ctx(**config), profiles), decisions=DecisionCache())


@pytest.mark.parametrize("webhook", WEBHOOKS)
def test_every_example_renamed_gets_from_the_cache_the_answer_a_fresh_decision_gives(webhook: Webhook):
    eng = example_engine()
    objects = list(example_objects())
    assert len(objects) > 20
    for label, obj in objects:
        for name in ("first-of-the-array", "second-of-the-array", "x" * 40):
            twin = renamed(obj, name)
            got = review(body_of(twin, uid=f"{label}-{name}"), webhook=webhook, engine=eng)
            same_answer(got, fresh(twin, eng, webhook, uid=f"{label}-{name}"))
    assert eng.decisions.hits >= len(objects), (
        "the renamed twins were answered from the cache",
        eng.decisions.hits,
    )


def test_a_job_array_with_exploration_gets_each_job_its_own_exploring_answer():
    """explorationShare picks Jobs by name: the one hint that reads the name is part of the key."""
    profile = make_profile("vector-add", phase="Ready")
    eng = dataclasses.replace(engine(make_ctx(explorationShare=0.3), [profile]), decisions=DecisionCache())
    job = make_job("array").label(v.WORKLOAD_LABEL, "vector-add").limits({"nvidia.com/gpu": 1}).obj()
    explored = set()
    for index in range(60):
        twin = renamed(job, f"array-{index}")
        got = review(body_of(twin, uid=f"u{index}"), webhook="mutate", engine=eng)
        same_answer(got, fresh(twin, eng, "mutate", uid=f"u{index}"))
        explored.add(got.decision.explored)
    assert len(explored) == 2, "some Jobs of the array explore, the others do not"
    assert eng.decisions.hits >= 50


def new_workload_job() -> dict[str, Any]:
    """A Job of a workload without a profile: the mutating webhook rewrites it for profiling."""
    return (
        make_job("first")
        .label(v.WORKLOAD_LABEL, "new-thing")
        .limits({"nvidia.com/gpu": 1})
        .args("--n", "4")
        .obj()
    )


def test_a_profiling_rewrite_embeds_the_name_so_another_name_is_decided_anew():
    eng = dataclasses.replace(engine(make_ctx()), decisions=DecisionCache())
    job = new_workload_job()
    first = review(body_of(job, uid="a"), webhook="mutate", engine=eng)
    assert first.decision.action == "profiling"
    again = review(body_of(job, uid="b"), webhook="mutate", engine=eng)
    assert eng.decisions.hits == 1 and again.patch == first.patch
    second = renamed(job, "second")
    got = review(body_of(second, uid="c"), webhook="mutate", engine=eng)
    same_answer(got, fresh(second, eng, "mutate", uid="c"))
    assert got.patch != first.patch and eng.decisions.hits == 1
    restored = apply_patch(second, got.patch)
    assert (
        "second" in json.dumps(restored["metadata"]["annotations"])
        or restored["metadata"]["name"] == "second"
    )


def test_a_profiling_rewrite_admitted_for_real_from_the_cache_still_holds_the_followers():
    eng = dataclasses.replace(engine(make_ctx()), decisions=DecisionCache())
    job = new_workload_job()
    review(body_of(job, uid="a", dry_run=True), webhook="mutate", engine=eng)
    hit = review(body_of(job, uid="b", dry_run=False), webhook="mutate", engine=eng)
    assert eng.decisions.hits == 1 and hit.decision.action == "profiling"
    follower = review(body_of(renamed(job, "follower"), uid="c", dry_run=False), webhook="mutate", engine=eng)
    assert follower.decision.action == "hints" and "suspend" in json.dumps(follower.patch)


def hinted_job() -> dict[str, Any]:
    return make_job("array-0").label(v.WORKLOAD_LABEL, "vector-add").limits({"nvidia.com/gpu": 1}).obj()


def twice(
    eng: AdmissionEngine, change: Any, obj: dict[str, Any] | None = None
) -> tuple[ReviewResult, ReviewResult]:
    """The same object reviewed before and after ``change`` (a second name, so a stale entry would
    be served were the change not seen)."""
    obj = obj or hinted_job()
    before = review(body_of(obj, uid="before"), webhook="mutate", engine=eng)
    assert (
        review(body_of(renamed(obj, "array-1"), uid="hit"), webhook="mutate", engine=eng).body["response"][
            "patch"
        ]
        == before.body["response"]["patch"]
    )
    hits = eng.decisions.hits
    eng = change() or eng
    after_obj = renamed(obj, "array-2")
    after = review(body_of(after_obj, uid="after"), webhook="mutate", engine=eng)
    assert eng.decisions.hits == hits, "not served from the entry made before the change"
    same_answer(after, fresh(after_obj, eng, "mutate", uid="after"))
    return before, after


def test_a_changed_profile_is_never_answered_from_the_cache():
    store = StaticProfileStore([make_profile("vector-add", phase="Profiling")])
    eng = AdmissionEngine(ctx=make_ctx(), profiles=store, nodes=SwappableNodes(frozenset(MIXED_CLUSTER)))

    def change() -> None:
        store._index.put(make_profile("vector-add", phase="Ready"))

    before, after = twice(eng, change)
    assert before.body != after.body, "held for the run, then ranked: the test could fail"


def test_a_changed_calibration_is_never_answered_from_the_cache():
    calibration = StaticCalibrationStore()
    eng = AdmissionEngine(
        ctx=make_ctx(explorationShare=0),
        profiles=StaticProfileStore([make_profile("vector-add", phase="Ready")]),
        nodes=SwappableNodes(frozenset(MIXED_CLUSTER)),
        calibration=calibration,
    )
    placed = [CATALOG.placement(label) for label in MIXED_CLUSTER]
    products = sorted({p.product for p in placed if p is not None})

    def change() -> None:  # measured: each product much slower than its catalog figures say, the first most
        calibration.calibration = Calibration(
            {p: ProductCalibration(p, FactorSupport(9.0 - i, 20, 3), FactorSupport(9.0 - i, 20, 3)) for i, p in enumerate(products)}
        )  # fmt: skip

    before, after = twice(eng, change)
    assert before.patch != after.patch, "calibrated figures rank the products anew: the test could fail"


def test_a_changed_config_is_never_answered_from_the_cache():
    eng = dataclasses.replace(
        engine(make_ctx(), [make_profile("vector-add", phase="Ready")]), decisions=DecisionCache()
    )

    def change() -> AdmissionEngine:  # a new context over the same stores and the same cache
        return dataclasses.replace(eng, ctx=make_ctx(schedulerName="another-scheduler"))

    before, after = twice(eng, change)
    assert "another-scheduler" in json.dumps(after.patch) and before.patch != after.patch


def test_a_changed_node_set_is_never_answered_from_the_cache():
    nodes = SwappableNodes(frozenset(MIXED_CLUSTER))
    eng = AdmissionEngine(
        ctx=make_ctx(explorationShare=0),
        profiles=StaticProfileStore([make_profile("vector-add", phase="Ready")]),
        nodes=nodes,
    )

    def change() -> None:
        nodes.set(frozenset(sorted(MIXED_CLUSTER)[:1]))

    before, after = twice(eng, change)
    assert before.patch != after.patch, "fewer products ranked: the test could fail"


def test_a_node_event_that_changes_no_product_or_count_keeps_the_cache():
    nodes = SwappableNodes(frozenset(MIXED_CLUSTER))
    eng = AdmissionEngine(
        ctx=make_ctx(), profiles=StaticProfileStore([make_profile("vector-add", phase="Ready")]), nodes=nodes
    )
    review(body_of(hinted_job(), uid="1"), webhook="mutate", engine=eng)
    nodes.set(frozenset(MIXED_CLUSTER))  # new objects, the same products and counts
    review(body_of(renamed(hinted_job(), "array-9"), uid="2"), webhook="mutate", engine=eng)
    assert eng.decisions.hits == 1


def test_the_cache_keeps_at_most_its_size_and_forgets_the_oldest_first():
    eng = dataclasses.replace(engine(make_ctx()), decisions=DecisionCache(size=3))
    for gpus in range(1, 6):
        job = make_job("j").label(v.WORKLOAD_LABEL, "w").limits({"nvidia.com/gpu": gpus}).obj()
        review(body_of(job, uid=str(gpus)), webhook="validate", engine=eng)
    assert len(eng.decisions) == 3
    oldest = make_job("j").label(v.WORKLOAD_LABEL, "w").limits({"nvidia.com/gpu": 1}).obj()
    review(body_of(oldest, uid="again"), webhook="validate", engine=eng)
    assert eng.decisions.hits == 0
    with pytest.raises(ValueError, match="size must be 0 or more, got -1"):
        DecisionCache(size=-1)


def test_the_cache_keeps_at_most_its_bytes_and_never_an_answer_larger_than_them():
    eng = dataclasses.replace(engine(make_ctx()), decisions=DecisionCache(max_bytes=12_000))
    for gpus in range(1, 6):
        job = make_job("j").label(v.WORKLOAD_LABEL, "w").limits({"nvidia.com/gpu": gpus}).obj()
        review(body_of(job, uid=str(gpus)), webhook="mutate", engine=eng)
        assert 0 < eng.decisions.bytes <= 12_000
    assert 1 <= len(eng.decisions) < 5, "the oldest went to keep within the bytes"
    big = make_job("big").label(v.WORKLOAD_LABEL, "w").limits({"nvidia.com/gpu": 1}).obj()
    big["metadata"]["annotations"] = {"notes.example/text": "x" * 20_000}
    review(body_of(big, uid="big"), webhook="mutate", engine=eng)
    assert all(len(key[4]) < 20_000 for key in eng.decisions._entries), "too large to remember"
    with pytest.raises(ValueError, match="max_bytes must be 0 or more, got -1"):
        DecisionCache(max_bytes=-1)


def test_a_cache_of_size_0_remembers_nothing_and_answers_the_same():
    eng = dataclasses.replace(engine(make_ctx()), decisions=DecisionCache(size=0))
    pod = make_pod("p").label(v.WORKLOAD_LABEL, "w").limits({"nvidia.com/gpu": 1}).obj()
    for uid in ("a", "b"):
        same_answer(
            review(body_of(pod, uid=uid), webhook="mutate", engine=eng), fresh(pod, eng, "mutate", uid=uid)
        )
    assert len(eng.decisions) == 0 and eng.decisions.hits == 0


def test_the_key_leaves_out_exactly_the_identity_the_api_server_stamps():
    ctx = make_ctx()
    pod = make_pod("p").label(v.WORKLOAD_LABEL, "w").limits({"nvidia.com/gpu": 1}).obj()
    request = parse_review(admission_review(pod, uid="1"))
    stamped = renamed(pod, "other")
    stamped["metadata"] |= {
        "generateName": "p-",
        "resourceVersion": "7",
        "generation": 1,
        "managedFields": [{"manager": "kubectl"}],
    }
    assert key_of(request, "mutate", ctx, None) == key_of(
        parse_review(admission_review(stamped, uid="2")), "mutate", ctx, None
    )
    labelled = copy.deepcopy(pod)
    labelled["metadata"]["labels"]["team"] = "a"
    assert key_of(request, "mutate", ctx, None) != key_of(
        parse_review(admission_review(labelled, uid="3")), "mutate", ctx, None
    )
    assert key_of(request, "mutate", ctx, None) != key_of(request, "validate", ctx, None)


def test_a_patch_that_would_carry_an_identity_field_is_not_remembered():
    cache = DecisionCache()
    pod = make_pod("p").label(v.WORKLOAD_LABEL, "w").limits({"nvidia.com/gpu": 1}).obj()
    request = parse_review(admission_review(pod, uid="1"))
    key = key_of(request, "mutate", make_ctx(), None)
    assert key is not None
    eng = engine(make_ctx())
    result = fresh(pod, eng, "mutate", uid="1")
    against = Path  # any object: nothing is stored, so nothing is compared
    for path in ("/metadata", "/metadata/name", "/metadata/generateName", ""):
        cache.remember(key, against, request, decision=result.decision,  # type: ignore[arg-type]
                       patch=[{"op": "add", "path": path, "value": {}}], response={}, outcome="patched")  # fmt: skip
    assert len(cache) == 0


def test_a_gangs_pods_are_named_by_its_job_so_another_name_is_decided_anew():
    """A gang's inter-Pod affinity selects the Pods of its own Job by name: the answer for llama-a is
    never served to llama-b, though the two differ only by name."""
    eng = dataclasses.replace(engine(make_ctx()), decisions=DecisionCache())
    first = review(body_of(llama_ddp().obj(), uid="a"), webhook="mutate", engine=eng)
    again = review(body_of(llama_ddp().obj(), uid="b"), webhook="mutate", engine=eng)
    assert eng.decisions.hits == 1 and again.patch == first.patch
    other = renamed(llama_ddp().obj(), "llama-b")
    got = review(body_of(other, uid="c"), webhook="mutate", engine=eng)
    same_answer(got, fresh(other, eng, "mutate", uid="c"))
    term = apply_patch(other, got.patch)["spec"]["template"]["spec"]["affinity"]["podAffinity"]
    selector = term["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["labelSelector"]
    assert selector == {"matchLabels": {v.JOB_NAME_LABEL: "llama-b"}}
