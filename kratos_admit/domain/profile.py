"""The WorkloadProfile custom resource (DESIGN "WorkloadProfile"): our own type, so extra keys are refused."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kratos_admit.domain import vocabulary as v

Phase = Literal["Profiling", "Ready", "Failed"]
Source = Literal["nsight-compute", "telemetry"]  # what the bound type and metrics come from


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ObjectMeta(BaseModel):
    """Kubernetes metadata is not ours: unknown fields (uid, managedFields, ...) are kept, not refused."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str
    namespace: str = "default"
    resource_version: str = Field(default="", alias="resourceVersion")


class ProfileSpec(_Strict):
    workload: str = Field(pattern=v.DNS1123_LABEL.pattern, max_length=v.DNS1123_LABEL_MAX)
    runtime_class_name: str | None = Field(default=None, alias="runtimeClassName")


class ProfileMetrics(_Strict):
    """Strings, as the CRD stores them; percent of peak unless the name says otherwise."""

    achieved_occupancy: str | None = Field(default=None, alias="achievedOccupancy")
    sm_throughput: str | None = Field(default=None, alias="smThroughput")
    memory_throughput: str | None = Field(default=None, alias="memoryThroughput")
    l2_throughput: str | None = Field(default=None, alias="l2Throughput")
    dram_throughput: str | None = Field(default=None, alias="dramThroughput")
    kernel_count: str | None = Field(default=None, alias="kernelCount")
    gpu_time_ns: str | None = Field(default=None, alias="gpuTimeNs")

    def percent(self, name: str) -> float | None:
        raw = getattr(self, name)
        try:
            return None if raw is None else float(raw)
        except ValueError:
            return None


class TimeShares(_Strict):
    """Where the workload's GPU time goes, by the unit that binds each kernel (DESIGN "The unit that
    does the work"): fractions as strings, summing to 1, weighted by each kernel's GPU time."""

    tensor: str = "0.00"
    fp32: str = "0.00"
    fp64: str = "0.00"
    memory: str = "0.00"
    # None: not measured (Nsight Compute never measures it; telemetry without the link counters).
    # Never read as 0: a gang's time on its links, unmeasured, is in none of the other shares either.
    interconnect: str | None = None
    latency: str = "0.00"

    def fractions(self) -> dict[v.Unit, float] | None:
        """The shares as floats, or None when one is not a number, negative, or they sum to nothing.
        An unmeasured interconnect has no entry."""
        found: dict[v.Unit, float] = {}
        for unit in v.UNITS:
            raw = getattr(self, unit)
            if raw is None:
                continue
            try:
                value = float(raw)
            except ValueError:
                return None
            if not value >= 0:  # also refuses NaN
                return None
            found[unit] = value
        total = sum(found.values())
        if total <= 0:
            return None
        return {unit: value / total for unit, value in found.items()}


class ProfileGpu(_Strict):
    product: str | None = None
    compute_capability: str | None = Field(default=None, alias="computeCapability")
    # the GPUs a gang's measured runs held together (its hints record's ``gangGPUs``), which set the
    # link its interconnect share was measured over; absent for a run on one GPU or before it was kept
    gang_gpus: int | None = Field(default=None, alias="gangGPUs", ge=1)


class Observation(_Strict):
    """What the workload really took on one GPU product: successful runs, Pod start to finish."""

    product: str
    runs: int = Field(ge=0)
    mean_seconds: str = Field(alias="meanSeconds")
    # the GPUs each run's gang held together (its hints record's): a gang of another size is another
    # entry, since its time and its link differ; absent for runs on one GPU or of no gang
    gang_gpus: int | None = Field(default=None, alias="gangGPUs", ge=1)


class RunnerSummary(BaseModel):
    """What the profiling-runner writes to its termination log (runner/kratos_runner/summary.py, which
    is stdlib-only and so cannot share this model; a test keeps the two in step). Extra keys the
    runner may add are kept."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    bound_type: v.BoundType = Field(alias="boundType")
    metrics: dict[str, str | int | float] = Field(default_factory=dict)
    gpu: dict[str, str | int | float] = Field(default_factory=dict)
    kernels: int = 0
    kernels_skipped: int = Field(default=0, alias="kernelsSkipped")
    killed: bool = False
    exit_code: int = Field(default=0, alias="exitCode")
    ncu_version: str = Field(default="", alias="ncuVersion")
    ncu_set: str = Field(default="", alias="ncuSet")  # the section set the runner asked ncu for
    reason: str = ""
    # {tensor, fp32, fp64, memory, latency} -> fraction as a string; empty from an older runner
    time_shares: dict[str, str] = Field(default_factory=dict, alias="timeShares")
    # the share of the steady state's GPU time the profiled kernels cover ("0.93"); "" for a profile
    # of the first launches (runner/kratos_runner/steady.py)
    coverage: str = ""
    failure: str = ""  # why nothing was profiled (runner/kratos_runner/failures.py), "" on success


class TelemetryRecord(_Strict):
    """DCGM profiling counters averaged over a workload's runs on one GPU product."""

    product: str
    runs: int = Field(ge=0)
    seconds: str  # GPU-seconds the averages cover, the weight of the next fold
    counters: dict[str, str] = Field(default_factory=dict)  # DCGM_FI_PROF_* -> ratio 0..1
    # the GPUs each run's gang held together, which set the link its link counters measured: a gang
    # of another size is another record; absent for runs of no gang
    gang_gpus: int | None = Field(default=None, alias="gangGPUs", ge=1)


