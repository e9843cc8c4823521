"""The webhook's live stores against the in-process Kubernetes API test double (tests/kube_double.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from aiohttp.test_utils import TestClient, TestServer

from kratos_admit.admission.engine import AdmissionEngine
from kratos_admit.edge.cluster import ClusterNodeStore, ClusterProfileStore
from kratos_admit.webhook.metrics import AdmissionMetrics
from kratos_admit.webhook.server import create_app
from tests.builders import make_job
from tests.harness import NODES, PROFILES, api_for, api_server, eventually, make_ctx, node, profile, review_of
from tests.kube_double import WEBHOOK, KubeDouble


@contextlib.asynccontextmanager
async def stores_running(kube: KubeDouble) -> AsyncIterator[tuple[ClusterProfileStore, ClusterNodeStore]]:
    async with api_server(kube) as server:
        api = api_for(server, "kratos-webhook", identity=WEBHOOK)
        profiles, nodes = ClusterProfileStore(api, get_timeout=0.5), ClusterNodeStore(api)
        for informer in (profiles.informer, nodes.informer):
            informer.watch_timeout = 5
            informer.backoff.cap = 0.2
        tasks = [asyncio.create_task(profiles.run()), asyncio.create_task(nodes.run())]
        try:
            yield profiles, nodes
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await api.close()


def api_calls(kube: KubeDouble) -> int:
    return len([r for r in kube.requests if r.query.get("watch", "").lower() not in ("true", "1")])


async def test_first_sync_then_watch_events():
    kube = KubeDouble()
    kube.put(*PROFILES, profile("vector-add"))
    kube.put(*NODES, node("gpu-a", "NVIDIA-A100-SXM4-80GB"))
    kube.put(*NODES, node("cpu-1", "", gpu=False))
    async with stores_running(kube) as (profiles, nodes):
        await eventually(lambda: profiles.ready() and nodes.ready())
        assert profiles.get("team-a", "vector-add") is not None and len(profiles) == 1
        assert nodes.gpu_products() == {"NVIDIA-A100-SXM4-80GB"}, "only nvidia.com/gpu.present=true nodes"
        kube.put(*PROFILES, profile("nbody", bound="compute"))
        kube.put(*NODES, node("gpu-l", "NVIDIA-L40S"))
        await eventually(
            lambda: profiles.get("team-a", "nbody") is not None and len(nodes.gpu_products()) == 2
        )
        kube.put(*PROFILES, profile("nbody", phase="Failed"))
        await eventually(
            lambda: (
                (p := profiles.get("team-a", "nbody")) is not None
                and p.status is not None
                and p.status.phase == "Failed"
            )
        )
        kube.remove(*PROFILES, "team-a", "nbody-profile")
        kube.remove(*NODES, "", "gpu-l")
        await eventually(
            lambda: (
                profiles.get("team-a", "nbody") is None and nodes.gpu_products() == {"NVIDIA-A100-SXM4-80GB"}
            )
        )


async def test_410_gone_relists():
    kube = KubeDouble()
    kube.put(*PROFILES, profile("vector-add"))
    async with stores_running(kube) as (profiles, _):
        await eventually(profiles.ready)
        kube.put(*PROFILES, profile("late"))
        await eventually(lambda: profiles.get("team-a", "late") is not None)
        kube.down = True  # the watch ends; what happens now is never sent as an event ...
        await asyncio.sleep(0.3)
        kube.remove(*PROFILES, "team-a", "vector-add-profile")
        kube.put(*PROFILES, profile("later"))
        kube.compact()  # ... and the history is gone: reconnecting from the old resourceVersion gets 410
        kube.down = False
        await eventually(lambda: profiles.informer.relists >= 2)
        await eventually(lambda: profiles.get("team-a", "later") is not None)
        assert profiles.get("team-a", "vector-add") is None


async def test_api_going_away_keeps_the_cache_answering_and_ready():
    kube = KubeDouble()
    kube.put(*PROFILES, profile("vector-add"))
    async with stores_running(kube) as (profiles, nodes):
        await eventually(lambda: profiles.ready() and nodes.ready())
        kube.down = True
        kube.compact()
        await asyncio.sleep(1.0)
        assert profiles.ready() and nodes.ready()
        assert profiles.get("team-a", "vector-add") is not None
        kube.down = False
        kube.put(*PROFILES, profile("after-outage"))
        await eventually(lambda: profiles.get("team-a", "after-outage") is not None)


async def test_a_miss_does_one_get_and_a_hit_does_none():
    kube = KubeDouble()
    async with stores_running(kube) as (profiles, _):
        await eventually(profiles.ready)
        kube.down = True  # the watch will not deliver what is written next ...
        kube.compact()
        kube.down = False
        kube.put(*PROFILES, profile("just-written"))
        gets_before = len(kube.calls("GET", r"/workloadprofiles/just-written-profile$"))
        assert profiles.get("team-a", "just-written") is None
        await profiles.refresh("team-a", "just-written")  # ... but the direct GET does
        assert profiles.get("team-a", "just-written") is not None
        assert len(kube.calls("GET", r"/workloadprofiles/just-written-profile$")) == gets_before + 1
        await profiles.refresh("team-a", "missing")
        await profiles.refresh("team-a", "missing")  # negative result remembered for a moment
        assert len(kube.calls("GET", r"/workloadprofiles/missing-profile$")) == 1


async def test_server_path_hit_makes_no_api_call_and_miss_makes_one():
    kube = KubeDouble()
    kube.put(*PROFILES, profile("vector-add"))
    async with stores_running(kube) as (profiles, nodes):
        await eventually(lambda: profiles.ready() and nodes.ready())
        app = create_app(
            AdmissionEngine(make_ctx(), profiles, nodes), metrics=AdmissionMetrics(), max_body_bytes=1 << 20
        )
        async with TestClient(TestServer(app)) as http:
            await asyncio.sleep(0.2)
            before = api_calls(kube)
            for _ in range(20):
                response = await http.post(
                    "/mutate",
                    data=json.dumps(review_of(make_job().obj())),
                    headers={"Content-Type": "application/json"},
                )
                assert (await response.json())["response"]["patchType"] == "JSONPatch"
            assert api_calls(kube) == before, "cache hits answer from memory"
            response = await http.post(
                "/mutate",
                data=json.dumps(review_of(make_job("other").obj())),
                headers={"Content-Type": "application/json"},
            )
            assert response.status == 200
            assert api_calls(kube) == before + 1, "one GET for the miss"
            kube.put(*PROFILES, profile("other"))
            await eventually(lambda: profiles.get("team-a", "other") is not None)


async def test_readiness_waits_for_the_first_sync():
    kube = KubeDouble()
    kube.down = True
    async with stores_running(kube) as (profiles, nodes):
        await asyncio.sleep(0.5)
        assert not profiles.ready() and not nodes.ready()
        app = create_app(AdmissionEngine(make_ctx(), profiles, nodes), metrics=AdmissionMetrics(), max_body_bytes=1 << 20,
                         ready=lambda: profiles.ready() and nodes.ready())  # fmt: skip
        async with TestClient(TestServer(app)) as http:
            assert (await http.get("/readyz")).status == 503
            kube.down = False
            await eventually(lambda: profiles.ready() and nodes.ready())
            assert (await http.get("/readyz")).status == 200


async def test_the_webhooks_copy_leaves_out_the_uids_the_controller_counted():
    """countedRuns and countedTelemetry (up to 256 Pod uids each) are the controller's, never read by
    admission, and so is all of the metadata but the name, namespace and resourceVersion (the
    managedFields above all): the webhook's cached profile holds none of them, from the list, a
    watch event and a GET, and its decisions are those of the whole profile."""
    from kratos_admit.admission.engine import answer
    from kratos_admit.admission.request import parse_review
    from kratos_admit.decisions.stores import StaticNodeStore, StaticProfileStore
    from kratos_admit.domain.profile import WorkloadProfile

    def mature(workload: str) -> dict[str, object]:
        obj = profile(workload)
        obj["status"] |= {
            "observations": [{"product": "NVIDIA-A100-SXM4-80GB", "runs": 3, "meanSeconds": "41.5"}],
            "countedRuns": [f"pod-uid-{i}" for i in range(256)],
            "countedTelemetry": [f"pod-uid-{i}" for i in range(256)],
            "observedRuns": 256,
        }
        obj["metadata"] |= {
            "uid": f"uid-{workload}",
            "generation": 1,
            "labels": {"team": "a"},
            "managedFields": [
                {"manager": "kratos-controller", "operation": "Update", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:observations": {}, "f:countedRuns": {}}}}
            ],
        }  # fmt: skip
        return obj

    kube = KubeDouble()
    kube.put(*PROFILES, mature("listed"))
    kube.put(*NODES, node("gpu-a", "NVIDIA-A100-SXM4-80GB"))
    async with stores_running(kube) as (profiles, nodes):
        await eventually(lambda: profiles.ready() and nodes.ready())
        kube.put(*PROFILES, mature("watched"))
        await eventually(lambda: profiles.get("team-a", "watched") is not None)
        kube.put(*PROFILES, mature("fetched"))
        await profiles.refresh("team-a", "fetched")  # before the watch delivers it, or after: the same
        for workload in ("listed", "watched", "fetched"):
            cached = profiles.get("team-a", workload)
            assert cached is not None and cached.status is not None
            assert cached.status.counted_runs == [] and cached.status.counted_telemetry == []
            assert cached.metadata.model_extra == {}, "no managedFields, uid, labels"
            assert (cached.metadata.name, cached.metadata.namespace) == (f"{workload}-profile", "team-a")
            stored = kube.get(*PROFILES, "team-a", f"{workload}-profile")  # as the API server has it
            assert stored is not None
            assert cached.metadata.resource_version == stored["metadata"]["resourceVersion"]
            assert cached.status.observed_runs == 256 and len(cached.status.observations) == 1
            whole = WorkloadProfile.model_validate(stored)
            assert len(whole.status.counted_runs) == 256  # type: ignore[union-attr]
            job = make_job("train", "team-a").label("gpu.scheduler.io/workload", workload).obj()
            decisions = [
                answer(
                    parse_review(review_of(job)),
                    webhook="mutate",
                    engine=AdmissionEngine(
                        ctx=make_ctx(), profiles=store, nodes=StaticNodeStore(nodes.gpu_products())
                    ),
                )
                for store in (profiles, StaticProfileStore([whole]))
            ]
            assert decisions[0].decision.action == "hints"
            assert decisions[0].body == decisions[1].body and decisions[0].patch == decisions[1].patch


# --- issue 51: a relist in pages, Nodes as metadata --------------------------------------------------


def lists_of(kube: KubeDouble, path: str) -> list[dict[str, str]]:
    return [r.query for r in kube.requests if r.path == path and r.method == "GET" and "watch" not in r.query]


async def test_a_relist_is_read_in_pages_each_folded_before_the_next_is_read():
    """limit/continue: each page's profiles are in the index before the next page is asked for, so
    neither the whole list as sent nor a second copy of the cache is ever held."""
    kube = KubeDouble()
    for i in range(7):
        kube.put(*PROFILES, profile(f"w{i}"))
    seen: list[int] = []
    async with stores_running(kube) as (profiles, _):
        profiles.informer.page_size = 2
        fold = profiles.informer.fold.page

        def page(items: list[dict[str, object]]) -> None:
            seen.append(len(profiles))  # what the index held when this page came
            fold(items)

        profiles.informer.fold.page = page  # type: ignore[method-assign]
        await eventually(profiles.ready)
        assert len(profiles) == 7
    listed = lists_of(kube, "/apis/gpu.scheduler.io/v1alpha1/workloadprofiles")
    assert [q.get("limit") for q in listed] == ["2"] * 4
    assert [bool(q.get("continue")) for q in listed] == [False, True, True, True]
    assert seen == [0, 2, 4, 6]


async def test_a_relist_keeps_answering_from_the_cache_and_drops_what_it_did_not_name():
    """Mark and sweep: while a relist is read, every profile held before it answers; at its end the
    one deleted while the watch was away is gone and the rest are the list's."""
    kube = KubeDouble()
    for i in range(5):
        kube.put(*PROFILES, profile(f"w{i}"))
    async with stores_running(kube) as (profiles, _):
        await eventually(profiles.ready)
        profiles.informer.page_size = 2
        answering: list[bool] = []
        fold = profiles.informer.fold.page

        def page(items: list[dict[str, object]]) -> None:
            answering.append(all(profiles.get("team-a", f"w{i}") is not None for i in range(1, 5)))
            fold(items)

        profiles.informer.fold.page = page  # type: ignore[method-assign]
        kube.down = True
        await asyncio.sleep(0.3)
        kube.remove(*PROFILES, "team-a", "w0-profile")
        kube.compact()
        kube.down = False
        await eventually(lambda: profiles.informer.relists >= 2)
        assert answering and all(answering)
        assert profiles.get("team-a", "w0") is None and len(profiles) == 4


