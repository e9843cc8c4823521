"""Calibration (DESIGN "Learning the cluster's GPUs", docs/ranking.md "Calibration"): the fit, its
robustness, its file, and what it buys the ranking on GPUs that differ from the catalog."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kratos_admit.cli.main import main
from kratos_admit.cli.placement import placement_rows
from kratos_admit.decisions.hints import ranking_of
from kratos_admit.decisions.profiling import profiling_products
from kratos_admit.decisions.stores import StaticCalibrationStore, StaticNodeStore
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config
from kratos_admit.domain.profile import Observation, ProfileGpu, TimeShares
from kratos_admit.model import robust
from kratos_admit.model.calibration import (
    NO_CALIBRATION,
    Calibration,
    CalibrationError,
    FactorSupport,
    ProductCalibration,
    Sample,
    parse_calibration,
    samples_of,
)
from kratos_admit.model.calibration_fit import fit_calibration
from kratos_admit.model.calibration_writes import moved_beyond_noise
from kratos_admit.model.catalog import Catalog
from kratos_admit.model.robust import huber_location, huber_locations, weighted_median, weighted_medians
from kratos_admit.simulation.inputs import load_cluster, load_trace
from kratos_admit.simulation.knowledge import Learned, prediction_errors
from kratos_admit.simulation.replay import simulate
from kratos_admit.simulation.trace import Figures, Truth
from kratos_controller.learning import calibrate, calibrate_samples, calibration_write_wait, profile_samples
from tests.builders import A100, L4, L40S, T4, WORKLOAD_SHAPES, make_job, make_profile, trace_job
from tests.harness import CATALOG, EXAMPLES, MIXED_CLUSTER, admit, drawn_truth, engine, make_ctx

PRODUCTS = (A100, L40S, L4, T4)
SHAPES = WORKLOAD_SHAPES


def exact_samples(truth: Truth, pairs: Mapping[str, tuple[str, ...]], *, runs: int = 5) -> list[Sample]:
    """What the observations of each workload on each of its products would say, without noise."""
    samples = []
    for name, products in pairs.items():
        sm, mem = SHAPES[name]
        job = trace_job(name, sm=sm, mem=mem, seconds=1000.0)
        for product in products:
            seconds = 1000.0 * truth.relative_time(job.shares, reference=A100, product=product)
            samples.append(Sample(name, product, runs, seconds, sm / 100, mem / 100, A100))
    return samples


def ratio_errors(fitted: dict[str, tuple[float, float]], truth: Truth) -> list[float]:
    """|fitted/true - 1| of each product's factors relative to the A100's (observations fix ratios only)."""
    errors = []
    base = CATALOG.lookup(A100)
    assert base is not None
    true_base = truth.product(A100)
    for product, (memory, compute) in fitted.items():
        entry, real = CATALOG.lookup(product), truth.product(product)
        assert entry is not None
        true_memory = (entry.sustained_bandwidth_gbs / real.sustained_bandwidth_gbs) / (
            base.sustained_bandwidth_gbs / true_base.sustained_bandwidth_gbs
        )
        true_compute = (entry.sustained_fp32_tflops / real.sustained_fp32_tflops) / (
            base.sustained_fp32_tflops / true_base.sustained_fp32_tflops
        )
        errors += [
            abs(memory / fitted[A100][0] / true_memory - 1),
            abs(compute / fitted[A100][1] / true_compute - 1),
        ]
    return errors


EVERYWHERE = dict.fromkeys(SHAPES, PRODUCTS)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_fit_recovers_each_products_factors_from_exact_runs(seed):
    """Exact runs of eight workloads on every product: each factor with enough votes is the truth's.
    (A factor only memory-bound work reached, here or there, stays unqualified.)"""
    truth = drawn_truth(seed)
    calibration = fit_calibration(exact_samples(truth, EVERYWHERE), CATALOG)
    assert set(calibration.products) == set(PRODUCTS)
    fitted = {
        p: (c.memory.factor, c.compute.factor) for p, c in calibration.products.items() if c.qualifies(5)
    }
    assert A100 in fitted and len(fitted) >= 2, {p: c.as_dict() for p, c in calibration.products.items()}
    assert max(ratio_errors(fitted, truth)) < 0.01


@pytest.mark.parametrize("inflated", [2.0, 3.0, 10.0], ids=["2x", "3x", "10x"])
def test_one_outlier_run_barely_moves_a_factor(inflated):
    """A run beside a noisy neighbour: one of five runs of one workload on the L4 took ``inflated``
    times as long, so that sample's mean is (4 + inflated)/5 times the truth."""
    truth = drawn_truth(7)
    clean = exact_samples(truth, EVERYWHERE)
    dirty = [
        Sample(s.workload, s.product, s.runs, s.seconds * (4 + inflated) / 5, s.sm, s.mem, s.profiled)
        if (s.workload, s.product) == ("stream", L4)
        else s
        for s in clean
    ]
    before, after = fit_calibration(clean, CATALOG), fit_calibration(dirty, CATALOG)
    for product in PRODUCTS:
        b, a = before.products[product], after.products[product]
        assert a.memory.factor == pytest.approx(b.memory.factor, rel=0.03)
        assert a.compute.factor == pytest.approx(b.compute.factor, rel=0.03)


def profiled_elsewhere(
    truth: Truth,
    name: str,
    shape: tuple[float, float],
    profiled: str,
    products: tuple[str, ...],
    *,
    runs: int = 5,
) -> list[Sample]:
    """Exact runs of a workload whose profiling run landed on ``profiled``: its shares are what Nsight
    Compute measured there, and it never ran there again."""
    job = trace_job(name, sm=shape[0], mem=shape[1], seconds=1000.0)
    measured = truth.measured_on(job, profiled)
    sm_there, mem_there = float(measured["smThroughput"]) / 100, float(measured["memoryThroughput"]) / 100
    return [
        Sample(
            name,
            p,
            runs,
            1000.0 * truth.relative_time(job.shares, reference=A100, product=p),
            sm_there,
            mem_there,
            profiled,
        )
        for p in products
    ]


