"""A test double of the Kubernetes API server: an in-process aiohttp app that speaks the REST and
watch protocol for the few resources KRATOS uses (Jobs, Pods, ConfigMaps, Secrets, Nodes, Leases,
WorkloadProfiles with their status subresource, webhook configurations, RuntimeClasses).

It keeps a global resourceVersion, serves list+watch from an event history (a watch from a
compacted resourceVersion gets a 410 Gone ERROR event, as the real server sends), answers 409 on
AlreadyExists and on resourceVersion conflicts, applies JSON and merge patches, and can be told to
fail or to go away, so the client code's error paths are exercised for real.

It is not a Kubernetes API server. (Secrets are kept as they are written: no encryption at rest, no ``stringData`` folding.) It
imitates only the behaviour KRATOS depends on, each piece
named after what it imitates (Kubernetes 1.28):

| behaviour | imitates | left out |
|---|---|---|
| defaults before admission (``_default``): ``schedulerName``, ``restartPolicy`` (Pods), ``dnsPolicy``, ``terminationMessagePolicy``/``Path``, ``imagePullPolicy``, ``securityContext``, ``terminationGracePeriodSeconds``, Job ``completions``/``parallelism``/``backoffLimit``/``completionMode``/``suspend`` | ``pkg/apis/core/v1/defaults.go``, ``pkg/apis/batch/v1/defaults.go``, run at decode, before any admission plugin | most other defaults |
| admission (``_admit``): mutating webhooks, then the RuntimeClass check, then validating webhooks, on CREATE and UPDATE of Jobs and Pods; rules, namespace and object selectors (matchLabels, In/NotIn/Exists/DoesNotExist), failurePolicy, reinvocation once; denials and failures in the real messages; warnings as ``Warning`` headers | ``staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook``; ``plugin/pkg/admission/runtimeclass`` | timeouts, matchConditions, dry-run |
| a Pod naming a RuntimeClass that does not exist is refused | ``plugin/pkg/admission/runtimeclass`` (``pod rejected: RuntimeClass "X" not found``) | overhead, scheduling |
| a Job's pod template is immutable, except its scheduling directives (node affinity, node selector, tolerations, labels, annotations, scheduling gates) while the Job is suspended and has never started | ``ValidateJobSpecUpdate`` with ``JobMutableNodeSchedulingDirectives`` (GA in 1.27) | other Job fields' rules |
| a Pod's spec is immutable but for tolerations added and scheduling gates removed; while gated it also accepts added node selector keys, added required node-affinity expressions and any preferred terms | ``ValidatePodUpdate``, KEP-3838 mutable scheduling directives of gated Pods (1.27 beta, on in 1.28) | images and deadlines |
| a DELETE of an object with finalizers only sets ``deletionTimestamp``; it goes when the last finalizer is removed. ``propagationPolicy`` Foreground adds ``foregroundDeletion`` and deletes dependents first; Orphan strips owner references; Jobs deleted through the API default to Orphan, other kinds to Background | the registry's graceful deletion and ``pkg/controller/garbagecollector``; batch/v1 Job's ``DefaultGarbageCollectionPolicy`` | grace periods |
| garbage collection: a dependent whose owners are all gone is deleted (background) | ``pkg/controller/garbagecollector`` | |
| ``expire_ttls(now)``: finished Jobs past ``ttlSecondsAfterFinished`` are deleted with Foreground propagation (their Pods first) | ``pkg/controller/ttlafterfinished`` | a clock of its own: tests step it |
| ``namespace_lifecycle = True``: creating a namespaced object in a namespace that does not exist is refused with 404 ``namespaces "X" not found`` | the ``NamespaceLifecycle`` admission plugin | terminating namespaces; off by default, as most tests never create namespaces |
| chunked lists: ``limit`` and ``continue``; every page from the snapshot the first was read at, with that resourceVersion; a token older than the last ``compact()`` is 410 ``Expired`` with the real message | the generic registry's paged list (etcd3 store ``GetList`` with ``continue``), API concepts "Retrieving large results sets in chunks" | ``remainingItemCount`` |
| metadata-only lists and watches: ``Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`` lists, ``as=PartialObjectMetadata`` the objects of a watch; an empty such list has ``"items": null``; ``as=PartialObjectMetadata`` on a list is 406 ``NotAcceptable`` (JSON after it in Accept or not); ``as=PartialObjectMetadataList`` on a watch sends no event | ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/response.go`` (``transformObject``), checked with curl against kube-apiserver 1.28.7 | Table, protobuf |
| list and watch with ``fieldSelector`` on ``metadata.name`` / ``metadata.namespace`` (``=``, ``==``, ``!=``, comma-ANDed), and a Pod's ``spec.nodeName`` and ``status.phase`` (``spec.nodeName!=``: bound) | the generic registry's field selectors, which every resource supports for these two fields; ``PodToSelectableFields`` | other fields (a Node's ``spec.unschedulable``, a Pod's ``spec.restartPolicy``...) |
| a watch without ``resourceVersion`` first sends every object it selects as an ADDED event, then the changes after them | "Get State and Start at Most Recent" (API concepts, "Semantics for watch") | ``resourceVersion=0`` ("Start at Any"): replayed from the double's history |
| discovery: ``GET /api``, ``/apis``, ``/api/v1``, ``/apis/<group>/<version>`` list the resources above (legacy, unaggregated form), so ``kubectl apply --dry-run=client`` can map kinds to resources | the discovery handlers of ``staging/src/k8s.io/apiserver/pkg/endpoints/discovery`` | verbs, short names, categories, aggregated discovery (kubectl falls back) |
| an events.k8s.io/v1 Event is created only with ``eventTime``, ``reportingController``, ``reportingInstance``, ``action``, ``reason`` (at most 128 characters), a ``note`` of at most 1 KiB and ``type`` Normal or Warning (422 otherwise) | ``pkg/apis/events/validation.ValidateEventCreate`` | series, related |
| authentication by bearer token (``tokens``: token -> ``Identity``; none is ``system:anonymous``, an unknown one 401) and RBAC authorisation of every request against the Roles, ClusterRoles, RoleBindings and ClusterRoleBindings stored in the double: verb (``get``/``list``/``watch``, a ``fieldSelector=metadata.name=X`` list or watch naming X, ``create``, ``update``, ``patch``, ``delete``, ``deletecollection``), API group, resource and subresource, namespace, ``resourceNames``; ``system:masters`` may do anything; a refusal is 403 with the real Status body and message | ``staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``, ``plugin/pkg/auth/authorizer/rbac``, ``endpoints/handlers/responsewriters.forbiddenMessage`` | aggregation of ClusterRoles, non-resource URLs, impersonation, the default system roles |
| a WorkloadProfile written through the API (create, update, patch, the status subresource) loses every field its CRD's schema does not name (``PRUNED``: the structural schema of ``webhook-config/crd-workloadprofiles.yaml``, the file the install applies), at any depth; ``additionalProperties`` keeps any key, its value pruned by that schema; ``x-kubernetes-preserve-unknown-fields`` keeps all below it | structural pruning, ``apiextensions-apiserver/pkg/apiserver/schema/pruning`` (a field the CRD lacks is dropped silently, never refused) | ``x-kubernetes-embedded-resource``, defaults; objects seeded with ``put()`` bypass it, as writes to etcd would |
| ``metadata.managedFields``: the fields a write changes belong to its field manager (``fieldManager``, else the User-Agent up to its first ``/``), in one entry per manager, operation and subresource; a list is one field, and so is a WorkloadProfile map its CRD marks ``x-kubernetes-map-type: atomic`` | the API server's field manager (``apiserver/pkg/endpoints/handlers/fieldmanager``) over structured-merge-diff's field sets, where an atomic map is a leaf | taking fields from other managers, removed fields, the ``.`` entry a map's own presence adds |
| ``run_jobs()`` / ``finish_pod()``: one Pod per unsuspended, unfinished Job, created through admission like the Job controller's, owned by the Job, ``startTime`` set; a finished Pod completes or fails its Job; a suspended Job's active Pods deleted, not counted ``failed``, ``active`` 0, ``Suspended`` True, ``startTime`` kept | ``pkg/controller/job`` in miniature (``manageJob`` on suspension; checked against kube-controller-manager 1.28.7: an Unschedulable Pod deleted so leaves ``status.failed`` unset) | parallelism, retries, indexes |
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime as dt
import json
import re
import ssl
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import jsonpointer
import yaml
from aiohttp import web
from multidict import CIMultiDict

Obj = dict[str, Any]

# (group prefix, version, plural) -> (kind, namespaced, has status subresource)
RESOURCES: dict[tuple[str, str], tuple[str, bool, bool]] = {
    ("api/v1", "pods"): ("Pod", True, True),
    ("api/v1", "configmaps"): ("ConfigMap", True, False),
    ("api/v1", "secrets"): ("Secret", True, False),
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
    ("apis/node.k8s.io/v1", "runtimeclasses"): ("RuntimeClass", False, False),
    ("apis/events.k8s.io/v1", "events"): ("Event", True, False),
    ("apis/rbac.authorization.k8s.io/v1", "roles"): ("Role", True, False),
    ("apis/rbac.authorization.k8s.io/v1", "rolebindings"): ("RoleBinding", True, False),
    ("apis/rbac.authorization.k8s.io/v1", "clusterroles"): ("ClusterRole", False, False),
    ("apis/rbac.authorization.k8s.io/v1", "clusterrolebindings"): ("ClusterRoleBinding", False, False),
    # Kueue's CRDs (v0.13), served only while ``kueue_installed`` is set (as a cluster serves a CRD's
    # resources only once the CRD is installed)
    ("apis/kueue.x-k8s.io/v1beta1", "workloads"): ("Workload", True, True),
    ("apis/kueue.x-k8s.io/v1beta1", "admissionchecks"): ("AdmissionCheck", False, True),
}
KUEUE = "apis/kueue.x-k8s.io/v1beta1"
WORKLOADS, ADMISSION_CHECKS = (KUEUE, "workloads"), (KUEUE, "admissionchecks")
# custom resources with a status subresource: create ignores status (the CRD's status subresource)
CUSTOM_WITH_STATUS = frozenset({"workloadprofiles", "workloads", "admissionchecks"})
# the lists a server-side apply merges by key, not replaces (``+listType=map`` in the types)
LIST_MAP_KEYS = {"admissionChecks": "name", "conditions": "type"}
EVENTS = ("apis/events.k8s.io/v1", "events")
RBAC = "apis/rbac.authorization.k8s.io/v1"
ROLES, ROLEBINDINGS = (RBAC, "roles"), (RBAC, "rolebindings")
CLUSTERROLES, CLUSTERROLEBINDINGS = (RBAC, "clusterroles"), (RBAC, "clusterrolebindings")
JOBS, PODS = ("apis/batch/v1", "jobs"), ("api/v1", "pods")
# resources that go through admission: (group, version, kind, resource)
ADMITTED: dict[tuple[str, str], tuple[str, str, str, str]] = {
    JOBS: ("batch", "v1", "Job", "jobs"),
    PODS: ("", "v1", "Pod", "pods"),
}
MUTATING = ("apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations")
VALIDATING = ("apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations")
NOW = "2026-11-22T10:00:00Z"
REPO = Path(__file__).resolve().parent.parent


def _crd_schema(path: Path) -> Obj:
    """The ``openAPIV3Schema`` of a CRD's served version, as the install applies the file."""
    crd = yaml.safe_load(path.read_text("utf-8"))
    [version] = [v for v in crd["spec"]["versions"] if v.get("served")]
    schema: Obj = version["schema"]["openAPIV3Schema"]
    return schema