async def test_a_continue_token_past_compaction_starts_the_list_over():
    """The real server refuses a continue token older than etcd's compaction (410 Expired): the
    informer lists again from the first page, and the cache ends with every profile."""
    kube = KubeDouble()
    for i in range(5):
        kube.put(*PROFILES, profile(f"w{i}"))
    async with stores_running(kube) as (profiles, _):
        profiles.informer.page_size = 2
        fold = profiles.informer.fold.page
        compacted: list[bool] = []

        def page(items: list[dict[str, object]]) -> None:
            if not compacted:
                compacted.append(True)
                kube.put(*PROFILES, profile("late"))
                kube.compact()  # the next page's token now points before the compaction
            fold(items)

        profiles.informer.fold.page = page  # type: ignore[method-assign]
        await eventually(profiles.ready)
        assert len(profiles) == 6 and profiles.get("team-a", "late") is not None
        assert profiles.informer.relists == 1, "only a list read to its end counts"
    continued = [
        q for q in lists_of(kube, "/apis/gpu.scheduler.io/v1alpha1/workloadprofiles") if "continue" in q
    ]
    assert len(continued) >= 3  # the refused one, then the second list's


async def test_nodes_are_listed_and_watched_as_metadata_only():
    """The Node store asks for PartialObjectMetadata (client-go's metadata informers' form): labels
    carry the GPU product, and a Node's status (images, conditions) never crosses the wire."""
    kube = KubeDouble()
    big = node("gpu-a", "NVIDIA-A100-SXM4-80GB")
    big["status"] = {
        "images": [{"names": [f"registry.example/image-{i}:v1"], "sizeBytes": 1 << 30} for i in range(10)]
    }
    kube.put(*NODES, big)
    kube.put(*NODES, node("gpu-b", "NVIDIA-L40S"))
    async with stores_running(kube) as (_, nodes):
        nodes.informer.page_size = 1
        await eventually(nodes.ready)
        assert nodes.gpu_products() == {"NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"}
        kube.put(*NODES, node("gpu-c", "NVIDIA-H100-80GB-HBM3"))
        kube.remove(*NODES, "", "gpu-b")
        await eventually(lambda: nodes.gpu_products() == {"NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"})
        assert dict(nodes.product_nodes()) == {"NVIDIA-A100-SXM4-80GB": 1, "NVIDIA-H100-80GB-HBM3": 1}
    asked = [r for r in kube.requests if r.path == "/api/v1/nodes"]
    assert {("watch" in r.query, r.accept.split(",")[0]) for r in asked} == {
        (False, "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
        (True, "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
    }
    assert [q.get("limit") for q in lists_of(kube, "/api/v1/nodes")][:2] == ["1", "1"]


async def test_the_double_answers_metadata_only_requests_as_the_real_server_does():
    """What the real kube-apiserver 1.28.7 answered to curl: a list as PartialObjectMetadataList, a
    list asking for the item form refused with 406 even with JSON named after it, a continue token
    from before a compaction refused with 410 Expired."""
    kube = KubeDouble()
    kube.put(*NODES, node("gpu-a", "NVIDIA-A100-SXM4-80GB"))
    kube.put(*NODES, node("gpu-b", "NVIDIA-L40S"))
    async with api_server(kube) as server:
        api = api_for(server)
        try:
            partial = "application/json;as=PartialObjectMetadata{};g=meta.k8s.io;v=v1, application/json"
            listed = await api.call_api(
                "/api/v1/nodes", "GET", query_params=[("limit", 1)], header_params={"Accept": partial.format("List")},
                auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
            )  # fmt: skip
            body = json.loads(await listed.read())
            assert body["kind"] == "PartialObjectMetadataList" and body["metadata"]["continue"]
            assert [i["kind"] for i in body["items"]] == ["PartialObjectMetadata"]
            assert "status" not in body["items"][0] and body["items"][0]["metadata"]["labels"]
            refused = await api.call_api(
                "/api/v1/nodes", "GET", header_params={"Accept": partial.format("")},
                auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
            )  # fmt: skip
            assert refused.status == 406
            assert (
                "you requested PartialObjectMetadata, but the requested object is a list"
                in (json.loads(await refused.read())["message"])
            )
            kube.compact()
            expired = await api.call_api(
                "/api/v1/nodes", "GET", query_params=[("limit", 1), ("continue", body["metadata"]["continue"])],
                auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
            )  # fmt: skip
            assert expired.status == 410
            assert json.loads(await expired.read())["reason"] == "Expired"
        finally:
            await api.close()


# --- issue 51: every profile held packed, the few read last held parsed ------------------------------


def test_the_packed_index_answers_as_the_parsed_one_and_keeps_only_the_last_read_parsed():
    """Each profile held as its model's JSON; a read parses it once and keeps the parsed model among
    the ``parsed`` most recently read. What a read returns equals what was put, whether it was still
    parsed or parsed anew; a profile renamed for the same workload replaces the old one."""
    from kratos_admit.decisions.stores import PackedProfileIndex, ProfileIndex
    from kratos_admit.domain.profile import WorkloadProfile, as_read

    def mature(i: int) -> WorkloadProfile:
        obj = profile(f"w{i}")
        obj["status"] |= {
            "observations": [{"product": "NVIDIA-L40S", "runs": i + 1, "meanSeconds": f"{40 + i}.5"}],
            "observedRuns": i + 1,
        }
        obj["metadata"] |= {"resourceVersion": str(100 + i)}
        return WorkloadProfile.model_validate(as_read(obj))

    models = [mature(i) for i in range(10)]
    packed, plain = PackedProfileIndex(parsed=3), ProfileIndex()
    for model in models:
        packed.put(model)
        plain.put(model)
    assert len(packed) == len(plain) == 10 and packed.names() == plain.names()
    assert packed.get("team-a", "w9") is models[9], "the last put is still parsed"
    again = packed.get("team-a", "w0")
    assert again is not None and again is not models[0], "fell out of the parsed few: parsed anew"
    assert again == models[0] and again.status == models[0].status
    assert packed.get("team-a", "w0") is again, "and now kept parsed"
    for i, model in enumerate(models):
        assert packed.get("team-a", f"w{i}") == plain.get("team-a", f"w{i}") == model
    assert len(packed._parsed) == 3, "never more than the parsed few"
    assert packed.profiles() == plain.profiles()

    renamed = mature(4).model_copy(
        update={"metadata": models[4].metadata.model_copy(update={"name": "other"})}
    )
    for index in (packed, plain):
        index.put(renamed)
        index.remove("team-a", models[4].metadata.name)  # the old name's delete comes after: the new stays
        found = index.get("team-a", "w4")
        assert found is not None and found.metadata.name == "other" and len(index) == 10
        index.remove("team-a", "other")
        assert index.get("team-a", "w4") is None and len(index) == 9
    assert packed.get("team-a", "absent") is None


async def test_a_profiles_managed_fields_name_its_status_as_one_field():
    """The API server lists every profile with its managedFields; at 20,000 profiles they were 22 MB
    of the webhook's 69 MB relist (issue 59), most of it one field per key of the status and of the
    maps in it. The CRD marks the status atomic, so it is one field (the real 1.28.7 server: 394
    bytes of managedFields a profile, 870 before), and the double keeps field sets as
    structured-merge-diff does."""
    from kratos_admit.domain import vocabulary as v
    from kratos_controller.kube_io import KubeIO
    from tests.kube_double import CONTROLLER

    status = {
        "phase": "Ready", "boundType": "memory",
        "metrics": {"achievedOccupancy": "78.21", "smThroughput": "12.56", "memoryThroughput": "81.40",
                    "l2Throughput": "30.22", "dramThroughput": "80.95", "kernelCount": "3", "gpuTimeNs": "184320"},
        "timeShares": {"tensor": "0.02", "fp32": "0.11", "fp64": "0.00", "memory": "0.81", "latency": "0.06"},
        "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "computeCapability": "9.0"},
        "observations": [{"product": "NVIDIA-H100-80GB-HBM3", "runs": 40, "meanSeconds": "100.5"}],
        "observedRuns": 40, "countedRuns": ["run-uid-1"],
    }  # fmt: skip
    shares = {
        "product": "NVIDIA-H100-80GB-HBM3", "runs": 40, "products": 3, "updatedAt": "2026-11-22T10:00:00Z",
        "timeShares": {"tensor": "0.0213", "fp32": "0.1100", "fp64": "0.0000", "memory": "0.8103", "latency": "0.0584"},
        "figures": {"NVIDIA-A100-SXM4-80GB": 1.234, "NVIDIA-L4": 0.31},
        "smThroughput": 12.56, "memoryThroughput": 81.4, "fp32Tflops": 51.2, "bandwidthGBs": 3350.0,
    }  # fmt: skip
    kube = KubeDouble()
    async with api_server(kube) as server:
        api = api_for(server, "kratos-controller", identity=CONTROLLER)
        try:
            custom = KubeIO(api).custom
            body = {k: val for k, val in profile("stream").items() if k != "status"}
            await custom.create_namespaced_custom_object(v.GROUP, v.VERSION, "team-a", v.PROFILE_PLURAL, body)
            await custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]  # as PublishProfile writes a result
                v.GROUP, v.VERSION, "team-a", v.PROFILE_PLURAL, "stream-profile",
                [{"op": "add", "path": "/status", "value": status}], _content_type="application/json-patch+json",
            )  # fmt: skip
            await KubeIO(api).patch_profile_status("team-a", "stream-profile", {"calibratedShares": shares})
        finally:
            await api.close()
    stored = kube.get(*PROFILES, "team-a", "stream-profile")
    assert stored is not None and stored["status"]["calibratedShares"] == shares, "the maps are kept whole"
    [entry] = [e for e in stored["metadata"]["managedFields"] if e.get("subresource") == "status"]
    assert entry["fieldsV1"] == {"f:status": {}}, "the status is one field"
    size = len(json.dumps(stored["metadata"]["managedFields"], separators=(",", ":")))
    assert size < 400, size  # 371 bytes; 1,063 with every key of the status and its maps a field
