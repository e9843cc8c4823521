"""The placement report: what the ranking decided for one profile on one cluster, and from what.

Pure: ``placement_rows(profile, nodes, catalog, config) -> rows``; the CLI prints them as a table a
person reads before trusting the hints (``kratos-admit placement``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from kratos_admit.decisions.calibration import NO_CALIBRATION, Calibration, FactorSupport
from kratos_admit.decisions.hints import ranking_of
from kratos_admit.decisions.ranking import throughput_shares
from kratos_admit.decisions.telemetry import derive, nsight_compute_figures
from kratos_admit.domain.catalog import Catalog, mig_profile_of
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import WorkloadProfile


@dataclass(frozen=True, slots=True)
class PlacementRow:
    product: str
    labels: str
    share: str  # "whole GPU", or the MIG slice's share of compute and memory
    fp32_tflops: float
    fp32_from: (
        str  # "calibrated (...)", "catalog, measured", "catalog, datasheet x factor", or "MIG share of ..."
    )
    bandwidth_gbs: float
    bandwidth_from: str
    relative_time: float
    # "model", "calibrated" or "observed"; "model + 1 run" where the workload's own runs there,
    # fewer than minObservedRuns, were weighed with the model's figure
    time_from: str
    weight: int


def _calibrated_source(support: FactorSupport) -> str:
    return f"calibrated (/{support.factor:g}, {support.runs} runs, {support.workloads} workloads)"


def _figure_source(measured: float | None) -> str:
    return "measured" if measured is not None else "datasheet x factor"


def placement_rows(
    profile: WorkloadProfile,
    node_products: Iterable[str],
    *,
    catalog: Catalog,
    config: Config,
    calibration: Calibration = NO_CALIBRATION,
) -> list[PlacementRow]:
    """One row per ranked product, best first; empty when the profile gives nothing to rank by."""
    ranked = ranking_of(profile, node_products, config=config, catalog=catalog, calibration=calibration)
    rows = []
    for r in ranked:
        entry = r.product
        mig = mig_profile_of(entry.product)
        base = catalog.lookup(entry.product)
        if mig is not None and base is not None:
            share = (
                f"MIG {mig}: {entry.sustained_fp32_tflops / base.sustained_fp32_tflops:.0%} of compute, "
                f"{entry.sustained_bandwidth_gbs / base.sustained_bandwidth_gbs:.0%} of bandwidth"
            )
            fp32_from = bandwidth_from = f"share of {base.product}"
        else:
            share = "whole GPU"
            fp32_from = _figure_source(entry.measured_fp32_tflops)
            bandwidth_from = _figure_source(entry.measured_bandwidth_gbs)
        own = calibration.get(entry.product)
        fitted = calibration.shares_of(profile.metadata.namespace, profile.spec.workload)
        if r.calibrated and fitted is not None and fitted.profiled == entry.product:
            fp32_from = bandwidth_from = f"re-fitted with the workload's shares ({fitted.runs} runs)"
        else:
            minimum = config.min_calibration_runs
            if own is not None and own.compute.qualifies(minimum):
                fp32_from = _calibrated_source(own.compute)
            elif mig is None:
                fp32_from = f"catalog, {fp32_from}"
            if own is not None and own.memory.qualifies(minimum):
                bandwidth_from = _calibrated_source(own.memory)
            elif mig is None:
                bandwidth_from = f"catalog, {bandwidth_from}"
        rows.append(
            PlacementRow(
                product=entry.product,
                labels=",".join(r.labels),
                share=share,
                fp32_tflops=round(entry.sustained_fp32_tflops, 1),
                fp32_from=fp32_from,
                bandwidth_gbs=round(entry.sustained_bandwidth_gbs),
                bandwidth_from=bandwidth_from,
                relative_time=round(r.relative_time, 3),
                time_from=f"{r.source} + {r.weighed_runs} run{'s' if r.weighed_runs > 1 else ''}"
                if r.weighed_runs
                else r.source,
                weight=r.weight,
            )
        )
    return rows


def placement_header(profile: WorkloadProfile, config: Config, rows: list[PlacementRow]) -> list[str]:
    """What the rows rest on: the profile's figures, the reference GPU, the strategy, and which
    observations were used (a product's runs count once there are ``minObservedRuns`` of them)."""
    status = profile.status
    shares = throughput_shares(profile)
    lines = [
        f"profile {profile.metadata.namespace}/{profile.metadata.name} (workload {profile.spec.workload}), "
        f"phase {status.phase if status else 'none'}, bound {status.bound_type if status else 'unknown'}",
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
    lines += _source_lines(profile)
    for o in status.observations if status else []:
        why = (
            "used" if o.product in used
            else "weighed with the model, which counts as one run" if o.product in weighed
            else "not in this cluster" if o.product not in ranked
            else f"not used: fewer than {config.min_observed_runs} runs" if o.runs < config.min_observed_runs
            else f"not used: no second product has {config.min_observed_runs} runs"
        )  # fmt: skip
        lines.append(f"observed on {o.product}: {o.runs} runs, mean {o.mean_seconds} s ({why})")
    return lines


def _source_lines(profile: WorkloadProfile) -> list[str]:
    """Where the bound type and metrics come from, and for a telemetry profile the DCGM counters
    the mapping used (docs/ranking.md "Telemetry profiles")."""
    status = profile.status
    if status is None:
        return []
    lines = [f"source: {status.source or 'nsight-compute'}"]
    telemetry_figures = not nsight_compute_figures(status) and status.source == "telemetry"
    best = next((r for r in status.telemetry if r.product == status.gpu.product), None)
    for record in status.telemetry:
        role = (
            "the figures come from these" if telemetry_figures and record is best
            else "kept as evidence; Nsight Compute's figures come first" if not telemetry_figures
            else "kept as evidence"
        )  # fmt: skip
        lines.append(
            f"telemetry on {record.product}: {record.runs} runs, {record.seconds} GPU-seconds ({role})"
        )
    if telemetry_figures and best is not None:
        derived = derive({name: float(value) for name, value in best.counters.items()})
        used = ", ".join(f"{name} {best.counters[name]}" for name in derived.used)
        lines.append(f"counters used: {used or 'none'}")
        if derived.reason:
            lines.append(f"bound type unknown: {derived.reason}")
    return lines


def format_table(rows: list[PlacementRow]) -> str:
    """The rows as columns; LABELS (the node label values read as the product) only where some
    differ from the product itself (a -SHARED or MIG variant), else it would repeat PRODUCT."""
    columns = list(PlacementRow.__dataclass_fields__)
    if all(r.labels == r.product for r in rows):
        columns.remove("labels")
    cells = [[str(asdict(r)[c]) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    header = [c.upper().replace("_", " ") for c in columns]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"
