"""The controller's Kubernetes I/O against the in-process API test double (tests/kube_double.py)."""

from __future__ import annotations

import asyncio
import contextlib
import copy

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kratos_controller.leader import LeaderElector
from kratos_controller.main import metrics_app, readiness
from kratos_controller.manager import Manager, run_when_leading
from kratos_controller.metrics import ControllerMetrics
from tests.harness import (
    CONFIGMAPS,
    JOBS,
    LEASES,
    NAMESPACES,
    PODS,
    PROFILES,
    TEST_KEY,
    api_for,
    api_server,
    controller_running,
    eventually,
    execution_jobs,
    finish,
    profiling_job,
    runner_pod,
    runner_summary,
    runner_summary_cannot_start,
    seed_finished,
)
from tests.kube_double import CLUSTERROLES, CONTROLLER, KubeDouble


async def test_finished_profiling_job_becomes_profile_configmap_and_one_execution_job():
    kube = KubeDouble()
    async with api_server(kube) as server:
        seed_finished(kube, "vector-add", runner_summary())
        async with controller_running(server) as controller:
            await eventually(lambda: execution_jobs(kube))
            profile = await eventually(lambda: kube.get(*PROFILES, "team-a", "vector-add-profile"))
            assert profile["spec"] == {"workload": "vector-add"}
            assert profile["status"]["phase"] == "Ready" and profile["status"]["boundType"] == "memory"
            configmap = kube.get(*CONFIGMAPS, "team-a", "vector-add-profile-summary")
            assert (
                configmap and configmap["data"]["boundType"] == "memory" and configmap["data"]["summary.json"]
            )
            assert [j["metadata"]["name"] for j in execution_jobs(kube)] == ["vector-add-execution"]
            # counted just after the writes it counts are visible: wait for it, then exactly one
            await eventually(lambda: controller.metrics.execution_jobs_created._value.get() >= 1)
            assert controller.metrics.execution_jobs_created._value.get() == 1
            assert controller.metrics.profiles_published.labels("ready")._value.get() == 1
            # status went through the status subresource
            assert kube.calls("PATCH", r"/workloadprofiles/vector-add-profile/status$")


async def test_one_execution_job_per_profiling_job_across_a_restart_half_way():
    kube = KubeDouble()
    async with api_server(kube) as server:
        seed_finished(kube, "vector-add", runner_summary())
        kube.fail(
            "POST", r"/apis/batch/v1/namespaces/team-a/jobs$", 500
        )  # dies before the execution Job exists
        async with controller_running(server) as first:
            await eventually(lambda: kube.get(*PROFILES, "team-a", "vector-add-profile"))
            await eventually(lambda: first.metrics.reconcile_errors._value.get() >= 1)
            await asyncio.sleep(0.1)
        async with controller_running(server, agent="controller-restarted") as second:
            await eventually(lambda: execution_jobs(kube))
            await asyncio.sleep(0.3)
            assert len(execution_jobs(kube)) == 1
            created = [c.metrics.execution_jobs_created._value.get() for c in (first, second)]
            assert sum(created) == 1, "one creation in all, whichever controller made it"
        async with controller_running(server, agent="controller-third") as third:
            await eventually(third.informer.synced.is_set)
            await asyncio.sleep(0.5)
            assert len(execution_jobs(kube)) == 1
            assert not [r for r in kube.calls("POST", r"/jobs$") if r.user_agent == "controller-third"], (
                "nothing left to do"
            )


async def test_failed_profiling_still_releases_the_workload():
    kube = KubeDouble()
    async with api_server(kube) as server:
        seed_finished(kube, "vector-add", None, condition="Failed")
        async with controller_running(server) as controller:
            await eventually(lambda: execution_jobs(kube))
            profile = kube.get(*PROFILES, "team-a", "vector-add-profile")
            assert profile and profile["status"]["phase"] == "Failed"
            assert (
                "profiling-runner ended 'Error' (exit 1) without a runner summary"
                in profile["status"]["message"]
            )
            assert profile["status"]["failure"] == "killed", "named by the kubelet's reason (issue 37)"
            assert controller.metrics.profiles_published.labels("failed")._value.get() == 1


