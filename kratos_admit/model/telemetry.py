"""DCGM telemetry into a profile, pure (DESIGN "Telemetry profiles"; docs/ranking.md says why).

dcgm-exporter's samples (labels and a value) -> the series of one Pod -> per GPU (a whole GPU, or
one MIG instance) the mean of each counter -> the mean over the Pod's GPUs -> ``smThroughput``,
``memoryThroughput`` and a bound type by the runner's speed-of-light rule, and the time shares of the
units (``tensor``, ``fp32``, ``fp64``, ``memory``, ``latency``) from the pipe counters and DRAM, and
for a run whose GPUs move data between them (``linked``) ``interconnect`` from the link counters
(``link_activity``). Also a reader of the Prometheus text exposition, for captures of ``/metrics``
and for tests.

Layer: decisions (no I/O; ``kratos_admit/prometheus.py`` asks Prometheus and hands samples here).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import TelemetryLabels
from kratos_admit.domain.profile import (
    MAX_COUNTED_RUNS,
    ProfileGpu,
    ProfileMetrics,
    ProfileStatus,
    TelemetryRecord,
    TimeShares,
)
from kratos_admit.model.catalog import Catalog
from kratos_admit.model.links import LINK_COUNTERS, LinkReading, link_activity

PREFIX: Final = "DCGM_FI_PROF_"
GR_ENGINE_ACTIVE: Final = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
PIPE_TENSOR_ACTIVE: Final = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DRAM_ACTIVE: Final = "DCGM_FI_PROF_DRAM_ACTIVE"
SM_ACTIVE: Final = "DCGM_FI_PROF_SM_ACTIVE"
SM_OCCUPANCY: Final = "DCGM_FI_PROF_SM_OCCUPANCY"
PIPE_FP16_ACTIVE: Final = "DCGM_FI_PROF_PIPE_FP16_ACTIVE"
PIPE_FP32_ACTIVE: Final = "DCGM_FI_PROF_PIPE_FP32_ACTIVE"
PIPE_FP64_ACTIVE: Final = "DCGM_FI_PROF_PIPE_FP64_ACTIVE"
# dcgm-exporter's default counters CSV (the GPU Operator's), and what the extended set adds
DEFAULT_COUNTERS: Final = (GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE)
EXTENDED_COUNTERS: Final = (SM_ACTIVE, SM_OCCUPANCY, PIPE_FP16_ACTIVE, PIPE_FP32_ACTIVE, PIPE_FP64_ACTIVE)
COUNTERS: Final = DEFAULT_COUNTERS + EXTENDED_COUNTERS
# each the share of cycles one kind of arithmetic pipe was busy: compute throughput as a share of peak
PIPE_COUNTERS: Final = (PIPE_TENSOR_ACTIVE, PIPE_FP16_ACTIVE, PIPE_FP32_ACTIVE, PIPE_FP64_ACTIVE)
# a device field every GPU row has in every dcgm-exporter counters file, profiling or not: a GPU of
# the Pod that has this but no profiling counter is a GPU without them (consumer boards, some MIG)
PRESENCE: Final = "DCGM_FI_DEV_GPU_UTIL"
QUERIED: Final = (*COUNTERS, *LINK_COUNTERS, PRESENCE)

# the runner's speed-of-light rule (runner/kratos_runner/summary.py, Nsight Compute's SOLBottleneck)
SOL_THRESHOLD: Final = 60.0
SOL_GAP: Final = 10.0
# The activity, as a share of peak over elapsed cycles, that a kernel bound by each unit holds its unit
# at: a unit saturates well below 1. Nsight Compute on an H100 80GB HBM3 read the tensor pipe at 94 %
# in a bf16 GEMM, the FMA pipe at 84 % in an FP32 FMA loop and 78 % in an FP32 GEMM, DRAM at 82 % in a
# STREAM triad and an fp16 GEMV; DCGM's pipe counters are the same ratio (of the peak sustained
# elapsed cycles), and DRAM_ACTIVE its DRAM figure. FP64 on the CUDA cores is taken as the FMA pipe.
# A link: NCCL's all-reduce on an H100 SXM moved 749 of the 900 GB/s its NVLink has both ways
# (NVIDIA/nccl#1264); no PCIe figure was found, so PCIe is read the same.
SATURATION: Final[Mapping[v.Unit, float]] = {
    "tensor": 0.9,
    "fp32": 0.8,
    "fp64": 0.8,
    "memory": 0.8,
    "interconnect": 0.83,
}
# the counters that show each unit's activity (``unit_activity``)
UNIT_COUNTERS: Final[Mapping[v.Unit, tuple[str, ...]]] = {
    "tensor": (PIPE_TENSOR_ACTIVE,),
    "fp32": (PIPE_FP32_ACTIVE, PIPE_FP16_ACTIVE),
    "fp64": (PIPE_FP64_ACTIVE,),
    "memory": (DRAM_ACTIVE,),
}


@dataclass(frozen=True)
class Sample:
    """One series' value: a line of ``/metrics``, or one element of a Prometheus vector answer."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Exposition:
    samples: tuple[Sample, ...]
    skipped: tuple[str, ...] = ()  # "line N: why", for each sample line that could not be read


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _samples_of(text: str) -> list[Sample]:
    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def parse_exposition(text: str) -> Exposition:
    """Every sample of a Prometheus text exposition, read by prometheus-client's parser.

    That parser stops at the first value it cannot read (dcgm-exporter has printed
    ``ERROR - FAILED TO CONVERT TO STRING`` as a value), losing the whole scrape. Prometheus itself
    rejects such a scrape too; a capture is evidence, so here the text is read again one line at a
    time with the same parser, and each unreadable line is skipped and reported by number."""
    try:
        return Exposition(tuple(_samples_of(text)))
    except ValueError:
        pass
    samples: list[Sample] = []
    skipped: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            samples += _samples_of(line + "\n")
        except (ValueError, IndexError) as exc:
            found = _NAME.match(line)
            name = found.group(0) if found else line[:40]
            skipped.append(f"line {number}: {name}: {exc}")
    return Exposition(tuple(samples), tuple(skipped))


