"""The interconnect's calibration (DESIGN "The interconnect", docs/ranking.md "The links' factors"): per
GPU product and link (NVLink, PCIe), by how much the model's interconnect time must be scaled to match
what the cluster's gangs really took there. A product's link factor of 2 says its gangs' collectives
took twice as long as the catalog's figure for that link says: a PCIe switch shared by two GPUs, a
bridge missing, NVLink lanes down.

Pure: ``fit_links(samples, catalog, unit_factors)``, from the samples of gangs whose profile measured an
interconnect share (``Sample.interconnect``) on ``Sample.gpus`` GPUs together, which set the link of
each run. The units' factors are the main fit's (``calibration_fit.py``), held: a gang's runs measure
only the link, and only where the link clearly binds them, as a unit's runs measure only that unit.

The model of a run on product P, relative to the product R its profile was measured on, is the
ranking's: each unit's share times R's figure over P's (and the units' factors), plus the interconnect
share times R's link over P's (and their link factors), plus the latency share. The run on R sets the
workload's scale (the model predicts it exactly); a run elsewhere votes for its link's factor
relative to R's when the link's term is at least ``DOMINANT`` times every unit's term and the
latency share's. The votes are averaged robustly (Huber's, in log-time, by runs), in rounds, as the
unit factors are. Observations fix only ratios between links, and no link figure in the catalog is
a measurement, so the factors are anchored to a median of 1 (in log) over every link measured (voted
on, or the reference of votes): the middle link keeps its datasheet's figure. A link that is not what
its datasheet says (a PCIe switch two GPUs share, a bridge missing) is the exception on a cluster, so
the median puts the correction on it; a mean would spread it over every link measured, and move
each against the catalog's figures of the links no gang has run on yet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kratos_admit.domain.vocabulary import Unit
from kratos_admit.model.calibration import (
    DIGITS,
    DOMINANT,
    FACTOR_UNITS,
    HUBER_DELTA,
    FactorSupport,
    Sample,
)
from kratos_admit.model.catalog import Catalog, LinkKind
from kratos_admit.model.robust import ROUNDS, huber_location, weighted_median

LinkKey = tuple[str, LinkKind]  # a catalog product and one of its links


@dataclass(frozen=True, slots=True)
class _Run:
    """A gang's sample as the link fit reads it: its link and its profiled product's, the units'
    terms (their factors held), the latency share, and the link's term at equal link factors."""

    sample: Sample
    here: LinkKey
    there: LinkKey
    units: tuple[float, ...]
    idle: float
    link: float

    def link_term(self, factors: Mapping[LinkKey, float]) -> float:
        return self.link * factors.get(self.here, 1.0) / factors.get(self.there, 1.0)

    def modelled(self, factors: Mapping[LinkKey, float]) -> float:
        return sum(self.units) + self.link_term(factors) + self.idle


def _read(s: Sample, catalog: Catalog, unit_factors: Mapping[Unit, Mapping[str, float]]) -> _Run | None:
    """The sample as ``_Run``; None when either product has no figure for the link its gang gets."""
    here, there = catalog.placement(s.product), catalog.placement(s.profiled)
    if here is None or there is None:
        return None
    link_here, link_there = here.link(s.gpus), there.link(s.gpus)
    if link_here is None or link_there is None:
        return None
    units = []
    for unit, share in s.shares:
        a, b = there.sustained(unit), here.sustained(unit)
        if a is None or b is None or unit not in FACTOR_UNITS:
            continue
        factors = unit_factors.get(unit, {})
        units.append(share * a / b * factors.get(s.product, 1.0) / factors.get(s.profiled, 1.0))
    idle = max(0.0, 1.0 - sum(share for _, share in s.shares) - s.interconnect)
    return _Run(
        s,
        (here.product, link_here.kind),
        (there.product, link_there.kind),
        tuple(units),
        idle,
        s.interconnect * link_there.gbs / link_here.gbs,
    )


def fit_links(
    samples: Sequence[Sample], catalog: Catalog, unit_factors: Mapping[Unit, Mapping[str, float]]
) -> dict[LinkKey, FactorSupport]:
    """Each measured link's factor, with the runs and workloads behind it (module docstring): the
    runs that voted for it, and the runs on it of the workloads whose votes elsewhere are ratios to it."""
    runs = [
        r for s in samples if s.interconnect > 0 and s.gpus > 1 and (r := _read(s, catalog, unit_factors))
    ]
    scale: dict[str, float] = {}
    for r in runs:
        if r.sample.product == r.sample.profiled:  # the model predicts it exactly: its time is the unit
            scale[r.sample.workload] = r.sample.seconds / r.modelled({})
    factors: dict[LinkKey, float] = {}
    votes: dict[LinkKey, list[tuple[float, _Run]]] = {}
    known: set[LinkKey] = set()
    for round_ in range(ROUNDS):
        delta = math.inf if round_ < ROUNDS // 2 else HUBER_DELTA
        votes = {}
        for r in runs:
            s = r.sample
            if s.product == s.profiled or s.workload not in scale:
                continue
            term = r.link_term(factors)
            busy = s.seconds / scale[s.workload] - sum(r.units) - r.idle
            if busy <= 0 or term < DOMINANT * max((*r.units, r.idle)):
                continue  # the link does not clearly bind it: it could explain a unit's figure as well
            votes.setdefault(r.here, []).append((factors.get(r.here, 1.0) * busy / term, r))
        moved = 0.0
        for key, cast in votes.items():
            new = math.exp(
                huber_location([math.log(f) for f, _ in cast], [r.sample.runs for _, r in cast], delta=delta)
            )
            moved = max(moved, abs(math.log(new / factors.get(key, 1.0))))
            factors[key] = new
        known |= set(votes) | {r.there for cast in votes.values() for _, r in cast}
        if known:
            logs = [math.log(factors.get(k, 1.0)) for k in sorted(known)]
            middle = math.exp(weighted_median(logs, [1.0] * len(logs)))
            factors = {k: factors.get(k, 1.0) / middle for k in known}
        if moved < 1e-7 and delta != math.inf:
            break
    found: dict[LinkKey, FactorSupport] = {}
    for key in sorted(known):
        mine = [r.sample for _, r in votes.get(key, [])]
        # the runs on this link of the workloads whose votes are ratios to it: they set their scale
        referenced = {r.sample.workload for cast in votes.values() for _, r in cast if r.there == key}
        anchored = [
            r.sample for r in runs if r.sample.workload in referenced and r.here == key and r.there == key
        ]
        found[key] = FactorSupport(
            round(factors.get(key, 1.0), DIGITS),
            sum(s.runs for s in (*mine, *anchored)),
            len({s.workload for s in (*mine, *anchored)}),
        )
    return found
