"""The calibration fit (DESIGN "Learning the cluster's GPUs"): per GPU product, by how much the ranking
model's memory time and compute time must be scaled to match what really ran on this cluster.

Pure: ``fit_calibration(samples, catalog) -> Calibration``. docs/ranking.md "Calibration" gives the
model and the estimator. In short: a product P's calibrated sustained figures are the catalog's
divided by its factors (``memoryTimeFactor`` 1.25: memory-bound work takes 25 % longer there than
the catalog says). Each (workload, product) observation is one sample: its mean seconds, its run
count, and the workload's profile (SM and memory shares on the product it was profiled on). The fit
alternates two robust steps: each workload's runtime scale is a robust mean (Huber's, in log-time)
of its samples' observed/modelled times, and each product's factor is the robust mean of what its
samples imply for the term that bounds them (memory or compute). A run on a throttled node or
beside a noisy neighbour inflates one sample's mean; the Huber weights let it move a factor by only
a few percent, where a least-squares fit would be pulled by its whole share. Observations fix only
ratios between products, so the factors are anchored to a geometric mean of 1; a factor that
nothing measured stays at 1, the catalog's figure.

The same pass then re-fits each workload's SM and memory shares from its runs (the profile's
shares the prior; docs/ranking.md "Re-fitted shares"), reading the product it was profiled on with
the figures its runs elsewhere imply when no run measured that product, so its predictions stop
resting on the catalog's guess for where its profile happened to be measured. The controller runs
it; the webhook only reads the result (``Calibration.workloads``) from memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kratos_admit.decisions.calibration import (
    DIGITS,
    DOMINANT,
    HUBER_DELTA,
    PRIOR_RUNS,
    Calibration,
    FactorSupport,
    ProductCalibration,
    Sample,
    WorkloadShares,
)
from kratos_admit.domain.catalog import Catalog

ROUNDS = 200
# re-fitted shares (docs/ranking.md "Re-fitted shares"): the profile's measured shares are a prior
# worth PRIOR_RUNS runs; a step moves a share by at most this much in log; a share stays in (0, 1]
MAX_STEP = 0.25
MIN_SHARE, MAX_SHARE = 0.005, 1.0
FACTOR_RANGE = math.log(2)  # a held factor is searched within 1/2..2 times the catalog's
REFIT_STEPS = 25  # Gauss-Newton steps of least squares, then as many of Huber


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


def _terms(
    s: Sample,
    catalog: Catalog,
    memory: Mapping[str, float],
    compute: Mapping[str, float],
    shares: tuple[float, float] | None = None,
) -> tuple[float, float, float]:
    """(memory term, compute term, idle share) of the sample's runtime relative to its profiled
    product, read with the workload's ``shares`` (SM, memory) where they were re-fitted, else its
    profile's."""
    sm, mem = shares if shares is not None else (s.sm, s.mem)
    there_bw, here_bw, there_fp32, here_fp32 = _figures(catalog, s.product, s.profiled)
    memory_term = mem * there_bw / here_bw * memory[s.product] / memory[s.profiled]
    compute_term = sm * there_fp32 / here_fp32 * compute[s.product] / compute[s.profiled]
    return memory_term, compute_term, 1 - max(sm, mem)


@functools.lru_cache(maxsize=1024)
def _figures(catalog: Catalog, product: str, profiled: str) -> tuple[float, float, float, float]:
    """The sustained bandwidth and FP32 of the profiled product and of the run's: fixed per pair, and
    _terms is the fit's inner loop (a refit read them about a million times for 480 runs). A catalog
    is not changed once loaded, and is hashed by identity."""
    here, there = catalog.placement(product), catalog.placement(profiled)
    assert here is not None and there is not None, "samples_of keeps catalog products only"
    return (
        there.sustained_bandwidth_gbs,
        here.sustained_bandwidth_gbs,
        there.sustained_fp32_tflops,
        here.sustained_fp32_tflops,
    )


