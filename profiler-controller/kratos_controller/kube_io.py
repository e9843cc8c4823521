"""Observe what reconcile needs, and apply its actions, with kubernetes_asyncio. Nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit import vocabulary as v
from kratos_admit.kube import is_status
from kratos_admit.raw import as_mapping
from kratos_controller.reconcile import (
    Action,
    Observed,
    PublishConfigMap,
    PublishProfile,
    execution_job_name,
)

Obj = dict[str, Any]


@dataclass
class KubeIO:
    api: client.ApiClient

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

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

    async def runner_message(self, namespace: str, job_name: str) -> tuple[str | None, str | None]:
        """The profiling-runner's termination message from the Job's pods, newest first; or why none."""
        pods = await self.core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}")
        failure = None if pods.items else "the profiling pod is gone (deleted or garbage-collected)"
        for pod in sorted(pods.items, key=lambda p: p.metadata.creation_timestamp or "", reverse=True):
            for status in (pod.status.container_statuses or []) if pod.status else []:
                if status.name != v.RUNNER_CONTAINER:
                    continue
                terminated = status.state.terminated if status.state else None
                if terminated is not None and terminated.message:
                    return terminated.message, None
                if terminated is not None:
                    failure = f"profiling-runner ended {terminated.reason or 'without a reason'} (exit {terminated.exit_code})"
            for status in (pod.status.init_container_statuses or []) if pod.status else []:
                terminated = status.state.terminated if status.state else None
                if status.name == v.STAGE_CONTAINER and terminated is not None and terminated.exit_code:
                    failure = f"stage-workload failed (exit {terminated.exit_code}): {(terminated.message or '').strip()[:300]}"
        return None, failure

    async def observe(self, job: Obj) -> Observed:
        meta = as_mapping(job.get("metadata"))
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        workload = str(as_mapping(meta.get("labels")).get(v.WORKLOAD_LABEL, ""))
        message, failure = await self.runner_message(namespace, name)
        return Observed(
            job=job,
            runner_message=message,
            pod_failure=failure,
            profile=await self.get_profile(namespace, v.profile_name(workload)) if workload else None,
            configmap_exists=await self._exists(
                self.core.read_namespaced_config_map, v.summary_configmap_name(workload), namespace
            ),
            execution_job_exists=await self._exists(
                self.batch.read_namespaced_job, execution_job_name(name), namespace
            ),
        )

    async def apply(self, action: Action) -> str:
        """Apply one action; returns what happened ("created", "updated", "exists")."""
        if isinstance(action, PublishConfigMap):
            # kubernetes_asyncio serialises plain dicts as they are; its model types would drop unknown fields
            body: Any = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": action.name, "namespace": action.namespace},
                "data": action.data,
            }
            try:
                await self.core.create_namespaced_config_map(action.namespace, body)
                return "created"
            except ApiException as exc:
                if exc.status != 409:
                    raise
            await self.core.replace_namespaced_config_map(action.name, action.namespace, body)
            return "updated"
        if isinstance(action, PublishProfile):
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
            # _content_type is accepted at run time but missing from the generated signature
            await self.custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]
                v.GROUP,
                v.VERSION,
                action.namespace,
                v.PROFILE_PLURAL,
                action.name,
                {"status": action.status},
                # a dict body would otherwise go out as application/json-patch+json and be refused
                _content_type="application/merge-patch+json",
            )
            return outcome
        try:
            manifest: Any = action.manifest
            await self.batch.create_namespaced_job(action.manifest["metadata"]["namespace"], manifest)
        except ApiException as exc:
            if is_status(exc, 409):
                return "exists"  # created before a restart: AlreadyExists counts as done
            raise
        return "created"