MAX_COUNTED_RUNS = 256  # the Pod uids the observations remember, so no run is counted twice

# What the controller keeps in a profile's status for its own bookkeeping and no decision reads: the
# Pod uids counted into its observations and telemetry (up to MAX_COUNTED_RUNS each), three quarters
# of a mature profile (docs/benchmarks.md, "Memory").
BOOKKEEPING = frozenset({"countedRuns", "countedTelemetry"})
# What a decision reads of a profile's metadata: where it is, and its resourceVersion (the hints
# record's ``profile`` reference). The API server's managedFields (an entry per writer naming every
# field it wrote), uid, labels and the rest are read by none.
READ_METADATA = ("name", "namespace", "resourceVersion")


def as_read(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """A profile object as the decisions read it (the webhook's cache, the calibration's fit): without
    the controller's bookkeeping and with only the metadata they read. The object itself when it has
    nothing to leave out; never a changed copy of what the caller holds."""
    status, meta = obj.get("status"), obj.get("metadata")
    if isinstance(status, Mapping) and not BOOKKEEPING.isdisjoint(status):
        obj = {**obj, "status": {k: val for k, val in status.items() if k not in BOOKKEEPING}}
    if isinstance(meta, Mapping) and not meta.keys() <= set(READ_METADATA):
        obj = {**obj, "metadata": {k: meta[k] for k in READ_METADATA if k in meta}}
    return obj


class ProfileCondition(_Strict):
    """A condition as Kubernetes writes them (metav1.Condition's fields). The one KRATOS writes is
    ``Failed``: True while the profile is Failed, False (reason and message kept) once telemetry made
    it Ready, so why its profiling failed stays on the profile."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str  # CamelCase, e.g. CountersInUse
    message: str = ""
    last_transition_time: str = Field(alias="lastTransitionTime")


# the runner's failure classes (runner/kratos_runner/failures.py; a test keeps the two in step)
RUNNER_FAILURE_CLASSES: tuple[str, ...] = (
    "no-gpu", "counter-permission", "counters-in-use", "out-of-memory", "cannot-start", "no-kernels", "ncu-error",
)  # fmt: skip
# the classes the controller names from the kubelet's statuses (DESIGN "Faults a real node brings")
KUBELET_FAILURE_CLASSES: tuple[str, ...] = ("image-pull", "killed")
FAILURE_CLASSES: tuple[str, ...] = RUNNER_FAILURE_CLASSES + KUBELET_FAILURE_CLASSES
# the classes where the counters were out of reach, not the workload at fault: telemetry still learns
COUNTERS_UNAVAILABLE: frozenset[str] = frozenset({"no-gpu", "counter-permission", "counters-in-use"})


def condition_reason(failure: str | None) -> str:
    """A failure class as a condition reason: ``counters-in-use`` -> ``CountersInUse``."""
    if not failure:
        return "ProfilingFailed"
    return "".join(part.capitalize() for part in failure.split("-"))


def failed_fields(failure: str | None, message: str, at: str) -> dict[str, Any]:
    """A Failed profile's ``message``, ``failure`` (a runner class, else none) and its ``Failed``
    condition, as the CRD stores them."""
    known = failure if failure in FAILURE_CLASSES else None
    condition = {"type": "Failed", "status": "True", "reason": condition_reason(known), "message": message,
                 "lastTransitionTime": at}  # fmt: skip
    return {"message": message, "failure": known, "conditions": [condition]}


class ProfileStatus(_Strict):
    phase: Phase
    bound_type: v.BoundType = Field(default="unknown", alias="boundType")
    metrics: ProfileMetrics = Field(default_factory=ProfileMetrics)
    # absent on profiles from before the units model: the ranking then reads smThroughput/memoryThroughput
    time_shares: TimeShares | None = Field(default=None, alias="timeShares")
    gpu: ProfileGpu = Field(default_factory=ProfileGpu)
    profiled_at: str | None = Field(default=None, alias="profiledAt")
    source: Source | None = None  # absent on profiles from before telemetry: nsight-compute
    source_job: str | None = Field(default=None, alias="sourceJob")
    message: str = ""
    observations: list[Observation] = Field(default_factory=list)
    # the last MAX_COUNTED_RUNS runs counted into observations (Pod uids): a replayed event or a
    # restarted controller never counts a run twice
    counted_runs: list[str] = Field(default_factory=list, alias="countedRuns")
    observed_runs: int = Field(default=0, ge=0, alias="observedRuns")  # for kubectl get -o wide
    telemetry: list[TelemetryRecord] = Field(default_factory=list)
    # the last MAX_COUNTED_RUNS Pods whose telemetry was folded in, as countedRuns for observations
    counted_telemetry: list[str] = Field(default_factory=list, alias="countedTelemetry")
    # why the Nsight Compute profiling failed (the runner's class), kept once telemetry makes it Ready
    failure: str | None = None
    conditions: list[ProfileCondition] | None = None
    # its shares re-fitted by the calibration from its runs on two or more products (issue 59: they
    # were in calibration.json's ``workloads``, which outgrew its ConfigMap); written by the
    # calibration controller alone, read as model/calibration.py ``profile_shares`` reads it
    calibrated_shares: dict[str, Any] | None = Field(default=None, alias="calibratedShares")

    @property
    def measured_links(self) -> bool:
        """Its time shares measured a gang's links (an ``interconnect`` share above 0): its runs then
        count by gang size, each size having moved its data over the link that size gets."""
        share = self.time_shares.interconnect if self.time_shares is not None else None
        return share is not None and float(share) > 0

    def as_status(self) -> dict[str, Any]:
        """The status as the CRD stores it: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True)


