"""The Kueue tier (issue 36): KRATOS as users run it, next to the real, unmodified Kueue.

Runs where the real-node tier runs (``KRATOS_E2E_KUBECONFIG``, ``KRATOS_E2E_REAL_NODE``, podman and
``CONTAINERD_ADDRESS``) and ``KRATOS_E2E_KUEUE=1`` says Kueue (v0.13, kueue.x-k8s.io/v1beta1) is
installed and its controller Ready. It builds the images, installs KRATOS with the README's steps 2
and 3, and gives Kueue a ResourceFlavor of the node's GPU product, ClusterQueues of 2 GPUs covering
``cpu``, ``memory`` and ``nvidia.com/gpu`` (one of them listing KRATOS's AdmissionCheck) and their
LocalQueues in the users' namespace. Then, each a test: a new workload's profiling run and execution
Job queued and admitted by Kueue; four followers of a workload under profiling, without and with the
AdmissionCheck; a Ready profile's Job; the two mutating webhooks in either order; a Kueue that is
down; both webhooks' latency over the same creates. At the end it uninstalls KRATOS as
docs/operations.md says and deletes what it made; Kueue stays as it found it.

Kueue's Pods run with the real node's fake GPUs; the profiling runs meet Debian's real Nsight Compute,
which without a GPU fails in its own words (``no-gpu``), so followers are released with base hints.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import difflib
import json
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from kratos_admit.domain import vocabulary as v
from kratos_admit.webhook.certs import generate, service_dns_names
from tests.e2e.real_cluster import kubectl
from tests.e2e.real_node import (
    ADMIT_IMAGE,
    NAMESPACE,
    Obj,
    Tier,
    build_images,
    documented_uninstall,
    finished_in,
    mean_seconds,
    metric_histogram,
    pod_metric,
    pods,
    profile_status,
    readme_install,
    sh,
    train_job,
    until,
    why_not,
    working_copy,
)
from tests.harness import REPO

USERS = "team-q"
FLAVOR = "kratos-e2e-gpu"
QUEUES = {"team": "kratos-e2e", "checked": "kratos-e2e-checked"}  # LocalQueue -> its ClusterQueue
QUOTA_GPUS = 2
CHECK = "kratos-profile"
KRATOS_MANAGERS = ("kratos-controller", "kratos-release", v.ADMISSION_CHECK_CONTROLLER)


def _why_not() -> str | None:
    if (reason := why_not()) is not None:
        return reason
    if os.environ.get("KRATOS_E2E_KUEUE") != "1":
        return "Kueue tier: set KRATOS_E2E_KUEUE=1 where Kueue v0.13 runs on the real node's cluster"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


def node_product() -> str:
    nodes = json.loads(kubectl("get", "nodes", "-l", "nvidia.com/gpu.present=true", "-o", "json"))["items"]
    assert nodes, "the real node advertises fake GPUs (node.sh gpus N)"
    return str(nodes[0]["metadata"]["labels"][v.GPU_PRODUCT_LABEL])


def kueue_objects(product: str) -> list[Obj]:
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR},
              "spec": {"nodeLabels": {v.GPU_PRODUCT_LABEL: product}}}  # fmt: skip
    objects: list[Obj] = [flavor]
    for local, cluster in QUEUES.items():
        spec: Obj = {
            "namespaceSelector": {},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory", v.GPU_RESOURCE],
                "flavors": [{"name": FLAVOR, "resources": [
                    {"name": "cpu", "nominalQuota": "16"}, {"name": "memory", "nominalQuota": "64Gi"},
                    {"name": v.GPU_RESOURCE, "nominalQuota": QUOTA_GPUS},
                ]}],
            }],
        }  # fmt: skip
        if local == "checked":
            spec["admissionChecks"] = [CHECK]
        objects.append({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
                        "metadata": {"name": cluster}, "spec": spec})  # fmt: skip
        objects.append({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                        "metadata": {"name": local, "namespace": USERS}, "spec": {"clusterQueue": cluster}})  # fmt: skip
    return objects


@dataclass
class KueueTier:
    tier: Tier
    product: str
    figures: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def kueue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KueueTier]:
    tier = working_copy(tmp_path_factory)
    build_images(tier)
    readme_install(tier)
    kubectl("create", "namespace", USERS)
    kubectl("label", "namespace", USERS, f"{v.NAMESPACE_LABEL}=enabled")
    product = node_product()
    objects = kueue_objects(product)
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    state = KueueTier(tier, product)
    try:
        yield state
    finally:
        print("kueue tier figures:", json.dumps(state.figures))
        kubectl("delete", "namespace", USERS, "--ignore-not-found", "--timeout=180s", check=False)
        for obj in reversed(objects):
            if obj["kind"] != "LocalQueue":
                kubectl(
                    "delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found", check=False
                )
        documented_uninstall(tier)


def user_job(name: str, *, seconds: int = 0) -> Obj:
    """A ``python train.py`` Job of workload ``name`` less its last ``-suffix`` (``sweep-1``: sweep)."""
    job = train_job(name, USERS, seconds=seconds)
    job["metadata"]["labels"][v.WORKLOAD_LABEL] = name.rsplit("-", 1)[0] if "-" in name else name
    return job


def queued_job(name: str, queue: str = "team", *, seconds: int = 0) -> Obj:
    job = user_job(name, seconds=seconds)
    job["metadata"]["labels"][v.KUEUE_QUEUE_LABEL] = queue
    return job


def blocker(name: str, queue: str) -> Obj:
    """A Job KRATOS does not know (no workload label) that takes the whole quota for a while."""
    job = train_job(name, USERS, seconds=25)
    job["metadata"]["labels"] = {v.KUEUE_QUEUE_LABEL: queue}
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {v.GPU_RESOURCE: QUOTA_GPUS}}
    job["spec"]["template"]["spec"]["tolerations"] = [{"key": v.GPU_TAINT_KEY, "operator": "Exists"}]
    return job


def get(kind: str, name: str) -> Obj | None:
    found = kubectl("-n", USERS, "get", kind, name, "-o", "json", "--ignore-not-found")
    return json.loads(found) if found.strip() else None


def workload_of(job: str) -> Obj | None:
    listed = json.loads(kubectl("-n", USERS, "get", "workloads.kueue.x-k8s.io", "-o", "json"))["items"]
    owned = [w for w in listed if any(r["name"] == job for r in w["metadata"].get("ownerReferences", []))]
    return owned[0] if owned else None


def condition(obj: Obj | None, kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in ((obj or {}).get("status") or {}).get("conditions", [])
    )


def kratos_wrote_suspend(job: Obj) -> list[str]:
    """KRATOS's field managers that own ``spec.suspend`` in the Job's managedFields."""
    return [
        entry["manager"]
        for entry in job["metadata"].get("managedFields", [])
        if entry["manager"] in KRATOS_MANAGERS
        and "f:suspend" in json.dumps(entry.get("fieldsV1", {}).get("f:spec", {}))
    ]


def stamp(value: str) -> float:
    return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ"))


class Sampler:
    """Every half second: the users' Pods (bound or not, GPUs asked), the workload's profile phase, and
    the Workloads' admission-check states."""

    def __init__(self, workload: str) -> None:
        self.workload = workload
        self.samples: list[Obj] = []
        self.stop = threading.Event()
        self.worker = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self.stop.is_set():
            listed = json.loads(kubectl("-n", USERS, "get", "pods,workloads.kueue.x-k8s.io", "-o", "json"))[
                "items"
            ]
            self.samples.append({
                "t": time.time(),
                "phase": profile_status(USERS, self.workload).get("phase"),
                "pods": [{
                    "name": p["metadata"]["name"], "job": p["metadata"].get("labels", {}).get("job-name", ""),
                    "bound": bool(p["spec"].get("nodeName")), "phase": p["status"].get("phase"),
                    "gpus": sum(int((c.get("resources") or {}).get("limits", {}).get(v.GPU_RESOURCE, 0)) for c in p["spec"]["containers"]),
                } for p in listed if p["kind"] == "Pod"],
                "checks": {w["metadata"]["name"]: [c["state"] for c in (w.get("status") or {}).get("admissionChecks", [])]
                           for w in listed if p_kind(w) == "Workload"},
            })  # fmt: skip
            self.stop.wait(0.5)

    def __enter__(self) -> Sampler:
        self.worker.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.worker.join(30)

    def gpus_in_use(self) -> list[int]:
        return [
            sum(p["gpus"] for p in s["pods"] if p["bound"] and p["phase"] in ("Pending", "Running"))
            for s in self.samples
        ]

    def followers_seen_while_profiling(self, followers: list[str], *, bound: bool) -> list[str]:
        return sorted({
            p["name"] for s in self.samples if s["phase"] == "Profiling"
            for p in s["pods"] if p["job"] in followers and (p["bound"] or not bound)
        })  # fmt: skip