def test_a_factor_no_run_voted_for_stays_the_catalogs_and_does_not_drag_the_others():
    """Found with the example trace and a +-40 % truth: two compute-bound workloads were profiled on
    the T4 and never ran there again, and no compute-bound run ever reached the T4, so nothing
    says anything about the T4's compute factor. The anchoring used to rescale that factor with
    the voted ones each round; through the workloads profiled on the T4 it fed back into their
    votes until it reached 0.085, and the L40S qualified with a compute factor 2.2 times the
    truth's (a never-seen workload predicted 98 % off). A factor no run voted for never qualifies
    its product; what the workloads profiled there say of it (step 3 of the fit) reads only their
    own shares, and drags no other factor."""
    truth = drawn_truth(7)
    others = (A100, L40S, L4)
    samples = (
        exact_samples(truth, {"stream": PRODUCTS, "spmv": PRODUCTS, "decode": PRODUCTS, "bfs": PRODUCTS})
        + exact_samples(truth, {"nbody": others, "raytrace": others})
        + profiled_elsewhere(truth, "md", (94, 44), T4, others)
        + profiled_elsewhere(truth, "pricing-t4", (96, 7), T4, others)
    )
    calibration = fit_calibration(samples, CATALOG)
    t4 = calibration.products[T4]
    assert t4.compute.runs == 0 and not t4.compute.qualifies(5), t4.as_dict()
    fitted = {
        p: (c.memory.factor, c.compute.factor) for p, c in calibration.products.items() if c.qualifies(5)
    }
    assert A100 in fitted and len(fitted) >= 2, {p: c.as_dict() for p, c in calibration.products.items()}
    assert max(ratio_errors(fitted, truth)) < 0.10, fitted


def test_workloads_seen_on_one_product_say_nothing_and_a_factor_needs_two_workloads():
    truth = drawn_truth(4)
    only_one = exact_samples(truth, {"stream": (L4,), "nbody": (L40S,)})
    assert fit_calibration(only_one, CATALOG).products == {}
    one_workload = fit_calibration(exact_samples(truth, {"stream": (A100, L4)}, runs=20), CATALOG)
    assert not one_workload.products[L4].qualifies(5), "20 runs, but all of one workload"


def test_the_same_runs_fit_the_same_factors_and_the_file_round_trips():
    samples = exact_samples(drawn_truth(5), EVERYWHERE)
    first, again = fit_calibration(samples, CATALOG), fit_calibration(list(reversed(samples)), CATALOG)
    assert first.to_json() == again.to_json()
    parsed = parse_calibration(first.to_json())
    assert parsed.to_json() == first.to_json()


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("not json", id="not-json"),
        pytest.param('{"products": {"Tesla-T4": {"runs": 1}}}', id="no-factors"),
        pytest.param(
            '{"products": {"Tesla-T4": {"memoryTimeFactor": 0, "computeTimeFactor": 1}}}', id="zero"
        ),
    ],
)
def test_an_unreadable_calibration_file_is_refused_with_a_reason(text):
    with pytest.raises(CalibrationError, match=r"calibration\.json"):
        parse_calibration(text)


@pytest.mark.parametrize(
    ("values", "weights", "expected"),
    [
        pytest.param([1.0, 2.0, 3.0], [1, 1, 1], 2.0, id="odd"),
        pytest.param([1.0, 2.0], [1, 1], 1.5, id="even-tie"),
        pytest.param([1.0, 2.0, 9.0], [1, 1, 5], 9.0, id="weighted"),
    ],
)
def test_weighted_median(values, weights, expected):
    assert weighted_median(values, weights) == expected


def test_the_huber_location_is_a_mean_near_the_centre_and_ignores_far_outliers():
    assert huber_location([0.0, 0.02, 0.04], [1, 1, 1]) == pytest.approx(0.02)
    assert abs(huber_location([0.0, 0.01, 0.02, 0.01, 2.0], [1, 1, 1, 1, 1]) - 0.01) < 0.03


def test_samples_come_from_ready_profiles_observations_pooling_shared_variants():
    profile = make_profile("stream", bound="memory", product=A100)
    assert profile.status is not None
    observations = [
        Observation(product=L4, runs=2, meanSeconds="100.0"),
        Observation(product=f"{L4}-SHARED", runs=2, meanSeconds="200.0"),
        Observation(product="NVIDIA-Q9000", runs=9, meanSeconds="1.0"),
    ]
    profile.status.observations = observations
    [sample] = samples_of([profile], CATALOG, reference_product=A100)
    assert (sample.product, sample.runs, sample.seconds, sample.profiled) == (L4, 4, 150.0, A100)


def test_the_ranking_uses_calibrated_figures_once_both_factors_qualify_and_says_so():
    truth = drawn_truth(2)
    calibration = fit_calibration(exact_samples(truth, EVERYWHERE), CATALOG)
    profile = make_profile("nbody", bound="compute", sm="88.70", mem="9.85", product=A100)
    plain = ranking_of(profile, set(PRODUCTS), config=Config(), catalog=CATALOG)
    calibrated = ranking_of(profile, set(PRODUCTS), config=Config(), catalog=CATALOG, calibration=calibration)
    assert {r.source for r in plain} == {"model"}
    assert {r.source for r in calibrated} == {"calibrated"}
    assert all(r.as_dict()["source"] == "calibrated" for r in calibrated)
    strict = Config.model_validate({"minCalibrationRuns": 50})
    assert {
        r.source
        for r in ranking_of(profile, set(PRODUCTS), config=strict, catalog=CATALOG, calibration=calibration)
    } == {"model"}


