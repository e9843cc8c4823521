"""One pydantic model for all configuration: a YAML file, then ``KRATOS_*`` environment overrides.

The environment names are derived from the YAML keys (``maxGpusPerPod`` -> ``KRATOS_MAX_GPUS_PER_POD``,
``nsightComputeImage`` -> ``KRATOS_NSIGHT_COMPUTE_IMAGE`` as DESIGN fixes it). That mapping, plus
reading each value as a YAML scalar so lists and numbers work, is ten lines; pydantic-settings would
add a dependency and its own precedence rules for no gain here.
"""

from __future__ import annotations

import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from kratos_admit import vocabulary as v
from kratos_admit.manifests import ManifestError, parse_yaml
from kratos_admit.quantity import parse_quantity

StoreSource = Literal["cluster", "files"]
ENV_PREFIX = "KRATOS_"


class ConfigError(ValueError):
    """Configuration that cannot be used; the message is one line naming the key."""


class ResourceRequirements(BaseModel):
    """A container's ``resources`` (requests and limits as Kubernetes quantities)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, values: dict[str, str]) -> dict[str, str]:
        for name, quantity in values.items():
            if parse_quantity(quantity) is None:
                raise ValueError(f"{name}: {quantity!r} is not a Kubernetes quantity")
        return values

    def as_dict(self) -> dict[str, dict[str, str]]:
        return {k: dict(val) for k, val in (("requests", self.requests), ("limits", self.limits)) if val}


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)

    runtime_class_name: str = "nvidia"
    nsight_compute_image: str = "kratos-nsight-compute-poc:latest"
    ncu_set: str = "basic"
    ncu_launch_count: int = Field(default=20, ge=1)
    ncu_launch_skip: int = Field(default=0, ge=0)
    profiling_deadline_seconds: int = Field(default=3600, ge=60)
    profiling_capabilities: tuple[str, ...] = ()
    # stage-workload gets these in full; profiling-runner gets the requests for any of cpu/memory
    # the user's container sets neither a request nor a limit for (never a limit the workload
    # did not have: one could kill it under ncu).
    profiling_resources: ResourceRequirements = Field(
        default_factory=lambda: ResourceRequirements(
            requests={"cpu": "100m", "memory": "128Mi"}, limits={"cpu": "1", "memory": "512Mi"}
        )
    )
    profiling_default: bool = True
    max_gpus_per_pod: int = Field(default=8, ge=1)
    scheduler: v.SchedulerBackend = "default"
    kai_queue: str = "default-queue"
    priority_classes: dict[v.Priority, str] = Field(default_factory=dict)
    hint_strategy: v.Strategy = "performance"
    reference_product: str = "NVIDIA-A100-SXM4-80GB"
    min_observed_runs: int = Field(default=3, ge=1)
    min_calibration_runs: int = Field(default=5, ge=1)
    catalog_file: Path | None = None
    listen: str = "0.0.0.0:8443"
    metrics_listen: str | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    signing_key_file: Path | None = None
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    source: StoreSource = "cluster"
    profiles_dir: Path | None = None
    nodes_file: Path | None = None
    shutdown_grace_seconds: float = Field(default=5.0, ge=0, le=60)
    lease_namespace: str = "kratos-system"
    lease_name: str = "kratos-profiler-controller"
    lease_duration_seconds: int = Field(default=15, ge=3)
    resync_seconds: float = Field(default=300.0, ge=1)
    controller_metrics_listen: str = "0.0.0.0:9090"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("profiling_capabilities")
    @classmethod
    def _capabilities_are_names(cls, caps: tuple[str, ...]) -> tuple[str, ...]:
        for cap in caps:
            if not re.fullmatch(r"[A-Z_]+", cap):
                raise ValueError(f"{cap!r} is not a capability name such as PERFMON or SYS_ADMIN")
        return caps

    @field_validator("listen", "metrics_listen", "controller_metrics_listen")
    @classmethod
    def _is_host_port(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)
        return value


def split_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def env_name(key: str) -> str:
    return ENV_PREFIX + re.sub(r"(?<!^)(?=[A-Z])", "_", key).upper()


def _is_text(annotation: Any) -> bool:
    """str, Path, and optional or union forms of them: taken as written, never read as YAML
    (which would make ``on`` a bool and ``0755`` an int)."""
    is_union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    members = typing.get_args(annotation) if is_union else (annotation,)
    return any(member in (str, Path) for member in members)


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name, field in Config.model_fields.items():
        key = field.alias or name
        raw = environ.get(env_name(key))
        if raw is None:
            continue
        parsed = raw if _is_text(field.annotation) else yaml.safe_load(raw) if raw.strip() else None
        values[key] = parsed
        origin[key] = env_name(key)
    return values, origin


def load_config(
    path: Path | None = None, *, environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] = {}
) -> Config:
    """File, then environment, then explicit overrides (CLI flags); a bad key stops with one line."""
    data: dict[str, Any] = {}
    where = "config"
    if path is not None:
        where = str(path)
        try:
            loaded = parse_yaml(path.read_text("utf-8"), str(path))
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        except ManifestError as exc:
            raise ConfigError(str(exc)) from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: must be a mapping of configuration keys")
        data.update(loaded or {})
    env_values, origin = _env_overrides(os.environ if environ is None else environ)
    data.update(env_values)
    data.update({k: val for k, val in overrides.items() if val is not None})
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        source = origin.get(str(err["loc"][0]), where) if err["loc"] else where
        raise ConfigError(f"{source}: {key}: {err['msg']}") from None
