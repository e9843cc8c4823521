"""Parse what Nsight Compute prints or exports into per-kernel figures. Pure functions over text.

Three layouts are read: the ``--page raw`` CSV (one row per kernel, a units row under the header),
the details-page CSV (one row per kernel x metric, older and newer column sets), and the text
report ``ncu`` prints without ``--csv``. Program output before or between report lines is skipped.
"""

from __future__ import annotations

import csv
import io
import math
import re

# canonical name -> the metric names that carry it, best first (raw names, then details-page labels)
CANONICAL = {
    "sm": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "Compute (SM) Throughput", "SM [%]", "SOL SM"),
    "mem": (
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "Memory Throughput",
        "Memory [%]",
        "SOL Memory",
    ),
    "occupancy": ("sm__warps_active.avg.pct_of_peak_sustained_active", "Achieved Occupancy"),
    "l2": (
        "lts__throughput.avg.pct_of_peak_sustained_elapsed",
        "lts__t_sectors.avg.pct_of_peak_sustained_elapsed",
        "L2 Cache Throughput",
    ),
    "dram": (
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "DRAM Throughput",
    ),
    "duration": ("gpu__time_duration.sum", "Duration"),
    # the arithmetic pipes, as the basic set of later versions measures them (units.py reads them)
    "tensor": (
        "sm__pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
    ),
    "tensorAll": ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",),
    "dmma": ("sm__pipe_tensor_op_dmma_cycles_active.avg.pct_of_peak_sustained_elapsed",),
    "fp64": ("sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_elapsed",),
    "fma": ("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_elapsed",),
}
_LABELS = {name: canonical for canonical, names in CANONICAL.items() for name in names}
_TIME_UNITS = {
    "ns": 1.0, "nsecond": 1.0, "nsec": 1.0,
    "us": 1e3, "usecond": 1e3, "usec": 1e3,
    "ms": 1e6, "msecond": 1e6, "msec": 1e6,
    "s": 1e9, "second": 1e9, "sec": 1e9,
}  # fmt: skip
_NO_VALUE = re.compile(r"^\(!\)\s*|^$")
_KERNEL_LINE = re.compile(
    r"^  (?P<name>\S.*?), (?:.*?, )?Context \d+, Stream \d+(?:, Device (?P<device>\d+), CC (?P<cc>\d+\.\d+))?\s*$"
)
_PROCESS_LINE = re.compile(r"^\[(?P<pid>\d+)\] (?P<name>.+)@")
_DASHES = re.compile(r"^\s*-{3,}(?: -{3,})*\s*$")


class Kernel:
    """One profiled kernel launch and the canonical figures found for it."""

    def __init__(self, key: tuple[str, str], name: str) -> None:
        self.key = key
        self.name = name
        self.metrics: dict[str, float] = {}
        self.seen: dict[str, bool] = {}  # canonical metric present in the report, even as n/a
        self._ranks: dict[str, int] = {}
        self.device_name: str | None = None
        self.compute_capability: str | None = None
        self.grid = ""  # "(1056, 1, 1)" as ncu prints it; "" where the layout does not say
        self.block = ""

    def record(self, label: str, unit: str, raw_value: str, section: str = "") -> None:
        """Keep a figure under its canonical name; a better-ranked source name wins over a worse one."""
        label, unit = label.strip(), unit.strip()
        canonical = _LABELS.get(label)
        if canonical is None or not _accepts(canonical, label, unit, section):
            return
        self.seen[canonical] = True
        value = parse_number(raw_value)
        if value is None:
            return
        if canonical == "duration":
            value *= _TIME_UNITS.get(unit.lower(), 1.0)
        rank = CANONICAL[canonical].index(label)
        if rank <= self._ranks.get(canonical, rank):
            self._ranks[canonical] = rank
            self.metrics[canonical] = value


def _accepts(canonical: str, label: str, unit: str, section: str) -> bool:
    """Details-page labels are reused across sections: keep only the Speed Of Light/Occupancy ones."""
    if "__" in label:
        return True
    if canonical == "duration":
        return unit.lower() in _TIME_UNITS
    if canonical == "occupancy":
        return unit == "%"
    return unit == "%" and (not section or "speed of light" in section.lower() or section == "SpeedOfLight")


def parse_number(text: str) -> float | None:
    """``8,192`` -> 8192.0; ``n/a``, ``(!) nan``, ``no data`` and the like -> None."""
    cleaned = _NO_VALUE.sub("", text.strip()).replace(",", "").strip()
    if not cleaned:
        return None
    try:
        value = float(cleaned)
    except ValueError:
        return None
    if math.isnan(value) or math.isinf(value):
        return None
    return value


class Report:
    """Everything the parser found: kernels in order, and notes that explain an empty result."""

    def __init__(self, layout: str) -> None:
        self.layout = layout
        self.kernels: list[Kernel] = []
        self.errors: list[str] = []
        self.report_files: list[str] = []
        self._by_key: dict[tuple[str, str], Kernel] = {}

    def kernel(self, key: tuple[str, str], name: str) -> Kernel:
        found = self._by_key.get(key)
        if found is None:
            found = Kernel(key, name)
            self._by_key[key] = found
            self.kernels.append(found)
        return found


