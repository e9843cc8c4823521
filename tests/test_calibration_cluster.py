"""Calibration through the API double (issue 19): the controller writes ConfigMap
kratos-gpu-calibration from every profile's observations, a run counted twice (a replayed event,
a controller restart) changes nothing in it, and the webhook ranks a never-seen workload with it."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
from pathlib import Path
from typing import Any
from unittest.mock import ANY

from kubernetes_asyncio import client

from kratos_admit.decisions.record import recorded_exploration
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.model.calibration import CONFIGMAP_KEY, CONFIGMAP_NAME, NO_CALIBRATION, samples_of
from kratos_admit.model.calibration_fit import fit_calibration
from kratos_admit.simulation.trace import Figures, Truth
from kratos_controller.learning import COUNTED_KEY, ledger_name
from tests.builders import A100, L4, L40S, T4, WORKLOAD_SHAPES, make_job, trace_job
from tests.harness import (
    CATALOG,
    CONFIGMAPS,
    JOBS,
    PODS,
    PROFILES,
    api_for,
    api_server,
    controller_running,
    events_of,
    eventually,
    opted_in_cluster,
    webhook_serving,
)
from tests.kube_double import KubeDouble

PRODUCTS = (A100, L40S, L4, T4)  # opted_in_cluster names their Nodes gpu-0 .. gpu-3
NODE_OF = {product: f"gpu-{i}" for i, product in enumerate(PRODUCTS)}
# this cluster's GPUs: every figure 10-30 % off the catalog's, not all the same way
TRUTH = Truth(
    CATALOG,
    {
        A100: Figures(16.5, 1620.0),
        L40S: Figures(33.0, 700.0),
        L4: Figures(17.0, 240.0),
        T4: Figures(5.6, 250.0),
    },
)
# five of the calibration tests' workloads, and a second compute-bound one
SHAPES = {name: WORKLOAD_SHAPES[name] for name in ("stream", "spmv", "decode", "nbody", "pricing")} | {
    "mc": (92, 4)
}


def seconds_on(workload: str, product: str) -> float:
    sm, mem = SHAPES[workload]
    job = trace_job(workload, sm=sm, mem=mem)
    return round(1000.0 * TRUTH.relative_time(job.shares, reference=A100, product=product), 1)


def observed_profile(workload: str, runs: int = 3) -> dict[str, Any]:
    sm, mem = SHAPES[workload]
    return {
        "apiVersion": v.API_VERSION,
        "kind": v.PROFILE_KIND,
        "metadata": {"name": f"{workload}-profile", "namespace": "team-a"},
        "spec": {"workload": workload},
        "status": {
            "phase": "Ready",
            "boundType": "memory" if mem > sm else "compute",
            "metrics": {"smThroughput": f"{sm}.0", "memoryThroughput": f"{mem}.0"},
            "gpu": {"product": A100},
            "observations": [
                {"product": p, "runs": runs, "meanSeconds": f"{seconds_on(workload, p):.1f}"}
                for p in PRODUCTS
            ],
            "observedRuns": runs * len(PRODUCTS),
        },
    }


def calibration_configmap(kube: KubeDouble) -> dict[str, Any] | None:
    return kube.get(*CONFIGMAPS, "kratos-system", CONFIGMAP_NAME)


def factors(kube: KubeDouble) -> dict[str, Any]:
    found = calibration_configmap(kube)
    assert found is not None
    products: dict[str, Any] = json.loads(found["data"][CONFIGMAP_KEY])["products"]
    return products


def job_of(name: str, workload: str) -> dict[str, Any]:
    job = make_job(name).label(v.WORKLOAD_LABEL, workload).obj()
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    return job


async def test_calibration_is_written_from_observations_counted_once_and_used_for_a_new_workload(
    tmp_path: Path,
):
    kube = KubeDouble()
    async with api_server(kube) as server, webhook_serving(kube, server, tmp_path) as engine:
        opted_in_cluster(kube, (tmp_path / "certs" / "ca.crt").read_bytes(), *PRODUCTS)
        for workload in SHAPES:
            kube.put(*PROFILES, observed_profile(workload))
        api = api_for(server, "kubectl")
        try:
            every_time = Config(calibration_write_seconds=0)  # each change written: the counts are checked
            async with controller_running(server, config=every_time) as running:
                await eventually(running.informer.synced.is_set)
                await eventually(lambda: calibration_configmap(kube))
                first = factors(kube)
                assert set(first) == set(PRODUCTS)
                refits = [
                    r.query for r in kube.requests
                    if r.path == "/apis/gpu.scheduler.io/v1alpha1/workloadprofiles" and "watch" not in r.query
                    and r.user.endswith(":kratos-controller")
                ]  # fmt: skip
                assert refits and all(q.get("limit") == "500" for q in refits), "the refit lists in pages"
                # three more runs of stream on the L4, as long as the earlier ones
                for i in range(3):
                    body: Any = job_of(f"stream-{i}", "stream")
                    await client.BatchV1Api(api).create_namespaced_job("team-a", body)
                for pod in await kube.run_jobs():
                    kube.finish_pod("team-a", pod, node=NODE_OF[L4], seconds=seconds_on("stream", L4))
                await eventually(lambda: factors(kube)[L4]["memoryRuns"] == first[L4]["memoryRuns"] + 3)
            written = copy.deepcopy(calibration_configmap(kube))
            assert written is not None
            assert factors(kube)[L4]["memoryTimeFactor"] == first[L4]["memoryTimeFactor"], (
                "runs as long as before change the counts, not the factor"
            )

            # the same events again (a relist, a resync) and a restarted controller: nothing changes
            for kind in (PODS, JOBS):
                for obj in [o for o in kube.items(*kind) if o["metadata"]["name"].startswith("stream-")]:
                    obj["metadata"].setdefault("labels", {})["replayed"] = "yes"
                    kube.put(*kind, obj)
            async with controller_running(server, agent="controller-restarted") as restarted:
                await eventually(restarted.informer.synced.is_set)
                # its first fit is done, though it writes nothing: the metric says so (bench/scale_bench.py
                # waits on it where the ConfigMap already holds the same calibration)
                fits = functools.partial(
                    restarted.metrics.registry.get_sample_value, "kratos_calibration_fit_seconds_count"
                )
                await eventually(lambda: fits() == 1)
                await asyncio.sleep(0.5)  # time to (wrongly) count again and rewrite
                assert fits() == 1, "nothing changed: no refit"
            assert calibration_configmap(kube) == written, "not rewritten: same data, same resourceVersion"
            stream = kube.get(*PROFILES, "team-a", "stream-profile")
            assert stream is not None
            assert {o["product"]: o["runs"] for o in stream["status"]["observations"]}[L4] == 6

            # the webhook answers from its watch of the ConfigMap: a never-seen workload is ranked
            # with the calibrated figures
            await eventually(lambda: engine.calibration.current() is not NO_CALIBRATION)
            fresh = observed_profile("nbody")
            fresh["metadata"]["name"], fresh["spec"]["workload"] = "fresh-profile", "fresh"
            del fresh["status"]["observations"]
            kube.put(*PROFILES, fresh)
            await eventually(lambda: engine.profiles.get("team-a", "fresh"))
            body = job_of("fresh-0", "fresh")
            await client.BatchV1Api(api).create_namespaced_job("team-a", body)
            stored = kube.get(*JOBS, "team-a", "fresh-0")
            assert stored is not None
            ranked = json.loads(stored["metadata"]["annotations"][v.HINTS_ANNOTATION])["ranked"]
            assert {r["product"]: r.get("source") for r in ranked} == dict.fromkeys(PRODUCTS, "calibrated")
        finally:
            await api.close()


async def test_a_burst_of_600_runs_writes_the_configmap_once_per_interval_and_ends_with_the_same_fit(
    tmp_path: Path,
):
    """Issue 26: a write after every counted run made every webhook replica reload the ConfigMap
    152 times in a burst. With calibrationWriteSeconds 1, 600 runs write it at most once a second
    plus the writes of factors that moved beyond their noise, and the last write holds the fit of
    all 600 runs: what a write after every run would have ended with."""
    kube = KubeDouble()
    config = Config(calibration_write_seconds=1.0)
    async with api_server(kube) as server, webhook_serving(kube, server, tmp_path):
        opted_in_cluster(kube, (tmp_path / "certs" / "ca.crt").read_bytes(), *PRODUCTS)
        for workload in SHAPES:
            kube.put(*PROFILES, observed_profile(workload, runs=1))
        api = api_for(server, "kubectl")
        try:
            async with controller_running(server, config=config) as running:
                await eventually(running.informer.synced.is_set)
                await eventually(lambda: calibration_configmap(kube))
                started = asyncio.get_running_loop().time()
                workloads = sorted(SHAPES)
                for i in range(600):
                    workload, product = workloads[i % len(workloads)], PRODUCTS[(i // len(workloads)) % 4]
                    body: Any = job_of(f"burst-{i}", workload)
                    await client.BatchV1Api(api).create_namespaced_job("team-a", body)
                    for pod in await kube.run_jobs():
                        noisy = seconds_on(workload, product) * (1 + 0.04 * ((i * 7919) % 11 - 5) / 5)
                        kube.finish_pod("team-a", pod, node=NODE_OF[product], seconds=round(noisy, 1))

                def counted() -> int:
                    return sum(
                        o["runs"]
                        for p in kube.items(*PROFILES)
                        for o in p.get("status", {}).get("observations", [])
                    )

                await eventually(lambda: counted() == 600 + len(SHAPES) * len(PRODUCTS), timeout=120)
                profiles = [WorkloadProfile.model_validate(p) for p in kube.items(*PROFILES)]
                every_run = fit_calibration(samples_of(profiles, CATALOG, reference_product=A100), CATALOG)
                await eventually(
                    lambda: (
                        json.loads(calibration_configmap(kube)["data"][CONFIGMAP_KEY])  # type: ignore[index]
                        == {
                            "products": {
                                n: p | {"updatedAt": ANY}
                                for n, p in json.loads(every_run.to_json())["products"].items()
                            },
                        }
                        and {  # issue 59: each workload's shares are in its own profile's status
                            f"team-a/{p['spec']['workload']}": p["status"].get("calibratedShares")
                            for p in kube.items(*PROFILES)
                        }
                        == {
                            n: w | {"updatedAt": ANY}
                            for n, w in json.loads(every_run.to_json())["workloads"].items()
                        }
                    ),
                    timeout=10,
                )
                seconds = asyncio.get_running_loop().time() - started
                writes = running.metrics.registry.get_sample_value
                on_interval = writes("kratos_calibration_writes_total", {"reason": "interval"}) or 0
                moved = writes("kratos_calibration_writes_total", {"reason": "moved"}) or 0
            replaced = [
                r
                for r in kube.requests
                if r.method == "PUT" and r.path.endswith(f"/configmaps/{CONFIGMAP_NAME}")
            ]
            assert len(replaced) + 1 == on_interval + moved, (
                "the first write creates it, every later one replaces it"
            )
            assert on_interval <= seconds / config.calibration_write_seconds + 1, (on_interval, seconds)
            assert on_interval + moved < 600 / 4, (on_interval, moved, seconds)
        finally:
            await api.close()


# --- issue 59: the runs counted live in a ledger ConfigMap only the controller reads -----------------

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


async def test_the_ledger_is_owned_by_its_profile_and_goes_with_it(tmp_path: Path):
    """Issue 59: the ledger ConfigMap names its WorkloadProfile as its owner (no blockOwnerDeletion,
    which would need the profile's finalizers), so the garbage collector deletes it with the profile."""
    kube = KubeDouble()
    async with api_server(kube) as server, webhook_serving(kube, server, tmp_path):
        opted_in_cluster(kube, (tmp_path / "certs" / "ca.crt").read_bytes(), *PRODUCTS)
        old: dict[str, Any] = observed_profile("stream")
        old["status"]["countedRuns"] = OLD_UIDS[:3]
        profile = kube.put(*PROFILES, old)
        api = api_for(server, "kubectl")
        try:
            async with controller_running(server) as running:
                await eventually(running.informer.synced.is_set)
                body: Any = job_of("stream-1", "stream")
                await client.BatchV1Api(api).create_namespaced_job("team-a", body)
                (one,) = await kube.run_jobs()
                kube.finish_pod("team-a", one, node=NODE_OF[L4], seconds=seconds_on("stream", L4))
                await eventually(lambda: ledger(kube) == OLD_UIDS[:3])
            found = kube.get(*CONFIGMAPS, "team-a", ledger_name("stream-profile"))
            assert found is not None
            assert found["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": v.API_VERSION,
                    "kind": v.PROFILE_KIND,
                    "name": "stream-profile",
                    "uid": profile["metadata"]["uid"],
                }
            ]
            kube.delete(*PROFILES, "team-a", "stream-profile")
            assert kube.get(*CONFIGMAPS, "team-a", ledger_name("stream-profile")) is None
        finally:
            await api.close()


