"""Issue 16: the install's RBAC is exactly enough. The API double authorises every request against the
Roles, ClusterRoles and bindings that ``kubectl kustomize webhook-config/`` renders, as the real API
server's RBAC authoriser does, and the webhook and controller run under their own ServiceAccounts.

One scenario drives everything the two identities do in a cluster (the webhook's caches and its
cache-miss GET; the controller's Lease, informers, profiling loop, follower release and
observations). Then: with the rendered RBAC it meets no 403; every verb of every rule is used by it;
and without any one rule it meets a 403 that the rule would have allowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.signing import sign_block
from kratos_controller.leader import LeaderElector
from kratos_controller.manager import Manager, run_when_leading
from kratos_controller.metrics import ControllerMetrics
from tests.builders import make_job, make_pod
from tests.harness import (
    CATALOG,
    CONFIGMAPS,
    JOBS,
    NAMESPACES,
    NODES,
    PODS,
    PROFILES,
    SECRETS,
    TEST_KEY,
    api_for,
    api_server,
    eventually,
    install_rbac,
    opted_in_cluster,
    rendered_rbac,
    runner_summary,
    webhook_secrets,
    webhook_serving,
)
from tests.kube_double import CONTROLLER, WEBHOOK, Attributes, Decision, KubeDouble

A100, L40S = "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"
IDENTITIES = {WEBHOOK.user, CONTROLLER.user}


def plain_job(name: str) -> dict[str, Any]:
    job = make_job(name).label(v.WORKLOAD_LABEL, "sweep").obj()
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    return job


def profile_status(kube: KubeDouble) -> dict[str, Any]:
    found = kube.get(*PROFILES, "team-a", "sweep-profile")
    return dict((found or {}).get("status") or {})


def stored(kube: KubeDouble, resource: tuple[str, str], name: str) -> dict[str, Any]:
    found = kube.get(*resource, "team-a", name)
    assert found is not None, f"{name} is not stored"
    return found


def holds_finalizer(obj: dict[str, Any] | None) -> bool:
    return obj is not None and v.RELEASE_FINALIZER in (obj["metadata"].get("finalizers") or [])


async def everything_kratos_does(kube: KubeDouble, tmp_path: Path) -> None:
    """The profiling loop of a sweep (one Job profiled, a Job and a Pod held and released), then two
    observed runs; the webhook and the controller each under its own ServiceAccount."""
    async with api_server(kube) as server:
        kube.put(*NAMESPACES, {"metadata": {"name": "kratos-system"}})
        # a summary ConfigMap left by an earlier run of the workload: the controller replaces it
        kube.put(*CONFIGMAPS, {"metadata": {"name": "sweep-profile-summary", "namespace": "team-a"}})
        # the chart's certificate Secrets, the serving one due for renewal (issue 38)
        serving = dt.timedelta(minutes=10)
        for secret in webhook_secrets(lifetime=dt.timedelta(hours=3), remaining=serving):
            kube.put(*SECRETS, secret)
        first = (kube.get(*SECRETS, "kratos-system", "kratos-webhook-tls") or {}).get("data")
        async with webhook_serving(kube, server, tmp_path):
            opted_in_cluster(kube, (tmp_path / "certs" / "ca.crt").read_bytes(), A100, L40S)
            admin = api_for(server, "kubectl")
            api = api_for(server, "kratos-controller", identity=CONTROLLER)
            elector = LeaderElector(
                api, namespace="kratos-system", name="kratos-profiler-controller", identity="a",
                retry_seconds=0.2,
            )  # fmt: skip
            controller = Manager(
                api, signing_key=TEST_KEY, metrics=ControllerMetrics(), watch_timeout=5, catalog=CATALOG
            )
            leading = asyncio.create_task(run_when_leading(controller, elector))
            try:
                await eventually(controller.informer.synced.is_set)
                batch, core = client.BatchV1Api(admin), client.CoreV1Api(admin)
                body: Any = plain_job("sweep-0")
                await batch.create_namespaced_job("team-a", body)
                await eventually(lambda: profile_status(kube).get("phase") == "Profiling")
                body = plain_job("sweep-1")
                await batch.create_namespaced_job("team-a", body)
                body = make_pod("solo").label(v.WORKLOAD_LABEL, "sweep").obj()
                await core.create_namespaced_pod("team-a", body)
                [pod] = await kube.run_jobs()
                kube.finish_pod(
                    "team-a", pod, message=runner_summary(), container=v.RUNNER_CONTAINER, node="gpu-0"
                )
                await eventually(lambda: profile_status(kube).get("phase") == "Ready")
                await eventually(lambda: stored(kube, JOBS, "sweep-1")["spec"]["suspend"] is False)
                await eventually(lambda: not stored(kube, PODS, "solo")["spec"].get("schedulingGates"))
                await eventually(lambda: not holds_finalizer(kube.get(*JOBS, "team-a", "sweep-0")))
                await eventually(lambda: not holds_finalizer(kube.get(*PODS, "team-a", pod)))
                for i, started in enumerate(await kube.run_jobs()):
                    kube.finish_pod("team-a", started, node=f"gpu-{i % 2}", seconds=50.0)
                await eventually(lambda: profile_status(kube).get("observedRuns") == 2)
                # the Observed Events follow the status write (best effort): told, or refused
                await eventually(lambda: observed_told(kube))
                await escape_once(kube, controller)
                await eventually(lambda: renewed(kube))
                await eventually(
                    lambda: (
                        (kube.get(*SECRETS, "kratos-system", "kratos-webhook-tls") or {}).get("data") != first
                    )
                )
            finally:
                leading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await leading
                await asyncio.gather(admin.close(), api.close())


async def escape_once(kube: KubeDouble, controller: Manager) -> None:
    """A narrowed Job waits unschedulable for its one busy H100 while an L40S is free: the controller
    suspends it, resets its start (jobs/status) and widens it (the escape of "Wait or run slow")."""
    now = dt.datetime.now(dt.UTC)
    stamp = (now - dt.timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    said = json.dumps({
        "maxSlowdown": 4, "bestSeconds": 300.0, "acceptable": [{"product": "NVIDIA-H100-80GB-HBM3", "slowdown": 1.0}],
        "keptOff": [{"product": L40S, "slowdown": 6.0}],
    })  # fmt: skip
    for name, product in (("esc-h100", "NVIDIA-H100-80GB-HBM3"), ("esc-l40s", L40S)):
        labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product}
        status = {"allocatable": {v.GPU_RESOURCE: "1"}, "conditions": [{"type": "Ready", "status": "True"}]}
        kube.put(*NODES, {"metadata": {"name": name, "labels": labels}, "status": status})
    job = make_job("escapee", namespace="team-a").label(v.WORKLOAD_LABEL, "escapee").obj()
    template = job["spec"]["template"]
    template["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                                      "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}}  # fmt: skip
    for block in (job["metadata"], template.setdefault("metadata", {})):
        block.setdefault("annotations", {})[v.HINTS_ANNOTATION] = said
        sign_block(block, namespace="team-a", key=TEST_KEY)
    job["metadata"].update(uid="uid-escapee", creationTimestamp=stamp)
    job["spec"].update(suspend=False, backoffLimit=6, parallelism=1)
    job["status"] = {"startTime": stamp, "active": 1}
    kube.put(*JOBS, job)
    running = make_pod("holder", namespace="team-a").obj()
    running["spec"]["nodeName"] = "esc-h100"
    # no record: predicted to run as long again as it has, 5000 s, longer than the 1800 s on the L40S
    running["status"] = {
        "phase": "Running",
        "startTime": (now - dt.timedelta(seconds=5000)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    kube.put(*PODS, running)
    waiting = make_pod("escapee-x1", namespace="team-a").obj()
    waiting["metadata"].update(labels={"job-name": "escapee"}, creationTimestamp=stamp, ownerReferences=[
        {"apiVersion": "batch/v1", "kind": "Job", "name": "escapee", "uid": "uid-escapee", "controller": True}])  # fmt: skip
    waiting["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}  # fmt: skip
    kube.put(*PODS, waiting)
    controller.waiting.escapes.settle_seconds = 0.0
    controller.waiting.watch(stored(kube, JOBS, "escapee"), "Job")
    await controller.waiting.check(now)
    await kube.run_jobs()
    controller.waiting.watch(stored(kube, JOBS, "escapee"), "Job")
    await controller.waiting.check(now)
    assert stored(kube, JOBS, "escapee")["spec"]["suspend"] is False
    assert L40S in json.dumps(stored(kube, JOBS, "escapee")["spec"]["template"]["spec"]["affinity"])


def observed_told(kube: KubeDouble) -> bool:
    """Both observed runs have their Event, or the controller may not write Events at all."""
    told = [e for e in kube.items("apis/events.k8s.io/v1", "events") if e["reason"] == "Observed"]
    return len(told) == 2 or any(a.resource == "events" and a.verb == "create" for a in refusals(kube))


def renewed(kube: KubeDouble) -> bool:
    """The leader has renewed its Lease at least once (a get, then an update)."""
    return any(
        d.allowed and d.attributes.resource == "leases" and d.attributes.verb == "update"
        for d in kube.decisions
    )


def refusals(kube: KubeDouble) -> list[Attributes]:
    return [d.attributes for d in kube.decisions if not d.allowed and d.attributes.user in IDENTITIES]


async def test_the_install_rbac_lets_kratos_do_everything_and_nothing_is_refused(tmp_path: Path):
    kube = KubeDouble()
    await everything_kratos_does(kube, tmp_path)
    assert refusals(kube) == []
    assert kube.get(*JOBS, "team-a", "sweep-0-execution"), "the loop ran to its end"


def rule_verbs() -> list[tuple[tuple[str, str, str], int, str]]:
    """(role, rule index, verb) for every verb of every rule the install grants."""
    return [
        ((role["kind"], role["metadata"].get("namespace", ""), role["metadata"]["name"]), index, verb)
        for role in rendered_rbac()
        if role["kind"] in ("Role", "ClusterRole")
        for index, rule in enumerate(role["rules"])
        for verb in rule["verbs"]
    ]


async def test_no_rule_grants_a_verb_that_kratos_never_uses(tmp_path: Path):
    kube = KubeDouble()
    await everything_kratos_does(kube, tmp_path)
    used = {(d.rule[0], d.rule[1], d.attributes.verb) for d in kube.decisions if d.allowed and d.rule}
    unused = [grant for grant in rule_verbs() if grant not in used]
    assert unused == [], "granted but never used: take these out of webhook-config/rbac.yaml"


def rules() -> list[Any]:
    return [
        pytest.param(role, index, id=f"{role['metadata']['name']}-{'+'.join(rule['resources'])}-{index}")
        for role in rendered_rbac()
        if role["kind"] in ("Role", "ClusterRole")
        for index, rule in enumerate(role["rules"])
    ]


def _would_allow(rule: dict[str, Any], attributes: Attributes) -> bool:
    """Whether ``rule`` alone grants the request (the double's rule matcher, on one rule)."""
    probe = KubeDouble()
    role = {"kind": "ClusterRole", "metadata": {"name": "probe"}, "rules": [rule]}
    binding = {
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "probe"},
        "roleRef": {"kind": "ClusterRole", "name": "probe"},
        "subjects": [{"kind": "User", "name": attributes.user}],
    }
    install_rbac(probe, [role, binding])
    decision: Decision = probe.authorize(
        next(i for i in (WEBHOOK, CONTROLLER) if i.user == attributes.user), attributes
    )
    return decision.allowed


