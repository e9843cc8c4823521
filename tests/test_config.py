from __future__ import annotations

from pathlib import Path

import pytest

from kratos_admit.domain.config import NOT_SETTINGS, Config, ConfigError, env_name, load_config, setting_names


def test_defaults_match_design():
    config = load_config(environ={})
    assert config.max_gpus_per_pod == 8
    assert config.runtime_class_name == "nvidia"
    assert config.nsight_compute_image == "kratos-nsight-compute-poc:latest"
    assert config.profiling_default is True and config.profiling_capabilities == ()
    assert config.listen == "0.0.0.0:8443" and config.scheduler == "default"


def test_yaml_file_then_environment_then_flags(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "maxGpusPerPod: 4\nscheduler: kai\nkaiQueue: research\npriorityClasses: {high: gpu-high}\n"
    )
    config = load_config(
        path,
        environ={
            "KRATOS_NSIGHT_COMPUTE_IMAGE": "registry.example/ncu:2025.1",
            "KRATOS_MAX_GPUS_PER_POD": "2",
            "KRATOS_PROFILING_CAPABILITIES": "[PERFMON]",
        },
        overrides={"listen": "127.0.0.1:9443"},
    )
    assert config.nsight_compute_image == "registry.example/ncu:2025.1"
    assert config.max_gpus_per_pod == 2 and config.scheduler == "kai" and config.kai_queue == "research"
    assert config.priority_classes == {"high": "gpu-high"} and config.profiling_capabilities == ("PERFMON",)
    assert config.listen == "127.0.0.1:9443"


def test_env_names_follow_the_yaml_keys():
    assert env_name("nsightComputeImage") == "KRATOS_NSIGHT_COMPUTE_IMAGE"
    assert env_name("maxGpusPerPod") == "KRATOS_MAX_GPUS_PER_POD"


@pytest.mark.parametrize(
    ("text", "environ", "message"),
    [
        pytest.param("maxGpusPerPods: 4\n", {}, "maxGpusPerPods: no such setting (did you mean maxGpusPerPod?)", id="unknown-key"),
        pytest.param("maxGpusPerPod: 0\n", {}, "maxGpusPerPod: 0 given, must be at least 1", id="below-minimum"),
        pytest.param("scheduler: slurm\n", {}, "scheduler: 'slurm' given, must be one of default, kai, volcano", id="not-a-choice"),
        pytest.param("priorityClasses: {urgent: x}\n", {}, "priorityClasses: key 'urgent' given, must be one of high, normal, low", id="bad-map-key"),
        pytest.param("profilingCapabilities: PERFMON\n", {}, "profilingCapabilities: 'PERFMON' given, must be a list, such as [PERFMON]", id="not-a-list"),
        pytest.param("profilingCapabilities: [perfmon]\n", {}, "profilingCapabilities: 'perfmon' is not a capability name", id="bad-capability"),
        pytest.param("profilingResources: {request: {}}\n", {}, "profilingResources.request: no such setting (did you mean requests?)", id="unknown-nested-key"),
        pytest.param("listen: nowhere\n", {}, "listen: 'nowhere' is not HOST:PORT", id="bad-address"),
        pytest.param("followerReleaseSeconds: 5\n", {}, "followerReleaseSeconds: 5 given, must be at least 60", id="release-too-soon"),
        pytest.param("", {"KRATOS_MAX_GPUS_PER_POD": "lots"}, "KRATOS_MAX_GPUS_PER_POD: maxGpusPerPod: 'lots' given, must be a whole number", id="env-not-a-number"),
        pytest.param("", {"KRATOS_PROFILING_CAPABILITIES": "[PERFMON"}, "KRATOS_PROFILING_CAPABILITIES: '[PERFMON' is not valid YAML", id="env-not-yaml"),
        pytest.param("", {"KRATOS_BOGUS_KEY": "1"}, "KRATOS_BOGUS_KEY: no such setting", id="env-unknown"),
        pytest.param("", {"KRATOS_SCHEDULR": "kai"}, "KRATOS_SCHEDULR: no such setting (did you mean KRATOS_SCHEDULER?)", id="env-typo"),
        pytest.param("telemetry: {prometheusURL: prometheus:9090}\n", {}, "telemetry.prometheusURL: 'prometheus:9090' is not an http:// or https:// URL", id="telemetry-url-without-scheme"),
        pytest.param("telemetry: {windowSeconds: 10}\n", {}, "telemetry.windowSeconds: 10 given, must be at least 60", id="telemetry-window-too-short"),
        pytest.param("telemetry: {labels: {pod: [exported-pod]}}\n", {}, "telemetry.labels.pod: 'exported-pod' is not a Prometheus label name", id="telemetry-bad-label-name"),
        pytest.param("telemetry: {labels: {pods: [pod]}}\n", {}, "telemetry.labels.pods: no such setting (did you mean pod?)", id="telemetry-unknown-label-key"),
        pytest.param("", {"KRATOS_TELEMETRY": "{prometheusUrl: http://p}"}, "KRATOS_TELEMETRY: telemetry.prometheusUrl: no such setting (did you mean prometheusURL?)", id="env-telemetry-key-case"),
        pytest.param("- a list\n", {}, "must be a mapping", id="not-a-mapping"),
        pytest.param("key: [\n", {}, "not valid YAML", id="not-yaml"),
    ],
)  # fmt: skip
def test_bad_configuration_is_one_line_naming_the_key(tmp_path: Path, text, environ, message):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ=environ)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert "Input should" not in str(err.value) and "Extra inputs" not in str(err.value)