def p_kind(obj: Obj) -> str:
    return str(obj.get("kind", ""))


def run_followers(kueue: KueueTier, workload: str, queue: str) -> tuple[Sampler, list[str]]:
    """A blocker takes the queue's quota; the workload's first Job becomes its profiling run (queued
    behind it, the profile Profiling); four followers arrive; then everything runs to its end."""
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(blocker(f"{workload}-blocker", queue)))
    until(
        lambda: condition(workload_of(f"{workload}-blocker"), "Admitted"),
        timeout=120,
        what="the blocker admitted",
    )
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(queued_job(f"{workload}-0", queue)))
    until(
        lambda: profile_status(USERS, workload).get("phase") == "Profiling",
        timeout=60,
        what="the profile Profiling",
    )
    followers = [f"{workload}-{i}" for i in range(1, 5)]
    with Sampler(workload) as sampler:
        kubectl(
            "apply",
            "-f",
            "-",
            stdin=yaml.safe_dump_all([queued_job(name, queue, seconds=3) for name in followers]),
        )
        for name in (f"{workload}-0-execution", *followers):
            until(lambda name=name: finished_in(USERS, name), timeout=420, what=f"{name} finished")
    return sampler, followers


def follower_figures(kueue: KueueTier, workload: str, followers: list[str]) -> list[float]:
    """Seconds from each follower's creation to its Pod's start, and the checks on each Job."""
    waits = []
    settled = profile_status(USERS, workload)
    published = max(
        stamp(c["lastTransitionTime"])
        for c in settled.get("conditions", []) or [{"lastTransitionTime": settled["profiledAt"]}]
    )
    for name in followers:
        job = get("job", name)
        assert job is not None and job["status"].get("succeeded") == 1, (name, job and job["status"])
        assert job["spec"]["suspend"] is False
        assert kratos_wrote_suspend(job) == [], (name, job["metadata"]["managedFields"])
        record = json.loads(job["metadata"]["annotations"][v.HINTS_ANNOTATION])
        assert "runtimeClassName" in record["injected"], record
        assert f"WorkloadProfile {workload}-profile is Failed" in record.get("reason", ""), record
        [pod] = pods(USERS, f"job-name={name}")
        assert pod["spec"]["runtimeClassName"] == "nvidia" and not pod["spec"].get("schedulingGates")
        scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert stamp(scheduled["lastTransitionTime"]) >= published - 1, (
            name,
            "scheduled before the profile settled",
        )
        started = pod["status"]["containerStatuses"][0]["state"]["terminated"]["startedAt"]
        waits.append(stamp(started) - stamp(job["metadata"]["creationTimestamp"]))
    return waits


