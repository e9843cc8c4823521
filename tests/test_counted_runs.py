"""Issue 59: the runs counted into a profile's observations are remembered in the ledger ConfigMap
``<profile>-counted-runs``, which only the controller reads; the profile's ``countedRuns`` names only
the runs of its last write. A run is counted once across a controller restart in the middle of a run,
and a profile written before (256 uids in ``countedRuns``) still reads right."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from kratos_controller.learning import COUNTED_KEY, ledger_name
from tests.harness import (
    CONFIGMAPS,
    PODS,
    PROFILES,
    api_for,
    api_server,
    controller_running,
    eventually,
    opted_in_cluster,
    webhook_serving,
)
from tests.kube_double import KubeDouble
from tests.test_calibration_cluster import NODE_OF, PRODUCTS, job_of, observed_profile, seconds_on

OLD_UIDS = [f"old-run-{i}" for i in range(256)]


def runs_on(kube: KubeDouble, product: str) -> int:
    profile = kube.get(*PROFILES, "team-a", "stream-profile")
    assert profile is not None
    return int({o["product"]: o["runs"] for o in profile["status"]["observations"]}[product])


def ledger(kube: KubeDouble) -> list[str]:
    found = kube.get(*CONFIGMAPS, "team-a", ledger_name("stream-profile"))
    return str(found["data"][COUNTED_KEY]).split() if found else []


def pod_uid(kube: KubeDouble, name: str) -> str:
    pod = kube.get(*PODS, "team-a", name)
    assert pod is not None
    return str(pod["metadata"]["uid"])


async def test_a_run_is_counted_once_across_a_restart_in_the_middle_of_a_run(tmp_path: Path):
    kube = KubeDouble()
    async with api_server(kube) as server, webhook_serving(kube, server, tmp_path):
        opted_in_cluster(kube, (tmp_path / "certs" / "ca.crt").read_bytes(), *PRODUCTS)
        old: dict[str, Any] = observed_profile("stream")
        old["status"]["countedRuns"] = OLD_UIDS  # as a controller before issue 59 wrote it
        kube.put(*PROFILES, old)
        product = PRODUCTS[2]
        before = runs_on(kube, product)
        api = api_for(server, "kubectl")
        try:
            async with controller_running(server) as first:
                await eventually(first.informer.synced.is_set)
                body: Any = job_of("stream-1", "stream")
                await client.BatchV1Api(api).create_namespaced_job("team-a", body)
                (one,) = await kube.run_jobs()
                kube.finish_pod("team-a", one, node=NODE_OF[product], seconds=seconds_on("stream", product))
                await eventually(lambda: runs_on(kube, product) == before + 1)
                profile = kube.get(*PROFILES, "team-a", "stream-profile")
                assert profile is not None
                assert profile["status"]["countedRuns"] == [pod_uid(kube, one)], "the last write's run alone"
                assert ledger(kube) == OLD_UIDS, "the older profile's uids moved to the ledger first"
                # a second run starts; the controller stops while it runs
                body = job_of("stream-2", "stream")
                await client.BatchV1Api(api).create_namespaced_job("team-a", body)
                (two,) = await kube.run_jobs()
            kube.finish_pod("team-a", two, node=NODE_OF[product], seconds=seconds_on("stream", product))
            async with controller_running(server, agent="controller-restarted") as second:
                await eventually(second.informer.synced.is_set)
                await eventually(lambda: runs_on(kube, product) == before + 2)
                await asyncio.sleep(0.5)  # time to (wrongly) count the first run again
                assert runs_on(kube, product) == before + 2
            assert ledger(kube) == [*OLD_UIDS, pod_uid(kube, one)][-256:]
            async with controller_running(server, agent="controller-third") as third:
                await eventually(third.informer.synced.is_set)
                await asyncio.sleep(0.5)
                assert runs_on(kube, product) == before + 2, (
                    "both finished Jobs replayed, neither counted again"
                )
            profile = kube.get(*PROFILES, "team-a", "stream-profile")
            assert profile is not None and profile["status"]["countedRuns"] == [pod_uid(kube, two)]
        finally:
            await api.close()
