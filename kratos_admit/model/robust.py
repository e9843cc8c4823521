"""The robust means the calibration's fits are made of (docs/ranking.md "Calibration"): a weighted
median, and Huber's M-estimate of location, in log-time, so a run on a throttled node or beside a
noisy neighbour moves a factor by only a few percent. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence

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