def _first(labels: Mapping[str, str], names: Iterable[str]) -> str:
    return next((labels[n] for n in names if labels.get(n)), "")


def of_pod(sample: Sample, *, namespace: str, pod: str, labels: TelemetryLabels) -> bool:
    """The sample is of this Pod under one of the configured (namespace, pod) label pairs."""
    return any(
        sample.labels.get(ns_label) == namespace and sample.labels.get(pod_label) == pod
        for ns_label, pod_label in labels.pod_pairs()
    )


def pod_samples(
    samples: Iterable[Sample], *, namespace: str, pod: str, labels: TelemetryLabels
) -> list[Sample]:
    return [s for s in samples if of_pod(s, namespace=namespace, pod=pod, labels=labels)]


def gpu_key(sample: Sample, labels: TelemetryLabels) -> str:
    """One GPU: its UUID (else its index), and for a MIG instance also the instance id, so the
    instances of one GPU are apart and the whole GPU's row is not one of them."""
    device = _first(sample.labels, labels.uuid) or _first(sample.labels, labels.gpu)
    instance = _first(sample.labels, labels.gpu_instance_id)
    return f"{device}/{instance}" if instance else device


def product_of(samples: Iterable[Sample], labels: TelemetryLabels) -> str:
    """GPU Feature Discovery's spelling of the GPU model dcgm-exporter names (``modelName``):
    ``NVIDIA A100-SXM4-80GB`` -> ``NVIDIA-A100-SXM4-80GB``; "" when no sample names one."""
    for sample in samples:
        model = _first(sample.labels, labels.model_name)
        if model:
            return "-".join(model.split())
    return ""


def _promql_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def pod_query(name: str, *, namespace: str, pod: str, seconds: float, labels: TelemetryLabels) -> str:
    """PromQL for one counter of one Pod, averaged over the last ``seconds`` (whole, at least 60:
    Prometheus needs a range of some scrapes): one ``avg_over_time`` per (namespace, pod) label
    pair, joined by ``or`` (series renamed by a ServiceMonitor scrape carry the ``exported_`` pair)."""
    window = max(60, math.ceil(seconds))
    return " or ".join(
        f"avg_over_time({name}{{{ns_label}={_promql_string(namespace)},{pod_label}={_promql_string(pod)}}}[{window}s])"
        for ns_label, pod_label in labels.pod_pairs()
    )