def test_1_a_new_workloads_profiling_run_and_its_execution_job_are_queued_and_admitted_by_kueue(
    kueue: KueueTier,
):
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(queued_job("solo")))
    created = get("job", "solo")
    assert created is not None and created["metadata"]["labels"][v.ROLE_LABEL] == "profiling"
    until(
        lambda: condition(workload_of("solo"), "Admitted"),
        timeout=120,
        what="the profiling run admitted by Kueue",
    )
    until(lambda: finished_in(USERS, "solo"), timeout=240, what="the profiling run finished")
    assert profile_status(USERS, "solo").get("failure") == "no-gpu"
    execution = until(lambda: get("job", "solo-execution"), timeout=120, what="solo-execution created")
    assert execution["metadata"]["labels"][v.KUEUE_QUEUE_LABEL] == "team", (
        "what Kueue queues, KRATOS keeps queued"
    )
    until(
        lambda: condition(workload_of("solo-execution"), "Admitted"),
        timeout=120,
        what="the execution Job admitted",
    )
    until(lambda: finished_in(USERS, "solo-execution"), timeout=240, what="solo-execution finished")
    for name in ("solo", "solo-execution"):
        job = get("job", name)
        assert job is not None and kratos_wrote_suspend(job) == [], name
    assert get("job", "solo-execution")["status"].get("succeeded") == 1  # type: ignore[index]


