"""The gang tier (issue 49): distributed training runs whole, on the real node, with KRATOS installed
as the README says, next to the real JobSet and, where it runs, the real Kueue.

Runs where the real-node tier runs (``KRATOS_E2E_KUBECONFIG``, ``KRATOS_E2E_REAL_NODE``, podman and
``CONTAINERD_ADDRESS``) and ``KRATOS_E2E_JOBSET=1`` says the JobSet v0.11 controller runs on the
cluster; with ``KRATOS_E2E_KUEUE=1`` (Kueue v0.13 running) every case runs again queued by Kueue. Each
case is a gang of a workload of its own, first without a profile and then with a Ready one:

- an Indexed Job of 2 Pods that really rendezvous: index 1 reaches index 0 over TCP as torchrun's
  static rendezvous does (the node has no cluster DNS, so a ClusterIP Service in front of index 0
  gives index 1 its address in its environment, as ``--master-addr`` would) and both fail without
  it (the first test shows index 0 alone failing: what KRATOS's profiling rewrite used to make);
- a Job of one Pod on 2 GPUs (the node's fake GPUs);
- a JobSet of two Jobs, opted in through its replicated Job's template labels.

Each completes with no profiling run, no Job or Pod suspended, gated or rewritten by KRATOS (its
spec as the user, or JobSet, wrote it), its Pods with base hints, or with a profile ranked hints and
one GPU product. At the end KRATOS is uninstalled as docs/operations.md says.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from kratos_admit.domain import vocabulary as v
from tests.e2e.real_cluster import kubectl
from tests.e2e.real_node import (
    TRAIN_IMAGE,
    Obj,
    Tier,
    build_images,
    documented_uninstall,
    pods,
    readme_install,
    until,
    why_not,
    working_copy,
)

USERS = "team-g"
PLAIN = "team-g-plain"  # not opted in: what a gang does without KRATOS
QUEUE, CLUSTER_QUEUE, FLAVOR = "gangs", "kratos-e2e-gangs", "kratos-e2e-gangs"
KUEUE = os.environ.get("KRATOS_E2E_KUEUE") == "1"
# managers of KRATOS's own writes (the controller and its release loop)
KRATOS_MANAGERS = ("kratos-controller", "kratos-release", v.ADMISSION_CHECK_CONTROLLER)


def _why_not() -> str | None:
    if (reason := why_not()) is not None:
        return reason
    if os.environ.get("KRATOS_E2E_JOBSET") != "1":
        return "gang tier: set KRATOS_E2E_JOBSET=1 where the JobSet v0.11 controller runs on the real node's cluster"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))

# Index 0 waits for WORLD_SIZE - 1 peers on port 29500; every other index connects to it through the
# Service named by RDZV_SERVICE (its address in the environment, the kubelet's service links), retrying
# until RDZV_TIMEOUT. Either fails when the other side never comes.
RENDEZVOUS = r"""
import os, socket, sys, time
index, world = int(os.environ["JOB_COMPLETION_INDEX"]), int(os.environ["WORLD_SIZE"])
deadline = time.monotonic() + float(os.environ.get("RDZV_TIMEOUT", "90"))
if index == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 29500))
    server.listen(world)
    peers = set()
    while len(peers) < world - 1:
        server.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            conn, _ = server.accept()
        except socket.timeout:
            print(f"rank 0: {len(peers)} of {world - 1} peers before the timeout", flush=True)
            sys.exit(1)
        peers.add(int(conn.recv(64).decode().split()[1]))
        conn.sendall(b"welcome")
        conn.close()
    print(f"rank 0: every peer reached me: {sorted(peers)}", flush=True)
else:
    prefix = os.environ["RDZV_SERVICE"].upper().replace("-", "_")
    host, port = os.environ.get(prefix + "_SERVICE_HOST"), int(os.environ.get(prefix + "_SERVICE_PORT", "29500"))
    while True:
        try:
            with socket.create_connection((host, port), timeout=2) as conn:
                conn.sendall(f"rank {index}".encode())
                if conn.recv(64) == b"welcome":
                    print(f"rank {index}: reached rank 0 at {host}:{port}", flush=True)
                    break
        except (OSError, TypeError) as exc:
            if time.monotonic() > deadline:
                print(f"rank {index}: rank 0 never answered at {host}:{port} ({exc})", flush=True)
                sys.exit(1)
            time.sleep(1)
