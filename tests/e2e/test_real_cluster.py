"""End to end against a real Kubernetes API server, scheduler and controller manager (issue 16).

Runs when ``KRATOS_E2E_KUBECONFIG`` names an admin kubeconfig; skipped otherwise. KRATOS is installed
from the rendered ``webhook-config/`` (CRD, Namespace, ServiceAccounts, RBAC, both webhook
configurations pointed at a webhook served here), and the webhook and the controller run here with
tokens of their own ServiceAccounts (TokenRequest), so every call they make meets the install's
RBAC. Fake GPU Nodes (two of them tainted ``nvidia.com/gpu=present:NoSchedule``) stand in for GPU
machines, and ``kubelet()`` for their kubelets. Where Debian's ``prometheus`` is installed, a real
Prometheus scrapes a dcgm-exporter stand-in per Node (the GPUs of the Pods the kubelet runs, with the
counters a test chose), and the controller reads telemetry from it (issue 25). The last test
uninstalls, in the order of docs/operations.md "Uninstall".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.model.calibration import CONFIGMAP_KEY, CONFIGMAP_NAME
from kratos_admit.model.exploration import exploring
from tests.builders import make_job, make_pod
from tests.e2e.real_cluster import (
    A100,
    GPU_NODES,
    L40S,
    Front,
    Installed,
    Telemetry,
    admin_api,
    admin_kubeconfig,
    apply,
    gpu_node,
    install,
    kubectl,
    kubelet,
    mark_node_ready,
    profiling_fails,
    remove_install,
    until,
    wait_ready,
)
from tests.harness import REPO, free_port, profile

pytestmark = pytest.mark.skipif(
    admin_kubeconfig() is None,
    reason="end-to-end suite: set KRATOS_E2E_KUBECONFIG to an admin kubeconfig of a real cluster to run it",
)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Telemetry | None]:
    """The Nodes' dcgm-exporters and a real Prometheus scraping them; None without the binary."""
    if shutil.which("prometheus") is None:
        yield None
        return
    with Telemetry(tmp_path_factory.mktemp("prometheus")) as telemetry:
        yield telemetry


@pytest.fixture
def telemetry(prometheus: Telemetry | None) -> Telemetry:
    if prometheus is None:
        pytest.skip("no prometheus binary on PATH: the telemetry tests need Debian's prometheus package")
    return prometheus


@pytest.fixture(scope="module")
def kratos(
    tmp_path_factory: pytest.TempPathFactory, prometheus: Telemetry | None
) -> Iterator[tuple[Installed, Front]]:
    directory = tmp_path_factory.mktemp("kratos")
    steps = install(directory)  # a generator: its finally uninstalls what the suite added
    installed = next(steps)
    context = ssl.create_default_context(cafile=str(directory / "certs" / "ca.crt"))
    port = free_port()
    webhook = installed.start("webhook", port, free_port())
    # telemetry as the component sets it (KRATOS_TELEMETRY); the shortest window the config allows
    settings = (
        {"prometheusURL": prometheus.url, "windowSeconds": 60, "timeoutSeconds": 2} if prometheus else {}
    )
    try:
        with Front(installed.front_port, context, [port]) as front:
            wait_ready(webhook, f"https://127.0.0.1:{port}/readyz", context=context)
            metrics = free_port()
            controller = installed.start(
                "controller", 0, metrics, KRATOS_RESYNC_SECONDS="5",
                **({"KRATOS_TELEMETRY": json.dumps(settings)} if settings else {}),
            )  # fmt: skip
            wait_ready(controller, f"http://127.0.0.1:{metrics}/readyz")
            installed.controller_metrics = f"http://127.0.0.1:{metrics}/metrics"
            yield installed, front
    finally:
        for process in installed.processes:
            print(f"--- {process.name}\n{process.tail(40)}")
        steps.close()


_namespaces: list[str] = []
RUN = secrets.token_hex(2)  # namespaces of this run are new even where an earlier run left its own


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of its own per test, opted in to KRATOS."""
    name = f"e2e-{RUN}-" + request.node.name.removeprefix("test_").replace("_", "-")[:36].rstrip("-")
    labels = {"gpu.scheduler.io/kratos": "enabled", "kratos-e2e": "true"}
    apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}])
    _namespaces.append(name)
    yield name


def job(name: str, workload: str, **spec: Any) -> dict[str, Any]:
    """A Job as a user writes it: an absolute command, one GPU, server defaults left to the server."""
    built = make_job(name, "x").label(v.WORKLOAD_LABEL, workload).obj()
    del built["metadata"]["namespace"]
    built["spec"].update(spec)
    pod_spec = built["spec"]["template"]["spec"]
    pod_spec["restartPolicy"] = "Never"
    pod_spec.pop("schedulerName", None)
    return built


def create(namespace: str, *objects: dict[str, Any]) -> str:
    return kubectl("create", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(objects))


def get(namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    out = kubectl("get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def items(namespace: str, kind: str, *selector: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(kubectl("get", kind, "-n", namespace, *selector, "-o", "json"))[
        "items"
    ]
    return found


def phase(namespace: str, workload: str) -> str:
    found = get(namespace, "workloadprofiles", v.profile_name(workload))
    return str(((found or {}).get("status") or {}).get("phase", ""))


def preferred(obj: dict[str, Any]) -> list[str]:
    """The GPU products of the preferred node-affinity terms, by weight."""
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Job" else obj["spec"]
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution") or [])  # fmt: skip
    ranked = sorted(terms, key=lambda t: -t["weight"])
    return [t["preference"]["matchExpressions"][0]["values"][0] for t in ranked]


def kratos_finalizers(namespace: str) -> list[str]:
    return [
        f"{o['kind']}/{o['metadata']['name']}"
        for kind in ("jobs", "pods")
        for o in items(namespace, kind)
        if v.RELEASE_FINALIZER in (o["metadata"].get("finalizers") or [])
    ]


def events_for(namespace: str, name: str) -> list[str]:
    """The reasons of KRATOS's Events about object ``name``, oldest first (``kubectl events`` shows
    them among the Job controller's own)."""
    found = json.loads(kubectl("get", "events.events.k8s.io", "-n", namespace, "-o", "json"))["items"]
    mine = [
        e
        for e in found
        if (e.get("regarding") or {}).get("name") == name
        and e.get("reportingController") == "gpu.scheduler.io/kratos-controller"
    ]
    mine.sort(key=lambda e: e.get("eventTime") or e["metadata"]["creationTimestamp"])
    return [e["reason"] for e in mine]