@dataclass(frozen=True)
class PodTelemetry:
    """What one Pod's series say: per counter the mean over the Pod's GPUs of each GPU's mean (a link
    counter's in bytes or MB per second, the others' ratios)."""

    counters: dict[str, float]
    gpus: tuple[str, ...]  # every GPU (or MIG instance) the Pod's series name
    missing: tuple[str, ...]  # default counters some GPU of the Pod lacks
    lacking: tuple[str, ...] = ()  # those GPUs, as a person finds them (``describe_gpu``)


def describe_gpu(sample: Sample, labels: TelemetryLabels) -> str:
    """A GPU as a person finds it: its UUID (else index), MIG instance and profile, host, container."""
    parts = [_first(sample.labels, labels.uuid) or f"gpu {_first(sample.labels, labels.gpu)}"]
    instance = _first(sample.labels, labels.gpu_instance_id)
    if instance:
        profile = _first(sample.labels, labels.gpu_instance_profile)
        parts.append(f"MIG instance {instance}" + (f" ({profile})" if profile else ""))
    host = _first(sample.labels, labels.hostname)
    if host:
        parts.append(f"on {host}")
    container = _first(sample.labels, labels.container)
    if container:
        parts.append(f"container {container}")
    return " ".join(parts)


def per_gpu(samples: Iterable[Sample], labels: TelemetryLabels) -> dict[str, dict[str, float]]:
    """Each GPU's mean of each counter (several series of one GPU: a container each, or a Pod seen
    under both label spellings), finite ratios only; the presence marker is kept as a GPU."""
    values: dict[str, dict[str, list[float]]] = {}
    for sample in samples:
        if sample.name not in QUERIED or not math.isfinite(sample.value):
            continue
        values.setdefault(gpu_key(sample, labels), {}).setdefault(sample.name, []).append(sample.value)
    return {
        gpu: {name: sum(found) / len(found) for name, found in counters.items() if name != PRESENCE}
        for gpu, counters in values.items()
    }


def pod_telemetry(samples: Iterable[Sample], labels: TelemetryLabels) -> PodTelemetry:
    """The Pod's counters from its series (already selected: ``pod_samples``)."""
    samples = list(samples)
    gpus = per_gpu(samples, labels)
    counters: dict[str, float] = {}
    for name in (*COUNTERS, *LINK_COUNTERS):
        found = [c[name] for c in gpus.values() if name in c]
        if found:
            counters[name] = sum(found) / len(found)
    missing = tuple(name for name in DEFAULT_COUNTERS if any(name not in c for c in gpus.values()))
    described = {gpu_key(s, labels): describe_gpu(s, labels) for s in samples}
    lacking = tuple(
        described[gpu] for gpu in sorted(gpus) if any(name not in gpus[gpu] for name in DEFAULT_COUNTERS)
    )
    return PodTelemetry(counters, tuple(sorted(gpus)), missing, lacking)


@dataclass(frozen=True)
class Derived:
    """A profile's figures from counters: percent of peak, the bound type and the time shares
    (docs/ranking.md)."""

    bound_type: v.BoundType
    sm_throughput: float | None = None
    memory_throughput: float | None = None
    achieved_occupancy: float | None = None
    used: tuple[str, ...] = ()  # the counters the figures come from
    reason: str = ""  # why the bound type is unknown
    metrics: dict[str, str] = field(default_factory=dict)
    time_shares: TimeShares | None = None  # None where the bound type is unknown


def _percent(value: float) -> str:
    return f"{min(max(value, 0.0), 1.0) * 100:.2f}"


