"""KRATOS's webhook and controller against a real API server filled like the largest clusters.

    .venv/bin/python bench/scale_bench.py --kubeconfig K fill --nodes 5000 --profiles 20000
    .venv/bin/python bench/scale_bench.py --kubeconfig K fill --pods 50000 --jobs 10000
    .venv/bin/python bench/scale_bench.py --kubeconfig K measure webhook
    .venv/bin/python bench/scale_bench.py --kubeconfig K measure controller
    .venv/bin/python bench/scale_bench.py --kubeconfig K empty

``fill`` creates what is missing (it counts what is there first, so a second run adds nothing):
GPU Nodes labelled as GPU Feature Discovery labels them, with the status a kubelet reports (capacity,
conditions, addresses, ten images) written through the status subresource, each tainted
``kratos.dev/scale-fill:NoSchedule`` from its creation (no kubelet runs a Pod bound to it: on a
cluster with a scheduler, as the faults tier's, none is ever placed there); mature WorkloadProfiles as
the controller writes them (observations on three products; ``countedRuns`` naming the last write's
run, as issue 59's controller leaves it, the others being in the ledger ConfigMap only it reads, or
with ``--shape before`` at its old cap of 256 uids; no ``calibratedShares``: the controller's first fit
writes them); Pods bound
to those Nodes (no kubelet runs them: they stay Pending) and suspended Jobs (so no Job controller
makes Pods of them), a quarter of each labelled ``gpu.scheduler.io/workload``, the label KRATOS's
informers select. Use a server of its own (an etcd and a kube-apiserver, no scheduler, no
controllers): nothing else then moves what is measured. ``empty`` deletes the fill's Nodes and its
team-* namespaces, with all in them (the faults tier fills its cluster so, then empties it).

``measure`` starts ``kratos-admit webhook`` or ``kratos-admit controller`` as a process against that
server and samples its resident set (``VmRSS`` of ``/proc/PID/status``) every 50 ms: the peak until
it is Ready (its ``/readyz``: for the webhook, every cache synced) and its caches are whole (for the
controller, ``kratos_cached_objects`` counted for Jobs and Pods), the time to each, the resident set once settled,
and then the API server's requests per minute at rest (``apiserver_request_total`` over
``--rest`` seconds, by verb and resource, less what the server asked of itself over as long a time
before the process started: the process is the server's only client) and the process's CPU over them
(``utime + stime`` of ``/proc/PID/stat``, its threads included). Its start's lists are in bytes too:
``apiserver_response_sizes_sum`` of LIST, by resource, as the server sent them (the
``ResponseWriterDelegator`` that counts them wraps the handler that gzips a list over 128 KiB for a
client that accepts gzip, as the webhook's does: kube-apiserver 1.28.7's ``endpoints/metrics`` and
``responsewriters/writers.go``). The controller is left to write its first calibration (``kratos_calibration_writes_total``,
or a refused write) before ``--settle`` starts; at the end its refused writes are counted and the
ConfigMap's size read. With ``--runs N`` (the controller), N runs then finish one after another, each
as the Job controller and a kubelet would leave it (a signed, hinted Job of a filled workload, its
Pod on a filled Node of a product the workload was observed on, the Pod's status and the Job's
``Complete`` written through the status subresource), and each is timed from its Job's completion to
its count in the profile's observations, to the ConfigMap's next write and to the profile's next
``calibratedShares``. Prints a JSON line with the figures and the commit measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_bench import node, profile  # the same objects as the in-process benchmark

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.signing import load_signing_key, sign_block
from kratos_admit.edge.kube import api_client, is_status, list_pages, metadata_lister
from kratos_admit.model.calibration import CONFIGMAP_NAME

NAMESPACES = 200  # team-0 .. team-199, as memory_bench's profiles
FILL_TAINT = "kratos.dev/scale-fill"  # on every Node the fill makes: no kubelet would run its Pods
WORKERS = 32  # creates in flight
Obj = dict[str, Any]


def commit(python: str) -> str:
    """The commit of the kratos_admit that ``python`` imports (+dirty: with changes)."""
    where = subprocess.run([python, "-c", "import kratos_admit; print(kratos_admit.__file__)"],
                           check=True, capture_output=True, text=True, cwd="/").stdout.strip()  # fmt: skip
    tree = str(Path(where).parent)
    found = subprocess.run(
        ["git", "-C", tree, "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True
    )
    dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--untracked-files=no"],
                           check=False, capture_output=True, text=True).stdout.strip()  # fmt: skip
    return found.stdout.strip() + ("+dirty" if dirty else "")


async def together(calls: list[Callable[[], Awaitable[Any]]]) -> None:
    """Every call, ``WORKERS`` at a time; one the server was too busy for tried again."""
    gate = asyncio.Semaphore(WORKERS)

    async def one(call: Callable[[], Awaitable[Any]]) -> None:
        async with gate:
            for attempt in range(5):
                try:
                    await call()
                    return
                except client.ApiException as exc:
                    if is_status(exc, 409):  # made by an earlier, interrupted fill
                        return
                    if not is_status(exc, 429, 500, 503, 504) or attempt == 4:
                        raise
                    await asyncio.sleep(0.5 * 2**attempt)

    await asyncio.gather(*(one(c) for c in calls))


async def names(list_func: Any, *args: Any, needs: str = "") -> set[str]:
    """namespace/name of the objects listed (with a ``needs`` field, only those that have it)."""
    found: set[str] = set()
    async for body in list_pages(list_func, *args, limit=5000):
        found.update(
            f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}"
            for i in body.get("items") or []
            if not needs or needs in i
        )
    return found


def pod(index: int) -> Obj:
    labels = {"app": f"app-{index % 500}"} | (
        {v.WORKLOAD_LABEL: f"workload-{index % 2000}"} if index % 4 == 0 else {}
    )
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"pod-{index:06d}", "namespace": f"team-{index % NAMESPACES}", "labels": labels},
        "spec": {"nodeName": f"gpu-node-{index % 5000:05d}", "restartPolicy": "Never",
                 "automountServiceAccountToken": False,
                 "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                 "command": ["python", "train.py", "--epochs", "10"],
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "4", "memory": "16Gi"}},
                                 "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}],
                 "tolerations": [{"key": v.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]},
    }  # fmt: skip


def job(index: int) -> Obj:
    labels = {"app": f"app-{index % 500}"} | (
        {v.WORKLOAD_LABEL: f"workload-{index % 2000}"} if index % 4 == 0 else {}
    )
    template = pod(index)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"job-{index:06d}", "namespace": f"team-{index % NAMESPACES}", "labels": labels},
        "spec": {"suspend": True, "backoffLimit": 0,
                 "template": {"metadata": {"labels": labels}, "spec": {**template["spec"], "nodeName": None}}},
    }  # fmt: skip


def mature_profile(index: int, *, shape: str = "issue59") -> Obj:
    """memory_bench's mature profile, its ``countedRuns`` as the controller of ``shape`` leaves it."""
    obj = profile(index, mature=True)
    if shape == "issue59":
        obj["status"]["countedRuns"] = obj["status"]["countedRuns"][-1:]
    return obj