def _references(votes: Mapping[str, list[tuple[float, Sample]]], used: Sequence[Sample]) -> set[str]:
    """The products whose factor the votes are ratios to: the profiled product of each voting
    workload that also ran there (that run set the workload's scale). A workload that never ran on
    the product it was profiled on measures nothing there."""
    ran = {(s.workload, s.product) for s in used}
    return {s.profiled for cast in votes.values() for _, s in cast if (s.workload, s.profiled) in ran}


def _anchor(factors: dict[str, float], voted: set[str], known: set[str]) -> None:
    """Divide the known factors by the geometric mean of those the samples voted on: the same divisor
    for all, so no ratio between them changes, and the calibrated products keep the catalog's figures
    on average. A factor nothing measured (neither voted on nor the reference of a workload's votes)
    is unknown: it stays at the catalog's figure, 1. Rescaling it with the others would let it drift
    without bound, and drag with it the votes of the workloads profiled on its product."""
    mean = math.exp(sum(math.log(factors[p]) for p in voted) / len(voted)) if voted else 1.0
    for p, value in factors.items():
        factors[p] = value / mean if p in known else 1.0


def _solve3(a: list[list[float]], b: list[float]) -> list[float] | None:
    """The solution of a 3x3 linear system (Gaussian elimination, partial pivoting); None if singular."""
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, 3):
            f = m[r][col] / m[col][col]
            for c in range(col, 4):
                m[r][c] -= f * m[col][c]
    x = [0.0, 0.0, 0.0]
    for r in (2, 1, 0):
        x[r] = (m[r][3] - sum(m[r][c] * x[c] for c in range(r + 1, 3))) / m[r][r]
    return x


def _refit_step(
    group: Sequence[Sample],
    *,
    prior: tuple[float, float],
    current: tuple[float, float, float],
    catalog: Catalog,
    memory: Mapping[str, float],
    compute: Mapping[str, float],
    delta: float,
    known: set[tuple[str, str]],
) -> tuple[float, float, float]:
    """One damped Gauss-Newton step of a workload's (scale, SM share, memory share) towards the
    runtimes its runs took, in log-time, each sample weighted by its runs (and Huber's weight), the
    profile's shares a prior worth ``PRIOR_RUNS`` runs (docs/ranking.md "Re-fitted shares")."""
    scale, sm, mem = current
    rows: list[tuple[list[float], float, float]] = []  # (gradient of log model, residual, weight)
    for s in group:
        m, c, idle = _terms(s, catalog, memory, compute, (sm, mem))
        if s.product != s.profiled and (s.product, "memory" if m >= c else "compute") not in known:
            continue  # a run on a product whose figure for what bounds it nothing measured
        modelled = max(m, c) + idle
        if modelled <= 0:
            continue
        residual = math.log(s.seconds / (scale * modelled))
        weight = s.runs * (1.0 if delta == math.inf else min(1.0, delta / max(abs(residual), 1e-12)))
        d_sm = ((c if c > m else 0.0) - (sm if sm > mem else 0.0)) / modelled
        d_mem = ((m if m >= c else 0.0) - (mem if mem >= sm else 0.0)) / modelled
        rows.append(([1.0, d_sm, d_mem], residual, weight))
    rows.append(([0.0, 1.0, 0.0], math.log(prior[0] / sm), PRIOR_RUNS))
    rows.append(([0.0, 0.0, 1.0], math.log(prior[1] / mem), PRIOR_RUNS))
    normal = [
        [sum(w * g[i] * g[j] for g, _, w in rows) + (1e-9 if i == j else 0.0) for j in range(3)]
        for i in range(3)
    ]
    rhs = [sum(w * g[i] * r for g, r, w in rows) for i in range(3)]
    step = _solve3(normal, rhs)
    if step is None:
        return current
    step = [max(-MAX_STEP, min(MAX_STEP, x)) for x in step]
    return (
        scale * math.exp(step[0]),
        min(MAX_SHARE, max(MIN_SHARE, sm * math.exp(step[1]))),
        min(MAX_SHARE, max(MIN_SHARE, mem * math.exp(step[2]))),
    )


