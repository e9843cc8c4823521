"""A test double of the Kubernetes API server: an in-process aiohttp app that speaks the REST and
watch protocol for the few resources KRATOS uses (Jobs, Pods, ConfigMaps, Nodes, Leases,
WorkloadProfiles with their status subresource, webhook configurations).

It is NOT a Kubernetes API server: no admission, no defaulting, no validation beyond what the
tests need. It keeps a global resourceVersion, serves list+watch from an event history (a watch
from a compacted resourceVersion gets a 410 Gone ERROR event, as the real server sends), answers
409 on AlreadyExists and on resourceVersion conflicts, applies JSON merge patches, and can be
told to fail or to go away, so the client code's error paths are exercised for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import jsonpointer
from aiohttp import web

Obj = dict[str, Any]

# (group prefix, version, plural) -> (kind, namespaced, has status subresource)
RESOURCES: dict[tuple[str, str], tuple[str, bool, bool]] = {
    ("api/v1", "pods"): ("Pod", True, True),
    ("api/v1", "configmaps"): ("ConfigMap", True, False),
    ("api/v1", "nodes"): ("Node", False, True),
    ("api/v1", "namespaces"): ("Namespace", False, False),
    ("apis/batch/v1", "jobs"): ("Job", True, True),
    ("apis/coordination.k8s.io/v1", "leases"): ("Lease", True, False),
    ("apis/gpu.scheduler.io/v1alpha1", "workloadprofiles"): ("WorkloadProfile", True, True),
    ("apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations"): (
        "MutatingWebhookConfiguration",
        False,
        False,
    ),
    ("apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations"): (
        "ValidatingWebhookConfiguration",
        False,
        False,
    ),
}
_PATH = re.compile(
    r"^/(?P<prefix>api/v1|apis/[^/]+/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?$"
)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    user_agent: str = ""


@dataclass
class KubeDouble:
    objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    history: dict[tuple[str, str], list[tuple[int, str, Obj]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    revision: int = 100
    compacted: int = 0
    epoch: int = 0  # bumped by compact(): open watches end, as when an API server restarts
    requests: list[Request] = field(default_factory=list)
    down: bool = False  # answer every call with 503 and end watches
    failures: list[tuple[str, str, int]] = field(
        default_factory=list
    )  # (method, path regex, status), used once each
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _wakers: set[asyncio.Task[None]] = field(default_factory=set)

    # --- seeding and inspection (synchronous helpers for tests) --------------------------------

    def put(self, prefix: str, plural: str, obj: Obj) -> Obj:
        """Create or replace an object directly, recording a watch event."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        key = (meta.get("namespace", ""), meta["name"])
        event = "MODIFIED" if key in self.objects[(prefix, plural)] else "ADDED"
        meta.setdefault("uid", str(uuid.uuid4()))
        self._store(prefix, plural, key, obj, event)
        return obj

    def get(self, prefix: str, plural: str, namespace: str, name: str) -> Obj | None:
        return copy.deepcopy(self.objects[(prefix, plural)].get((namespace, name)))

    def items(self, prefix: str, plural: str) -> list[Obj]:
        return [copy.deepcopy(o) for o in self.objects[(prefix, plural)].values()]

    def remove(self, prefix: str, plural: str, namespace: str, name: str) -> None:
        obj = self.objects[(prefix, plural)].pop((namespace, name))
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.history[(prefix, plural)].append((self.revision, "DELETED", copy.deepcopy(obj)))
        self._notify()

    def compact(self) -> None:
        """Forget the event history, so watches from an older resourceVersion get 410 Gone."""
        self.compacted = self.revision
        self.epoch += 1
        for events in self.history.values():
            events.clear()
        self._notify()

    def fail(self, method: str, path_regex: str, status: int = 500) -> None:
        self.failures.append((method, path_regex, status))

    def calls(self, method: str, path_regex: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and re.search(path_regex, r.path)]

    def _store(self, prefix: str, plural: str, key: tuple[str, str], obj: Obj, event: str) -> None:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.objects[(prefix, plural)][key] = obj
        self.history[(prefix, plural)].append((self.revision, event, copy.deepcopy(obj)))
        self._notify()

    def _notify(self) -> None:
        async def wake() -> None:
            async with self.changed:
                self.changed.notify_all()

        with contextlib.suppress(RuntimeError):  # no loop yet: nobody can be watching
            task = asyncio.get_running_loop().create_task(wake())
            self._wakers.add(task)
            task.add_done_callback(self._wakers.discard)

    # --- the HTTP side ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(
            Request(request.method, request.path, dict(request.query), request.headers.get("User-Agent", ""))
        )
        if self.down:
            return _status(503, "ServiceUnavailable", "the test double is down")
        for i, (method, pattern, status) in enumerate(self.failures):
            if method == request.method and re.search(pattern, request.path):
                del self.failures[i]
                return _status(status, "InternalError", "injected failure")
        match = _PATH.match(request.path)
        if not match or (match["prefix"], match["plural"]) not in RESOURCES:
            return _status(404, "NotFound", f"no route {request.path}")
        prefix, plural, ns, name, sub = (
            match["prefix"],
            match["plural"],
            match["ns"] or "",
            match["name"],
            match["sub"],
        )
        kind, namespaced, has_status = RESOURCES[(prefix, plural)]
        resource = (prefix, plural)
        if request.method == "GET" and name is None:
            if request.query.get("watch", "").lower() in ("true", "1"):
                return await self._watch(request, resource, ns)
            return self._list(request, resource, ns, kind)
        if request.method == "POST" and name is None:
            obj = await request.json()
            meta = obj.setdefault("metadata", {})
            if "name" not in meta and "generateName" in meta:
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if namespaced:
                meta["namespace"] = ns
            key = (meta.get("namespace", ""), meta["name"])
            if key in self.objects[resource]:
                return _status(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
            meta["uid"] = str(uuid.uuid4())
            meta.setdefault("creationTimestamp", "2026-11-22T10:00:00Z")
            if has_status and plural == "workloadprofiles":
                obj.pop("status", None)  # the status subresource: create ignores status
            self._store(prefix, plural, key, obj, "ADDED")
            return web.json_response(obj, status=201)
        key = (ns, name or "")
        current = self.objects[resource].get(key)
        if current is None:
            return _status(404, "NotFound", f'{plural} "{name}" not found')
        if request.method == "GET":
            return web.json_response(current)
        if request.method == "DELETE":
            self.remove(prefix, plural, ns, name or "")
            return web.json_response(_status_body(200, "Success", "deleted"))
        body = await request.json()
        if request.method == "PUT":
            given = body.get("metadata", {}).get("resourceVersion")
            if given and given != current["metadata"]["resourceVersion"]:
                return _status(
                    409,
                    "Conflict",
                    "the object has been modified; please apply your changes to the latest version",
                )
            updated = copy.deepcopy(body)
        elif request.method == "PATCH" and request.content_type == "application/json-patch+json":
            try:
                updated = jsonpatch.apply_patch(current, body)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                return _status(422, "Invalid", str(exc))
        elif request.method == "PATCH" and request.content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            updated = _merge(copy.deepcopy(current), body)
        elif request.method == "PATCH":
            return _status(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {request.content_type}",
            )
        else:
            return _status(405, "MethodNotAllowed", request.method)
        updated.setdefault("metadata", {})
        for keep in ("uid", "creationTimestamp", "name", "namespace"):
            if keep in current["metadata"]:
                updated["metadata"][keep] = current["metadata"][keep]
        if has_status and plural == "workloadprofiles":
            if sub == "status":
                updated = {**copy.deepcopy(current), "status": updated.get("status")}
            else:
                updated["status"] = copy.deepcopy(current.get("status"))
                if updated["status"] is None:
                    updated.pop("status")
        self._store(prefix, plural, key, updated, "MODIFIED")
        return web.json_response(updated)

    def _list(self, request: web.Request, resource: tuple[str, str], ns: str, kind: str) -> web.Response:
        selector = request.query.get("labelSelector", "")
        items = [
            o
            for (o_ns, _), o in sorted(self.objects[resource].items())
            if (not ns or o_ns == ns) and _selects(selector, o)
        ]
        return web.json_response(
            {
                "kind": f"{kind}List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.revision)},
                "items": items,
            }
        )

    async def _watch(self, request: web.Request, resource: tuple[str, str], ns: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        since = int(request.query.get("resourceVersion") or self.revision)
        timeout = float(request.query.get("timeoutSeconds", "30"))
        selector = request.query.get("labelSelector", "")
        deadline = asyncio.get_running_loop().time() + timeout
        if since < self.compacted:
            gone = {
                "type": "ERROR",
                "object": _status_body(
                    410, "Expired", f"too old resource version: {since} ({self.compacted})"
                ),
            }
            await response.write(json.dumps(gone).encode() + b"\n")
            return response
        sent = since
        epoch = self.epoch
        while not self.down and epoch == self.epoch:
            for revision, event, obj in list(self.history[resource]):
                if (
                    revision > sent
                    and (not ns or obj["metadata"].get("namespace") == ns)
                    and _selects(selector, obj)
                ):
                    await response.write(json.dumps({"type": event, "object": obj}).encode() + b"\n")
                sent = max(sent, revision)
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            async with self.changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), timeout=min(remaining, 0.5))
        return response


def _selects(selector: str, obj: Obj) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, val = term.split("!=", 1)
            if labels.get(k) == val:
                return False
        elif "=" in term:
            k, val = term.split("=", 1)
            if labels.get(k.rstrip("=")) != val.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (strategic merge patches are treated the same here)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge(target.get(key), value)
    return target


def _status_body(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure" if code >= 400 else "Success",
        "code": code,
        "reason": reason,
        "message": message,
    }


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(_status_body(code, reason, message), status=code)