def released_job(namespace: str, name: str) -> dict[str, Any] | None:
    found = get(namespace, "job", name)
    return found if found and found["spec"]["suspend"] is False else None


def ready_profile(
    workload: str, namespace: str, bound: str = "memory", metrics: dict[str, str] | None = None
) -> None:
    """A WorkloadProfile as the controller publishes it (status through the status subresource)."""
    body = profile(workload, namespace, bound=bound)
    status = body.pop("status")
    status["metrics"] = metrics or status["metrics"]
    apply([body])
    kubectl("patch", "workloadprofiles", body["metadata"]["name"], "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": status}))  # fmt: skip


# --- placement ----------------------------------------------------------------------------------------------


def not_exploring(namespace: str, base: str) -> str:
    """A Job name in ``namespace`` that is not one of the default explorationShare's Jobs (a hash of
    namespace/name decides; the namespace is new each run): this test is about the first choice."""
    return next(
        name
        for name in (base, *(f"{base}-{k}" for k in range(1, 100)))
        if not exploring(f"{namespace}/{name}", Config().exploration_share)
    )


async def test_a_hinted_job_is_placed_by_the_real_scheduler_on_the_best_gpu(kratos, namespace):
    ready_profile("stream", namespace, bound="memory")
    name = not_exploring(namespace, "stream")
    create(namespace, job(name, "stream"))
    stored = get(namespace, "job", name)
    assert stored is not None
    assert "explore" not in json.loads(stored["metadata"]["annotations"][v.HINTS_ANNOTATION])
    template = stored["spec"]["template"]["spec"]
    assert template["runtimeClassName"] == "nvidia" and template["schedulerName"] == "default-scheduler"
    assert preferred(stored)[0] == A100, "memory-bound: the A100's bandwidth first"
    [pod] = await until(lambda: [p for p in items(namespace, "pods") if p["spec"].get("nodeName")],
                        what="the Job's Pod bound")  # fmt: skip
    assert pod["spec"]["nodeName"] == "e2e-a100-0"


def published_exploring() -> dict[str, Any]:
    """The exploring Jobs under way as the controller published them in its calibration ConfigMap."""
    found = get("kratos-system", "configmap", CONFIGMAP_NAME) or {}
    text = (found.get("data") or {}).get(CONFIGMAP_KEY, "{}")
    published: dict[str, Any] = json.loads(text).get("exploring", {})
    return published


async def test_an_exploring_job_under_way_is_published_with_the_calibration_until_it_is_gone(
    kratos, namespace
):
    """Issue 58 (stop 68): the controller, under its own ServiceAccount, counts an exploring Job that
    has not finished from its signed hints record and writes it into the calibration ConfigMap beside
    the factors, for the webhook's next choice; the Job deleted, the entry goes."""
    ready_profile("mc", namespace, bound="compute", metrics=COMPUTE_METRICS)
    name = next(
        f"mc-{k}" for k in range(1000) if exploring(f"{namespace}/mc-{k}", Config().exploration_share)
    )
    create(namespace, job(name, "mc"))
    stored = get(namespace, "job", name)
    assert stored is not None
    record = json.loads(stored["metadata"]["annotations"][v.HINTS_ANNOTATION])
    assert record["exploreFigure"] == "fp32" and record["explore"] in (A100, L40S, "NVIDIA-L4"), record
    product = record["explore"]
    # calibrationWriteSeconds (30 s) apart from the controller's last write
    await until(lambda: f"{namespace}/mc" in published_exploring().get(product, {}).get("fp32", []),
                timeout=90, what="the exploring Job in the calibration ConfigMap")  # fmt: skip
    kubectl("delete", "job", name, "-n", namespace, "--wait=false")
    await until(lambda: f"{namespace}/mc" not in published_exploring().get(product, {}).get("fp32", []),
                timeout=90, what="the deleted Job gone from the calibration ConfigMap")  # fmt: skip