def _bounds(
    group: Sequence[Sample], shares: tuple[float, float], catalog: Catalog, factors: _Factors
) -> set[str]:
    """The resources that clearly bound at least one of a workload's samples (its runs measure that share)."""
    found = set()
    for s in group:
        m, c, _ = _terms(s, catalog, factors.memory, factors.compute, shares)
        if m >= DOMINANT * c:
            found.add("memory")
        elif c >= DOMINANT * m:
            found.add("compute")
    return found


Votes = dict[str, dict[str, list[tuple[float, Sample]]]]  # by resource, by product: (factor, sample)


@dataclass
class _Factors:
    memory: dict[str, float]
    compute: dict[str, float]
    votes: Votes
    measured: dict[str, set[str]]  # by resource: the products the last round's votes measured

    def of(self, kind: str) -> dict[str, float]:
        return self.memory if kind == "memory" else self.compute


def _fit_factors(
    used: Sequence[Sample],
    catalog: Catalog,
    shares: Mapping[str, tuple[float, float]],
    fixed: Mapping[str, Mapping[str, float]],
) -> _Factors:
    """Each product's factors from the runs, the workloads read with ``shares``; a factor in
    ``fixed`` (by resource, by product) is held at that value (known, but not voted on)."""
    names = {s.product for s in used} | {s.profiled for s in used}
    memory = dict.fromkeys(names, 1.0)
    compute = dict.fromkeys(names, 1.0)
    for kind, factors in (("memory", memory), ("compute", compute)):
        factors.update(fixed.get(kind, {}))
    votes: Votes = {"memory": {}, "compute": {}}
    # the factors some round measured (voted on, or the reference of votes): the others stay 1
    known: dict[str, set[str]] = {kind: set(fixed.get(kind, {})) for kind in ("memory", "compute")}
    by_workload: dict[str, list[Sample]] = {}
    for s in used:
        by_workload.setdefault(s.workload, []).append(s)
    for round_ in range(ROUNDS):
        # least squares first (a unique fit, near which the Huber steps then converge), then Huber
        delta = math.inf if round_ < ROUNDS // 2 else HUBER_DELTA
        scale: dict[str, float] = {}
        for workload, group in by_workload.items():
            # the scale comes from the samples the model reads clearly: the run on the profiled
            # product (which the model predicts exactly), and runs clearly bound by one resource
            logs, weights = [], []
            for s in group:
                m, c, idle = _terms(s, catalog, memory, compute, shares[workload])
                if s.product == s.profiled or max(m, c) >= DOMINANT * min(m, c):
                    logs.append(math.log(s.seconds / (max(m, c) + idle)))
                    weights.append(s.runs)
            if logs:
                scale[workload] = math.exp(huber_location(logs, weights, delta=delta))
        votes = {"memory": {}, "compute": {}}
        for s in used:
            if s.product == s.profiled:
                continue  # the run on its own profiled product sets the scale, not a ratio
            if s.workload not in scale:
                continue
            m, c, idle = _terms(s, catalog, memory, compute, shares[s.workload])
            busy = s.seconds / scale[s.workload] - idle
            if busy <= 0 or max(m, c) < DOMINANT * min(m, c):
                continue  # which resource bounds it is not clear: it could explain either factor
            kind, term, factors = ("memory", m, memory) if m >= c else ("compute", c, compute)
            if s.product in fixed.get(kind, {}):
                continue
            votes[kind].setdefault(s.product, []).append((factors[s.product] * busy / term, s))
        moved = 0.0
        for kind, factors in (("memory", memory), ("compute", compute)):
            for product, cast in votes[kind].items():
                new = math.exp(
                    huber_location([math.log(f) for f, _ in cast], [s.runs for _, s in cast], delta=delta)
                )
                moved = max(moved, abs(math.log(new / factors[product])))
                factors[product] = new
            factors.update(fixed.get(kind, {}))
            known[kind] |= set(votes[kind]) | _references(votes[kind], used)
            _anchor(factors, set(votes[kind]), known[kind])
        if moved < 1e-7 and delta != math.inf:
            break
    measured = {
        kind: set(votes[kind]) | _references(votes[kind], used) | set(fixed.get(kind, {}))
        for kind in ("memory", "compute")
    }
    return _Factors(memory, compute, votes, measured)