async def fill(
    api: client.ApiClient,
    *,
    nodes: int,
    profiles: int,
    pods: int = 0,
    jobs: int = 0,
    shape: str = "issue59",
) -> None:
    # Any: they are given plain dicts, which the generated clients send as they are
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    batch: Any = client.BatchV1Api(api)
    started = time.monotonic()
    have = await names(core.list_namespace)
    wanted = [f"team-{i}" for i in range(NAMESPACES)] + ["kratos-system"]
    await together(
        [
            functools.partial(core.create_namespace, {"metadata": {"name": n}})
            for n in wanted
            if f"/{n}" not in have
        ]
    )
    accounts = await names(core.list_service_account_for_all_namespaces)  # no controller-manager: none made
    await together([
        functools.partial(core.create_namespaced_service_account, n, {"metadata": {"name": "default"}})
        for n in wanted if f"{n}/default" not in accounts
    ])  # fmt: skip
    have = await names(metadata_lister(api, "/api/v1/nodes")) if nodes else set()

    async def make_node(i: int) -> None:
        obj = node(i)
        status = obj.pop("status")
        obj["metadata"] = {
            k: val for k, val in obj["metadata"].items() if k in ("name", "labels", "annotations")
        }
        obj["spec"]["taints"].append({"key": FILL_TAINT, "value": "true", "effect": "NoSchedule"})
        try:
            await core.create_node(obj)
        except client.ApiException as exc:  # made by an interrupted fill, perhaps without its status
            if not is_status(exc, 409):
                raise
        await core.patch_node_status(
            obj["metadata"]["name"], {"status": status}, _content_type="application/merge-patch+json"
        )

    await together(
        [functools.partial(make_node, i) for i in range(nodes) if f"/gpu-node-{i:05d}" not in have]
    )
    print(f"nodes: {nodes} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    have = (
        await names(custom.list_cluster_custom_object, v.GROUP, v.VERSION, v.PROFILE_PLURAL, needs="status")
        if profiles
        else set()
    )

    async def make_profile(i: int) -> None:
        obj = mature_profile(i, shape=shape)
        status = obj.pop("status")
        meta = obj["metadata"]
        obj["metadata"] = {"name": meta["name"], "namespace": meta["namespace"]}
        try:
            await custom.create_namespaced_custom_object(
                v.GROUP, v.VERSION, meta["namespace"], v.PROFILE_PLURAL, obj
            )
        except client.ApiException as exc:  # made by an interrupted fill, perhaps without its status
            if not is_status(exc, 409):
                raise
        await custom.patch_namespaced_custom_object_status(
            v.GROUP,
            v.VERSION,
            meta["namespace"],
            v.PROFILE_PLURAL,
            meta["name"],
            {"status": status},
            _content_type="application/merge-patch+json",
        )

    await together([
        functools.partial(make_profile, i) for i in range(profiles)
        if f"team-{i % NAMESPACES}/workload-{i}-profile" not in have
    ])  # fmt: skip
    print(f"profiles: {profiles} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    workloads: list[tuple[str, str, Any, Callable[[int], Obj], int]] = [
        ("pods", "/api/v1/pods", core.create_namespaced_pod, pod, pods),
        ("jobs", "/apis/batch/v1/jobs", batch.create_namespaced_job, job, jobs),
    ]
    for kind, path, create, build, count in workloads:
        have = await names(metadata_lister(api, path)) if count else set()
        await together([
            functools.partial(create, f"team-{i % NAMESPACES}", build(i)) for i in range(count)
            if f"team-{i % NAMESPACES}/{kind[:-1]}-{i:06d}" not in have
        ])  # fmt: skip
        print(f"{kind}: {count} ({time.monotonic() - started:.0f} s)", file=sys.stderr)