def gang(name: str, workload: str, pods: int) -> dict[str, Any]:
    """An Indexed Job whose ``pods`` Pods run at once (a gang, issue 49), as a user writes it."""
    return job(name, workload, completionMode="Indexed", completions=pods, parallelism=pods)


GANG_TAINT = "kratos-e2e-gang"
GANG_NODES = (("e2e-gang-a100", A100), ("e2e-gang-l40s", L40S))
COMPUTE_METRICS = {"smThroughput": "85.0", "memoryThroughput": "20.0"}  # the L40S's FP32 first


@pytest.fixture(scope="module")
def gang_nodes(kratos: Any) -> Iterator[None]:
    """Two GPU products with 8 free GPUs each, either alone room for every gang here: Nodes with a
    taint of their own that only the gang tests' Pods tolerate (and require), so nothing else fills them."""
    nodes = []
    for name, product in GANG_NODES:
        node = gpu_node(name, product, tainted=False)
        node["metadata"]["labels"][GANG_TAINT] = "true"
        node["spec"] = {"taints": [{"key": GANG_TAINT, "value": "true", "effect": "NoSchedule"}]}
        nodes.append(node)
    apply(nodes)
    for name, _ in GANG_NODES:
        mark_node_ready(name, {"cpu": "64", "memory": "512Gi", v.GPU_RESOURCE: "8"})
    yield
    kubectl("delete", "node", *(name for name, _ in GANG_NODES), "--ignore-not-found")


