"""The controller's telemetry (DESIGN "Telemetry profiles") through the API double, which enforces
the install's RBAC, with a Prometheus that answers the HTTP API from dcgm-exporter-shaped samples:
runs of any owner become evidence; failures never make a profile and never delay other work."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.model.telemetry import (
    DRAM_ACTIVE,
    GR_ENGINE_ACTIVE,
    PIPE_FP32_ACTIVE,
    PIPE_TENSOR_ACTIVE,
    SM_ACTIVE,
)
from tests.builders import PodBuilder, make_job, make_pod
from tests.harness import (
    DATA,
    JOBS,
    MEMORY_BOUND,
    NODES,
    PODS,
    PROFILES,
    DcgmGpu,
    FakePrometheus,
    api_for,
    api_server,
    controller_running,
    dcgm_exposition,
    events_of,
    eventually,
    node,
    opted_in_cluster,
    profile,
    prometheus_serving,
    runner_summary,
    runner_summary_failed,
    seed_finished,
    status_of,
    webhook_serving,
)
from tests.kube_double import KubeDouble

A100 = "NVIDIA-A100-SXM4-80GB"


def telemetry_config(url: str, **more: Any) -> Config:
    return Config.model_validate({"telemetry": {"prometheusURL": url, **more}})


def gpu_pod(name: str, workload: str = "infer", namespace: str = "team-a") -> PodBuilder:
    return make_pod(name, namespace).label(v.WORKLOAD_LABEL, workload)


def finished_at(minutes_ago: float) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


events = events_of


async def test_a_bare_pods_run_makes_a_ready_profile_from_telemetry():
    kube = KubeDouble()
    kube.put(*NODES, node("gpu-0", A100))
    pod = kube.put(
        *PODS, gpu_pod("infer-0").ran("gpu-0", "2026-11-25T07:00:00Z", "2026-11-25T07:10:00Z").obj()
    )
    text = dcgm_exposition(
        [
            DcgmGpu(0, "GPU-a", "team-a", "infer-0", counters=MEMORY_BOUND),
            DcgmGpu(1, "GPU-b", counters=MEMORY_BOUND),
        ]
    )
    fake = FakePrometheus().load_text(text)
    async with api_server(kube) as server, prometheus_serving(fake) as url:
        async with controller_running(server, config=telemetry_config(url)) as controller:
            status = await eventually(lambda: status_of(kube).get("telemetry") and status_of(kube))
            assert (status["phase"], status["source"], status["boundType"]) == (
                "Ready",
                "telemetry",
                "memory",
            )
            assert status["metrics"]["memoryThroughput"] == "80.00" and status["gpu"] == {"product": A100}
            assert status["timeShares"] == {  # DRAM at its saturation (0.8) the whole run
                "tensor": "0.00",
                "fp32": "0.00",
                "fp64": "0.00",
                "memory": "1.00",
                "latency": "0.00",
            }
            assert status["telemetry"] == [
                {
                    "product": A100,
                    "runs": 1,
                    "seconds": "600",  # one GPU (GPU-b holds no Pod), 600 s
                    "counters": {
                        DRAM_ACTIVE: "0.8",
                        GR_ENGINE_ACTIVE: "0.97",
                        PIPE_FP32_ACTIVE: "0.15",
                        PIPE_TENSOR_ACTIVE: "0",
                        SM_ACTIVE: "0.95",
                    },
                }
            ]
            assert status["countedTelemetry"] == [pod["metadata"]["uid"]]
            [ready] = await eventually(lambda: events(kube, "ProfileReady"))
            assert ready["regarding"]["kind"] == "WorkloadProfile" and "from DCGM telemetry" in ready["note"]
            assert controller.metrics.telemetry_queries.labels("ok")._value.get() == 1
            end = dt.datetime(2026, 11, 25, 7, 10, tzinfo=dt.UTC).timestamp()
            assert {q["time"] for q in fake.queries} == {f"{end:.3f}"}
            assert all("[600s]" in q["query"] for q in fake.queries)
        async with controller_running(server, config=telemetry_config(url), agent="controller-restarted"):
            await eventually(lambda: kube.calls("GET", r"/workloadprofiles/infer-profile$"))
            asked = len(fake.queries)
            kube.put(*PODS, pod)  # a replayed event after the restart: counted once, never asked again
            await eventually(lambda: len(kube.calls("GET", r"/workloadprofiles/infer-profile$")) >= 2)
            assert len(fake.queries) == asked and status_of(kube)["telemetry"][0]["runs"] == 1


async def test_a_deployment_pod_running_past_its_window_adds_telemetry_and_nsight_compute_keeps_precedence():
    kube = KubeDouble()
    kube.put(*NODES, node("gpu-0", A100))
    kube.put(*PROFILES, profile("web", bound="compute"))
    # the owner, live: the double's garbage collector deletes Pods whose owners are gone
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web-5d9c", "namespace": "team-a", "uid": "uid-web-5d9c"},
    }
    kube.put("apis/apps/v1", "replicasets", replicaset)
    started = finished_at(minutes_ago=5)
    pods = [
        gpu_pod(f"web-5d9c-{i}", "web").owned_by("ReplicaSet", "web-5d9c").ran("gpu-0", started).obj()
        for i in range(2)
    ]
    gpus = [
        DcgmGpu(
            i,
            f"GPU-{i}",
            "team-a",
            f"web-5d9c-{i}",
            counters=((DRAM_ACTIVE, 0.2), (PIPE_TENSOR_ACTIVE, 0.9), (GR_ENGINE_ACTIVE, 0.99)),
        )
        for i in range(2)
    ]
    fake = FakePrometheus().load_text(dcgm_exposition(gpus))
    async with api_server(kube) as server, prometheus_serving(fake) as url:
        for pod in pods:
            kube.put(*PODS, pod)
        async with controller_running(server, config=telemetry_config(url, windowSeconds=60)):
            await eventually(lambda: (status_of(kube, "web").get("telemetry") or [{}])[0].get("runs") == 2)
            status = status_of(kube, "web")
            assert (status["boundType"], status["metrics"]["smThroughput"]) == ("compute", "12.0"), "kept"
            assert "source" not in status and status["telemetry"][0]["seconds"] == "120"  # 2 Pods x 60 s


async def test_a_failing_prometheus_makes_no_profile_says_so_once_and_is_retried():
    kube = KubeDouble()
    kube.put(*NODES, node("gpu-0", A100))
    kube.put(*PODS, gpu_pod("infer-0").ran("gpu-0", "2026-11-25T07:00:00Z", "2026-11-25T07:10:00Z").obj())
    body = '{"status":"error","errorType":"unavailable","error":"too many queries"}'
    gpu = DcgmGpu(0, "GPU-a", "team-a", "infer-0", counters=MEMORY_BOUND)
    fake = FakePrometheus(fail=(503, body)).load_text(dcgm_exposition([gpu]))
    async with (
        api_server(kube) as server,
        prometheus_serving(fake) as url,
        controller_running(server, config=telemetry_config(url)) as controller,
    ):
        assert controller.telemetry is not None
        controller.telemetry.retry_base = 0.05
        errors = controller.metrics.telemetry_queries.labels("error")
        await eventually(lambda: errors._value.get() >= 3)
        assert kube.get(*PROFILES, "team-a", "infer-profile") is None, "no profile from a failed query"
        [event] = events(kube, "TelemetryUnavailable")
        assert event["regarding"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": "team-a",
            "name": "infer-0",
            "uid": "uid-infer-0",
        }
        assert event["note"] == f"{url}: HTTP 503: unavailable: too many queries"
        assert event["type"] == "Warning"
        fake.fail = None
        status = await eventually(lambda: status_of(kube).get("telemetry") and status_of(kube))
        assert status["source"] == "telemetry" and controller.metrics.reconcile_errors._value.get() == 0


async def test_a_gpu_without_profiling_counters_is_named_in_an_event_and_makes_no_profile():
    kube = KubeDouble()
    kube.put(*NODES, node("workstation-3", "NVIDIA-GeForce-RTX-4090"))
    pod = gpu_pod("render-job-8xq4t", "render", "team-e").ran(
        "workstation-3", "2026-11-25T07:00:00Z", "2026-11-25T07:10:00Z"
    )
    kube.put(*PODS, pod.obj())
    fake = FakePrometheus().load(DATA / "dcgm" / "geforce-no-profiling-counters.txt")
    async with (
        api_server(kube) as server,
        prometheus_serving(fake) as url,
        controller_running(server, config=telemetry_config(url)) as controller,
    ):
        [event] = await eventually(lambda: events(kube, "TelemetryUnavailable"))
        assert (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, DCGM_FI_PROF_DRAM_ACTIVE"
            in event["note"]
        )
        assert url in event["note"] and "team-e/render-job-8xq4t" in event["note"]
        assert controller.metrics.telemetry_queries.labels("incomplete")._value.get() == 1
        assert kube.get(*PROFILES, "team-e", "render-profile") is None


async def test_a_slow_prometheus_never_delays_a_profiling_run_or_a_release():
    kube = KubeDouble()
    kube.put(*NODES, node("gpu-0", A100))
    kube.put(*PODS, gpu_pod("infer-0").ran("gpu-0", "2026-11-25T07:00:00Z", "2026-11-25T07:10:00Z").obj())
    fake = FakePrometheus(delay=30.0)
    async with (
        api_server(kube) as server,
        prometheus_serving(fake) as url,
        controller_running(server, config=telemetry_config(url, timeoutSeconds=20)),
    ):
        await eventually(lambda: fake.queries)
        seed_finished(kube, "vector-add", runner_summary())
        published = await eventually(lambda: status_of(kube, "vector-add").get("phase") == "Ready", timeout=5)
        assert published and kube.get(*PROFILES, "team-a", "infer-profile") is None


async def test_a_jobs_run_without_a_profile_reports_on_the_job():
    kube = KubeDouble()
    kube.put(*NODES, node("workstation-3", "NVIDIA-GeForce-RTX-4090"))
    job = kube.put(*JOBS, make_job("render", "team-e").obj())
    pod = (
        gpu_pod("render-job-8xq4t", "render", "team-e")
        .label("job-name", "render")
        .ran("workstation-3", "2026-11-25T07:00:00Z", "2026-11-25T07:10:00Z")
        .obj()
    )
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "render",
            "uid": job["metadata"]["uid"],
            "controller": True,
        }
    ]
    kube.put(*PODS, pod)
    fake = FakePrometheus().load(DATA / "dcgm" / "geforce-no-profiling-counters.txt")
    async with (
        api_server(kube) as server,
        prometheus_serving(fake) as url,
        controller_running(server, config=telemetry_config(url)),
    ):
        [event] = await eventually(lambda: events(kube, "TelemetryUnavailable"))
        assert (event["regarding"]["kind"], event["regarding"]["name"]) == ("Job", "render")
        assert "DCGM_FI_PROF_DRAM_ACTIVE" in event["note"]


async def test_a_profile_made_meanwhile_is_never_overwritten_and_the_run_folds_into_it():
    """The profile was absent when the controller read it, and a profiling run's Profiling phase
    appeared before the telemetry profile was created: the create finds it there and leaves it
    alone, and the next attempt folds the run into it."""
    kube = KubeDouble()
    kube.put(*NODES, node("gpu-0", A100))
    kube.put(*PODS, gpu_pod("infer-0").ran("gpu-0", "2026-11-25T07:00:00Z", "2026-11-25T07:10:00Z").obj())
    fake = FakePrometheus().load_text(
        dcgm_exposition([DcgmGpu(0, "GPU-a", "team-a", "infer-0", counters=MEMORY_BOUND)])
    )
    async with (
        api_server(kube) as server,
        prometheus_serving(fake) as url,
        controller_running(server, config=telemetry_config(url)) as controller,
    ):
        original_get = controller.io.get_profile
        reads = 0

        async def absent_then_made(namespace: str, name: str) -> dict[str, Any] | None:
            nonlocal reads
            reads += 1
            if reads == 1:  # the profiling run publishes just after this read
                kube.put(*PROFILES, profile("infer", phase="Profiling"))
                return None
            return await original_get(namespace, name)

        controller.io.get_profile = absent_then_made  # type: ignore[method-assign]
        status = await eventually(lambda: status_of(kube).get("telemetry") and status_of(kube))
        assert status["phase"] == "Profiling" and "source" not in status, "the profiling run's profile stays"
        assert status["telemetry"][0]["runs"] == 1 and reads >= 2


async def test_a_job_labelled_only_on_its_own_metadata_is_measured_when_it_completes(tmp_path: Path):
    """The workload label on the Job but not on its pod template, as most Jobs are written: its Pods
    carry no label for the Pod informer, so the Job's completion (the run observed) measures them."""
    kube = KubeDouble()
    fake = FakePrometheus()
    async with (
        api_server(kube) as server,
        webhook_serving(kube, server, tmp_path),
        prometheus_serving(fake) as url,
        controller_running(server, config=telemetry_config(url)) as controller,
    ):
        opted_in_cluster(kube, (tmp_path / "certs" / "ca.crt").read_bytes(), A100)
        entrypoint: Any = make_job("serve").label(v.WORKLOAD_LABEL, "serve").obj()
        entrypoint["spec"]["template"]["spec"]["containers"][0].pop("command")
        api = api_for(server, "kubectl")
        try:
            await client.BatchV1Api(api).create_namespaced_job("team-a", entrypoint)
        finally:
            await api.close()
        [pod] = await kube.run_jobs()
        created = kube.get(*PODS, "team-a", pod)
        assert created and v.WORKLOAD_LABEL not in created["metadata"]["labels"], "a Job's Pod, unlabelled"
        fake.load_text(dcgm_exposition([DcgmGpu(0, "GPU-a", "team-a", pod, counters=MEMORY_BOUND)]))
        kube.finish_pod("team-a", pod, node="gpu-0", seconds=600)
        status = await eventually(
            lambda: status_of(kube, "serve").get("telemetry") and status_of(kube, "serve")
        )
        assert (status["phase"], status["source"], status["boundType"]) == ("Ready", "telemetry", "memory")
        assert status["telemetry"][0]["runs"] == 1 and status["telemetry"][0]["seconds"] == "600"
        telemetry = controller.telemetry
        assert telemetry is not None
        await eventually(lambda: not telemetry.job_pods)  # nothing of the Pod held once it is counted


