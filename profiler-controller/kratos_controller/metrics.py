"""The controller's Prometheus metrics: profiles published, execution Jobs, reconcile errors, the
objects KRATOS holds and for how long, calibration writes and telemetry queries."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sized
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_list, as_mapping


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.profiles_published = Counter(
            "kratos_profiles_published",
            "WorkloadProfiles written, by outcome (profiling, ready, failed).",
            ["outcome"],
            registry=self.registry,
        )
        self.profiling_failures = Counter(
            "kratos_profiling_failures",
            "Profiling runs that profiled nothing, by the runner's failure class and the node and GPU product "
            "they ran on (unknown where the Pod never ran).",
            ["failure", "node", "product"],
            registry=self.registry,
        )
        self.execution_jobs_created = Counter(
            "kratos_execution_jobs_created",
            "Execution Jobs created from profiling Jobs.",
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "kratos_reconcile_errors", "Reconciles that failed and were retried.", registry=self.registry
        )
        self.hints = Counter(
            "kratos_hints",
            "Held followers released with hints, by what their preferred GPU products rest on "
            "(model, observed; none: base hints only).",
            ["source"],
            registry=self.registry,
        )
        self.admission_checks = Counter(
            "kratos_admission_check_states",
            "States KRATOS's Kueue AdmissionCheck wrote on Workloads (Pending: a follower waits for its "
            "profile; Ready: nothing to wait for).",
            ["state"],
            registry=self.registry,
        )
        self.certificate_renewals = Counter(
            "kratos_certificate_renewals",
            "Renewals of the webhook's serving certificate by the controller's leader, by outcome (renewed, "
            "failed: retried with backoff, the certificate in place kept).",
            ["outcome"],
            registry=self.registry,
        )
        self.acceptable_wait_seconds = Counter(
            "kratos_acceptable_wait_seconds",
            "Seconds the Pods of objects narrowed by maxSlowdown (their hints record keeps products off) "
            "have waited unbound for an acceptable GPU product, counted at each look (every 30 s).",
            registry=self.registry,
        )
        self.escapes = Counter(
            "kratos_wait_escapes",
            "Jobs narrowed by maxSlowdown that found no acceptable GPU product with room and were widened "
            "to a kept-off product where they were predicted to finish sooner than by waiting, by product.",
            ["product"],
            registry=self.registry,
        )
        self.waiting_for_product = Gauge(
            "kratos_pods_waiting_for_product",
            "Pods of narrowed objects waiting unbound for an acceptable GPU product, at the last look.",
            registry=self.registry,
        )
        self.certificate_expiry = Gauge(
            "kratos_certificate_expiry_timestamp_seconds",
            "When the CA (certificate=ca) and the serving certificate (certificate=serving) the controller renews "
            "from end (Unix time); absent where it does not renew.",
            ["certificate"],
            registry=self.registry,
        )
        self.calibration_writes = Counter(
            "kratos_calibration_writes",
            "Writes of the calibration ConfigMap, by why now: interval (calibrationWriteSeconds had "
            "passed, or the first write since start) or moved (a factor moved beyond its noise).",
            ["reason"],
            registry=self.registry,
        )
        self.calibration_fit = Histogram(
            "kratos_calibration_fit_seconds",
            "Wall seconds of each refit of the calibration, in its thread: the first after a start fits "
            "every workload, a later one what the changed profiles move. Its count is the refits made.",
            buckets=(0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
            registry=self.registry,
        )
        self.calibration_write_failures = Counter(
            "kratos_calibration_write_failures",
            "Calibration writes the API server refused or failed, by what: configmap (the factors) "
            "or shares (a profile's status.calibratedShares), and the HTTP status (413: too large).",
            ["object", "code"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "kratos_controller_leader",
            "1 while this replica holds the Lease and acts, else 0.",
            registry=self.registry,
        )
        self.held_objects = Gauge(
            "kratos_held_objects",
            "Opted-in Jobs and Pods KRATOS holds: followers awaiting a profile (suspended or gated) "
            "and profiling Jobs and Pods under the release finalizer.",
            registry=self.registry,
        )
        self.held_oldest_age = Gauge(
            "kratos_held_oldest_age_seconds",
            "Age since creation of the oldest object KRATOS holds; 0 when it holds none.",
            registry=self.registry,
        )
        self.telemetry_queries = Counter(
            "kratos_telemetry_queries",
            "Pod runs asked of Prometheus for their DCGM counters, by result (ok; incomplete: some "
            "default counter missing; empty: no series for the Pod; error: Prometheus unreachable, "
            "slow or refusing).",
            ["result"],
            registry=self.registry,
        )
        self.cached_objects = Gauge(
            "kratos_cached_objects",
            "Opted-in objects in the controller's informer caches, by kind (Job, Pod); NaN until the "
            "informer's first list has been read to its end.",
            ["kind"],
            registry=self.registry,
        )
        self.profiling_deadline = Gauge(
            "kratos_profiling_deadline_seconds",
            "The configured profilingDeadlineSeconds, for alerts on objects held longer.",
            registry=self.registry,
        )

    def watch_held(
        self,
        objects: Callable[[], Iterable[Mapping[str, Any]]],
        *,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        """Count what ``objects`` holds at each scrape (the controller's caches: a leader's view)."""

        def held() -> list[dt.datetime]:
            return [since for obj in objects() if (since := held_since(obj)) is not None]

        self.held_objects.set_function(lambda: float(len(held())))
        self.held_oldest_age.set_function(
            lambda: max(((clock() - since).total_seconds() for since in held()), default=0.0)
        )

    def caches(self, kinds: Mapping[str, tuple[Callable[[], bool], Sized]]) -> None:
        """Count each kind's cache at each scrape, once its informer has synced (``kinds``: kind ->
        (synced, cache))."""
        for kind, (synced, cache) in kinds.items():
            self.cached_objects.labels(kind).set_function(_counted(synced, cache))


def _counted(synced: Callable[[], bool], cache: Sized) -> Callable[[], float]:
    return lambda: float(len(cache)) if synced() else float("nan")


def held_since(obj: Mapping[str, Any]) -> dt.datetime | None:
    """When a held object was created: a follower awaiting a profile, or a profiling Job or Pod
    under the release finalizer; None when KRATOS does not hold it."""
    meta = as_mapping(obj.get("metadata"))
    held = v.AWAITING_PROFILE_ANNOTATION in as_mapping(
        meta.get("annotations")
    ) or v.RELEASE_FINALIZER in as_list(meta.get("finalizers"))
    created = meta.get("creationTimestamp")
    if not held or not isinstance(created, str):
        return None
    try:
        return dt.datetime.fromisoformat(created)
    except ValueError:
        return None
