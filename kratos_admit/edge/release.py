"""``kratos-admit release``: let go of everything KRATOS holds, so nothing stays stuck when KRATOS is
uninstalled or its controller is down: the ``gpu.scheduler.io/release`` finalizer on profiling Jobs
and their Pods, Jobs KRATOS suspended while a run was under way (never one the user suspended), and
the ``gpu.scheduler.io/profile`` scheduling gate on Pods and in the pod template of a Job Kueue
manages while its template can still change (Kueue owns such a Job's ``spec.suspend``: release never
writes it).

Only the finalizer, ``spec.suspend`` and the scheduling gates change: no KRATOS-only key is written,
so no signing key is needed and the validating webhook, if still installed, allows each update.
Each write is a merge patch conditional on the resourceVersion it read (a conflict is read again).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.decisions.holds import template_mutable
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_list, as_mapping
from kratos_admit.domain.workload import kueue_queue
from kratos_admit.edge.kube import list_pages, list_raw, one_line

Obj = dict[str, Any]
HeldKind = Literal["Job", "Pod"]
MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "kratos-release"  # metadata.managedFields names what release wrote
RETRIES = 3  # conflicting writes re-read and tried again


class ReleaseError(ValueError):
    """The API server cannot be reached or refuses the release; the message says which."""


@dataclass(frozen=True, slots=True)
class Release:
    """What letting go of one object takes, and the merge patch that does it."""

    kind: HeldKind
    namespace: str
    name: str
    done: tuple[str, ...]  # what it lets go of, in words
    patch: Obj  # {} when there is nothing it can change (only the note to say)
    note: str = ""  # what is left held and why

    def line(self, *, dry_run: bool) -> str:
        resource = "job.batch" if self.kind == "Job" else "pod"
        suffix = " (dry run)" if dry_run and self.done else ""
        said = "; ".join(filter(None, (", ".join(self.done), self.note)))
        return f"{self.namespace}/{resource}/{self.name}: {said}{suffix}"


def suspended_by_kratos(job: Mapping[str, Any]) -> bool:
    """A held follower KRATOS suspended: marked ``awaiting-profile``, and its hints record says KRATOS
    injected the suspend (a Job the user suspended is held without that, and stays suspended)."""
    annotations = as_mapping(as_mapping(job.get("metadata")).get("annotations"))
    if as_mapping(job.get("spec")).get("suspend") is not True:
        return False
    if v.AWAITING_PROFILE_ANNOTATION not in annotations:
        return False
    try:
        record = json.loads(str(annotations.get(v.HINTS_ANNOTATION, "{}")))
    except ValueError:
        return False
    return "suspend" in as_list(as_mapping(record).get("injected"))


def plan_release(kind: HeldKind, obj: Mapping[str, Any]) -> Release | None:
    """What to let go of in ``obj`` (None when KRATOS holds nothing there). Pure."""
    meta = as_mapping(obj.get("metadata"))
    done: list[str] = []
    patch: Obj = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
    finalizers = [f for f in as_list(meta.get("finalizers")) if isinstance(f, str)]
    if v.RELEASE_FINALIZER in finalizers:
        rest = [f for f in finalizers if f != v.RELEASE_FINALIZER]
        patch["metadata"]["finalizers"] = rest or None
        done.append(f"finalizer {v.RELEASE_FINALIZER} removed")
    spec = as_mapping(obj.get("spec"))
    if kind == "Job" and suspended_by_kratos(obj) and not kueue_queue(obj):  # Kueue owns a Kueue Job's
        patch["spec"] = {"suspend": False}
        done.append("resumed")
    pod_spec = spec if kind == "Pod" else as_mapping(as_mapping(spec.get("template")).get("spec"))
    gates = [g for g in as_list(pod_spec.get("schedulingGates")) if isinstance(g, Mapping)]
    note = ""
    if any(g.get("name") == v.PROFILE_SCHEDULING_GATE for g in gates):
        rest_gates = [dict(g) for g in gates if g.get("name") != v.PROFILE_SCHEDULING_GATE]
        if kind == "Pod":
            patch["spec"] = {"schedulingGates": rest_gates or None}
            done.append(f"scheduling gate {v.PROFILE_SCHEDULING_GATE} removed")
        elif template_mutable(obj):
            patch["spec"] = {"template": {"spec": {"schedulingGates": rest_gates or None}}}
            done.append(f"scheduling gate {v.PROFILE_SCHEDULING_GATE} removed from its pod template")
        else:
            note = (
                f"its pod template keeps the scheduling gate {v.PROFILE_SCHEDULING_GATE}: Kueue started the Job and "
                "a started Job's template cannot change; its Pods are released here, and a Pod it makes later "
                "waits until release is run again or the Job is deleted"
            )
    if not done and not note:
        return None
    return Release(
        kind,
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        tuple(done),
        patch if done else {},
        note,
    )


class Releaser:
    """Reads Jobs and Pods page by page and lets go of what KRATOS holds in them."""

    def __init__(self, api: client.ApiClient, *, namespace: str | None, dry_run: bool) -> None:
        self.batch, self.core = client.BatchV1Api(api), client.CoreV1Api(api)
        self.host = str(api.configuration.host)
        self.namespace, self.dry_run = namespace, dry_run

    async def run(self) -> list[Release]:
        try:
            return await self._run()
        except ApiException as exc:
            raise ReleaseError(f"API error {one_line(exc)}") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ReleaseError(f"cannot reach the API server at {self.host}: {exc}") from None

    async def _run(self) -> list[Release]:
        released: list[Release] = []
        for kind in ("Job", "Pod"):
            async for obj in self._objects(kind):
                release = plan_release(kind, obj)
                if release is None:
                    continue
                if not self.dry_run and release.patch:
                    release = await self._apply(release)
                if release.done or release.note:
                    released.append(release)
        return released

    async def _objects(self, kind: HeldKind) -> AsyncIterator[Obj]:
        lister: Any
        if kind == "Job":
            lister = (
                self.batch.list_namespaced_job if self.namespace else self.batch.list_job_for_all_namespaces
            )
        else:
            lister = (
                self.core.list_namespaced_pod if self.namespace else self.core.list_pod_for_all_namespaces
            )
        args = (self.namespace,) if self.namespace else ()
        async for body in list_pages(lister, *args):  # a big cluster is read in pages, never at once
            for obj in as_list(body.get("items")):
                if isinstance(obj, dict):
                    yield obj

    async def _apply(self, release: Release) -> Release:
        for _ in range(RETRIES):
            if not release.patch:  # only a note: nothing this release can change
                return release
            try:
                await self._patch(release)
                return release
            except ApiException as exc:
                if exc.status == 404:
                    return Release(release.kind, release.namespace, release.name, (), {})
                if exc.status != 409:
                    raise
            current = await self._read(release)
            if current is None:
                return Release(release.kind, release.namespace, release.name, (), {})
            again = plan_release(release.kind, current)
            if again is None:
                return Release(release.kind, release.namespace, release.name, (), {})
            release = again
        raise ReleaseError(
            f"{release.namespace}/{release.name}: changed under every one of {RETRIES} attempts; run again"
        )

    async def _patch(self, release: Release) -> None:
        body: Any = release.patch
        if release.kind == "Job":
            await self.batch.patch_namespaced_job(  # type: ignore[call-arg]
                release.name, release.namespace, body, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH
            )
        else:
            await self.core.patch_namespaced_pod(  # type: ignore[call-arg]
                release.name, release.namespace, body, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH
            )

    async def _read(self, release: Release) -> Obj | None:
        read: Any = self.batch.read_namespaced_job if release.kind == "Job" else self.core.read_namespaced_pod
        try:
            return await list_raw(read, release.name, release.namespace)  # any call, raw JSON back
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


async def delete_webhook_configurations(api: client.ApiClient, name: str, *, dry_run: bool) -> list[str]:
    """Delete the MutatingWebhookConfiguration and the ValidatingWebhookConfiguration ``name`` (the
    first step of an uninstall: nothing new is held or rewritten after it); one line each, what it
    did. One that is gone already is no error (a second run, or a Helm uninstall after a manual one)."""
    registration = client.AdmissionregistrationV1Api(api)
    lines = []
    for kind, delete in (
        ("mutatingwebhookconfiguration", registration.delete_mutating_webhook_configuration),
        ("validatingwebhookconfiguration", registration.delete_validating_webhook_configuration),
    ):
        try:
            if not dry_run:
                await delete(name)
            lines.append(f"{kind}/{name}: deleted{' (dry run)' if dry_run else ''}")
        except ApiException as exc:
            if exc.status != 404:
                raise ReleaseError(f"cannot delete {kind} {name}: API error {one_line(exc)}") from None
            lines.append(f"{kind}/{name}: not found (deleted already)")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ReleaseError(f"cannot reach the API server at {api.configuration.host}: {exc}") from None
    return lines
