"""DCGM telemetry into a profile (kratos_admit/telemetry.py): reading dcgm-exporter's exposition,
selecting a Pod's series, per-GPU then per-Pod means, and the mapping to throughputs and a bound
type (docs/ranking.md, "Telemetry profiles"). Each behaviour runs on captures written for the
project (tests/data/dcgm) and, where present, on real ones from public sources."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from kratos_admit.domain.config import TelemetryLabels
from kratos_admit.domain.profile import MAX_COUNTED_RUNS, ProfileStatus
from kratos_admit.model.telemetry import (
    COUNTERS,
    DEFAULT_COUNTERS,
    DRAM_ACTIVE,
    GR_ENGINE_ACTIVE,
    PIPE_FP32_ACTIVE,
    PIPE_FP64_ACTIVE,
    PIPE_TENSOR_ACTIVE,
    PREFIX,
    SM_ACTIVE,
    SM_OCCUPANCY,
    Sample,
    TelemetryRun,
    derive,
    describe_gpu,
    gpu_key,
    measuring_product,
    parse_exposition,
    per_gpu,
    pod_samples,
    pod_telemetry,
    product_of,
    with_telemetry,
)
from tests.builders import make_profile
from tests.harness import CATALOG, DATA, require_fixtures

LABELS = TelemetryLabels()
OUR_CAPTURES = DATA / "dcgm"
VGPU_UTIL = "DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION"


@dataclass(frozen=True)
class PodExpectation:
    """What one Pod's series in a capture must give (figures derived by hand from the file)."""

    namespace: str
    pod: str
    gpus: int
    bound: str
    sm: str | None = None
    memory: str | None = None
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class CaptureExpectation:
    gpus: int  # GPUs and MIG instances over the whole capture
    skipped: int = 0  # sample lines with a value that is not a number
    product: str = ""
    pods: tuple[PodExpectation, ...] = ()
    node_bound: str | None = None  # the bound type of all the capture's GPUs taken together


OURS = {
    "k8s-h100x4-two-pods.txt": CaptureExpectation(
        gpus=4,
        product="NVIDIA-H100-80GB-HBM3",
        pods=(
            # GPUs 0 and 1: tensor (0.7124+0.6876)/2 = 0.70, DRAM (0.30125+0.31875)/2 = 0.31
            PodExpectation("team-a", "train-llm-0-x7k2p", 2, "compute", "70.00", "31.00"),
            # GPU 2: tensor 0.0512, DRAM 0.1229, engine 0.40 (under 60 %: latency, not ambiguous)
            PodExpectation("team-b", "embed-svc-6d9f8-q2wz", 1, "latency", "5.12", "12.29"),
        ),
    ),
    "servicemonitor-a100-extended-exported-labels.txt": CaptureExpectation(
        gpus=1,
        product="NVIDIA-A100-SXM4-80GB",
        # DESIGN's example: DRAM 0.8, PIPE_FP32 0.15, SMs busy 95 %: memory-bound
        pods=(PodExpectation("team-c", "stream-triad-5", 1, "memory", "15.00", "80.00"),),
        node_bound="memory",
    ),
    "mig-a100-instances-split-families-broken-value.txt": CaptureExpectation(
        gpus=3,
        skipped=3,
        product="NVIDIA-A100-SXM4-40GB",
        pods=(
            PodExpectation("team-d", "infer-a-0", 1, "compute", "82.00", "31.00"),
            PodExpectation("team-d", "infer-b-0", 1, "memory", "2.00", "90.00"),
        ),
    ),
    "geforce-no-profiling-counters.txt": CaptureExpectation(
        gpus=1,
        product="NVIDIA-GeForce-RTX-4090",
        pods=(PodExpectation("team-e", "render-job-8xq4t", 1, "unknown", missing=DEFAULT_COUNTERS),),
        node_bound="unknown",
    ),
}