# custom resources whose writes are pruned to their CRD's structural schema, by plural
PRUNED: dict[str, Obj] = {
    "workloadprofiles": _crd_schema(REPO / "webhook-config" / "crd-workloadprofiles.yaml")
}


def _discovery(path: str, *, kueue: bool = False) -> Obj | None:
    """The legacy discovery documents for the resources the double serves (None: not discovery)."""
    path = path.rstrip("/")
    groups = sorted(
        {prefix for prefix, _ in RESOURCES if prefix.startswith("apis/") and (kueue or prefix != KUEUE)}
    )
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g.split("/")[1], "versions": [{"groupVersion": g[5:], "version": g.split("/")[2]}],
             "preferredVersion": {"groupVersion": g[5:], "version": g.split("/")[2]}}
            for g in groups
        ]}  # fmt: skip
    prefix = path.lstrip("/")
    if prefix != "api/v1" and prefix not in groups:
        return None
    resources = []
    for (res_prefix, plural), (kind, namespaced, has_status) in RESOURCES.items():
        if res_prefix != prefix:
            continue
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        resources.append(
            {
                "name": plural,
                "singularName": kind.lower(),
                "namespaced": namespaced,
                "kind": kind,
                "verbs": verbs,
            }
        )
        if has_status:
            resources.append({"name": f"{plural}/status", "singularName": "", "namespaced": namespaced, "kind": kind,
                              "verbs": ["get", "patch", "update"]})  # fmt: skip
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": prefix.removeprefix("apis/").removeprefix("api/"),
        "resources": resources,
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
    user: str = ""
    content_type: str = ""
    accept: str = ""


@dataclass(frozen=True)
class Identity:
    """Who a request comes from, as the API server's authenticator hands it to the authoriser."""

    user: str
    groups: tuple[str, ...] = ("system:authenticated",)