def test_2_four_followers_wait_unscheduled_while_profiling_then_run_with_hints_within_the_quota(
    kueue: KueueTier,
):
    sampler, followers = run_followers(kueue, "sweep", "team")
    early = sampler.followers_seen_while_profiling(followers, bound=True)
    assert early == [], f"follower Pods scheduled while the profile was Profiling: {early}"
    created_early = sampler.followers_seen_while_profiling(followers, bound=False)
    assert max(sampler.gpus_in_use()) <= QUOTA_GPUS, sampler.gpus_in_use()
    waits = follower_figures(kueue, "sweep", followers)
    kueue.figures["followers"] = {
        "creation to run s": waits, "samples": len(sampler.samples), "max GPUs in use": max(sampler.gpus_in_use()),
        "follower Pods created (gated) while Profiling": created_early,
    }  # fmt: skip
    print(f"followers: creation to run {waits} s; {len(sampler.samples)} samples, GPUs in use at most "
          f"{max(sampler.gpus_in_use())} of {QUOTA_GPUS}; gated while profiling: {created_early}")  # fmt: skip


def test_3_with_the_admission_check_no_follower_pod_is_even_created_before_the_profile_settles(
    kueue: KueueTier,
):
    overlay = kueue.tier.work / "my-kratos" / "kustomization.yaml"
    text = overlay.read_text().replace(
        "# components: [../webhook-config/components/scheduler-kai]",
        "components: [../webhook-config/components/kueue-admission-check]",
    )
    overlay.write_text(text)
    sh(
        "kubectl apply -k my-kratos/ && kubectl -n kratos-system rollout status deploy/kratos-controller --timeout=180s",
        kueue.tier,
        timeout=240,
    )
    until(
        lambda: condition(json.loads(kubectl("get", "admissioncheck", CHECK, "-o", "json")), "Active"),
        timeout=120, what="the AdmissionCheck Active",
    )  # fmt: skip
    until(
        lambda: condition(json.loads(kubectl("get", "clusterqueue", QUEUES["checked"], "-o", "json")), "Active"),
        timeout=60, what="the checked ClusterQueue active",
    )  # fmt: skip
    sampler, followers = run_followers(kueue, "gated", "checked")
    created = sampler.followers_seen_while_profiling(followers, bound=False)
    assert created == [], f"follower Pods created while the profile was Profiling: {created}"
    pending = [
        s
        for s in sampler.samples
        if s["phase"] == "Profiling" and any("Pending" in states for states in s["checks"].values())
    ]
    assert pending, "a follower's Workload waited on the check while the run was under way"
    assert max(sampler.gpus_in_use()) <= QUOTA_GPUS
    waits = follower_figures(kueue, "gated", followers)
    kueue.figures["followers with the AdmissionCheck"] = {"creation to run s": waits, "samples": len(sampler.samples),
                                                          "max GPUs in use": max(sampler.gpus_in_use())}  # fmt: skip
    print(
        f"followers with the AdmissionCheck: creation to run {waits} s; none created before the profile settled"
    )


def ready_profile(workload: str) -> Obj:
    return {
        "apiVersion": v.API_VERSION, "kind": v.PROFILE_KIND,
        "metadata": {"name": f"{workload}-profile", "namespace": USERS},
        "spec": {"workload": workload},
    }  # fmt: skip