def _refit_shares(
    group: Sequence[Sample], prior: tuple[float, float], catalog: Catalog, factors: _Factors
) -> tuple[float, float]:
    """A workload's (SM, memory) shares that best explain its runs under the products' factors,
    by Gauss-Newton in log-time (least squares, then Huber), its profile's shares the prior."""
    known = {(p, kind) for kind, products in factors.measured.items() for p in products}
    m, c, idle = _terms(group[0], catalog, factors.memory, factors.compute, prior)
    current = (group[0].seconds / (max(m, c) + idle), *prior)
    for step in range(2 * REFIT_STEPS):
        delta = math.inf if step < REFIT_STEPS else HUBER_DELTA
        updated = _refit_step(
            group,
            prior=prior,
            current=current,
            catalog=catalog,
            memory=factors.memory,
            compute=factors.compute,
            delta=delta,
            known=known,
        )
        moved = max(abs(math.log(a / b)) for a, b in zip(updated, current, strict=True))
        current = updated
        if moved < 1e-9 and delta != math.inf:
            break
    return current[1], current[2]


def _profiled_factor(
    group: Sequence[Sample], shares: tuple[float, float], kind: str, catalog: Catalog, factors: _Factors
) -> float | None:
    """The factor for ``kind`` of the product a workload was profiled on, that best explains its runs
    on products whose figures are measured (its profile's shares are of that product's real figures,
    so the ratios between its runs elsewhere say how far the product's figure is off), or None
    when no such run is clearly bound by ``kind``. A golden-section search in log-factor of the
    Huber loss, the workload's scale the Huber location at each trial."""
    profiled = group[0].profiled
    known = {(p, k) for k, products in factors.measured.items() for p in products}
    clear = []
    for s in group:
        m, c, _ = _terms(s, catalog, factors.memory, factors.compute, shares)
        bound = "memory" if m >= c else "compute"
        if s.product == profiled or (s.product, bound) in known:
            clear.append(s)
    if not any(s.product != profiled for s in clear):
        return None
    trial = {"memory": dict(factors.memory), "compute": dict(factors.compute)}

    def loss(log_factor: float) -> float:
        trial[kind][profiled] = math.exp(log_factor)
        logs, weights = [], []
        for s in clear:
            m, c, idle = _terms(s, catalog, trial["memory"], trial["compute"], shares)
            logs.append(math.log(s.seconds / (max(m, c) + idle)))
            weights.append(float(s.runs))
        centre = huber_location(logs, weights)
        return sum(w * _huber(x - centre) for x, w in zip(logs, weights, strict=True))

    low, high = -FACTOR_RANGE, FACTOR_RANGE
    ratio = (math.sqrt(5) - 1) / 2
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    fa, fb = loss(a), loss(b)
    while high - low > 1e-5:
        if fa <= fb:
            high, b, fb = b, a, fa
            a = high - ratio * (high - low)
            fa = loss(a)
        else:
            low, a, fa = a, b, fb
            b = low + ratio * (high - low)
            fb = loss(b)
    return math.exp((low + high) / 2)


def _huber(x: float, delta: float = HUBER_DELTA) -> float:
    return x * x / 2 if abs(x) <= delta else delta * (abs(x) - delta / 2)


