"""A telemetry profile's time shares (docs/ranking.md, "Time shares from counters"): DCGM's run-averaged
pipe and DRAM activity -> the share of the run each unit bound, on real dcgm-exporter captures from
public sources and on counters built as the kernels of issue 43's H100 runs would show them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import TelemetryLabels
from kratos_admit.domain.profile import ProfileStatus, TimeShares
from kratos_admit.model.telemetry import (
    DRAM_ACTIVE,
    GR_ENGINE_ACTIVE,
    PIPE_FP16_ACTIVE,
    PIPE_FP32_ACTIVE,
    PIPE_FP64_ACTIVE,
    PIPE_TENSOR_ACTIVE,
    SATURATION,
    SM_ACTIVE,
    TelemetryRun,
    derive,
    parse_exposition,
    pod_samples,
    pod_telemetry,
    time_shares,
    unit_activity,
    with_telemetry,
)
from tests.harness import require_fixtures

LABELS = TelemetryLabels()
NOW = "2026-11-27T18:00:00Z"
A100 = "NVIDIA-A100-SXM4-80GB"


def shares(**given: str) -> dict[str, str | None]:
    """A timeShares block: the units named, every other one 0.00, the interconnect unmeasured (None)
    unless named."""
    return {unit: given.get(unit, None if unit == "interconnect" else "0.00") for unit in v.UNITS}


def as_written(**given: str) -> dict[str, str | None]:
    """``shares`` as the status stores them: an unmeasured interconnect (a run on one GPU) left out."""
    return {unit: share for unit, share in shares(**given).items() if share is not None}


def captured(name: str) -> Path:
    return require_fixtures() / "dcgm" / name


# --- real dcgm-exporter captures (../shared/fixtures/dcgm; skipped when absent) --------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # NVIDIA's own A100 sample, busy: tensor pipe 0.93 (above its 0.9 saturation) and DRAM 0.75 on
        # average over the whole GPU and MIG instance 13: the tensor pipe was saturated the whole time,
        # so DRAM's traffic overlapped it, and the time is the tensor cores'
        pytest.param("nvdocs-a100-mig-busy-prof.txt", shares(tensor="1.00"), id="a100-busy-tensor"),
        # a T4 whose graphics engine was busy 15.6 % of the time: tensor 0.0058 / 0.9 -> 0.01, DRAM
        # 0.0928 / 0.8 -> 0.11 (0.116), the rest latency; the default set sees no CUDA-core pipe
        pytest.param(
            "ericsson-t4-busy-no-help.txt",
            shares(tensor="0.01", memory="0.11", latency="0.88"),
            id="t4-light",
        ),
        pytest.param("kops-aws-l4-idle-full.txt", shares(latency="1.00"), id="l4-idle"),
        pytest.param("johnsblog-a800x8-mig-idle.txt", shares(latency="1.00"), id="a800-mig-idle"),
    ],
)
def test_real_captures_give_the_time_shares_their_counters_say(name: str, expected: dict[str, str]):
    exposition = parse_exposition(captured(name).read_text("utf-8"))
    derived = derive(pod_telemetry(exposition.samples, LABELS).counters)
    assert derived.time_shares is not None
    assert derived.time_shares.model_dump() == expected


def test_a_real_pods_series_on_an_idle_gpu_is_all_latency():
    """LKE's RTX 4000 Ada, in dcgm-exporter's Kubernetes mode: the Pod's GPU was busy 0.5 % of the time."""
    exposition = parse_exposition(captured("lke-rtx4000ada-k8s-pod-full.txt").read_text("utf-8"))
    selected = pod_samples(
        exposition.samples, namespace="default", pod="cuda-75454ffb9f-8ljq7", labels=LABELS
    )
    derived = derive(pod_telemetry(selected, LABELS).counters)
    assert derived.time_shares is not None and derived.time_shares.model_dump() == shares(latency="1.00")


def test_a_real_capture_without_profiling_counters_has_no_time_shares():
    exposition = parse_exposition(captured("aicr-eks-h100x8-k8s-pod-sampled.txt").read_text("utf-8"))
    derived = derive(pod_telemetry(exposition.samples, LABELS).counters)
    assert (derived.bound_type, derived.time_shares) == ("unknown", None)


