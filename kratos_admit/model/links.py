"""A gang's links from DCGM's counters (DESIGN "The interconnect", docs/ranking.md): which counters
measure NVLink and PCIe, the rates they give, and the links' activity against a product's figures.
Pure; ``telemetry.py`` asks for these counters and folds the activity into a profile's time shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from kratos_admit.model.catalog import GpuProduct

# Links (DCGM's dcgm_fields.h, docs/ranking.md "The interconnect"): rates in bytes per second of the whole
# GPU, all its links (1009-1012; PROF_NVLINK_* in no counters file dcgm-exporter ships), and field 449,
# NVLink transmit and receive together in MB/s (in dcgm-exporter's defaults, typed counter)
PCIE_TX_BYTES: Final = "DCGM_FI_PROF_PCIE_TX_BYTES"
PCIE_RX_BYTES: Final = "DCGM_FI_PROF_PCIE_RX_BYTES"
NVLINK_TX_BYTES: Final = "DCGM_FI_PROF_NVLINK_TX_BYTES"
NVLINK_RX_BYTES: Final = "DCGM_FI_PROF_NVLINK_RX_BYTES"
NVLINK_BANDWIDTH_TOTAL: Final = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
LINK_COUNTERS: Final = (
    NVLINK_TX_BYTES,
    NVLINK_RX_BYTES,
    NVLINK_BANDWIDTH_TOTAL,
    PCIE_TX_BYTES,
    PCIE_RX_BYTES,
)


@dataclass(frozen=True)
class LinkReading:
    """The links' activity over a run: the busier of NVLink's and PCIe's achieved rate (both
    directions) over the product's figure for that link; or, None, why it is unmeasured."""

    activity: float | None
    rates: Mapping[str, float] = field(default_factory=dict)  # NVLink, PCIe: GB/s both ways
    missing: tuple[str, ...] = ()  # the counters that would have measured it
    reason: str = ""


def link_rates(counters: Mapping[str, float]) -> dict[str, float]:
    """GB/s both directions together, per link the counters measure: NVLink from PROF_NVLINK_TX/RX
    (bytes/s), else NVLINK_BANDWIDTH_TOTAL (MB/s, both ways already); PCIe from PROF_PCIE_TX/RX."""
    rates: dict[str, float] = {}
    if NVLINK_TX_BYTES in counters and NVLINK_RX_BYTES in counters:
        rates["NVLink"] = (counters[NVLINK_TX_BYTES] + counters[NVLINK_RX_BYTES]) / 1e9
    elif NVLINK_BANDWIDTH_TOTAL in counters:
        rates["NVLink"] = counters[NVLINK_BANDWIDTH_TOTAL] / 1e3
    if PCIE_TX_BYTES in counters and PCIE_RX_BYTES in counters:
        rates["PCIe"] = (counters[PCIE_TX_BYTES] + counters[PCIE_RX_BYTES]) / 1e9
    return {link: max(rate, 0.0) for link, rate in rates.items()}


def link_activity(counters: Mapping[str, float], product: GpuProduct | None) -> LinkReading:
    """How busy the run kept its links, read as DRAM_ACTIVE is for memory: each link's achieved rate
    over the product's figure for it (NVLink's where the catalog has one, PCIe's x16), the busier of
    the two. Unmeasured (never 0) when a link the product has shows no counter, or the catalog has no
    figure: the missing counters are named."""
    rates = link_rates(counters)
    missing: list[str] = []
    if product is not None and product.nvlink_gbs is not None and "NVLink" not in rates:
        missing.append(f"{NVLINK_TX_BYTES}/{NVLINK_RX_BYTES} (or {NVLINK_BANDWIDTH_TOTAL})")
    if "PCIe" not in rates:
        missing.append(f"{PCIE_TX_BYTES}/{PCIE_RX_BYTES}")
    if missing:
        return LinkReading(None, rates, tuple(missing), "no " + " and no ".join(missing))
    pcie = product.pcie_bandwidth_gbs if product is not None else None
    if product is None or pcie is None:
        what = product.product if product is not None else "a product the catalog does not know"
        return LinkReading(None, rates, (), f"the catalog has no link figures for {what}")
    busy = [rates["PCIe"] / pcie]
    if product.nvlink_gbs is not None:
        busy.append(rates["NVLink"] / product.nvlink_gbs)
    return LinkReading(min(max(busy), 1.0), rates)
