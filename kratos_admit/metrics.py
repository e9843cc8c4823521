"""The Prometheus metrics DESIGN names, on a registry of their own so tests and workers do not collide."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
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
        self.profile_cache_objects = Gauge(
            "kratos_profile_cache_objects", "WorkloadProfiles held in the webhook's cache.", registry=r
        )
        self.certificate_expiry = Gauge(
            "kratos_tls_certificate_expiry_timestamp_seconds",
            "Expiry (Unix time) of the serving certificate in use.",
            registry=r,
        )

    def watch_profile_count(self, count: Callable[[], int]) -> None:
        self.profile_cache_objects.set_function(lambda: float(count()))