def on_gang_nodes(pod_spec: dict[str, Any]) -> None:
    """The user's own placement: only the gang Nodes (KRATOS ANDs its requirements into this term)."""
    pod_spec["tolerations"] = [{"key": GANG_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": GANG_TAINT, "operator": "In", "values": ["true"]}]}]}}}  # fmt: skip


def let_go(namespace: str) -> None:
    """The test's Jobs and Pods gone at once (no kubelet confirms a deletion), so the gang Nodes are free."""
    kubectl("delete", "jobsets.jobset.x-k8s.io,jobs", "--all", "-n", namespace, "--wait=false", check=False)
    kubectl("delete", "pods", "--all", "-n", namespace, "--force", "--grace-period=0", check=False)


def as_written(stored: dict[str, Any], sent: dict[str, Any]) -> tuple[Any, ...]:
    """What a gang keeps exactly as the user wrote it."""

    def fields(obj: dict[str, Any]) -> tuple[Any, ...]:
        spec, container = obj["spec"], obj["spec"]["template"]["spec"]["containers"][0]
        return (spec["parallelism"], spec["completions"], spec["completionMode"], container.get("command"),
                container.get("args"), spec.get("suspend", False), obj["spec"]["template"]["spec"].get("schedulingGates"))  # fmt: skip

    return fields(stored), fields(sent)


async def ranked_at_admission(namespace: str, probe: dict[str, Any]) -> None:
    """Until a server-side dry run of a Job of the workload comes back with ranked hints: the webhook's
    cache has its profile."""
    await until(lambda: preferred(json.loads(kubectl("create", "-n", namespace, "--dry-run=server", "-o", "json",
                                                     "-f", "-", stdin=yaml.safe_dump(probe)))),
                what="the webhook's cache has the profile")  # fmt: skip


async def bound_pods(namespace: str, selector: str, count: int) -> list[dict[str, Any]]:
    def bound() -> list[dict[str, Any]]:
        found = items(namespace, "pods", "-l", selector)
        return found if len(found) == count and all(p["spec"].get("nodeName") for p in found) else []

    found: list[dict[str, Any]] = await until(bound, timeout=90, what=f"{count} Pods of {selector} bound")
    return found


def gang_product(pod: dict[str, Any]) -> str:
    return dict(GANG_NODES)[pod["spec"]["nodeName"]]


async def test_a_gang_runs_whole_and_with_a_profile_all_its_pods_land_on_one_gpu_product(
    kratos, gang_nodes, namespace
):
    """Issue 49: an Indexed gang of 4 Pods is admitted as written with base hints (no profiling run,
    no hold); with a Ready compute-bound profile its Pods prefer the L40S and all land on that one
    product, though the A100 alone has room for all of them too."""
    sent = gang("ddp", "ddp", 4)
    create(namespace, sent)
    stored = get(namespace, "job", "ddp")
    assert stored is not None
    kept, written = as_written(stored, sent | {"spec": {**sent["spec"], "suspend": False}})
    assert kept == written, "parallelism, completions, completionMode, command and args as written"
    record = json.loads(stored["metadata"]["annotations"][v.HINTS_ANNOTATION])
    assert record["gang"].startswith("Indexed Job whose 4 Pods run at once") and record["ranked"] == []
    assert v.ROLE_LABEL not in stored["metadata"]["labels"]
    async with admin_api() as api, kubelet(api, namespace) as finished:
        await until(lambda: len(finished) == 4, what="the gang's 4 Pods ran")
    assert items(namespace, "jobs", "-l", f"{v.ROLE_LABEL}=profiling") == [], "no profiling run"
    ready_profile("ranked", namespace, bound="compute", metrics=COMPUTE_METRICS)
    ranked = gang("ranked", "ranked", 4)
    on_gang_nodes(ranked["spec"]["template"]["spec"])
    await ranked_at_admission(namespace, ranked)
    create(namespace, ranked)
    stored = get(namespace, "job", "ranked")
    assert stored is not None and preferred(stored)[0] == L40S, "compute-bound: the L40S first"
    pod_affinity = stored["spec"]["template"]["spec"]["affinity"]["podAffinity"]
    [term] = pod_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == v.GPU_PRODUCT_LABEL
    bound = await bound_pods(namespace, f"{v.JOB_NAME_LABEL}=ranked", 4)
    try:
        assert {gang_product(p) for p in bound} == {L40S}, "one product"
        for pod in bound:
            assert (
                json.loads(pod["metadata"]["annotations"][v.HINTS_ANNOTATION])["profile"] == "ranked-profile"
            )
    finally:
        let_go(namespace)


@pytest.mark.skipif(os.environ.get("KRATOS_E2E_JOBSET") != "1",
                    reason="needs the JobSet v0.11 controller on the cluster: set KRATOS_E2E_JOBSET=1 where it runs")  # fmt: skip
async def test_a_jobsets_pods_with_a_profile_all_land_on_one_gpu_product(kratos, gang_nodes, namespace):
    """Issue 49: the real JobSet controller's child Jobs are gangs (owned by the JobSet); with a Ready
    profile every Pod of every child Job prefers the L40S, peers with the others by the JobSet's name,
    and all land on that one product, though the A100 alone has room for all of them too."""
    ready_profile("js", namespace, bound="compute", metrics=COMPUTE_METRICS)
    await ranked_at_admission(namespace, gang("js-probe", "js", 2))
    worker = job("w", "js")["spec"]
    on_gang_nodes(worker["template"]["spec"])
    replicated = {"name": "workers", "replicas": 2, "template": {"metadata": {"labels": {v.WORKLOAD_LABEL: "js"}},
                  "spec": {**worker, "parallelism": 2, "completions": 2}}}  # fmt: skip
    create(namespace, {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
                       "spec": {"replicatedJobs": [replicated]}})  # fmt: skip
    bound = await bound_pods(namespace, f"{v.JOBSET_NAME_LABEL}=js", 4)
    try:
        assert {gang_product(p) for p in bound} == {L40S}, "one product"
        for pod in bound:
            record = json.loads(pod["metadata"]["annotations"][v.HINTS_ANNOTATION])
            assert record["profile"] == "js-profile" and record["gang"].startswith("owned by JobSet js")
            [term] = pod["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            assert term["podAffinityTerm"]["labelSelector"] == {"matchLabels": {v.JOBSET_NAME_LABEL: "js"}}
    finally:
        let_go(namespace)


# --- the profiling loop ---------------------------------------------------------------------------------


async def run_loop(namespace: str, workload: str, *, outcome: Any = None) -> Any:
    """Create a Job of a new workload and let the fake kubelets run every Pod until the execution
    Job has run; the execution Job."""
    create(namespace, job(workload, workload))
    stored = get(namespace, "job", workload)
    assert stored and stored["metadata"]["labels"][v.ROLE_LABEL] == "profiling"
    async with admin_api() as api, kubelet(api, namespace, *([outcome] if outcome else [])) as finished:
        execution = await until(lambda: get(namespace, "job", f"{workload}-execution"), what="execution Job")
        await until(lambda: any(p.startswith(f"{workload}-execution-") for p in finished), what="it ran")
    return execution


async def test_the_profiling_loop_ends_in_a_hinted_execution_job_and_leaves_no_finalizer(kratos, namespace):
    execution = await run_loop(namespace, "loop")
    assert phase(namespace, "loop") == "Ready"
    assert preferred(execution), "ranked hints from the Ready profile"
    assert execution["metadata"]["ownerReferences"][0]["name"] == "loop"
    await until(lambda: kratos_finalizers(namespace) == [], what="no KRATOS finalizer left")
    original = get(namespace, "job", "loop")
    assert original and original["metadata"]["annotations"][v.EXECUTION_JOB_ANNOTATION] == "loop-execution"
    print(kubectl("events", "-n", namespace, "--for", "job/loop"))  # what a user sees
    await until(lambda: events_for(namespace, "loop")[:3] == ["ProfilingStarted", "ProfileReady", "ExecutionJobCreated"],
                what=f"Events ProfilingStarted, ProfileReady, ExecutionJobCreated on the Job (have {events_for(namespace, 'loop')})")  # fmt: skip


async def test_a_failed_profile_still_yields_an_execution_job_with_base_hints(kratos, namespace):
    execution = await run_loop(namespace, "broken", outcome=profiling_fails)
    assert phase(namespace, "broken") == "Failed"
    found = get(namespace, "workloadprofiles", "broken-profile")
    assert found and found["status"]["message"]
    assert not preferred(execution)
    tolerations = execution["spec"]["template"]["spec"]["tolerations"]
    assert {"key": v.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in tolerations


async def test_a_sweep_of_three_is_profiled_once_and_the_followers_are_released_with_hints(kratos, namespace):
    create(namespace, *(job(f"sweep-{i}", "sweep") for i in range(3)))
    jobs = {j["metadata"]["name"]: j for j in items(namespace, "jobs")}
    assert [n for n, j in jobs.items() if j["metadata"]["labels"].get(v.ROLE_LABEL) == "profiling"] == [
        "sweep-0"
    ]
    for follower in ("sweep-1", "sweep-2"):
        assert jobs[follower]["spec"]["suspend"] is True
        assert jobs[follower]["metadata"]["annotations"][v.AWAITING_PROFILE_ANNOTATION] == "sweep-profile"
    async with admin_api() as api, kubelet(api, namespace) as finished:
        for follower in ("sweep-1", "sweep-2"):
            released = await until(
                functools.partial(released_job, namespace, follower), what=f"{follower} released"
            )
            assert preferred(released), "released with the ranked hints"
            assert v.AWAITING_PROFILE_ANNOTATION not in released["metadata"]["annotations"]
        await until(lambda: {p.rsplit("-", 1)[0] for p in finished} >= {"sweep-0", "sweep-0-execution", "sweep-1", "sweep-2"},
                    what="every Pod ran")  # fmt: skip
        await until(lambda: events_for(namespace, "sweep-1")[:2] == ["AwaitingProfile", "Released"],
                    what=f"Events on a follower (have {events_for(namespace, 'sweep-1')})")  # fmt: skip
    assert len(items(namespace, "jobs", "-l", f"{v.ROLE_LABEL}=profiling")) == 1


async def test_a_run_with_ttl_0_still_gets_its_execution_job(kratos, namespace):
    create(namespace, job("short", "short", ttlSecondsAfterFinished=0))
    stored = get(namespace, "job", "short")
    assert stored and "ttlSecondsAfterFinished" not in stored["spec"], "the profiling Job drops the TTL"
    async with admin_api() as api, kubelet(api, namespace) as finished:
        await until(
            lambda: any(p.startswith("short-execution-") for p in finished), what="the execution Job ran"
        )
        # the TTL-after-finished controller deletes the execution Job, which carries the user's TTL 0
        await until(lambda: get(namespace, "job", "short-execution") is None, what="TTL 0 applied")
    original = get(namespace, "job", "short")
    assert original and original["metadata"]["annotations"][v.EXECUTION_JOB_ANNOTATION] == "short-execution"


async def test_deleting_the_original_job_deletes_its_execution_job(kratos, namespace):
    await run_loop(namespace, "cascade")
    await until(lambda: kratos_finalizers(namespace) == [], what="finalizers gone")
    kubectl("delete", "job", "cascade", "-n", namespace, "--cascade=background")
    await until(lambda: get(namespace, "job", "cascade-execution") is None, what="garbage collected")


# --- what the API server does before KRATOS sees a Job ----------------------------------------------------


async def test_a_server_defaulted_job_gets_the_kai_scheduler_it_asks_for(kratos, namespace):
    asked = job("kai", "kai")
    asked["metadata"]["annotations"] = {v.SCHEDULER_ANNOTATION: "kai", v.PROFILING_ANNOTATION: "false"}
    create(namespace, asked)
    stored = get(namespace, "job", "kai")
    assert stored is not None
    template = stored["spec"]["template"]
    assert template["spec"]["schedulerName"] == v.KAI_SCHEDULER_NAME, "the server's default counts as unset"
    assert template["metadata"]["labels"]["kai.scheduler/queue"]


async def test_a_namespace_enforcing_restricted_admits_the_profiling_run(kratos, namespace):
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    strict = job("strict", "strict")
    pod_spec = strict["spec"]["template"]["spec"]
    pod_spec["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for container in pod_spec["containers"]:
        container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    create(namespace, strict)
    execution = await run_loop_existing(namespace, "strict")
    assert execution["metadata"]["name"] == "strict-execution"


async def test_an_in_image_run_in_a_restricted_namespace_ends_in_the_users_original_command(
    kratos, namespace
):
    """A PyTorch-style Job (an interpreter, a relative script) is profiled in its own image: the API
    server's Pod Security admission ("restricted", enforced) admits the rewritten Pods, and the
    execution Job runs the user's original command."""
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    torch = job("torch", "torch")
    pod_spec = torch["spec"]["template"]["spec"]
    pod_spec["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    command = ["python", "train.py", "--epochs", "90"]
    pod_spec["containers"][0].update(
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        command=command,
        workingDir="/workspace",
        securityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    )
    create(namespace, torch)
    stored = get(namespace, "job", "torch")
    assert stored is not None
    rewritten = stored["spec"]["template"]["spec"]
    [runner] = rewritten["containers"]
    assert runner["image"] == "nvcr.io/nvidia/pytorch:24.05-py3" and runner["workingDir"] == "/workspace"
    assert runner["command"][runner["command"].index("--") + 1 :] == command
    assert rewritten["initContainers"][-1]["name"] == v.STAGE_PROFILER_CONTAINER
    execution = await run_loop_existing(namespace, "torch")
    assert execution["spec"]["template"]["spec"]["containers"][0]["command"] == command
    assert phase(namespace, "torch") == "Ready"
    assert preferred(execution), "ranked hints from the profile the in-image run made"


async def run_loop_existing(namespace: str, workload: str) -> Any:
    async with admin_api() as api, kubelet(api, namespace) as finished:
        await until(
            lambda: any(p.startswith(f"{workload}-") for p in finished),
            what="the profiling Pod admitted and ran",
        )
        execution = await until(lambda: get(namespace, "job", f"{workload}-execution"), what="execution Job")
        await until(lambda: any(p.startswith(f"{workload}-execution-") for p in finished), what="it ran")
    return execution


# --- telemetry profiles (issue 25) -----------------------------------------------------------------------------

# what the stand-in dcgm-exporter serves for the GPUs of a test's Pods while they run
MEMORY_BOUND = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.97,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.0,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.8,
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.15,
}
COMPUTE_BOUND = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.95,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.9,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.2,
}


def labelled_pods(obj: dict[str, Any], workload: str) -> dict[str, Any]:
    """The workload label on the pod template too (DESIGN: Job/Pod and pod template), so the Pods the
    Job or Deployment controller makes carry it."""
    template = obj["spec"]["template"]
    template.setdefault("metadata", {}).setdefault("labels", {})[v.WORKLOAD_LABEL] = workload
    return obj


def product_of(namespace: str, pod: str) -> str:
    """The GPU product of the Node the Pod ran on."""
    found = get(namespace, "pod", pod)
    assert found is not None
    return next(product for node, product, _ in GPU_NODES if node == found["spec"]["nodeName"])


def telemetry_profile(namespace: str, workload: str) -> dict[str, Any] | None:
    found = get(namespace, "workloadprofiles", v.profile_name(workload))
    status = (found or {}).get("status") or {}
    return found if status.get("phase") == "Ready" and status.get("source") == "telemetry" else None


async def next_job_is_ranked(namespace: str, workload: str) -> list[str]:
    """The products the next Job of ``workload`` prefers, once the webhook's cache has the profile
    (a server-side dry run asks until it answers with ranked hints), then created for real."""
    name = not_exploring(namespace, f"{workload}-next")
    following = job(name, workload)

    def ranked() -> list[str]:
        return preferred(json.loads(kubectl("create", "-n", namespace, "--dry-run=server", "-o", "json",
                                            "-f", "-", stdin=yaml.safe_dump(following))))  # fmt: skip

    await until(ranked, what=f"ranked hints for the next Job of {workload}")
    create(namespace, following)
    stored = get(namespace, "job", name)
    assert stored and not stored["metadata"]["labels"].get(v.ROLE_LABEL), "hinted, not profiled again"
    return preferred(stored)


def telemetry_queries(installed: Installed, result: str) -> float:
    """kratos_telemetry_queries_total{result} from the controller's /metrics, as Prometheus scrapes it."""
    with urllib.request.urlopen(installed.controller_metrics, timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "kratos_telemetry_queries_total" and sample.labels.get("result") == result
    )


async def test_an_entrypoint_only_job_gets_a_telemetry_profile_and_its_next_job_ranked_hints(
    kratos, telemetry, namespace
):
    """A Job running its image's entrypoint (no command) cannot be profiled: it runs with base hints,
    its GPU's DCGM counters (memory-bound) reach Prometheus, and when it completes the controller
    makes the workload's profile from them. Labelled as most Jobs are, on the Job only: its Pod
    carries no workload label."""
    telemetry.dcgm.serve(namespace, MEMORY_BOUND)
    entrypoint = job("serve", "serve")
    for container in entrypoint["spec"]["template"]["spec"]["containers"]:
        container.pop("command", None)
    create(namespace, entrypoint)
    stored = get(namespace, "job", "serve")
    assert stored and v.ROLE_LABEL not in stored["metadata"]["labels"] and not preferred(stored)
    async with admin_api() as api, kubelet(api, namespace, seconds=4, dcgm=telemetry.dcgm) as finished:
        await until(lambda: finished, what="the Job's Pod ran")
        profile = await until(lambda: telemetry_profile(namespace, "serve"), what="a Ready telemetry profile")
    assert telemetry.scraped(namespace, finished[0]) > 0, "Prometheus scraped the Pod's GPU"
    ran = get(namespace, "pod", finished[0])
    assert ran and v.WORKLOAD_LABEL not in ran["metadata"]["labels"]
    status = profile["status"]
    assert status["boundType"] == "memory"
    [record] = status["telemetry"]
    assert record["product"] == product_of(namespace, finished[0]) and record["runs"] == 1
    assert float(record["counters"]["DCGM_FI_PROF_DRAM_ACTIVE"]) == pytest.approx(0.8)
    assert (await next_job_is_ranked(namespace, "serve"))[0] == A100, (
        "memory-bound: the A100's bandwidth first"
    )
    assert "ProfileReady" in events_for(namespace, v.profile_name("serve"))


async def test_a_bare_pod_gets_a_telemetry_profile_and_the_next_job_ranked_hints(
    kratos, telemetry, namespace
):
    telemetry.dcgm.serve(namespace, COMPUTE_BOUND)
    pod = make_pod("notebook", "x").obj()
    del pod["metadata"]["namespace"]
    create(namespace, pod)
    async with admin_api() as api, kubelet(api, namespace, seconds=4, dcgm=telemetry.dcgm) as finished:
        await until(lambda: finished == ["notebook"], what="the Pod ran")
        profile = await until(
            lambda: telemetry_profile(namespace, "notebook"), what="a Ready telemetry profile"
        )
    assert profile["status"]["boundType"] == "compute"
    ran = get(namespace, "pod", "notebook")
    assert ran and ran["status"]["phase"] == "Succeeded"
    [record] = profile["status"]["telemetry"]
    assert record["product"] == product_of(namespace, "notebook")
    ranked = await next_job_is_ranked(namespace, "notebook")
    assert ranked.index(L40S) < ranked.index(A100), (
        f"compute-bound: the L40S's FP32 before the A100 ({ranked})"
    )


async def test_a_pod_of_a_deployment_gets_a_telemetry_profile_after_the_window(kratos, telemetry, namespace):
    """An inference server: the real Deployment and ReplicaSet controllers make its Pod, which runs on;
    once it has run telemetry.windowSeconds (60 s here) the controller counts that first window."""
    telemetry.dcgm.serve(namespace, MEMORY_BOUND)
    pod_spec = make_pod("inference", "x").obj()["spec"]
    pod_spec["restartPolicy"] = "Always"
    labels = {v.WORKLOAD_LABEL: "inference", "app": "inference"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "inference", "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "inference"}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    create(namespace, deployment)
    async with admin_api() as api, kubelet(api, namespace, dcgm=telemetry.dcgm):
        [pod] = await until(lambda: [p for p in items(namespace, "pods") if p.get("status", {}).get("phase") == "Running"],
                            what="the Deployment's Pod running")  # fmt: skip
        [owner] = pod["metadata"]["ownerReferences"]
        assert owner["kind"] == "ReplicaSet" and owner["name"].startswith("inference-")
        assert phase(namespace, "inference") == "", "no profile before the window has passed"
        profile = await until(lambda: telemetry_profile(namespace, "inference"), timeout=120,
                              what="a Ready telemetry profile after the 60 s window")  # fmt: skip
    running = get(namespace, "pod", pod["metadata"]["name"])
    assert running and running["status"]["phase"] == "Running", "counted while it still runs"
    assert profile["status"]["boundType"] == "memory"
    [record] = profile["status"]["telemetry"]
    assert record["runs"] == 1 and float(record["seconds"]) == pytest.approx(60, abs=1)
    assert (await next_job_is_ranked(namespace, "inference"))[0] == A100


async def test_a_gangs_own_run_makes_its_profile_ready_while_it_still_runs(kratos, telemetry, namespace):
    """Issue 49: a gang is never profiled under Nsight Compute; its profile comes from the DCGM telemetry
    of its own run, after telemetry.windowSeconds (60 s here), while its Pods still run. Labelled on
    the Job only, as users write it: KRATOS puts the workload label on its Pods, so the controller sees
    them while they run."""
    telemetry.dcgm.serve(namespace, COMPUTE_BOUND)
    create(namespace, gang("llm", "llm", 2))
    async with admin_api() as api, kubelet(api, namespace, seconds=240, dcgm=telemetry.dcgm):
        running = await until(lambda: [p for p in items(namespace, "pods", "-l", f"{v.WORKLOAD_LABEL}=llm")
                                       if p.get("status", {}).get("phase") == "Running"] or None,
                              what="the gang's Pods running, with the workload label")  # fmt: skip
        profile = await until(lambda: telemetry_profile(namespace, "llm"), timeout=150,
                              what="a Ready telemetry profile after the 60 s window")  # fmt: skip
        still = items(namespace, "pods", "-l", f"{v.JOB_NAME_LABEL}=llm")
        assert still and all(p["status"]["phase"] == "Running" for p in still), "counted while the gang runs"
    assert running and profile["status"]["boundType"] == "compute"
    assert items(namespace, "jobs", "-l", f"{v.ROLE_LABEL}=profiling") == [], (
        "no GPU-second on a measuring run"
    )
    ranked = await next_job_is_ranked(namespace, "llm")
    assert ranked.index(L40S) < ranked.index(A100), f"compute-bound: the L40S before the A100 ({ranked})"


async def test_prometheus_down_makes_no_profile_says_so_and_telemetry_resumes_when_it_is_back(
    kratos, telemetry, namespace
):
    """Prometheus stops while a Pod runs (its samples so far stored): the query when the Pod ends fails,
    the controller goes on, makes no profile, says so in an Event and the metric; once Prometheus is
    back (same storage) the retried query makes the profile."""
    installed, _ = kratos
    [controller] = [p for p in installed.processes if p.name.startswith("controller")]
    telemetry.dcgm.serve(namespace, MEMORY_BOUND)
    unprofiled = labelled_pods(job("outage", "outage"), "outage")
    unprofiled["metadata"]["annotations"] = {v.PROFILING_ANNOTATION: "false"}
    create(namespace, unprofiled)
    errors = telemetry_queries(installed, "error")
    try:
        async with admin_api() as api, kubelet(api, namespace, seconds=8, dcgm=telemetry.dcgm) as finished:
            [pod] = await until(lambda: [p["metadata"]["name"] for p in items(namespace, "pods")
                                         if p.get("status", {}).get("phase") == "Running"], what="the Pod running")  # fmt: skip
            await until(lambda: telemetry.scraped(namespace, pod) >= 2, what="two scrapes of its GPU stored")
            await asyncio.to_thread(telemetry.stop_prometheus)
            await until(lambda: finished, what="the Pod ended")
            await until(lambda: "TelemetryUnavailable" in events_for(namespace, "outage"),
                        what=f"Event TelemetryUnavailable on the Job (have {events_for(namespace, 'outage')})")  # fmt: skip
            await until(lambda: telemetry_queries(installed, "error") > errors, what="a failed query counted")
            note = next(e["note"] for e in items(namespace, "events.events.k8s.io")
                        if e["reason"] == "TelemetryUnavailable")  # fmt: skip
            assert note.startswith(telemetry.url), note
            assert phase(namespace, "outage") == "", "no profile from a failed query"
            assert controller.popen.poll() is None, "the controller goes on"
            wait_ready(controller, installed.controller_metrics.replace("/metrics", "/readyz"))
        await asyncio.to_thread(telemetry.start_prometheus)
        profile = await until(lambda: telemetry_profile(namespace, "outage"), timeout=90,
                              what="the retried query makes the profile once Prometheus is back")  # fmt: skip
    finally:
        if telemetry.prometheus is None:
            await asyncio.to_thread(telemetry.start_prometheus)
    assert profile["status"]["boundType"] == "memory"
    assert profile["status"]["telemetry"][0]["runs"] == 1
    assert telemetry_queries(installed, "ok") > 0


# --- a rollout of the webhook ---------------------------------------------------------------------------------


async def test_a_webhook_rollout_fails_no_create(kratos, namespace):
    installed, front = kratos
    [old] = [p for p in installed.processes if p.name.startswith("webhook")]
    context = ssl.create_default_context(cafile=str(installed.directory / "certs" / "ca.crt"))
    answered, failures = 0, []
    stop = asyncio.Event()

    async def creates() -> None:
        nonlocal answered
        async with admin_api() as api:
            batch = client.BatchV1Api(api)
            i = 0
            while not stop.is_set():
                body: Any = job(f"load-{i}", "load")
                try:
                    await batch.create_namespaced_job(namespace, body, dry_run="All")
                    answered += 1
                except ApiException as exc:
                    failures.append(f"{exc.status}: {exc.body!r}"[:300])
                i += 1

    load = asyncio.create_task(creates())
    try:
        await until(lambda: answered > 20, what="load running")
        new_port = free_port()
        new = installed.start("webhook", new_port, free_port(), KRATOS_SHUTDOWN_GRACE_SECONDS="3")
        await asyncio.to_thread(wait_ready, new, f"https://127.0.0.1:{new_port}/readyz", context=context)
        front.service.pods.append(new_port)
        old.popen.send_signal(15)
        await asyncio.to_thread(old.popen.wait, 30)
        before = answered
        await until(lambda: answered > before + 20, what="served by the new pod")
    finally:
        stop.set()
        await load
    assert old.popen.returncode == 0
    assert failures == [], failures[:3]
    print(f"rollout: {answered} dry-run creates admitted, {len(failures)} failed")


# --- uninstall, in the order of docs/operations.md (last) -------------------------------------------------------


async def test_zz_uninstall_in_order_leaves_nothing_stuck(kratos, namespace):
    installed, _ = kratos
    for process in [p for p in installed.processes if p.name.startswith("controller")]:
        assert process.stop() == 0
    create(namespace, *(job(f"held-{i}", "held") for i in range(2)))
    pod = make_pod("gated", "x").label(v.WORKLOAD_LABEL, "held").obj()
    del pod["metadata"]["namespace"]
    create(namespace, pod)
    async with admin_api() as api, contextlib.AsyncExitStack() as kubelets:
        for name in _namespaces:  # the fake Nodes' kubelets serve every namespace of the suite
            await kubelets.enter_async_context(kubelet(api, name))
        await until(lambda: kratos_finalizers(namespace), what="the profiling run's finalizers")
        stuck = get(namespace, "job", "held-1")
        assert stuck and stuck["spec"]["suspend"] is True
        # 1. the webhook configurations go: nothing new is held
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            kubectl("delete", kind, "kratos-admit")
        # 2. release
        released = subprocess.run(
            [sys.executable, "-m", "kratos_admit", "release", "-A", "--kubeconfig", str(admin_kubeconfig())],
            capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
        )  # fmt: skip
        assert released.returncode == 0, released.stderr
        print(released.stdout)
        assert kratos_finalizers(namespace) == []
        held = get(namespace, "job", "held-1")
        assert held and held["spec"]["suspend"] is False
        gated = get(namespace, "pod", "gated")
        assert gated and not gated["spec"].get("schedulingGates")
        for name in _namespaces:  # nothing KRATOS set is left anywhere the suite ran
            assert kratos_finalizers(name) == [], name
            assert not [j for j in items(name, "jobs") if j["spec"].get("suspend")], name
            assert not [p for p in items(name, "pods") if p["spec"].get("schedulingGates")], name
        # 3. the install goes, and every namespace that held KRATOS objects deletes without help
        started = time.monotonic()
        for name in _namespaces:
            kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")

        def gone() -> bool:
            left = kubectl("get", "namespaces", "-o", "name")
            return not [n for n in _namespaces if f"namespace/{n}\n" in left]

        await until(gone, timeout=30, what=f"namespaces deleted ({kubectl('get', 'namespaces')})")
        print(f"uninstall: {len(_namespaces)} namespaces deleted in {time.monotonic() - started:.1f} s")
    remove_install()  # and wait: the next module meets no kratos-system still terminating