def service_account(namespace: str, name: str) -> Identity:
    """A ServiceAccount's token identity: user and groups as the token authenticator gives them."""
    return Identity(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


ADMIN = Identity("kubernetes-admin", ("system:masters", "system:authenticated"))
ANONYMOUS = Identity("system:anonymous", ("system:unauthenticated",))
WEBHOOK = service_account("kratos-system", "kratos-webhook")
CONTROLLER = service_account("kratos-system", "kratos-controller")
# the tokens the double knows from the start (tests may add more to ``KubeDouble.tokens``)
# the Helm chart's pre-delete hook (webhook-config/chart/templates/release-hook.yaml)
RELEASE = service_account("kratos-system", "kratos-release")
TOKENS = {
    "admin-token": ADMIN,
    "kratos-webhook-token": WEBHOOK,
    "kratos-controller-token": CONTROLLER,
    "kratos-release-token": RELEASE,
}


@dataclass(frozen=True)
class Attributes:
    """What the RBAC authoriser sees of a request (``authorizer.Attributes``)."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str

    @property
    def qualified(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass(frozen=True)
class Decision:
    """One authorisation, with the rule that allowed it: ((Role or ClusterRole kind, namespace, name),
    rule index), None when system:masters allowed it or nothing did."""

    attributes: Attributes
    allowed: bool
    rule: tuple[tuple[str, str, str], int] | None


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
    stopping: bool = False  # set by stop(): open watches end, as when an API server shuts down
    namespace_lifecycle: bool = False  # refuse creates in namespaces that do not exist (see the table)
    requests: list[Request] = field(default_factory=list)
    down: bool = False  # answer every call with 503 and end watches
    # (method, path regex, status, reason, message), used once each
    failures: list[tuple[str, str, int, str, str]] = field(default_factory=list)
    # (method, path regex, seconds): each such request is answered that much later (``slow``)
    delays: list[tuple[str, str, float]] = field(default_factory=list)
    # set once when anything changes, then replaced: a watch waits on the one it saw before reading
    # the history, so no change is missed. Not an asyncio.Condition: on Python 3.11 wait_for()
    # around Condition.wait() can leave the lock held when its timeout races a notify, and every
    # later watch then hangs (seen here as a test that hung at teardown in about one run of seven).
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # where a webhook's Service answers: (namespace, name) -> (host, port); TLS is checked against
    # <name>.<namespace>.svc, as the API server does
    services: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    webhook_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (webhook, operation, kind)
    events: list[str] = field(default_factory=list)  # what the Job controller could not do, and why
    tokens: dict[str, Identity] = field(default_factory=lambda: dict(TOKENS))
    decisions: list[Decision] = field(default_factory=list)  # every authorisation, in order
    kueue_installed: bool = False  # serve Kueue's Workloads and AdmissionChecks (its CRDs installed)
    # the objects a chunked list was first read at, by (resource, resourceVersion): its later pages
    # come from there, as etcd serves them from that revision (dropped by compact())
    snapshots: dict[tuple[tuple[str, str], int], list[tuple[tuple[str, str], Obj]]] = field(
        default_factory=dict
    )

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

    def stop(self) -> None:
        """End every open watch now (the API server's graceful stop), so a server shutdown does not
        wait out each watch's timeoutSeconds."""
        self.stopping = True
        self._notify()

    def compact(self) -> None:
        """Forget the event history, so watches from an older resourceVersion get 410 Gone."""
        self.compacted = self.revision
        self.epoch += 1
        self.snapshots.clear()
        for events in self.history.values():
            events.clear()
        self._notify()

    def fail(
        self,
        method: str,
        path_regex: str,
        status: int = 500,
        reason: str = "InternalError",
        message: str = "",
    ) -> None:
        """The next ``method`` request to a path ``path_regex`` finds is answered ``status``, with this
        Status reason and message (the real server's own words where a test gives them)."""
        self.failures.append((method, path_regex, status, reason, message or "injected failure"))

    def slow(self, method: str, path_regex: str, seconds: float) -> None:
        """Every ``method`` request to a path ``path_regex`` finds is answered ``seconds`` later: a
        test knob, as ``fail`` is, for a loaded server's latency (a round of thousands of patches
        takes minutes on a real one)."""
        self.delays.append((method, path_regex, seconds))

    def calls(self, method: str, path_regex: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and re.search(path_regex, r.path)]

    def _store(self, prefix: str, plural: str, key: tuple[str, str], obj: Obj, event: str) -> None:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.objects[(prefix, plural)][key] = obj
        self.history[(prefix, plural)].append((self.revision, event, copy.deepcopy(obj)))
        self._notify()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    # --- the HTTP side ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        authorization = request.headers.get("Authorization", "")
        token = authorization.removeprefix("Bearer ").strip() if authorization.startswith("Bearer ") else ""
        identity = self.tokens.get(token) if token else ANONYMOUS
        self.requests.append(
            Request(
                request.method,
                request.path,
                dict(request.query),
                request.headers.get("User-Agent", ""),
                identity.user if identity else "",
                request.content_type,
                request.headers.get("Accept", ""),
            )
        )
        if self.down:
            return _status(503, "ServiceUnavailable", "the test double is down")
        if identity is None:
            return _status(401, "Unauthorized", "Unauthorized")
        for i, (method, pattern, status, reason, message) in enumerate(self.failures):
            if method == request.method and re.search(pattern, request.path):
                del self.failures[i]
                return _status(status, reason, message)
        for method, pattern, seconds in self.delays:
            if method == request.method and re.search(pattern, request.path):
                await asyncio.sleep(seconds)
        if (
            request.method == "GET"
            and (found := _discovery(request.path, kueue=self.kueue_installed)) is not None
        ):
            return web.json_response(found)
        match = _PATH.match(request.path)
        if not match or (match["prefix"], match["plural"]) not in RESOURCES:
            return _status(404, "NotFound", f"no route {request.path}")
        if match["prefix"] == KUEUE and not self.kueue_installed:
            return _status(404, "NotFound", "the server could not find the requested resource")
        attributes = request_attributes(identity, request.method, match, request.query)
        decision = self.authorize(identity, attributes)
        if not decision.allowed:
            return _forbidden(attributes)
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
            if namespaced:
                meta["namespace"] = ns
                if self.namespace_lifecycle and ("", ns) not in self.objects[("api/v1", "namespaces")]:
                    return _status(404, "NotFound", f'namespaces "{ns}" not found')
            if resource == EVENTS and (invalid := invalid_event(obj)):
                return _status(
                    422, "Invalid", f'Event.events.k8s.io "{meta.get("name", "")}" is invalid: {invalid}'
                )
            warnings: list[str] = []
            if resource in ADMITTED:
                _default(resource, obj)
                admitted = await self.admit("CREATE", resource, obj, None)
                if isinstance(admitted, web.Response):
                    return admitted
                obj, warnings = admitted
                meta = obj["metadata"]
            if "name" not in meta and "generateName" in meta:
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            key = (meta.get("namespace", ""), meta["name"])
            if key in self.objects[resource]:
                return _status(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
            meta["uid"] = str(uuid.uuid4())
            meta.setdefault("creationTimestamp", _iso(dt.datetime.now(dt.UTC)))
            if has_status and plural in CUSTOM_WITH_STATUS:
                obj.pop("status", None)  # the status subresource: create ignores status
            if plural in PRUNED:
                obj = _pruned(obj, PRUNED[plural])
            _manage(obj, None, _manager(request), "Update", "", schema=PRUNED.get(plural))
            self._store(prefix, plural, key, obj, "ADDED")
            self.collect_garbage()
            return web.json_response(obj, status=201, headers=_warning_headers(warnings))
        key = (ns, name or "")
        current = self.objects[resource].get(key)
        if current is None:
            return _status(404, "NotFound", f'{plural} "{name}" not found')
        if request.method == "GET":
            return web.json_response(current)
        if request.method == "DELETE":
            options = await request.json() if request.can_read_body else {}
            default = "Orphan" if resource == JOBS else "Background"
            policy = str(
                (options or {}).get("propagationPolicy") or request.query.get("propagationPolicy") or default
            )
            return web.json_response(self.delete(prefix, plural, ns, name or "", policy))
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
            given = (body.get("metadata") or {}).get("resourceVersion")
            if given and given != current["metadata"]["resourceVersion"]:
                return _status(
                    409,
                    "Conflict",
                    "the object has been modified; please apply your changes to the latest version",
                )
            updated = _merge(copy.deepcopy(current), body)
        elif request.method == "PATCH" and request.content_type == "application/apply-patch+yaml":
            if "fieldManager" not in request.query:
                return _status(
                    422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: "
                    "is required for apply patch",
                )  # fmt: skip
            updated = _apply(copy.deepcopy(current), body)
        elif request.method == "PATCH":
            return _status(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {request.content_type}",
            )
        else:
            return _status(405, "MethodNotAllowed", request.method)
        updated.setdefault("metadata", {})
        given = updated["metadata"].get("resourceVersion")
        if request.method == "PATCH" and given and given != current["metadata"]["resourceVersion"]:
            # a patch that sets resourceVersion makes it a precondition, whatever the patch type
            return _status(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version",
            )
        for keep in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp", "ownerReferences"):
            if keep in current["metadata"] and (
                keep != "ownerReferences" or "ownerReferences" not in updated["metadata"]
            ):
                updated["metadata"][keep] = current["metadata"][keep]
        if has_status and sub == "status":
            updated = {**copy.deepcopy(current), "status": updated.get("status")}
        elif has_status:
            updated["status"] = copy.deepcopy(current.get("status"))
            if updated["status"] is None:
                updated.pop("status")
        warnings = []
        if resource in ADMITTED and sub is None:
            refused = _immutable(resource, current, updated)
            if refused:
                return _status(422, "Invalid", refused)
            admitted = await self.admit("UPDATE", resource, updated, current)
            if isinstance(admitted, web.Response):
                return admitted
            updated, warnings = admitted
        if plural in PRUNED:
            updated = _pruned(updated, PRUNED[plural])
        operation = "Apply" if request.content_type == "application/apply-patch+yaml" else "Update"
        updated["metadata"]["managedFields"] = copy.deepcopy(current["metadata"].get("managedFields") or [])
        _manage(updated, current, _manager(request), operation, sub or "", schema=PRUNED.get(plural))
        self._store(prefix, plural, key, updated, "MODIFIED")
        self.collect_garbage()
        return web.json_response(self.objects[resource].get(key, updated), headers=_warning_headers(warnings))

    # --- RBAC -----------------------------------------------------------------------------------------

    def authorize(self, identity: Identity, attributes: Attributes) -> Decision:
        """The RBAC authoriser: allowed when a rule of a role bound to the identity covers the request."""
        decision = Decision(attributes, True, None)
        if "system:masters" not in identity.groups:
            decision = Decision(attributes, False, None)
            for role, index in self._rules_for(identity, attributes.namespace):
                rules = (role.get("rules") or []) if role else []
                if _rule_allows(rules[index], attributes):
                    meta = role["metadata"]
                    decision = Decision(
                        attributes, True, ((role["kind"], meta.get("namespace", ""), meta["name"]), index)
                    )
                    break
        self.decisions.append(decision)
        return decision

    def _rules_for(self, identity: Identity, namespace: str) -> Iterable[tuple[Obj, int]]:
        bindings = [(b, "") for b in self.objects[CLUSTERROLEBINDINGS].values()]
        if namespace:
            bindings += [
                (b, namespace) for (ns, _), b in self.objects[ROLEBINDINGS].items() if ns == namespace
            ]
        for binding, scope in bindings:
            if not any(_subject_is(s, identity) for s in binding.get("subjects") or []):
                continue
            ref = binding.get("roleRef") or {}
            role = (
                self.objects[ROLES].get((scope, ref.get("name", "")))
                if ref.get("kind") == "Role"
                else self.objects[CLUSTERROLES].get(("", ref.get("name", "")))
            )
            if role is not None:
                for index in range(len(role.get("rules") or [])):
                    yield role, index

    # --- admission ----------------------------------------------------------------------------------

    async def admit(
        self, operation: str, resource: tuple[str, str], obj: Obj, old: Obj | None
    ) -> tuple[Obj, list[str]] | web.Response:
        """Mutating webhooks, the RuntimeClass check, validating webhooks: what the API server runs
        between decoding a write and storing it. A denial or failure is the response to return."""
        warnings: list[str] = []
        mutating = [
            h
            for c in self.items(*MUTATING)
            for h in c.get("webhooks") or []
            if self._matches(h, operation, resource, obj, old)
        ]
        patched_by: list[int] = []
        for rounds in range(2):  # reinvocationPolicy IfNeeded: once more if a later webhook changed it
            for i, hook in enumerate(mutating):
                if rounds == 1 and (
                    hook.get("reinvocationPolicy") != "IfNeeded" or not patched_by or i >= max(patched_by)
                ):
                    continue
                answer = await self._ask(hook, operation, resource, obj, old, warnings=warnings)
                if isinstance(answer, web.Response):
                    return answer
                if answer.get("patch"):
                    ops = json.loads(base64.b64decode(answer["patch"]))
                    if ops:
                        obj = jsonpatch.apply_patch(obj, ops)
                        patched_by.append(i)
            if len(mutating) < 2 or not patched_by:
                break
        if resource == PODS and operation == "CREATE":
            runtime_class = (obj.get("spec") or {}).get("runtimeClassName")
            if runtime_class and self.get("apis/node.k8s.io/v1", "runtimeclasses", "", runtime_class) is None:
                return _status(403, "Forbidden", f'pod rejected: RuntimeClass "{runtime_class}" not found')
        for config in self.items(*VALIDATING):
            for hook in config.get("webhooks") or []:
                if not self._matches(hook, operation, resource, obj, old):
                    continue
                answer = await self._ask(hook, operation, resource, obj, old, warnings=warnings)
                if isinstance(answer, web.Response):
                    return answer
        return obj, warnings

    def _matches(
        self, hook: Obj, operation: str, resource: tuple[str, str], obj: Obj, old: Obj | None
    ) -> bool:
        group, version, _, plural = ADMITTED[resource]
        rule_ok = any(
            _has(rule.get("apiGroups"), group)
            and _has(rule.get("apiVersions"), version)
            and _has(rule.get("resources"), plural)
            and _has(rule.get("operations"), operation)
            for rule in hook.get("rules") or []
        )
        if not rule_ok:
            return False
        namespace = obj["metadata"].get("namespace", "")
        ns_obj = self.get("api/v1", "namespaces", "", namespace) or {}
        ns_labels = {
            **(ns_obj.get("metadata", {}).get("labels") or {}),
            "kubernetes.io/metadata.name": namespace,
        }
        if not _selector_matches(hook.get("namespaceSelector"), ns_labels):
            return False
        candidates = [obj] + ([old] if old is not None else [])
        return any(
            _selector_matches(hook.get("objectSelector"), c["metadata"].get("labels") or {})
            for c in candidates
        )

    async def _ask(
        self,
        hook: Obj,
        operation: str,
        resource: tuple[str, str],
        obj: Obj,
        old: Obj | None,
        *,
        warnings: list[str],
    ) -> Obj | web.Response:
        """One webhook's answer, its warnings collected; a failure or a denial as the API server's
        response to the client."""
        answer = await self._call(hook, operation, resource, obj, old)
        if isinstance(answer, web.Response):
            return answer
        warnings += answer.get("warnings") or []
        return answer if answer.get("allowed") else _denied(hook, answer)

    async def _call(
        self, hook: Obj, operation: str, resource: tuple[str, str], obj: Obj, old: Obj | None
    ) -> Obj | web.Response:
        group, version, kind, plural = ADMITTED[resource]
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version, "resource": plural},
                "namespace": obj["metadata"].get("namespace", ""),
                "name": obj["metadata"].get("name", ""),
                "operation": operation,
                "userInfo": {"username": "test-user"},
                "object": obj,
                "oldObject": old,
                "dryRun": False,
            },
        }
        config = hook.get("clientConfig") or {}
        if "url" in config:
            url, host = config["url"], None
        else:
            service = config["service"]
            address = self.services[(service["namespace"], service["name"])]
            url = f"https://{address[0]}:{address[1]}{service.get('path', '')}"
            host = f"{service['name']}.{service['namespace']}.svc"
        context = ssl.create_default_context(cadata=base64.b64decode(config.get("caBundle", "")).decode())
        self.webhook_calls.append((hook["name"], operation, kind))
        try:
            async with aiohttp.ClientSession() as session, session.post(
                url, json=review, ssl=context, server_hostname=host,
                timeout=aiohttp.ClientTimeout(total=float(hook.get("timeoutSeconds", 10))),
            ) as response:  # fmt: skip
                if response.status != 200:
                    raise ValueError(f"{response.status}: {await response.text()}")
                answer: Obj = (await response.json())["response"]
                return answer
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError) as exc:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                return {"allowed": True}
            return _status(
                500,
                "InternalError",
                f'Internal error occurred: failed calling webhook "{hook["name"]}": {exc}',
            )

    # --- deletion, finalizers, garbage collection, TTL ------------------------------------------------

    def delete(self, prefix: str, plural: str, namespace: str, name: str, policy: str = "Background") -> Obj:
        """DELETE with a propagation policy: finalizers (and Foreground's foregroundDeletion) keep the
        object, marked with deletionTimestamp, until they are removed."""
        resource = (prefix, plural)
        obj = self.objects[resource].get((namespace, name))
        if obj is None:
            return _status_body(404, "NotFound", f'{plural} "{name}" not found')
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        if policy == "Orphan":
            for dep_resource, dep_key, dependent in self._dependents(meta["uid"]):
                orphan = copy.deepcopy(dependent)
                orphan["metadata"]["ownerReferences"] = [
                    r for r in orphan["metadata"].get("ownerReferences") or [] if r.get("uid") != meta["uid"]
                ]
                self._store(*dep_resource, dep_key, orphan, "MODIFIED")
        if policy == "Foreground" and "foregroundDeletion" not in (meta.get("finalizers") or []):
            meta["finalizers"] = [*(meta.get("finalizers") or []), "foregroundDeletion"]
        if meta.get("finalizers"):
            meta.setdefault("deletionTimestamp", NOW)
            meta.setdefault("deletionGracePeriodSeconds", 0)
            self._store(prefix, plural, (namespace, name), obj, "MODIFIED")
        else:
            self.remove(prefix, plural, namespace, name)
        self.collect_garbage()
        return obj

    def _dependents(self, uid: str) -> list[tuple[tuple[str, str], tuple[str, str], Obj]]:
        return [
            (resource, key, obj)
            for resource, objects in self.objects.items()
            for key, obj in list(objects.items())
            if any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])
        ]

    def collect_garbage(self) -> None:
        """Finalizers done, owners gone, foreground deletions waiting on dependents: until nothing moves."""
        moved = True
        while moved:
            moved = False
            live = {o["metadata"].get("uid") for objects in self.objects.values() for o in objects.values()}
            for resource, objects in list(self.objects.items()):
                for key, obj in list(objects.items()):
                    meta = obj["metadata"]
                    if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                        self.remove(*resource, *key)
                        moved = True
                    elif meta.get("deletionTimestamp") and "foregroundDeletion" in meta["finalizers"]:
                        dependents = self._dependents(meta["uid"])
                        for dep_resource, dep_key, dep in dependents:
                            if not dep["metadata"].get("deletionTimestamp"):
                                self.delete(*dep_resource, *dep_key, "Background")
                                moved = True
                        if not dependents:
                            updated = copy.deepcopy(obj)
                            updated["metadata"]["finalizers"] = [
                                f for f in meta["finalizers"] if f != "foregroundDeletion"
                            ]
                            self._store(*resource, key, updated, "MODIFIED")
                            moved = True
                    elif (
                        meta.get("ownerReferences")
                        and not meta.get("deletionTimestamp")
                        and not any(r.get("uid") in live for r in meta["ownerReferences"])
                    ):
                        self.delete(*resource, *key, "Background")
                        moved = True
                    if moved:
                        break
                if moved:
                    break

    def expire_ttls(self, now: dt.datetime) -> list[str]:
        """The TTL-after-finished controller: delete (Foreground) every finished Job whose
        ttlSecondsAfterFinished has passed by ``now``; the names deleted."""
        expired = []
        for (namespace, name), job in list(self.objects[JOBS].items()):
            ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
            done = _finished_at(job)
            if ttl is None or done is None or job["metadata"].get("deletionTimestamp"):
                continue
            if done + dt.timedelta(seconds=int(ttl)) <= now:
                self.delete(*JOBS, namespace, name, "Foreground")
                expired.append(name)
        return expired

    # --- a Job controller in miniature ------------------------------------------------------------------

    async def run_jobs(self) -> list[str]:
        """One Pod, through admission, for every Job that is not suspended, finished or being
        deleted and has none yet; the names of the Pods created."""
        created = []
        for (namespace, name), job in list(self.objects[JOBS].items()):
            spec = job.get("spec") or {}
            if spec.get("suspend") and not _finished_at(job):
                self._suspend_job(namespace, name, job)
                continue
            if _finished_at(job) or job["metadata"].get("deletionTimestamp"):
                continue
            if any(resource == PODS for resource, _, _ in self._dependents(job["metadata"]["uid"])):
                continue  # the Job controller counts its Pods (an owned Workload, say, is no Pod)
            template = copy.deepcopy(spec.get("template") or {})
            tmeta = template.get("metadata") or {}
            labels = {**(tmeta.get("labels") or {}), "job-name": name, "batch.kubernetes.io/job-name": name,
                      "controller-uid": job["metadata"]["uid"], "batch.kubernetes.io/controller-uid": job["metadata"]["uid"]}  # fmt: skip
            pod: Obj = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{uuid.uuid4().hex[:5]}",
                    "namespace": namespace,
                    "labels": labels,
                    "annotations": tmeta.get("annotations") or {},
                    "finalizers": tmeta.get("finalizers") or [],
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "Job",
                            "name": name,
                            "uid": job["metadata"]["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": template.get("spec") or {},
            }
            _default(PODS, pod)
            admitted = await self.admit("CREATE", PODS, pod, None)
            if isinstance(admitted, web.Response):
                refusal = json.loads(admitted.text or "{}")
                self.events.append(f"{namespace}/{name}: FailedCreate: {refusal.get('message', '')}")
                continue
            pod = admitted[0]
            pod["metadata"]["uid"] = str(uuid.uuid4())
            pod["metadata"]["creationTimestamp"] = _iso(dt.datetime.now(dt.UTC))
            pod["status"] = {"phase": "Pending"}
            self._store(*PODS, (namespace, pod["metadata"]["name"]), pod, "ADDED")
            updated = copy.deepcopy(job)
            updated.setdefault("status", {}).update(startTime=NOW, active=1)
            self._store(*JOBS, (namespace, name), updated, "MODIFIED")
            created.append(pod["metadata"]["name"])
        return created

    def _suspend_job(self, namespace: str, name: str, job: Obj) -> None:
        """A suspended Job's active Pods deleted, none counted failed (a Job of one Unschedulable Pod,
        suspended on kube-apiserver and kube-controller-manager 1.28.7, kept ``status.failed`` unset),
        ``active`` 0 and the ``Suspended`` condition True; its ``startTime`` kept (the Job controller
        sets it anew only on resume)."""
        uid = job["metadata"]["uid"]
        active = [
            key for resource, key, _ in self._dependents(uid)
            if resource == PODS and (self.objects[PODS][key].get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]  # fmt: skip
        for key in active:
            self.delete(*PODS, *key)
        status = job.get("status") or {}
        suspended = any(
            c.get("type") == "Suspended" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        if not active and suspended:
            return
        updated = copy.deepcopy(job)
        status = updated.setdefault("status", {})
        status["active"] = 0
        others = [c for c in status.get("conditions") or [] if c.get("type") != "Suspended"]
        status["conditions"] = [*others, {"type": "Suspended", "status": "True", "reason": "JobSuspended", "lastTransitionTime": NOW}]  # fmt: skip
        self._store(*JOBS, (namespace, name), updated, "MODIFIED")

    def finish_pod(
        self, namespace: str, name: str, *, exit_code: int = 0, message: str | None = None,
        container: str | None = None, node: str = "", seconds: float = 60.0,
    ) -> None:  # fmt: skip
        """The kubelet and the Job controller, at once: the Pod ends (each container terminated,
        ``message`` in ``container``'s), then its Job completes or fails."""
        pod = copy.deepcopy(self.objects[PODS][(namespace, name)])
        started = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
        ended = started + dt.timedelta(seconds=seconds)
        statuses = []
        for c in pod["spec"].get("containers") or []:
            terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                          "startedAt": _iso(started), "finishedAt": _iso(ended)}  # fmt: skip
            if message is not None and c["name"] == (container or c["name"]):
                terminated["message"] = message
            statuses.append({"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""),
                             "imageID": "", "state": {"terminated": terminated}})  # fmt: skip
        pod["spec"]["nodeName"] = node or pod["spec"].get("nodeName", "")
        pod["status"] = {"phase": "Succeeded" if exit_code == 0 else "Failed", "containerStatuses": statuses}
        self._store(*PODS, (namespace, name), pod, "MODIFIED")
        owner = next(
            (r for r in pod["metadata"].get("ownerReferences") or [] if r.get("kind") == "Job"), None
        )
        if owner is None:
            return
        job = copy.deepcopy(self.objects[JOBS][(namespace, owner["name"])])
        condition = "Complete" if exit_code == 0 else "Failed"
        status = job.setdefault("status", {})
        status.update(
            active=0, conditions=[{"type": condition, "status": "True", "lastTransitionTime": _iso(ended)}]
        )
        status["succeeded" if exit_code == 0 else "failed"] = 1
        if exit_code == 0:
            status["completionTime"] = _iso(ended)
        self._store(*JOBS, (namespace, owner["name"]), job, "MODIFIED")

    def _list(self, request: web.Request, resource: tuple[str, str], ns: str, kind: str) -> web.Response:
        selector = request.query.get("labelSelector", "")
        fields = request.query.get("fieldSelector", "")
        partial = _partial_form(request)
        if partial == "PartialObjectMetadata":
            group = "core" if resource[0] == "api/v1" else "unstructured"
            return _status(
                406,
                "NotAcceptable",
                f"you requested PartialObjectMetadata, but the requested object is a list (*{group}.{kind}List)",
            )
        limit = int(request.query.get("limit") or 0)
        token = request.query.get("continue", "")
        if token:
            try:
                position = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
                revision, start = int(position["rv"]), (str(position["start"][0]), str(position["start"][1]))
            except (ValueError, KeyError, TypeError, IndexError):
                return _status(
                    400, "BadRequest", "continue key is not valid: incorrect encoded start resourceVersion"
                )
            snapshot = self.snapshots.get((resource, revision))
            if revision < self.compacted or snapshot is None:
                return _status(410, "Expired", CONTINUE_TOO_OLD)
        else:
            revision, start = self.revision, ("", "")
            snapshot = sorted(
                self.objects[resource].items()
            )  # sent at once: copied only if kept for later pages
        selected = [
            (key, o)
            for key, o in snapshot
            if key > start
            and (not ns or key[0] == ns)
            and _selects(selector, o)
            and _field_selects(fields, o)
        ]
        meta: Obj = {"resourceVersion": str(revision)}
        if limit and len(selected) > limit:
            selected = selected[:limit]
            if not token:
                self.snapshots[(resource, revision)] = [(key, copy.deepcopy(o)) for key, o in snapshot]
            next_start = list(selected[-1][0])  # (namespace, name), as etcd's key after which it goes on
            meta["continue"] = (
                base64.urlsafe_b64encode(
                    json.dumps({"v": "meta.k8s.io/v1", "rv": revision, "start": next_start}).encode()
                )
                .decode()
                .rstrip("=")
            )
        items = [o for _, o in selected]
        if partial == "PartialObjectMetadataList":
            return web.json_response(
                {
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": meta,
                    # an empty one is sent with "items": null (kube-apiserver 1.28.7, seen with curl)
                    "items": [_as_partial(o) for o in items] or None,
                }
            )
        return web.json_response(
            {"kind": f"{kind}List", "apiVersion": "v1", "metadata": meta, "items": items}
        )

    async def _watch(self, request: web.Request, resource: tuple[str, str], ns: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        partial = _partial_form(request)
        if partial == "PartialObjectMetadataList":
            return response  # the real server answers 200 and sends no event it cannot convert
        form = _as_partial if partial == "PartialObjectMetadata" else (lambda o: o)
        since = int(request.query.get("resourceVersion") or self.revision)
        timeout = float(request.query.get("timeoutSeconds", "30"))
        selector = request.query.get("labelSelector", "")
        fields = request.query.get("fieldSelector", "")
        deadline = asyncio.get_running_loop().time() + timeout
        if not request.query.get("resourceVersion"):
            # a watch without a resourceVersion first gets every object it selects as it is now, as
            # ADDED events, then the changes after them: the real server's "Get State and Start at
            # Most Recent" (the watch cache's initial events, API concepts "Semantics for watch")
            for (o_ns, _), obj in sorted(self.objects[resource].items()):
                if (not ns or o_ns == ns) and _selects(selector, obj) and _field_selects(fields, obj):
                    await response.write(json.dumps({"type": "ADDED", "object": form(obj)}).encode() + b"\n")
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
        while not self.down and not self.stopping and epoch == self.epoch:
            changed = self.changed  # taken before reading the history: a later change sets it
            for revision, event, obj in list(self.history[resource]):
                if (
                    revision > sent
                    and (not ns or obj["metadata"].get("namespace") == ns)
                    and _selects(selector, obj)
                    and _field_selects(fields, obj)
                ):
                    try:
                        await response.write(
                            json.dumps({"type": event, "object": form(obj)}).encode() + b"\n"
                        )
                    except ConnectionError:  # the watcher hung up: nothing to send it
                        return response
                sent = max(sent, revision)
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=min(remaining, 0.5))
        return response


# the real server's refusal of a continue token older than etcd's compaction (410, reason Expired)
CONTINUE_TOO_OLD = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter, or use the continue token in this response to retrieve the "
    "remainder of the results. Continuing with the provided token results in an inconsistent list - objects "
    "that were created, modified, or deleted between the time the first chunk was returned and now may show "
    "up in the list."
)


