"""Calibration learns each product's links (issue 50 item 5, docs/ranking.md "The links' factors"): from
the runs of gangs whose interconnect clearly binds them, a factor per product and link, so a cluster
whose H100 PCIe cards share a PCIe switch by twos ranks its gangs with the link they really get. The
gang's size travels from admission (the hints record's ``gangGPUs``) to its runs' observations and
telemetry, which set the link each run had."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio import client

from kratos_admit.cli.placement import placement_rows
from kratos_admit.decisions.record import hints_record, recorded_gang_gpus
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import ProfileStatus, TimeShares, WorkloadProfile, with_runs
from kratos_admit.domain.vocabulary import Unit
from kratos_admit.model.calibration import (
    Calibration,
    FactorSupport,
    parse_calibration,
    samples_of,
)
from kratos_admit.model.calibration_fit import fit_calibration
from kratos_admit.model.calibration_writes import moved_beyond_noise
from kratos_admit.model.observed import observed_times
from kratos_admit.model.ranking import rank_gpu_products, reference_of
from kratos_admit.model.telemetry import TelemetryRun, with_telemetry
from kratos_admit.simulation.knowledge import Learned, prediction_errors
from kratos_admit.simulation.replay import simulate
from kratos_admit.simulation.trace import Figures, Trace, TraceJob, Truth, time_shares_status
from tests.builders import sim_node
from tests.harness import CATALOG, api_for, api_server
from tests.kube_double import KubeDouble

H100_SXM = "NVIDIA-H100-80GB-HBM3"  # NVLink 4, 900 GB/s to 8 GPUs; measured ground
H100_PCIE = "NVIDIA-H100-PCIe"  # PCIe Gen5, 128 GB/s (bridged pairs only)
L40S = "NVIDIA-L40S"  # PCIe Gen4, 64 GB/s
A100 = "NVIDIA-A100-SXM4-80GB"  # NVLink 3, 600 GB/s to 8 GPUs

# two all-reduce-heavy gangs on 8 GPUs, measured on H100 SXM5s (shares there)
GANGS: dict[str, dict[Unit, float]] = {
    "allreduce-a": {"tensor": 0.30, "memory": 0.05, "interconnect": 0.60, "latency": 0.05},
    "allreduce-b": {"tensor": 0.20, "memory": 0.10, "interconnect": 0.65, "latency": 0.05},
}


def switched_truth() -> Truth:
    """A cluster whose H100 PCIe cards share a PCIe switch by twos: half the Gen5 x16 link each."""
    h = CATALOG.lookup(H100_PCIE)
    assert h is not None
    return Truth(
        CATALOG, {H100_PCIE: Figures(h.sustained_fp32_tflops, h.sustained_bandwidth_gbs, pcie_gbs=64.0)}
    )


def gang_profile(
    workload: str, *, runs: int = 6, seconds: float = 1000.0, truth: Truth | None = None
) -> WorkloadProfile:
    """A telemetry profile of an 8-GPU gang measured on H100 SXM5s, with ``runs`` runs on each of the
    three products taking what ``truth`` says."""
    truth = truth or switched_truth()
    status = ProfileStatus.model_validate(
        {"phase": "Ready", "source": "telemetry", "gpu": {"product": H100_SXM, "gangGPUs": 8},
         "timeShares": time_shares_status(GANGS[workload])}
    )  # fmt: skip
    for product in (H100_SXM, H100_PCIE, L40S):
        took = seconds * truth.relative_time(GANGS[workload], reference=H100_SXM, product=product, gpus=8)
        runs_there = [(f"{workload}-{product}-{i}", product, took) for i in range(runs)]
        status = with_runs(status, runs_there, gang_gpus=8) or status
    return WorkloadProfile.model_validate(
        {"metadata": {"name": f"{workload}-profile", "namespace": "ml"}, "spec": {"workload": workload},
         "status": status.as_status()}
    )  # fmt: skip


def fitted(profiles: list[WorkloadProfile]) -> Calibration:
    return fit_calibration(samples_of(profiles, CATALOG, reference_product=H100_SXM), CATALOG)


def test_the_links_gangs_ran_on_get_factors_and_the_shared_switch_is_found_on_its_own_product():
    """Runs on L40S and H100 PCIe are bound by their PCIe links (60 % of the time on 900 GB/s NVLink is
    8 to 14 times that on 64-128 GB/s), so each votes for its link against the H100 SXM5's NVLink.
    The median anchors: the H100 PCIe's PCIe takes twice its datasheet's time, the others none."""
    calibration = fitted([gang_profile(w) for w in GANGS])
    h100_pcie, l40s, h100_sxm = (calibration.get(p) for p in (H100_PCIE, L40S, H100_SXM))
    assert h100_pcie is not None and l40s is not None and h100_sxm is not None
    assert h100_pcie.pcie.factor == pytest.approx(2.0, rel=1e-3)
    assert l40s.pcie.factor == pytest.approx(1.0, rel=1e-3) and h100_sxm.nvlink.factor == pytest.approx(
        1.0, rel=1e-3
    )
    assert (h100_pcie.pcie.runs, h100_pcie.pcie.workloads) == (12, 2)
    assert (h100_sxm.nvlink.runs, h100_sxm.nvlink.workloads) == (12, 2), "the reference's runs anchor it"
    assert h100_pcie.nvlink == FactorSupport(), "a link no gang ran over stays the catalog's"
    assert h100_pcie.memory == FactorSupport() and h100_pcie.compute == FactorSupport(), "no unit measured"
    assert calibration.workloads == {}, "a gang's shares are not re-fitted by the units' fit"


def test_the_calibrated_link_makes_the_gangs_prediction_true_where_the_catalog_was_off_by_half():
    truth = switched_truth()
    profiles = [gang_profile(w) for w in GANGS]
    calibration = fitted(profiles)
    fresh = gang_profile("allreduce-a", runs=0)  # no observations: the model alone
    for with_calibration, worst in ((False, 0.471), (True, 0.001)):
        found = rank_gpu_products(
            fresh, [H100_SXM, H100_PCIE, L40S, A100], catalog=CATALOG, strategy="performance",
            reference_product=H100_SXM, gpus=8, min_calibration_runs=5,
            calibration=calibration if with_calibration else Calibration(),
        )  # fmt: skip
        errors = {
            r.product.product: abs(
                r.relative_time / truth.relative_time(GANGS["allreduce-a"], reference=H100_SXM, product=r.product.product, gpus=8) - 1
            )
            for r in found
        }  # fmt: skip
        assert (
            errors[H100_PCIE] == pytest.approx(worst, abs=0.001)
            if not with_calibration
            else errors[H100_PCIE] < worst
        )
        assert errors[A100] < 1e-9 and errors[L40S] < 1e-3, "links no fault touched keep their figures"
        assert {r.product.product: r.source for r in found}[H100_PCIE] == (
            "calibrated" if with_calibration else "model"
        )
    reference = reference_of(fresh, catalog=CATALOG, calibration=calibration, min_calibration_runs=5, gpus=8)
    assert reference is not None and dict(reference.by_unit)["interconnect"] == "calibrated"
    single = reference_of(fresh, catalog=CATALOG, calibration=calibration, min_calibration_runs=5, gpus=1)
    assert single is not None and "interconnect" not in dict(single.by_unit), "one GPU has no link"


def test_a_link_factor_needs_the_runs_and_two_workloads_as_a_units_does():
    one = fitted([gang_profile("allreduce-a")])
    entry = CATALOG.lookup(H100_PCIE)
    assert entry is not None
    h100_pcie = one.get(H100_PCIE)
    assert h100_pcie is not None and h100_pcie.pcie.workloads == 1
    assert one.calibrated(entry, 5, gpus=8) == (entry, False), "one workload's runs are not enough"
    both = fitted([gang_profile(w) for w in GANGS])
    calibrated, changed = both.calibrated(entry, 5, gpus=8)
    assert changed and calibrated.pcie_gbs == pytest.approx(64.0, rel=1e-3)
    assert both.calibrated(entry, 5) == (entry, False), "on one GPU the link is not what is ranked"
    assert both.calibrated(entry, 5, gpus=2)[0].nvlink_gbs == entry.nvlink_gbs, (
        "a bridged pair: NVLink, unmeasured"
    )


def test_runs_the_units_bind_vote_for_no_link_and_a_gang_of_unknown_size_is_left_out():
    """A gang whose link is a small part of its time on every product measures no link (its runs could
    explain a unit's figure as well); a profile that does not say how many GPUs its gang held (kept
    before the size was recorded) gives no sample: its link on each product is unknown."""
    light: dict[Unit, float] = {"tensor": 0.85, "memory": 0.05, "interconnect": 0.05, "latency": 0.05}
    GANGS["light"] = light
    try:
        calibration = fitted([gang_profile("light")])
    finally:
        del GANGS["light"]
    assert all(
        p.pcie == FactorSupport() and p.nvlink == FactorSupport() for p in calibration.products.values()
    )
    unknown = gang_profile("allreduce-a")
    assert unknown.status is not None
    unsized = unknown.model_copy(
        update={"status": unknown.status.model_copy(update={"gpu": unknown.status.gpu.model_copy(update={"gang_gpus": None})})}
    )  # fmt: skip
    assert samples_of([unsized], CATALOG, reference_product=H100_SXM) == []
    samples = samples_of([unknown], CATALOG, reference_product=H100_SXM)
    assert {(s.product, s.gpus, round(s.interconnect, 2)) for s in samples} == {
        (H100_SXM, 8, 0.6), (H100_PCIE, 8, 0.6), (L40S, 8, 0.6)
    }  # fmt: skip


def test_calibration_json_carries_the_link_factors_and_reads_a_previous_versions_without_them():
    calibration = fitted([gang_profile(w) for w in GANGS])
    document = json.loads(calibration.to_json())
    assert document["products"][H100_PCIE]["pcieTimeFactor"] == pytest.approx(2.0, rel=1e-3)
    assert (
        document["products"][H100_PCIE]["pcieRuns"] == 12
        and "nvlinkTimeFactor" not in document["products"][H100_PCIE]
    )
    assert parse_calibration(calibration.to_json()).to_json() == calibration.to_json()
    old = {
        "products": {
            L40S: {"memoryTimeFactor": 1.1, "computeTimeFactor": 0.9, "memoryRuns": 5, "computeRuns": 5}
        }
    }
    parsed = parse_calibration(json.dumps(old)).get(L40S)
    assert parsed is not None and parsed.pcie == FactorSupport() and parsed.nvlink == FactorSupport()
    bad = json.dumps({"products": {L40S: {**old["products"][L40S], "pcieTimeFactor": 0}}})
    with pytest.raises(ValueError, match=f"products.{L40S}: factors must be positive"):
        parse_calibration(bad)
    assert moved_beyond_noise(calibration, parse_calibration(json.dumps(old)), 5), (
        "a link factor starts to qualify"
    )


def test_a_gangs_size_goes_from_the_hints_record_to_its_observations_and_telemetry_by_size():
    record = hints_record(
        "p", "compute", strategy="balanced", injected=(), ranked=(), reason="", gang="x", gang_gpus=16
    )
    pod = {"metadata": {"annotations": {v.HINTS_ANNOTATION: record}}}
    assert json.loads(record)["gangGPUs"] == 16 and recorded_gang_gpus(pod) == 16
    alone = hints_record("p", "compute", strategy="balanced", injected=(), ranked=(), reason="")
    assert (
        "gangGPUs" not in json.loads(alone)
        and recorded_gang_gpus({"metadata": {"annotations": {v.HINTS_ANNOTATION: alone}}}) is None
    )
    assert recorded_gang_gpus({"metadata": {"annotations": {v.HINTS_ANNOTATION: "{not json"}}}) is None
    linked = ProfileStatus(
        phase="Ready", timeShares=TimeShares(tensor="0.50", interconnect="0.40", latency="0.10")
    )
    eight = with_runs(linked, [("a", L40S, 100.0)], gang_gpus=8)
    assert eight is not None
    both = with_runs(eight, [("b", L40S, 300.0)], gang_gpus=16)
    assert both is not None
    assert [(o.product, o.gang_gpus, o.mean_seconds) for o in both.observations] == [
        (L40S, 8, "100.0"), (L40S, 16, "300.0")
    ]  # fmt: skip
    profile = WorkloadProfile.model_validate(
        {"metadata": {"name": "w-profile"}, "spec": {"workload": "w"}, "status": both.as_status()}
    )
    assert observed_times(profile, 16) == ((L40S, 300.0, 1),) and observed_times(profile, 8) == (
        (L40S, 100.0, 1),
    )
    assert observed_times(profile, 4) == (), "a gang of another size moved its data over another link"
    # where no link was measured the model has no term for the size: the runs pool, as before sizes
    pooled = with_runs(ProfileStatus(phase="Ready"), [("a", L40S, 100.0), ("b", L40S, 300.0)], gang_gpus=8)
    assert pooled is not None and [(o.gang_gpus, o.runs, o.mean_seconds) for o in pooled.observations] == [
        (None, 2, "200.0")
    ]
    unlinked = profile.model_copy(update={"status": both.model_copy(update={"time_shares": None})})
    assert observed_times(unlinked, 16) == observed_times(unlinked, 1) == ((L40S, 200.0, 2),), (
        "a profile that no longer measures links reads the entries of every size together"
    )
    run = TelemetryRun(
        "u1", H100_SXM, 600.0, 8, {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.9}, linked=True, gang_gpus=16
    )
    measured = with_telemetry(None, run, now="2026-11-28T12:00:00Z", catalog=CATALOG)
    assert measured is not None and measured.gpu.gang_gpus == 16 and measured.telemetry[0].gang_gpus == 16
    other = with_telemetry(
        measured,
        TelemetryRun(
            "u2", H100_SXM, 60.0, 8, {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.5}, linked=True, gang_gpus=8
        ),
        now="2026-11-28T12:05:00Z",
        catalog=CATALOG,
    )
    assert other is not None and [(r.gang_gpus, r.runs) for r in other.telemetry] == [(8, 1), (16, 1)]
    assert other.gpu.gang_gpus == 16, "the record with the most GPU-seconds is what the profile reads"


def test_in_simulate_gangs_that_spill_onto_pcie_parts_teach_the_shared_switch_and_a_new_gang_is_predicted():
    """One H100 SXM5 Node, two H100 PCIe and two L40S (8 GPUs each), 90 gangs of 8 from three
    all-reduce-heavy workloads, one every 300 s: the SXM5 Node is busy, and gangs spill onto the PCIe
    parts, whose H100 PCIe cards really get 64 GB/s each. After the trace the H100 PCIe's PCIe factor is
    2 (1.99 from 14 runs of 3 workloads), and a gang never seen is predicted within 2 % on every product
    (1.2 % on the H100 PCIe), where the catalog's links put it 46.5 % off.

    No cap (maxSlowdown 0): this is the links' calibration from the gangs that spill. Under the default
    cap (issue 58) they do not spill onto the L40Ss (more than 6 times slower for them), so the factor
    rests on 18 runs of the PCIe parts (1.95) and the L40S's link goes unmeasured (2.5 % off)."""
    truth = switched_truth()
    shares: dict[str, dict[Unit, float]] = {
        "ar-a": GANGS["allreduce-a"],
        "ar-b": GANGS["allreduce-b"],
        "ar-c": {"tensor": 0.40, "memory": 0.05, "interconnect": 0.50, "latency": 0.05},
    }
    metrics = {"smThroughput": "50.00", "memoryThroughput": "20.00"}
    jobs = [
        TraceJob(name=f"{w}-{i}", workload=w, arrival=300.0 * i, gpus=8, pods=1, reference_product=H100_SXM,
                 reference_seconds=1200.0, time_shares=shares[w], metrics=metrics)
        for i, w in enumerate(sorted(shares) * 30)
    ]  # fmt: skip
    cluster = [sim_node("sxm-0", H100_SXM), *(sim_node(f"pcie-{i}", H100_PCIE) for i in range(2)),
               *(sim_node(f"l40s-{i}", L40S) for i in range(2))]  # fmt: skip
    config = Config(max_slowdown=0)
    result = simulate(
        Trace(tuple(jobs)), cluster, truth=truth, config=config, catalog=CATALOG, seed=1, policies=("kratos",)
    )
    learned = result.learned.current().get(H100_PCIE)
    assert learned is not None and learned.pcie.factor == pytest.approx(2.0, rel=0.02)
    assert learned.pcie.qualifies(config.min_calibration_runs), learned.as_dict()
    unseen = [TraceJob(name="new-0", workload="new", arrival=0.0, gpus=8, pods=1, reference_product=H100_SXM,
                       reference_seconds=1200.0, metrics=metrics,
                       time_shares={"tensor": 0.35, "memory": 0.05, "interconnect": 0.55, "latency": 0.05})]  # fmt: skip
    products = frozenset(n.product for n in cluster)
    errors = {
        "with_calibration": prediction_errors(
            result.learned, unseen, truth=truth, node_products=products, config=config, catalog=CATALOG
        ),
        "without": prediction_errors(
            Learned(result.learned.profiles), unseen, truth=truth, node_products=products, config=config,
            catalog=CATALOG,
        ),
    }  # fmt: skip
    assert max(errors["with_calibration"].values()) < 0.02, errors
    assert errors["without"][H100_PCIE] == pytest.approx(0.465, abs=0.005), errors