@pytest.mark.parametrize("variable", sorted(NOT_SETTINGS))
def test_kratos_variables_read_by_something_else_are_not_settings_and_pass(variable: str):
    assert load_config(environ={variable: "/some/path"}) == load_config(environ={})


def test_every_setting_has_its_variable_and_no_variable_is_both():
    assert set(setting_names().values()) == {f.alias for f in Config.model_fields.values()}
    assert NOT_SETTINGS.isdisjoint(setting_names())


def test_follower_release_delay_defaults_to_three_minutes():
    assert load_config(environ={}).follower_release_seconds == 180
    assert load_config(environ={"KRATOS_FOLLOWER_RELEASE_SECONDS": "600"}).follower_release_seconds == 600


def test_text_settings_from_the_environment_are_taken_as_written():
    config = load_config(
        environ={"KRATOS_PROFILES_DIR": "on", "KRATOS_TLS_CERT_FILE": "0755", "KRATOS_METRICS_LISTEN": "127.0.0.1:9090",
                 "KRATOS_KAI_QUEUE": "yes", "KRATOS_PROFILING_DEFAULT": "false"}
    )  # fmt: skip
    assert config.profiles_dir == Path("on") and config.tls_cert_file == Path("0755")
    assert config.metrics_listen == "127.0.0.1:9090" and config.kai_queue == "yes"
    assert config.profiling_default is False  # non-text settings are still read as YAML


def test_a_telemetry_variable_sets_its_own_keys_and_keeps_the_files_labels(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "telemetry: {labels: {pod: [pod_name], namespace: [pod_namespace]}, windowSeconds: 300}\n"
    )
    config = load_config(
        path, environ={"KRATOS_TELEMETRY": "{prometheusURL: 'https://prometheus.monitoring:9090/'}"}
    )
    telemetry = config.telemetry
    assert (
        telemetry.prometheus_url == "https://prometheus.monitoring:9090" and telemetry.window_seconds == 300
    )
    assert telemetry.labels.pod_pairs() == [("pod_namespace", "pod_name")]


def test_telemetry_is_off_by_default_and_its_labels_fit_the_gpu_operator():
    telemetry = load_config(environ={}).telemetry
    assert telemetry.prometheus_url is None
    assert telemetry.labels.pod_pairs() == [("namespace", "pod"), ("exported_namespace", "exported_pod")]
    assert telemetry.labels.hostname == ("Hostname", "hostname") and telemetry.labels.uuid == ("UUID",)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("KRATOS_WEBHOOK_SERVICE_HOST", "10.0.0.12"),
        ("KRATOS_WEBHOOK_SERVICE_PORT", "443"),
        ("KRATOS_WEBHOOK_SERVICE_PORT_HTTPS", "443"),
        ("KRATOS_WEBHOOK_PORT", "tcp://10.0.0.12:443"),
        ("KRATOS_WEBHOOK_PORT_443_TCP", "tcp://10.0.0.12:443"),
        ("KRATOS_WEBHOOK_PORT_443_TCP_PROTO", "tcp"),
        ("KRATOS_WEBHOOK_PORT_443_TCP_PORT", "443"),
        ("KRATOS_WEBHOOK_PORT_443_TCP_ADDR", "10.0.0.12"),
        ("KRATOS_FOO_PORT_53_UDP", "udp://[fd00::7]:53"),
        ("KRATOS_FOO_SERVICE_HOST", "fd00::7"),
    ],
)
def test_the_kubelets_service_link_variables_are_not_settings(variable: str, value: str):
    """Issue 33: what the kubelet injects for a Service named kratos-... (kubernetes
    pkg/kubelet/envvars/envvars.go) is passed over, never "no such setting"."""
    assert load_config(environ={variable: value}) == load_config(environ={})


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("KRATOS_WEBHOOK_PORT", "8443"),  # not a link's tcp://HOST:PORT
        ("KRATOS_METRICS_PORT", "9090"),
        ("KRATOS_WEBHOOK_SERVICE_HOST", "webhook.example.com"),  # a link's value is a ClusterIP
        ("KRATOS_WEBHOOK_PORT_443_TCP_PROTO", "https"),
    ],
)
def test_a_variable_only_shaped_like_a_service_link_is_still_an_error(variable: str, value: str):
    with pytest.raises(ConfigError, match=f"{variable}: no such setting"):
        load_config(environ={variable: value})
