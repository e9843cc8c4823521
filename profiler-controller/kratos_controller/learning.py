"""What the controller learns from finished runs, pure (DESIGN "Learning the cluster's GPUs",
"Telemetry profiles"): observations of the time each workload really took per GPU product, the
calibration refitted from them, and the DCGM telemetry of every opted-in GPU run."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kratos_admit.decisions.record import recorded_exploration, recorded_gang_gpus
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import (
    MAX_COUNTED_RUNS,
    ProfileStatus,
    WorkloadProfile,
    as_read,
    with_runs,
)
from kratos_admit.domain.quantity import parse_positive_integer
from kratos_admit.domain.raw import as_list, as_mapping, string_map
from kratos_admit.domain.signing import signature_valid, signed_role
from kratos_admit.domain.vocabulary import Unit
from kratos_admit.model.calibration import (
    CONFIGMAP_KEY,
    CONFIGMAP_NAME,
    NO_CALIBRATION,
    Calibration,
    CalibrationError,
    Sample,
    exploring_document,
    parse_calibration,
    samples_of,
)
from kratos_admit.model.calibration_fit import fit_calibration
from kratos_admit.model.calibration_writes import keep_unchanged_dates, moved_beyond_noise, same_calibration
from kratos_admit.model.catalog import Catalog
from kratos_admit.model.links import link_activity
from kratos_admit.model.telemetry import PodTelemetry, TelemetryRun, with_telemetry
from kratos_controller.actions import Obj, PublishConfigMap, PublishProfile, RecordObservations
from kratos_controller.faults import finished, timestamp

# --- observations: what the workload really took on each GPU product -----------------------------------


@dataclass(frozen=True)
class Run:
    uid: str  # the Pod's uid: one run
    product: str  # the node's nvidia.com/gpu.product
    seconds: float
    gang_gpus: int | None = None  # the GPUs its gang ran on together (its hints record's), above 1


def observed_job(job: Mapping[str, Any], *, signing_key: bytes) -> bool:
    """A finished, successful Job KRATOS placed with hints (an execution Job or a hinted one), whose
    runs say what the workload takes; profiling runs measure under ncu and never count."""
    meta = as_mapping(job.get("metadata"))
    namespace = str(meta.get("namespace", "default"))
    if finished(job) != "Complete" or signed_role(meta, namespace=namespace, key=signing_key) == "profiling":
        return False
    return v.HINTS_ANNOTATION in string_map(meta.get("annotations")) and signature_valid(
        meta, namespace=namespace, key=signing_key
    )


def exploring_job(job: Mapping[str, Any], *, signing_key: bytes) -> tuple[str, Unit] | None:
    """The product and figure an unfinished Job KRATOS sent first to explore measures (its signed hints
    record's ``explore`` and ``exploreFigure``); None for any other Job, a finished one included."""
    meta = as_mapping(job.get("metadata"))
    found = recorded_exploration(job)
    if found is None or finished(job) is not None:
        return None
    namespace = str(meta.get("namespace", "default"))
    return found if signature_valid(meta, namespace=namespace, key=signing_key) else None


def runs_of(pods: Iterable[Mapping[str, Any]], products: Mapping[str, str]) -> list[Run]:
    """The successful runs among a Job's pods: the GPU container's start to finish, on the GPU
    product of the node it ran on (``products``: node name -> ``nvidia.com/gpu.product``)."""
    runs = []
    for pod in pods:
        meta, spec, status = (as_mapping(pod.get(k)) for k in ("metadata", "spec", "status"))
        product = products.get(str(spec.get("nodeName", "")))
        if status.get("phase") != "Succeeded" or not product or not meta.get("uid"):
            continue
        gpu_names = {
            str(as_mapping(c).get("name"))
            for c in as_list(spec.get("containers"))
            if any(
                str(k) == v.GPU_RESOURCE or str(k).startswith(v.MIG_RESOURCE_PREFIX)
                for k in as_mapping(as_mapping(as_mapping(c).get("resources")).get("limits"))
            )
        }
        for container in as_list(status.get("containerStatuses")):
            c = as_mapping(container)
            if gpu_names and c.get("name") not in gpu_names:
                continue
            ended = as_mapping(as_mapping(c.get("state")).get("terminated"))
            started, finished_at = timestamp(ended.get("startedAt")), timestamp(ended.get("finishedAt"))
            if ended.get("exitCode") == 0 and started and finished_at and finished_at > started:
                seconds = (finished_at - started).total_seconds()
                runs.append(Run(str(meta["uid"]), product, seconds, recorded_gang_gpus(pod)))
                break
    return runs


COUNTED_KEY = "countedRuns"  # the ledger ConfigMap's key: the uids counted, one a line


def ledger_name(profile_name: str) -> str:
    """The ConfigMap that holds the runs counted into a profile's observations (issue 59), beside it:
    only the controller reads it, so the webhook's list of profiles carries none of them."""
    return f"{profile_name}-counted-runs"


def ledger_runs(configmap: Mapping[str, Any] | None) -> list[str]:
    """The run uids a ledger ConfigMap holds (none when it is absent)."""
    return string_map(as_mapping(as_mapping(configmap).get("data"))).get(COUNTED_KEY, "").split()


def ledger_after(counted: Sequence[str], profile: Obj) -> dict[str, str] | None:
    """The ledger's data once it holds the runs the profile's ``countedRuns`` names (those its last
    write of observations counted, or up to 256 in a profile from before issue 59), the last
    MAX_COUNTED_RUNS kept; None when it holds them all already. Written before the profile's next
    write replaces its ``countedRuns``, so a run is in one of the two from its count on."""
    pending = [str(u) for u in as_list(as_mapping(profile.get("status")).get("countedRuns"))]
    known = set(counted)
    missing = [u for u in pending if u not in known]
    if not missing:
        return None
    return {COUNTED_KEY: "\n".join([*counted, *missing][-MAX_COUNTED_RUNS:])}


def record_runs(profile: Obj, runs: Sequence[Run], counted: Iterable[str] = ()) -> RecordObservations | None:
    """The profile's status with the runs neither it (``countedRuns``) nor the ledger (``counted``)
    has counted yet: a running mean and count per product, and ``countedRuns`` naming this write's
    runs alone (the earlier ones are in the ledger by then: ``ledger_after``)."""
    try:
        status = ProfileStatus.model_validate(profile.get("status") or {})
    except ValidationError:
        return None
    known = {*counted, *status.counted_runs}
    runs = [r for r in runs if r.uid not in known]
    if not runs:
        return None
    status = status.model_copy(update={"counted_runs": []})
    updated: ProfileStatus | None = None
    for size in sorted({run.gang_gpus or 1 for run in runs}):  # a gang's size is its own entry
        of_size = [(r.uid, r.product, r.seconds) for r in runs if (r.gang_gpus or 1) == size]
        gang = size if size > 1 else None
        updated = with_runs(updated or status, of_size, gang_gpus=gang) or updated
    return _recorded(profile, updated)


def _recorded(profile: Obj, updated: ProfileStatus | None) -> RecordObservations | None:
    """The status write for ``profile``, guarded by its resourceVersion; None when nothing changed."""
    if updated is None:
        return None
    meta = as_mapping(profile.get("metadata"))
    return RecordObservations(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        str(meta.get("resourceVersion", "")),
        updated,
    )


# --- calibration: what every counted run says about each GPU product ----------------------------------


def current_calibration(configmap: Mapping[str, Any] | None) -> Calibration:
    """What the ConfigMap holds now (nothing, when it is absent or unreadable: the next fit replaces it)."""
    text = string_map(as_mapping(as_mapping(configmap).get("data"))).get(CONFIGMAP_KEY)
    if not text:
        return NO_CALIBRATION
    try:
        return parse_calibration(text)
    except CalibrationError:
        return NO_CALIBRATION


def published_calibration(calibration: Calibration) -> dict[str, str]:
    """The ConfigMap's data: the products' factors alone, compact (issue 59: with every workload's
    shares, pretty-printed, it passed 1 MiB at 2,898 workloads), and the exploring Jobs under way (a
    few: one Job in twenty explores, and only while a figure is unknown). A workload's shares
    (``as_dict``) go to its profile's ``status.calibratedShares``."""
    document: dict[str, Any] = {
        "products": {name: p.as_dict() for name, p in sorted(calibration.products.items())}
    }
    if calibration.exploring:  # the exploring Jobs under way, for the next Jobs' choice
        document["exploring"] = exploring_document(calibration.exploring)
    return {CONFIGMAP_KEY: json.dumps(document, sort_keys=True, separators=(",", ":"))}


def calibration_write_wait(
    fitted: Calibration,
    written: Calibration,
    *,
    since_write: float | None,
    interval: float,
    min_runs: int,
) -> float:
    """Seconds until a changed calibration should be written (0: now). At most once per
    ``interval`` (config ``calibrationWriteSeconds``), sooner only when a factor moved beyond its
    noise; ``since_write`` is None when this controller has not written yet (after a start: write)."""
    if since_write is None or since_write >= interval or moved_beyond_noise(fitted, written, min_runs):
        return 0.0
    return interval - since_write


def profile_samples(
    profiles: Iterable[Mapping[str, Any]], *, catalog: Catalog, reference_product: str
) -> list[Sample]:
    """The calibration's samples of these profile objects (their observations), each read as the
    decisions read it (``as_read``: without the Pod uids counted) and dropped once read; an invalid
    one gives none. The controller folds a list page by page through this, so only the samples of
    the whole list are ever held together."""
    parsed = []
    for raw in profiles:
        try:
            parsed.append(WorkloadProfile.model_validate(as_read(raw)))
        except ValidationError:
            continue
    return samples_of(parsed, catalog, reference_product=reference_product)


def calibrate(
    profiles: Iterable[Mapping[str, Any]],
    configmap: Mapping[str, Any] | None,
    *,
    namespace: str,
    catalog: Catalog,
    reference_product: str,
    now: str,
) -> tuple[Calibration, PublishConfigMap | None]:
    """The calibration fitted from every profile's observations (``calibrate_samples``)."""
    samples = profile_samples(profiles, catalog=catalog, reference_product=reference_product)
    return calibrate_samples(samples, configmap, namespace=namespace, catalog=catalog, now=now)


def calibrate_samples(
    samples: list[Sample],
    configmap: Mapping[str, Any] | None,
    *,
    namespace: str,
    catalog: Catalog,
    now: str,
) -> tuple[Calibration, PublishConfigMap | None]:
    """The calibration fitted from the samples of every profile's observations, and the write of the
    ConfigMap when it differs from what the ConfigMap holds. A product whose fit did not change keeps
    its ``updatedAt``, so the same runs (counted twice, replayed, after a restart) write nothing."""
    before = current_calibration(configmap)
    fitted = keep_unchanged_dates(fit_calibration(samples, catalog, updated_at=now), before)
    if configmap is not None and same_calibration(fitted, before):
        return before, None
    return fitted, PublishConfigMap(namespace, CONFIGMAP_NAME, {CONFIGMAP_KEY: fitted.to_json()})


# --- telemetry: DCGM counters of every opted-in GPU run ---------------------------------------------


@dataclass(frozen=True)
class TelemetryDue:
    """A Pod whose run is to be asked of Prometheus: the counters averaged over ``seconds`` up to ``end``."""

    uid: str
    namespace: str
    pod: str
    workload: str
    node: str
    end: dt.datetime
    seconds: float
    # its GPUs move data between them: more than one GPU, or a Pod of a gang (an Indexed Job's, a
    # JobSet's, a training operator's): its link counters make the interconnect share
    linked: bool = False
    gang_gpus: int | None = None  # the GPUs its gang runs on together (its hints record's), above 1


def _asks_for_gpus(container: Mapping[str, Any]) -> bool:
    limits = as_mapping(as_mapping(container.get("resources")).get("limits"))
    return any(str(k) == v.GPU_RESOURCE or str(k).startswith(v.MIG_RESOURCE_PREFIX) for k in limits)


def _linked(labels: Mapping[str, str], containers: list[Mapping[str, Any]]) -> bool:
    """The Pod's GPUs move data between them: it holds more than one whole GPU, or it is a Pod of a
    gang (its labels say so: the index of an Indexed Job, a JobSet's or training operator's name)."""
    if v.JOB_COMPLETION_INDEX in labels or any(labels.get(key) for key in v.GANG_POD_LABELS):
        return True
    gpus = 0
    for container in containers:
        count = as_mapping(as_mapping(container.get("resources")).get("limits")).get(v.GPU_RESOURCE)
        gpus += parse_positive_integer(count) or 0
    return gpus > 1


def telemetry_due(
    pod: Mapping[str, Any], *, now: dt.datetime, window_seconds: float
) -> TelemetryDue | float | None:
    """The Pod's run when it is due (succeeded, or has run ``window_seconds``: the first window is
    its evidence); the seconds until it is due while it runs; None when it never will be (not
    opted in, no GPU, a profiling run under ncu, failed, or not started)."""
    meta, spec, status = (as_mapping(pod.get(k)) for k in ("metadata", "spec", "status"))
    labels = string_map(meta.get("labels"))
    workload = labels.get(v.WORKLOAD_LABEL, "")
    if not v.is_dns1123_label(workload) or labels.get(v.ROLE_LABEL) == "profiling" or not meta.get("uid"):
        return None
    gpu_names = {
        str(as_mapping(c).get("name"))
        for c in as_list(spec.get("containers"))
        if _asks_for_gpus(as_mapping(c))
    }
    node = str(spec.get("nodeName") or "")
    phase = status.get("phase")
    if not gpu_names or not node or phase not in ("Running", "Succeeded"):
        return None
    started: dt.datetime | None = None
    ended: dt.datetime | None = None
    for container in as_list(status.get("containerStatuses")):
        c = as_mapping(container)
        if c.get("name") not in gpu_names:
            continue
        state = as_mapping(c.get("state"))
        run = as_mapping(state.get("running") or state.get("terminated"))
        begun = timestamp(run.get("startedAt"))
        if begun is not None and (started is None or begun < started):
            started = begun
        finished_at = timestamp(as_mapping(state.get("terminated")).get("finishedAt"))
        if finished_at is not None and (ended is None or finished_at > ended):
            ended = finished_at
    if started is None:
        return None
    due = TelemetryDue(
        str(meta["uid"]),
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        workload,
        node,
        now,
        0.0,
        _linked(labels, [as_mapping(c) for c in as_list(spec.get("containers"))]),
        recorded_gang_gpus(pod),
    )
    if phase == "Succeeded" and ended is not None and ended > started:
        return dataclasses.replace(due, end=ended, seconds=(ended - started).total_seconds())
    if phase == "Running":
        ran = (now - started).total_seconds()
        if ran < window_seconds:
            return window_seconds - ran
        return dataclasses.replace(
            due, end=started + dt.timedelta(seconds=window_seconds), seconds=window_seconds
        )
    return None


def telemetry_run(due: TelemetryDue, found: PodTelemetry, product: str) -> TelemetryRun | None:
    """What the run adds to the profile; None when Prometheus had no profiling counter for it."""
    if not found.counters or not product:
        return None
    return TelemetryRun(
        due.uid, product, due.seconds, len(found.gpus), found.counters, due.linked, due.gang_gpus
    )


def record_telemetry(
    profile: Obj | None, due: TelemetryDue, run: TelemetryRun, *, now: str, catalog: Catalog | None = None
) -> PublishProfile | RecordObservations | None:
    """The write that folds ``run`` into the workload's profile: a new profile (Ready, from
    telemetry) when there is none, else its status replaced (guarded by its resourceVersion);
    None when the Pod was counted already or the profile cannot be read. With ``catalog``, a
    telemetry profile is read as measured on the catalog's measured ground wherever a run there
    was counted (``measuring_product``)."""
    known = catalog.measured_ground if catalog is not None else None
    if profile is None:
        status = with_telemetry(None, run, now=now, known=known, catalog=catalog)
        if status is None:
            return None
        name = v.profile_name(due.workload)
        labels = {v.WORKLOAD_LABEL: due.workload}
        return PublishProfile(due.namespace, name, {"workload": due.workload}, status, labels, only_new=True)
    try:
        current = ProfileStatus.model_validate(profile.get("status") or {"phase": "Profiling"})
    except ValidationError:
        return None
    return _recorded(profile, with_telemetry(current, run, now=now, known=known, catalog=catalog))


def counted_telemetry(profile: Obj | None, uid: str) -> bool:
    return uid in as_list(as_mapping(as_mapping(profile).get("status")).get("countedTelemetry"))


def missing_links_note(
    due: TelemetryDue, found: PodTelemetry, product: str, catalog: Catalog, url: str
) -> str | None:
    """Why a linked run's interconnect is unmeasured, naming the link counters Prometheus lacks for
    it; None when its links were measured (or it is no linked run)."""
    if not due.linked:
        return None
    reading = link_activity(found.counters, catalog.placement(product) if product else None)
    if not reading.missing:
        return None
    return (
        f"Prometheus at {url} has no {' and no '.join(reading.missing)} for Pod {due.namespace}/{due.pod}, "
        f"whose GPUs move data between them: its interconnect share is unmeasured (not 0) until "
        "dcgm-exporter's counters file has them (the telemetry component's does)"
    )


def missing_counters_note(due: TelemetryDue, found: PodTelemetry, url: str) -> str:
    """Why a run's profile lacks counters, naming them (a GPU without DCGM profiling support, or a
    counters file that leaves them out)."""
    names = ", ".join(found.missing)
    gpus = "; ".join(found.lacking)
    return (
        f"Prometheus at {url} has no {names} for Pod {due.namespace}/{due.pod} ({gpus}): the GPU "
        "does not support DCGM profiling (consumer boards, some MIG setups) or dcgm-exporter's "
        "counters file leaves them out"
    )
