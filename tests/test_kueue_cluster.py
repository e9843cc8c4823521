"""Issue 36 through the API double: KRATOS's webhook and controller where Kueue runs.

The double plays the API server (admission, the Job template's and the gated Pod's mutability rules,
the resourceVersion precondition of a patch, metadata.managedFields, server-side apply of a CRD's
status list-maps, Kueue's CRDs served or not). What Kueue itself does is written out by the tests as
the writes Kueue makes: a Job created the way Kueue's webhook leaves it (labelled, suspended), the
unsuspend and the flavor's nodeSelector of its admission, and a Workload per Job with its
admission-check entry. The real Kueue meets the same cases in tests/e2e/test_kueue.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from tests.builders import make_job
from tests.harness import (
    JOBS,
    PODS,
    PROFILES,
    RBAC_KINDS,
    REPO,
    eventually,
    install_rbac,
    kratos_cluster,
    render,
    runner_summary,
)
from tests.kube_double import ADMISSION_CHECKS, WORKLOADS, KubeDouble

A100, L40S = "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"
QUEUE = v.KUEUE_QUEUE_LABEL
CHECK = "kratos-profile"
KUEUE_MANAGER = "kueue-admission"  # the field manager of the writes Kueue's controller makes here


def kueue_job(name: str) -> dict[str, Any]:
    """A Job of workload sweep as Kueue's webhook leaves it at creation: queue label, suspended."""
    job = make_job(name).label(v.WORKLOAD_LABEL, "sweep").label(QUEUE, "team").job_spec(suspend=True).obj()
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    return job


async def create(api: client.ApiClient, job: dict[str, Any]) -> None:
    body: Any = job
    await client.BatchV1Api(api).create_namespaced_job("team-a", body)


async def kueue_starts(api: client.ApiClient, name: str) -> None:
    """Kueue's admission of a Job: the flavor's nodeSelector into the template, then unsuspended."""
    body: Any = {
        "spec": {"suspend": False, "template": {"spec": {"nodeSelector": {v.GPU_PRODUCT_LABEL: A100}}}}
    }
    await client.BatchV1Api(api).patch_namespaced_job(  # type: ignore[call-arg]
        name, "team-a", body, field_manager=KUEUE_MANAGER, _content_type="application/merge-patch+json"
    )


def stored(kube: KubeDouble, resource: tuple[str, str], name: str) -> dict[str, Any]:
    found = kube.get(*resource, "team-a", name)
    assert found is not None, f"{name} is not stored"
    return found


def gated(pod_spec: dict[str, Any]) -> bool:
    return any(g["name"] == v.PROFILE_SCHEDULING_GATE for g in pod_spec.get("schedulingGates") or [])


def preferred(pod_spec: dict[str, Any]) -> list[Any]:
    node_affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    return list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or [])


def phase(kube: KubeDouble) -> str | None:
    return ((kube.get(*PROFILES, "team-a", "sweep-profile") or {}).get("status") or {}).get("phase")


def pods_of(kube: KubeDouble, job: str) -> list[dict[str, Any]]:
    return [p for p in kube.items(*PODS) if p["metadata"]["labels"].get("job-name") == job]


def wrote_suspend(job: dict[str, Any], managers: tuple[str, ...]) -> list[str]:
    """The field managers among ``managers`` that own ``spec.suspend`` in ``job``'s managedFields."""
    return [
        entry["manager"]
        for entry in job["metadata"].get("managedFields") or []
        if entry["manager"] in managers and "f:suspend" in (entry["fieldsV1"].get("f:spec") or {})
    ]


async def finish_profiling(kube: KubeDouble) -> None:
    [pod] = pods_of(kube, "sweep-0")
    kube.finish_pod(
        "team-a",
        pod["metadata"]["name"],
        message=runner_summary(),
        container=v.RUNNER_CONTAINER,
        node="gpu-0",
    )