def make_ready(workload: str, phase: str = "Ready") -> None:
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(ready_profile(workload)))
    status = {
        "status": {
            "phase": phase,
            "boundType": "memory",
            "metrics": {"smThroughput": "12.0", "memoryThroughput": "85.0"},
        }
    }
    if phase == "Profiling":
        status = {"status": {"phase": "Profiling", "sourceJob": f"{workload}-0", "message": "under way"}}
    kubectl(
        "-n",
        USERS,
        "patch",
        "workloadprofile",
        f"{workload}-profile",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )


def test_4_a_ready_profiles_job_is_admitted_by_kueue_and_runs_with_the_hints_intact(kueue: KueueTier):
    make_ready("ready")
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(queued_job("ready-1", seconds=2)))
    until(
        lambda: condition(workload_of("ready-1"), "Admitted"), timeout=120, what="ready-1 admitted by Kueue"
    )
    until(lambda: finished_in(USERS, "ready-1"), timeout=240, what="ready-1 finished")
    job = get("job", "ready-1")
    assert job is not None and job["status"].get("succeeded") == 1
    [pod] = pods(USERS, "job-name=ready-1")
    terms = pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(kueue.product in json.dumps(t) for t in terms), terms
    assert pod["spec"]["nodeSelector"] == {v.GPU_PRODUCT_LABEL: kueue.product}, "Kueue's flavor"
    assert json.loads(pod["metadata"]["annotations"][v.HINTS_ANNOTATION])["profile"] == "ready-profile"
    assert kratos_wrote_suspend(job) == []


def dry_run(obj: Obj) -> Obj:
    created: Obj = json.loads(
        kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=yaml.safe_dump(obj))
    )
    return created


def decision(obj: Obj) -> Obj:
    """What the two webhooks made of a Job, without the server's own fields (the uid it makes for each
    create, and the selector and template labels it derives from that uid)."""
    out = copy.deepcopy(obj)
    for key in ("uid", "creationTimestamp", "managedFields", "resourceVersion", "generation"):
        out["metadata"].pop(key, None)
    out.pop("status", None)
    if "spec" in out and "template" in out["spec"]:
        out["spec"].pop("selector", None)
        for label in ("controller-uid", "batch.kubernetes.io/controller-uid"):
            out["spec"]["template"].get("metadata", {}).get("labels", {}).pop(label, None)
    return out


def test_5_the_two_mutating_webhooks_give_the_same_decisions_in_either_order(kueue: KueueTier):
    make_ready("order-ready")
    make_ready("order-held", phase="Profiling")
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "default", "namespace": USERS},
         "spec": {"clusterQueue": QUEUES["team"]}}))  # fmt: skip
    unlabelled = user_job("order-held-9")  # gets Kueue's LocalQueueDefaulting queue "default"
    cases = {"follower": queued_job("order-held-1"), "ready": queued_job("order-ready-1"),
             "new": queued_job("order-new-1"), "defaulted-follower": unlabelled}  # fmt: skip
    first = {name: decision(dry_run(job)) for name, job in cases.items()}
    hook = json.loads(kubectl("get", "mutatingwebhookconfiguration", "kratos-admit", "-o", "json"))
    renamed = decision(hook)
    renamed["metadata"]["name"] = "zz-kratos-admit"  # now after kueue-mutating-webhook-configuration
    try:
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump(renamed))
        kubectl("delete", "mutatingwebhookconfiguration", "kratos-admit")
        time.sleep(2)  # the API server's webhook manager follows its informer
        second = {name: decision(dry_run(job)) for name, job in cases.items()}
    finally:
        original = decision(hook)
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump(original))
        kubectl("delete", "mutatingwebhookconfiguration", "zz-kratos-admit", "--ignore-not-found")
        kubectl("-n", USERS, "delete", "localqueue", "default")
    for name in cases:
        if (
            name == "new"
        ):  # the profiling rewrite: the same, but for the template KRATOS kept of the Job it saw
            for out in (first[name], second[name]):
                out["metadata"]["annotations"].pop(v.ORIGINAL_TEMPLATE_ANNOTATION)
                out["metadata"]["annotations"].pop(v.SIGNATURE_ANNOTATION)
        assert first[name] == second[name], (name, "\n".join(difflib.unified_diff(
            yaml.safe_dump(first[name]).splitlines(), yaml.safe_dump(second[name]).splitlines(), lineterm="")))  # fmt: skip
    assert (
        first["follower"]["spec"]["suspend"] is True
        and first["defaulted-follower"]["metadata"]["labels"][v.KUEUE_QUEUE_LABEL] == "default"
    )
    held = first["defaulted-follower"]["spec"]["template"]["spec"]["schedulingGates"]
    assert held == [{"name": v.PROFILE_SCHEDULING_GATE}]
    print(f"webhook order: {len(cases)} cases ({', '.join(cases)}) give the same objects in both orders")


