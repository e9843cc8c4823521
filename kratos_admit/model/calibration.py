"""Calibration (DESIGN "Learning the cluster's GPUs"): per GPU product, by how much the ranking
model's time on each unit (tensor, FP32, FP64, memory) must be scaled to match what really ran on
this cluster, and per workload its re-fitted shares; ``calibration.json`` in and out, and when a new
fit is worth writing. The fit itself is ``calibration_fit.py``; docs/ranking.md "Calibration" gives
the model."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.vocabulary import Unit
from kratos_admit.model.catalog import Catalog, GpuProduct, LinkKind

CONFIGMAP_NAME = "kratos-gpu-calibration"
CONFIGMAP_KEY = "calibration.json"
DIGITS = 4  # factors are stored rounded, so a refit from the same runs writes the same bytes
HUBER_DELTA = 0.1  # in log-time: samples within about 10 % of the fit count as in a mean
# a run measures a figure only when that resource clearly bounds it (its model term at least this
# many times the other); a run near the balance point could be explained by either. The fit reads
# samples by it, and exploration sends a Job only where its run would be so bound.
DOMINANT = 2.0
# what a prior is worth, in runs: the profile's shares in the re-fit of a workload's shares, and
# the model's prediction for a product the workload ran on fewer than minObservedRuns times
PRIOR_RUNS = 1.0
# the units a product's figure scales, each with a factor of its own (latency time scales with none)
FACTOR_UNITS: tuple[Unit, ...] = ("tensor", "fp32", "fp64", "memory")
# each factor's unit by its name in calibration.json and the hints record (``exploreFigure``)
FIGURES: dict[str, Unit] = {str(u): u for u in FACTOR_UNITS}
# each unit's catalog figure: the GpuProduct field a calibrated figure replaces
MEASURED_FIELD: dict[Unit, str] = {
    "tensor": "measured_tensor_tflops",
    "fp32": "measured_fp32_tflops",
    "fp64": "measured_fp64_tflops",
    "memory": "measured_bandwidth_gbs",
}
# the links a product's gangs move their data over, each with a factor of its own (calibration_links.py)
LINK_KINDS: tuple[LinkKind, ...] = ("NVLink", "PCIe")
_LINK_KEY: dict[LinkKind, str] = {"NVLink": "nvlink", "PCIe": "pcie"}
# each unit's key prefix in calibration.json (fp32's factor also goes out under its name from before
# the units model, "compute", which a webhook of the previous version reads during an upgrade)
_KEY: dict[Unit, str] = {"tensor": "tensor", "fp32": "fp32", "fp64": "fp64", "memory": "memory"}


@dataclass(frozen=True, slots=True)
class Sample:
    """One workload's observed mean on one product, with what its profile says about the workload."""

    workload: str  # namespace/name: one workload
    product: str  # catalog product (a MIG slice keeps its own name)
    runs: int
    seconds: float
    sm: float  # SM and memory throughput shares on ``profiled``
    mem: float
    profiled: str  # catalog product the profile was measured on
    # the profile's time shares of the scaled units (tensor, fp32, fp64, memory; latency is the rest),
    # as (unit, share) pairs; empty for a profile written before the units model, read by ``sm``/``mem``
    shares: tuple[tuple[Unit, float], ...] = ()
    # a gang's: the GPUs it ran on together (which set its link on each product) and its profile's
    # interconnect share; a sample with one is fitted by the links' fit (calibration_links.py) only
    gpus: int = 1
    interconnect: float = 0.0


@dataclass(frozen=True, slots=True)
class FactorSupport:
    factor: float = 1.0
    runs: int = 0
    workloads: int = 0

    def qualifies(self, min_runs: int) -> bool:
        return self.runs >= min_runs and self.workloads >= 2