@pytest.mark.parametrize("seed", range(10))
def test_after_the_example_trace_a_new_workload_is_predicted_within_ten_percent_on_calibrated_products(seed):
    """Issue 19: GPUs whose sustained figures are off the catalog's by up to +-40 %, ten draws. After
    the example trace, a workload never seen (profiled on the A100) is predicted within 10 % on
    every product whose calibration rests on minCalibrationRuns runs from 2 workloads (the A100 and
    one to three others, depending on where the draw's runs spilled); without calibration the same
    predictions are off by more than twice as much."""
    cluster = load_cluster(EXAMPLES / "simulation" / "cluster.yaml", CATALOG)
    trace = load_trace(EXAMPLES / "simulation" / "trace.yaml", CATALOG)
    truth = drawn_truth(seed)
    config = Config()
    result = simulate(
        trace, cluster, truth=truth, config=config, catalog=CATALOG, seed=seed, policies=("kratos",)
    )
    calibration = result.learned.current()
    qualified = {p for p, c in calibration.products.items() if c.qualifies(config.min_calibration_runs)}
    assert A100 in qualified and len(qualified) >= 2, {
        p: c.as_dict() for p, c in calibration.products.items()
    }
    unseen = [
        trace_job("new-memory", sm=10, mem=90),
        trace_job("new-compute", sm=92, mem=6),
        trace_job("new-latency", sm=30, mem=25),
        trace_job("new-balanced", sm=75, mem=70),
    ]
    products = frozenset(n.product for n in cluster)
    with_calibration = prediction_errors(
        result.learned, unseen, truth=truth, node_products=products, config=config, catalog=CATALOG
    )
    without = prediction_errors(
        Learned(result.learned.profiles),
        unseen,
        truth=truth,
        node_products=products,
        config=config,
        catalog=CATALOG,
    )
    assert calibration is not NO_CALIBRATION
    assert {p: round(e, 3) for p, e in with_calibration.items() if p in qualified and e > 0.10} == {}
    worst_with = max(with_calibration[p] for p in qualified)
    worst_without = max(without[p] for p in qualified)
    assert worst_without > 2 * worst_with, (worst_without, worst_with)


def test_a_product_no_factor_of_which_qualifies_keeps_the_catalogs_figures():
    """The A100 calibrated, the L4's factors on too few runs: a workload profiled on the (uncalibrated)
    L40S is ranked on the A100 with its calibrated figures and on the others from the catalog, and
    each ranked product says which."""
    calibration = calibration_of(a100=support(40, 30, factor=1.3), l4=support(3, 0, factor=1.5))
    profile = make_profile("new", bound="memory", sm="10", mem="90", product=L40S)
    config = Config()
    ranked = ranking_of(profile, set(PRODUCTS), config=config, catalog=CATALOG, calibration=calibration)
    assert {r.product.product: r.source for r in ranked} == {
        A100: "calibrated",
        L40S: "model",
        L4: "model",
        T4: "model",
    }
    catalog_only = ranking_of(profile, set(PRODUCTS), config=config, catalog=CATALOG)
    before = {r.product.product: r.relative_time for r in catalog_only}
    after = {r.product.product: r.relative_time for r in ranked}
    assert {p: after[p] for p in (L4, T4)} == {p: before[p] for p in (L4, T4)}
    assert after[A100] > before[A100], "memory-bound work takes 30 % longer on these A100s"


def test_placement_shows_calibrated_figures_read_from_the_configmap(tmp_path: Path):
    calibration = fit_calibration(exact_samples(drawn_truth(3), EVERYWHERE), CATALOG)
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kratos-gpu-calibration", "namespace": "kratos-system"},
        "data": {"calibration.json": calibration.to_json()},
    }
    (tmp_path / "calibration.yaml").write_text(yaml.safe_dump(configmap))
    out, err = io.StringIO(), io.StringIO()
    status = main(
        [
            "placement", "-p", str(EXAMPLES / "profiles" / "nbody-profile.yaml"),
            "--calibration", str(tmp_path / "calibration.yaml"), "-o", "json",
        ],
        stdout=out, stderr=err,
    )  # fmt: skip
    assert status == 0, err.getvalue()
    rows = {r["product"]: r for r in json.loads(out.getvalue())}
    qualified = {p for p, c in calibration.products.items() if c.qualifies(5)}
    assert qualified and all(rows[p]["time_from"] == "calibrated" for p in qualified)
    assert all(rows[p]["fp32_from"].startswith("calibrated") for p in qualified)
    for product, row in rows.items():
        found = calibration.get(product)
        for figure, factor in (("fp32_from", "compute"), ("bandwidth_from", "memory")):
            own = getattr(found, factor) if found is not None else None
            if own is not None and own.qualifies(5):
                expected = f"calibrated (/{own.factor:g}, {own.runs} runs, {own.workloads} workloads)"
                assert row[figure] == expected, row
            else:
                assert row[figure].startswith("catalog, "), row


def test_placement_refuses_an_unreadable_calibration_file_with_one_line(tmp_path: Path):
    (tmp_path / "calibration.json").write_text("{}")
    err = io.StringIO()
    status = main(
        ["placement", "-p", str(EXAMPLES / "profiles" / "nbody-profile.yaml"), "--calibration", str(tmp_path / "calibration.json")],
        stdout=io.StringIO(), stderr=err,
    )  # fmt: skip
    assert status == 2 and "calibration.json: not a KRATOS calibration" in err.getvalue()
    assert len(err.getvalue().strip().splitlines()) == 1


def profile_dicts(truth: Truth, runs: int = 5) -> list[dict[str, object]]:
    """Ready WorkloadProfiles (as the API returns them) whose observations are exact runs."""
    found = []
    for name, (sm, mem) in SHAPES.items():
        job = trace_job(name, sm=sm, mem=mem)
        observations = [
            {
                "product": p,
                "runs": runs,
                "meanSeconds": f"{1000.0 * truth.relative_time(job.shares, reference=A100, product=p):.1f}",
            }
            for p in PRODUCTS
        ]
        found.append(
            {
                "metadata": {"name": f"{name}-profile", "namespace": "team-a"},
                "spec": {"workload": name},
                "status": {
                    "phase": "Ready",
                    "metrics": {"smThroughput": str(sm), "memoryThroughput": str(mem)},
                    "gpu": {"product": A100},
                    "observations": observations,
                },
            }
        )
    return found