def test_6_a_kueue_that_is_down_fails_the_create_with_its_own_error_and_leaves_nothing_held(kueue: KueueTier):
    deploy = ("-n", "kueue-system", "deploy/kueue-controller-manager")
    kubectl("scale", *deploy, "--replicas=0")
    try:
        until(
            lambda: not pods("kueue-system", "control-plane=controller-manager"),
            timeout=120,
            what="Kueue's Pod gone",
        )
        for job in (
            queued_job("down-0"),
            queued_job("sweep-9"),
        ):  # a new workload; a follower of a Failed one
            done = sh(f"kubectl create -f - <<'YAML'\n{yaml.safe_dump(job)}YAML", kueue.tier, check=False)
            assert done.returncode != 0 and "mjob.kb.io" in done.stderr, done.stderr
            assert get("job", job["metadata"]["name"]) is None
        assert profile_status(USERS, "down") == {}, "no profile, no run recorded"
    finally:
        kubectl("scale", *deploy, "--replicas=1")
        kubectl(
            "-n", "kueue-system", "rollout", "status", "deploy/kueue-controller-manager", "--timeout=180s"
        )
        until(dry_run_suspended, timeout=120, what="Kueue's Job webhook answers again")
    # the user submits the same Job again: profiled, not held behind the run that was never stored
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(queued_job("down-0")))
    again = get("job", "down-0")
    assert again is not None and again["metadata"]["labels"][v.ROLE_LABEL] == "profiling"
    assert v.AWAITING_PROFILE_ANNOTATION not in again["metadata"].get("annotations", {})


def dry_run_suspended() -> bool:
    probe = queued_job("probe")
    probe["metadata"]["labels"].pop(v.WORKLOAD_LABEL)
    done = kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=yaml.safe_dump(probe), check=False
    )
    return bool(done.strip()) and json.loads(done)["spec"].get("suspend") is True


KRATOS_HOOK = "mutate.gpu.scheduler.io"
FLOOR = (
    "kratos-e2e-floor"  # namespace; Service, Deployment and MutatingWebhookConfiguration of the plain floor
)
FLOOR_HOOK = "floor.kratos-e2e.io"
PATCHING = "kratos-e2e-floor-patch"  # the patching floor's Service and Deployment
PATCHING_HOOK = "patch.floor.kratos-e2e.io"
# mutating webhooks are called in the order of their configurations' names: the patching floor's
# sorts before kratos-admit, so its change never makes the API server call KRATOS again
PATCHING_CONFIGURATION = "a-kratos-e2e-floor-patch"
FLOORS = {FLOOR: (FLOOR_HOOK, FLOOR, []), PATCHING: (PATCHING_HOOK, PATCHING_CONFIGURATION,
          ["--patch-annotation", "kratos-e2e.io/floor=patched"])}  # fmt: skip