OUTSIDE = {
    "lke-rtx4000ada-k8s-pod-full.txt": CaptureExpectation(
        gpus=1,
        product="NVIDIA-RTX-4000-Ada-Generation",
        pods=(PodExpectation("default", "cuda-75454ffb9f-8ljq7", 1, "latency", "0.00", "0.31"),),
    ),
    "aicr-eks-h100x8-k8s-pod-sampled.txt": CaptureExpectation(
        gpus=8,
        product="NVIDIA-H100-80GB-HBM3",
        # the excerpt has no profiling counter at all: the Pod's GPU lacks every default counter
        pods=(
            PodExpectation(
                "dynamo-workload", "vllm-agg-0-vllmdecodeworker-s65j5", 1, "unknown", missing=DEFAULT_COUNTERS
            ),
        ),
        node_bound="unknown",
    ),
    "johnsblog-a800x8-mig-idle.txt": CaptureExpectation(
        gpus=10,  # GPU 0 as three MIG instances (no whole-GPU row), GPUs 1-7 whole
        skipped=10,
        product="NVIDIA-A800-SXM4-80GB",
        node_bound="latency",
    ),
    "nvdocs-a100-mig-busy-prof.txt": CaptureExpectation(
        gpus=2,  # the whole GPU and instance 13, its families split by a blank line
        node_bound="compute",  # tensor (0.92926+0.930433)/2 = 92.98, DRAM (0.690789+0.800339)/2 = 74.56
    ),
    "ericsson-t4-busy-no-help.txt": CaptureExpectation(
        gpus=1, product="Tesla-T4", node_bound="latency"
    ),  # tensor 0.58, DRAM 9.28, engine 15.6 %
    "kops-aws-l4-idle-full.txt": CaptureExpectation(gpus=1, product="NVIDIA-L4", node_bound="latency"),
}


def _check_capture(path: Path, expected: CaptureExpectation) -> None:
    exposition = parse_exposition(path.read_text("utf-8"))
    assert exposition.samples
    assert len(exposition.skipped) == expected.skipped, exposition.skipped
    for reason in exposition.skipped:
        assert VGPU_UTIL in reason and "line " in reason
    for sample in exposition.samples:
        if sample.name in COUNTERS:
            assert 0.0 <= sample.value <= 1.0, sample
    assert len(per_gpu(exposition.samples, LABELS)) == expected.gpus
    assert product_of(exposition.samples, LABELS) == expected.product
    if expected.node_bound is not None:
        assert derive(pod_telemetry(exposition.samples, LABELS).counters).bound_type == expected.node_bound
    for pod in expected.pods:
        selected = pod_samples(exposition.samples, namespace=pod.namespace, pod=pod.pod, labels=LABELS)
        found = pod_telemetry(selected, LABELS)
        derived = derive(found.counters)
        assert (len(found.gpus), derived.bound_type, found.missing) == (pod.gpus, pod.bound, pod.missing)
        assert derived.metrics.get("smThroughput") == pod.sm
        assert derived.metrics.get("memoryThroughput") == pod.memory


@pytest.mark.parametrize("name", sorted(OURS))
def test_each_project_capture_reads_as_its_expectation_says(name: str):
    _check_capture(OUR_CAPTURES / name, OURS[name])


def test_every_project_capture_has_an_expectation():
    assert {p.name for p in OUR_CAPTURES.glob("*.txt")} == set(OURS)


@pytest.mark.parametrize("name", sorted(OUTSIDE))
def test_each_real_dcgm_exporter_capture_reads_as_its_expectation_says(name: str):
    _check_capture(require_fixtures() / "dcgm" / name, OUTSIDE[name])


def test_every_real_capture_on_disk_has_an_expectation():
    found = {p.name for p in (require_fixtures() / "dcgm").iterdir() if p.name != "SOURCES.md"}
    assert found == set(OUTSIDE)


def test_an_unreadable_value_skips_its_line_only_and_says_which():
    text = (
        "# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge\n"
        'DCGM_FI_PROF_DRAM_ACTIVE{gpu="0"} 0.5\n'
        'DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION{gpu="0"} ERROR - FAILED TO CONVERT TO STRING\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0"} 0.25\n'
    )
    exposition = parse_exposition(text)
    assert [(s.name, s.value) for s in exposition.samples] == [
        (DRAM_ACTIVE, 0.5),
        (PIPE_TENSOR_ACTIVE, 0.25),
    ]
    assert len(exposition.skipped) == 1 and exposition.skipped[0].startswith(f"line 3: {VGPU_UTIL}: ")