def test_the_controller_writes_the_configmap_only_when_the_fit_changes_and_keeps_unchanged_dates():
    truth = drawn_truth(3, spread=0.2)
    profiles = profile_dicts(truth)
    options: dict[str, Any] = {"namespace": "kratos-system", "catalog": CATALOG, "reference_product": A100}
    fitted, write = calibrate(profiles, None, now="2026-11-23T10:00:00Z", **options)
    assert write is not None and (write.namespace, write.name) == ("kratos-system", "kratos-gpu-calibration")
    configmap = {"data": write.data}
    again, rewrite = calibrate(profiles, configmap, now="2026-11-23T11:00:00Z", **options)
    assert rewrite is None, "the same runs, fitted again later, write nothing"
    assert again.to_json() == fitted.to_json()
    more = profile_dicts(truth)
    status = more[0]["status"]
    assert isinstance(status, dict)
    status["observations"][2]["runs"] = 9  # more runs of one workload on the L4, as long as before
    changed, update = calibrate(more, configmap, now="2026-11-23T12:00:00Z", **options)
    assert update is not None
    dates = {p: c.updated_at for p, c in changed.products.items()}
    assert dates[L4] == "2026-11-23T12:00:00Z"
    assert dates[A100] == "2026-11-23T10:00:00Z", "a product whose fit did not change keeps its date"


def test_the_fit_folded_page_by_page_is_the_fit_of_the_whole_list_bookkeeping_and_all():
    """The controller folds the profiles into samples a list page at a time (issue 51): the fit is the
    same as of the whole list at once, and the counted Pod uids and managedFields the API server
    sends with each profile change nothing."""
    profiles: list[dict[str, Any]] = [dict(p) for p in profile_dicts(drawn_truth(3, spread=0.2))]
    options: dict[str, Any] = {"namespace": "kratos-system", "catalog": CATALOG}
    whole, _ = calibrate(profiles, None, reference_product=A100, now="2026-11-23T10:00:00Z", **options)
    kept = [
        p | {"metadata": {**p["metadata"], "uid": "u", "managedFields": [{"manager": "kratos-controller"}]},
             "status": {**p["status"], "countedRuns": [f"pod-{i}" for i in range(256)]}}
        for p in profiles
    ]  # fmt: skip
    samples = [
        s
        for i in range(0, len(kept), 2)
        for s in profile_samples(kept[i : i + 2], catalog=CATALOG, reference_product=A100)
    ]
    paged, _ = calibrate_samples(samples, None, now="2026-11-23T10:00:00Z", **options)
    assert paged.to_json() == whole.to_json()
    assert kept[0]["status"]["countedRuns"], "the caller's objects are left as they were"


def test_an_unreadable_configmap_is_replaced_by_the_fit():
    profiles = profile_dicts(drawn_truth(3, spread=0.2))
    _, write = calibrate(
        profiles,
        {"data": {"calibration.json": "garbage"}},
        namespace="kratos-system",
        catalog=CATALOG,
        reference_product=A100,
        now="2026-11-23T10:00:00Z",
    )
    assert write is not None and parse_calibration(write.data["calibration.json"]).products


def far_truth(seed: int, *, far: str = T4, spread: float = 0.5) -> Truth:
    """Every product off the catalog by up to +-30 %, and ``far`` by a full +-``spread`` in both
    figures (which way drawn): the product furthest from the catalog."""
    rng = random.Random(seed)
    figures = {}
    for product in PRODUCTS:
        entry = CATALOG.lookup(product)
        assert entry is not None
        if product == far:
            fp32, bandwidth = (1 - spread, 1 - spread) if rng.random() < 0.5 else (1 + spread, 1 - spread)
        else:
            fp32, bandwidth = rng.uniform(0.7, 1.3), rng.uniform(0.7, 1.3)
        figures[product] = Figures(
            entry.sustained_fp32_tflops * fp32, entry.sustained_bandwidth_gbs * bandwidth
        )
    return Truth(CATALOG, figures)


def as_before(calibration: Calibration, min_runs: int) -> Calibration:
    """The same fit read as KRATOS read it before issue 26: a product's figures only once both its
    factors qualify, and every workload through its profile's own shares."""
    products = {
        name: p
        if p.qualifies(min_runs)
        else ProductCalibration(name, FactorSupport(p.memory.factor), FactorSupport(p.compute.factor))
        for name, p in calibration.products.items()
    }
    return Calibration(products)