# --- built counters -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counters", "expected"),
    [
        # DESIGN's memory-bound example: DRAM at its saturation all along, the FP32 pipe's 0.15 overlaps it
        pytest.param(
            {DRAM_ACTIVE: 0.8, PIPE_FP32_ACTIVE: 0.15, PIPE_TENSOR_ACTIVE: 0.0, SM_ACTIVE: 0.95, GR_ENGINE_ACTIVE: 0.97},
            shares(memory="1.00"),
            id="dram-bound-kernel",
        ),
        # the H100's bf16 GEMM: tensor pipe 0.94, DRAM 0.27
        pytest.param(
            {PIPE_TENSOR_ACTIVE: 0.94, DRAM_ACTIVE: 0.27, PIPE_FP32_ACTIVE: 0.02, PIPE_FP64_ACTIVE: 0.0},
            shares(tensor="1.00"),
            id="tensor-gemm",
        ),
        # the H100's FP32 FMA loop: FMA pipe 0.84 (FP32 GEMM 0.78 with DRAM 0.6: FP32 still first)
        pytest.param(
            {PIPE_FP32_ACTIVE: 0.84, PIPE_TENSOR_ACTIVE: 0.05, DRAM_ACTIVE: 0.0, PIPE_FP64_ACTIVE: 0.0},
            shares(fp32="1.00"),
            id="fp32-fma-loop",
        ),
        pytest.param(
            {PIPE_FP32_ACTIVE: 0.78, PIPE_TENSOR_ACTIVE: 0.0, DRAM_ACTIVE: 0.6, PIPE_FP64_ACTIVE: 0.0},
            shares(fp32="0.98", memory="0.02"),
            id="fp32-gemm",
        ),
        # an FP64 stencil on the CUDA cores: 0.75 / 0.8 of the run FP64, the rest DRAM's
        pytest.param(
            {PIPE_FP64_ACTIVE: 0.75, DRAM_ACTIVE: 0.2, PIPE_FP32_ACTIVE: 0.05, PIPE_TENSOR_ACTIVE: 0.0},
            shares(fp64="0.94", memory="0.06"),
            id="fp64-cuda-cores",
        ),
        # FP16 off the tensor cores runs on the CUDA cores: fp32
        pytest.param(
            {PIPE_FP16_ACTIVE: 0.8, PIPE_FP32_ACTIVE: 0.1, PIPE_TENSOR_ACTIVE: 0.0, DRAM_ACTIVE: 0.1},
            shares(fp32="1.00"),
            id="fp16-on-cuda-cores",
        ),
        # a training step: 30 % tensor-bound GEMMs, DRAM-bound elementwise kernels, small kernels;
        # the units add to less than the run, so each keeps its share and the rest is latency
        pytest.param(
            {PIPE_TENSOR_ACTIVE: 0.27, DRAM_ACTIVE: 0.39, PIPE_FP32_ACTIVE: 0.1, PIPE_FP64_ACTIVE: 0.0},
            shares(tensor="0.30", fp32="0.12", memory="0.49", latency="0.09"),
            id="training-step",
        ),
        # half the run on the host (data loading): that half is latency, which no GPU speeds up
        pytest.param(
            {PIPE_TENSOR_ACTIVE: 0.45, DRAM_ACTIVE: 0.1, GR_ENGINE_ACTIVE: 0.5},
            shares(tensor="0.50", memory="0.13", latency="0.37"),
            id="half-idle-default-set",
        ),
        # one warp chasing pointers: the GPU busy, no unit near its saturation
        pytest.param(
            {PIPE_TENSOR_ACTIVE: 0.0, DRAM_ACTIVE: 0.02, PIPE_FP32_ACTIVE: 0.01, PIPE_FP64_ACTIVE: 0.0, GR_ENGINE_ACTIVE: 0.99},
            shares(fp32="0.01", memory="0.03", latency="0.96"),
            id="pointer-chase",
        ),
    ],
)  # fmt: skip
def test_counters_give_each_unit_its_share_of_the_run(counters: dict[str, float], expected: dict[str, str]):
    derived = derive(counters)
    assert derived.time_shares is not None and derived.time_shares.model_dump() == expected


def test_units_busy_at_once_give_the_shared_time_to_the_busiest():
    """Tensor 0.6 / 0.9 = 0.67 of the run and DRAM 0.6 / 0.8 = 0.75 cannot both be exclusive (1.42
    runs): DRAM, the busier, keeps 0.75 and the tensor pipe the 0.25 left; nothing is latency."""
    found = time_shares({"tensor": 0.6, "memory": 0.6})
    assert found is not None and found.model_dump() == shares(tensor="0.25", memory="0.75")


def test_a_unit_is_saturated_below_one_and_never_counts_more_than_the_run():
    assert all(0.5 < level < 1.0 for level in SATURATION.values())
    found = time_shares({"memory": 1.0})
    assert found is not None and found.model_dump() == shares(memory="1.00")