@dataclass(frozen=True, slots=True)
class ProductCalibration:
    """A product's factor per unit. ``compute`` is the FP32 factor (its name from before the units
    model, kept for the callers that read it); ``tensor`` and ``fp64`` are measured only by runs that
    exercised them, and stay at 1 (the catalog's figure) with no runs otherwise."""

    product: str
    memory: FactorSupport
    compute: FactorSupport
    updated_at: str = ""
    tensor: FactorSupport = FactorSupport()
    fp64: FactorSupport = FactorSupport()
    # a link's factor: how much longer gangs' collectives took over it than its catalog figure says
    nvlink: FactorSupport = FactorSupport()
    pcie: FactorSupport = FactorSupport()

    def link(self, kind: LinkKind) -> FactorSupport:
        """The factor of the product's ``kind`` link, with the runs behind it."""
        return self.nvlink if kind == "NVLink" else self.pcie

    @property
    def fp32(self) -> FactorSupport:
        return self.compute

    def support(self, unit: Unit) -> FactorSupport:
        """The factor of ``unit`` (tensor, fp32, fp64, memory) with the runs behind it."""
        if unit == "memory":
            return self.memory
        if unit == "fp32":
            return self.compute
        if unit == "tensor":
            return self.tensor
        if unit == "fp64":
            return self.fp64
        raise ValueError(f"no factor scales {unit!r} time")

    @property
    def runs(self) -> int:
        """The runs behind the weaker of its FP32 and memory factors: a product is as well known as
        its least-known resource (tensor and FP64 count where the runs exercised them, on their own)."""
        return min(self.memory.runs, self.compute.runs)

    @property
    def workloads(self) -> int:
        return min(self.memory.workloads, self.compute.workloads)

    def qualifies(self, min_runs: int) -> bool:
        """Its FP32 and memory factors rest on ``min_runs`` runs from at least two workloads (DESIGN)."""
        return self.memory.qualifies(min_runs) and self.compute.qualifies(min_runs)

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"runs": self.runs, "workloads": self.workloads, "updatedAt": self.updated_at}
        for unit in FACTOR_UNITS:
            support = self.support(unit)
            if unit in ("tensor", "fp64") and not support.runs and support.factor == 1.0:
                continue  # a unit no run exercised: the catalog's figure, nothing to say
            found |= {
                f"{_KEY[unit]}TimeFactor": round(support.factor, DIGITS),
                f"{_KEY[unit]}Runs": support.runs,
                f"{_KEY[unit]}Workloads": support.workloads,
            }
        for kind in LINK_KINDS:
            support = self.link(kind)
            if support.runs or support.factor != 1.0:
                key = _LINK_KEY[kind]
                found |= {
                    f"{key}TimeFactor": round(support.factor, DIGITS),
                    f"{key}Runs": support.runs,
                    f"{key}Workloads": support.workloads,
                }
        # the FP32 factor under its name from before the units model, for the previous version's readers
        found |= {
            "computeTimeFactor": round(self.compute.factor, DIGITS),
            "computeRuns": self.compute.runs,
            "computeWorkloads": self.compute.workloads,
        }
        return found

    def same_fit(self, other: ProductCalibration) -> bool:
        return self.as_dict() | {"updatedAt": ""} == other.as_dict() | {"updatedAt": ""}


@dataclass(frozen=True, slots=True)
class WorkloadShares:
    """A workload's shares re-fitted from its runs on two or more products, as fractions of the
    figures of the product it was profiled on that the fit used (the catalog's divided by that
    product's factors), so a prediction from them no longer rests on the catalog's figures for where
    the profile happened to be measured. A profile with time shares is re-fitted per unit
    (``time_shares``, ``figures``); one written before the units model by its SM and memory
    throughputs (``sm``, ``mem``, ``fp32_tflops``, ``bandwidth_gbs``)."""

    workload: str  # namespace/name
    profiled: str
    sm: float
    mem: float
    fp32_tflops: float
    bandwidth_gbs: float
    runs: int
    products: int
    updated_at: str = ""
    # by unit, latency included; empty for a workload read by its throughputs
    time_shares: tuple[tuple[Unit, float], ...] = ()
    figures: tuple[tuple[Unit, float], ...] = ()  # the profiled product's figure per scaled unit

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"product": self.profiled}
        if self.time_shares:
            found |= {
                "timeShares": {unit: f"{share:.{DIGITS + 2}f}" for unit, share in self.time_shares},
                "figures": dict(self.figures),
            }
        else:
            found |= {
                "smThroughput": round(self.sm * 100, DIGITS),
                "memoryThroughput": round(self.mem * 100, DIGITS),
                "fp32Tflops": self.fp32_tflops,
                "bandwidthGBs": self.bandwidth_gbs,
            }
        return found | {"runs": self.runs, "products": self.products, "updatedAt": self.updated_at}

    def same_fit(self, other: WorkloadShares) -> bool:
        return self.as_dict() | {"updatedAt": ""} == other.as_dict() | {"updatedAt": ""}