@pytest.mark.parametrize(
    ("seed", "before_at_least"),
    [(1, 0.2), (2, 0.0), (3, 0.0), (4, 0.0), (5, 0.0), (6, 0.2)],
    ids=["draw-1", "draw-2", "draw-3", "draw-4", "draw-5", "draw-6"],
)
def test_workloads_profiled_on_the_product_furthest_from_the_catalog_are_predicted_within_ten_percent(
    seed, before_at_least
):
    """Issue 26: the example cluster with six more T4 servers (the T4s the largest group, so before
    anything is calibrated every profiling run goes there) and a truth in which the T4 is 50 % off
    the catalog. After the example trace, every product calibrated in both figures (FP32 and memory
    factors on minCalibrationRuns runs from two workloads) is predicted within 10 % for every workload
    of the trace. Read as before (a product calibrated only once both its factors qualify, the
    profiles' own shares), the same runs predict those products worse, by up to 39 % (draw 5, before the fit settled).

    A product with a figure no run measured keeps the catalog's, and a workload that never ran there
    is predicted with the catalog's error (docs/ranking.md "What it does not achieve"): here the T4's
    FP32 in draws 1, 3, 5 and 6 (21 to 67 %), the L40S's in draw 2 (29 %). Before issue 49 the same
    draws had every product within 10 %: a Job on two GPUs is now a gang, never profiled, its
    workload's profile from its own run's telemetry, and compute-bound runs reach the T4 less often.

    Exploration off (explorationShare 0) and no cap (maxSlowdown 0): this is issue 26's calibration
    from the runs the ranking chooses. With the default cap (issue 58) compute-bound work is kept off
    the T4s it would run 6 times slower on, so the T4's factors rest on fewer and other runs: in draw 2
    it ends calibrated and 19.1 % off, and read as before the products are no longer worse by the
    margins below (the runs that made them worse no longer happen). Since the factors' fit settles
    (issue 59; it used to end on the parity of its rounds), draws 3 and 5 predict the products as well
    read either way (worst 5.1 % and 3.4 %, as after), where the old reading was 20 % and 39 % worse."""
    cluster = load_cluster(EXAMPLES / "simulation" / "cluster.yaml", CATALOG)
    t4 = next(n for n in cluster if n.product == T4)
    cluster += [dataclasses.replace(t4, name=f"gpu-t4-extra-{i}") for i in range(6)]
    trace = load_trace(EXAMPLES / "simulation" / "trace.yaml", CATALOG)
    truth, config = far_truth(seed), Config.model_validate({"explorationShare": 0.0, "maxSlowdown": 0})
    result = simulate(
        trace, cluster, truth=truth, config=config, catalog=CATALOG, seed=seed, policies=("kratos",)
    )
    profiles = list(result.learned.profiles.index.profiles())
    profiled_on = [p.status.gpu.product for p in profiles if p.status is not None]
    assert profiled_on.count(T4) >= len(profiled_on) / 2, profiled_on
    ran = {p for p, k in result.products.items() if k.runs >= config.min_calibration_runs}
    assert ran == set(PRODUCTS), result.as_dict()["products"]
    fit = result.learned.current()
    calibrated = {p for p, c in fit.products.items() if c.qualifies(config.min_calibration_runs)}
    assert A100 in calibrated and len(calibrated) >= 2, calibrated
    after = {p: e for p, e in result.prediction_error.items() if p in calibrated}
    assert {p: round(e, 3) for p, e in after.items() if e > 0.10} == {}
    before = prediction_errors(
        Learned(result.learned.profiles, StaticCalibrationStore(as_before(fit, 5))),
        trace.jobs,
        truth=truth,
        node_products=frozenset(n.product for n in cluster),
        config=config,
        catalog=CATALOG,
    )
    worst_before = max(before[p] for p in calibrated)
    assert worst_before >= max(after.values()) and worst_before >= before_at_least, (before, after)


# --- profiling on known ground, per-factor qualification, the write cadence, the file ---------------


def support(memory_runs: int, compute_runs: int, *, factor: float = 1.2) -> ProductCalibration:
    return ProductCalibration(
        "x",
        FactorSupport(factor, memory_runs, 3 if memory_runs else 0),
        FactorSupport(factor, compute_runs, 3 if compute_runs else 0),
    )


def calibration_of(**products: ProductCalibration) -> Calibration:
    names = {"a100": A100, "l40s": L40S, "l4": L4, "t4": T4}
    return Calibration({names[k]: dataclasses.replace(p, product=names[k]) for k, p in products.items()})


@pytest.mark.parametrize(
    ("calibration", "config", "expected"),
    [
        pytest.param(NO_CALIBRATION, {}, (T4,), id="nothing-calibrated-the-largest-group"),
        pytest.param(calibration_of(l4=support(20, 8)), {}, (L4,), id="the-calibrated-product"),
        pytest.param(
            calibration_of(l4=support(20, 8), a100=support(40, 30)), {}, (A100,), id="the-best-calibrated"
        ),
        pytest.param(calibration_of(l4=support(20, 0)), {}, (T4,), id="half-calibrated-does-not-count"),
        pytest.param(
            calibration_of(a100=support(40, 30)), {"profilingProducts": [L40S]}, (L40S,), id="config-first"
        ),
        pytest.param(
            NO_CALIBRATION,
            {"profilingProducts": ["NVIDIA-H100-80GB-HBM3"]},
            ("NVIDIA-H100-80GB-HBM3",),
            id="config-absent-from-the-cluster-still-preferred",
        ),
    ],
)
def test_a_profiling_run_prefers_known_ground(calibration, config, expected):

    nodes = {A100: 3, L40S: 4, L4: 5, T4: 6}
    found = profiling_products(
        set(nodes), nodes, calibration=calibration, catalog=CATALOG, config=Config.model_validate(config)
    )
    assert found == expected


MEASURED = "NVIDIA-H100-80GB-HBM3"  # the catalog's one product whose every figure is a cited measurement


@pytest.mark.parametrize(
    ("calibration", "config", "cluster", "expected"),
    [
        pytest.param(
            NO_CALIBRATION, {}, {MEASURED: 1}, (MEASURED,), id="measured-ground-over-the-largest-group"
        ),
        pytest.param(
            calibration_of(l4=support(20, 8)), {}, {MEASURED: 1}, (L4,), id="calibrated-ground-first"
        ),
        pytest.param(
            NO_CALIBRATION, {"profilingProducts": [L40S]}, {MEASURED: 1}, (L40S,), id="config-first"
        ),
        pytest.param(
            NO_CALIBRATION, {}, {f"{MEASURED}-SHARED": 1}, (T4,), id="a-time-sliced-gpu-is-not-its-own"
        ),
        pytest.param(NO_CALIBRATION, {}, {f"{MEASURED}-MIG-1g.10gb": 1}, (T4,), id="a-mig-slice-is-a-share"),
    ],
)
def test_before_any_calibration_a_profiling_run_prefers_a_product_whose_figures_are_measured(
    calibration, config, cluster, expected
):
    """Issue 52: the T4s are the largest group, but a profile measured there is converted with the
    catalog's T4 figures, datasheet times a factor; one measured on the H100, whose figures are all
    measured and cited, is converted with figures known to be right. Calibration and config still win."""
    nodes = {A100: 3, L40S: 4, L4: 5, T4: 6, **cluster}
    found = profiling_products(
        set(nodes), nodes, calibration=calibration, catalog=CATALOG, config=Config.model_validate(config)
    )
    assert found == expected