@pytest.mark.parametrize("tensor", [0.0, 0.13, 0.5, 0.77, 1.0])
@pytest.mark.parametrize("dram", [0.0, 0.07, 0.41, 0.8])
@pytest.mark.parametrize("fp32", [0.0, 0.33, 0.9])
def test_shares_are_two_decimals_that_sum_to_exactly_one(tensor: float, dram: float, fp32: float):
    counters = {PIPE_TENSOR_ACTIVE: tensor, DRAM_ACTIVE: dram, PIPE_FP32_ACTIVE: fp32, PIPE_FP64_ACTIVE: 0.01}
    found = derive(counters).time_shares
    assert found is not None
    written = found.model_dump(exclude_none=True)
    assert all(len(value) == 4 and value[1] == "." for value in written.values())
    assert sum(round(float(value) * 100) for value in written.values()) == 100


def test_only_the_counters_present_are_units_seen():
    """The default set shows no CUDA-core pipe: fp32 and fp64 are unseen, not idle."""
    assert unit_activity({PIPE_TENSOR_ACTIVE: 0.4, DRAM_ACTIVE: 0.2, GR_ENGINE_ACTIVE: 0.9}) == {
        "tensor": 0.4,
        "memory": 0.2,
    }
    assert unit_activity({PIPE_FP16_ACTIVE: 0.3, PIPE_FP32_ACTIVE: 0.2}) == {"fp32": 0.3}
    assert time_shares({}) is None


def test_the_default_set_cannot_tell_cuda_core_compute_from_latency_and_gives_no_shares():
    """Engine busy 95 % with the tensor pipe and DRAM idle: an FP32 or FP64 kernel on the CUDA cores,
    or latency; the default counters cannot say which, so the profile has no shares to rank by."""
    derived = derive({GR_ENGINE_ACTIVE: 0.95, PIPE_TENSOR_ACTIVE: 0.02, DRAM_ACTIVE: 0.1})
    assert derived.bound_type == "unknown" and derived.time_shares is None
    assert "PIPE_FP32/FP64_ACTIVE" in derived.reason
    extended = derive(
        {GR_ENGINE_ACTIVE: 0.95, PIPE_TENSOR_ACTIVE: 0.02, DRAM_ACTIVE: 0.1, PIPE_FP32_ACTIVE: 0.76}
    )
    assert extended.time_shares is not None and extended.time_shares.fp32 == "0.95"


def test_fp64_matrix_work_on_tensor_cores_reads_as_tensor():
    """On A100/H100-class GPUs DCGM counts DMMA (FP64 on the tensor cores) in PIPE_TENSOR_ACTIVE, and
    PIPE_FP64_ACTIVE only FP64 on the CUDA cores: a DGEMM there is indistinguishable from a bf16 GEMM."""
    dgemm = derive(
        {PIPE_TENSOR_ACTIVE: 0.9, PIPE_FP64_ACTIVE: 0.02, PIPE_FP32_ACTIVE: 0.03, DRAM_ACTIVE: 0.2}
    )
    assert dgemm.time_shares is not None and dgemm.time_shares.model_dump() == shares(tensor="1.00")


def _run(uid: str, **counters: float) -> TelemetryRun:
    return TelemetryRun(uid, A100, 300.0, 1, counters)


def test_a_telemetry_profile_carries_the_shares_of_its_product_with_most_gpu_seconds():
    status = with_telemetry(None, _run("pod-1", **{PIPE_TENSOR_ACTIVE: 0.45, DRAM_ACTIVE: 0.1}), now=NOW)
    assert status is not None and status.source == "telemetry"
    assert status.as_status()["timeShares"] == as_written(tensor="0.50", memory="0.13", latency="0.37")
    # a second run, tensor-bound all along, moves the GPU-second mean: tensor 0.675, DRAM 0.1
    status = with_telemetry(status, _run("pod-2", **{PIPE_TENSOR_ACTIVE: 0.9, DRAM_ACTIVE: 0.1}), now=NOW)
    assert status is not None
    assert status.as_status()["timeShares"] == as_written(tensor="0.75", memory="0.13", latency="0.12")


def test_a_telemetry_profile_whose_units_cannot_be_told_apart_has_no_time_shares():
    run = _run("pod-1", **{GR_ENGINE_ACTIVE: 0.95, PIPE_TENSOR_ACTIVE: 0.02, DRAM_ACTIVE: 0.1})
    status = with_telemetry(None, run, now=NOW)
    assert status is not None and status.bound_type == "unknown" and "timeShares" not in status.as_status()


def test_an_nsight_compute_profile_keeps_its_own_time_shares():
    measured = TimeShares.model_validate(shares(tensor="0.30", memory="0.27", latency="0.43"))
    ready = ProfileStatus.model_validate(
        {"phase": "Ready", "boundType": "latency", "source": "nsight-compute", "timeShares": measured}
    )
    status = with_telemetry(ready, _run("pod-1", **{PIPE_FP32_ACTIVE: 0.8, DRAM_ACTIVE: 0.1}), now=NOW)
    assert status is not None and status.time_shares == measured and len(status.telemetry) == 1
