"""What a refit changes of what the controller publishes: dates kept where a fit did not move, and
whether a change is worth writing before ``calibrationWriteSeconds`` is up (a factor moved beyond its
noise). Apart from ``calibration.py``, which is what the calibration is and how it is read."""

from __future__ import annotations

import dataclasses
import math

from kratos_admit.model.calibration import (
    FACTOR_UNITS,
    HUBER_DELTA,
    LINK_KINDS,
    Calibration,
    FactorSupport,
    ProductCalibration,
)


def keep_unchanged_dates(new: Calibration, old: Calibration) -> Calibration:
    """``new`` with each product's (and workload's) ``updatedAt`` kept from ``old`` where its fit did
    not change."""
    products = {}
    for name, p in new.products.items():
        before = old.get(name)
        products[name] = (
            dataclasses.replace(p, updated_at=before.updated_at)
            if before is not None and before.same_fit(p)
            else p
        )
    workloads = {}
    for name, w in new.workloads.items():
        was = old.workloads.get(name)
        workloads[name] = (
            dataclasses.replace(w, updated_at=was.updated_at) if was is not None and was.same_fit(w) else w
        )
    return Calibration(products, workloads)


def factor_noise(support: FactorSupport) -> float:
    """How far a factor moves (in log) from noise alone: the ordinary spread of runs (about
    ``HUBER_DELTA``) over the square root of the runs behind it."""
    return HUBER_DELTA / math.sqrt(max(1, support.runs))


def moved_beyond_noise(new: Calibration, old: Calibration, min_runs: int) -> bool:
    """Whether ``new`` changes what the ranking uses by more than noise: a factor that starts or
    stops qualifying, or a qualified factor that moved by more than its own noise (the larger of
    its old and new noise). Counts, dates and re-fitted shares alone wait for the next write."""
    for name, p in new.products.items():
        before = old.get(name) or ProductCalibration(name, FactorSupport(), FactorSupport())
        pairs = [(p.support(u), before.support(u)) for u in FACTOR_UNITS]
        for now, was in [*pairs, *((p.link(k), before.link(k)) for k in LINK_KINDS)]:
            if now.qualifies(min_runs) != was.qualifies(min_runs):
                return True
            if now.qualifies(min_runs) and abs(math.log(now.factor / was.factor)) > max(
                factor_noise(now), factor_noise(was)
            ):
                return True
    return any(
        any(p.support(u).qualifies(min_runs) for u in FACTOR_UNITS)
        or any(p.link(k).qualifies(min_runs) for k in LINK_KINDS)
        for n, p in old.products.items()
        if n not in new.products
    )


def same_calibration(a: Calibration, b: Calibration) -> bool:
    return a.to_json() == b.to_json()