def _pruned(obj: Obj, schema: Obj) -> Obj:
    """``obj`` without the fields ``schema`` does not name, at any depth (apiVersion, kind and
    metadata are the server's own and never pruned)."""
    kept: Obj = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
    pruned = _prune(obj, schema)
    return {**pruned, **kept} if isinstance(pruned, dict) else kept


def _prune(value: Any, schema: Obj) -> Any:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict):
        if "properties" in schema:
            properties = schema["properties"]
            return {k: _prune(val, properties[k]) for k, val in value.items() if k in properties}
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return {k: _prune(val, extra) for k, val in value.items()}
        return value if extra is True else {}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune(item, schema["items"]) for item in value]
    return value


def _partial_form(request: web.Request) -> str:
    """The metadata-only form the request's Accept asks for first ("" for the object itself): the
    server takes the first media type it can serve, and refuses (406) an ``as=`` it cannot give
    for this request, JSON named after it or not."""
    first = request.headers.get("Accept", "").split(",")[0]
    params = dict(part.strip().split("=", 1) for part in first.split(";")[1:] if "=" in part)
    found = params.get("as", "")
    return found if found in ("PartialObjectMetadata", "PartialObjectMetadataList") else ""


def _as_partial(obj: Obj) -> Obj:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": copy.deepcopy(obj["metadata"]),
    }