@pytest.mark.parametrize(("role", "index"), rules())
async def test_without_any_one_rule_kratos_meets_a_403_that_rule_would_have_allowed(
    tmp_path: Path, role: dict[str, Any], index: int
):
    removed = role["rules"][index]
    install = rendered_rbac()
    for obj in install:
        if obj["kind"] == role["kind"] and obj["metadata"]["name"] == role["metadata"]["name"]:
            obj["rules"] = [r for i, r in enumerate(obj["rules"]) if i != index]
    kube = KubeDouble()
    install_rbac(kube, install)
    scenario = asyncio.create_task(everything_kratos_does(kube, tmp_path))
    try:
        await eventually(
            lambda: scenario.done() or any(_would_allow(removed, a) for a in refusals(kube)), timeout=30
        )
    finally:
        scenario.cancel()
        with contextlib.suppress(BaseException):
            await scenario
    refused = [a for a in refusals(kube) if _would_allow(removed, a)]
    assert refused, f"nothing KRATOS does needed {removed}"


async def test_a_controller_denied_events_still_completes_the_loop(tmp_path: Path):
    """Issue 18: Events are best effort; a refused write never fails a reconcile."""
    install = rendered_rbac()
    for obj in install:
        if obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == "kratos-controller":
            obj["rules"] = [r for r in obj["rules"] if r["apiGroups"] != ["events.k8s.io"]]
    kube = KubeDouble()
    install_rbac(kube, install)
    await everything_kratos_does(kube, tmp_path)  # to the observed runs, as with the full RBAC
    refused = {(a.verb, a.group, a.resource) for a in refusals(kube)}
    assert refused == {("create", "events.k8s.io", "events")}
    assert kube.items("apis/events.k8s.io/v1", "events") == []


