"""The placement report: what the ranking decided for one profile on one cluster, and from what.

Pure: ``placement_rows(profile, nodes, catalog, config) -> rows``; the CLI prints them as a table a
person reads before trusting the hints (``kratos-admit placement``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from kratos_admit.decisions.acceptable import cut
from kratos_admit.decisions.hints import ranking_of
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.vocabulary import UNITS, Unit
from kratos_admit.model.calibration import NO_CALIBRATION, Calibration, FactorSupport, ProductCalibration
from kratos_admit.model.catalog import Catalog, Link, mig_profile_of
from kratos_admit.model.links import LINK_COUNTERS
from kratos_admit.model.ranking import (
    SCALED_UNITS,
    RankedProduct,
    profile_shares,
    reference_of,
    throughput_shares,
    unit_figures,
)
from kratos_admit.model.telemetry import derive_record, nsight_compute_figures


@dataclass(frozen=True, slots=True)
class PlacementRow:
    product: str
    labels: str
    share: str  # "whole GPU", or the MIG slice's share of compute and memory
    # each unit's sustained figure and where it comes from: "calibrated (...)", "catalog, measured",
    # "catalog, datasheet x factor", "share of <GPU>" (a MIG slice), or "re-fitted with ..."
    tensor_tflops: float
    tensor_from: str
    fp32_tflops: float
    fp32_from: str
    fp64_tflops: float
    fp64_from: str
    bandwidth_gbs: float
    bandwidth_from: str
    # the link a workload on several GPUs gets on the product, its GB/s both ways, and where that
    # figure comes from ("NVLink 4, datasheet: ..."); "-" on one GPU, where no link scales its time
    interconnect_gbs: float | str
    interconnect_from: str
    # DESIGN "Wait or run slow": the predicted time over the best product's (of those with a Node
    # that can hold a Pod), and whether the cut by maxSlowdown lets the workload run there
    slowdown: float
    cut: str  # "acceptable", "kept-off", or "-" where nothing is narrowed
    relative_time: float
    # "model", "calibrated" or "observed"; "model + 1 run" where the workload's own runs there,
    # fewer than minObservedRuns, were weighed with the model's figure
    time_from: str
    # what the measuring product's figures rest on, for a row the model predicts: "<product>:
    # calibrated", "measured" (in the catalog) or "datasheet"; "-" for a row ranked by observed runs
    measured_on: str
    weight: int


def _calibrated_source(support: FactorSupport) -> str:
    return f"calibrated (/{support.factor:g}, {support.runs} runs, {support.workloads} workloads)"


def _sources(
    r: RankedProduct,
    catalog: Catalog,
    *,
    profile: WorkloadProfile,
    calibration: Calibration,
    minimum: int,
) -> tuple[str, dict[Unit, str]]:
    """The row's share of the GPU, and where each unit's figure comes from."""
    entry = r.product
    mig = mig_profile_of(entry.product)
    base = catalog.lookup(entry.product)
    sources: dict[Unit, str] = {}
    if mig is not None and base is not None:
        share = (
            f"MIG {mig}: {entry.sustained_fp32_tflops / base.sustained_fp32_tflops:.0%} of compute, "
            f"{entry.sustained_bandwidth_gbs / base.sustained_bandwidth_gbs:.0%} of bandwidth"
        )
        sources = dict.fromkeys(SCALED_UNITS, f"share of {base.product}")
    else:
        share = "whole GPU"
        original = base or entry
        sources = {
            unit: "catalog, measured" if original.measured(unit) else "catalog, datasheet x factor"
            for unit in SCALED_UNITS
        }
    own = calibration.get(entry.product)
    fitted = calibration.shares_for(profile)
    for unit in SCALED_UNITS:
        if own is not None and own.support(unit).qualifies(minimum):
            sources[unit] = _calibrated_source(own.support(unit))
    if r.calibrated and fitted is not None and fitted.profiled == entry.product:
        # the figures the re-fit gave the product it was profiled on: per unit, or FP32 and bandwidth
        refitted: set[Unit] = {u for u, _ in fitted.figures} if fitted.time_shares else {"fp32", "memory"}
        for unit in refitted:
            sources[unit] = f"re-fitted with the workload's shares ({fitted.runs} runs)"
    return share, sources


def placement_rows(
    profile: WorkloadProfile,
    node_products: Iterable[str],
    *,
    catalog: Catalog,
    config: Config,
    calibration: Calibration = NO_CALIBRATION,
    gpus: int = 1,
    product_gpus: Mapping[str, int] | None = None,
) -> list[PlacementRow]:
    """One row per ranked product, best first; empty when the profile gives nothing to rank by.
    ``gpus``: the GPUs the workload runs on together (a gang's), whose link scales its interconnect;
    ``product_gpus``: the most GPUs one Node of each product has (the cut's "can hold a Pod" of one GPU)."""
    ranked = ranking_of(
        profile, node_products, config=config, catalog=catalog, calibration=calibration, gpus=gpus
    )
    narrowed = cut(ranked, cap=config.max_slowdown, product_gpus=product_gpus)
    verdicts = {s.product: ("acceptable", s.slowdown) for s in narrowed.acceptable} if narrowed else {}
    verdicts |= {s.product: ("kept-off", s.slowdown) for s in narrowed.kept_off} if narrowed else {}
    reference = reference_of(
        profile,
        catalog=catalog,
        calibration=calibration,
        min_calibration_runs=config.min_calibration_runs,
        gpus=gpus,
    )
    rests_on = f"{reference.product}: {reference.figures}" if reference is not None else "-"
    rows = []
    for r in ranked:
        entry = r.product
        share, sources = _sources(
            r, catalog, profile=profile, calibration=calibration, minimum=config.min_calibration_runs
        )
        figures = unit_figures(entry)
        link = entry.link(gpus)
        rows.append(
            PlacementRow(
                product=entry.product,
                labels=",".join(r.labels),
                share=share,
                tensor_tflops=round(figures["tensor"], 1),
                tensor_from=sources["tensor"],
                fp32_tflops=round(figures["fp32"], 1),
                fp32_from=sources["fp32"],
                fp64_tflops=round(figures["fp64"], 2),
                fp64_from=sources["fp64"],
                bandwidth_gbs=round(figures["memory"]),
                bandwidth_from=sources["memory"],
                interconnect_gbs=round(link.gbs, 1) if link is not None else "-",
                interconnect_from=_link_source(
                    link, entry.link_source, gpus, calibration.get(entry.product), config.min_calibration_runs
                ),
                relative_time=round(r.relative_time, 3),
                time_from=f"{r.source} + {r.weighed_runs} run{'s' if r.weighed_runs > 1 else ''}"
                if r.weighed_runs
                else r.source,
                measured_on="-" if r.observed else rests_on,
                weight=r.weight,
                slowdown=round(verdicts[entry.product][1], 2) if entry.product in verdicts else 1.0,
                cut=verdicts[entry.product][0] if narrowed is not None and narrowed.narrows else "-",
            )
        )
    return rows


def _link_source(
    link: Link | None, source: str, gpus: int, own: ProductCalibration | None, minimum: int
) -> str:
    """Where the link's figure comes from: the cluster's calibration of that link, else its datasheet."""
    if link is None:
        return "one GPU: no link" if gpus <= 1 else "no link figure in the catalog"
    if own is not None and (support := own.link(link.kind)).qualifies(minimum):
        return f"{link.name}, {_calibrated_source(support)}"
    return f"{link.name}, datasheet: {source or 'not cited'}"


def placement_header(
    profile: WorkloadProfile,
    config: Config,
    rows: list[PlacementRow],
    *,
    catalog: Catalog,
    summary: str | None = None,
    calibration: Calibration = NO_CALIBRATION,
    gpus: int = 1,
) -> list[str]:
    """What the rows rest on: the profile's figures (``summary``: the runner summary file it was read
    from, as the controller would write it), its time shares by unit, the reference GPU, the strategy,
    and which observations were used (a product's runs count once there are ``minObservedRuns``)."""
    status = profile.status
    shares = throughput_shares(profile)
    what = (
        f"runner summary {summary}, as the controller would write it"
        if summary is not None
        else f"profile {profile.metadata.namespace}/{profile.metadata.name} (workload {profile.spec.workload})"
    )
    lines = [
        f"{what}, phase {status.phase if status else 'none'}, bound {status.bound_type if status else 'unknown'}",
    ]
    used = {label for r in rows if r.time_from == "observed" for label in r.labels.split(",")}
    weighed = {label for r in rows if " + " in r.time_from for label in r.labels.split(",")}
    ranked = {label for r in rows for label in r.labels.split(",")}
    if shares is not None:
        lines.append(
            f"SM {shares[0]:.1%} and memory {shares[1]:.1%} of peak on "
            f"{(status.gpu.product if status else None) or config.reference_product}; "
            f"strategy {config.hint_strategy}; observed runtimes used for "
            f"{sum(r.time_from == 'observed' for r in rows)} of {len(rows)} products (they replace the "
            f"model once 2 products have {config.min_observed_runs} successful runs each; fewer runs on "
            f"a product are weighed with the model's figure there, which counts as one run)"
        )
    lines += _shares_lines(profile)
    if gpus > 1:
        lines.append(
            f"on {gpus} GPUs together: its interconnect time scales by the link it gets on each product "
            "(NVLink where they fit one NVLink domain, else PCIe); the network between nodes is not measured"
        )
    lines += _reference_lines(profile, config, catalog, calibration, gpus)
    lines += _source_lines(profile, catalog)
    for o in status.observations if status else []:
        why = (
            f"not used: its runs held {o.gang_gpus} GPUs together, not {gpus}, over another link"
            if o.gang_gpus is not None and o.gang_gpus != gpus and status is not None and status.measured_links
            else "used" if o.product in used
            else "weighed with the model, which counts as one run" if o.product in weighed
            else "not in this cluster" if o.product not in ranked
            else f"not used: fewer than {config.min_observed_runs} runs" if o.runs < config.min_observed_runs
            else f"not used: no second product has {config.min_observed_runs} runs"
        )  # fmt: skip
        gang = f" on {o.gang_gpus} GPUs together" if o.gang_gpus else ""
        lines.append(f"observed on {o.product}{gang}: {o.runs} runs, mean {o.mean_seconds} s ({why})")
    return lines


def cut_line(rows: list[PlacementRow], cap: float) -> str:
    """What "Wait or run slow" does with these rows: the products kept off and their slowdowns."""
    if cap <= 0:
        return "maxSlowdown 0: no product is kept off (every product present may run it)"
    kept = [f"{r.product} ({r.slowdown:g}x)" for r in rows if r.cut == "kept-off"]
    if not kept:
        return f"maxSlowdown {cap:g}: every product is within {cap:g}x of the best: none is kept off"
    return (
        f"maxSlowdown {cap:g}: required onto the products within {cap:g}x of the best; kept off "
        + ", ".join(kept)
        + ": the workload waits for an acceptable product rather than run there"
    )


_FIGURE_WORDS = {
    "calibrated": "calibrated",
    "measured": "catalog, measured",
    "datasheet": "datasheet x factor",
}
_RESTS_ON = {
    "calibrated": "the cluster's calibration",
    "measured": "the catalog's measurements",
    "datasheet": "the datasheet (times a factor)",
}


def _reference_lines(
    profile: WorkloadProfile, config: Config, catalog: Catalog, calibration: Calibration, gpus: int = 1
) -> list[str]:
    """The product the profile was measured on and, per unit its time uses, what the figures its
    shares are converted with rest on: every row the model predicts rests on them."""
    found = reference_of(
        profile,
        catalog=catalog,
        calibration=calibration,
        min_calibration_runs=config.min_calibration_runs,
        gpus=gpus,
    )
    if found is None:
        return []
    units = "; ".join(f"{unit} {_FIGURE_WORDS[source]}" for unit, source in found.by_unit)
    return [
        f"measured on {found.product}, whose figures rest on {_RESTS_ON[found.figures]} "
        f"({units or 'no unit scales'}): so does every prediction of the model"
    ]


def _shares_lines(profile: WorkloadProfile) -> list[str]:
    """The time shares the model scales, by unit, and whether the profile carried them or they were
    derived from an older profile's throughputs (docs/ranking.md "The units model")."""
    status = profile.status
    shares = profile_shares(profile)
    if status is None or shares is None:
        return []
    carried = status.time_shares is not None and status.time_shares.fractions() is not None
    said = ", ".join(
        f"{unit} {shares.get(unit, 0.0):.0%}"
        if unit != "interconnect" or unit in shares
        else f"{unit} unmeasured"
        for unit in UNITS
        if unit != "interconnect" or unit in shares or status.source == "telemetry"
    )
    origin = (
        "the profile's timeShares"
        if carried
        else "a profile from before time shares, ranked by the roofline of its SM and memory throughputs"
    )
    return [f"time shares: {said} ({origin})"]


def _source_lines(profile: WorkloadProfile, catalog: Catalog) -> list[str]:
    """Where the bound type and metrics come from, and for a telemetry profile the DCGM counters
    the mapping used (docs/ranking.md "Telemetry profiles")."""
    status = profile.status
    if status is None:
        return []
    lines = [f"source: {status.source or 'nsight-compute'}"]
    telemetry_figures = not nsight_compute_figures(status) and status.source == "telemetry"
    best = next(
        (
            r
            for r in status.telemetry
            if (r.product, r.gang_gpus) == (status.gpu.product, status.gpu.gang_gpus)
        ),
        None,
    )
    for record in status.telemetry:
        role = (
            "the figures come from these" if telemetry_figures and record is best
            else "kept as evidence; Nsight Compute's figures come first" if not telemetry_figures
            else "kept as evidence"
        )  # fmt: skip
        gang = f" on {record.gang_gpus} GPUs together" if record.gang_gpus else ""
        lines.append(
            f"telemetry on {record.product}{gang}: {record.runs} runs, {record.seconds} GPU-seconds ({role})"
        )
    if telemetry_figures and best is not None:
        derived, links = derive_record(best, catalog)
        used = ", ".join(f"{name} {best.counters[name]}" for name in derived.used)
        lines.append(f"counters used: {used or 'none'}")
        if derived.reason:
            lines.append(f"bound type unknown: {derived.reason}")
        if links.activity is not None:
            rates = ", ".join(f"{kind} {rate:.1f} GB/s" for kind, rate in sorted(links.rates.items()))
            lines.append(f"interconnect: links {links.activity:.0%} busy ({rates}, both ways)")
        elif any(name in LINK_COUNTERS for name in best.counters) or links.rates:
            lines.append(f"interconnect unmeasured: {links.reason}")
    return lines


def format_table(rows: list[PlacementRow]) -> str:
    """The rows as columns; LABELS (the node label values read as the product) only where some
    differ from the product itself (a -SHARED or MIG variant), else it would repeat PRODUCT."""
    columns = list(PlacementRow.__dataclass_fields__)
    if all(r.labels == r.product for r in rows):
        columns.remove("labels")
    if all(r.interconnect_gbs == "-" for r in rows):  # one GPU: no link scales anything
        columns.remove("interconnect_gbs")
        columns.remove("interconnect_from")
    cells = [[str(asdict(r)[c]) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    header = [c.upper().replace("_", " ") for c in columns]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"
