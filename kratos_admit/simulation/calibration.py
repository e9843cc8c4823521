"""The calibration the simulated controller publishes (DESIGN "Simulation"): each refit after a counted
run, and the exploring Jobs under way beside it, as the controller counts them from its Jobs' hints
records (docs/ranking.md "Exploration"). Imported by the replay alone: the fit needs numpy, which the
webhook's commands never load."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from kratos_admit.decisions.record import recorded_exploration
from kratos_admit.decisions.stores import StaticCalibrationStore
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.vocabulary import Unit
from kratos_admit.model.calibration import Calibration, samples_of, under_way
from kratos_admit.model.calibration_fit import FitMemo, fit_calibration
from kratos_admit.model.catalog import Catalog
from kratos_admit.simulation.trace import NAMESPACE


class SimulatedCalibration(StaticCalibrationStore):
    """The calibration the simulated controller publishes: each refit (``FitMemo``: it re-fits what the
    counted run moved, as the controller's does), with the exploring Jobs under way, by trace Job
    (product, figure, workload), as the controller counts them from its Jobs' hints records."""

    def __init__(self) -> None:
        super().__init__()
        self.memo = FitMemo()
        self.exploring: dict[str, tuple[str, Unit, str]] = {}

    def started(self, job: str, workload: str, admitted: Mapping[str, Any]) -> None:
        """The trace Job ``job`` admitted as ``admitted``: counted while it runs if it explores."""
        found = recorded_exploration(admitted)
        if found is not None:
            self.exploring[job] = (*found, f"{NAMESPACE}/{workload}")
            self._publish(self.calibration)

    def ended(self, job: str) -> None:
        if self.exploring.pop(job, None) is not None:
            self._publish(self.calibration)

    def refit(self, profiles: Iterable[WorkloadProfile], catalog: Catalog, reference_product: str) -> None:
        samples = samples_of(profiles, catalog, reference_product=reference_product)
        self._publish(fit_calibration(samples, catalog, memo=self.memo))

    def _publish(self, fitted: Calibration) -> None:
        self.calibration = dataclasses.replace(fitted, exploring=under_way(self.exploring.values()))