def _sample(name: str, value: float, **labels: str) -> Sample:
    return Sample(name, labels, value)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        pytest.param({"gpu": "0", "UUID": "GPU-a"}, "GPU-a", id="whole-gpu-by-uuid"),
        pytest.param({"gpu": "3"}, "3", id="index-when-no-uuid"),
        pytest.param({"gpu": "0", "UUID": "GPU-a", "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "7"}, "GPU-a/7", id="mig-instance"),
    ],
)  # fmt: skip
def test_a_gpu_is_its_uuid_and_a_mig_instance_is_apart(labels: dict[str, str], expected: str):
    assert gpu_key(_sample(DRAM_ACTIVE, 0.1, **labels), LABELS) == expected


def test_a_pod_seen_under_both_label_spellings_is_one_pod_and_each_gpu_is_averaged_first():
    samples = [
        _sample(DRAM_ACTIVE, 0.2, UUID="GPU-a", namespace="ns", pod="p"),
        _sample(DRAM_ACTIVE, 0.4, UUID="GPU-a", exported_namespace="ns", exported_pod="p", namespace="gpu-operator", pod="exporter"),
        _sample(DRAM_ACTIVE, 0.9, UUID="GPU-b", namespace="ns", pod="p"),
        _sample(DRAM_ACTIVE, 0.1, UUID="GPU-c", namespace="ns", pod="other"),
        _sample(DRAM_ACTIVE, 0.1, UUID="GPU-d", namespace="other", pod="p"),
    ]  # fmt: skip
    found = pod_telemetry(pod_samples(samples, namespace="ns", pod="p", labels=LABELS), LABELS)
    # GPU-a: (0.2 + 0.4) / 2 = 0.3; then over GPU-a and GPU-b: (0.3 + 0.9) / 2 = 0.6
    assert found.gpus == ("GPU-a", "GPU-b") and found.counters == {DRAM_ACTIVE: pytest.approx(0.6)}


def test_configured_label_names_select_series_of_the_old_exporter_namespace():
    labels = TelemetryLabels.model_validate(
        {"namespace": ["pod_namespace"], "pod": ["pod_name"], "UUID": ["uuid"]}
    )
    samples = [_sample(DRAM_ACTIVE, 0.7, uuid="GPU-x", pod_namespace="ns", pod_name="p")]
    found = pod_telemetry(pod_samples(samples, namespace="ns", pod="p", labels=labels), labels)
    assert found.gpus == ("GPU-x",) and found.counters == {DRAM_ACTIVE: 0.7}


def test_a_gpu_without_profiling_counters_is_named_missing_beside_one_with_them():
    samples = [
        _sample("DCGM_FI_DEV_GPU_UTIL", 90, UUID="GPU-a"),
        _sample("DCGM_FI_DEV_GPU_UTIL", 90, UUID="GPU-b"),
        *(_sample(name, 0.5, UUID="GPU-b") for name in DEFAULT_COUNTERS),
    ]
    found = pod_telemetry(samples, LABELS)
    assert found.gpus == ("GPU-a", "GPU-b") and found.missing == DEFAULT_COUNTERS
    assert set(found.counters) == set(DEFAULT_COUNTERS) and found.lacking == ("GPU-a",)


def test_a_mig_instance_is_described_with_its_profile_host_and_container():
    sample = _sample(
        DRAM_ACTIVE, 0.1, gpu="0", UUID="GPU-a", GPU_I_PROFILE="2g.20gb", GPU_I_ID="5",
        hostname="node-1", exported_container="main",
    )  # fmt: skip
    assert describe_gpu(sample, LABELS) == "GPU-a MIG instance 5 (2g.20gb) on node-1 container main"


