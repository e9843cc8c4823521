"""Field paths as values and the error type every validation rule returns (after apimachinery's field pkg)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

# DESIGN "Validation rules": the ids are stable; metrics and messages use them.
Rule = Literal[
    "gpu-count",
    "gpu-max",
    "mig-profile",
    "gpu-sharing",
    "no-gpu",
    "hint-format",
    "workload-name",
    "reserved-key",
    "profiling-target",
]
RULES: Final[tuple[Rule, ...]] = get_args(Rule)


@dataclass(frozen=True, slots=True)
class Path:
    """A Kubernetes-style field path: ``spec.containers[0].resources.limits[nvidia.com/gpu]``."""

    text: str = ""

    def child(self, name: str) -> Path:
        return Path(f"{self.text}.{name}" if self.text else name)

    def index(self, i: int) -> Path:
        return Path(f"{self.text}[{i}]")

    def key(self, k: str) -> Path:
        return Path(f"{self.text}[{k}]")

    def __str__(self) -> str:
        return self.text or "<root>"


ROOT = Path()
METADATA = ROOT.child("metadata")
SPEC = ROOT.child("spec")
TEMPLATE = SPEC.child("template")


@dataclass(frozen=True, slots=True)
class FieldError:
    """One user mistake: which rule, where, the bad value, and why (apimachinery's field.Error).
    Never raised; collected and reported together."""

    rule: Rule
    path: Path
    detail: str
    value: object = None  # the offending value as found, None where the mistake is an absence

    @property
    def field(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return f"{self.field}: {self.detail} ({self.rule})"

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "field": self.field, "message": self.detail}