def _iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _finished_at(job: Obj) -> dt.datetime | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return dt.datetime.fromisoformat(
                str(condition.get("lastTransitionTime", NOW)).replace("Z", "+00:00")
            )
    return None


def _has(values: object, value: str) -> bool:
    return isinstance(values, list) and ("*" in values or value in values)


def _selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist)."""
    if not selector:
        return True
    if any(labels.get(k) != val for k, val in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def _denied(hook: Obj, answer: Obj) -> web.Response:
    status = answer.get("status") or {}
    code = int(status.get("code") or 403)
    message = f'admission webhook "{hook["name"]}" denied the request: {status.get("message", "")}'
    return _status(code, str(status.get("reason") or "Forbidden"), message)


def _warning_headers(warnings: list[str]) -> CIMultiDict[str]:
    """Admission warnings reach the client as HTTP Warning headers (code 299), as the real server sends them."""
    headers: CIMultiDict[str] = CIMultiDict()
    for warning in warnings:
        headers.add("Warning", '299 - "' + warning.replace('"', "'") + '"')
    return headers


def _default(resource: tuple[str, str], obj: Obj) -> None:
    """What the API server fills in when it decodes a Pod or Job, before any admission plugin or webhook
    (pkg/apis/core/v1/defaults.go, pkg/apis/batch/v1/defaults.go)."""
    spec = obj.setdefault("spec", {})
    if resource == JOBS:
        if spec.get("completions") is None and spec.get("parallelism") is None:
            spec["completions"] = spec["parallelism"] = 1
        spec.setdefault("parallelism", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        pod_spec = spec.setdefault("template", {}).setdefault("spec", {})
    else:
        pod_spec = spec
    pod_spec.setdefault("restartPolicy", "Always")
    pod_spec.setdefault("dnsPolicy", "ClusterFirst")
    pod_spec.setdefault("schedulerName", "default-scheduler")
    pod_spec.setdefault("securityContext", {})
    pod_spec.setdefault("terminationGracePeriodSeconds", 30)
    for key in ("initContainers", "containers"):
        for container in pod_spec.get(key) or []:
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            image = str(container.get("image", ""))
            tag = image.rsplit("/", 1)[-1].partition(":")[2] if "@" not in image else "digest"
            container.setdefault("imagePullPolicy", "Always" if tag in ("", "latest") else "IfNotPresent")


# the scheduling directives of a suspended Job's template (JobMutableNodeSchedulingDirectives)
_JOB_SCHEDULING_META = ("labels", "annotations")
_JOB_SCHEDULING_SPEC = ("nodeSelector", "tolerations", "schedulingGates")


def _without(template: Obj, *, scheduling: bool) -> Obj:
    template = copy.deepcopy(template or {})
    if scheduling:
        meta = template.setdefault("metadata", {})
        for key in _JOB_SCHEDULING_META:
            meta.pop(key, None)
        spec = template.setdefault("spec", {})
        for key in _JOB_SCHEDULING_SPEC:
            spec.pop(key, None)
        (spec.get("affinity") or {}).pop("nodeAffinity", None)
    return template


def _immutable(resource: tuple[str, str], old: Obj, new: Obj) -> str:
    """Why the API server refuses this update of a Job's template or a Pod's spec ("" when it does not)."""
    name = old["metadata"]["name"]
    if resource == JOBS:
        old_template, new_template = old["spec"].get("template"), new.get("spec", {}).get("template")
        if old_template == new_template:
            return ""
        never_started = old["spec"].get("suspend") is True and not (old.get("status") or {}).get("startTime")
        if never_started and _without(old_template, scheduling=True) == _without(
            new_template, scheduling=True
        ):
            return ""
        return f'Job.batch "{name}" is invalid: spec.template: Invalid value: ...: field is immutable'
    old_spec, new_spec = copy.deepcopy(old["spec"]), copy.deepcopy(new.get("spec") or {})
    if old_spec == new_spec:
        return ""
    gated = bool(old_spec.get("schedulingGates"))
    refused = f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)'
    old_gates, new_gates = (
        old_spec.pop("schedulingGates", None) or [],
        new_spec.pop("schedulingGates", None) or [],
    )
    if any(g not in old_gates for g in new_gates):
        return f'Pod "{name}" is invalid: spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling gate'
    old_tol, new_tol = old_spec.pop("tolerations", None) or [], new_spec.pop("tolerations", None) or []
    if any(t not in new_tol for t in old_tol):
        return refused
    if gated:
        old_sel, new_sel = old_spec.pop("nodeSelector", None) or {}, new_spec.pop("nodeSelector", None) or {}
        if any(new_sel.get(k) != val for k, val in old_sel.items()):
            return refused
        old_na = (old_spec.get("affinity") or {}).pop("nodeAffinity", None) or {}
        new_na = (new_spec.get("affinity") or {}).pop("nodeAffinity", None) or {}
        old_req = (old_na.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
            "nodeSelectorTerms"
        )
        new_req = (new_na.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
            "nodeSelectorTerms"
        )
        if old_req is not None and (
            new_req is None
            or len(new_req) != len(old_req)
            or any(
                e not in (n.get("matchExpressions") or [])
                for o, n in zip(old_req, new_req, strict=True)
                for e in o.get("matchExpressions") or []
            )
        ):
            return f'Pod "{name}" is invalid: spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: Invalid value: ...: only additions of matchExpressions to existing terms are allowed for a gated pod'
        for spec in (old_spec, new_spec):
            if spec.get("affinity") == {}:
                spec.pop("affinity")
    return "" if old_spec == new_spec else refused


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


# the fields a Pod's field selector may name beyond metadata's (``pkg/registry/core/pod/strategy.go``
# ``PodToSelectableFields``, the two KRATOS asks for)
_POD_FIELDS = ("spec.nodeName", "status.phase")


def _field_selects(selector: str, obj: Obj) -> bool:
    """A field selector on metadata.name / metadata.namespace, and on a Pod's spec.nodeName and
    status.phase (an unset field is ""); any other field matches nothing."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        key, _, value = term.replace("!=", "=").replace("==", "=").partition("=")
        if key not in ("metadata.name", "metadata.namespace") and not (
            obj.get("kind") == "Pod" and key in _POD_FIELDS
        ):
            return False
        section, _, field_name = key.partition(".")
        if (str((obj.get(section) or {}).get(field_name) or "") == value) == negate:
            return False
    return True