"""


@dataclass
class GangTier:
    tier: Tier
    product: str
    figures: dict[str, Any] = field(default_factory=dict)


def kueue_objects() -> list[Obj]:
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}}
    resources = [{"name": "cpu", "nominalQuota": "16"}, {"name": "memory", "nominalQuota": "64Gi"},
                 {"name": v.GPU_RESOURCE, "nominalQuota": 4}]  # fmt: skip
    queue = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
             "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu", "memory", v.GPU_RESOURCE],
                                                                    "flavors": [{"name": FLAVOR, "resources": resources}]}]}}  # fmt: skip
    local = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": USERS},
             "spec": {"clusterQueue": CLUSTER_QUEUE}}  # fmt: skip
    return [flavor, queue, local]


@pytest.fixture(scope="module")
def gangs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GangTier]:
    tier = working_copy(tmp_path_factory)
    build_images(tier)
    readme_install(tier)
    for namespace in (USERS, PLAIN):
        kubectl("delete", "namespace", namespace, "--ignore-not-found", "--timeout=120s")
        kubectl("create", "namespace", namespace)
    kubectl("label", "namespace", USERS, f"{v.NAMESPACE_LABEL}=enabled")
    if KUEUE:
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(kueue_objects()))
    nodes = json.loads(kubectl("get", "nodes", "-l", f"{v.GPU_PRESENT_LABEL}=true", "-o", "json"))["items"]
    assert nodes, "the real node advertises fake GPUs (node.sh gpus N)"
    state = GangTier(tier, nodes[0]["metadata"]["labels"][v.GPU_PRODUCT_LABEL])
    try:
        yield state
    finally:
        print("gang tier figures:", json.dumps(state.figures))
        for namespace in (USERS, PLAIN):
            kubectl("delete", "namespace", namespace, "--ignore-not-found", "--timeout=180s", check=False)
        if KUEUE:
            for obj in reversed(kueue_objects()[:2]):
                kubectl(
                    "delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found", check=False
                )
        documented_uninstall(tier)


def container(name: str, command: list[str], gpus: int, **env: str) -> Obj:
    return {"name": name, "image": TRAIN_IMAGE, "imagePullPolicy": "IfNotPresent", "command": command,
            "env": [{"name": k, "value": val} for k, val in env.items()],
            "resources": {"limits": {v.GPU_RESOURCE: gpus}}}  # fmt: skip


def labelled(obj: Obj, workload: str, queue: bool) -> Obj:
    labels = obj["metadata"].setdefault("labels", {})
    if workload:
        labels[v.WORKLOAD_LABEL] = workload
    if queue:
        labels[v.KUEUE_QUEUE_LABEL] = QUEUE
    return obj


def rendezvous(name: str, workload: str, *, queue: bool, pods: int = 2, timeout: int = 90) -> list[Obj]:
    """The Service in front of index 0, and the Indexed Job whose Pods meet there."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{name}-rdzv"},
               "spec": {"selector": {v.JOB_NAME_LABEL: name, v.JOB_COMPLETION_INDEX: "0"},
                        "ports": [{"port": 29500, "targetPort": 29500}]}}  # fmt: skip
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"completionMode": "Indexed", "completions": pods, "parallelism": pods, "backoffLimit": 0,
                    "template": {"spec": {"restartPolicy": "Never", "containers": [container(
                        "train", ["python3", "-c", RENDEZVOUS], 1, WORLD_SIZE=str(pods),
                        RDZV_SERVICE=f"{name}-rdzv", RDZV_TIMEOUT=str(timeout))]}}}}  # fmt: skip
    return [service, labelled(job, workload, queue)]


def two_gpus(name: str, workload: str, *, queue: bool) -> list[Obj]:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [container(
               "train", ["python3", "-c", "import time; time.sleep(2); print('one program on 2 GPUs')"], 2)]}}}}  # fmt: skip
    return [labelled(job, workload, queue)]


def jobset(name: str, workload: str, *, queue: bool) -> list[Obj]:
    """A JobSet as a user writes it, opted in through its replicated Job's template labels."""
    worker = container(
        "worker", ["python3", "-c", "import os; print('worker', os.environ['JOB_COMPLETION_INDEX'])"], 1
    )
    replicated = {"name": "workers", "replicas": 2, "template": {
        "metadata": {"labels": {v.WORKLOAD_LABEL: workload}},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
                 "template": {"spec": {"restartPolicy": "Never", "containers": [worker]}}}}}  # fmt: skip
    obj = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
           "spec": {"replicatedJobs": [replicated]}}  # fmt: skip
    return [labelled(obj, "", queue)]


def create(objects: list[Obj], namespace: str = USERS) -> None:
    kubectl("create", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(objects))


def get(kind: str, name: str, namespace: str = USERS) -> Obj | None:
    found = kubectl("-n", namespace, "get", kind, name, "-o", "json", "--ignore-not-found")
    return json.loads(found) if found.strip() else None