def t4_measured(**shares: str) -> Any:
    profile = make_profile("decode", product=T4)
    assert profile.status is not None
    status = profile.status.model_copy(update={"time_shares": TimeShares.model_validate(shares)})
    return profile.model_copy(update={"status": status})


def test_a_profile_measured_on_a_product_calibrated_later_is_ranked_as_if_measured_with_the_calibrated_figures():
    """Issue 52, item 3: nothing keeps a conversion made with figures since corrected. A profile measured
    on the T4 is ranked through the T4's catalog figures until the T4's calibration qualifies; from then
    on, exactly as if the catalog had carried the calibrated T4 figures from the start."""
    profile = t4_measured(fp32="0.60", memory="0.30", latency="0.10")
    products = (A100, L40S, L4, T4, MEASURED)
    config = Config()
    before = ranking_of(profile, products, config=config, catalog=CATALOG)
    t4 = ProductCalibration(T4, FactorSupport(1.25, 12, 3), FactorSupport(1.51, 9, 2))
    calibrated = Calibration({T4: t4})
    after = ranking_of(profile, products, config=config, catalog=CATALOG, calibration=calibrated)
    entry = CATALOG.lookup(T4)
    assert entry is not None
    corrected_entry, changed = calibrated.calibrated(entry, config.min_calibration_runs)
    assert changed and corrected_entry.sustained_fp32_tflops == pytest.approx(
        entry.sustained_fp32_tflops / 1.51
    )
    corrected = Catalog([corrected_entry if p.product == T4 else p for p in CATALOG.products])
    as_if = ranking_of(profile, products, config=config, catalog=corrected)

    def read(ranked: list[Any]) -> list[tuple[str, int, float]]:
        return [(r.product.product, r.weight, round(r.relative_time, 9)) for r in ranked]

    assert read(after) == read(as_if) != read(before)
    assert all(r.calibrated for r in after), "the hints say the ranking rests on the cluster's calibration"


@pytest.mark.parametrize(
    ("product", "calibration", "figures"),
    [
        pytest.param(T4, NO_CALIBRATION, "datasheet", id="t4-the-datasheets"),
        pytest.param(MEASURED, NO_CALIBRATION, "measured", id="h100-measured"),
        pytest.param(
            T4,
            Calibration({T4: ProductCalibration(T4, FactorSupport(1.2, 12, 3), FactorSupport(1.5, 9, 2))}),
            "calibrated",
            id="t4-calibrated",
        ),
        pytest.param(
            T4,
            Calibration({T4: ProductCalibration(T4, FactorSupport(1.2, 12, 3), FactorSupport(1.5, 2, 1))}),
            "datasheet",
            id="t4-fp32-not-yet-calibrated-the-weakest-counts",
        ),
    ],
)
def test_the_hints_record_and_placement_say_what_the_measuring_products_figures_rest_on(
    product, calibration, figures, tmp_path: Path
):
    """Issue 52, item 2: a ranking from a T4-measured profile rests on the T4's datasheet figures, and
    the record says so, per unit the workload's time uses (the weakest of them: fp32 and memory here)."""
    profile = t4_measured(fp32="0.60", memory="0.30", latency="0.10")
    assert profile.status is not None
    profile = profile.model_copy(
        update={"status": profile.status.model_copy(update={"gpu": ProfileGpu(product=product)})}
    )
    eng = dataclasses.replace(engine(make_ctx(), [profile]), calibration=StaticCalibrationStore(calibration))
    result = admit(make_job("decode-1").label(v.WORKLOAD_LABEL, "decode").obj(), eng)
    assert result.decision.action == "hints" and result.decision.mutated is not None
    record = json.loads(result.decision.mutated["metadata"]["annotations"][v.HINTS_ANNOTATION])
    assert record["measuredOn"] == {"product": product, "figures": figures}
    rows = placement_rows(profile, MIXED_CLUSTER, catalog=CATALOG, config=Config(), calibration=calibration)
    assert {r.measured_on for r in rows if r.time_from != "observed"} == {f"{product}: {figures}"}


def test_a_profiling_job_gets_one_preferred_term_never_a_requirement_and_the_record_says_so():

    eng = dataclasses.replace(engine(make_ctx()), nodes=StaticNodeStore({A100, L4}, {A100: 1, L4: 6}))
    result = admit(make_job("fresh").label(v.WORKLOAD_LABEL, "fresh").obj(), eng)
    assert result.decision.action == "profiling"
    job = result.decision.mutated
    assert job is not None
    affinity = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    [term] = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term == {
        "weight": 100,
        "preference": {"matchExpressions": [{"key": v.GPU_PRODUCT_LABEL, "operator": "In", "values": [L4]}]},
    }
    required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(e["key"] != v.GPU_PRODUCT_LABEL for t in required for e in t["matchExpressions"])
    record = json.loads(job["metadata"]["annotations"][v.HINTS_ANNOTATION])
    assert "affinity.nodeAffinity.preferred" in record["injected"]


def test_each_factor_is_used_once_it_qualifies_on_its_own():
    entry = CATALOG.lookup(L4)
    assert entry is not None
    memory_only = calibration_of(l4=support(20, 2, factor=1.25))
    calibrated, changed = memory_only.calibrated(entry, 5)
    assert changed
    assert calibrated.sustained_bandwidth_gbs == pytest.approx(entry.sustained_bandwidth_gbs / 1.25)
    assert calibrated.sustained_fp32_tflops == entry.sustained_fp32_tflops
    neither = calibration_of(l4=support(2, 2))
    assert neither.calibrated(entry, 5) == (entry, False)


