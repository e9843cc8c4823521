from __future__ import annotations

from pathlib import Path

import pytest

from kratos_admit.config import ConfigError, env_name, load_config


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
        ("maxGpusPerPods: 4\n", {}, "maxGpusPerPods: Extra inputs are not permitted"),
        ("maxGpusPerPod: 0\n", {}, "maxGpusPerPod: Input should be greater than or equal to 1"),
        ("scheduler: slurm\n", {}, "scheduler: Input should be 'default', 'kai' or 'volcano'"),
        ("priorityClasses: {urgent: x}\n", {}, "priorityClasses.urgent"),
        ("profilingCapabilities: [perfmon]\n", {}, "profilingCapabilities"),
        ("listen: nowhere\n", {}, "listen"),
        ("", {"KRATOS_MAX_GPUS_PER_POD": "lots"}, "KRATOS_MAX_GPUS_PER_POD: maxGpusPerPod"),
        ("- a list\n", {}, "must be a mapping"),
        ("key: [\n", {}, "not valid YAML"),
    ],
)
def test_bad_configuration_is_one_line_naming_the_key(tmp_path: Path, text, environ, message):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ=environ)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_text_settings_from_the_environment_are_taken_as_written():
    config = load_config(
        environ={"KRATOS_PROFILES_DIR": "on", "KRATOS_TLS_CERT_FILE": "0755", "KRATOS_METRICS_LISTEN": "127.0.0.1:9090",
                 "KRATOS_KAI_QUEUE": "yes", "KRATOS_PROFILING_DEFAULT": "false"}
    )  # fmt: skip
    assert config.profiles_dir == Path("on") and config.tls_cert_file == Path("0755")
    assert config.metrics_listen == "127.0.0.1:9090" and config.kai_queue == "yes"
    assert config.profiling_default is False  # non-text settings are still read as YAML