def test_placement_shows_the_calibrated_link_and_where_it_comes_from():
    calibration = fitted([gang_profile(w) for w in GANGS])
    fresh = gang_profile("allreduce-a", runs=0)
    rows = {
        r.product: r
        for r in placement_rows(
            fresh,
            [H100_SXM, H100_PCIE, L40S],
            catalog=CATALOG,
            config=Config(),
            calibration=calibration,
            gpus=8,
        )
    }
    assert rows[H100_PCIE].interconnect_gbs == pytest.approx(64.0, abs=0.1)
    assert rows[H100_PCIE].interconnect_from == "PCIe Gen5, calibrated (/2, 12 runs, 2 workloads)"
    assert rows[H100_SXM].interconnect_from == "NVLink 4, calibrated (/1, 12 runs, 2 workloads)"
    plain = placement_rows(fresh, [H100_PCIE], catalog=CATALOG, config=Config(), gpus=8)
    assert plain[0].interconnect_gbs == 128 and plain[0].interconnect_from.startswith(
        "PCIe Gen5, datasheet: "
    )


async def test_the_api_server_keeps_a_gangs_size_because_the_crd_names_it_and_drops_what_it_does_not():
    """The real API server prunes every field a CRD's structural schema lacks, silently; the double
    does the same from the CRD the install applies. The sizes the controller writes are kept there
    (the CRD names them), a field it does not name is gone, on create and on the status subresource."""
    kube = KubeDouble()
    async with api_server(kube) as server, api_for(server) as api:
        custom = client.CustomObjectsApi(api)
        body = {"apiVersion": "gpu.scheduler.io/v1alpha1", "kind": "WorkloadProfile",
                "metadata": {"name": "w-profile", "namespace": "ml"}, "spec": {"workload": "w", "owner": "x"}}  # fmt: skip
        created = await custom.create_namespaced_custom_object(
            "gpu.scheduler.io", "v1alpha1", "ml", "workloadprofiles", body
        )
        assert created["spec"] == {"workload": "w"}, "spec.owner is no field of the CRD"
        status = {"phase": "Ready", "gpu": {"product": L40S, "gangGPUs": 8, "vendor": "x"},
                  "observations": [{"product": L40S, "runs": 1, "meanSeconds": "1.0", "gangGPUs": 8, "note": "x"}],
                  "telemetry": [{"product": L40S, "runs": 1, "seconds": "8", "gangGPUs": 8,
                                 "counters": {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": "0.9"}}],
                  "unknown": {"a": 1}}  # fmt: skip
        written = await custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]
            "gpu.scheduler.io", "v1alpha1", "ml", "workloadprofiles", "w-profile",
            [{"op": "add", "path": "/status", "value": status}], _content_type="application/json-patch+json",
        )  # fmt: skip
    assert written["status"]["gpu"] == {"product": L40S, "gangGPUs": 8}
    assert written["status"]["observations"] == [
        {"product": L40S, "runs": 1, "meanSeconds": "1.0", "gangGPUs": 8}
    ]
    assert written["status"]["telemetry"][0]["gangGPUs"] == 8
    assert written["status"]["telemetry"][0]["counters"] == {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": "0.9"}, (
        "additionalProperties keeps any counter"
    )
    assert "unknown" not in written["status"]