def parse_report(text: str) -> Report:
    """Detect the layout and parse; never raises for odd input (an empty Report says why)."""
    lines = text.splitlines()
    header_index = next((i for i, line in enumerate(lines) if line.lstrip().startswith('"ID",')), None)
    if header_index is not None:
        body = "\n".join(line.strip() for line in lines[header_index:])
        header = next(csv.reader([lines[header_index].strip()]))
        if "Metric Name" in header and "Metric Value" in header:
            report = _parse_details_csv(body)
        else:
            report = _parse_raw_csv(body)
    else:
        report = _parse_text(lines)
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("==ERROR=="):
            report.errors.append(stripped[len("==ERROR==") :].strip())
        marker = stripped.find("==PROF== Report:")
        if marker >= 0:
            report.report_files.append(stripped[marker + len("==PROF== Report:") :].strip())
    return report


def _rows(body: str) -> list[list[str]]:
    return [row for row in csv.reader(io.StringIO(body)) if row]


def _cell(row: list[str], column: dict[str, int], name: str) -> str:
    i = column.get(name)
    return row[i] if i is not None and i < len(row) else ""


def _parse_raw_csv(body: str) -> Report:
    report = Report("csv-raw")
    rows = _rows(body)
    header = rows[0]
    units = rows[1] if len(rows) > 1 and rows[1] and rows[1][0] == "" else [""] * len(header)
    column = {name: i for i, name in enumerate(header)}
    start = 2 if units is not rows[0] and len(rows) > 1 and rows[1] and rows[1][0] == "" else 1
    for row in rows[start:]:
        if len(row) < 5 or not row[0].strip().isdigit():
            continue  # ragged or foreign line (program output after the table)

        def get(name: str, row: list[str] = row) -> str:
            return _cell(row, column, name)

        kernel = report.kernel((get("Process ID"), row[0]), get("Kernel Name"))
        for name, i in column.items():
            if i < len(row):
                kernel.record(name, units[i] if i < len(units) else "", row[i])
        kernel.device_name = get("device__attribute_display_name") or None
        kernel.grid, kernel.block = get("Grid Size"), get("Block Size")
        cc = get("CC")
        if not cc and get("device__attribute_compute_capability_major"):
            cc = (
                get("device__attribute_compute_capability_major")
                + "."
                + get("device__attribute_compute_capability_minor")
            )
        kernel.compute_capability = cc or None
    return report


def _parse_details_csv(body: str) -> Report:
    report = Report("csv-details")
    rows = _rows(body)
    header = rows[0]
    column = {name: i for i, name in enumerate(header)}
    needed = [column[n] for n in ("ID", "Kernel Name", "Metric Name", "Metric Value") if n in column]
    for row in rows[1:]:
        if len(row) <= max(needed) or not row[0].strip().isdigit():
            continue

        def get(name: str, row: list[str] = row) -> str:
            return _cell(row, column, name)

        kernel = report.kernel((get("Process ID"), row[0]), get("Kernel Name"))
        kernel.record(get("Metric Name"), get("Metric Unit"), get("Metric Value"), get("Section Name"))
        if get("CC"):
            kernel.compute_capability = get("CC")
    return report


def _spans(dashes: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"-+", dashes)]


def _split_row(line: str, spans: list[tuple[int, int]]) -> tuple[str, str, str]:
    if len(spans) == 3:
        name = line[: spans[1][0]].strip()
        unit = line[spans[1][0] : spans[2][0]].strip()
        value = line[spans[2][0] :].strip()
        return name, unit, value
    parts = re.split(r"\s{2,}", line.strip())
    if len(parts) >= 3:
        return parts[0], parts[-2], parts[-1]
    return parts[0], "", parts[-1] if len(parts) > 1 else ""


def _parse_text(lines: list[str]) -> Report:
    report = Report("text")
    process = ""
    kernel: Kernel | None = None
    section = ""
    spans: list[tuple[int, int]] = []
    in_table = False
    last_was_header = False
    for line in lines:
        process_match = _PROCESS_LINE.match(line)
        if process_match:
            process = process_match.group("pid")
            kernel = None
            continue
        kernel_match = _KERNEL_LINE.match(line)
        if kernel_match and process:
            kernel = report.kernel((process, str(len(report.kernels))), kernel_match.group("name"))
            kernel.compute_capability = kernel_match.group("cc")
            section, in_table = "", False
            continue
        if kernel is None:
            continue
        stripped = line.strip()
        if stripped.startswith("Section:"):
            section, in_table = stripped[len("Section:") :].strip(), False
            continue
        if _DASHES.match(line):
            if not in_table:
                in_table, spans = True, _spans(line)
            elif not last_was_header:
                in_table = False
            last_was_header = False
            continue
        if not in_table or not stripped:
            continue
        name, unit, value = _split_row(line, spans)
        last_was_header = name == "Metric Name"
        if not last_was_header:
            kernel.record(name, unit, value, section)
    return report