async def test_a_kueue_follower_is_gated_then_released_and_kratos_never_writes_its_suspend(tmp_path: Path):
    async with kratos_cluster(tmp_path, A100, L40S) as (kube, _, api):
        await create(api, kueue_job("sweep-0"))
        await kueue_starts(api, "sweep-0")
        await eventually(lambda: phase(kube) == "Profiling")
        for name in ("sweep-1", "sweep-2"):
            await create(api, kueue_job(name))
            held = stored(kube, JOBS, name)
            assert held["spec"]["suspend"] is True and gated(held["spec"]["template"]["spec"])
        await kueue_starts(api, "sweep-1")  # Kueue admits one follower while the run is under way
        started = await kube.run_jobs()
        assert len(started) == 2, started
        [early] = pods_of(kube, "sweep-1")
        assert gated(early["spec"]), "its Pod waits behind the gate, holding no GPU"
        await finish_profiling(kube)
        await eventually(lambda: phase(kube) == "Ready")
        # the started follower: its Pod released; the one Kueue has not admitted: its template
        released_pod = await eventually(
            lambda: (p := stored(kube, PODS, early["metadata"]["name"])) and not gated(p["spec"]) and p
        )
        assert preferred(released_pod["spec"]), "the ranked affinity, written while gated"
        waiting = await eventually(
            lambda: (j := stored(kube, JOBS, "sweep-2")) and not gated(j["spec"]["template"]["spec"]) and j
        )
        assert waiting["spec"]["suspend"] is True, "Kueue's to start"
        assert preferred(waiting["spec"]["template"]["spec"])
        first = await eventually(
            lambda: (
                (j := stored(kube, JOBS, "sweep-1"))
                and v.AWAITING_PROFILE_ANNOTATION not in j["metadata"]["annotations"]
                and j
            )
        )
        assert gated(first["spec"]["template"]["spec"]), "a started Job's template cannot change"
        # a Pod sweep-1 makes after the release (a retry) is admitted without the gate, with the hints
        kube.remove(*PODS, "team-a", early["metadata"]["name"])
        [retry] = await kube.run_jobs()
        again = stored(kube, PODS, retry)
        assert not gated(again["spec"]) and preferred(again["spec"])
        # Kueue starts sweep-2: its Pod is born ungated, with the hints of its template
        await kueue_starts(api, "sweep-2")
        [late] = await kube.run_jobs()
        assert not gated(stored(kube, PODS, late)["spec"])
        for name in ("sweep-0", "sweep-1", "sweep-2"):
            job = stored(kube, JOBS, name)
            assert wrote_suspend(job, ("kratos-controller", "kratos-webhook")) == [], name
            assert (
                "kratos-controller" in {e["manager"] for e in job["metadata"]["managedFields"]}
                or name == "sweep-0"
            )
        assert wrote_suspend(stored(kube, JOBS, "sweep-1"), (KUEUE_MANAGER,)) == [KUEUE_MANAGER]
        for call in kube.calls("PATCH", r"/jobs/sweep-[12]$"):
            assert call.query.get("fieldManager") in ("kratos-controller", KUEUE_MANAGER)


def with_kueue_check_rbac(kube: KubeDouble) -> list[dict[str, Any]]:
    """The base's RBAC and the kueue-admission-check component's, stored in the double; the
    component's own rules returned."""
    overlay = REPO / "webhook-config" / "components" / "kueue-admission-check"
    component = [o for o in render_component(overlay) if o["kind"] in RBAC_KINDS]
    install_rbac(kube)
    install_rbac(kube, component)
    return [
        o
        for o in component
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "kratos-controller-kueue"
    ]


def render_component(component: Path) -> list[dict[str, Any]]:
    """The base with ``component``, rendered as a user's overlay would (kubectl kustomize)."""
    with tempfile.TemporaryDirectory() as root:
        shutil.copytree(REPO / "webhook-config", Path(root) / "base")
        overlay = Path(root) / "overlay"
        overlay.mkdir()
        (overlay / "kustomization.yaml").write_text(
            f"resources: [../base]\ncomponents: [../base/components/{component.name}]\n"
        )
        return render(overlay)


def workload_of(job: dict[str, Any] | None) -> dict[str, Any]:
    """The Workload Kueue makes for a Job (``None``: one a person made, owned by nothing), as it stands
    once quota is reserved and the checks of its ClusterQueue are added, Pending."""
    meta = job["metadata"] if job is not None else {"name": "by-hand"}
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta.get("uid", ""),
             "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    pending = {"state": "Pending", "message": "", "lastTransitionTime": "2026-11-26T10:00:00Z"}
    workload: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {"name": f"job-{meta['name']}-1a2b3", "namespace": "team-a"},
        "spec": {"queueName": "team", "podSets": [{"name": "main", "count": 1}]},
        "status": {"admissionChecks": [{"name": "other-check", **pending}, {"name": CHECK, **pending}]},
    }
    if job is not None:
        workload["metadata"]["ownerReferences"] = [owner]
    return workload