async def empty(api: client.ApiClient) -> None:
    """Delete what ``fill`` made: its Nodes (``gpu-node-NNNNN``) and the team-* namespaces, whose
    namespace controller (where one runs) deletes all in them; kratos-system stays."""
    core: Any = client.CoreV1Api(api)

    async def gone(delete: Callable[[str], Awaitable[Any]], name: str) -> None:
        try:
            await delete(name)
        except client.ApiException as exc:
            if not is_status(exc, 404):
                raise

    nodes = [n.lstrip("/") for n in await names(metadata_lister(api, "/api/v1/nodes"))]
    teams = {f"team-{i}" for i in range(NAMESPACES)}
    namespaces = [n.lstrip("/") for n in await names(core.list_namespace)]
    calls: list[Callable[[], Awaitable[Any]]] = [
        functools.partial(gone, core.delete_node, n) for n in nodes if re.fullmatch(r"gpu-node-\d{5}", n)
    ]
    await together(
        calls + [functools.partial(gone, core.delete_namespace, n) for n in namespaces if n in teams]
    )


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """The process's resident set now, or (``VmHWM``) the most it ever held, between samples too."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def sampled(pid: int, seconds: float) -> float:
    """The highest resident set over ``seconds``, sampled every 50 ms."""
    peak, until = 0.0, time.monotonic() + seconds
    while time.monotonic() < until:
        peak = max(peak, rss_mib(pid))
        await asyncio.sleep(0.05)
    return peak


def cpu_seconds(pid: int) -> float:
    """The CPU a process has used, user and system, its threads included (``/proc/PID/stat``)."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


async def requests_by(api: client.ApiClient, metric: str = "apiserver_request_total") -> Counter[str]:
    """apiserver_request_total by verb and resource (what every client asked so far); with ``metric``
    ``apiserver_response_sizes_sum``, the bytes of the answers so."""
    response = await api.call_api("/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False,
                                  _return_http_data_only=True)  # fmt: skip
    text = (await response.read()).decode()
    found: Counter[str] = Counter()
    for line in text.splitlines():
        if not line.startswith(metric + "{"):
            continue
        labels = dict(
            p.split("=", 1) for p in line[line.index("{") + 1 : line.rindex("}")].split(",") if "=" in p
        )
        resource = labels.get("resource", '""').strip('"')
        if resource:
            found[f"{labels.get('verb', '').strip(chr(34))} {resource}"] += int(float(line.rsplit(" ", 1)[1]))
    return found