@pytest.mark.parametrize(
    ("new", "old", "moved"),
    [
        pytest.param(support(25, 25, factor=1.21), support(20, 20, factor=1.2), False, id="within-noise"),
        pytest.param(support(25, 25, factor=1.35), support(20, 20, factor=1.2), True, id="beyond-noise"),
        pytest.param(support(6, 25), support(4, 25), True, id="starts-qualifying"),
        pytest.param(support(4, 4, factor=2.0), support(3, 3), False, id="unqualified-moves-freely"),
    ],
)
def test_a_write_comes_sooner_only_when_a_factor_moved_beyond_its_noise(new, old, moved):

    fitted, written = calibration_of(l4=new), calibration_of(l4=old)
    assert moved_beyond_noise(fitted, written, 5) is moved
    wait = calibration_write_wait(fitted, written, since_write=10.0, interval=30.0, min_runs=5)
    assert wait == (0.0 if moved else 20.0)
    assert calibration_write_wait(fitted, written, since_write=None, interval=30.0, min_runs=5) == 0.0
    assert calibration_write_wait(fitted, written, since_write=31.0, interval=30.0, min_runs=5) == 0.0


def test_re_fitted_shares_round_trip_through_the_file_and_bad_ones_are_refused():
    calibration = fit_calibration(exact_samples(drawn_truth(3), EVERYWHERE), CATALOG, updated_at="t")
    assert set(calibration.workloads) == set(SHAPES)
    again = parse_calibration(calibration.to_json())
    assert again.to_json() == calibration.to_json()
    stream = again.shares_of("stream", "")  # keyed namespace/workload: these samples have none
    assert stream is None and again.workloads["stream"].profiled == A100
    document = json.loads(calibration.to_json())
    document["workloads"]["stream"]["memoryThroughput"] = 140
    with pytest.raises(CalibrationError, match=r"workloads\.stream: shares must be in \(0, 100\]"):
        parse_calibration(json.dumps(document))


def test_exact_runs_re_fit_the_profiles_own_shares():
    """Runs that the profile's shares explain exactly leave the shares where the profile put them."""
    calibration = fit_calibration(exact_samples(drawn_truth(1), EVERYWHERE), CATALOG)
    for name, (sm, mem) in SHAPES.items():
        fitted = calibration.workloads[name]
        assert (fitted.sm, fitted.mem) == pytest.approx((sm / 100, mem / 100), abs=0.005), name


# --- per unit (issue 43): tensor, FP32, FP64 and memory, each with its own factor ---------------------

H100, A10 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A10"
UNIT_PRODUCTS = (H100, A100, L40S, A10)
# workload: time shares on the H100 (latency the rest)
UNIT_SHAPES: dict[str, dict[v.Unit, float]] = {
    "bf16-train": {"tensor": 0.86, "memory": 0.06},
    "fp16-infer": {"tensor": 0.7, "memory": 0.1},
    "dgemm": {"fp64": 0.94},
    "fp64-solver": {"fp64": 0.8, "memory": 0.05},
    "nbody": {"fp32": 0.9},
    "pricing": {"fp32": 0.85, "memory": 0.03},
    "triad": {"memory": 0.9},
    "decode": {"memory": 0.75, "tensor": 0.1},
}


def units_truth() -> Truth:
    """Every unit of every product off the catalog: tensor and FP64 by -15 to +14 %."""
    off: dict[str, tuple[float, float, float, float]] = {  # tensor, fp32, fp64, memory
        H100: (0.96, 0.95, 0.97, 0.98),
        A100: (0.86, 1.02, 0.89, 0.91),
        L40S: (1.14, 0.82, 1.0, 0.94),
        A10: (0.85, 0.81, 1.0, 0.92),
    }
    figures = {}
    for product, (tensor, fp32, fp64, memory) in off.items():
        entry = CATALOG.lookup(product)
        assert entry is not None
        figures[product] = Figures(
            entry.sustained_fp32_tflops * fp32,
            entry.sustained_bandwidth_gbs * memory,
            entry.sustained_tensor_tflops * tensor,
            entry.sustained_fp64_tflops * fp64,
        )
    return Truth(CATALOG, figures)


def unit_samples(truth: Truth, pairs: Mapping[str, tuple[str, ...]], *, runs: int = 5) -> list[Sample]:
    """Exact runs of each workload (profiled on the H100, its time shares) on each of its products."""
    found = []
    for name, products in pairs.items():
        shares = dict(UNIT_SHAPES[name])
        shares["latency"] = 1 - sum(shares.values())
        for product in products:
            seconds = 1000.0 * truth.relative_time(shares, reference=H100, product=product)
            pairs_ = tuple((u, x) for u, x in shares.items() if u != "latency")
            found.append(Sample(name, product, runs, seconds, 0.5, 0.5, H100, pairs_))
    return found


def true_factor(truth: Truth, unit: v.Unit, product: str) -> float:
    """How much longer ``unit``'s time takes on ``product`` than the catalog says, relative to the H100's."""
    entry, base = CATALOG.lookup(product), CATALOG.lookup(H100)
    assert entry is not None and base is not None
    catalog_ratio = entry.sustained(unit) / base.sustained(unit)  # type: ignore[operator]
    true_ratio = truth.product(product).sustained(unit) / truth.product(H100).sustained(unit)  # type: ignore[operator]
    return catalog_ratio / true_ratio


def test_the_fit_learns_a_factor_per_unit_from_runs_with_time_shares():
    """Exact runs of tensor-, FP64-, FP32- and memory-bound workloads on every product: each unit's
    factor, relative to the H100's, is the truth's; an FP64 factor on the L40S and A10 too (FP64 work
    there is 47 to 68 times slower, and still clearly FP64-bound)."""
    truth = units_truth()
    calibration = fit_calibration(unit_samples(truth, dict.fromkeys(UNIT_SHAPES, UNIT_PRODUCTS)), CATALOG)
    base = calibration.products[H100]
    for product in UNIT_PRODUCTS:
        fitted = calibration.products[product]
        for unit in ("tensor", "fp32", "fp64", "memory"):
            support = fitted.support(unit)
            assert support.qualifies(5), (product, unit, fitted.as_dict())
            factor = support.factor / base.support(unit).factor
            assert factor == pytest.approx(true_factor(truth, unit, product), rel=0.01), (product, unit)