def derive(counters: Mapping[str, float], interconnect: float | None = None) -> Derived:
    """``smThroughput`` = the busiest arithmetic pipe present, ``memoryThroughput`` = DRAM_ACTIVE,
    both as percent of peak; then the speed-of-light rule. SM_ACTIVE and GR_ENGINE_ACTIVE say how
    much of the time work was resident, not how much of the peak it reached: they never count as
    throughput. With only the default counters, a run whose graphics engine was busy but whose
    tensor pipe and DRAM were not may be CUDA-core compute as much as latency: that is ``unknown``.
    ``interconnect`` is the links' activity (``link_activity``) of a run whose GPUs moved data between
    them: it takes its share of the time as the units do; None leaves the interconnect unmeasured."""
    pipes = [name for name in PIPE_COUNTERS if name in counters]
    metrics: dict[str, str] = {}
    used: list[str] = []
    sm = mem = occupancy = None
    if pipes:
        busiest = max(pipes, key=lambda name: counters[name])
        sm = min(max(counters[busiest], 0.0), 1.0) * 100
        metrics["smThroughput"] = _percent(counters[busiest])
        used += pipes
    if DRAM_ACTIVE in counters:
        mem = min(max(counters[DRAM_ACTIVE], 0.0), 1.0) * 100
        metrics["memoryThroughput"] = metrics["dramThroughput"] = _percent(counters[DRAM_ACTIVE])
        used.append(DRAM_ACTIVE)
    if SM_OCCUPANCY in counters and counters.get(SM_ACTIVE, 0.0) > 0:
        # DCGM's occupancy is over all SMs and all the time; Nsight Compute's over active SMs
        occupancy = min(counters[SM_OCCUPANCY] / counters[SM_ACTIVE], 1.0) * 100
        metrics["achievedOccupancy"] = f"{occupancy:.2f}"
        used += [SM_OCCUPANCY, SM_ACTIVE]

    def made(bound: v.BoundType, reason: str = "", also: tuple[str, ...] = ()) -> Derived:
        activity = unit_activity(counters)
        if interconnect is not None:
            activity["interconnect"] = min(max(interconnect, 0.0), 1.0)
        shares = None if bound == "unknown" else time_shares(activity)
        return Derived(bound, sm, mem, occupancy, (*used, *also), reason, metrics, shares)

    if sm is None or mem is None:
        absent = " and ".join(
            what
            for what, value in (("a pipe counter (PIPE_*_ACTIVE)", sm), ("DRAM_ACTIVE", mem))
            if value is None
        )
        return made("unknown", f"no {absent}")
    if sm < SOL_THRESHOLD and mem < SOL_THRESHOLD:
        cuda_cores_unseen = PIPE_FP32_ACTIVE not in counters and PIPE_FP64_ACTIVE not in counters
        engine = counters.get(GR_ENGINE_ACTIVE)
        if cuda_cores_unseen and engine is not None and engine * 100 >= SOL_THRESHOLD:
            return made(
                "unknown",
                f"the GPU was busy {engine * 100:.0f} % of the time with tensor pipe and DRAM below "
                f"{SOL_THRESHOLD:.0f} %: CUDA-core (FP32/FP64) compute or latency, which only the "
                "extended counters (PIPE_FP32/FP64_ACTIVE) tell apart",
                (GR_ENGINE_ACTIVE,),
            )
        return made("latency")
    if abs(sm - mem) >= SOL_GAP:
        return made("compute" if sm > mem else "memory")
    return made("balanced")


def unit_activity(counters: Mapping[str, float]) -> dict[v.Unit, float]:
    """Each unit's activity over the run, from the counters present: ``tensor`` PIPE_TENSOR_ACTIVE
    (all tensor-core work: DCGM counts FP64 matrix work on A100/H100-class tensor cores there too),
    ``fp64`` PIPE_FP64_ACTIVE (FP64 on the CUDA cores), ``fp32`` the busier of PIPE_FP32_ACTIVE and
    PIPE_FP16_ACTIVE (FP16 off the tensor cores runs on the same CUDA cores), ``memory`` DRAM_ACTIVE.
    A unit whose counters are absent is left out: it was not seen, not idle."""
    found: dict[v.Unit, float] = {}
    for unit, names in UNIT_COUNTERS.items():
        values = [counters[name] for name in names if name in counters]
        if values:
            found[unit] = min(max(*values, 0.0), 1.0)
    return found


