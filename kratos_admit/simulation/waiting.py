"""A load-aware rule of "Wait or run slow", in the model only (``kratos-eft``): each waiting Job, in
arrival order, takes the product where it is predicted to finish first, the wait counted (HEFT's
earliest finish time), and starts only when that product has a free GPU; otherwise it waits for it.

The wait for a product is read from the predicted ends of the Jobs running there and of the Jobs ahead
in the queue that wait for it; every prediction is KRATOS's own (the ranking's relative times, in the
unit of the Job's runtime on the product its profile was measured on), never the truth. It is what a
controller that holds Pods by a scheduling gate and releases each narrowed to one product would do;
the measured comparison with the fixed cap is in docs/placement.md ("Wait or run slow").
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kratos_admit.decisions.hints import ranking_of
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.model.calibration import Calibration
from kratos_admit.model.catalog import Catalog
from kratos_admit.simulation.trace import TraceJob


@dataclass
class EarliestFinish:
    """The predicted ends of the Jobs running on each product, and the choice for a waiting Job."""

    running: dict[str, list[float]] = field(default_factory=dict)  # product -> sorted predicted ends
    ends: dict[str, tuple[str, float]] = field(default_factory=dict)  # Job -> (product, predicted end)

    def started(self, job: str, product: str, predicted_end: float, gpus: int = 1) -> None:
        for _ in range(gpus):
            bisect.insort(self.running.setdefault(product, []), predicted_end)
        self.ends[job] = (product, predicted_end)

    def finished(self, job: str, gpus: int = 1) -> None:
        found = self.ends.pop(job, None)
        if found is None:
            return
        product, end = found
        ends = self.running.get(product, [])
        for _ in range(gpus):
            i = bisect.bisect_left(ends, end)
            if i < len(ends) and ends[i] == end:
                ends.pop(i)

    def choose(
        self,
        now: float,
        predicted: Mapping[str, float],
        *,
        free: Callable[[str], bool],
        ahead: Mapping[str, int],
    ) -> tuple[str, bool] | None:
        """The product where a Job of ``predicted`` seconds per product finishes first, and whether it
        has a free GPU now; ``ahead``: how many Jobs before it already wait for each product (each takes
        the next GPU that frees there). None where no product can be predicted."""
        best: tuple[float, str, bool] | None = None
        for product, seconds in sorted(predicted.items()):
            if free(product) and not ahead.get(product, 0):
                start, now_free = now, True
            else:
                ends = self.running.get(product, [])
                k = ahead.get(product, 0)
                start = max(now, ends[k]) if k < len(ends) else math.inf
                now_free = False
            finish = start + seconds
            if best is None or finish < best[0]:
                best = (finish, product, now_free)
        if best is None or math.isinf(best[0]):
            return None
        return best[1], best[2]


def predicted_seconds(
    profile: WorkloadProfile | None,
    job: TraceJob,
    products: frozenset[str],
    *,
    config: Config,
    catalog: Catalog,
    calibration: Calibration,
) -> dict[str, float]:
    """What KRATOS predicts ``job`` takes on each product of the cluster: the ranking's relative times
    of its workload's ``profile``, in the unit of its runtime on its reference product (the trace's
    reference runtime, as a user's own estimate); empty without a Ready profile."""
    if profile is None or not profile.ready or profile.status is None:
        return {}
    measured = profile.status.gpu.product or job.reference_product
    ranked = ranking_of(
        profile,
        products | {job.reference_product, measured},
        config=config,
        catalog=catalog,
        calibration=calibration,
        gpus=job.total_gpus,
    )
    relative = {label: r.relative_time for r in ranked for label in r.labels}
    unit = job.reference_seconds / relative.get(job.reference_product, 1.0)
    return {p: relative[p] * unit for p in products if p in relative}