@dataclass(frozen=True, eq=False)
class Calibration:
    """Factors by catalog product, and re-fitted shares by workload. Hashed and compared by
    identity: the ranking caches on it, and a store hands out the same object until the calibration
    changes."""

    products: Mapping[str, ProductCalibration] = field(default_factory=dict)
    workloads: Mapping[str, WorkloadShares] = field(default_factory=dict)
    # the exploring Jobs under way (docs/ranking.md "Exploration"): product -> figure -> the workloads
    # (namespace/workload) of its Jobs sent there to measure that figure that have not finished yet,
    # one entry a Job; the controller counts them from its Jobs and publishes them with the factors
    exploring: Mapping[str, Mapping[Unit, tuple[str, ...]]] = field(default_factory=dict)

    def get(self, product: str) -> ProductCalibration | None:
        return self.products.get(product)

    def exploring_on(self, product: str, figure: Unit) -> tuple[str, ...]:
        """The workloads of the Jobs under way that explore ``product``'s ``figure``, one a Job."""
        return self.exploring.get(product, {}).get(figure, ())

    def shares_of(self, namespace: str, workload: str) -> WorkloadShares | None:
        """The workload's re-fitted shares, or None while it has run on fewer than two products."""
        return self.workloads.get(f"{namespace}/{workload}")

    def shares_for(self, profile: WorkloadProfile) -> WorkloadShares | None:
        """Its own ``status.calibratedShares`` (issue 59), else an older calibration file's entry."""
        namespace, workload = profile.metadata.namespace, profile.spec.workload
        status = profile.status.calibrated_shares if profile.status is not None else None
        return profile_shares(namespace, workload, status) or self.shares_of(namespace, workload)

    def calibrated(self, entry: GpuProduct, min_runs: int, gpus: int = 1) -> tuple[GpuProduct, bool]:
        """``entry`` with each sustained figure divided by its unit's factor where that factor
        qualifies (``minCalibrationRuns`` runs from at least two workloads), and whether any did. A
        memory factor measured by many memory-bound runs is used even while no compute-bound run has
        reached the product: a figure is as well known as its own runs make it. For a workload on
        ``gpus`` > 1 GPUs together, the link it gets there too, by that link's factor."""
        found = self.products.get(entry.product)
        if found is None:
            return entry, False
        update: dict[str, float] = {
            MEASURED_FIELD[unit]: figure / support.factor
            for unit in FACTOR_UNITS
            if (support := found.support(unit)).qualifies(min_runs) and (figure := entry.sustained(unit))
        }
        link = entry.link(gpus)
        if link is not None and (support := found.link(link.kind)).qualifies(min_runs):
            update["nvlink_gbs" if link.kind == "NVLink" else "pcie_gbs"] = link.gbs / support.factor
        if not update:
            return entry, False
        return entry.model_copy(update=update), True

    def to_json(self) -> str:
        """The whole fit (comparisons; calibration.json before issue 59, now ``published_calibration``)."""
        document: dict[str, Any] = {
            "products": {name: p.as_dict() for name, p in sorted(self.products.items())}
        }
        if self.workloads:
            document["workloads"] = {name: w.as_dict() for name, w in sorted(self.workloads.items())}
        if self.exploring:
            document["exploring"] = exploring_document(self.exploring)
        return json.dumps(document, indent=2, sort_keys=True)


def exploring_document(
    exploring: Mapping[str, Mapping[Unit, tuple[str, ...]]],
) -> dict[str, dict[str, list[str]]]:
    """``Calibration.exploring`` as calibration.json holds it: product -> figure -> workloads, sorted."""
    return {
        product: {figure: sorted(workloads) for figure, workloads in sorted(figures.items()) if workloads}
        for product, figures in sorted(exploring.items())
        if any(figures.values())
    }


def under_way(entries: Iterable[tuple[str, Unit, str]]) -> dict[str, dict[Unit, tuple[str, ...]]]:
    """``Calibration.exploring`` from the exploring Jobs under way, each (product, figure, workload)."""
    found: dict[str, dict[Unit, list[str]]] = {}
    for product, figure, workload in entries:
        found.setdefault(product, {}).setdefault(figure, []).append(workload)
    return {p: {f: tuple(sorted(w)) for f, w in figures.items()} for p, figures in found.items()}