def _apply(target: Any, applied: Any) -> Any:
    """Server-side apply's merge, forced: maps merge, lists named in ``LIST_MAP_KEYS`` merge entry by
    key, every other value is replaced (structured-merge-diff, ``+listType=map`` and atomic)."""
    if not isinstance(applied, dict):
        return copy.deepcopy(applied)
    if not isinstance(target, dict):
        target = {}
    for key, value in applied.items():
        if key in LIST_MAP_KEYS and isinstance(value, list):
            by = LIST_MAP_KEYS[key]
            merged = [copy.deepcopy(e) for e in target.get(key) or []]
            for entry in value:
                at = next((i for i, e in enumerate(merged) if e.get(by) == entry.get(by)), None)
                if at is None:
                    merged.append(copy.deepcopy(entry))
                else:
                    merged[at] = _apply(merged[at], entry)
            target[key] = merged
        else:
            target[key] = _apply(target.get(key), value)
    return target


def _manager(request: web.Request) -> str:
    """The field manager of a write: ``fieldManager``, else the user agent up to its first ``/``
    (the API server's default)."""
    return request.query.get("fieldManager") or request.headers.get("User-Agent", "").split("/")[0]


_SERVER_SET = frozenset({"managedFields", "resourceVersion", "uid", "creationTimestamp", "generation"})