async def measure(api: client.ApiClient, args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="kratos-scale-"))
    exe = [args.python, "-m", "kratos_admit"]
    subprocess.run([*exe, "certs", "generate", "--service", "kratos-webhook", "--namespace", "kratos-system",
                    "--out", str(work)], check=True, capture_output=True, cwd=work)  # fmt: skip
    env = dict(os.environ, KRATOS_LOG_LEVEL="WARNING")
    if args.process == "webhook":
        command = [*exe, "webhook", "--listen", "127.0.0.1:18443", "--tls-cert", str(work / "tls.crt"),
                   "--tls-key", str(work / "tls.key"), "--signing-key", str(work / "signing.key"),
                   "--kubeconfig", str(args.kubeconfig)]  # fmt: skip
        ready_url = "https://127.0.0.1:18443/readyz"
    else:
        command = [
            *exe,
            "controller",
            "--signing-key",
            str(work / "signing.key"),
            "--kubeconfig",
            str(args.kubeconfig),
        ]
        env |= {"KRATOS_CONTROLLER_METRICS_LISTEN": "127.0.0.1:19090", "POD_NAME": "kratos-scale-bench"}
        ready_url = "http://127.0.0.1:19090/readyz"
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    # the API server's own requests (its lease, the kubernetes Service's endpoints, its informers'
    # watches ending), counted over the same time with nothing else running, are taken off the process's
    quiet_from = await requests_by(api)
    await asyncio.sleep(args.rest)
    quiet = await requests_by(api) - quiet_from
    before = await requests_by(api)
    sizes_before = await requests_by(api, "apiserver_response_sizes_sum")
    started = time.monotonic()
    with (work / "stderr").open("wb") as stderr:
        # run from elsewhere: from the checkout, ``-m`` would import the checkout's kratos_admit, not --python's
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr, cwd=work)
    peak, ready_s, high_water = 0.0, None, 0.0
    try:
        async with aiohttp.ClientSession() as http:
            while ready_s is None and time.monotonic() - started < args.timeout:
                peak = max(peak, rss_mib(process.pid))
                if process.poll() is not None:
                    raise SystemExit(
                        f"{args.process} exited {process.returncode}: {(work / 'stderr').read_text()[-2000:]}"
                    )
                with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                    async with http.get(
                        ready_url, ssl=insecure, timeout=aiohttp.ClientTimeout(total=0.5)
                    ) as answer:
                        if answer.status == 200:
                            ready_s = time.monotonic() - started
                await asyncio.sleep(0.05)
            synced_s = ready_s if args.process == "webhook" else None  # the webhook is Ready once synced
            while args.process == "controller" and time.monotonic() - started < args.timeout:
                # a controller is Ready as a standby too: its caches are whole once both kinds are counted
                peak = max(peak, rss_mib(process.pid))
                with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                    async with http.get("http://127.0.0.1:19090/metrics") as answer:
                        counted = [
                            line for line in (await answer.text()).splitlines()
                            if line.startswith("kratos_cached_objects{")
                        ]  # fmt: skip
                    if not counted:
                        break  # a version without the gauge: no time to say
                    if all(not line.endswith("NaN") for line in counted):
                        synced_s = time.monotonic() - started
                        break
                await asyncio.sleep(0.1)
            at_ready = rss_mib(process.pid)
            sizes = await requests_by(api, "apiserver_response_sizes_sum") - sizes_before
            calibrated_s = fitted_s = None
            while args.process == "controller" and time.monotonic() - started < args.timeout:
                # the first fit is done when its histogram counts one; a calibration equal to the one
                # the ConfigMap holds is not written, so the write is waited for only a little after
                peak = max(peak, rss_mib(process.pid))
                if (
                    fitted_s is None
                    and await controller_metric(http, "kratos_calibration_fit_seconds_count") > 0
                ):
                    fitted_s = time.monotonic() - started
                if await controller_metric(http, "kratos_calibration_writes") > 0:
                    calibrated_s = time.monotonic() - started
                    break
                if fitted_s is not None and time.monotonic() - started > fitted_s + FIRST_WRITE_WAIT:
                    break
                await asyncio.sleep(0.5)
            peak = max(peak, await sampled(process.pid, args.settle))
            settled = rss_mib(process.pid)
            rest_from, cpu_from = await requests_by(api), cpu_seconds(process.pid)
            peak = max(peak, await sampled(process.pid, args.rest))
            rest_cpu = (cpu_seconds(process.pid) - cpu_from) / args.rest
            rest = await requests_by(api) - rest_from - quiet
            scale = (time.monotonic() - started - args.rest) / args.rest  # the start's share of quiet
            listed = rest_from - before - Counter({k: round(n * scale) for k, n in quiet.items()})
            runs = []
            for index in range(args.runs):
                runs.append(await run_to_calibration(api, load_signing_key(work / "signing.key"), index))
                peak = max(peak, rss_mib(process.pid))
            refused = await controller_metric(http, "kratos_calibration_write_failures_total")
            high_water = rss_mib(process.pid, "VmHWM")
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
        if process.poll() is None:
            process.kill()
    per_minute = {k: round(n * 60 / args.rest, 1) for k, n in sorted(rest.items())}
    lists = {k.split(" ", 1)[1]: n for k, n in sorted(sizes.items()) if k.startswith("LIST ")}
    found: dict[str, Any] = {
        "commit": commit(args.python), "process": args.process, "readySeconds": None if ready_s is None else round(ready_s, 1),
        "syncedSeconds": None if synced_s is None else round(synced_s, 1),
        "peakMiB": round(peak, 1), "highWaterMiB": round(high_water, 1), "atReadyMiB": round(at_ready, 1), "settledMiB": round(settled, 1),
        "startListBytes": lists, "startListBytesTotal": sum(lists.values()),
        "startRequests": dict(sorted(listed.items())), "restRequestsPerMinute": per_minute,
        "restRequestsPerMinuteTotal": round(sum(rest.values()) * 60 / args.rest, 1),
        "restCpuCores": round(rest_cpu, 4),
    }  # fmt: skip
    if args.process == "controller":
        configmap = await client.CoreV1Api(api).read_namespaced_config_map(CONFIGMAP_NAME, "kratos-system")
        found |= {
            "fittedSeconds": None if fitted_s is None else round(fitted_s, 1),
            "calibratedSeconds": None if calibrated_s is None else round(calibrated_s, 1),
            "calibrationWriteFailures": refused,
            "configMapBytes": sum(len(text.encode()) for text in (configmap.data or {}).values()),
            "runs": runs,
        }
    return found