def test_a_unit_no_run_exercised_keeps_the_catalogs_figure_and_is_not_written():
    """FP32- and memory-bound runs on the A10 (decode's tensor share is there, but its runs are
    clearly memory-bound): the A10's tensor and FP64 stay the catalog's."""
    truth = units_truth()
    pairs = dict.fromkeys(("nbody", "pricing", "triad", "decode"), (H100, A10))
    samples = unit_samples(truth, pairs)
    calibration = fit_calibration(samples, CATALOG)
    a10 = calibration.products[A10]
    assert a10.compute.qualifies(5) and a10.memory.qualifies(5)
    assert (a10.tensor, a10.fp64) == (FactorSupport(), FactorSupport())
    written = json.loads(calibration.to_json())["products"][A10]
    assert not any(k.startswith(("tensor", "fp64")) for k in written), written
    assert written["fp32TimeFactor"] == written["computeTimeFactor"] == a10.compute.factor
    entry = CATALOG.lookup(A10)
    assert entry is not None
    calibrated, changed = calibration.calibrated(entry, 5)
    assert changed and calibrated.sustained_tensor_tflops == entry.sustained_tensor_tflops
    assert calibrated.sustained_fp32_tflops == pytest.approx(entry.sustained_fp32_tflops / a10.compute.factor)


def test_a_configmap_written_before_the_units_model_still_loads_its_compute_factor_as_fp32():
    before = {
        "products": {
            L4: {"memoryTimeFactor": 1.1357, "computeTimeFactor": 0.7912, "runs": 11, "workloads": 3,
                 "memoryRuns": 22, "memoryWorkloads": 4, "computeRuns": 11, "computeWorkloads": 3,
                 "updatedAt": "2026-11-23T10:00:00Z"},
        },
        "workloads": {
            "team-a/stream": {"product": T4, "smThroughput": 0.9, "memoryThroughput": 99.5, "fp32Tflops": 6.67,
                              "bandwidthGBs": 271.2, "runs": 14, "products": 3, "updatedAt": "t"},
        },
    }  # fmt: skip
    calibration = parse_calibration(json.dumps(before))
    l4 = calibration.products[L4]
    assert l4.support("fp32") == FactorSupport(0.7912, 11, 3) == l4.compute
    assert l4.support("memory") == FactorSupport(1.1357, 22, 4)
    assert l4.support("tensor") == l4.support("fp64") == FactorSupport()
    stream = calibration.shares_of("team-a", "stream")
    assert stream is not None and stream.time_shares == ()
    assert (stream.sm, stream.mem) == pytest.approx((0.009, 0.995))
    again = parse_calibration(calibration.to_json())
    assert again.to_json() == calibration.to_json()


def test_re_fitted_time_shares_round_trip_and_the_ranking_reads_them_against_their_figures():
    truth = units_truth()
    calibration = fit_calibration(
        unit_samples(truth, dict.fromkeys(UNIT_SHAPES, UNIT_PRODUCTS)), CATALOG, updated_at="t"
    )
    fitted = calibration.workloads["bf16-train"]
    shares = dict(fitted.time_shares)
    assert set(shares) == {"tensor", "memory", "latency"} and sum(shares.values()) == pytest.approx(
        1, abs=1e-4
    )
    assert shares["tensor"] == pytest.approx(0.86, abs=0.01), "exact runs keep the profile's shares"
    assert dict(fitted.figures)["tensor"] > 0 and "fp64" not in dict(fitted.figures)
    again = parse_calibration(calibration.to_json())
    assert again.to_json() == calibration.to_json()
    document = json.loads(calibration.to_json())
    document["workloads"]["bf16-train"]["timeShares"]["bogus"] = "0.1"
    with pytest.raises(CalibrationError, match="'bogus' is not a unit"):
        parse_calibration(json.dumps(document))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 7),
            st.sampled_from([-0.3, -0.05, 0.0, 0.02, 0.1, 0.1, 0.2]) | st.floats(-1, 1),
            st.integers(1, 6),
        ),
        max_size=60,
    ),
    st.sampled_from([math.inf, 0.1, 0.02]),
)
def test_the_group_wise_estimators_are_the_scalar_ones_on_each_group(
    rows: list[tuple[int, float, int]], delta: float
):
    """``huber_locations`` and ``weighted_medians`` (issue 59: the factors' fit over arrays) give, for
    each group, exactly what ``huber_location`` and ``weighted_median`` give on its values in order,
    ties (repeated values, a running weight at half) included; nan for a group with none. Both ways
    of ``huber_locations``: the array steps (``SCALAR_BELOW`` 0) and the scalar function per group."""
    rows = sorted(rows, key=lambda r: r[0])
    count = 8
    groups = np.array([g for g, _, _ in rows], dtype=np.intp)
    values = np.array([x for _, x, _ in rows], dtype=np.float64)
    weights = np.array([float(w) for _, _, w in rows], dtype=np.float64)
    medians = weighted_medians(values, weights, groups, count)
    ways = {}
    for below in (0, robust.SCALAR_BELOW):
        was, robust.SCALAR_BELOW = robust.SCALAR_BELOW, below
        try:
            ways[below] = huber_locations(values, weights, groups, count, delta=delta)
        finally:
            robust.SCALAR_BELOW = was
    for k in range(count):
        mine = [(x, w) for g, x, w in rows if g == k]
        if not mine:
            assert math.isnan(medians[k]) and all(math.isnan(located[k]) for located in ways.values())
            continue
        xs, ws = [x for x, _ in mine], [w for _, w in mine]
        assert medians[k] == weighted_median(xs, ws)
        for located in ways.values():
            assert located[k] == huber_location(xs, ws, delta=delta)