def _exploring(raw: Any) -> dict[str, dict[Unit, tuple[str, ...]]]:
    found: dict[str, dict[Unit, tuple[str, ...]]] = {}
    for product, figures in dict(raw).items():
        for figure, workloads in dict(figures).items():
            if figure not in FIGURES:
                raise ValueError(
                    f"exploring.{product}: {figure!r} is not a figure (tensor, fp32, fp64, memory)"
                )
            if not isinstance(workloads, list) or not all(isinstance(w, str) for w in workloads):
                raise ValueError(f"exploring.{product}.{figure}: not a list of workloads")
            found.setdefault(str(product), {})[FIGURES[figure]] = tuple(workloads)
    return found


NO_CALIBRATION = Calibration()


def profile_shares(namespace: str, workload: str, status: Mapping[str, Any] | None) -> WorkloadShares | None:
    """The shares a ``status.calibratedShares`` holds; None when none can be read."""
    if not status:
        return None
    try:
        found = _workload(f"{namespace}/{workload}", dict(status))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return found if _valid_workload(found) else None


class CalibrationError(ValueError):
    """A calibration.json that cannot be read; the message says where."""


def _support(p: Mapping[str, Any], unit: Unit) -> FactorSupport:
    """A unit's factor in a product's entry: ``<unit>TimeFactor``, ``<unit>Runs``, ``<unit>Workloads``;
    FP32's under its name from before the units model (``computeTimeFactor``) where the entry has no
    ``fp32TimeFactor``; a unit the entry does not name is the catalog's (factor 1, no runs)."""
    key = _KEY[unit]
    if unit == "fp32" and "fp32TimeFactor" not in p:
        key = "compute"
    if unit in ("tensor", "fp64") and f"{key}TimeFactor" not in p:
        return FactorSupport()
    return FactorSupport(
        float(p[f"{key}TimeFactor"]), int(p.get(f"{key}Runs", 0)), int(p.get(f"{key}Workloads", 0))
    )


def _link_support(p: Mapping[str, Any], kind: LinkKind) -> FactorSupport:
    """A link's factor in a product's entry (``nvlinkTimeFactor``, ``pcieRuns``, ...); the catalog's
    figure (factor 1, no runs) where the entry names none, as a previous version's do not."""
    key = _LINK_KEY[kind]
    if f"{key}TimeFactor" not in p:
        return FactorSupport()
    return FactorSupport(
        float(p[f"{key}TimeFactor"]), int(p.get(f"{key}Runs", 0)), int(p.get(f"{key}Workloads", 0))
    )


def _unit_pairs(raw: Any, *, what: str) -> tuple[tuple[Unit, float], ...]:
    known = {str(u): u for u in (*FACTOR_UNITS, "latency")}
    pairs = []
    for name, value in dict(raw).items():
        if name not in known:
            raise ValueError(f"{what}: {name!r} is not a unit (tensor, fp32, fp64, memory, latency)")
        pairs.append((known[name], float(value)))
    return tuple(pairs)


def _workload(name: str, w: Mapping[str, Any]) -> WorkloadShares:
    found = WorkloadShares(
        workload=name,
        profiled=str(w["product"]),
        sm=0.0,
        mem=0.0,
        fp32_tflops=0.0,
        bandwidth_gbs=0.0,
        runs=int(w.get("runs", 0)),
        products=int(w.get("products", 0)),
        updated_at=str(w.get("updatedAt", "")),
    )
    if "timeShares" in w:
        figures = _unit_pairs(w["figures"], what="figures")
        by_unit = dict(figures)
        return dataclasses.replace(
            found,
            fp32_tflops=by_unit.get("fp32", 0.0),
            bandwidth_gbs=by_unit.get("memory", 0.0),
            time_shares=_unit_pairs(w["timeShares"], what="timeShares"),
            figures=figures,
        )
    return dataclasses.replace(
        found,
        sm=float(w["smThroughput"]) / 100,
        mem=float(w["memoryThroughput"]) / 100,
        fp32_tflops=float(w["fp32Tflops"]),
        bandwidth_gbs=float(w["bandwidthGBs"]),
    )


def _valid_workload(w: WorkloadShares) -> bool:
    if w.time_shares:
        shares = dict(w.time_shares)
        return (
            all(x >= 0 for x in shares.values())
            and sum(shares.values()) > 0
            and all(dict(w.figures).get(u, 0) > 0 for u, x in shares.items() if u != "latency" and x > 0)
        )
    return 0 < w.sm <= 1 and 0 < w.mem <= 1 and w.fp32_tflops > 0 and w.bandwidth_gbs > 0