@pytest.mark.parametrize(
    ("counters", "bound", "sm", "memory"),
    [
        pytest.param({DRAM_ACTIVE: 0.8, PIPE_FP32_ACTIVE: 0.15, SM_ACTIVE: 0.95, GR_ENGINE_ACTIVE: 0.97}, "memory", "15.00", "80.00", id="design-example-memory-however-busy-the-sms"),
        pytest.param({DRAM_ACTIVE: 0.2, PIPE_TENSOR_ACTIVE: 0.9, GR_ENGINE_ACTIVE: 0.99}, "compute", "90.00", "20.00", id="tensor-core-compute"),
        pytest.param({DRAM_ACTIVE: 0.7, PIPE_TENSOR_ACTIVE: 0.05, PIPE_FP64_ACTIVE: 0.75, PIPE_FP32_ACTIVE: 0.1}, "balanced", "75.00", "70.00", id="busiest-pipe-fp64-against-dram"),
        pytest.param({DRAM_ACTIVE: 0.3, PIPE_TENSOR_ACTIVE: 0.1, GR_ENGINE_ACTIVE: 0.4}, "latency", "10.00", "30.00", id="both-low-engine-idle"),
        pytest.param({DRAM_ACTIVE: 0.3, PIPE_TENSOR_ACTIVE: 0.0, GR_ENGINE_ACTIVE: 0.95}, "unknown", "0.00", "30.00", id="default-set-cannot-tell-cuda-core-compute-from-latency"),
        pytest.param({DRAM_ACTIVE: 0.3, PIPE_TENSOR_ACTIVE: 0.0, PIPE_FP32_ACTIVE: 0.2, GR_ENGINE_ACTIVE: 0.95}, "latency", "20.00", "30.00", id="extended-set-tells-them-apart"),
        pytest.param({DRAM_ACTIVE: 0.5, SM_ACTIVE: 0.99, GR_ENGINE_ACTIVE: 0.99}, "unknown", None, "50.00", id="residency-is-not-throughput"),
        pytest.param({}, "unknown", None, None, id="no-counters"),
    ],
)  # fmt: skip
def test_counters_map_to_throughputs_and_a_bound_type(counters, bound, sm, memory):
    derived = derive(counters)
    assert (
        derived.bound_type,
        derived.metrics.get("smThroughput"),
        derived.metrics.get("memoryThroughput"),
    ) == (
        bound,
        sm,
        memory,
    )
    assert (derived.reason != "") == (bound == "unknown")


def test_occupancy_is_over_the_active_sms_as_nsight_compute_counts_it():
    derived = derive({DRAM_ACTIVE: 0.8, PIPE_FP32_ACTIVE: 0.15, SM_ACTIVE: 0.8, SM_OCCUPANCY: 0.4})
    assert derived.metrics["achievedOccupancy"] == "50.00"
    assert set(derived.used) == {DRAM_ACTIVE, PIPE_FP32_ACTIVE, SM_ACTIVE, SM_OCCUPANCY}


def test_every_counter_name_is_a_dcgm_profiling_field():
    assert all(name.startswith(PREFIX) for name in COUNTERS) and len(set(COUNTERS)) == 8


A100, L4 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"
NOW = "2026-11-25T08:00:00Z"


def _run(
    uid: str, product: str = A100, seconds: float = 100, gpus: int = 1, **counters: float
) -> TelemetryRun:
    named = {"DCGM_FI_PROF_" + name.upper(): value for name, value in counters.items()}
    return TelemetryRun(uid, product, seconds, gpus, named)


