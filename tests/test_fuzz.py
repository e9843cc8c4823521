"""Property: whatever AdmissionReview arrives, the server answers 200 or 400 (never 500) and stays up."""

from __future__ import annotations

import asyncio
import copy
import json
import os
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kratos_admit.domain import vocabulary as v
from kratos_admit.webhook.metrics import AdmissionMetrics
from kratos_admit.webhook.server import create_app
from tests.builders import make_job, make_pod, make_profile
from tests.harness import engine, make_ctx

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)

BASES = [
    make_job().obj(),
    make_pod().obj(),
    make_job().pod_annotate("gpu-fraction", "0.5").no_resources().obj(),
    make_job().dra_claim("gpu", "t").annotate(v.MIN_CC_ANNOTATION, "8.6").obj(),
    make_pod()
    .limits({"nvidia.com/mig-1g.5gb": 1})
    .add_container("init", {v.GPU_RESOURCE: 2}, init=True)
    .obj(),
]
KINDS = [
    {"group": "batch", "version": "v1", "kind": "Job"},
    {"group": "", "version": "v1", "kind": "Pod"},
    {"group": "apps", "version": "v1", "kind": "Deployment"},
]
INTERESTING_KEYS = [
    "metadata",
    "labels",
    "annotations",
    "spec",
    "template",
    "containers",
    "initContainers",
    "resources",
    "limits",
    "requests",
    "command",
    "affinity",
    v.WORKLOAD_LABEL,
    v.HINTS_ANNOTATION,
    v.SIGNATURE_ANNOTATION,
]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            paths += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            paths += _paths(value, (*prefix, i))
    return paths


@st.composite
def mutated_objects(draw: st.DrawFn) -> Any:
    obj = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_paths(obj)))
        if not path:
            return draw(json_values)
        parent = obj
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.booleans()) and isinstance(parent, dict):
            parent.pop(path[-1], None)
            parent[draw(st.sampled_from(INTERESTING_KEYS))] = draw(json_values)
        else:
            parent[path[-1]] = draw(json_values)
    return obj


def _mostly(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> Any:
    """A well-formed value 9 times in 10, so most reviews reach the decision path; else anything."""
    return draw(valid) if draw(st.integers(0, 9)) else draw(json_values)


@st.composite
def reviews(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 19)) == 0:
        return draw(st.binary(max_size=64))
    request: dict[str, Any] = {
        "uid": _mostly(draw, st.text(min_size=1, max_size=8)),
        "operation": _mostly(draw, st.sampled_from(["CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT"])),
        "kind": _mostly(draw, st.sampled_from(KINDS)),
        "namespace": _mostly(draw, st.sampled_from(["team-a", "team-b"])),
        "object": mutated_objects(),
        "subResource": _mostly(draw, st.sampled_from(["", "", "", "status", "scale"])),
        "dryRun": _mostly(draw, st.booleans()),
    }
    request["object"] = draw(request["object"])
    if draw(st.booleans()):
        request["oldObject"] = draw(mutated_objects() | st.none())
    for key in list(request):
        if draw(st.integers(0, 19)) == 0:
            del request[key]
    review: Any = {
        "apiVersion": _mostly(draw, st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])),
        "kind": _mostly(draw, st.just("AdmissionReview")),
        "request": request if draw(st.integers(0, 19)) else draw(json_values),
    }
    return json.dumps(review).encode()


def test_random_and_mutated_reviews_never_get_a_500():
    loop = asyncio.new_event_loop()
    app = create_app(engine(make_ctx(), [make_profile()]), metrics=AdmissionMetrics(), max_body_bytes=1 << 20)

    async def start() -> TestClient[web.Request, web.Application]:
        started = TestClient(TestServer(app))
        await started.start_server()
        return started

    client = loop.run_until_complete(start())
    seen: dict[int, int] = {}

    async def post(path: str, body: bytes) -> tuple[int, Any]:
        response = await client.post(path, data=body, headers={"Content-Type": "application/json"})
        return response.status, await response.json()

    @settings(
        max_examples=int(os.environ.get("KRATOS_FUZZ_EXAMPLES", "400")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(body=reviews(), path=st.sampled_from(["/mutate", "/validate"]))
    def check(body: bytes, path: str) -> None:
        status, answer = loop.run_until_complete(post(path, body))
        seen[status] = seen.get(status, 0) + 1
        assert status in (200, 400), (status, answer, body[:300])
        if status == 400:
            assert set(answer) == {"error"}
        else:
            response = answer["response"]
            assert response["uid"] == json.loads(body)["request"]["uid"]
            assert isinstance(response["allowed"], bool)
            if not response["allowed"]:
                assert response["status"]["code"] == 403 and response["status"]["message"]

    try:
        check()
        health = loop.run_until_complete(client.get("/healthz"))
        assert health.status == 200, "the server is still up"
        assert seen.get(200, 0) > 50 and seen.get(400, 0) > 20, seen
    finally:
        loop.run_until_complete(client.close())
        loop.close()