def time_shares(activity: Mapping[v.Unit, float]) -> TimeShares | None:
    """Where the run's time went, from each unit's run-averaged activity (docs/ranking.md, "Time
    shares from counters"). A unit busy for a share ``s`` of the run at its saturation ``c`` averages
    ``s * c``, so ``activity / c`` (at most 1) is the share of the run it bound if it bound it alone.
    Units that add up to more than the whole run were busy at the same time: the time they shared
    goes to the busiest, as a kernel's time goes to its busiest unit, so each unit in turn, busiest
    first, takes its share of the time still unclaimed. The interconnect comes after them all: a
    collective that ran while a unit computed was hidden behind it (as DDP overlaps its all-reduce
    with the backward pass), so its share is the time its links were busy that no unit claimed, the
    communication the step waited for. What no one claims is ``latency`` (small or dependent kernels,
    and time the GPU sat idle). So the units' shares are those a run without link counters gets, and
    on one GPU, where no link scales it, the interconnect's time ranks as the latency it was before.
    None with no unit seen."""
    if not activity:
        return None
    busy = {unit: min(value / SATURATION[unit], 1.0) for unit, value in activity.items()}
    left = 1.0
    claimed: dict[v.Unit, float] = {}
    for unit in sorted(busy, key=lambda u: (u == "interconnect", -busy[u], v.UNITS.index(u))):
        claimed[unit] = min(busy[unit], left)
        left -= claimed[unit]
    claimed["latency"] = max(left, 0.0)
    return TimeShares.model_validate(_hundredths(claimed))


def _hundredths(fractions: Mapping[v.Unit, float]) -> dict[str, str]:
    """Fractions as strings with two decimals summing to exactly 1.00, as the runner writes them (the
    hundredths lost to rounding down go to the units that lost the most, the first unit of equals
    first). Rounded to 1e-9 first, so that float noise never decides between equal remainders. The
    interconnect only where it was measured (it has an entry)."""
    units = [u for u in v.UNITS if u != "interconnect" or u in fractions]
    exact = {unit: round(100.0 * fractions.get(unit, 0.0), 9) for unit in units}
    whole = {unit: math.floor(value) for unit, value in exact.items()}
    lost = sorted(units, key=lambda u: (-round(exact[u] - whole[u], 9), units.index(u)))
    for unit in lost[: max(100 - sum(whole.values()), 0)]:
        whole[unit] += 1
    return {unit: f"{whole[unit] / 100:.2f}" for unit in units}


# --- folding a run into the WorkloadProfile's status -------------------------------------------------


@dataclass(frozen=True)
class TelemetryRun:
    """One Pod's run as Prometheus saw it: its counters' means over ``seconds`` on ``gpus`` GPUs."""

    uid: str  # the Pod's uid: counted once
    product: str
    seconds: float
    gpus: int
    counters: Mapping[str, float]
    # its GPUs move data between them (more than one GPU, or a Pod of a gang): only then do its link
    # counters say anything of the workload's interconnect, and are folded in
    linked: bool = False
    # the GPUs its gang runs on together (above 1): a gang of another size moves its data over another
    # link, so its counters fold into a record of their own
    gang_gpus: int | None = None


def ratio(value: float) -> str:
    """A counter as the status stores it: ``0.71``, ``0.0047``, ``0``; a link's rate (bytes or MB
    per second) to four significant digits, ``1.234e+11``."""
    return f"{round(value, 4):g}" if abs(value) < 1000 else f"{value:.4g}"


def derive_record(record: TelemetryRecord, catalog: Catalog | None) -> tuple[Derived, LinkReading]:
    """``derive`` of a product's folded counters, with its links' activity where they were folded."""
    counters = {name: float(value) for name, value in record.counters.items()}
    entry = catalog.placement(record.product) if catalog is not None else None
    links = link_activity(counters, entry)
    return derive(counters, links.activity), links