def _sub_schema(schema: Obj | None, key: str) -> Obj | None:
    """The schema of ``key`` in an object of ``schema`` (its property, else ``additionalProperties``)."""
    if schema is None:
        return None
    found = (schema.get("properties") or {}).get(key, schema.get("additionalProperties"))
    return found if isinstance(found, dict) else None


def _changed(old: Any, new: Any, schema: Obj | None = None) -> Obj | None:
    """The fields ``new`` sets differently from ``old``, as a FieldsV1 tree (``f:`` keys; a list
    counts as one field, and so does a map whose CRD schema says ``x-kubernetes-map-type: atomic``,
    as structured-merge-diff's field sets do). None when nothing changed."""
    atomic = schema is not None and schema.get("x-kubernetes-map-type") == "atomic"
    if isinstance(new, dict) and isinstance(old, dict | None) and not atomic:
        tree: Obj = {}
        for key, value in new.items():
            if key in _SERVER_SET:
                continue
            sub = _changed((old or {}).get(key), value, _sub_schema(schema, key))
            if sub is not None:
                tree[f"f:{key}"] = sub
        return tree or None
    return None if old == new else {}


def _manage(
    obj: Obj, old: Obj | None, manager: str, operation: str, subresource: str, *, schema: Obj | None = None
) -> None:
    """metadata.managedFields as the API server keeps it: the fields a write changed belong to its
    manager (merged into its entry for that operation and subresource); ``schema``, a CRD's, makes
    its atomic maps one field each. Left out: taking fields away from other managers, and removed
    fields."""
    changed = _changed({} if old is None else {k: v for k, v in old.items() if k != "metadata"},
                       {k: v for k, v in obj.items() if k != "metadata"}, schema)  # fmt: skip
    meta_changed = _changed((old or {}).get("metadata") or {}, {k: obj["metadata"].get(k) for k in ("labels", "annotations", "finalizers") if k in obj["metadata"]})  # fmt: skip
    if meta_changed:
        changed = {**(changed or {}), "f:metadata": meta_changed}
    if not changed or not manager:
        return
    entries = obj["metadata"].setdefault("managedFields", [])
    entry = next(
        (e for e in entries if (e["manager"], e["operation"], e.get("subresource", "")) == (manager, operation, subresource)),
        None,
    )  # fmt: skip
    if entry is None:
        entry = {"manager": manager, "operation": operation, "apiVersion": "v1", "time": NOW, "fieldsType": "FieldsV1", "fieldsV1": {}}  # fmt: skip
        if subresource:
            entry["subresource"] = subresource
        entries.append(entry)
    entry["fieldsV1"] = _union(entry["fieldsV1"], changed)