async def test_counters_held_by_dcgm_cost_no_learning_the_execution_runs_telemetry_makes_it_ready(
    tmp_path: Path,
):
    """Issue 31: the profiling run finds the counters held (counters-in-use): the profile is Failed
    with the class (condition reason CountersInUse, Event, metric); the execution Job's run, measured
    by DCGM, makes it a Ready telemetry profile that keeps why profiling failed; the next Job of the
    workload is ranked, and nothing profiles it again."""
    kube = KubeDouble()
    fake = FakePrometheus()
    async with (
        api_server(kube) as server,
        webhook_serving(kube, server, tmp_path) as engine,
        prometheus_serving(fake) as url,
        controller_running(server, config=telemetry_config(url)) as controller,
    ):
        opted_in_cluster(kube, (tmp_path / "certs" / "ca.crt").read_bytes(), A100)
        api = api_for(server, "kubectl")
        try:
            user: Any = make_job("train").label(v.WORKLOAD_LABEL, "train").obj()
            await client.BatchV1Api(api).create_namespaced_job("team-a", user)
            [profiling] = await kube.run_jobs()
            kube.finish_pod(
                "team-a", profiling, exit_code=1, message=runner_summary_failed(), container=v.RUNNER_CONTAINER,
                node="gpu-0",
            )  # fmt: skip
            failed = await eventually(
                lambda: status_of(kube, "train").get("phase") == "Failed" and status_of(kube, "train")
            )
            assert failed["failure"] == "counters-in-use" and "DCGM" in failed["message"]
            [condition] = failed["conditions"]
            assert (condition["type"], condition["status"], condition["reason"]) == (
                "Failed",
                "True",
                "CountersInUse",
            )
            # the Event is written after the status: wait for it as for the status
            notes = await eventually(lambda: [e["note"] for e in events(kube, "ProfileFailed")])
            assert all("(CountersInUse)" in note for note in notes)
            # counted once the Node's product is read, just after the profile is written
            await eventually(
                lambda: (
                    controller.metrics.profiling_failures.labels(
                        "counters-in-use", "gpu-0", A100
                    )._value.get()
                    == 1
                )
            )
            # the execution Job (created after the profile is written) runs, and DCGM measures it
            await eventually(lambda: ("team-a", "train-execution") in kube.objects[JOBS])
            [execution] = await kube.run_jobs()
            fake.load_text(dcgm_exposition([DcgmGpu(0, "GPU-a", "team-a", execution, counters=MEMORY_BOUND)]))
            kube.finish_pod("team-a", execution, node="gpu-0", seconds=600)
            ready = await eventually(
                lambda: status_of(kube, "train").get("phase") == "Ready" and status_of(kube, "train")
            )
            assert (ready["source"], ready["boundType"]) == ("telemetry", "memory")
            assert ready["failure"] == "counters-in-use", "why profiling failed is kept"
            [kept] = ready["conditions"]
            assert (kept["status"], kept["reason"]) == ("False", "CountersInUse")
            assert "DCGM" in kept["message"] and "Ready from DCGM telemetry" in kept["message"]
            # the next Job of the workload: ranked at once, never profiled again
            await eventually(lambda: (p := engine.profiles.get("team-a", "train")) is not None and p.ready)
            again: Any = make_job("train-2").label(v.WORKLOAD_LABEL, "train").obj()
            created = await client.BatchV1Api(api).create_namespaced_job("team-a", again)
        finally:
            await api.close()
        labels = created.metadata.labels or {}
        assert labels.get(v.ROLE_LABEL) != "profiling"
        hints = json.loads((created.metadata.annotations or {})[v.HINTS_ANNOTATION])
        assert hints.get("ranked"), hints
