"""One pydantic model for all configuration: a YAML file, then ``KRATOS_*`` environment overrides.

The environment names are derived from the YAML keys (``maxGpusPerPod`` -> ``KRATOS_MAX_GPUS_PER_POD``,
``nsightComputeImage`` -> ``KRATOS_NSIGHT_COMPUTE_IMAGE`` as DESIGN fixes it). That mapping, plus
reading each value as a YAML scalar so lists and numbers work, is ten lines; pydantic-settings would
add a dependency and its own precedence rules for no gain here.

Errors are in KRATOS's words, one line each: the key (and the file or variable it came from), what
was given and what is allowed, never pydantic's ("Extra inputs are not permitted"). A ``KRATOS_*``
variable that names no setting stops start-up too (a typo in an overlay must not pass silently),
except the few that are not settings (``NOT_SETTINGS``) and the kubelet's service-link variables
(``service_link``). A variable holding a mapping (``KRATOS_TELEMETRY``) sets the keys it names and keeps
the file's others.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.manifests import ManifestError, parse_yaml, yaml_problem
from kratos_admit.domain.quantity import parse_quantity

StoreSource = Literal["cluster", "files"]
MAX_SLOWDOWN_DEFAULT = 5.0  # bench/wait_or_run_slow.py; docs/placement.md "Wait or run slow"
ENV_PREFIX = "KRATOS_"
# KRATOS_* variables that are read by something else and name no setting (docs/reference.md "Configuration").
NOT_SETTINGS: frozenset[str] = frozenset(
    {
        "KRATOS_E2E_KUBECONFIG",  # the end-to-end tests' cluster (tests/e2e)
        "KRATOS_TERMINATION_LOG",  # where the profiling runner writes its summary (runner/)
        "KRATOS_STAGE_DIR",  # where the runner looks for a staged executable (runner/, default /kratos/stage)
        "KRATOS_FUZZ_EXAMPLES",  # how many examples the property-based server test tries
        "KRATOS_TEST_OUTSIDE_DATA",  # where the tests find the outside data (tests/harness.py)
        "KRATOS_TEST_NCU",  # a real ncu the opt-in tests run (tests/test_real_ncu.py)
    }
)

# The kubelet's "service links": for every Service of the Pod's namespace (unless the Pod sets
# enableServiceLinks: false) it adds variables named after the Service, upper-cased with '-' as '_'
# (kubernetes pkg/kubelet/envvars/envvars.go, FromServices and makeLinkVariables), so a Service called
# kratos-webhook gives KRATOS_WEBHOOK_SERVICE_HOST=10.0.0.12, KRATOS_WEBHOOK_SERVICE_PORT=443,
# KRATOS_WEBHOOK_SERVICE_PORT_HTTPS=443 (a named port), KRATOS_WEBHOOK_PORT=tcp://10.0.0.12:443, and per
# port KRATOS_WEBHOOK_PORT_443_TCP (the same URL) with _PROTO, _PORT and _ADDR. Both the name's shape
# and the value's are checked, so only what a kubelet writes is passed over.
_SERVICE_LINK_SHAPES: tuple[tuple[re.Pattern[str], re.Pattern[str]], ...] = (
    (re.compile(r"[A-Z0-9_]+_SERVICE_HOST"), re.compile(r"[0-9A-Fa-f.:]+")),
    (re.compile(r"[A-Z0-9_]+_SERVICE_PORT(_[A-Z0-9_]+)?"), re.compile(r"[0-9]{1,5}")),
    (
        re.compile(r"[A-Z0-9_]+_PORT(_[0-9]{1,5}_(TCP|UDP|SCTP))?"),
        re.compile(r"(tcp|udp|sctp)://\S+:[0-9]{1,5}"),
    ),
    (re.compile(r"[A-Z0-9_]+_PORT_[0-9]{1,5}_(TCP|UDP|SCTP)_PROTO"), re.compile(r"tcp|udp|sctp")),
    (re.compile(r"[A-Z0-9_]+_PORT_[0-9]{1,5}_(TCP|UDP|SCTP)_PORT"), re.compile(r"[0-9]{1,5}")),
    (re.compile(r"[A-Z0-9_]+_PORT_[0-9]{1,5}_(TCP|UDP|SCTP)_ADDR"), re.compile(r"[0-9A-Fa-f.:]+")),
)


def service_link(variable: str, value: str) -> bool:
    """Whether ``variable=value`` is one the kubelet injects for a Service (never a setting)."""
    return any(
        name.fullmatch(variable) is not None and shape.fullmatch(value) is not None
        for name, shape in _SERVICE_LINK_SHAPES
    )


# Programs that run something else (a script, a child process), by file name: an absolute command[0]
# named here is not staged alone (the script, its modules and libraries stay in the workload's
# image), so profilingForm auto profiles it in the workload's own image (docs/profiling-forms.md).
# A version suffix is understood: python3.11, pypy3.10 and node18 match python, pypy and node.
DEFAULT_INTERPRETERS: tuple[str, ...] = (
    # language runtimes
    "python", "pypy", "ipython", "jupyter", "julia", "java", "node", "nodejs", "deno", "bun",
    "R", "Rscript", "perl", "ruby", "php", "lua", "luajit", "octave", "matlab", "dotnet", "mono",
    # machine-learning and distributed launchers
    "torchrun", "accelerate", "deepspeed", "horovodrun", "colossalai", "composer", "lightning",
    "ray", "vllm", "uvicorn", "gunicorn", "mpirun", "mpiexec", "orterun", "prterun", "srun",
    "charmrun", "conda", "mamba", "micromamba", "uv", "poetry", "pipenv",
    # shells
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "csh", "tcsh", "fish", "busybox",
    # wrappers that run their arguments
    "env", "nohup", "time", "timeout", "nice", "ionice", "numactl", "taskset", "stdbuf", "chrt",
    "setsid", "tini", "dumb-init", "catchsegv", "xargs", "make",
)  # fmt: skip


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


class TelemetryLabels(BaseModel):
    """The label names dcgm-exporter's series carry, each a list tried in order (docs/ranking.md,
    "Telemetry profiles"). The defaults fit the GPU Operator's dcgm-exporter in Kubernetes mode;
    the ``exported_*`` names are what a ServiceMonitor scrape makes of labels that clash with the
    target's own ``namespace``/``pod``/``container``."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)

    namespace: tuple[str, ...] = Field(default=("namespace", "exported_namespace"), min_length=1)
    pod: tuple[str, ...] = Field(default=("pod", "exported_pod"), min_length=1)
    container: tuple[str, ...] = Field(default=("container", "exported_container"), min_length=1)
    gpu: tuple[str, ...] = Field(default=("gpu",), min_length=1)
    uuid: tuple[str, ...] = Field(default=("UUID",), min_length=1, alias="UUID")
    gpu_instance_profile: tuple[str, ...] = Field(default=("GPU_I_PROFILE",), min_length=1)
    gpu_instance_id: tuple[str, ...] = Field(default=("GPU_I_ID",), min_length=1)
    hostname: tuple[str, ...] = Field(default=("Hostname", "hostname"), min_length=1)
    model_name: tuple[str, ...] = Field(default=("modelName",), min_length=1)

    @field_validator("*")
    @classmethod
    def _label_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name):
                raise ValueError(f"{name!r} is not a Prometheus label name")
        return names

    def pod_pairs(self) -> list[tuple[str, str]]:
        """(namespace label, pod label) pairs, in order: a ServiceMonitor renames both together."""
        return list(zip(self.namespace, self.pod, strict=False))


