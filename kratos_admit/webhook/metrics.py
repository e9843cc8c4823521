"""The Prometheus metrics DESIGN names, on a registry of their own so tests and workers do not collide.

With ``webhook --workers N`` the processes share one view through prometheus-client's multiprocess
mode: each writes its samples to files in one directory and every ``/metrics`` sums them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess, values

_MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"


def share_between_processes(directory: Path) -> None:
    """Switch this process, and the workers it forks afterwards, to multiprocess metrics in
    ``directory``. prometheus-client picks its value class from the environment at import time,
    so the class is chosen again here, before any KRATOS metric exists."""
    os.environ[_MULTIPROCESS_ENV] = str(directory)
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


def shared_directory() -> Path | None:
    found = os.environ.get(_MULTIPROCESS_ENV)
    return Path(found) if found else None


def shared_registry(directory: Path) -> CollectorRegistry:
    """What every worker's samples add up to: the registry ``/metrics`` serves with workers."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return registry


def worker_gone(directory: Path, pid: int) -> None:
    """Drop a finished worker's live gauges (its counters keep counting in the sum)."""
    multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]


_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        shared = shared_directory()
        # what /metrics serves: this process's registry, or the sum over all workers
        self.exposition = shared_registry(shared) if shared else self.registry
        self._shared = shared is not None
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter(
            "kratos_admission_requests",
            "AdmissionReviews answered, by webhook, object kind, operation and outcome.",
            ["webhook", "kind", "operation", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "kratos_admission_duration_seconds",
            "Time to answer one AdmissionReview, body read to response written.",
            ["webhook"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.violations = Counter(
            "kratos_validation_violations", "Violations reported, by rule id.", ["rule"], registry=r
        )
        self.mutations = Counter(
            "kratos_mutations",
            "Mutating decisions, by action (hints, profiling, none).",
            ["action"],
            registry=r,
        )
        self.hints = Counter(
            "kratos_hints",
            "Objects admitted with hints, by what their preferred GPU products rest on "
            "(model, observed; none: base hints only).",
            ["source"],
            registry=r,
        )
        self.explorations = Counter(
            "kratos_explorations",
            "Jobs admitted to explore a GPU product whose figure for their bound type is not yet calibrated "
            "(config explorationShare), by that product.",
            ["product"],
            registry=r,
        )
        self.profile_cache_objects = Gauge(
            "kratos_profile_cache_objects",
            "WorkloadProfiles held in the webhook's cache.",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.certificate_expiry = Gauge(
            "kratos_tls_certificate_expiry_timestamp_seconds",
            "Expiry (Unix time) of the serving certificate in use.",
            registry=r,
            multiprocess_mode="livemin",
        )

    def inc(self, counter: Counter, *labels: str) -> None:
        """``counter.labels(*labels).inc()``, the labelled child looked up once (per request it
        was a lock, a join and a validation of every label, for each of four metrics)."""
        self._child(counter, labels).inc()

    def observe(self, histogram: Histogram, label: str, value: float) -> None:
        self._child(histogram, (label,)).observe(value)

    def _child(self, metric: Counter | Histogram, labels: tuple[str, ...]) -> Any:
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def watch_profile_count(self, count: Callable[[], int]) -> None:
        if self._shared:  # samples live in files, not in a callback; workers serve file stores,
            self.profile_cache_objects.set(float(count()))  # loaded once before they fork
        else:
            self.profile_cache_objects.set_function(lambda: float(count()))