def condition(obj: Obj | None, kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in ((obj or {}).get("status") or {}).get("conditions", [])
    )


def make_ready(workload: str) -> None:
    """A Ready compute-bound WorkloadProfile, as the controller publishes one (status subresource)."""
    profile = {"apiVersion": v.API_VERSION, "kind": v.PROFILE_KIND,
               "metadata": {"name": v.profile_name(workload), "namespace": USERS}, "spec": {"workload": workload}}  # fmt: skip
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(profile))
    # its links measured (an interconnect share): its runs are then observed by gang size
    status = {"phase": "Ready", "boundType": "compute", "source": "telemetry",
              "metrics": {"smThroughput": "85.0", "memoryThroughput": "20.0"},
              "timeShares": {"tensor": "0.50", "fp32": "0.00", "fp64": "0.00", "memory": "0.10",
                             "interconnect": "0.40", "latency": "0.00"}}  # fmt: skip
    kubectl("-n", USERS, "patch", "workloadprofile", v.profile_name(workload), "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": status}))  # fmt: skip


def ranked_at_admission(probe: Obj) -> bool:
    """A server-side dry run of a Job of the workload comes back with ranked hints: the webhook's cache
    has its profile (both replicas watch; the dry run is answered exactly like a real create)."""
    out = json.loads(
        kubectl(
            "create", "-n", USERS, "--dry-run=server", "-o", "json", "-f", "-", stdin=yaml.safe_dump(probe)
        )
    )
    record = json.loads(out["metadata"]["annotations"][v.HINTS_ANNOTATION])
    return bool(record.get("ranked"))


def written(job: Obj) -> tuple[Any, ...]:
    """What a gang keeps as written; a field left unset is the API server's default (set before any
    webhook runs)."""
    spec = job["spec"]
    containers = [(c.get("command"), c.get("args")) for c in spec["template"]["spec"]["containers"]]
    return (
        spec.get("parallelism", 1),
        spec.get("completions", 1),
        spec.get("completionMode", "NonIndexed"),
        containers,
    )


def kratos_wrote(obj: Obj, *fields: str) -> list[str]:
    """KRATOS's controller managers that own any of ``fields`` of the object's spec."""
    return [
        e["manager"] for e in obj["metadata"].get("managedFields", [])
        if e["manager"] in KRATOS_MANAGERS and any(f"f:{f}" in json.dumps(e.get("fieldsV1", {})) for f in fields)
    ]  # fmt: skip


def check_ran_whole(jobs: list[Obj], sent: list[Obj], workload: str, *, profiled: bool) -> set[str]:
    """Every Job of the gang as it was written, never held or gated by KRATOS, its hints record a
    gang's; every Pod with base hints (ranked ones with a profile); the GPU products they ran on."""
    for job, wrote in zip(jobs, sent, strict=True):
        assert written(job) == written(wrote), f"{job['metadata']['name']}: as written"
        annotations = job["metadata"]["annotations"]
        assert (
            v.AWAITING_PROFILE_ANNOTATION not in annotations and v.ROLE_LABEL not in job["metadata"]["labels"]
        )
        record = json.loads(annotations[v.HINTS_ANNOTATION])
        assert record["gang"] and not {"suspend", "schedulingGates"} & set(record["injected"]), record
        assert kratos_wrote(job, "suspend", "schedulingGates") == [], "KRATOS never held it"
        assert not job["spec"]["template"]["spec"].get("schedulingGates")
    ran = pods(USERS, f"{v.WORKLOAD_LABEL}={workload}")
    assert ran, "the gang's Pods carry the workload label"
    products = set()
    for pod in ran:
        assert pod["status"]["phase"] == "Succeeded", pod["metadata"]["name"]
        spec = pod["spec"]
        assert spec["runtimeClassName"] == "nvidia"
        assert {"key": v.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        record = json.loads(pod["metadata"]["annotations"][v.HINTS_ANNOTATION])
        assert record["gang"] and (record["profile"] == v.profile_name(workload)) is profiled, record
        preferred = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "preferredDuringSchedulingIgnoredDuringExecution"
        )
        assert bool(preferred) is profiled, "ranked hints only from a Ready profile"
        node = json.loads(kubectl("get", "node", spec["nodeName"], "-o", "json"))
        products.add(node["metadata"]["labels"][v.GPU_PRODUCT_LABEL])
    assert len(products) == 1, f"one GPU product: {products}"
    profiling = json.loads(
        kubectl("-n", USERS, "get", "jobs", "-l", f"{v.ROLE_LABEL}=profiling", "-o", "json")
    )
    assert profiling["items"] == [], "no profiling run"
    return products