def folded(records: Iterable[TelemetryRecord], run: TelemetryRun) -> list[TelemetryRecord]:
    """``records`` with ``run`` folded into its product's (of its gang's size): runs + 1, GPU-seconds
    added, and each counter's mean weighted by GPU-seconds. A counter the run lacks keeps its mean;
    one only the run has starts from it."""
    weight = run.seconds * max(run.gpus, 1)
    by_key = {(r.product, r.gang_gpus): r for r in records}
    seen = by_key.get((run.product, run.gang_gpus))
    before = float(seen.seconds) if seen else 0.0
    counters = dict(seen.counters) if seen else {}
    for name, value in run.counters.items():
        if name in LINK_COUNTERS and not run.linked:
            continue
        old = counters.get(name)
        mean = value if old is None else (float(old) * before + value * weight) / (before + weight)
        counters[name] = ratio(mean)
    by_key[(run.product, run.gang_gpus)] = TelemetryRecord(
        product=run.product,
        runs=(seen.runs if seen else 0) + 1,
        seconds=f"{before + weight:.0f}",
        counters=dict(sorted(counters.items())),
        gangGPUs=run.gang_gpus,
    )
    return sorted(by_key.values(), key=lambda r: (r.product, r.gang_gpus or 1))


def nsight_compute_figures(status: ProfileStatus) -> bool:
    """The bound type and metrics come from Nsight Compute (or a run of it is under way): they
    keep precedence, telemetry only adds ``status.telemetry``."""
    if status.phase == "Profiling":
        return True
    return status.phase == "Ready" and status.source != "telemetry"


def measuring_product(seconds: Mapping[str, float], known: Callable[[str], bool] | None = None) -> str:
    """The product a telemetry profile is read as measured on, of those with GPU-seconds: one whose
    figures are known (``known``: measured ground, DESIGN "Learning the cluster's GPUs") before any
    other, then the most GPU-seconds. So a profile first measured on a product whose catalog figure
    is wrong moves to known ground as soon as a run there is counted (issue 52)."""
    return max(seconds, key=lambda p: (known(p) if known is not None else False, seconds[p], p))


def with_telemetry(
    status: ProfileStatus | None,
    run: TelemetryRun,
    *,
    now: str,
    known: Callable[[str], bool] | None = None,
    catalog: Catalog | None = None,
) -> ProfileStatus | None:
    """The profile's status with ``run`` folded in (None when that Pod was counted already). With
    no Nsight Compute figures, the profile is Ready from telemetry: the product ``measuring_product``
    picks gives ``gpu.product`` and, by ``derive``, the bound type and metrics; the interconnect's
    share where its link counters were folded and ``catalog`` has that product's link figures."""
    if status is not None and run.uid in status.counted_telemetry:
        return None
    current = status or ProfileStatus(phase="Ready", source="telemetry")
    records = folded(current.telemetry, run)
    counted = [*current.counted_telemetry, run.uid][-MAX_COUNTED_RUNS:]
    update: dict[str, object] = {"telemetry": records, "counted_telemetry": counted}
    if not nsight_compute_figures(current):
        seconds: dict[str, float] = {}
        for r in records:
            seconds[r.product] = seconds.get(r.product, 0.0) + float(r.seconds)
        best_product = measuring_product(seconds, known)
        # of that product's records (one per gang size), the one with the most GPU-seconds
        best = max((r for r in records if r.product == best_product), key=lambda r: float(r.seconds))
        derived, _ = derive_record(best, catalog)
        runs = sum(r.runs for r in records)
        note = f"from DCGM telemetry of {runs} run(s), {best.seconds} GPU-seconds on {best.product}"
        update |= {
            "phase": "Ready",
            "source": "telemetry",
            "bound_type": derived.bound_type,
            "metrics": ProfileMetrics.model_validate(derived.metrics),
            "time_shares": derived.time_shares,
            "gpu": ProfileGpu(product=best.product, gangGPUs=best.gang_gpus),
            "profiled_at": now,
            "source_job": None,
            "message": f"{note}: {derived.reason}" if derived.reason else note,
        }
        if current.phase == "Failed":  # why profiling failed stays: the Failed condition turns False
            update["conditions"] = [
                c.model_copy(
                    update={
                        "status": "False",
                        "last_transition_time": now,
                        "message": f"{c.message}; Ready from DCGM telemetry since {now}",
                    }
                )
                if c.type == "Failed" and c.status == "True"
                else c
                for c in current.conditions or []
            ]
    return current.model_copy(update=update)