def floor_objects(name: str, ca: str) -> list[Obj]:
    """A floor (``python -m kratos_admit.webhook.floor``: parse, echo the uid, allow; the patching
    one also sets one annotation) as a webhook in Pods: KRATOS's image, Deployment shape (2
    replicas, its requests and limits, HTTPS readiness), Service and webhook registration (rules,
    selectors, timeout, failurePolicy), so that what the API server measures for it is what any
    aiohttp webhook in a Pod on this node costs, and with a patch, any webhook that changes the object."""
    hook_name, configuration, more = FLOORS[name]
    labels = {"app": name}
    deployment = yaml.safe_load((REPO / "webhook-config" / "webhook-deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    pod: Obj = {
        "containers": [{
            "name": "floor", "image": ADMIT_IMAGE, "imagePullPolicy": "Never",
            "command": ["python", "-m", "kratos_admit.webhook.floor"],
            "args": ["--listen", "0.0.0.0:8443", "--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key", *more],
            "ports": [{"containerPort": 8443, "name": "https"}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8443, "scheme": "HTTPS"}, "periodSeconds": 2},
            "resources": container["resources"],
            "securityContext": container["securityContext"],
            "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": True}],
        }],
        "volumes": [{"name": "tls", "secret": {"secretName": FLOOR}}],
    }  # fmt: skip
    kratos_hook = next(
        hook
        for doc in yaml.safe_load_all((REPO / "webhook-config" / "webhooks.yaml").read_text())
        if doc["kind"] == "MutatingWebhookConfiguration"
        for hook in doc["webhooks"]
        if hook["name"] == KRATOS_HOOK
    )
    hook = {
        **copy.deepcopy(kratos_hook), "name": hook_name, "reinvocationPolicy": "Never",
        "clientConfig": {"caBundle": ca, "service": {"name": name, "namespace": FLOOR, "path": "/mutate", "port": 443}},
    }  # fmt: skip
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": FLOOR},
         "spec": {"replicas": deployment["spec"]["replicas"], "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": pod}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": FLOOR},
         "spec": {"selector": labels, "ports": [{"port": 443, "targetPort": 8443}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": configuration}, "webhooks": [hook]},
    ]  # fmt: skip


def floors_answer() -> bool:
    """A server dry-run create that the floors select goes through with the patching floor's
    annotation (failurePolicy Fail: until their endpoints are ready, the API server fails it)."""
    probe = yaml.safe_dump(queued_job("floor-probe"))
    done = kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=probe, check=False)
    annotations = json.loads(done)["metadata"].get("annotations", {}) if done.strip() else {}
    return annotations.get("kratos-e2e.io/floor") == "patched"


@contextlib.contextmanager
def floor_webhooks(tier: Tier) -> Iterator[None]:
    """Both floors installed for the block: their certificate from ``kratos-admit certs``' own code,
    rolled out and answering the API server before the block starts; all of it deleted after."""
    certs = generate(
        service=FLOOR,
        namespace=FLOOR,
        out=tier.work / "floor-certs",
        extra_names=service_dns_names(PATCHING, FLOOR),
    )
    kubectl("create", "namespace", FLOOR)
    try:
        kubectl(
            "-n", FLOOR, "create", "secret", "tls", FLOOR,
            f"--cert={certs.directory / 'tls.crt'}", f"--key={certs.directory / 'tls.key'}",
        )  # fmt: skip
        ca = base64.b64encode((certs.directory / "ca.crt").read_bytes()).decode()
        for name in FLOORS:
            kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(floor_objects(name, ca)))
        for name in FLOORS:
            kubectl("-n", FLOOR, "rollout", "status", f"deployment/{name}", "--timeout=180s")
        until(floors_answer, timeout=90, what="the API server reaches both floors through their Services")
        yield
    finally:
        for _, configuration, _ in FLOORS.values():
            kubectl(
                "delete", "mutatingwebhookconfiguration", configuration, "--ignore-not-found", check=False
            )
        kubectl("delete", "namespace", FLOOR, "--ignore-not-found", "--timeout=180s", check=False)


HOOKS = (KRATOS_HOOK, "mjob.kb.io", FLOOR_HOOK, PATCHING_HOOK)
IN_PROCESS = 'kratos_admission_duration_seconds_{}{{webhook="mutate"}}'  # KRATOS's own: body read to answer


def in_process() -> tuple[float, float]:
    """KRATOS's own histogram of its mutating answers over both webhook Pods: (sum s, count)."""
    total, count = (
        pod_metric(NAMESPACE, "app.kubernetes.io/name=kratos-webhook", IN_PROCESS.format(part))
        for part in ("sum", "count")
    )
    return total, count


