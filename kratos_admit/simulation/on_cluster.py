"""``simulate --kubeconfig``: the same policies, placed by a real API server and kube-scheduler
(docs/placement.md "On a real control plane").

The cluster's Nodes are created as fake Nodes (labels and GPU capacity, Ready, no kubelet); each
policy runs in a namespace of its own. Admission stays in process, through the same engine as the
model (a Job admitted there becomes the Pod its Job controller would make); kube-scheduler binds the
Pods; a pod completer here marks each bound Pod Running, and Succeeded once its true runtime has
passed, in real time scaled by ``time_scale`` (0.01: a simulated hour in 36 s). Everything created is
deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import heapq
import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.raw import clone
from kratos_admit.model.catalog import Catalog
from kratos_admit.simulation.knowledge import Learned
from kratos_admit.simulation.replay import (
    Pending,
    PolicyRun,
    run_policies,
)
from kratos_admit.simulation.result import SimulationResult, simulation_result
from kratos_admit.simulation.scheduling import SimNode
from kratos_admit.simulation.trace import (
    LEARNING,
    MODEL_ONLY,
    POLICIES,
    Policy,
    PolicyResult,
    SimulationError,
    Trace,
    Truth,
)

log = logging.getLogger("kratos.simulate")
MERGE_PATCH = "application/merge-patch+json"
NODE_PREFIX = "kratos-sim-"
POLICY_LABEL = "gpu.scheduler.io/simulation-policy"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_manifest(node: SimNode) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE_PREFIX + node.name, "labels": {**node.labels, "kratos-sim": "true"}},
    }


def node_status(node: SimNode) -> dict[str, Any]:
    """What a kubelet and the NVIDIA device plugin would report: capacity, and Ready."""
    capacity = {
        "cpu": f"{node.milli_cpu}m",
        "memory": str(node.memory_bytes),
        "pods": "110",
        v.GPU_RESOURCE: str(node.gpus),
    }
    now = _now()
    return {
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kratos-admit simulate: a fake Node",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
    }


def pod_manifest(
    entry: Pending, name: str, namespace: str, policy: str, weights: Mapping[str, int]
) -> dict[str, Any]:
    """The Pod a Job's controller would create from the admitted pod template (or, without KRATOS,
    from the user's): the oracle's true preference is written as preferred node affinity."""
    spec: dict[str, Any] = (
        clone(dict(entry.spec))
        if entry.spec is not None
        else {
            "containers": [
                {
                    "name": "main",
                    "image": f"registry.example/{entry.job.workload}:1",
                    "resources": {"limits": {v.GPU_RESOURCE: str(entry.job.gpus)}},
                }
            ]
        }
    )
    spec["restartPolicy"] = "Never"
    if weights:
        terms = [
            {
                "weight": w,
                "preference": {
                    "matchExpressions": [{"key": v.GPU_PRODUCT_LABEL, "operator": "In", "values": [p]}]
                },
            }
            for p, w in sorted(weights.items())
        ]
        spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})[
            "preferredDuringSchedulingIgnoredDuringExecution"
        ] = terms
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {v.WORKLOAD_LABEL: entry.job.workload, POLICY_LABEL: policy},
        },
        "spec": spec,
    }


class _Driver:
    """One policy on the real cluster: arrivals, Pod creation, binds seen by a watch, completions."""

    def __init__(
        self,
        run: PolicyRun,
        api: client.ApiClient,
        namespace: str,
        nodes: Mapping[str, SimNode],
        time_scale: float,
    ) -> None:
        self.run, self.namespace, self.nodes, self.time_scale = run, namespace, nodes, time_scale
        self.core = client.CoreV1Api(api)
        self.pods: dict[str, Pending] = {}
        self.started: set[str] = set()
        self.completions: list[tuple[float, int, str, str, float]] = []  # (due, seq, pod, node, seconds)
        self.binds: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.seq = itertools.count()
        self.start = 0.0

    def now(self) -> float:
        """Simulated seconds since the start."""
        return (asyncio.get_running_loop().time() - self.start) / self.time_scale

    async def _create_pending(self) -> None:
        while self.run.pending:
            entry = heapq.heappop(self.run.pending)
            name = f"{entry.job.name}-{'p' if entry.profiling else 'r'}{next(self.seq)}"
            weights = self.run.true_weights(entry.job) if self.run.policy == "oracle" else {}
            body: Any = pod_manifest(entry, name, self.namespace, self.run.policy, weights)
            self.pods[name] = entry
            await self.core.create_namespaced_pod(self.namespace, body)

    async def _watch_binds(self) -> None:
        stream = watch.Watch()
        async with stream:
            async for event in stream.stream(
                self.core.list_namespaced_pod, self.namespace, timeout_seconds=3600
            ):
                raw = event.get("raw_object") or {}
                name = raw.get("metadata", {}).get("name", "")
                node = (raw.get("spec") or {}).get("nodeName")
                if node and name in self.pods and name not in self.started:
                    self.started.add(name)
                    self.binds.put_nowait((name, node))

    async def _bound(self, name: str, node_name: str) -> None:
        entry = self.pods[name]
        node = self.nodes[node_name]
        seconds = self.run.started(entry, node.product)
        heapq.heappush(self.completions, (self.now() + seconds, next(self.seq), name, node_name, seconds))
        status: Any = {"status": {"phase": "Running", "startTime": _now()}}
        await self.core.patch_namespaced_pod_status(name, self.namespace, status, _content_type=MERGE_PATCH)  # type: ignore[call-arg]

    async def _complete(self, name: str, node_name: str, seconds: float) -> None:
        entry = self.pods[name]
        now = _now()
        terminated = {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
        statuses = [
            {"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""), "imageID": "",
             "state": {"terminated": terminated}}
            for c in (entry.spec or {}).get("containers", [{"name": "main"}])
        ]  # fmt: skip
        status: Any = {"status": {"phase": "Succeeded", "containerStatuses": statuses}}
        await self.core.patch_namespaced_pod_status(name, self.namespace, status, _content_type=MERGE_PATCH)  # type: ignore[call-arg]
        with contextlib.suppress(ApiException):  # a terminal Pod goes at once; it frees its GPUs either way
            await self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        self.run.done(entry, [self.nodes[node_name]], seconds, self.now())

    async def run_policy(self) -> PolicyResult:
        arrivals = sorted(self.run.trace.jobs, key=lambda j: j.arrival)
        watcher = asyncio.create_task(self._watch_binds())
        await asyncio.sleep(0.5)  # the watch is open before the first Pod
        self.start = asyncio.get_running_loop().time()
        i = 0
        try:
            while i < len(arrivals) or self.completions or self.pods.keys() - self.started or self.run.held:
                now = self.now()
                while i < len(arrivals) and arrivals[i].arrival <= now:
                    self.run.admit(arrivals[i], arrivals[i].arrival)
                    i += 1
                while self.completions and self.completions[0][0] <= now:
                    _, _, name, node, seconds = heapq.heappop(self.completions)
                    await self._complete(name, node, seconds)
                await self._create_pending()
                while not self.binds.empty():
                    await self._bound(*self.binds.get_nowait())
                due = [t for t in (arrivals[i].arrival if i < len(arrivals) else None,
                                   self.completions[0][0] if self.completions else None) if t is not None]  # fmt: skip
                wait = max(0.0, (min(due) - self.now()) * self.time_scale) if due else 1.0
                with contextlib.suppress(TimeoutError):
                    pair = await asyncio.wait_for(self.binds.get(), timeout=min(wait, 1.0))
                    await self._bound(*pair)
                if watcher.done():
                    watcher.result()  # a failed watch is an error, not a hang
                    watcher = asyncio.create_task(self._watch_binds())
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        return self.run.result()


async def _delete(call: Any, *args: Any, **kwargs: Any) -> None:
    with contextlib.suppress(ApiException):
        await call(*args, **kwargs)


async def simulate_on_cluster(
    api: client.ApiClient,
    trace: Trace,
    nodes: Sequence[SimNode],
    *,
    truth: Truth,
    config: Config,
    catalog: Catalog,
    seed: int = 1,
    noise: float = 0.05,
    time_scale: float = 0.01,
    policies: Sequence[Policy] = POLICIES,
) -> SimulationResult:
    """Every policy on the cluster behind ``api``, one after the other; Nodes, namespaces and the
    RuntimeClass it made are deleted at the end, whatever happens. One Pod per Job: a gang of several
    Pods (``pods``) runs only in the model, where it is placed whole."""
    several = next((j for j in trace.jobs if j.pods > 1), None)
    if several is not None:
        raise SimulationError(
            f"Job {several.name}: pods {several.pods}: --kubeconfig runs one Pod per Job; a gang of "
            "several Pods runs in the model only (leave out --kubeconfig)"
        )
    core, node_api = client.CoreV1Api(api), client.NodeV1Api(api)
    by_name = {NODE_PREFIX + n.name: n for n in nodes}
    made_runtime_class = False
    namespaces: list[str] = []
    results: dict[Policy, PolicyResult] = {}
    learned: dict[Policy, Learned] = {}
    try:
        try:
            await node_api.read_runtime_class(config.runtime_class_name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body: Any = {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": config.runtime_class_name},
                "handler": config.runtime_class_name,
            }
            await node_api.create_runtime_class(body)
            made_runtime_class = True
        for node in nodes:
            manifest: Any = node_manifest(node)
            await core.create_node(manifest)
            status: Any = node_status(node)
            await core.patch_node_status(NODE_PREFIX + node.name, status, _content_type=MERGE_PATCH)  # type: ignore[call-arg]
            # the TaintNodesByCondition admission plugin taints a new Node not-ready; it is Ready now
            untaint: Any = {"spec": {"taints": None}}
            await core.patch_node(NODE_PREFIX + node.name, untaint, _content_type=MERGE_PATCH)  # type: ignore[call-arg]
        # the wait-aware oracle is a bound computed in the model only: a real scheduler has no truth to wait by
        # the load-aware rules (MODEL_ONLY) run in the model only: no controller holds Pods for them
        for policy in (
            p for p in run_policies(policies, config) if p != "oracle-wait" and p not in MODEL_ONLY
        ):
            namespace = f"kratos-sim-{policy}"
            ns_body: Any = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            await core.create_namespace(ns_body)
            namespaces.append(namespace)
            run = PolicyRun(
                policy, trace, nodes, truth=truth, config=config, catalog=catalog, seed=seed, noise=noise
            )
            log.info("policy started", extra={"policy": policy, "namespace": namespace})
            results[policy] = await _Driver(run, api, namespace, by_name, time_scale).run_policy()
            if policy in LEARNING:
                learned[policy] = Learned(run.profiles, run.calibration, run.explored)
    finally:
        for namespace in namespaces:
            await _delete(core.delete_namespace, namespace)
        for name in by_name:
            await _delete(core.delete_node, name)
        if made_runtime_class:
            await _delete(node_api.delete_runtime_class, config.runtime_class_name)
    return simulation_result(results, learned, trace, nodes, truth=truth, config=config, catalog=catalog)