def fit_calibration(samples: Sequence[Sample], catalog: Catalog, *, updated_at: str = "") -> Calibration:
    """The factors per product, and the shares per workload, that best explain the samples (module
    docstring, docs/ranking.md "Re-fitted shares"). Only workloads seen on at least two products
    say anything about products' ratios; the others are left out.

    1. the factors, each workload read with its profile's shares;
    2. each workload's shares re-fitted from its runs under those factors (the profile the prior);
    3. a product that no run measured (workloads were only profiled there): its factor for a
       resource is the robust mean of what each workload profiled there says, the factor that best
       explains its runs on measured products (its profile measured shares of that product's real
       figures); with those held, 1 and 2 again.
    """
    products_of: dict[str, set[str]] = {}
    for s in samples:
        products_of.setdefault(s.workload, set()).add(s.product)
    used = [s for s in samples if len(products_of[s.workload]) >= 2]
    by_workload: dict[str, list[Sample]] = {}
    for s in used:
        by_workload.setdefault(s.workload, []).append(s)
    prior = {
        w: (min(MAX_SHARE, max(MIN_SHARE, g[0].sm)), min(MAX_SHARE, max(MIN_SHARE, g[0].mem)))
        for w, g in by_workload.items()
    }
    factors = _fit_factors(used, catalog, prior, {})
    shares = {w: _refit_shares(g, prior[w], catalog, factors) for w, g in by_workload.items()}
    profile_votes: Votes = {"memory": {}, "compute": {}}
    for workload, group in by_workload.items():
        profiled = group[0].profiled
        elsewhere = sum(s.runs for s in group if s.product != profiled)
        for kind in _bounds(group, prior[workload], catalog, factors):
            if profiled in factors.measured[kind]:
                continue
            value = _profiled_factor(group, prior[workload], kind, catalog, factors)
            if value is not None:
                weight = dataclasses.replace(group[0], product=profiled, runs=elsewhere)
                profile_votes[kind].setdefault(profiled, []).append((value, weight))
    reference = factors
    fixed = {
        kind: {
            product: math.exp(huber_location([math.log(f) for f, _ in cast], [s.runs for _, s in cast]))
            for product, cast in by_product.items()
            if len({s.workload for _, s in cast}) >= 2  # one workload's idle share is too little to go on
        }
        for kind, by_product in profile_votes.items()
    }
    if any(fixed.values()):
        # the products' factors stay those of step 1: a held factor rests on the idle shares of a
        # few workloads (ill-conditioned), so it reads only those workloads' own shares
        held = _Factors(
            {**factors.memory, **fixed["memory"]},
            {**factors.compute, **fixed["compute"]},
            factors.votes,
            {k: factors.measured[k] | set(fixed[k]) for k in factors.measured},
        )
        held_products = set(fixed["memory"]) | set(fixed["compute"])
        shares = {
            w: _refit_shares(g, prior[w], catalog, held) if g[0].profiled in held_products else shares[w]
            for w, g in by_workload.items()
        }
        reference = held
    names = {s.product for s in used} | {s.profiled for s in used}
    result: dict[str, ProductCalibration] = {}
    for product in sorted(names):
        # a factor rests on the runs that voted for it here, and on this product's own runs of the
        # workloads profiled on it whose votes elsewhere are ratios to it. A factor step 3 held
        # rests on no run on its product: it never qualifies the product, it only reads the shares
        # of the workloads profiled there (docs/ranking.md "Re-fitted shares")
        here = {s.workload: s for s in used if s.product == product}
        support = {}
        for kind in ("memory", "compute"):
            mine = [s for _, s in factors.votes[kind].get(product, [])]
            anchored = {
                s.workload
                for voted in factors.votes[kind].values()
                for _, s in voted
                if s.profiled == product and s.workload in here
            }
            runs = sum(s.runs for s in mine) + sum(here[w].runs for w in anchored)
            support[kind] = FactorSupport(
                round(factors.of(kind)[product], DIGITS), runs, len({s.workload for s in mine} | anchored)
            )
        result[product] = ProductCalibration(
            product=product, memory=support["memory"], compute=support["compute"], updated_at=updated_at
        )
    workloads: dict[str, WorkloadShares] = {}
    for workload, group in sorted(by_workload.items()):
        entry = catalog.placement(group[0].profiled)
        assert entry is not None, "samples_of keeps catalog products only"
        sm, mem = shares[workload]
        workloads[workload] = WorkloadShares(
            workload=workload,
            profiled=entry.product,
            sm=round(sm, DIGITS + 2),
            mem=round(mem, DIGITS + 2),
            fp32_tflops=round(entry.sustained_fp32_tflops / reference.compute[entry.product], DIGITS),
            bandwidth_gbs=round(entry.sustained_bandwidth_gbs / reference.memory[entry.product], DIGITS),
            runs=sum(s.runs for s in group),
            products=len(group),
            updated_at=updated_at,
        )
    return Calibration(result, workloads)