def parse_calibration(text: str) -> Calibration:
    """A ``calibration.json``, as this version writes it or as the previous one did (a factor for
    FP32, ``computeTimeFactor``, and one for memory; workloads by their throughputs)."""
    try:
        data = json.loads(text)
        products = {}
        for name, p in dict(data["products"]).items():
            entry = dict(p)
            products[str(name)] = ProductCalibration(
                product=str(name),
                memory=_support(entry, "memory"),
                compute=_support(entry, "fp32"),
                updated_at=str(entry.get("updatedAt", "")),
                tensor=_support(entry, "tensor"),
                fp64=_support(entry, "fp64"),
                nvlink=_link_support(entry, "NVLink"),
                pcie=_link_support(entry, "PCIe"),
            )
        workloads = {
            str(name): _workload(str(name), dict(w)) for name, w in dict(data.get("workloads", {})).items()
        }
        exploring = _exploring(data.get("exploring", {}))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CalibrationError(
            f"{CONFIGMAP_KEY}: not a KRATOS calibration ({type(exc).__name__}: {exc})"
        ) from None
    for name, p in products.items():
        if not all(p.support(unit).factor > 0 for unit in FACTOR_UNITS) or not all(
            p.link(kind).factor > 0 for kind in LINK_KINDS
        ):
            raise CalibrationError(f"{CONFIGMAP_KEY}: products.{name}: factors must be positive")
    for name, w in workloads.items():
        if not _valid_workload(w):
            raise CalibrationError(
                f"{CONFIGMAP_KEY}: workloads.{name}: shares must be in (0, 100] and figures positive"
            )
    return Calibration(products, workloads, exploring)


def samples_of(
    profiles: Iterable[WorkloadProfile], catalog: Catalog, *, reference_product: str
) -> list[Sample]:
    """Every observation of a Ready profile with throughputs, as a sample (products the catalog does
    not know are left out; ``-SHARED`` variants pool into their product, by running mean, and so do
    the runs of every gang size where the profile measured no link: the units' model has no term that
    depends on the size). A profile with a measured interconnect share (a gang's) gives samples of the
    gang size it was measured at (``gpu.gangGPUs``) alone, carrying the share and the size, which sets
    its link on each product: the links' fit reads them, the units' fit leaves them out; one whose gang
    size was not recorded gives none."""
    found: list[Sample] = []
    for profile in profiles:
        status = profile.status
        if status is None or status.phase != "Ready":
            continue
        sm, mem = status.metrics.percent("sm_throughput"), status.metrics.percent("memory_throughput")
        profiled = catalog.placement(status.gpu.product or reference_product)
        fractions = status.time_shares.fractions() if status.time_shares is not None else None
        gang = status.gpu.gang_gpus
        interconnect = fractions.get("interconnect", 0.0) if fractions is not None else 0.0
        if interconnect > 0 and (gang is None or gang < 2):
            continue
        shares = tuple((u, fractions[u]) for u in FACTOR_UNITS if fractions[u] > 0) if fractions else ()
        if profiled is None or (not shares and (sm is None or mem is None)):
            continue
        sm, mem = sm or 0.0, mem or 0.0
        pooled: dict[str, tuple[int, float]] = {}
        for observation in status.observations:
            if interconnect > 0 and observation.gang_gpus != gang:
                continue  # its share was measured over the link of that size
            entry = catalog.placement(observation.product)
            try:
                seconds = float(observation.mean_seconds)
            except ValueError:
                continue
            if entry is None or observation.runs <= 0 or seconds <= 0:
                continue
            runs, total = pooled.get(entry.product, (0, 0.0))
            pooled[entry.product] = (runs + observation.runs, total + seconds * observation.runs)
        key = f"{profile.metadata.namespace}/{profile.spec.workload}"
        for product, (runs, total) in sorted(pooled.items()):
            found.append(
                Sample(
                    workload=key,
                    product=product,
                    runs=runs,
                    seconds=total / runs,
                    sm=min(max(sm, 0.0), 100.0) / 100,
                    mem=min(max(mem, 0.0), 100.0) / 100,
                    profiled=profiled.product,
                    shares=shares,
                    gpus=gang or 1,
                    interconnect=interconnect,
                )
            )
    return found