def _union(a: Obj, b: Obj) -> Obj:
    merged = copy.deepcopy(a)
    for key, value in b.items():
        merged[key] = _union(merged.get(key) or {}, value) if value else merged.get(key, {})
    return merged


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


def request_attributes(
    identity: Identity, method: str, match: re.Match[str], query: Mapping[str, str]
) -> Attributes:
    """The API server's RequestInfo: the verb from the method (a GET with no name is a list or a
    watch, which a ``metadata.name`` field selector names), group, resource, subresource."""
    prefix, name = match["prefix"], match["name"] or ""
    group = "" if prefix == "api/v1" else prefix.split("/")[1]
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch", "").lower() in ("true", "1") else "list")
        if not name:  # fields.Selector.RequiresExactMatch("metadata.name"): "=" or "==", never "!="
            for term in query.get("fieldSelector", "").split(","):
                key, _, value = term.partition("=")
                value = value.removeprefix("=")
                if key == "metadata.name" and value and not value.startswith("="):
                    name = value
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
        if method == "DELETE":
            verb = "delete" if name else "deletecollection"
    return Attributes(
        user=identity.user,
        verb=verb or method.lower(),
        group=group,
        resource=match["plural"],
        subresource=match["sub"] or "",
        namespace=match["ns"] or "",
        name=name,
    )


def invalid_event(event: Obj) -> str:
    """What ``ValidateEventCreate`` refuses in an events.k8s.io/v1 Event ("" when nothing): the
    fields it requires, their lengths, and the type."""
    problems = [
        f"{key}: Required value"
        for key in ("eventTime", "reportingController", "reportingInstance", "action", "reason")
        if not event.get(key)
    ]
    problems += [
        f"{key}: Too long"
        for key in ("action", "reason", "reportingInstance")
        if len(str(event.get(key, ""))) > 128
    ]
    if len(str(event.get("note", "")).encode()) > 1024:
        problems.append("note: Too long: must have at most 1024 bytes")
    if event.get("type") not in ("Normal", "Warning"):
        problems.append(f'type: Unsupported value: "{event.get("type", "")}"')
    return ", ".join(problems)


def _subject_is(subject: Obj, identity: Identity) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return identity.user == f"system:serviceaccount:{subject.get('namespace', '')}:{name}"
    if kind == "User":
        return identity.user == name
    return kind == "Group" and name in identity.groups


def _rule_allows(rule: Obj, attributes: Attributes) -> bool:
    """``rbac.RuleAllows``: verb, API group, resource (``*``, ``res``, ``res/sub``, ``res/*``, ``*/sub``),
    and resourceNames (which never match a request without a name, such as a create)."""
    resources = rule.get("resources") or []
    names = rule.get("resourceNames") or []
    return (
        _has(rule.get("verbs"), attributes.verb)
        and _has(rule.get("apiGroups"), attributes.group)
        and (
            "*" in resources
            or attributes.qualified in resources
            or (bool(attributes.subresource) and f"{attributes.resource}/*" in resources)
            or (bool(attributes.subresource) and f"*/{attributes.subresource}" in resources)
        )
        and (not names or attributes.name in names)
    )


def _forbidden(attributes: Attributes) -> web.Response:
    """403 as ``responsewriters.Forbidden`` writes it: ``apierrors.NewForbidden`` over ``forbiddenMessage``."""
    where = f'in the namespace "{attributes.namespace}"' if attributes.namespace else "at the cluster scope"
    reason = (
        f'User "{attributes.user}" cannot {attributes.verb} resource "{attributes.qualified}" '
        f'in API group "{attributes.group}" {where}'
    )
    resource = f"{attributes.resource}.{attributes.group}" if attributes.group else attributes.resource
    subject = f'{resource} "{attributes.name}"' if attributes.name else resource
    body = _status_body(403, "Forbidden", f"{subject} is forbidden: {reason}")
    body["details"] = {"name": attributes.name, "group": attributes.group, "kind": attributes.resource}
    if not attributes.name:
        del body["details"]["name"]
    return web.json_response(body, status=403)
