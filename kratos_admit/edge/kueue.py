"""The API calls KRATOS makes on Kueue's resources (kueue.x-k8s.io/v1beta1), for its optional
AdmissionCheck (DESIGN "Where Kueue runs"): list and watch Workloads and AdmissionChecks, and write
the check's state and the check's ``Active`` condition with server-side apply, as Kueue's own check
controllers do (its provisioning controller: ``Status().Patch(..., client.Apply, FieldOwner,
ForceOwnership)``), so KRATOS owns exactly its own entry of each list and nothing else."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_list, as_mapping

WORKLOADS = "workloads"
ADMISSION_CHECKS = "admissionchecks"
APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = v.ADMISSION_CHECK_CONTROLLER
Obj = dict[str, Any]


def ours(admission_check: Mapping[str, Any]) -> bool:
    """An AdmissionCheck KRATOS runs: its ``spec.controllerName`` is ``gpu.scheduler.io/profile``."""
    return as_mapping(admission_check.get("spec")).get("controllerName") == v.ADMISSION_CHECK_CONTROLLER


def check_states(workload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The Workload's ``status.admissionChecks`` by check name."""
    found: dict[str, Mapping[str, Any]] = {}
    for entry in as_list(as_mapping(workload.get("status")).get("admissionChecks")):
        name = as_mapping(entry).get("name")
        if isinstance(name, str):
            found[name] = as_mapping(entry)
    return found


def owner_job(workload: Mapping[str, Any]) -> str | None:
    """The name of the batch/v1 Job that controls a Workload (Kueue makes one per Job), else None."""
    for ref in as_list(as_mapping(workload.get("metadata")).get("ownerReferences")):
        r = as_mapping(ref)
        if r.get("kind") == "Job" and r.get("apiVersion") == "batch/v1" and r.get("controller") is True:
            return str(r.get("name", "")) or None
    return None


class KueueApi:
    """Kueue's Workloads and AdmissionChecks, through kubernetes_asyncio's custom-object calls."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.list_workloads = functools.partial(
            self.custom.list_cluster_custom_object, v.KUEUE_GROUP, v.KUEUE_VERSION, WORKLOADS
        )
        self.list_admission_checks = functools.partial(
            self.custom.list_cluster_custom_object, v.KUEUE_GROUP, v.KUEUE_VERSION, ADMISSION_CHECKS
        )

    async def served(self) -> bool:
        """Whether this cluster serves Kueue's Workload API (Kueue's CRDs installed); a 404 says not."""
        try:
            await self.list_admission_checks(limit=1)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def set_check_state(
        self,
        namespace: str,
        workload: str,
        *,
        check: str,
        state: Literal["Pending", "Ready"],
        message: str,
        now: str,
    ) -> None:
        """Apply this check's entry of the Workload's ``status.admissionChecks`` (a list-map keyed by
        name: the other checks' entries are left as they are)."""
        body: Any = {
            "apiVersion": f"{v.KUEUE_GROUP}/{v.KUEUE_VERSION}",
            "kind": "Workload",
            "metadata": {"name": workload, "namespace": namespace},
            "status": {
                "admissionChecks": [
                    {"name": check, "state": state, "message": message[:32768], "lastTransitionTime": now}
                ]
            },
        }
        await self.custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]
            v.KUEUE_GROUP,
            v.KUEUE_VERSION,
            namespace,
            WORKLOADS,
            workload,
            body,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=APPLY_PATCH,
        )

    async def activate(self, check: str, *, now: str) -> None:
        """Apply the AdmissionCheck's ``Active`` condition: Kueue counts a ClusterQueue that lists an
        inactive check as inactive, and admits nothing through it."""
        body: Any = {
            "apiVersion": f"{v.KUEUE_GROUP}/{v.KUEUE_VERSION}",
            "kind": "AdmissionCheck",
            "metadata": {"name": check},
            "status": {
                "conditions": [
                    {
                        "type": "Active",
                        "status": "True",
                        "reason": "Active",
                        "message": "the KRATOS controller holds followers of a workload under profiling",
                        "lastTransitionTime": now,
                    }
                ]
            },
        }
        await self.custom.patch_cluster_custom_object_status(  # type: ignore[call-arg]
            v.KUEUE_GROUP,
            v.KUEUE_VERSION,
            ADMISSION_CHECKS,
            check,
            body,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=APPLY_PATCH,
        )


def active(admission_check: Mapping[str, Any]) -> bool:
    for condition in as_list(as_mapping(admission_check.get("status")).get("conditions")):
        c = as_mapping(condition)
        if c.get("type") == "Active":
            return c.get("status") == "True"
    return False