async def test_the_loop_tells_its_story_in_events(tmp_path: Path):
    kube = KubeDouble()
    await everything_kratos_does(kube, tmp_path)
    events = sorted(kube.items("apis/events.k8s.io/v1", "events"), key=lambda e: e["eventTime"])
    story = [(e["regarding"]["kind"], e["regarding"]["name"], e["reason"]) for e in events]
    on = lambda name: [reason for kind, n, reason in story if n == name]  # noqa: E731
    assert on("sweep-0") == ["ProfilingStarted", "ProfileReady", "ExecutionJobCreated"]
    assert on("sweep-1")[:2] == ["AwaitingProfile", "Released"] and on("solo") == [
        "AwaitingProfile",
        "Released",
    ]
    assert on("sweep-profile") == ["ProfileReady"]
    assert on("sweep-0-execution") == ["Observed"] and on("sweep-1")[2:] == ["Observed"]
    assert all(e["reportingController"] == "gpu.scheduler.io/kratos-controller" for e in events)
    assert len({e["metadata"]["name"] for e in events}) == len(events)


LEASE = ("coordination.k8s.io", "leases")


@pytest.mark.parametrize(
    ("attributes", "allowed"),
    [
        pytest.param(Attributes(CONTROLLER.user, "delete", "", "pods", "", "team-a", "p"), False, id="no-delete"),
        pytest.param(Attributes(CONTROLLER.user, "watch", "", "secrets", "", "", ""), False, id="no-secrets"),
        pytest.param(Attributes(WEBHOOK.user, "create", "batch", "jobs", "", "team-a", ""), False, id="webhook-reads-only"),
        pytest.param(Attributes(CONTROLLER.user, "update", *LEASE, "", "kratos-system", "other"), False, id="other-lease"),
        pytest.param(Attributes(CONTROLLER.user, "update", *LEASE, "", "kratos-system", "kratos-profiler-controller"), True, id="own-lease"),
        pytest.param(Attributes(CONTROLLER.user, "update", *LEASE, "", "team-a", "kratos-profiler-controller"), False, id="role-binds-in-its-namespace"),
        pytest.param(Attributes(CONTROLLER.user, "patch", "gpu.scheduler.io", "workloadprofiles", "status", "team-a", "x"), True, id="subresource"),
        pytest.param(Attributes(CONTROLLER.user, "patch", "gpu.scheduler.io", "workloadprofiles", "", "team-a", "x"), False, id="not-the-main-resource"),
    ],
)  # fmt: skip
def test_the_double_authorises_by_verb_resource_subresource_namespace_and_name(attributes, allowed):
    kube = KubeDouble()
    install_rbac(kube)
    identity = WEBHOOK if attributes.user == WEBHOOK.user else CONTROLLER
    assert kube.authorize(identity, attributes).allowed is allowed


async def test_a_refusal_is_the_real_servers_403_status():
    """What a controller without the Pod watch met on a real 1.28 API server (issue 16)."""
    kube = KubeDouble()
    role = next(
        o
        for o in rendered_rbac()
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "kratos-controller"
    )
    for rule in role["rules"]:
        if rule["resources"] == ["pods"]:
            rule["verbs"] = [verb for verb in rule["verbs"] if verb != "watch"]
    install_rbac(
        kube,
        [
            o if o["metadata"]["name"] != "kratos-controller" or o["kind"] != "ClusterRole" else role
            for o in rendered_rbac()
        ],
    )
    async with api_server(kube) as server:
        api = api_for(server, identity=CONTROLLER)
        try:
            response: Any = await client.CoreV1Api(api).list_pod_for_all_namespaces(
                watch=True, _preload_content=False
            )
            assert response.status == 403
            assert await response.json() == {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": 403,
                "reason": "Forbidden",
                "message": 'pods is forbidden: User "system:serviceaccount:kratos-system:kratos-controller" '
                'cannot watch resource "pods" in API group "" at the cluster scope',
                "details": {"group": "", "kind": "pods"},
            }
            response.release()
        finally:
            await api.close()