async def controller_metric(http: aiohttp.ClientSession, name: str) -> float:
    """The sum of the controller's samples of ``name`` (and of every series whose name starts so)."""
    with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
        async with http.get("http://127.0.0.1:19090/metrics") as answer:
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in (await answer.text()).splitlines()
                if line.startswith(name) and not line.startswith("#") and "_created" not in line.split(" ")[0]
            )
    return 0.0


FIRST_WRITE_WAIT = 60.0  # after the first fit: the write, where one is due (an equal calibration makes none)
RUN_NODE, RUN_SECONDS = "gpu-node-00002", 102.5  # memory_bench's NVIDIA-L40S; the fill's mean there


async def run_to_calibration(api: client.ApiClient, key: bytes, index: int) -> dict[str, Any]:
    """One run of the fill's workload ``index`` finished on ``RUN_NODE``, timed from its Job's
    ``Complete`` to its count, to the ConfigMap's next write and to the profile's next shares."""
    core: Any = client.CoreV1Api(api)
    batch: Any = client.BatchV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    namespace, workload = f"team-{index % NAMESPACES}", f"workload-{index}"
    read_profile = functools.partial(
        custom.get_namespaced_custom_object,
        v.GROUP,
        v.VERSION,
        namespace,
        v.PROFILE_PLURAL,
        f"{workload}-profile",
    )

    async def now() -> tuple[int, str, Any]:
        profile, configmap = (
            await read_profile(),
            await core.read_namespaced_config_map(CONFIGMAP_NAME, "kratos-system"),
        )
        status = profile.get("status") or {}
        return (
            sum(o["runs"] for o in status.get("observations") or []),
            configmap.metadata.resource_version,
            status.get("calibratedShares"),
        )

    runs, configmap, shares = await now()
    name = f"scale-run-{index}-{int(time.time())}"
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "labels": {v.WORKLOAD_LABEL: workload},
        "annotations": {v.HINTS_ANNOTATION: json.dumps({"ranked": []})},
    }
    sign_block(meta, namespace=namespace, key=key)
    container = {
        "name": "main",
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "resources": {"limits": {v.GPU_RESOURCE: "1"}},
    }
    made = await batch.create_namespaced_job(
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {
                "suspend": True,
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": {v.WORKLOAD_LABEL: workload}},
                    "spec": {"restartPolicy": "Never", "containers": [container]},
                },
            },
        },
    )
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": name,
        "uid": made.metadata.uid,
        "controller": True,
    }
    await core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-0",
                "namespace": namespace,
                "labels": {"job-name": name, v.WORKLOAD_LABEL: workload},
                "ownerReferences": [owner],
            },
            "spec": {
                "nodeName": RUN_NODE,
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "containers": [container],
                "tolerations": [{"operator": "Exists"}],
            },
        },
    )
    ended = time.time()
    stamp = functools.partial(time.strftime, "%Y-%m-%dT%H:%M:%SZ")
    terminated = {
        "exitCode": 0,
        "reason": "Completed",
        "startedAt": stamp(time.gmtime(ended - RUN_SECONDS)),
        "finishedAt": stamp(time.gmtime(ended)),
    }
    merge = "application/merge-patch+json"
    await core.patch_namespaced_pod_status(
        f"{name}-0",
        namespace,
        {
            "status": {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": "main",
                        "ready": False,
                        "restartCount": 0,
                        "image": container["image"],
                        "imageID": "",
                        "state": {"terminated": terminated},
                    }
                ],
            }
        },
        _content_type=merge,
    )
    await batch.patch_namespaced_job_status(name, namespace, {"status": {
        "startTime": terminated["startedAt"], "completionTime": terminated["finishedAt"], "succeeded": 1,
        "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": terminated["finishedAt"]}]}},
        _content_type=merge)  # fmt: skip
    done = time.monotonic()
    seen: dict[str, float | None] = {"countedSeconds": None, "configMapSeconds": None, "sharesSeconds": None}
    while None in seen.values() and time.monotonic() - done < RUN_TIMEOUT:
        now_runs, now_configmap, now_shares = await now()
        for what, moved in (("countedSeconds", now_runs > runs), ("configMapSeconds", now_configmap != configmap),
                            ("sharesSeconds", now_shares != shares)):  # fmt: skip
            if moved and seen[what] is None:
                seen[what] = round(time.monotonic() - done, 2)
        await asyncio.sleep(0.1)
    return {"workload": f"{namespace}/{workload}", **seen}


