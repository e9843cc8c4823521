"""Observe what reconcile needs, and apply its actions, with kubernetes_asyncio. Nothing else: every
decision, and every word a profile says about a failure, is made in ``reconcile``."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.decisions.escape import slim_node, slim_pod
from kratos_admit.decisions.stores import most_gpus, node_gpus
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_list, as_mapping
from kratos_admit.domain.workload import Kind
from kratos_admit.edge.kube import is_status, list_pages, list_raw, one_line
from kratos_controller import actions
from kratos_controller import reconcile as rc
from kratos_controller.faults import timestamp

Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
FIELD_MANAGER = "kratos-controller"  # metadata.managedFields names what the controller wrote
RECORDED_LIMIT = 10_000  # Event names remembered; past that the memory starts again (a 409 still dedupes)
log = logging.getLogger("kratos.controller")


def _end(status: Mapping[str, Any]) -> actions.ContainerEnd | None:
    terminated = as_mapping(as_mapping(status.get("state")).get("terminated"))
    if not terminated:
        return None
    return actions.ContainerEnd(
        exit_code=int(terminated.get("exitCode", 0) or 0),
        reason=str(terminated.get("reason") or ""),
        message=str(terminated.get("message") or ""),
        container=str(status.get("name") or ""),
    )


# the kubelet's waiting reasons of an image it cannot pull (kubelet/images: ErrImagePull and its
# back-off, an image absent with pullPolicy Never, a name it cannot parse)
PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"})


def pull_failure(pods: list[Obj]) -> actions.PullFailure | None:
    """The first container of the newest Pod (init containers first) waiting on an image the kubelet
    cannot pull, with the image its spec names."""
    for pod in newest_first(pods)[:1]:
        spec, status = as_mapping(pod.get("spec")), as_mapping(pod.get("status"))
        images = {
            str(as_mapping(c).get("name")): str(as_mapping(c).get("image") or "")
            for key in ("initContainers", "containers")
            for c in as_list(spec.get(key))
        }
        for key in ("initContainerStatuses", "containerStatuses"):
            for c in as_list(status.get(key)):
                waiting = as_mapping(as_mapping(as_mapping(c).get("state")).get("waiting"))
                if waiting.get("reason") in PULL_REASONS:
                    name = str(as_mapping(c).get("name") or "")
                    return actions.PullFailure(
                        container=name,
                        image=images.get(name) or str(as_mapping(c).get("image") or ""),
                        reason=str(waiting["reason"]),
                        message=str(waiting.get("message") or ""),
                        since=timestamp(status.get("startTime")),
                    )
    return None


def disruption(pods: list[Obj]) -> actions.Disruption | None:
    """The newest Pod evicted by the kubelet (phase Failed, reason Evicted), or deleted while it ran
    (its DisruptionTarget condition's reason when the API server or a controller gave one)."""
    for pod in newest_first(pods)[:1]:
        meta, status = as_mapping(pod.get("metadata")), as_mapping(pod.get("status"))
        if status.get("reason") == "Evicted":
            return actions.Disruption("evicted", "Evicted", str(status.get("message") or ""))
        if meta.get("deletionTimestamp") and status.get("phase") not in ("Succeeded",):
            target = next(
                (
                    as_mapping(c)
                    for c in as_list(status.get("conditions"))
                    if as_mapping(c).get("type") == "DisruptionTarget"
                    and as_mapping(c).get("status") == "True"
                ),
                {},
            )
            return actions.Disruption(
                "deleted", str(target.get("reason") or ""), str(target.get("message") or "")
            )
    return None


def newest_first(pods: list[Obj]) -> list[Obj]:
    """A Job's Pods, the newest (by creationTimestamp) first."""
    return sorted(
        pods, key=lambda p: str(as_mapping(p.get("metadata")).get("creationTimestamp", "")), reverse=True
    )


def container_ends(pods: list[Obj]) -> tuple[actions.ContainerEnd | None, actions.ContainerEnd | None]:
    """(profiling-runner's end, the failure of an init container: stage-workload, stage-profiler or one of
    the Job's own, which run first), newest pod first, a runner that left a message preferred: the facts
    ``reconcile.pod_failure`` words."""
    runner: actions.ContainerEnd | None = None
    stage: actions.ContainerEnd | None = None
    for pod in newest_first(pods):
        status = as_mapping(pod.get("status"))
        for c in as_list(status.get("containerStatuses")):
            end = _end(as_mapping(c))
            if as_mapping(c).get("name") == v.RUNNER_CONTAINER and end is not None:
                if end.message:
                    return end, None
                runner = runner or end
        for c in as_list(status.get("initContainerStatuses")):
            end = _end(as_mapping(c))
            if end is not None and (end.exit_code or end.reason == "OOMKilled"):
                stage = stage or end
    return runner, stage


def newest_node(pods: list[Obj]) -> str:
    """The node the newest of ``pods`` that was bound was bound to ("" when none was)."""
    bound = (str(as_mapping(p.get("spec")).get("nodeName") or "") for p in newest_first(pods))
    return next((node for node in bound if node), "")


@dataclass
class KubeIO:
    api: client.ApiClient
    node_products: dict[str, str] = field(default_factory=dict)  # node name -> GPU product, cached
    recorded: set[str] = field(default_factory=set)  # Events written (or found written): not again
    refused: set[str] = field(default_factory=set)  # why Event writes failed, each logged once

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.events = client.EventsV1Api(self.api)

    async def record(self, event: Obj) -> None:
        """Write an Event, best effort: it never raises, so a refused or failed write never fails a
        reconcile; each kind of failure is logged once."""
        name = str(event["metadata"]["name"])
        if name in self.recorded:
            return
        try:
            body: Any = event
            await self.events.create_namespaced_event(str(event["metadata"]["namespace"]), body)
        except ApiException as exc:
            if exc.status != 409:  # 409: this very report was made before (the name says what it reports)
                self._refused(one_line(exc))
                return
        except Exception as exc:  # the API away: the report is lost, the work goes on
            self._refused(one_line(exc))
            return
        if len(self.recorded) > RECORDED_LIMIT:
            self.recorded.clear()
        self.recorded.add(name)

    def _refused(self, reason: str) -> None:
        if reason not in self.refused:
            self.refused.add(reason)
            log.warning("Event not written", extra={"reason": reason})

    async def _exists(self, call: Any, *args: Any) -> bool:
        # not _preload_content=False: kubernetes_asyncio then returns a 404 instead of raising it
        try:
            await call(*args)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def get_profile(self, namespace: str, name: str) -> Obj | None:
        try:
            found: Obj = await self.custom.get_namespaced_custom_object(
                v.GROUP, v.VERSION, namespace, v.PROFILE_PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found

    async def profile_pages(self) -> AsyncIterator[list[Obj]]:
        """Every WorkloadProfile, a page at a time (``list_pages``): a caller folds each before the
        next is read, so a cluster's mature profiles (their counted Pod uids and all) are never held
        at once."""
        async for body in list_pages(
            self.custom.list_cluster_custom_object, v.GROUP, v.VERSION, v.PROFILE_PLURAL
        ):
            yield [p for p in as_list(body.get("items")) if isinstance(p, dict)]

    async def get_configmap(self, namespace: str, name: str) -> Obj | None:
        """The ConfigMap's name and data (what the calibration reads), or None when it is absent."""
        try:
            found = await self.core.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return {"metadata": {"name": name, "namespace": namespace}, "data": dict(found.data or {})}

    async def read_job(self, namespace: str, name: str) -> Obj | None:
        """The Job as the API server has it now (raw), or None when it is gone."""
        try:
            return await list_raw(self.batch.read_namespaced_job, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def job_pods(self, namespace: str, job_name: str) -> list[Obj]:
        body = await list_raw(self.core.list_namespaced_pod, namespace, label_selector=f"job-name={job_name}")
        return [p for p in as_list(body.get("items")) if isinstance(p, dict)]

    async def observe(self, job: Obj) -> actions.Observed:
        meta = as_mapping(job.get("metadata"))
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        workload = str(as_mapping(meta.get("labels")).get(v.WORKLOAD_LABEL, ""))
        pods = await self.job_pods(namespace, name)
        runner, stage = container_ends(pods)
        profile = await self.get_profile(namespace, v.profile_name(workload)) if workload else None
        source = as_mapping(as_mapping(profile).get("status")).get("sourceJob")
        return actions.Observed(
            job=job,
            runner=runner,
            stage=stage,
            pods_seen=bool(pods),
            node=newest_node(pods),
            pull=pull_failure(pods),
            disruption=disruption(pods),
            now=dt.datetime.now(dt.UTC),
            pods_holding=tuple(
                str(as_mapping(p.get("metadata")).get("name"))
                for p in pods
                if v.RELEASE_FINALIZER in as_list(as_mapping(p.get("metadata")).get("finalizers"))
            ),
            profile=profile,
            configmap_exists=await self._exists(
                self.core.read_namespaced_config_map, v.summary_configmap_name(workload), namespace
            ),
            execution_job_exists=await self._exists(
                self.batch.read_namespaced_job, rc.execution_job_name(name), namespace
            ),
            source_job_exists=(
                True
                if not isinstance(source, str) or source == name
                else await self._exists(self.batch.read_namespaced_job, source, namespace)
            ),
        )

    async def gpu_products(self) -> frozenset[str]:
        return (await self.gpu_inventory())[0]

    async def gpu_inventory(self) -> tuple[frozenset[str], dict[str, int]]:
        """The GPU products of the cluster's Nodes, and per product the most GPUs one Node of it can
        give (its allocatable): what a release narrows by (DESIGN "Wait or run slow")."""
        body = await list_raw(self.core.list_node, label_selector=f"{v.GPU_PRESENT_LABEL}=true")
        found: list[tuple[str, int]] = []
        for n in as_list(body.get("items")):
            node = as_mapping(n)
            product = as_mapping(as_mapping(node.get("metadata")).get("labels")).get(v.GPU_PRODUCT_LABEL)
            if product:
                found.append((str(product), node_gpus(node)))
        return frozenset(p for p, _ in found), most_gpus(found)

    async def product_of(self, node: str) -> str:
        """The node's ``nvidia.com/gpu.product`` ("" when it has none or is gone), cached by name."""
        if node not in self.node_products:
            try:
                found = await self.core.read_node(node)
            except ApiException as exc:
                if exc.status == 404:
                    return ""
                raise
            labels = found.metadata.labels or {} if found.metadata else {}
            self.node_products[node] = str(labels.get(v.GPU_PRODUCT_LABEL, ""))
        return self.node_products[node]

    async def publish_configmap(
        self, namespace: str, name: str, data: Mapping[str, str], *, exists: bool = False
    ) -> str:
        """Replace the ConfigMap when it ``exists`` (as last read), else create it, each falling back on
        the other when the server knows better (404, 409); "created" or "updated"."""
        # kubernetes_asyncio serialises plain dicts as they are; its model types would drop unknown fields
        body: Any = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": dict(data),
        }
        if exists:
            try:
                await self.core.replace_namespaced_config_map(name, namespace, body)
                return "updated"
            except ApiException as exc:
                if exc.status != 404:
                    raise
        try:
            await self.core.create_namespaced_config_map(namespace, body)
            return "created"
        except ApiException as exc:
            if exc.status != 409:
                raise
        await self.core.replace_namespaced_config_map(name, namespace, body)
        return "updated"

    async def write_ledger(self, profile: Obj, name: str, data: Mapping[str, str], *, exists: bool) -> None:
        """The profile's ledger of counted runs (issue 59): replaced when it ``exists``, else created,
        owned by the profile (no ``blockOwnerDeletion``, which would need its finalizers), so the
        garbage collector deletes it with the profile."""
        meta = as_mapping(profile.get("metadata"))
        namespace = str(meta.get("namespace", ""))
        owner = {
            "apiVersion": v.API_VERSION,
            "kind": v.PROFILE_KIND,
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        }
        body: Any = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                **({"ownerReferences": [owner]} if meta.get("uid") else {}),
            },
            "data": dict(data),
        }
        if exists:
            try:
                await self.core.replace_namespaced_config_map(name, namespace, body)
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
        await self.core.create_namespaced_config_map(namespace, body)

    async def patch_profile_status(self, namespace: str, name: str, fields: Mapping[str, Any]) -> None:
        """A JSON merge patch of these status fields alone (None removes one): the calibration's
        shares, which no other writer of the status touches (their replace keeps what they read)."""
        patch: Any = {"status": dict(fields)}
        await self.custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]
            v.GROUP, v.VERSION, namespace, v.PROFILE_PLURAL, name, patch, _content_type=MERGE_PATCH
        )

    async def apply(self, action: actions.Action) -> str:
        """Apply one action; returns what happened ("created", "updated", "exists", "gone")."""
        if isinstance(action, actions.PublishConfigMap):
            return await self.publish_configmap(action.namespace, action.name, action.data)
        if isinstance(action, actions.PublishProfile):
            profile: Any = {
                "apiVersion": v.API_VERSION,
                "kind": v.PROFILE_KIND,
                "metadata": {"name": action.name, "namespace": action.namespace, "labels": action.labels},
                "spec": action.spec,
            }
            outcome = "updated"
            try:
                await self.custom.create_namespaced_custom_object(
                    v.GROUP, v.VERSION, action.namespace, v.PROFILE_PLURAL, profile
                )
                outcome = "created"
            except ApiException as exc:
                if exc.status != 409:
                    raise
                if action.only_new:
                    return "exists"
            # the whole status, replaced (a JSON patch "add" of /status replaces it): a merge patch
            # would keep the metrics of an earlier result. _content_type is accepted at run time but
            # missing from the generated signature.
            await self.custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]
                v.GROUP,
                v.VERSION,
                action.namespace,
                v.PROFILE_PLURAL,
                action.name,
                [{"op": "add", "path": "/status", "value": action.status.as_status()}],
                _content_type="application/json-patch+json",
            )
            return outcome
        if isinstance(action, actions.CreateExecutionJob):
            try:
                manifest: Any = action.manifest
                await self.batch.create_namespaced_job(action.manifest["metadata"]["namespace"], manifest)
            except ApiException as exc:
                if is_status(exc, 409):
                    return "exists"  # created before a restart: AlreadyExists counts as done
                raise
            return "created"
        if isinstance(action, actions.MarkExecutionJob):
            patch: Any = {"metadata": {"annotations": action.annotations}}
            await self.batch.patch_namespaced_job(  # type: ignore[call-arg]
                action.name, action.namespace, patch, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH
            )
            return "updated"
        if isinstance(action, actions.RemoveFinalizer):
            return await self._remove_finalizer(action)
        if isinstance(action, actions.StopJob):
            patch = {"spec": {"activeDeadlineSeconds": action.active_deadline_seconds}}
            await self.batch.patch_namespaced_job(  # type: ignore[call-arg]
                action.name, action.namespace, patch, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH
            )
            return "updated"
        if isinstance(action, actions.ReleaseFollower):  # only what changed: never Kueue's spec.suspend
            return await self.patch_changed(
                action.kind, action.namespace, action.name, action.held, action.released
            )
        current: Any = await self.get_profile(action.namespace, action.name)
        if current is None:
            return "gone"
        current["status"] = action.status.as_status()
        current["metadata"]["resourceVersion"] = action.resource_version  # a conflict (409) is retried
        await self.custom.replace_namespaced_custom_object_status(
            v.GROUP, v.VERSION, action.namespace, v.PROFILE_PLURAL, action.name, current
        )
        return "updated"

    async def patch_changed(self, kind: Kind, namespace: str, name: str, held: Obj, changed: Obj) -> str:
        """A JSON patch of exactly what ``changed`` changes of ``held`` (so KRATOS's field manager owns
        only those fields), conditional on the resourceVersion ``held`` was read at (a concurrent change,
        Kueue admitting a held Job, gives 409 and a retry on the fresh object); "exists": no change."""
        ops: Any = jsonpatch.make_patch(held, changed).patch
        if not ops:
            return "exists"
        version = str(as_mapping(held.get("metadata")).get("resourceVersion") or "")
        if version:
            ops = [{"op": "replace", "path": "/metadata/resourceVersion", "value": version}, *ops]
        if kind == "Job":
            await self.batch.patch_namespaced_job(  # type: ignore[call-arg]
                name, namespace, ops, field_manager=FIELD_MANAGER, _content_type=JSON_PATCH
            )
        else:
            await self.core.patch_namespaced_pod(  # type: ignore[call-arg]
                name, namespace, ops, field_manager=FIELD_MANAGER, _content_type=JSON_PATCH
            )
        return "updated"

    async def reset_job_start(self, namespace: str, name: str) -> None:
        """Clear a suspended Job's ``status.startTime`` (422 where it is no longer suspended), as Kueue
        does to a Job it stops: only then may its template's affinity change."""
        ops: Any = [
            {"op": "test", "path": "/spec/suspend", "value": True},
            {"op": "remove", "path": "/status/startTime"},
        ]
        await self.batch.patch_namespaced_job_status(  # type: ignore[call-arg]
            name, namespace, ops, field_manager=FIELD_MANAGER, _content_type=JSON_PATCH
        )

    async def gpu_occupancy(self) -> tuple[list[Obj], list[Obj]]:
        """The GPU Nodes and every bound, unfinished Pod (a chunked list): what holds each product's
        GPUs, for a waiting Job's escape, asked only while a narrowed Job waits unschedulable."""
        nodes: list[Obj] = []
        async for page in list_pages(self.core.list_node, label_selector=f"{v.GPU_PRESENT_LABEL}=true"):
            nodes.extend(slim_node(n) for n in as_list(page.get("items")) if isinstance(n, dict))
        pods: list[Obj] = []  # kept slim, page by page: only what holds GPUs, and only what is read of it
        selector = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
        async for page in list_pages(self.core.list_pod_for_all_namespaces, field_selector=selector):
            pods.extend(
                s for s in (slim_pod(p) for p in as_list(page.get("items")) if isinstance(p, dict)) if s
            )
        return nodes, pods

    async def _remove_finalizer(self, action: actions.RemoveFinalizer) -> str:
        try:
            if action.kind == "Job":
                found: Any = await self.batch.read_namespaced_job(action.name, action.namespace)
            else:
                found = await self.core.read_namespaced_pod(action.name, action.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return "gone"
            raise
        finalizers = list(found.metadata.finalizers or [])
        if v.RELEASE_FINALIZER not in finalizers:
            return "exists"
        rest = [f for f in finalizers if f != v.RELEASE_FINALIZER]
        # the resourceVersion makes the merge patch conditional: a concurrent change gives 409, retried
        patch: Any = {
            "metadata": {"finalizers": rest or None, "resourceVersion": found.metadata.resource_version}
        }
        if action.kind == "Job":
            await self.batch.patch_namespaced_job(  # type: ignore[call-arg]
                action.name, action.namespace, patch, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH
            )
        else:
            await self.core.patch_namespaced_pod(  # type: ignore[call-arg]
                action.name, action.namespace, patch, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH
            )
        return "updated"
