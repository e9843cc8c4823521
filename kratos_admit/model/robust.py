"""The robust means the calibration's fits are made of (docs/ranking.md "Calibration"): a weighted
median, and Huber's M-estimate of location, in log-time, so a run on a throttled node or beside a
noisy neighbour moves a factor by only a few percent. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from kratos_admit.model.calibration import HUBER_DELTA

ROUNDS = 200  # a fit's rounds at most: half of least squares, then as many of Huber


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value below and above which half the weight lies (the mean of the two middle values on a tie)."""
    pairs = sorted(zip(values, weights, strict=True))
    half = sum(w for _, w in pairs) / 2
    running = 0.0
    for i, (value, weight) in enumerate(pairs):
        running += weight
        if math.isclose(running, half) and i + 1 < len(pairs):
            return (value + pairs[i + 1][0]) / 2
        if running > half:
            return value
    return pairs[-1][0]


def huber_location(values: Sequence[float], weights: Sequence[float], *, delta: float = HUBER_DELTA) -> float:
    """Huber's M-estimate of location (iteratively reweighted, from the weighted median): values
    within ``delta`` of it count fully, as in a mean; one farther out counts delta/distance of its
    weight, so an outlier moves it by at most about delta times its share of the weight."""
    if delta == math.inf:
        # every weight counts fully: the weighted mean, which is the first step's result and its fixed
        # point (the same floats, without the median and the second step)
        return sum(x * wt for x, wt in zip(values, weights, strict=True)) / sum(weights)
    centre = weighted_median(values, weights)
    for _ in range(20):
        w = [
            wt * min(1.0, delta / max(abs(x - centre), 1e-12)) for x, wt in zip(values, weights, strict=True)
        ]
        updated = sum(x * wi for x, wi in zip(values, w, strict=True)) / sum(w)
        if abs(updated - centre) < 1e-9:
            return updated
        centre = updated
    return centre


# --- the same estimators over many groups at once (the calibration's factors' fit, issue 59) --------
#
# At 20,000 workloads the factors' fit reads 60,000 samples a round: one Huber location per workload
# and one per (unit, product) of the votes. Computed group by group in Python that was 0.35 ms a sample
# a fit (21 s at 20,000 workloads); over numpy arrays it is one pass per step for every group. Each
# group's sums run over its values in their given order, as ``sum`` over the scalar functions' lists
# does, so a group's result is the scalar function's on the same values in that order.


def group_starts(groups: NDArray[np.intp], count: int) -> NDArray[np.intp]:
    """The index of each group's first element in ``groups`` sorted (``count`` groups; an empty
    group starts where the next does)."""
    return np.searchsorted(groups, np.arange(count), side="left").astype(np.intp)


def weighted_medians(
    values: NDArray[np.float64], weights: NDArray[np.float64], groups: NDArray[np.intp], count: int
) -> NDArray[np.float64]:
    """``weighted_median`` of each group's values (nan for a group with none), ties as it breaks them:
    sorted by value, then weight; the mean of the two middle values where the running weight is
    (``math.isclose``) half of the group's and another value follows. The weights are whole run counts,
    so the running sums are exact in any order."""
    found = np.full(count, np.nan)
    if values.size == 0:
        return found
    order = np.lexsort((weights, values, groups))
    v, w, g = values[order], weights[order], groups[order]
    starts = group_starts(g, count)
    ends = np.append(starts[1:], g.size)
    present = ends > starts
    cumulative = np.cumsum(w)
    before = np.where(starts > 0, cumulative[np.maximum(starts - 1, 0)], 0.0)
    running = cumulative - before[g]
    half = (cumulative[np.maximum(ends - 1, 0)] - before) / 2
    at = np.arange(g.size)
    last = at == ends[g] - 1
    close = np.abs(running - half[g]) <= 1e-9 * np.maximum(np.abs(running), np.abs(half[g]))  # math.isclose
    tie = close & ~last
    hit = tie | (running > half[g])
    first = np.full(count, g.size, dtype=np.intp)
    np.minimum.at(first, g[hit], at[hit])
    none = present & (first == g.size)
    first = np.where(none, ends - 1, first)
    chosen = np.minimum(first, g.size - 1)
    nxt = np.minimum(chosen + 1, g.size - 1)
    median = np.where(tie[chosen] & ~none, (v[chosen] + v[nxt]) / 2, v[chosen])
    found[present] = median[present]
    return found


def huber_locations(
    values: NDArray[np.float64],
    weights: NDArray[np.float64],
    groups: NDArray[np.intp],
    count: int,
    *,
    delta: float = HUBER_DELTA,
) -> NDArray[np.float64]:
    """``huber_location`` of each group's values (nan for a group with none): with ``delta`` infinite
    the weighted mean; else from the weighted median, at most 20 reweighting steps, each group ending
    at the first step that moves it by less than 1e-9, as the scalar function does. Below
    ``SCALAR_BELOW`` values the scalar function itself, group by group: an array step costs a few
    microseconds whatever its size, more than the loop over a few dozen values (the simulator's fits)."""
    if values.size < SCALAR_BELOW:
        found = np.full(count, np.nan)
        members: dict[int, tuple[list[float], list[float]]] = {}
        for g, x, w in zip(groups.tolist(), values.tolist(), weights.tolist(), strict=True):
            xs, ws = members.setdefault(g, ([], []))
            xs.append(x)
            ws.append(w)
        for g, (xs, ws) in members.items():
            found[g] = huber_location(xs, ws, delta=delta)
        return found
    totals = np.bincount(groups, weights=weights, minlength=count)
    present = totals > 0
    if delta == math.inf:
        sums = np.bincount(groups, weights=values * weights, minlength=count)
        mean: NDArray[np.float64] = np.divide(sums, totals, out=np.full(count, np.nan), where=present)
        return mean
    centre = weighted_medians(values, weights, groups, count)
    active = present.copy()
    for _ in range(20):
        if not active.any():
            break
        w = weights * np.minimum(1.0, delta / np.maximum(np.abs(values - centre[groups]), 1e-12))
        sums = np.bincount(groups, weights=values * w, minlength=count)
        updated = np.divide(
            sums, np.bincount(groups, weights=w, minlength=count), out=centre.copy(), where=active
        )
        done = active & (np.abs(updated - centre) < 1e-9)
        centre = updated
        active &= ~done
    return centre


SCALAR_BELOW = 256  # values: fewer, and ``huber_locations`` runs the scalar function per group