def latency_over_creates(tier: Tier, job: Obj) -> dict[str, Any]:
    """LATENCY_CREATES server dry-run creates of ``job``, one after another (as a user's kubectl
    does): each webhook's mean and calls from the API server's histogram, and KRATOS's mean from its own."""
    before = {hook: metric_histogram(hook) for hook in HOOKS}
    own = in_process()
    text = yaml.safe_dump(job)
    sh(
        f"for i in $(seq {LATENCY_CREATES}); do kubectl create --dry-run=server -o name -f - <<'YAML' >/dev/null\n{text}YAML\ndone",
        tier,
        timeout=900,
    )
    after = {hook: metric_histogram(hook) for hook in HOOKS}
    own_after = in_process()
    calls = {hook: after[hook].get(float("inf"), 0.0) - before[hook].get(float("inf"), 0.0) for hook in HOOKS}
    means = {hook: round(mean_seconds(before[hook], after[hook]) * 1000, 3) for hook in HOOKS}
    answered = own_after[1] - own[1]
    return {
        "means ms": means,
        "calls": calls,
        "KRATOS in process ms": round((own_after[0] - own[0]) / answered * 1000, 3)
        if answered
        else float("nan"),
        "KRATOS / floor": round(means[KRATOS_HOOK] / means[FLOOR_HOOK], 2),
        "KRATOS / patching floor": round(means[KRATOS_HOOK] / means[PATCHING_HOOK], 2),
        "KRATOS / Kueue": round(means[KRATOS_HOOK] / means["mjob.kb.io"], 2),
    }


def test_7_the_webhooks_latency_over_the_same_creates(kueue: KueueTier):
    """Issue 44 item 4: the API server's own histogram over the same creates, for KRATOS's mutating
    webhook, Kueue's ``mjob.kb.io`` and two floors in Pods beside them (the plain one; one that sets an
    annotation: what the API server spends applying any patch), and KRATOS's own histogram (what of
    it is KRATOS's work), for two Jobs of a Ready profile (hints):
    - queued (Kueue's label): Kueue suspends it after KRATOS hinted it, so the API server calls
      KRATOS again (``reinvocationPolicy: IfNeeded``), and the second answer changes nothing;
    - not queued: Kueue changes nothing, and KRATOS is called once per create, with its patch.
    Recorded, not asserted: a figure of speed on a shared machine is a benchmark's
    (docs/benchmarks.md), not a test's."""
    make_ready("latency")
    queued = queued_job("latency-1")
    plain = user_job("latency-2")
    with floor_webhooks(kueue.tier):
        figures = {
            "queued": latency_over_creates(kueue.tier, queued),
            "not queued": latency_over_creates(kueue.tier, plain),
        }
    kueue.figures[f"webhook latency over {LATENCY_CREATES} creates"] = figures
    for what, got in figures.items():
        print(f"latency over {LATENCY_CREATES} server dry-run creates, {what} (means, the API server's histogram): "
              f"KRATOS mutate {got['means ms'][KRATOS_HOOK]:.2f} ms, Kueue mjob.kb.io {got['means ms']['mjob.kb.io']:.2f} ms, "
              f"floor {got['means ms'][FLOOR_HOOK]:.2f} ms, patching floor {got['means ms'][PATCHING_HOOK]:.2f} ms; "
              f"KRATOS/floor {got['KRATOS / floor']:.2f}x, KRATOS/patching floor {got['KRATOS / patching floor']:.2f}x, "
              f"KRATOS/Kueue {got['KRATOS / Kueue']:.2f}x; KRATOS in process {got['KRATOS in process ms']:.3f} ms; calls {got['calls']}")  # fmt: skip
        assert not any(math.isnan(m) for m in got["means ms"].values()), (
            f"all four webhooks were called: {got}"
        )
        # at least: a Job controller's or a release's create in the namespace meanwhile is counted too
        assert got["calls"][FLOOR_HOOK] >= LATENCY_CREATES, "the floor saw every create"
        assert got["calls"][PATCHING_HOOK] >= LATENCY_CREATES, "the patching floor saw every create"
        assert got["calls"][KRATOS_HOOK] >= LATENCY_CREATES, "KRATOS saw every create"
    assert figures["queued"]["calls"][KRATOS_HOOK] >= 2 * LATENCY_CREATES, "reinvoked after Kueue's change"


LATENCY_CREATES = 300