def check_of(kube: KubeDouble, workload: dict[str, Any]) -> dict[str, Any]:
    found = kube.get(*WORKLOADS, "team-a", workload["metadata"]["name"]) or {}
    states: dict[str, dict[str, Any]] = {
        c["name"]: c for c in (found.get("status") or {}).get("admissionChecks") or []
    }
    return states[CHECK]


async def test_the_admission_check_holds_a_followers_workload_until_its_profile_settles(tmp_path: Path):
    kube = KubeDouble(kueue_installed=True)
    rules = with_kueue_check_rbac(kube)
    kube.put(*ADMISSION_CHECKS, {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
                                  "metadata": {"name": CHECK}, "spec": {"controllerName": v.ADMISSION_CHECK_CONTROLLER}})  # fmt: skip
    config = Config(kueue_admission_check=True)
    async with kratos_cluster(tmp_path, A100, L40S, kube=kube, controller_config=config) as (_, _, api):
        await eventually(
            lambda: (kube.get(*ADMISSION_CHECKS, "", CHECK) or {}).get("status", {}).get("conditions")
        )
        active = (kube.get(*ADMISSION_CHECKS, "", CHECK) or {})["status"]["conditions"][0]
        assert (active["type"], active["status"]) == ("Active", "True")
        await create(api, kueue_job("sweep-0"))
        profiling = kube.put(*WORKLOADS, workload_of(stored(kube, JOBS, "sweep-0")))
        await eventually(lambda: check_of(kube, profiling)["state"] == "Ready")
        await kueue_starts(api, "sweep-0")
        await eventually(lambda: phase(kube) == "Profiling")
        await create(api, kueue_job("sweep-1"))
        follower = kube.put(*WORKLOADS, workload_of(stored(kube, JOBS, "sweep-1")))
        other = kube.put(*WORKLOADS, workload_of(None))
        await eventually(lambda: check_of(kube, other)["state"] == "Ready")
        await eventually(lambda: "waiting for the profiling run" in check_of(kube, follower)["message"])
        assert check_of(kube, follower)["state"] == "Pending"
        await asyncio.sleep(0.5)
        assert check_of(kube, follower)["state"] == "Pending", "no Pod before the profile settles"
        others = {
            c["name"]: c
            for c in (kube.get(*WORKLOADS, "team-a", follower["metadata"]["name"]) or {})["status"][
                "admissionChecks"
            ]
        }
        assert others["other-check"]["state"] == "Pending", "another check's entry is left alone"
        await kube.run_jobs()
        await finish_profiling(kube)
        await eventually(lambda: check_of(kube, follower)["state"] == "Ready")
        job = stored(kube, JOBS, "sweep-1")
        assert not gated(job["spec"]["template"]["spec"]) and preferred(job["spec"]["template"]["spec"]), (
            "released before Kueue may start it"
        )
        assert job["spec"]["suspend"] is True
    refused = [
        d.attributes
        for d in kube.decisions
        if not d.allowed and d.attributes.user.endswith("kratos-controller")
    ]
    assert refused == []
    [role] = rules
    used = {
        (d.attributes.resource, d.attributes.subresource, d.attributes.verb)
        for d in kube.decisions
        if d.allowed and d.rule and d.rule[0][2] == role["metadata"]["name"]
    }
    granted = {
        (r.split("/")[0], r.split("/")[1] if "/" in r else "", verb)
        for rule in role["rules"]
        for r in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == used, "the component grants exactly what the AdmissionCheck calls"


async def test_without_kueues_crds_the_check_waits_and_the_rest_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    kube = KubeDouble()  # no Kueue
    with_kueue_check_rbac(kube)
    config = Config(kueue_admission_check=True, resync_seconds=1)
    with caplog.at_level(logging.WARNING, logger="kratos.controller"):
        async with kratos_cluster(tmp_path, A100, kube=kube, controller_config=config) as (_, _, api):
            job = copy.deepcopy(kueue_job("sweep-0"))
            del job["metadata"]["labels"][QUEUE]
            job["spec"]["suspend"] = False
            await create(api, job)
            await kube.run_jobs()
            await finish_profiling(kube)
            await eventually(lambda: phase(kube) == "Ready")
            await eventually(lambda: kube.get(*JOBS, "team-a", "sweep-0-execution"))
            await asyncio.sleep(1.5)  # a resync: looked at again, said once
    said = [r for r in caplog.records if "not served" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert json.dumps(stored(kube, PROFILES, "sweep-profile")["status"]["phase"]) == '"Ready"'