RUN_TIMEOUT = 900.0  # a refit at 20,000 mature profiles is minutes of a core


async def main_async(args: argparse.Namespace) -> int:
    api = await api_client(args.kubeconfig)
    try:
        if args.command == "fill":
            await fill(
                api,
                nodes=args.nodes,
                profiles=args.profiles,
                pods=args.pods,
                jobs=args.jobs,
                shape=args.shape,
            )
        elif args.command == "empty":
            await empty(api)
        else:
            print(json.dumps(await measure(api, args)))
    finally:
        await api.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    sub = parser.add_subparsers(dest="command", required=True)
    filling = sub.add_parser("fill", help="create the Nodes, profiles, Pods and Jobs that are missing")
    filling.add_argument("--nodes", type=int, default=5000)
    filling.add_argument("--profiles", type=int, default=20000)
    filling.add_argument("--pods", type=int, default=0)
    filling.add_argument("--jobs", type=int, default=0)
    filling.add_argument(
        "--shape",
        choices=("issue59", "before"),
        default="issue59",
        help="profiles' countedRuns: the last write's run (issue 59's controller) or 256 uids (before it)",
    )
    sub.add_parser("empty", help="delete the fill's Nodes and its team-* namespaces")
    measuring = sub.add_parser("measure", help="start the webhook or the controller and sample it")
    measuring.add_argument("process", choices=("webhook", "controller"))
    measuring.add_argument("--settle", type=float, default=20.0, help="seconds after Ready before 'settled'")
    measuring.add_argument(
        "--rest", type=float, default=60.0, help="seconds the requests at rest are counted over"
    )
    measuring.add_argument("--timeout", type=float, default=600.0, help="give up if not Ready by then")
    measuring.add_argument(
        "--runs", type=int, default=0, help="the controller: runs finished, each timed to the calibration"
    )
    measuring.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter whose kratos_admit is measured (an older checkout's)",
    )
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