async def test_a_refused_calibration_write_is_an_event_and_a_metric_and_is_written_again_without_a_refit(
    tmp_path: Path,
):
    """Issue 59: at 20,000 workloads every write was refused (413) and each retry refitted everything,
    with only a log line to show for it. A refused write is a warning Event on the ConfigMap and the
    metric kratos_calibration_write_failures_total; the write alone is tried again after
    calibrationWriteSeconds, from the fit already made."""
    kube = KubeDouble()
    too_large = "Request entity too large: limit is 3145728"  # the real API server's words
    for _ in range(2):  # the first write and its first retry
        kube.fail("POST", "/namespaces/kratos-system/configmaps$", 413, "RequestEntityTooLarge", too_large)
    async with api_server(kube) as server:
        opted_in_cluster(kube, b"", *PRODUCTS)
        for workload in SHAPES:
            kube.put(*PROFILES, observed_profile(workload))
        async with controller_running(server, config=Config(calibration_write_seconds=0.2)) as running:
            await eventually(running.informer.synced.is_set)
            await eventually(lambda: calibration_configmap(kube))
            refused = running.metrics.registry.get_sample_value(
                "kratos_calibration_write_failures_total", {"object": "configmap", "code": "413"}
            )
            assert refused == 2
            fits = running.metrics.registry.get_sample_value("kratos_calibration_fit_seconds_count")
            assert fits == 1, "the retries write the fit made, they do not refit"
            (event,) = events_of(kube, "CalibrationNotWritten")  # one Event, however many refusals
            assert event["type"] == "Warning"
            assert event["regarding"]["kind"] == "ConfigMap"
            assert event["regarding"]["name"] == CONFIGMAP_NAME
            assert event["regarding"]["namespace"] == "kratos-system"
            assert "413" in event["note"] and "tried again in 0.2 s" in event["note"]
            assert set(factors(kube)) == set(PRODUCTS), "then written"