def test_a_workload_without_a_profile_gets_a_ready_one_from_telemetry():
    status = with_telemetry(
        None, _run("pod-1", seconds=300, gpus=2, dram_active=0.8, pipe_fp32_active=0.15), now=NOW
    )
    assert status is not None
    assert status.as_status() == {
        "phase": "Ready",
        "boundType": "memory",
        "source": "telemetry",
        "metrics": {"smThroughput": "15.00", "memoryThroughput": "80.00", "dramThroughput": "80.00"},
        # DRAM at its saturation (0.8) all the run long: all of its time is DRAM's
        "timeShares": {"tensor": "0.00", "fp32": "0.00", "fp64": "0.00", "memory": "1.00", "latency": "0.00"},
        "gpu": {"product": A100},
        "profiledAt": NOW,
        "message": f"from DCGM telemetry of 1 run(s), 600 GPU-seconds on {A100}",
        "observations": [],
        "countedRuns": [],
        "observedRuns": 0,
        "telemetry": [
            {
                "product": A100,
                "runs": 1,
                "seconds": "600",
                "counters": {"DCGM_FI_PROF_DRAM_ACTIVE": "0.8", "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "0.15"},
            }
        ],
        "countedTelemetry": ["pod-1"],
    }


def test_runs_fold_by_gpu_seconds_and_a_pod_counts_once():
    first = with_telemetry(
        None, _run("a", seconds=100, gpus=1, dram_active=0.9, pipe_tensor_active=0.1), now=NOW
    )
    # 3 GPUs for 100 s weigh 300 against the first run's 100: DRAM (0.9*100 + 0.5*300) / 400 = 0.6
    second = with_telemetry(
        first, _run("b", seconds=100, gpus=3, dram_active=0.5, gr_engine_active=0.7), now=NOW
    )
    assert second is not None and with_telemetry(second, _run("b", dram_active=0.0), now=NOW) is None
    (record,) = second.telemetry
    assert (record.runs, record.seconds) == (2, "400")
    assert record.counters == {
        "DCGM_FI_PROF_DRAM_ACTIVE": "0.6",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "0.7",  # only the second run had it
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0.1",  # only the first run had it: kept
    }
    # tensor 10 %, DRAM 60 %: not both under 60, 50 points apart
    assert (second.bound_type, second.metrics.sm_throughput, second.metrics.memory_throughput) == (
        "memory",
        "10.00",
        "60.00",
    )


def test_the_product_with_most_gpu_seconds_gives_the_figures():
    status = with_telemetry(
        None, _run("a", A100, seconds=1000, dram_active=0.85, pipe_tensor_active=0.1), now=NOW
    )
    status = with_telemetry(
        status, _run("b", L4, seconds=100, dram_active=0.2, pipe_tensor_active=0.9), now=NOW
    )
    assert status is not None and [r.product for r in status.telemetry] == [A100, L4]
    assert (status.gpu.product, status.bound_type) == (A100, "memory")


def test_measured_ground_gives_the_figures_as_soon_as_a_run_there_is_counted():
    """Issue 52: a gang's first runs land where base hints let them (a T4 whose catalog FP32 is wrong,
    say); one run counted on the H100 80GB HBM3, whose figures are all measured, and the profile is
    read as measured there, however few its GPU-seconds."""
    h100, t4 = "NVIDIA-H100-80GB-HBM3", "Tesla-T4"
    status = with_telemetry(
        None, _run("a", t4, seconds=3000, pipe_fp32_active=0.7), now=NOW, known=CATALOG.measured_ground
    )
    assert status is not None and status.gpu.product == t4
    status = with_telemetry(
        status, _run("b", h100, seconds=60, pipe_fp32_active=0.4), now=NOW, known=CATALOG.measured_ground
    )
    assert status is not None and status.gpu.product == h100
    assert measuring_product({t4: 3000.0, h100: 60.0}) == t4, "without the catalog: the most GPU-seconds"
    assert measuring_product({t4: 3000.0, f"{h100}-SHARED": 60.0}, CATALOG.measured_ground) == t4


@pytest.mark.parametrize(
    ("phase", "source", "keeps_figures"),
    [
        pytest.param("Ready", "nsight-compute", True, id="nsight-compute-profile-keeps-precedence"),
        pytest.param("Ready", None, True, id="profile-from-before-sources-is-nsight-compute"),
        pytest.param("Profiling", None, True, id="nsight-compute-run-under-way"),
        pytest.param("Failed", None, False, id="failed-profiling-run-is-no-profile"),
        pytest.param("Ready", "telemetry", False, id="telemetry-profile-follows-telemetry"),
    ],
)
def test_an_nsight_compute_profile_keeps_its_bound_type_and_metrics(phase, source, keeps_figures):
    profile = make_profile(phase=phase, bound="compute", sm="88.00", mem="12.00", product=L4)
    assert profile.status is not None
    before = profile.status.model_copy(update={"source": source})
    after = with_telemetry(before, _run("pod-9", A100, dram_active=0.8, pipe_fp32_active=0.15), now=NOW)
    assert after is not None and [r.product for r in after.telemetry] == [A100]
    figures = (after.phase, after.bound_type, after.metrics, after.gpu, after.source)
    if keeps_figures:
        assert figures == (before.phase, before.bound_type, before.metrics, before.gpu, before.source)
    else:
        assert (after.phase, after.bound_type, after.gpu.product, after.source) == (
            "Ready",
            "memory",
            A100,
            "telemetry",
        )


def test_the_counted_pods_are_bounded():
    status: ProfileStatus | None = None
    for i in range(MAX_COUNTED_RUNS + 5):
        status = with_telemetry(status, _run(f"pod-{i}", dram_active=0.5), now=NOW)
    assert status is not None and len(status.counted_telemetry) == MAX_COUNTED_RUNS
    assert (
        status.counted_telemetry[-1] == f"pod-{MAX_COUNTED_RUNS + 4}"
        and status.telemetry[0].runs == MAX_COUNTED_RUNS + 5
    )