_METRIC_KEYS = frozenset(
    ProfileMetrics.model_fields[name].alias or name for name in ProfileMetrics.model_fields
)


def ready_status(summary: RunnerSummary, *, profiled_at: str, source_job: str) -> ProfileStatus:
    """The Ready status the controller writes from a runner summary that names a bound type (the
    controller's profile_status, and ``kratos-admit placement --summary`` ranking one as it would):
    its metrics, time shares and GPU, and a message when the workload exited non-zero."""
    message = (
        f"the workload exited {summary.exit_code} under profiling"
        if summary.exit_code and not summary.killed
        else ""
    )
    gpu = {k: str(val) for k, val in summary.gpu.items() if k in ("product", "computeCapability")}
    shares = {u: str(summary.time_shares[u]) for u in v.UNITS if u in summary.time_shares}
    return ProfileStatus.model_validate(
        {
            "phase": "Ready",
            "boundType": summary.bound_type,
            "metrics": ProfileMetrics.model_validate(
                {k: str(val) for k, val in summary.metrics.items() if k in _METRIC_KEYS}
            ),
            "timeShares": TimeShares.model_validate(shares) if shares else None,
            "gpu": ProfileGpu.model_validate(gpu),
            "profiledAt": profiled_at,
            "sourceJob": source_job,
            "source": "nsight-compute",
            "message": message,
        }
    )


class WorkloadProfile(_Strict):
    api_version: Literal["gpu.scheduler.io/v1alpha1"] = Field(
        default="gpu.scheduler.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["WorkloadProfile"] = "WorkloadProfile"
    metadata: ObjectMeta
    spec: ProfileSpec
    status: ProfileStatus | None = None

    @property
    def ready(self) -> bool:
        return self.status is not None and self.status.phase == "Ready"

    @property
    def reference(self) -> str:
        """The value of the ``gpu.scheduler.io/profile`` annotation: ``<name>@<resourceVersion>``."""
        return f"{self.metadata.name}@{self.metadata.resource_version or '0'}"


def with_runs(
    status: ProfileStatus, runs: Iterable[tuple[str, str, float]], *, gang_gpus: int | None = None
) -> ProfileStatus | None:
    """``status`` with the runs ``(uid, product, seconds)`` it has not counted yet: a running mean
    and count per product, and each run's uid remembered (the last MAX_COUNTED_RUNS) so none is
    counted twice; None when every run was counted already. Where the status measured a gang's links,
    per product and ``gang_gpus`` too (the GPUs the runs' gang held together: a gang of another size
    moved its data over another link, and is another entry); elsewhere the model has no term for the
    size, and the runs of every size pool into one entry per product, as before sizes were kept."""
    gang_gpus = gang_gpus if status.measured_links else None
    counted = list(status.counted_runs)
    by_key = {(o.product, o.gang_gpus): o for o in status.observations}
    changed = False
    for uid, product, seconds in runs:
        if uid in counted:
            continue
        seen = by_key.get((product, gang_gpus))
        count = seen.runs if seen else 0
        mean = float(seen.mean_seconds) if seen else 0.0
        new_mean = (mean * count + seconds) / (count + 1)
        by_key[(product, gang_gpus)] = Observation(
            product=product, runs=count + 1, meanSeconds=f"{new_mean:.1f}", gangGPUs=gang_gpus
        )
        counted.append(uid)
        changed = True
    if not changed:
        return None
    return status.model_copy(
        update={
            "observations": sorted(by_key.values(), key=lambda o: (o.product, o.gang_gpus or 1)),
            "counted_runs": counted[-MAX_COUNTED_RUNS:],
            "observed_runs": sum(o.runs for o in by_key.values()),
        }
    )