async def test_a_runs_own_profile_gets_its_shares_before_the_round_under_way_ends():
    """On the real server a run that moved a published factor re-fitted about 5,000 profiles' shares,
    and their round of patches took about a minute; a run finished meanwhile got its own profile's
    shares only after that round (71.8 s). A round writes first each profile whose own samples a fit
    took in, at the latest fit, also a fit that ended while the round was under way."""
    kube = KubeDouble()
    kube.slow("PATCH", r"/workloadprofiles/[^/]+/status$", 0.1)  # 240 patches, 4 at a time: 6 s
    workloads = sorted(SHAPES)
    for i in range(240):
        obj = observed_profile(workloads[i % len(workloads)])
        obj["metadata"]["name"], obj["spec"]["workload"] = f"w{i:03d}-profile", f"w{i:03d}"
        kube.put(*PROFILES, obj)
    last = "w239-profile"  # listed last, so the round would write it last

    def patched() -> list[str]:
        return [r.path.split("/")[-2] for r in kube.calls("PATCH", r"/workloadprofiles/[^/]+/status$")]

    async with api_server(kube) as server:
        opted_in_cluster(kube, b"", *PRODUCTS)
        async with controller_running(server, config=Config(calibration_write_seconds=0.5)):
            await eventually(lambda: len(patched()) >= 8, timeout=30)  # the first round is under way
            run = kube.get(*PROFILES, "team-a", last)
            assert run is not None and last not in patched()
            observation = run["status"]["observations"][1]  # one more run there, 2 % slower
            seconds = float(observation["meanSeconds"])
            observation["meanSeconds"] = (
                f"{seconds * (observation['runs'] + 1.02) / (observation['runs'] + 1):.1f}"
            )
            observation["runs"] += 1
            kube.put(*PROFILES, run)
            at_run = len(patched())
            await eventually(lambda: last in patched(), timeout=30)
            written_at = patched().index(last)
            await eventually(
                lambda: all(p["status"].get("calibratedShares") for p in kube.items(*PROFILES)), timeout=60
            )
            total = len(patched())
            profiles = [WorkloadProfile.model_validate(p) for p in kube.items(*PROFILES)]
    assert total >= 240 and at_run < 240 / 2, (total, at_run)
    assert written_at < 200, (
        f"written {written_at}th of the round's {total} patches, the run came at {at_run}"
    )
    assert patched().count(last) == 1, "once, at the latest fit: the round does not write it again"
    fitted = fit_calibration(samples_of(profiles, CATALOG, reference_product=A100), CATALOG)
    stored = kube.get(*PROFILES, "team-a", last)
    assert stored is not None
    want = json.loads(fitted.to_json())["workloads"]["team-a/w239"]
    assert stored["status"]["calibratedShares"] == want | {"updatedAt": ANY}


