"""The calibration fit (DESIGN "Learning the cluster's GPUs"): per GPU product, by how much the ranking
model's time on each unit (tensor, FP32, FP64, memory) must be scaled to match what really ran on
this cluster.

Pure: ``fit_calibration(samples, catalog) -> Calibration``. docs/ranking.md "Calibration" gives the
model and the estimator. In short: a product P's calibrated sustained figures are the catalog's
divided by its factors (``memoryTimeFactor`` 1.25: memory-bound work takes 25 % longer there than
the catalog says). Each (workload, product) observation is one sample: its mean seconds, its run
count, and the workload's profile (its time shares by unit, or for a profile written before the
units model its SM and memory shares, on the product it was profiled on). A sample with time shares
is modelled as the ranking does, the sum over units of share x figure ratio plus the latency share;
one without them as before, the larger of its FP32 and memory terms plus its idle share. The fit
alternates two robust steps: each workload's runtime scale is a robust mean (Huber's, in log-time)
of its samples' observed/modelled times, and each product's factor per unit is the robust mean of
what its samples imply for the unit that clearly bounds them (its term at least ``DOMINANT`` times
every other's). A run on a throttled node or
beside a noisy neighbour inflates one sample's mean; the Huber weights let it move a factor by only
a few percent, where a least-squares fit would be pulled by its whole share. Observations fix only
ratios between products, so the factors are anchored to a geometric mean of 1; a factor that
nothing measured stays at 1, the catalog's figure.

The same pass then re-fits each workload's shares (per unit, or SM and memory) from its runs (the profile's
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

import numpy as np
from numpy.typing import NDArray

from kratos_admit.domain.vocabulary import Unit
from kratos_admit.model.calibration import (
    DIGITS,
    DOMINANT,
    FACTOR_UNITS,
    HUBER_DELTA,
    PRIOR_RUNS,
    Calibration,
    FactorSupport,
    ProductCalibration,
    Sample,
    WorkloadShares,
)
from kratos_admit.model.calibration_links import fit_links
from kratos_admit.model.catalog import Catalog
from kratos_admit.model.robust import ROUNDS, huber_location, huber_locations

# re-fitted shares (docs/ranking.md "Re-fitted shares"): the profile's measured shares are a prior
# worth PRIOR_RUNS runs; a step moves a share by at most this much in log; a share stays in (0, 1]
MAX_STEP = 0.25
MIN_SHARE, MAX_SHARE = 0.005, 1.0
FACTOR_RANGE = math.log(2)  # a held factor is searched within 1/2..2 times the catalog's
REFIT_STEPS = 25  # Gauss-Newton steps of least squares, then as many of Huber


Shares = dict[Unit, float]  # a workload's shares of the scaled units (latency: the rest)
Factors = dict[Unit, dict[str, float]]  # by unit, by product


def profile_shares_of(s: Sample) -> Shares:
    """The sample's profile shares: its time shares by unit, or (a profile written before the units
    model) its SM throughput as FP32's and its memory throughput as memory's."""
    if s.shares:
        return dict(s.shares)
    return {"fp32": s.sm, "memory": s.mem}


def _idle(s: Sample, shares: Shares) -> float:
    """The share of the run no figure scales: the latency share (what the units leave of 1), or for
    a profile by throughputs 1 less the busier one."""
    if s.shares:
        return max(0.0, 1.0 - sum(shares.values()))
    return 1 - max(shares.values())


def _terms(
    s: Sample, catalog: Catalog, factors: Factors, shares: Shares | None = None
) -> tuple[Shares, float]:
    """Each unit's term of the sample's runtime relative to its profiled product, and the idle share,
    read with the workload's ``shares`` where they were re-fitted, else its profile's."""
    shares = shares if shares is not None else profile_shares_of(s)
    ratios = _ratios(catalog, s.product, s.profiled)
    terms = {
        unit: share * ratios[unit] * factors[unit][s.product] / factors[unit][s.profiled]
        for unit, share in shares.items()
    }
    return terms, _idle(s, shares)


def _modelled(s: Sample, terms: Shares, idle: float) -> float:
    """The model's relative time: the sum of the terms (units model), or the larger of the two (a
    profile by throughputs, the roofline it was measured for), plus the idle share."""
    return (sum(terms.values()) if s.shares else max(terms.values())) + idle


def _bound(terms: Shares) -> Unit:
    """The unit with the largest term (memory first on a tie, as the two-resource fit had it)."""
    return max(terms, key=lambda unit: (terms[unit], unit == "memory"))


def _clear(s: Sample, terms: Shares, idle: float) -> bool:
    """Whether one unit clearly bounds the run: its term at least DOMINANT times every other unit's
    and, for a sample with time shares, the latency share's too (a run mostly spent in latency says
    little of any figure: a 5 % error in its time would move the figure by half). A profile by
    throughputs is read as before, by its two terms."""
    top = _bound(terms)
    others = [t for unit, t in terms.items() if unit != top]
    if s.shares:
        others.append(idle)
    return all(terms[top] >= DOMINANT * t for t in others)


@functools.lru_cache(maxsize=1024)
def _ratios(catalog: Catalog, product: str, profiled: str) -> dict[Unit, float]:
    """Each unit's sustained figure of the profiled product over the run's: fixed per pair, and
    _terms is the fit's inner loop (a refit read them about a million times for 480 runs). A catalog
    is not changed once loaded, and is hashed by identity."""
    here, there = catalog.placement(product), catalog.placement(profiled)
    assert here is not None and there is not None, "samples_of keeps catalog products only"
    found: dict[Unit, float] = {}
    for unit in FACTOR_UNITS:
        a, b = there.sustained(unit), here.sustained(unit)
        assert a is not None and b is not None
        found[unit] = a / b
    return found


def _references(votes: Mapping[str, list[tuple[float, Sample]]], ran: set[tuple[str, str]]) -> set[str]:
    """The products whose factor the votes are ratios to: the profiled product of each voting
    workload that also ran there (``ran``: by workload, the products; that run set the workload's
    scale). A workload that never ran on the product it was profiled on measures nothing there."""
    return {s.profiled for cast in votes.values() for _, s in cast if (s.workload, s.profiled) in ran}


def _anchor(factors: dict[str, float], voted: set[str], known: set[str], measured: frozenset[str]) -> None:
    """Divide the known factors by one geometric mean: the same divisor for all, so no ratio between
    them changes. Where the fit measured a product of the catalog's measured ground (``measured``: every
    figure of it a cited measurement), the mean of those: they keep their measured figures, and every
    calibrated figure is on their scale (issue 52: measured ground anchors a profile's conversion).
    Else the mean of those the samples voted on: the calibrated products keep the catalog's figures
    on average. A factor nothing measured
    (neither voted on nor the reference of a workload's votes) is unknown: it stays at the catalog's
    figure, 1. Rescaling it with the others would let it drift without bound, and drag with it the
    votes of the workloads profiled on its product."""
    ground = measured & known
    by = ground or voted
    mean = math.exp(sum(math.log(factors[p]) for p in by) / len(by)) if by else 1.0
    for p, value in factors.items():
        factors[p] = value / mean if p in known else 1.0


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """The solution of a small linear system (Gaussian elimination, partial pivoting); None if singular."""
    n = len(b)
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _gradient(s: Sample, shares: Shares, terms: Shares, modelled: float) -> list[float]:
    """d log(model) / d log(share) for each of the workload's units, in ``shares``' order. Units
    model: each term, less the share itself while a latency share remains (it takes that time from
    latency). By throughputs: the larger term's share moves the roofline, the busier share the idle."""
    if s.shares:
        busy = sum(shares.values()) < 1.0
        return [(terms[u] - (shares[u] if busy else 0.0)) / modelled for u in shares]
    top, busiest = _bound(terms), max(shares, key=lambda u: (shares[u], u == "memory"))
    return [
        ((terms[u] if u == top else 0.0) - (shares[u] if u == busiest else 0.0)) / modelled for u in shares
    ]


def _refit_step(
    group: Sequence[Sample],
    *,
    prior: Shares,
    current: tuple[float, Shares],
    catalog: Catalog,
    factors: Factors,
    delta: float,
    known: set[tuple[str, Unit]],
) -> tuple[float, Shares]:
    """One damped Gauss-Newton step of a workload's (scale, shares) towards the runtimes its runs
    took, in log-time, each sample weighted by its runs (and Huber's weight), the profile's shares a
    prior worth ``PRIOR_RUNS`` runs (docs/ranking.md "Re-fitted shares")."""
    scale, shares = current
    units = list(shares)
    rows: list[tuple[list[float], float, float]] = []  # (gradient of log model, residual, weight)
    for s in group:
        terms, idle = _terms(s, catalog, factors, shares)
        if s.product != s.profiled and (s.product, _bound(terms)) not in known:
            continue  # a run on a product whose figure for what bounds it nothing measured
        modelled = _modelled(s, terms, idle)
        if modelled <= 0:
            continue
        residual = math.log(s.seconds / (scale * modelled))
        weight = s.runs * (1.0 if delta == math.inf else min(1.0, delta / max(abs(residual), 1e-12)))
        rows.append(([1.0, *_gradient(s, shares, terms, modelled)], residual, weight))
    for i, unit in enumerate(units):
        row = [0.0] * (len(units) + 1)
        row[i + 1] = 1.0
        rows.append((row, math.log(prior[unit] / shares[unit]), PRIOR_RUNS))
    size = len(units) + 1
    normal = [
        [sum(w * g[i] * g[j] for g, _, w in rows) + (1e-9 if i == j else 0.0) for j in range(size)]
        for i in range(size)
    ]
    rhs = [sum(w * g[i] * r for g, r, w in rows) for i in range(size)]
    step = _solve(normal, rhs)
    if step is None:
        return current
    step = [max(-MAX_STEP, min(MAX_STEP, x)) for x in step]
    return scale * math.exp(step[0]), {
        unit: min(MAX_SHARE, max(MIN_SHARE, shares[unit] * math.exp(x)))
        for unit, x in zip(units, step[1:], strict=True)
    }


def _bounds(group: Sequence[Sample], shares: Shares, catalog: Catalog, factors: _Factors) -> set[Unit]:
    """The units that clearly bound at least one of a workload's samples (its runs measure that share)."""
    found: set[Unit] = set()
    for s in group:
        terms, idle = _terms(s, catalog, factors.by_unit, shares)
        if _clear(s, terms, idle):
            found.add(_bound(terms))
    return found


Votes = dict[Unit, dict[str, list[tuple[float, Sample]]]]  # by unit, by product: (factor, sample)


@dataclass
class _Factors:
    by_unit: Factors
    votes: Votes
    measured: dict[Unit, set[str]]  # by unit: the products the last round's votes measured
    rounds: int = 0  # the rounds the fit took (ROUNDS at most)

    def of(self, unit: Unit) -> dict[str, float]:
        return self.by_unit[unit]

    def published(self) -> _Factors:
        """The factors as calibration.json publishes them (rounded to DIGITS): what the shares are
        re-fitted against, so a factor's move below its last digit re-fits no workload's shares."""
        by_unit = {u: {p: round(f, DIGITS) for p, f in by.items()} for u, by in self.by_unit.items()}
        return _Factors(by_unit, self.votes, self.measured)


@dataclass
class FitMemo:
    """What one fit leaves for the next (issue 59, incremental calibration): each workload's
    re-fitted shares, the units that clearly bound its runs, and its profiled-product factors by
    everything they read (its samples, its prior, the published factors and measured sets of its
    products), so a fit re-fits only the workloads
    whose samples changed or whose products' published factors moved. The products' factors are one
    alternating fit over all samples (any run on a product moves its factor; started elsewhere than
    the catalog's figures, an under-determined fit settles elsewhere: started from the last fit's
    factors, 188 of the example trace's 240 refits differed from a fit from nothing, the A100's memory
    factor 0.67 against 0.73 at one), so they are fitted whole each time. Valid for one catalog:
    another starts over (``fit_calibration``)."""

    catalog: Catalog | None = None
    shares: dict[tuple[object, ...], Shares] = dataclasses.field(default_factory=dict)
    profiled: dict[tuple[object, ...], float | None] = dataclasses.field(default_factory=dict)
    bounds: dict[tuple[object, ...], frozenset[Unit]] = dataclasses.field(default_factory=dict)
    refits: int = 0  # workloads whose shares the last fit re-fitted (not found in the memo)


def _read_key(
    group: Sequence[Sample],
    prior: Shares,
    factors: _Factors,
    shared: dict[tuple[str, ...], tuple[object, ...]] | None = None,
) -> tuple[object, ...]:
    """Everything a workload's share re-fit reads: its samples, its prior, and the published factors
    and measured sets of the products it ran or was profiled on. ``shared``: the factors' part by
    product set, made once per fit and shared by every workload on the same products (at 20,000
    workloads on three products one tuple, not 20,000 of 12 tuples each: 25 MiB a set of keys)."""
    names = tuple(sorted({s.product for s in group} | {s.profiled for s in group}))
    read = shared.get(names) if shared is not None else None
    if read is None:
        read = tuple(
            (u, p, factors.by_unit[u].get(p, 1.0), p in factors.measured[u])
            for u in FACTOR_UNITS
            for p in names
        )
        if shared is not None:
            shared[names] = read
    return (tuple(group), tuple(sorted(prior.items())), read)


SETTLING = 1e-3  # the factors are near their fit: a sample's clearness that changes now is at the edge
SETTLING_ROUNDS = 10  # or this many rounds have passed (a cycle wider than SETTLING never comes near)
SETTLED = 1e-9  # a round that moves no factor by more than this (in log) ends a phase of the fit
MEMORY = FACTOR_UNITS.index("memory")


@dataclass(frozen=True)
class _Rows:
    """The samples as arrays, one row a sample, one column a unit of FACTOR_UNITS: the parts of their
    terms no factor moves (the share x the catalog's figure ratio, 0 for a unit the workload's shares
    do not name, which adds nothing to a sum and bounds nothing), built once per fit."""

    samples: Sequence[Sample]
    products: list[str]  # the index of a product in the arrays
    workload: NDArray[np.intp]  # each row's workload (rows of one workload in their given order)
    workloads: int
    product: NDArray[np.intp]
    profiled: NDArray[np.intp]
    bases: NDArray[np.float64]  # rows x units
    idle: NDArray[np.float64]
    seconds: NDArray[np.float64]
    runs: NDArray[np.float64]
    units_model: NDArray[np.bool_]  # time shares (terms summed) or a profile by throughputs (the larger)
    own: NDArray[np.bool_]  # the run on the workload's profiled product
    reference: NDArray[np.bool_]  # the workload ran on its profiled product: its votes are ratios to it


def _rows(used: Sequence[Sample], catalog: Catalog, shares: Mapping[str, Shares]) -> _Rows:
    products = sorted({s.product for s in used} | {s.profiled for s in used})
    index = {p: i for i, p in enumerate(products)}
    order: dict[str, int] = {}
    for s in used:
        order.setdefault(s.workload, len(order))
    # rows grouped by workload, each workload's in the order given: the sums of a group run as the
    # scalar fit's did over its lists
    ordered = sorted(used, key=lambda s: order[s.workload])
    workload = np.array([order[s.workload] for s in ordered], dtype=np.intp)
    product = np.array([index[s.product] for s in ordered], dtype=np.intp)
    profiled = np.array([index[s.profiled] for s in ordered], dtype=np.intp)
    # the bases are share x ratio, one product of two floats each: the workload's shares by unit (0
    # for a unit it does not name) times the pair of products' figure ratios, both tabled once
    column = {unit: u for u, unit in enumerate(FACTOR_UNITS)}
    by_workload = np.zeros((len(order), len(FACTOR_UNITS)))
    idle_of = np.zeros(len(order))
    firsts: dict[str, Sample] = {}
    for s in ordered:
        firsts.setdefault(s.workload, s)
    for name, w in order.items():
        read = shares[name]
        for unit, share in read.items():
            by_workload[w, column[unit]] = share
        idle_of[w] = _idle(firsts[name], read)  # one profile, one model: the same for all its samples
    ratio = np.zeros((len(products), len(products), len(FACTOR_UNITS)))
    for p, q in {(s.product, s.profiled) for s in ordered}:
        ratios = _ratios(catalog, p, q)
        ratio[index[p], index[q]] = [ratios[unit] for unit in FACTOR_UNITS]
    bases = by_workload[workload] * ratio[product, profiled]
    idle = idle_of[workload]
    ran = {(s.workload, s.product) for s in ordered}
    return _Rows(
        samples=ordered,
        products=products,
        workload=workload,
        workloads=len(order),
        product=product,
        profiled=profiled,
        bases=bases,
        idle=idle,
        seconds=np.array([s.seconds for s in ordered], dtype=np.float64),
        runs=np.array([float(s.runs) for s in ordered], dtype=np.float64),
        units_model=np.array([bool(s.shares) for s in ordered], dtype=np.bool_),
        own=np.array([s.product == s.profiled for s in ordered], dtype=np.bool_),
        reference=np.array([(s.workload, s.profiled) in ran for s in ordered], dtype=np.bool_),
    )


def _read_terms(rows: _Rows, factors: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each row's terms under ``factors`` (units x products): ``_terms``'s formula on the bases."""
    return rows.bases * factors[:, rows.product].T / factors[:, rows.profiled].T


def _row_sums(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each row's values added column by column, left to right: what ``sum`` over a dict of them in
    that order gives, float for float (numpy's own sum may pair them otherwise)."""
    total = values[:, 0]
    for column in range(1, values.shape[1]):
        total = total + values[:, column]
    return total


def _bound_of(terms: NDArray[np.float64], memory: int = MEMORY) -> NDArray[np.intp]:
    """``_bound`` per row: the column with the largest term, ``memory``'s first on a tie (-1: no
    memory column), else the first."""
    first: NDArray[np.intp] = np.argmax(terms, axis=1).astype(np.intp)
    if memory < 0:
        return first
    return np.where(terms[:, memory] == terms.max(axis=1), memory, first).astype(np.intp)


def _clear_of(rows: _Rows, terms: NDArray[np.float64], bound: NDArray[np.intp]) -> NDArray[np.bool_]:
    """``_clear`` per row: the bounding unit's term at least DOMINANT times every other's (and the
    idle share's, for time shares)."""
    at = np.arange(len(bound))
    top = terms[at, bound]
    others = terms.copy()
    others[at, bound] = -np.inf
    rival = np.maximum(others.max(axis=1), np.where(rows.units_model, rows.idle, -np.inf))
    return np.asarray(top >= DOMINANT * rival)


def _modelled_of(rows: _Rows, terms: NDArray[np.float64]) -> NDArray[np.float64]:
    """``_modelled`` per row: the terms summed in unit order (or the larger, by throughputs), plus idle."""
    return np.where(rows.units_model, _row_sums(terms), terms.max(axis=1)) + rows.idle


def _fit_factors(
    used: Sequence[Sample],
    catalog: Catalog,
    shares: Mapping[str, Shares],
    fixed: Mapping[Unit, Mapping[str, float]],
) -> _Factors:
    """Each product's factors from the runs, the workloads read with ``shares``; a factor in
    ``fixed`` (by unit, by product) is held at that value (known, but not voted on).

    Least-squares rounds until no factor moves (at most ROUNDS // 2), then Huber rounds until none
    moves. Which samples are clearly bound, and by which unit, is read afresh in each least-squares
    round and held through the Huber rounds: read afresh there, a sample at the DOMINANT edge voted
    in one round and not the next, and the factors went round a cycle of two (0.1 % apart at 1,000
    workloads) until the last round, so the result was the parity of ROUNDS and each fit ran all of
    them. Each round's terms are computed once and read by both of its steps, for every sample at
    once (numpy arrays: 21 s of a core at 20,000 workloads when it went sample by sample)."""
    rows = _rows(used, catalog, shares)
    names, units = rows.products, len(FACTOR_UNITS)
    pinned = np.ones((units, len(names)))
    held = np.zeros((units, len(names)), dtype=np.bool_)
    for u, unit in enumerate(FACTOR_UNITS):
        for product, value in fixed.get(unit, {}).items():
            pinned[u, names.index(product)] = value
            held[u, names.index(product)] = True
    factors = pinned.copy()
    # the catalog's measured ground (every figure a cited measurement: the H100 80GB HBM3 today), which
    # anchors each unit's factors where the fit measured it
    ground = np.array([catalog.measured_ground(p) for p in names], dtype=np.bool_)
    # the factors some round measured (voted on, or the reference of votes): the others stay 1
    known = held.copy()
    n = len(rows.samples)
    clear = np.zeros(n, dtype=np.bool_)
    bound = np.full(n, MEMORY, dtype=np.intp)
    flips = np.zeros(n, dtype=np.intp)
    voted = np.zeros((units, len(names)), dtype=np.bool_)
    voting = np.zeros(n, dtype=np.bool_)
    votes = np.ones(n)
    huber = settling = False
    round_ = 0
    for round_ in range(ROUNDS):
        delta = HUBER_DELTA if huber else math.inf
        terms = _read_terms(rows, factors)
        if not huber:
            now = _clear_of(rows, terms, bound := _bound_of(terms))
            if settling:
                flips += now != clear
            clear = now & (flips < 2)
        # the scale comes from the samples the model reads clearly: the run on the profiled product
        # (which the model predicts exactly), and runs clearly bound by one unit
        reads = rows.own | clear
        modelled = _modelled_of(rows, terms)
        logs = np.log(rows.seconds[reads] / modelled[reads])
        scales = np.exp(
            huber_locations(logs, rows.runs[reads], rows.workload[reads], rows.workloads, delta=delta)
        )
        scale = scales[rows.workload]
        at = np.arange(n)
        mine = terms[at, bound]
        # the units model adds the other units' time; the roofline of a profile by throughputs does not
        rest = terms.copy()
        rest[at, bound] = 0.0
        rest[~rows.units_model] = 0.0
        others = _row_sums(rest)
        busy = rows.seconds / scale - rows.idle - others  # nan where the workload has no scale
        # a run on its own profiled product sets the scale, not a ratio; a run no unit clearly bounds
        # could explain either factor
        voting = ~rows.own & clear & ~np.isnan(scale) & (busy > 0) & ~held[bound, rows.product]
        votes = factors[bound, rows.product] * busy / np.where(voting, mine, 1.0)
        group = bound * len(names) + rows.product
        before = factors.copy()
        located = huber_locations(
            np.log(votes[voting]), rows.runs[voting], group[voting], units * len(names), delta=delta
        ).reshape(units, len(names))
        voted = ~np.isnan(located)
        factors = np.where(voted, np.exp(located), factors)
        factors = np.where(held, pinned, factors)
        referenced = np.zeros((units, len(names)), dtype=np.bool_)
        referenced[bound[voting & rows.reference], rows.profiled[voting & rows.reference]] = True
        known |= voted | referenced
        factors = _anchored(factors, voted, known, ground)
        # measured after the anchor: a vote's move the anchor takes back is no move
        moved = float(np.abs(np.log(factors / before)).max()) if factors.size else 0.0
        settling = settling or moved < SETTLING or round_ + 1 >= SETTLING_ROUNDS
        if moved < SETTLED or (not huber and round_ == ROUNDS // 2 - 1):
            if huber:
                break
            huber = True
    cast: Votes = {unit: {} for unit in FACTOR_UNITS}
    for i in np.flatnonzero(voting).tolist():
        cast[FACTOR_UNITS[bound[i]]].setdefault(names[rows.product[i]], []).append(
            (float(votes[i]), rows.samples[i])
        )
    measured = {
        unit: {names[p] for p in np.flatnonzero(voted[u] | referenced[u] | held[u])}
        for u, unit in enumerate(FACTOR_UNITS)
    }
    by_unit = {
        unit: {p: float(factors[u, i]) for i, p in enumerate(names)} for u, unit in enumerate(FACTOR_UNITS)
    }
    return _Factors(by_unit, cast, measured, round_ + 1)


def _anchored(
    factors: NDArray[np.float64],
    voted: NDArray[np.bool_],
    known: NDArray[np.bool_],
    ground: NDArray[np.bool_],
) -> NDArray[np.float64]:
    """``_anchor`` for every unit (a row of ``factors`` each): the known factors divided by one
    geometric mean, that of the measured ground where the fit measured it, else of those voted on;
    an unknown factor stays 1."""
    on_ground = ground & known
    by = np.where(on_ground.any(axis=1, keepdims=True), on_ground, voted)
    count = by.sum(axis=1, keepdims=True)
    logs = np.where(by, np.log(factors), 0.0).sum(axis=1, keepdims=True)
    mean = np.exp(logs / np.maximum(count, 1))
    return np.where(known, factors / mean, 1.0)


def _refit_shares(group: Sequence[Sample], prior: Shares, catalog: Catalog, factors: _Factors) -> Shares:
    """A workload's shares that best explain its runs under the products' factors, by Gauss-Newton in
    log-time (least squares, then Huber), its profile's shares the prior."""
    known = {(p, unit) for unit, products in factors.measured.items() for p in products}
    terms, idle = _terms(group[0], catalog, factors.by_unit, prior)
    current = (group[0].seconds / _modelled(group[0], terms, idle), dict(prior))
    for step in range(2 * REFIT_STEPS):
        delta = math.inf if step < REFIT_STEPS else HUBER_DELTA
        updated = _refit_step(
            group,
            prior=prior,
            current=current,
            catalog=catalog,
            factors=factors.by_unit,
            delta=delta,
            known=known,
        )
        moved = max(
            abs(math.log(updated[0] / current[0])),
            *(abs(math.log(updated[1][u] / current[1][u])) for u in prior),
        )
        current = updated
        if moved < 1e-9 and delta != math.inf:
            break
    return current[1]


BATCH_FROM = 64  # workloads to re-fit: from this many, ``_refit_many`` steps them together over arrays


def _refit_many(
    items: Sequence[tuple[Sequence[Sample], Shares]], catalog: Catalog, factors: _Factors
) -> list[Shares]:
    """``_refit_shares`` of each (group, prior): workload by workload for a few, else together over
    numpy arrays, workloads with the same units (and the same model of them) in one batch. A batch
    makes each workload's floating-point operations in the scalar function's order (its rows' sums
    in their order, the same elimination with partial pivoting), so each result is the same floats."""
    if len(items) < BATCH_FROM:
        return [_refit_shares(group, prior, catalog, factors) for group, prior in items]
    found: list[Shares | None] = [None] * len(items)
    batches: dict[tuple[tuple[Unit, ...], bool], list[int]] = {}
    for i, (group, prior) in enumerate(items):
        batches.setdefault((tuple(prior), bool(group[0].shares)), []).append(i)
    for (units, units_model), members in batches.items():
        for i, shares in zip(
            members,
            _refit_batch([items[i] for i in members], units, units_model, catalog, factors),
            strict=True,
        ):
            found[i] = shares
    return [s for s in found if s is not None]


def _refit_batch(
    items: Sequence[tuple[Sequence[Sample], Shares]],
    units: tuple[Unit, ...],
    units_model: bool,
    catalog: Catalog,
    factors: _Factors,
) -> list[Shares]:
    """``_refit_shares`` of workloads whose shares name the same ``units``, all at once."""
    k = len(units)
    known = {(p, unit) for unit, products in factors.measured.items() for p in products}
    samples = [s for group, _ in items for s in group]
    owner = np.array([w for w, (group, _) in enumerate(items) for _ in group], dtype=np.intp)
    starts = np.cumsum([0] + [len(group) for group, _ in items[:-1]]).astype(np.intp)
    ratio = np.array([[_ratios(catalog, s.product, s.profiled)[u] for u in units] for s in samples])
    here = np.array([[factors.by_unit[u][s.product] for u in units] for s in samples])
    there = np.array([[factors.by_unit[u][s.profiled] for u in units] for s in samples])
    seconds = np.array([s.seconds for s in samples])
    runs = np.array([float(s.runs) for s in samples])
    own = np.array([s.product == s.profiled for s in samples], dtype=np.bool_)
    # by sample and unit: whether the product's factor for that unit was measured (else a run there
    # bound by it is left out, as nothing measured the figure it would be read with)
    measured = np.array([[(s.product, u) in known for u in units] for s in samples], dtype=np.bool_)
    prior = np.array([[p[u] for u in units] for _, p in items])
    memory = units.index("memory") if "memory" in units else -1

    def read(shares: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Each sample's terms and modelled time under its workload's ``shares`` (``_terms``,
        ``_idle``, ``_modelled``)."""
        mine = shares[owner]
        terms = mine * ratio * here / there
        if units_model:
            return terms, _row_sums(terms) + np.maximum(0.0, 1.0 - _row_sums(mine))
        return terms, terms.max(axis=1) + (1 - mine.max(axis=1))

    shares = prior.copy()
    modelled = read(shares)[1]
    scale = seconds[starts] / modelled[starts]
    active = np.ones(len(items), dtype=np.bool_)
    at_rows = np.arange(len(samples))
    for step in range(2 * REFIT_STEPS):
        if not active.any():
            break
        huber = step >= REFIT_STEPS
        terms, modelled = read(shares)
        kept = (own | measured[at_rows, _bound_of(terms, memory)]) & (modelled > 0) & active[owner]
        with np.errstate(divide="ignore", invalid="ignore"):
            residual = np.log(seconds / (scale[owner] * modelled))
            weight = runs * (
                np.minimum(1.0, HUBER_DELTA / np.maximum(np.abs(residual), 1e-12)) if huber else 1.0
            )
            mine = shares[owner]
            if units_model:
                busy = (_row_sums(mine) < 1.0)[:, None]
                grad = (terms - np.where(busy, mine, 0.0)) / modelled[:, None]
            else:
                top = _bound_of(terms, memory)
                busiest = _bound_of(mine, memory)
                cols = np.arange(k)[None, :]
                grad = (
                    np.where(cols == top[:, None], terms, 0.0) - np.where(cols == busiest[:, None], mine, 0.0)
                ) / modelled[:, None]
        g = np.concatenate([np.ones((len(samples), 1)), grad], axis=1)[kept]
        w, r, who = weight[kept], residual[kept], owner[kept]
        normal = np.zeros((len(items), k + 1, k + 1))
        rhs = np.zeros((len(items), k + 1))
        np.add.at(normal, who, (w[:, None] * g)[:, :, None] * g[:, None, :])
        np.add.at(rhs, who, (w[:, None] * g) * r[:, None])
        with np.errstate(divide="ignore"):
            toward = np.log(prior / shares)
        diagonal = np.arange(1, k + 1)
        normal[:, diagonal, diagonal] += PRIOR_RUNS * 1.0 * 1.0
        rhs[:, 1:] += PRIOR_RUNS * 1.0 * toward
        everywhere = np.arange(k + 1)
        normal[:, everywhere, everywhere] += 1e-9
        solved, singular = _solve_many(normal, rhs)
        moving = active & ~singular
        steps = np.clip(solved, -MAX_STEP, MAX_STEP)
        new_scale = np.where(moving, scale * np.exp(steps[:, 0]), scale)
        new_shares = np.where(
            moving[:, None],
            np.minimum(MAX_SHARE, np.maximum(MIN_SHARE, shares * np.exp(steps[:, 1:]))),
            shares,
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            moved = np.maximum(
                np.abs(np.log(new_scale / scale)), np.abs(np.log(new_shares / shares)).max(axis=1)
            )
        moved = np.where(moving, moved, 0.0)
        scale, shares = new_scale, new_shares
        if huber:
            active &= ~(moved < 1e-9)
    return [{u: float(shares[w, i]) for i, u in enumerate(units)} for w in range(len(items))]


def _solve_many(
    a: NDArray[np.float64], b: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """``_solve`` of each system of a batch (its operations in the same order), and which were
    singular (a pivot below 1e-12: their solutions are not read)."""
    n = b.shape[1]
    m = np.concatenate([a, b[:, :, None]], axis=2)
    singular = np.zeros(len(b), dtype=np.bool_)
    batch = np.arange(len(b))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for col in range(n):
            pivot = col + np.argmax(np.abs(m[:, col:, col]), axis=1)
            singular |= ~(np.abs(m[batch, pivot, col]) >= 1e-12)
            upper, lower = m[batch, col].copy(), m[batch, pivot].copy()
            m[batch, col], m[batch, pivot] = lower, upper
            for r in range(col + 1, n):
                f = m[:, r, col] / m[:, col, col]
                for c in range(col, n + 1):
                    m[:, r, c] = m[:, r, c] - f * m[:, col, c]
        x = np.zeros((len(b), n))
        for r in reversed(range(n)):
            acc = np.zeros(len(b))
            for c in range(r + 1, n):
                acc = acc + m[:, r, c] * x[:, c]
            x[:, r] = (m[:, r, n] - acc) / m[:, r, r]
    return x, singular


def _profiled_factor(
    group: Sequence[Sample], shares: Shares, unit: Unit, catalog: Catalog, factors: _Factors
) -> float | None:
    """The factor for ``unit`` of the product a workload was profiled on, that best explains its runs
    on products whose figures are measured (its profile's shares are of that product's real figures,
    so the ratios between its runs elsewhere say how far the product's figure is off), or None
    when no such run is clearly bound by ``unit``. A golden-section search in log-factor of the
    Huber loss, the workload's scale the Huber location at each trial."""
    profiled = group[0].profiled
    known = {(p, u) for u, products in factors.measured.items() for p in products}
    clear = []
    for s in group:
        terms, _ = _terms(s, catalog, factors.by_unit, shares)
        if s.product == profiled or (s.product, _bound(terms)) in known:
            clear.append(s)
    if not any(s.product != profiled for s in clear):
        return None
    trial: Factors = {u: dict(f) for u, f in factors.by_unit.items()}

    def loss(log_factor: float) -> float:
        trial[unit][profiled] = math.exp(log_factor)
        logs, weights = [], []
        for s in clear:
            terms, idle = _terms(s, catalog, trial, shares)
            logs.append(math.log(s.seconds / _modelled(s, terms, idle)))
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


def fit_calibration(
    samples: Sequence[Sample], catalog: Catalog, *, updated_at: str = "", memo: FitMemo | None = None
) -> Calibration:
    """The factors per product and unit, and the shares per workload, that best explain the samples
    (module docstring, docs/ranking.md "Re-fitted shares"). Only workloads seen on at least two
    products say anything about products' ratios; the others are left out.

    1. the factors, each workload read with its profile's shares;
    2. each workload's shares re-fitted from its runs under those factors (the profile the prior);
    3. a product that no run measured (workloads were only profiled there): its factor for a unit
       is the robust mean of what each workload profiled there says, the factor that best explains
       its runs on measured products (its profile measured shares of that product's real figures);
       with those held, 2 again;
    4. each link's factor, from the gangs' samples, the units' factors of step 1 held.

    Steps 2 and 3 read the factors as published (rounded). With ``memo`` (the previous fit's), they
    re-fit only the workloads whose samples or read factors changed: the result is the same as a fit
    without it (tests/test_calibration_incremental.py).
    """
    products_of: dict[str, set[str]] = {}
    for s in samples:
        products_of.setdefault(s.workload, set()).add(s.product)
    both = [s for s in samples if len(products_of[s.workload]) >= 2]
    # a gang's samples with an interconnect share measure its links (calibration_links.py), not units
    used = [s for s in both if not s.interconnect]
    by_workload: dict[str, list[Sample]] = {}
    for s in used:
        by_workload.setdefault(s.workload, []).append(s)
    prior = {
        w: {u: min(MAX_SHARE, max(MIN_SHARE, x)) for u, x in profile_shares_of(g[0]).items()}
        for w, g in by_workload.items()
    }
    warm = memo is not None and memo.catalog is catalog
    memo = memo if memo is not None else FitMemo()
    if not warm:
        memo.shares, memo.profiled, memo.bounds = {}, {}, {}
    seen_shares: dict[tuple[object, ...], Shares] = {}
    seen_profiled: dict[tuple[object, ...], float | None] = {}
    seen_bounds: dict[tuple[object, ...], frozenset[Unit]] = {}
    memo.refits = 0

    def refit(keys: Mapping[str, tuple[object, ...]], at: _Factors) -> dict[str, Shares]:
        """The re-fitted shares of the workloads ``keys`` names (each with its ``_read_key`` at
        ``at``): from the memo where it holds them, the rest re-fitted together (``_refit_many``)."""
        missing: dict[tuple[object, ...], str] = {}
        for w, key in keys.items():
            if key not in memo.shares and key not in seen_shares:
                missing.setdefault(key, w)
        fitted = dict(
            zip(
                missing,
                _refit_many([(by_workload[w], prior[w]) for w in missing.values()], catalog, at),
                strict=True,
            )
        )
        found: dict[str, Shares] = {}
        for w, key in keys.items():
            shares = memo.shares.get(key)
            if shares is None:
                shares = seen_shares.get(key) or fitted[key]
                memo.refits += 1
            seen_shares[key] = found[w] = shares
        return found

    factors = _fit_factors(used, catalog, prior, {})
    published = factors.published()
    # each workload's read key at the published factors: the memo's key for its shares and its bounds
    by_products: dict[tuple[str, ...], tuple[object, ...]] = {}
    read_keys = {w: _read_key(g, prior[w], published, by_products) for w, g in by_workload.items()}
    shares = refit(read_keys, published)
    profile_votes: Votes = {unit: {} for unit in FACTOR_UNITS}
    for workload, group in by_workload.items():
        profiled = group[0].profiled
        if all(profiled in factors.measured[unit] for unit in FACTOR_UNITS):
            continue  # no factor of its profiled product is left for its runs to say
        elsewhere = sum(s.runs for s in group if s.product != profiled)
        read = read_keys[workload]
        bounds = memo.bounds.get(read, seen_bounds.get(read))
        if bounds is None:
            bounds = frozenset(_bounds(group, prior[workload], catalog, published))
        seen_bounds[read] = bounds
        for unit in sorted(bounds):
            if profiled in factors.measured[unit]:
                continue
            key = (unit, *read)
            if key in memo.profiled or key in seen_profiled:
                value = memo.profiled[key] if key in memo.profiled else seen_profiled[key]
            else:
                value = _profiled_factor(group, prior[workload], unit, catalog, published)
            seen_profiled[key] = value
            if value is not None:
                weight = dataclasses.replace(group[0], product=profiled, runs=elsewhere)
                profile_votes[unit].setdefault(profiled, []).append((value, weight))
    reference = factors
    fixed = {
        unit: {
            product: math.exp(huber_location([math.log(f) for f, _ in cast], [s.runs for _, s in cast]))
            for product, cast in by_product.items()
            if len({s.workload for _, s in cast}) >= 2  # one workload's idle share is too little to go on
        }
        for unit, by_product in profile_votes.items()
    }
    if any(fixed.values()):
        # the products' factors stay those of step 1: a held factor rests on the idle shares of a
        # few workloads (ill-conditioned), so it reads only those workloads' own shares
        held = _Factors(
            {unit: {**published.by_unit[unit], **fixed[unit]} for unit in FACTOR_UNITS},
            factors.votes,
            {u: factors.measured[u] | set(fixed[u]) for u in FACTOR_UNITS},
        )
        held_products = {p for by_product in fixed.values() for p in by_product}
        held_keys: dict[tuple[str, ...], tuple[object, ...]] = {}
        shares |= refit(
            {
                w: _read_key(g, prior[w], held, held_keys)
                for w, g in by_workload.items()
                if g[0].profiled in held_products
            },
            held,
        )
        reference = held
    memo.catalog = catalog
    memo.shares, memo.profiled, memo.bounds = seen_shares, seen_profiled, seen_bounds
    names = {s.product for s in used} | {s.profiled for s in used}
    result: dict[str, ProductCalibration] = {}
    # by product: its samples by workload; by unit and profiled product: the workloads whose votes
    # (on any product) are ratios to it. Each read once, not once per product and unit
    on: dict[str, dict[str, Sample]] = {}
    for s in used:
        on.setdefault(s.product, {})[s.workload] = s
    ratios_to: dict[Unit, dict[str, set[str]]] = {unit: {} for unit in FACTOR_UNITS}
    for unit in FACTOR_UNITS:
        for voted in factors.votes[unit].values():
            for _, s in voted:
                ratios_to[unit].setdefault(s.profiled, set()).add(s.workload)
    for product in sorted(names):
        # a factor rests on the runs that voted for it here, and on this product's own runs of the
        # workloads profiled on it whose votes elsewhere are ratios to it. A factor step 3 held
        # rests on no run on its product: it never qualifies the product, it only reads the shares
        # of the workloads profiled there (docs/ranking.md "Re-fitted shares")
        here = on.get(product, {})
        support: dict[Unit, FactorSupport] = {}
        for unit in FACTOR_UNITS:
            mine = [s for _, s in factors.votes[unit].get(product, [])]
            anchored = {w for w in ratios_to[unit].get(product, set()) if w in here}
            runs = sum(s.runs for s in mine) + sum(here[w].runs for w in sorted(anchored))
            support[unit] = FactorSupport(
                round(factors.of(unit)[product], DIGITS), runs, len({s.workload for s in mine} | anchored)
            )
        result[product] = ProductCalibration(
            product=product,
            memory=support["memory"],
            compute=support["fp32"],
            updated_at=updated_at,
            tensor=support["tensor"],
            fp64=support["fp64"],
        )
    workloads: dict[str, WorkloadShares] = {}
    for workload, group in sorted(by_workload.items()):
        entry = catalog.placement(group[0].profiled)
        assert entry is not None, "samples_of keeps catalog products only"
        fitted = shares[workload]
        figures: dict[Unit, float] = {}
        for unit in FACTOR_UNITS:
            figure = entry.sustained(unit)
            assert figure is not None
            figures[unit] = round(figure / reference.by_unit[unit][entry.product], DIGITS)
        fitted_shares = WorkloadShares(
            workload=workload,
            profiled=entry.product,
            sm=round(fitted.get("fp32", 0.0), DIGITS + 2),
            mem=round(fitted.get("memory", 0.0), DIGITS + 2),
            fp32_tflops=figures["fp32"],
            bandwidth_gbs=figures["memory"],
            runs=sum(s.runs for s in group),
            products=len(group),
            updated_at=updated_at,
        )
        if group[0].shares:  # per unit, of the figures of the units it has
            rounded = {u: round(x, DIGITS + 2) for u, x in fitted.items()}
            latency: tuple[Unit, float] = (
                "latency",
                round(max(0.0, 1.0 - sum(rounded.values())), DIGITS + 2),
            )
            fitted_shares = dataclasses.replace(
                fitted_shares,
                sm=0.0,
                mem=0.0,
                time_shares=(*rounded.items(), latency),
                figures=tuple((u, figures[u]) for u in rounded),
            )
        workloads[workload] = fitted_shares
    for (product, kind), link in fit_links(
        [s for s in both if s.interconnect], catalog, factors.by_unit
    ).items():
        found = result.get(product) or ProductCalibration(
            product, FactorSupport(), FactorSupport(), updated_at
        )
        result[product] = (
            dataclasses.replace(found, nvlink=link)
            if kind == "NVLink"
            else dataclasses.replace(found, pcie=link)
        )
    return Calibration(dict(sorted(result.items())), workloads)