async def test_a_staged_executable_that_could_not_start_gives_a_failed_profile_and_the_execution_job():
    kube = KubeDouble()
    async with api_server(kube) as server:
        seed_finished(
            kube,
            "vector-add",
            runner_summary_cannot_start(),
            "Failed",
            exit_code=127,
            reason="BackoffLimitExceeded",
        )
        async with controller_running(server) as controller:
            [execution] = await eventually(lambda: execution_jobs(kube))
            profile = kube.get(*PROFILES, "team-a", "vector-add-profile")
            assert profile and profile["status"]["phase"] == "Failed"
            message = profile["status"]["message"]
            assert "shared library libcudart.so.12 is missing" in message
            assert "gpu.scheduler.io/profiling-form: in-image" in message
            configmap = kube.get(*CONFIGMAPS, "team-a", "vector-add-profile-summary")
            assert configmap and configmap["data"]["message"] == message
            assert execution["metadata"]["name"] == "vector-add-execution"
            assert execution["spec"]["template"]["spec"]["containers"][0]["name"] != "profiling-runner"
            assert controller.metrics.profiles_published.labels("failed")._value.get() == 1
            # counted just after the write it counts is visible: wait for it, then exactly one
            await eventually(lambda: controller.metrics.execution_jobs_created._value.get() >= 1)
            assert controller.metrics.execution_jobs_created._value.get() == 1


async def test_watch_events_after_a_410_relist_are_handled():
    kube = KubeDouble()
    async with api_server(kube) as server, controller_running(server) as controller:
        await eventually(controller.informer.synced.is_set)
        running = profiling_job("late")
        kube.put(*JOBS, running)
        await asyncio.sleep(0.3)
        kube.put(*PODS, runner_pod(finish(running), runner_summary()))
        kube.put(*JOBS, {**finish(running), "metadata": kube.get(*JOBS, "team-a", "late")["metadata"]})  # type: ignore[index]
        kube.compact()  # the watch closes and its resourceVersion is now too old: 410, relist
        await eventually(
            lambda: [j for j in execution_jobs(kube) if j["metadata"]["name"] == "late-execution"]
        )
        assert controller.informer.relists >= 2


async def test_two_controllers_sharing_a_lease_never_both_act():
    kube = KubeDouble()
    async with api_server(kube) as server:
        for i in range(3):
            seed_finished(kube, f"job-{i}", runner_summary())
        apis = [api_for(server, f"controller-{n}", identity=CONTROLLER) for n in "ab"]
        controllers = [
            Manager(api, signing_key=TEST_KEY, metrics=ControllerMetrics(), watch_timeout=5) for api in apis
        ]
        electors = [
            LeaderElector(
                api,
                namespace="kratos-system",
                name="kratos-profiler-controller",
                identity=agent,
                lease_seconds=3,
                retry_seconds=0.2,
            )
            for api, agent in zip(apis, ("controller-a", "controller-b"), strict=True)
        ]
        tasks = [
            asyncio.create_task(run_when_leading(c, e)) for c, e in zip(controllers, electors, strict=True)
        ]
        try:
            await eventually(lambda: len(execution_jobs(kube)) == 3)
            await asyncio.sleep(0.5)
            leaders = [e.identity for e in electors if e.leading.is_set()]
            assert len(leaders) == 1
            assert [c.metrics.registry.get_sample_value("kratos_controller_leader") for c in controllers] == [
                1.0 if e.leading.is_set() else 0.0 for e in electors
            ], "the leader gauge says who acts"
            actors = {
                r.user_agent
                for r in kube.requests
                if r.method in ("POST", "PATCH", "PUT") and "/leases" not in r.path
            }
            assert actors == set(leaders), "only the Lease holder wrote anything"
            lease = kube.get(*LEASES, "kratos-system", "kratos-profiler-controller")
            assert lease and lease["spec"]["holderIdentity"] == leaders[0]

            # the leader cannot renew any more: it stops acting, the other takes over after expiry
            leader = next(e for e in electors if e.leading.is_set())
            follower = next(e for e in electors if e is not leader)
            kube.fail("PUT", r"/leases/", 500)
            for _ in range(40):
                kube.fail("PUT", r"/leases/", 500)
                kube.fail("GET", r"/leases/", 500)
            await eventually(leader.lost.is_set, timeout=15)
            kube.failures.clear()
            await eventually(follower.leading.is_set, timeout=15)
            seed_finished(kube, "job-after-failover", runner_summary())
            await eventually(lambda: len(execution_jobs(kube)) == 4, timeout=15)
            assert len(execution_jobs(kube)) == 4
            leading = {e.identity: c.metrics.registry.get_sample_value("kratos_controller_leader")
                       for c, e in zip(controllers, electors, strict=True)}  # fmt: skip
            assert leading == {leader.identity: 0.0, follower.identity: 1.0}
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for api in apis:
                await api.close()