def exploring_published(kube: KubeDouble) -> dict[str, Any]:
    found = calibration_configmap(kube)
    assert found is not None
    published: dict[str, Any] = json.loads(found["data"][CONFIGMAP_KEY]).get("exploring", {})
    return published


async def test_the_exploring_jobs_under_way_are_published_and_the_next_job_explores_elsewhere(tmp_path: Path):
    """Issue 58 (a cap that keeps work off a product also decides what is learned of it): the
    controller counts the Jobs sent to explore a figure whose runs have not ended, from their signed
    hints records, and publishes them with the factors; the webhook reads them, and the next exploring
    Job of a workload goes to a figure no run is on its way to measure. A finished or deleted Job, and
    a record the controller did not sign, count for nothing."""
    kube = KubeDouble()
    async with (
        api_server(kube) as server,
        webhook_serving(kube, server, tmp_path, explorationShare=1.0) as engine,
    ):
        opted_in_cluster(kube, (tmp_path / "certs" / "ca.crt").read_bytes(), *PRODUCTS)
        for workload in ("stream", "spmv", "decode"):  # memory-bound runs everywhere: no FP32 measured
            kube.put(*PROFILES, observed_profile(workload))
        fresh = observed_profile("nbody")
        del fresh["status"]["observations"], fresh["status"]["observedRuns"]
        kube.put(*PROFILES, fresh)
        api = api_for(server, "kubectl")
        try:
            async with controller_running(server, config=Config(calibration_write_seconds=0)) as running:
                await eventually(running.informer.synced.is_set)
                await eventually(lambda: calibration_configmap(kube))
                await eventually(lambda: engine.profiles.get("team-a", "nbody"))
                await eventually(lambda: engine.calibration.current() is not NO_CALIBRATION)
                assert exploring_published(kube) == {}

                body: Any = job_of("nbody-0", "nbody")
                await client.BatchV1Api(api).create_namespaced_job("team-a", body)
                first = recorded_exploration(kube.get(*JOBS, "team-a", "nbody-0") or {})
                assert first is not None and first[1] == "fp32", first
                await eventually(lambda: exploring_published(kube) == {first[0]: {"fp32": ["team-a/nbody"]}})
                await eventually(lambda: engine.calibration.current().exploring_on(first[0], "fp32"))

                body = job_of("nbody-1", "nbody")
                await client.BatchV1Api(api).create_namespaced_job("team-a", body)
                second = recorded_exploration(kube.get(*JOBS, "team-a", "nbody-1") or {})
                assert second is not None and second[0] != first[0], (first, second)
                await eventually(
                    lambda: (
                        exploring_published(kube)
                        == {first[0]: {"fp32": ["team-a/nbody"]}, second[0]: {"fp32": ["team-a/nbody"]}}
                    )
                )
                stored = kube.get(*JOBS, "team-a", "nbody-1")
                assert stored is not None
                record = json.loads(stored["metadata"]["annotations"][v.HINTS_ANNOTATION])
                assert "0 run(s) from 0 workload(s), fewer than 5" in record["exploreReason"], record

                forged = job_of("forged", "nbody")
                forged["metadata"]["annotations"] = {
                    v.HINTS_ANNOTATION: json.dumps({"explore": PRODUCTS[3], "exploreFigure": "fp32"})
                }
                kube.put(*JOBS, forged)  # straight into the store: no webhook signed it
                pods = await kube.run_jobs()
                nbody_0 = next(p for p in pods if p.startswith("nbody-0-"))
                kube.finish_pod(
                    "team-a", nbody_0, node=NODE_OF[first[0]], seconds=seconds_on("nbody", first[0])
                )
                await eventually(lambda: exploring_published(kube) == {second[0]: {"fp32": ["team-a/nbody"]}})
                kube.delete(*JOBS, "team-a", "nbody-1")
                await eventually(lambda: exploring_published(kube) == {})
                await eventually(lambda: engine.calibration.current().exploring == {})
        finally:
            await api.close()
