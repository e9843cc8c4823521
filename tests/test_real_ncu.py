"""The runner against a real Nsight Compute, opt-in: ``KRATOS_TEST_NCU=/path/to/ncu``.

The suite is hermetic (no other test reaches a host's ``ncu``, wherever Nsight Compute is installed),
so these run only when told which ``ncu`` to use; the real-node tier of the end-to-end suite runs the
same program inside the runner image. Checked with Debian's ``nsight-compute`` 2022.3.0.22~11.8.0-5~deb12u1
(``KRATOS_TEST_NCU=/usr/bin/ncu``), on a machine without a GPU or driver; the CUDA toolkit's
``/usr/local/cuda/bin/ncu`` (a script that runs the latest Nsight Compute it finds) is followed to the
program it runs, as ``kratos_runner.tools`` follows it.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from kratos_runner.cli import main, parse_section_sets
from kratos_runner.tools import real_ncu, sections_of

NCU = os.environ.get("KRATOS_TEST_NCU", "")
pytestmark = pytest.mark.skipif(
    not NCU, reason="KRATOS_TEST_NCU names no real ncu (opt-in: the suite is hermetic)"
)
# every metric the parser reads, as the SpeedOfLight and Occupancy sections name them
PARSER_METRICS = (
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__time_duration.sum",
)


def sections_dir() -> Path:
    """The sections/ the real ncu reads: two levels above the program itself, found through whichever
    wrapper leads to it (Nsight Compute's own, Debian's link, the CUDA toolkit's bin/ncu script)."""
    return Path(sections_of(real_ncu(NCU)))


def test_the_basic_set_is_asked_for_as_a_set_this_ncu_has_and_it_measures_what_the_parser_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("KRATOS_TERMINATION_LOG", str(tmp_path / "termination-log"))
    listed = subprocess.run(
        [NCU, "--list-sets"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    sets = parse_section_sets(listed)
    assert sets, listed
    out, err = io.StringIO(), io.StringIO()
    main(["--ncu", NCU, "--set", "basic", "--launch-count", "1", "--", "/bin/true"], stdout=out, stderr=err)
    summary = json.loads((tmp_path / "termination-log").read_text())
    assert summary["ncuSet"] in sets and summary["ncuSet"] in ("basic", "default")
    assert "No metrics to collect" not in out.getvalue(), out.getvalue()
    assert summary["ncuVersion"], "the version ncu --version printed"
    chosen = summary["ncuSet"]
    text = "\n".join(p.read_text() for p in sections_dir().glob("*.section"))
    in_set = "\n".join(
        block
        for block in re.split(r"(?m)^Identifier: ", text)
        if re.search(rf'Identifier: "{chosen}"', block)
    )
    for metric in PARSER_METRICS:
        assert metric in in_set, (
            f"{metric} is not collected by the set {chosen!r} of ncu {summary['ncuVersion']}"
        )