async def test_a_missing_lease_namespace_is_one_clear_error_and_leading_starts_once_it_exists(
    caplog: pytest.LogCaptureFixture,
):
    kube = KubeDouble()
    kube.namespace_lifecycle = True  # the real server refuses creates in a missing namespace
    async with api_server(kube) as server:
        api = api_for(server, "controller-a", identity=CONTROLLER)
        elector = LeaderElector(
            api,
            namespace="kratos-system",
            name="kratos-profiler-controller",
            identity="a",
            retry_seconds=0.05,
        )
        task = asyncio.create_task(elector.run())
        try:
            await eventually(lambda: len([r for r in kube.requests if r.method == "POST"]) >= 5)
            errors = [r for r in caplog.records if r.name == "kratos.leader" and r.levelname == "ERROR"]
            assert len(errors) == 1, "said once, not at every retry"
            assert errors[0].getMessage() == (
                "the Lease namespace 'kratos-system' does not exist: create it "
                "(kubectl create namespace kratos-system) or set leaseNamespace"
            )
            assert "\n" not in errors[0].getMessage() and not elector.leading.is_set()
            kube.put(*NAMESPACES, {"metadata": {"name": "kratos-system"}})
            await eventually(elector.leading.is_set)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await api.close()


def test_api_errors_are_logged_as_one_line():
    from kubernetes_asyncio.client.exceptions import ApiException

    from kratos_admit.edge.kube import one_line

    exc = ApiException(status=403, reason="Forbidden")
    exc.body = b'{"kind": "Status", "message": "leases is forbidden: User \\"x\\" cannot get"}'
    assert one_line(exc) == '403 Forbidden: leases is forbidden: User "x" cannot get'
    assert one_line(OSError("connection\n refused")) == "OSError: connection refused"


async def test_readyz_answers_503_within_10_s_of_the_pod_watch_being_refused_and_200_once_allowed():
    """Issue 16: a controller whose Pod watch is refused (here: its ClusterRole loses ``watch`` on
    pods, and open watches end as when the API server restarts) says so on /readyz."""
    kube = KubeDouble()
    async with api_server(kube) as server:
        kube.put(*NAMESPACES, {"metadata": {"name": "kratos-system"}})
        api = api_for(server, "controller-a", identity=CONTROLLER)
        elector = LeaderElector(
            api, namespace="kratos-system", name="kratos-profiler-controller", identity="a", retry_seconds=0.2
        )
        controller = Manager(api, signing_key=TEST_KEY, metrics=ControllerMetrics(), watch_timeout=5)
        for informer in (controller.informer, controller.pod_informer):
            informer.backoff.cap = 0.5
        leading = asyncio.create_task(run_when_leading(controller, elector))
        http = TestClient(TestServer(metrics_app(controller.metrics, readiness(controller, elector))))
        await http.start_server()
        loop = asyncio.get_running_loop()
        try:
            await eventually(controller.pod_informer.synced.is_set)
            assert (await http.get("/readyz")).status == 200
            granted = kube.get(*CLUSTERROLES, "", "kratos-controller")
            assert granted is not None
            refused = copy.deepcopy(granted)
            for rule in refused["rules"]:
                if rule["resources"] == ["pods"]:
                    rule["verbs"].remove("watch")
            kube.put(*CLUSTERROLES, refused)
            kube.compact()  # open watches end; the Pod watch is refused from now on
            since = loop.time()
            while (response := await http.get("/readyz")).status == 200:
                assert loop.time() - since < 10, "still ready 10 s after the Pod watch was refused"
                await asyncio.sleep(0.2)
            assert response.status == 503
            text = await response.text()
            assert "kratos-pods" in text and "403" in text, text
            kube.put(*CLUSTERROLES, granted)
            await eventually(lambda: controller.pod_informer.failing.since is None, timeout=10)
            assert (await http.get("/readyz")).status == 200
        finally:
            await http.close()
            leading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await leading
            await api.close()


async def test_a_failed_reconcile_is_logged_on_one_line(caplog: pytest.LogCaptureFixture):
    """An API error (the client's exception carries headers and body over many lines) is logged as
    one line with the server's message, then retried."""
    kube = KubeDouble()
    async with api_server(kube) as server:
        seed_finished(kube, "vector-add", runner_summary())
        kube.fail("POST", r"/apis/batch/v1/namespaces/team-a/jobs$", 500)
        async with controller_running(server):
            await eventually(lambda: execution_jobs(kube))
    [failed] = [r for r in caplog.records if r.getMessage() == "reconcile failed, retrying"][:1]
    reason = str(failed.__dict__["reason"])
    assert "\n" not in reason and reason.startswith("500") and reason.endswith("injected failure"), reason
