"""The webhook's resident set with a large cluster in its caches, and what each cache costs.

    .venv/bin/python bench/memory_bench.py                       # 5,000 Nodes, 20,000 WorkloadProfiles
    .venv/bin/python bench/memory_bench.py --nodes 500 --profiles 2000
    .venv/bin/python bench/memory_bench.py --page-size 0 --whole-nodes   # as before issue 51's cuts

The caches are the webhook's own classes (``ClusterNodeStore``, ``ClusterProfileStore``, the engine's
``DecisionCache``) filled in process as their informers fill them on a relist: the list arrives as
JSON in pages of ``--page-size`` objects (the Informer's ``limit``; 0: the whole list at once), each
page parsed and folded into the cache before the next is made. Nodes are labelled by GPU Feature
Discovery and carry the status a kubelet reports (capacity, conditions, addresses, images), sent as
``PartialObjectMetadata`` (their metadata alone) as the Node store asks for them, or whole with
``--whole-nodes``; WorkloadProfiles are as the controller writes them, first just profiled (metrics,
time shares, GPU), then mature (observations on three products and the countedRuns list at its cap
of ``MAX_COUNTED_RUNS`` Pod uids). Each step gives the Python memory each cache holds after a full
collection (tracemalloc), the peak of a relist (a page as sent and parsed, and the cache) and the
growth of the resident set (``VmRSS``), which keeps what the allocator freed for reuse.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from admission_bench import make_engine, scenarios
from kubernetes_asyncio import client

from kratos_admit.admission.engine import AdmissionEngine, review
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import MAX_COUNTED_RUNS
from kratos_admit.edge.cluster import ClusterNodeStore, ClusterProfileStore
from kratos_admit.edge.kube import PAGE_SIZE, Fold

PRODUCTS = (
    ("NVIDIA-A100-SXM4-80GB", "81920", "8", "0"),
    ("NVIDIA-H100-80GB-HBM3", "81559", "9", "0"),
    ("NVIDIA-L40S", "46068", "8", "9"),
    ("NVIDIA-L4", "23034", "8", "9"),
)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def settled_rss() -> float:
    gc.collect()
    return rss_mib()


def node(index: int) -> dict[str, Any]:
    """A GPU Node as `kubectl get node -o json` shows one (managedFields left out, as watches send
    them too unless asked)."""
    product, memory, major, minor = PRODUCTS[index % len(PRODUCTS)]
    name = f"gpu-node-{index:05d}"
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "p4de.24xlarge", "topology.kubernetes.io/zone": f"zone-{index % 3}",
        "topology.kubernetes.io/region": "region-1", "feature.node.kubernetes.io/cpu-model.vendor_id": "AMD",
        "feature.node.kubernetes.io/kernel-version.full": "6.1.0-27-amd64",
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": memory,
        "nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor, "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.machine": "p4de.24xlarge", "nvidia.com/gpu.replicas": "1",
        "nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "127",
        "nvidia.com/cuda.driver.rev": "08", "nvidia.com/cuda.runtime.major": "12", "nvidia.com/cuda.runtime.minor": "4",
        "nvidia.com/gfd.timestamp": "1732700000", "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "single",
    }  # fmt: skip
    conditions = [
        {"type": kind, "status": "False" if kind != "Ready" else "True", "reason": f"Kubelet{kind}",
         "message": f"kubelet reports {kind}", "lastHeartbeatTime": "2026-11-27T10:00:00Z",
         "lastTransitionTime": "2026-11-20T10:00:00Z"}
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
    ]  # fmt: skip
    images = [
        {"names": [f"nvcr.io/nvidia/image-{i}@sha256:{(index * 31 + i):064x}", f"nvcr.io/nvidia/image-{i}:24.0{i}"],
         "sizeBytes": 1_000_000_000 + i}
        for i in range(10)
    ]  # fmt: skip
    capacity = {
        "cpu": "96",
        "memory": "1056939092Ki",
        "pods": "110",
        "nvidia.com/gpu": "8",
        "ephemeral-storage": "1000000000Ki",
    }
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"{index:08d}-0000-4000-8000-000000000000", "resourceVersion": str(10_000 + index),
                     "creationTimestamp": "2026-11-20T10:00:00Z", "labels": labels,
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"podCIDR": f"10.{index // 256 % 256}.{index % 256}.0/24", "providerID": f"aws:///zone/i-{index:017x}",
                 "taints": [{"key": v.GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"}]},
        "status": {"capacity": capacity, "allocatable": dict(capacity), "conditions": conditions,
                   "addresses": [{"type": "InternalIP", "address": f"10.0.{index // 256 % 256}.{index % 256}"},
                                 {"type": "Hostname", "address": name}],
                   "nodeInfo": {"machineID": f"{index:032x}", "systemUUID": f"{index:032x}", "bootID": f"{index:032x}",
                                "kernelVersion": "6.1.0-27-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                                "containerRuntimeVersion": "containerd://1.7.22", "kubeletVersion": "v1.31.2",
                                "kubeProxyVersion": "v1.31.2", "operatingSystem": "linux", "architecture": "amd64"},
                   "images": images},
    }  # fmt: skip


def profile(index: int, *, mature: bool) -> dict[str, Any]:
    """A WorkloadProfile as the controller writes it: just profiled, or mature (observed on three
    products, countedRuns at its cap)."""
    product = PRODUCTS[index % len(PRODUCTS)][0]
    status: dict[str, Any] = {
        "phase": "Ready", "boundType": "memory",
        "metrics": {"achievedOccupancy": "78.21", "smThroughput": "12.56", "memoryThroughput": "81.40",
                    "l2Throughput": "30.22", "dramThroughput": "80.95", "kernelCount": "3", "gpuTimeNs": "184320"},
        "timeShares": {"tensor": "0.02", "fp32": "0.11", "fp64": "0.00", "memory": "0.81", "latency": "0.06"},
        "gpu": {"product": product, "computeCapability": "9.0"},
        "profiledAt": "2026-11-22T10:00:00Z", "source": "nsight-compute", "sourceJob": f"workload-{index}",
        "message": "",
    }  # fmt: skip
    if mature:
        status["observations"] = [
            {"product": p, "runs": 40 + i, "meanSeconds": f"{100 + i}.5"}
            for i, (p, *_) in enumerate(PRODUCTS[:3])
        ]  # fmt: skip
        status["countedRuns"] = [
            f"{index:08x}-{run:04x}-4000-8000-{run:012x}" for run in range(MAX_COUNTED_RUNS)
        ]
        status["observedRuns"] = 123
    return {
        "apiVersion": "gpu.scheduler.io/v1alpha1", "kind": "WorkloadProfile",
        "metadata": {"name": f"workload-{index}-profile", "namespace": f"team-{index % 200}",
                     "uid": f"{index:08d}-1111-4000-8000-000000000000", "resourceVersion": str(50_000 + index),
                     "generation": 1, "creationTimestamp": "2026-11-22T09:00:00Z"},
        "spec": {"workload": f"workload-{index}"},
        "status": status,
    }  # fmt: skip


TRACING = [True]  # --no-trace: resident set only (tracemalloc's own records grow it by as much again)
PAGE = [PAGE_SIZE]  # --page-size: objects a list page (0: the whole list at once)
WHOLE_NODES = [False]  # --whole-nodes: Nodes sent whole, not as PartialObjectMetadata


def trace(start: bool) -> tuple[int, int]:
    """Start tracing, or stop it and give (held, peak) bytes; (0, 0) with --no-trace."""
    if not TRACING[0]:
        return 0, 0
    if start:
        tracemalloc.start()
        return 0, 0
    found = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return found


Row = tuple[str, float, float, float]
TOTAL = "the webhook's resident set"  # what, MiB held by it, MiB at the peak, resident set growth MiB


def step(name: str, build: Callable[[int], dict[str, Any]], count: int, fold: Fold, rows: list[Row]) -> None:
    """What a relist leaves held (traced by tracemalloc after a full collection, the listed objects
    dropped), its peak (a page as sent and as parsed, and the cache), and the growth of the resident
    set (which keeps what the allocator freed for reuse)."""
    before = settled_rss()
    trace(True)
    size = PAGE[0] or count
    fold.begin()
    for start in range(0, count, size):
        sent = json.dumps({"items": [build(i) for i in range(start, min(count, start + size))]}).encode()
        body = json.loads(sent)  # as list_raw reads a page: the bytes, then the parsed page
        del sent
        fold.page(body["items"])
        del body
    fold.end()
    gc.collect()
    held, peak = trace(False)
    rows.append((name, held / 2**20, peak / 2**20, settled_rss() - before))
    print(f"{name}: {rows[-1][1]:.1f} MiB held, peak {rows[-1][2]:.1f} MiB", file=sys.stderr)


def as_sent(obj: dict[str, Any]) -> dict[str, Any]:
    """A Node as the API server sends it to the Node store: its metadata alone, unless --whole-nodes."""
    if WHOLE_NODES[0]:
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def fill_decisions(count: int, rows: list[Row]) -> AdmissionEngine:
    """The decision cache full of distinct hinted Jobs."""
    key = b"kratos-benchmark-signing-key-0123456789abcdef"
    engine = make_engine(key, cache=count)
    review_doc = json.loads(scenarios(key)[0].body)
    bodies = []
    for index in range(count):
        review_doc["request"]["object"]["metadata"].setdefault("annotations", {})["team.example/build"] = str(
            index
        )
        bodies.append(json.dumps(review_doc).encode())
    before = settled_rss()
    trace(True)
    for body in bodies:
        review(body, webhook="mutate", engine=engine)
    del bodies
    gc.collect()
    held, peak = trace(False)
    assert len(engine.decisions) == count
    rows.append(
        (f"decision cache full ({count:,} hinted Jobs)", held / 2**20, peak / 2**20, settled_rss() - before)
    )
    return engine


async def measure(nodes: int, profiles: int, decisions: int) -> list[Row]:
    rows: list[Row] = []
    api = client.ApiClient()
    try:
        node_store = ClusterNodeStore(api)
        profile_store = ClusterProfileStore(api)
        step(f"{nodes:,} GPU Nodes (ClusterNodeStore)", lambda i: as_sent(node(i)), nodes, node_store, rows)
        assert len(node_store.gpu_products()) == len(PRODUCTS)
        step(f"{profiles:,} WorkloadProfiles just profiled (ClusterProfileStore)",
             lambda i: profile(i, mature=False), profiles, profile_store.informer.fold, rows)  # fmt: skip
        assert len(profile_store) == profiles
        rows.append(
            (f"{TOTAL}: {nodes:,} Nodes, {profiles:,} profiles just profiled", 0.0, 0.0, settled_rss())
        )
        profile_store.informer.fold.begin()
        profile_store.informer.fold.end()  # a relist that named none: the cache empty again
        assert len(profile_store) == 0
        step(f"{profiles:,} mature WorkloadProfiles ({MAX_COUNTED_RUNS} countedRuns each)",
             lambda i: profile(i, mature=True), profiles, profile_store.informer.fold, rows)  # fmt: skip
        assert len(profile_store) == profiles
        engine = fill_decisions(decisions, rows)
        rows.append(
            (
                f"{TOTAL}: {nodes:,} Nodes, {profiles:,} mature profiles, {len(engine.decisions):,} decisions",
                0.0,
                0.0,
                settled_rss(),
            )
        )
    finally:
        await api.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--profiles", type=int, default=20000)
    parser.add_argument(
        "--decisions", type=int, default=1024, help="decision cache entries (its default size)"
    )
    parser.add_argument("--no-trace", action="store_true", help="the resident set only, without tracemalloc")
    parser.add_argument(
        "--page-size", type=int, default=PAGE_SIZE, help="objects a list page (0: the whole list at once)"
    )
    parser.add_argument("--whole-nodes", action="store_true", help="Nodes sent whole, not as their metadata")
    args = parser.parse_args(argv)
    TRACING[0] = not args.no_trace
    PAGE[0], WHOLE_NODES[0] = args.page_size, args.whole_nodes
    start = settled_rss()
    rows = asyncio.run(measure(args.nodes, args.profiles, args.decisions))
    print("| what | held MiB | peak MiB (the relist) | resident set growth MiB |")
    print("|---|---|---|---|")
    print(f"| the webhook's modules loaded, caches empty (resident set) | | | {start:.1f} |")
    for name, held, peak, grown in rows:
        if name.startswith(TOTAL):
            print(f"| **{name}** | | | **{grown:.1f}** |")
            continue
        print(
            f"| {name} | {held:.1f} | {peak:.1f} | {grown:+.1f} |"
            if TRACING[0]
            else f"| {name} | | | {grown:+.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
