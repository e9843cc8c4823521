"""The hints record (``gpu.scheduler.io/hints``, DESIGN "Hints"): what was injected and why, written
once per distinct answer (memoised) and read back for the ranking source it carries."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from kratos_admit.decisions.acceptable import Cut
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.raw import as_list, as_mapping
from kratos_admit.domain.vocabulary import Unit
from kratos_admit.model.calibration import FIGURES
from kratos_admit.model.exploration import Exploration
from kratos_admit.model.ranking import RankedProduct, RankingSource, Reference


@functools.lru_cache(maxsize=4096)
def hints_record(
    profile: str,
    bound_type: str,
    *,
    strategy: str,
    injected: tuple[str, ...],
    ranked: tuple[RankedProduct, ...],
    reason: str,
    explore: Exploration | None = None,
    gang: str = "",
    reference: Reference | None = None,
    interconnect: str = "",
    gang_gpus: int = 1,
    cut: Cut | None = None,
) -> str:
    """The gpu.scheduler.io/hints annotation: what was injected and why (memoised, it repeats).
    ``profile`` is empty and ``reason`` says why when only base hints were given; ``explore`` names
    the product this Job was sent first to measure a figure, and why; ``gang`` what made it a gang;
    ``reference`` the product the ranked profile was measured on and what its figures rest on
    (``calibrated``, ``measured`` in the catalog, or the ``datasheet``'s times a factor);
    ``interconnect`` what is not measured of a gang's links (``unmeasured across nodes``);
    ``gang_gpus`` the GPUs a gang runs on together as admission read it (``gangGPUs``, above 1 only):
    the link its ranking used, and the controller's key for the runs' observations and telemetry;
    ``cut`` the products a Ready workload may run on and those it is kept off, with their predicted
    slowdowns and the cap (DESIGN "Wait or run slow"), where it narrows."""
    record: dict[str, object] = {
        "profile": profile or None,
        "boundType": bound_type,
        "strategy": strategy,
        "injected": list(injected),
        "ranked": [r.as_dict() for r in ranked],
    }
    if reason:
        record["reason"] = reason
    if reference is not None:
        record["measuredOn"] = {"product": reference.product, "figures": reference.figures}
    if gang:
        record["gang"] = gang
    if gang_gpus > 1:
        record["gangGPUs"] = gang_gpus
    if interconnect:
        record["interconnect"] = interconnect
    if cut is not None and cut.narrows:
        record.update(cut.record())
    if explore is not None:
        record["explore"] = explore.product.product.product
        # what its run measures: the controller counts the exploring Jobs under way by it
        record["exploreFigure"] = explore.figure
        record["exploreReason"] = explore.reason
    return json.dumps(record, separators=(",", ":"))


def recorded_ranking_source(obj: Mapping[str, Any]) -> RankingSource:
    """The ranking source of the hints record on an object's metadata (what ``hints_record`` wrote)."""
    annotations = as_mapping(as_mapping(obj.get("metadata")).get("annotations"))
    try:
        ranked = as_list(as_mapping(json.loads(str(annotations.get(v.HINTS_ANNOTATION, "{}")))).get("ranked"))
    except ValueError:
        return "none"
    if not ranked:
        return "none"
    source = as_mapping(ranked[0]).get("source")
    return "observed" if source == "observed" else "calibrated" if source == "calibrated" else "model"


def recorded_gang_gpus(obj: Mapping[str, Any]) -> int | None:
    """The ``gangGPUs`` of the hints record on an object's metadata (a Pod inherits its template's):
    the GPUs its gang runs on together, above 1; None for no gang, one GPU, or no readable record."""
    annotations = as_mapping(as_mapping(obj.get("metadata")).get("annotations"))
    try:
        found = as_mapping(json.loads(str(annotations.get(v.HINTS_ANNOTATION, "{}")))).get("gangGPUs")
    except ValueError:
        return None
    return found if isinstance(found, int) and not isinstance(found, bool) and found > 1 else None


def recorded_exploration(obj: Mapping[str, Any]) -> tuple[str, Unit] | None:
    """The product and the figure the hints record on an object's metadata says it was sent first to
    measure (``explore``, ``exploreFigure``); None for a Job that does not explore, a record from
    before ``exploreFigure`` was written, or no readable record."""
    annotations = as_mapping(as_mapping(obj.get("metadata")).get("annotations"))
    text = str(annotations.get(v.HINTS_ANNOTATION, ""))
    if '"explore"' not in text:  # most records: no parse
        return None
    try:
        record = as_mapping(json.loads(text))
    except ValueError:
        return None
    product, figure = record.get("explore"), record.get("exploreFigure")
    unit = FIGURES.get(figure) if isinstance(figure, str) else None
    return (product, unit) if isinstance(product, str) and product and unit is not None else None