def test_1_without_its_peer_a_rendezvous_fails(gangs: GangTier):
    """The program needs its peers: index 0 alone (what KRATOS's profiling rewrite used to leave of the
    gang, in a namespace KRATOS does not see) waits for index 1, which never comes, and fails."""
    [service, job] = rendezvous("alone", "", queue=False, pods=1, timeout=15)
    job["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = "2"  # a world of 2, 1 Pod
    create([service, job], PLAIN)
    until(lambda: condition(get("job", "alone", PLAIN), "Failed"), timeout=120, what="index 0 alone fails")
    [pod] = pods(PLAIN, f"{v.JOB_NAME_LABEL}=alone")
    log = kubectl("-n", PLAIN, "logs", pod["metadata"]["name"])
    assert "rank 0: 0 of 1 peers before the timeout" in log


CASES = [("rendezvous", rendezvous), ("two-gpus", two_gpus), ("jobset", jobset)]
VARIANTS = [(False, False), (False, True)] + ([(True, False), (True, True)] if KUEUE else [])


@pytest.mark.parametrize(("queued", "profiled"), VARIANTS,
                         ids=[f"{'kueue' if q else 'plain'}-{'profile' if p else 'no-profile'}" for q, p in VARIANTS])  # fmt: skip
@pytest.mark.parametrize(("case", "make"), CASES, ids=[c for c, _ in CASES])
def test_2_a_gang_completes_as_written_with_no_profiling_run(
    gangs: GangTier, case: str, make: Any, queued: bool, profiled: bool
):
    name = f"{case}-{'q' if queued else 'p'}{'r' if profiled else 'b'}"
    workload = name
    objects = make(name, workload, queue=queued)
    if profiled:
        make_ready(workload)
        probe = two_gpus(f"{name}-probe", workload, queue=False)[0]
        until(lambda: ranked_at_admission(probe), timeout=60, what="the webhook's cache has the profile")
    create(objects)
    if case == "jobset":
        until(
            lambda: condition(get("jobset", name), "Completed"), timeout=180, what=f"JobSet {name} completed"
        )
        stored = get("jobset", name)
        assert stored is not None
        template = stored["spec"]["replicatedJobs"][0]["template"]
        jobs = [get("job", f"{name}-workers-{i}") for i in range(2)]
        assert all(jobs)
        sent = [template] * 2  # as JobSet wrote each child Job: the replicated Job's template, defaulted
        for job in jobs:
            assert job and job["spec"]["template"]["spec"].get("subdomain") == name, "JobSet's own subdomain"
    else:
        job_name = objects[-1]["metadata"]["name"]
        until(
            lambda: condition(get("job", job_name), "Complete"), timeout=180, what=f"Job {job_name} complete"
        )
        jobs, sent = [get("job", job_name)], [objects[-1]]
    products = check_ran_whole([j for j in jobs if j], sent, workload, profiled=profiled)
    if queued:  # Kueue admitted and finished it: its Workload, owned by the Job or the JobSet
        owner = name if case == "jobset" else objects[-1]["metadata"]["name"]
        workloads = json.loads(kubectl("-n", USERS, "get", "workloads.kueue.x-k8s.io", "-o", "json"))["items"]
        [queued_as] = [
            w for w in workloads if any(r["name"] == owner for r in w["metadata"].get("ownerReferences", []))
        ]
        assert condition(queued_as, "Admitted") or condition(queued_as, "Finished"), queued_as.get("status")
    gangs.figures[name] = sorted(products)
    size = json.loads(jobs[0]["metadata"]["annotations"][v.HINTS_ANNOTATION]).get("gangGPUs")  # type: ignore[index]
    # a JobSet's Job shows admission one Pod of 1 GPU (its peers are other Jobs): no size above 1
    assert size == (None if case == "jobset" else 2), size
    if profiled and case != "jobset":  # its links measured: its runs are observed by the size its Pods carry

        def observed() -> list[Obj]:
            profile = get("workloadprofile", v.profile_name(workload)) or {}
            return [
                o for o in (profile.get("status") or {}).get("observations", []) if o.get("gangGPUs") == size
            ]

        gangs.figures[f"{name} observed"] = until(
            observed, timeout=120, what=f"{name}'s runs observed by size"
        )
    if case == "rendezvous":
        logs = [
            kubectl("-n", USERS, "logs", p["metadata"]["name"])
            for p in pods(USERS, f"{v.JOB_NAME_LABEL}={name}")
        ]
        assert any("rank 0: every peer reached me: [1]" in log for log in logs), logs
        assert any("rank 1: reached rank 0" in log for log in logs), logs