class TelemetryConfig(BaseModel):
    """Where the controller reads DCGM telemetry (DESIGN "Telemetry profiles"); off without a URL."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)

    prometheus_url: str | None = Field(default=None, alias="prometheusURL")
    window_seconds: float = Field(default=600.0, ge=60)
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    labels: TelemetryLabels = Field(default_factory=TelemetryLabels)
    bearer_token_file: Path | None = None
    ca_file: Path | None = None

    @field_validator("prometheus_url")
    @classmethod
    def _is_http_url(cls, url: str | None) -> str | None:
        if url is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url.rstrip("/") if url else url


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)

    runtime_class_name: str = "nvidia"
    nsight_compute_image: str = "kratos-nsight-compute-poc:latest"
    ncu_set: str = "basic"
    # unset: the runner profiles the steady state it finds (docs/profiling.md); set, either one fixes
    # the launch window as before the steady-state profile (the runner fills the other with 0 or 20)
    ncu_launch_count: int | None = Field(default=None, ge=1)
    ncu_launch_skip: int | None = Field(default=None, ge=0)
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
    profiling_form: v.ProfilingFormSetting = "auto"
    interpreters: tuple[str, ...] = DEFAULT_INTERPRETERS
    max_gpus_per_pod: int = Field(default=8, ge=1)
    scheduler: v.SchedulerBackend = "default"
    kai_queue: str = "default-queue"
    # with scheduler "default": the schedulerName KRATOS sets (the scheduler-affinity component's
    # profile, kratos-scheduler); empty: none, the cluster's default scheduler
    scheduler_name: str = Field(
        default="", pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"
    )
    priority_classes: dict[v.Priority, str] = Field(default_factory=dict)
    hint_strategy: v.Strategy = "performance"
    reference_product: str = "NVIDIA-A100-SXM4-80GB"
    min_observed_runs: int = Field(default=3, ge=1)
    min_calibration_runs: int = Field(default=5, ge=1)
    # profiling runs prefer these GPU products (node label values); empty: the best-calibrated
    # product in the cluster, else the product with the most Nodes (docs/ranking.md)
    profiling_products: tuple[str, ...] = ()
    # this share of a workload's Jobs (by a hash of namespace/name) is sent to the best-ranked product
    # whose figure for its bound type is not yet calibrated; 0 turns exploration off (docs/ranking.md)
    exploration_share: float = Field(default=0.05, ge=0, le=1)
    # a workload with a Ready profile may run only on the products predicted within this many times
    # its best product's time (a required node affinity); 0 turns it off (docs/placement.md "Wait or
    # run slow": the default is chosen there, by measurement)
    max_slowdown: float = Field(default=MAX_SLOWDOWN_DEFAULT, ge=0)
    # the controller writes the calibration ConfigMap at most this often, sooner only when a factor
    # moved beyond its own noise (docs/ranking.md "Where it lives")
    calibration_write_seconds: float = Field(default=30.0, ge=0)
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
    # followers held for a profiling run that never appeared are let go after this; longer than the
    # webhook remembers a run it admitted (60 s), so a run still on its way is not overtaken
    follower_release_seconds: float = Field(default=180.0, ge=60)
    # the controller's leader renews the webhook's serving certificate (where the CA's key is in the
    # cluster) once less than this share of its lifetime remains
    certificate_renew_before: float = Field(default=1 / 3, gt=0, lt=1)
    # a profiling Pod whose image the kubelet cannot pull for this long ends its run (image-pull); a
    # name that cannot parse (InvalidImageName) at once
    image_pull_grace_seconds: float = Field(default=300.0, ge=1)
    # Kueue: the controller runs KRATOS's AdmissionCheck (controllerName gpu.scheduler.io/profile) for
    # the ClusterQueues that list it (the kueue-admission-check component turns it on, with its RBAC)
    kueue_admission_check: bool = False
    controller_metrics_listen: str = "0.0.0.0:9090"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)

    @field_validator("profiling_capabilities")
    @classmethod
    def _capabilities_are_names(cls, caps: tuple[str, ...]) -> tuple[str, ...]:
        for cap in caps:
            if not re.fullmatch(r"[A-Z_]+", cap):
                raise ValueError(f"{cap!r} is not a capability name such as PERFMON or SYS_ADMIN")
        return caps

    @field_validator("interpreters")
    @classmethod
    def _interpreters_are_file_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not name or "/" in name or name.strip() != name:
                raise ValueError(f"{name!r} is not a program's file name such as python3 or torchrun")
        return names

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


def setting_names() -> dict[str, str]:
    """Every setting's environment variable -> its YAML key."""
    return {env_name(field.alias or name): field.alias or name for name, field in Config.model_fields.items()}


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    settings = setting_names()
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or variable in NOT_SETTINGS:
            continue
        key = settings.get(variable)
        if key is None and service_link(variable, environ[variable]):
            continue
        if key is None:
            close = difflib.get_close_matches(variable, list(settings), n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{variable}: no such setting{hint}; docs/reference.md lists them")
        raw = environ[variable]
        field = Config.model_fields[_field_name(key)]
        try:
            parsed = raw if _is_text(field.annotation) else yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{variable}: {raw!r} is not valid YAML: {yaml_problem(exc)}") from None
        values[key] = parsed
        origin[key] = variable
    return values, origin


def _field_name(key: str) -> str:
    return next(name for name, field in Config.model_fields.items() if (field.alias or name) == key)


_EXPECTED = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "text",
    "tuple_type": "a list, such as [PERFMON]",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "path_type": "a file path",
}


