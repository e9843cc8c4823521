"""``simulate --kubeconfig`` (docs/placement.md "On a real control plane"): what it creates in the
cluster, and its one-line errors. The run itself needs a real API server and kube-scheduler; the
numbers it gave are in docs/placement.md."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kratos_admit.cli.main import main
from kratos_admit.domain import vocabulary as v
from kratos_admit.simulation.on_cluster import NODE_PREFIX, node_manifest, node_status, pod_manifest
from kratos_admit.simulation.replay import Pending
from kratos_admit.simulation.scheduling import PodRequest
from tests.builders import A100, L40S, sim_node, trace_job
from tests.harness import EXAMPLES, assert_valid_kubernetes, free_port, kubeconfig_for

SIMULATION = EXAMPLES / "simulation"


def test_a_fake_node_carries_the_files_labels_gpu_capacity_and_is_ready():
    node = sim_node("gpu-a100-1", A100, gpus=8, cpu=96, memory_gib=1152)
    manifest = node_manifest(node)
    assert manifest["metadata"]["name"] == NODE_PREFIX + "gpu-a100-1"
    assert manifest["metadata"]["labels"][v.GPU_PRODUCT_LABEL] == A100
    status = node_status(node)["status"]
    assert status["allocatable"][v.GPU_RESOURCE] == "8" and status["allocatable"]["cpu"] == "96000m"
    assert [c["type"] for c in status["conditions"] if c["status"] == "True"] == ["Ready"]
    assert_valid_kubernetes({**manifest, **node_status(node)})


@pytest.mark.parametrize(
    ("spec", "weights", "preferred"),
    [
        pytest.param(None, {}, None, id="default-the-users-pod"),
        pytest.param(None, {A100: 100, L40S: 31}, {A100: 100, L40S: 31}, id="oracle-true-weights"),
        pytest.param(
            {
                "containers": [
                    {"name": "main", "image": "x", "resources": {"limits": {v.GPU_RESOURCE: "1"}}}
                ],
                "runtimeClassName": "nvidia",
            },
            {},
            None,
            id="kratos-the-admitted-template",
        ),
    ],
)
def test_the_pod_is_the_one_the_job_controller_would_make(spec, weights, preferred):
    entry = Pending(0.0, 1, trace_job("stream-0", workload="stream", gpus=2), PodRequest(gpus=2), spec=spec)
    pod = pod_manifest(entry, "stream-0-r1", "kratos-sim-oracle", "oracle", weights)
    assert_valid_kubernetes(pod)
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["metadata"]["labels"][v.WORKLOAD_LABEL] == "stream"
    terms = (
        (pod["spec"].get("affinity") or {})
        .get("nodeAffinity", {})
        .get("preferredDuringSchedulingIgnoredDuringExecution")
    )
    found = (
        {t["preference"]["matchExpressions"][0]["values"][0]: t["weight"] for t in terms} if terms else None
    )
    assert found == preferred
    if spec is None:
        assert pod["spec"]["containers"][0]["resources"]["limits"][v.GPU_RESOURCE] == "2"


def run_cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    return int(main(list(argv), stdout=io.StringIO(), stderr=err)), err.getvalue()


def test_an_api_server_that_cannot_be_reached_exits_2_with_one_line(tmp_path: Path):
    kubeconfig = kubeconfig_for(f"http://127.0.0.1:{free_port()}", tmp_path / "kubeconfig")
    status, err = run_cli(
        "simulate", "--cluster", str(SIMULATION / "cluster.yaml"), "--trace", str(SIMULATION / "trace.yaml"),
        "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    assert status == 2 and "cannot reach the API server" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("scale", ["0", "-1", "2"])
def test_a_time_scale_outside_zero_to_one_exits_2(scale):
    status, err = run_cli(
        "simulate", "--cluster", str(SIMULATION / "cluster.yaml"), "--trace", str(SIMULATION / "trace.yaml"),
        "--kubeconfig", "x", "--time-scale", scale,
    )  # fmt: skip
    assert status == 2 and "--time-scale" in err