def _given(data: Any, loc: tuple[int | str, ...]) -> object:
    """The value the user wrote at ``loc`` (``...`` when it cannot be found)."""
    for part in loc:
        if part == "[key]":
            break
        found = (isinstance(data, Mapping) and part in data) or (
            isinstance(data, list | tuple) and isinstance(part, int) and part < len(data)
        )
        if not found:
            return ...
        data = data[part]
    return data


ModelT = TypeVar("ModelT", bound=BaseModel)


def validated_document(
    model: type[ModelT], data: Any, path: Path, error: type[ValueError], top: str
) -> ModelT:
    """A YAML document of ours (a suite, a trace, a truth file) as ``model``, or ``error`` with one
    line in KRATOS's words: the file, then the field, what was given and what is allowed."""
    if not isinstance(data, dict):
        raise error(f"{path}: {top}, found {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"{path}: {in_our_words(exc.errors()[0], data, model=model, noun='field')}") from None


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as the user reads it: ``jobs[0].metrics``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def in_our_words(
    err: Mapping[str, Any], data: Any, *, model: type[BaseModel] | None = None, noun: str = "setting"
) -> str:
    """One pydantic error of ``model`` (default: Config) as ``key: what was given, what is allowed``."""
    loc = tuple(err["loc"])
    kind, ctx = err["type"], err.get("ctx") or {}
    if loc and loc[-1] == "[key]":  # a mapping key, such as a priorityClasses entry
        loc = loc[:-1]
        given: object = loc[-1]
        prefix = field_path(loc[:-1])
        what = f"key {given!r}"
    else:
        given = _given(data, loc)
        prefix = field_path(loc)
        what = f"{given!r}"
    if kind == "extra_forbidden":
        known = _known_keys(model or Config, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
        return f"{prefix}: no such {noun} ({hint})"
    if kind == "literal_error":
        allowed = str(ctx.get("expected", "")).replace("'", "")
        return f"{prefix}: {what} given, must be one of {allowed.replace(' or ', ', ')}"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        bound = {"greater_than_equal": ("at least", "ge"), "less_than_equal": ("at most", "le"),
                 "greater_than": ("more than", "gt"), "less_than": ("less than", "lt")}[kind]  # fmt: skip
        limit = ctx.get(bound[1])
        return (
            f"{prefix}: {what} given, must be {bound[0]} {limit:g}"
            if isinstance(limit, int | float)
            else (f"{prefix}: {what} given, must be {bound[0]} {limit}")
        )
    if kind == "value_error":
        return f"{prefix}: {ctx.get('error', err['msg'])}"
    if kind == "too_short":
        return f"{prefix}: {what} given, must have at least {ctx.get('min_length')} item(s)"
    if kind == "string_pattern_mismatch":
        return f"{prefix}: {what} given, must match {ctx.get('pattern')}"
    expected = _EXPECTED.get(kind)
    if expected is not None:
        return f"{prefix}: {what} given, must be {expected}"
    return f"{prefix}: {what} given: {str(err['msg'])[:1].lower()}{str(err['msg'])[1:]}"


def _known_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    for part in loc:
        if isinstance(part, int):  # an item of a list of models
            continue
        field = model.model_fields.get(_python_name(model, str(part)))
        annotation = field.annotation if field is not None else None
        members = typing.get_args(annotation) or (annotation,)  # ProfileStatus | None, say
        nested = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if not nested:
            return []
        model = nested[0]
    return [field.alias or name for name, field in model.model_fields.items()]


def _python_name(model: type[BaseModel], key: str) -> str:
    return next((n for n, f in model.model_fields.items() if (f.alias or n) == key), key)


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] = {},
    flags: Mapping[str, str] = {},
) -> Config:
    """File, then environment, then explicit overrides (CLI flags, named in ``flags`` by key, so an
    error names the flag); a bad key stops with one line."""
    data: dict[str, Any] = {}
    where = "config"
    if path is not None:
        where = str(path)
        try:
            loaded = parse_yaml(path.read_text("utf-8"), str(path))
        except IsADirectoryError:
            raise ConfigError(f"{path}: is a directory; --config expects a YAML file") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
        except ManifestError as exc:
            raise ConfigError(str(exc)) from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(
                f"{path}: must be a mapping of configuration keys, found {type(loaded).__name__}"
            )
        data.update(loaded or {})
    env_values, origin = _env_overrides(os.environ if environ is None else environ)
    for key, value in env_values.items():
        # a mapping (``KRATOS_TELEMETRY``) sets its own keys of the file's mapping and keeps the rest,
        # so a component that sets the Prometheus URL composes with labels set in config.yaml
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    given = {k: val for k, val in overrides.items() if val is not None}
    data.update(given)
    origin.update({k: flags[k] for k in given if k in flags})
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        source = origin.get(str(err["loc"][0]), where) if err["loc"] else where
        raise ConfigError(f"{source}: {in_our_words(err, data)}") from None
