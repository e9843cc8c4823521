"""The interconnect as a unit (issue 50, DESIGN "The interconnect"): the catalog's links, the share
DCGM's link counters give a gang's time, the ranking by the link a gang gets on each product, and
what `placement` shows. Real dcgm-exporter captures (../shared/fixtures/dcgm) where present."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config, TelemetryLabels
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.domain.vocabulary import Strategy, Unit
from kratos_admit.model.catalog import CatalogError, GpuProduct, load_catalog
from kratos_admit.model.links import (
    NVLINK_BANDWIDTH_TOTAL,
    NVLINK_RX_BYTES,
    NVLINK_TX_BYTES,
    PCIE_RX_BYTES,
    PCIE_TX_BYTES,
    link_activity,
    link_rates,
)
from kratos_admit.model.ranking import rank_gpu_products
from kratos_admit.model.telemetry import (
    DRAM_ACTIVE,
    GR_ENGINE_ACTIVE,
    PIPE_FP32_ACTIVE,
    PIPE_TENSOR_ACTIVE,
    TelemetryRun,
    derive,
    parse_exposition,
    pod_telemetry,
    with_telemetry,
)
from kratos_admit.simulation.replay import simulate
from kratos_admit.simulation.report import format_results
from kratos_admit.simulation.scheduling import SimNode
from kratos_admit.simulation.trace import SimulationError, Trace, TraceJob, Truth
from tests.builders import make_pod, sim_node
from tests.harness import (
    CATALOG,
    NODES,
    PODS,
    DcgmGpu,
    FakePrometheus,
    ScrapeJob,
    api_server,
    controller_running,
    dcgm_exporter_app,
    dcgm_exposition,
    events_of,
    eventually,
    node,
    nodes_file,
    prometheus_binary,
    prometheus_serving,
    real_prometheus,
    require_fixtures,
    run_kratos,
    status_of,
)
from tests.kube_double import KubeDouble

A100 = "NVIDIA-A100-SXM4-80GB"
H100_SXM = "NVIDIA-H100-80GB-HBM3"
H100_PCIE = "NVIDIA-H100-PCIe"
L40S = "NVIDIA-L40S"


# --- the catalog's links ------------------------------------------------------------------------


def test_every_product_names_its_links_and_where_they_come_from():
    catalog = load_catalog()
    for entry in catalog.products:
        assert entry.pcie_generation in (3, 4, 5) and entry.link_source, entry.product
        assert entry.pcie_bandwidth_gbs == {3: 32, 4: 64, 5: 128}[entry.pcie_generation]
        if entry.nvlink_gbs is not None:
            assert entry.nvlink_gpus in (2, 8) and entry.nvlink_generation, entry.product
    sxm = {p.product: p.nvlink_gbs for p in catalog.products if p.nvlink_gpus == 8}
    assert sxm[A100] == 600 and sxm[H100_SXM] == 900 and sxm["NVIDIA-B200"] == 1800
    bridged = {p.product for p in catalog.products if p.nvlink_gpus == 2}
    assert {"NVIDIA-A100-PCIE-40GB", "NVIDIA-A40", H100_PCIE, "NVIDIA-H100-NVL"} <= bridged
    assert all(p.nvlink_gbs is None for p in catalog.products if p.architecture == "Ada Lovelace")


def test_the_link_a_gang_gets_is_nvlink_where_it_fits_one_nvlink_domain_else_pcie():
    catalog = load_catalog()
    a100, h100_pcie, l40s = (catalog.lookup(p) for p in (A100, H100_PCIE, L40S))
    assert a100 is not None and h100_pcie is not None and l40s is not None
    assert a100.link(1) is None, "one GPU has no link to scale"
    assert str(a100.link(8)) == "NVLink 3 600 GB/s" and str(a100.link(16)) == "PCIe Gen4 64 GB/s"
    assert str(h100_pcie.link(2)) == "NVLink 4 600 GB/s", "a bridge joins a pair"
    assert str(h100_pcie.link(8)) == "PCIe Gen5 128 GB/s", "but not 8 cards"
    assert str(l40s.link(2)) == "PCIe Gen4 64 GB/s"
    mig = catalog.placement(f"{A100}-MIG-3g.40gb")
    assert mig is not None and str(mig.link(2)) == "PCIe Gen4 64 GB/s", "a MIG instance has no NVLink peer"


def test_a_catalog_entry_with_half_a_link_is_refused_naming_the_field(tmp_path: Path):
    base = load_catalog().lookup(L40S)
    assert base is not None
    entry = base.model_dump(by_alias=True, exclude_none=True)
    for broken, words in (
        ({"nvlinkGBs": 600}, "nvlinkGBs needs nvlinkGPUs"),
        ({"pcieGeneration": 6}, "pcieGeneration 6 has no known x16 bandwidth: give pcieGBs"),
    ):
        path = tmp_path / "catalog.yaml"
        path.write_text(json.dumps({"products": [entry | broken]}))
        with pytest.raises(CatalogError, match=words):
            load_catalog(path)
    assert GpuProduct.model_validate(entry | {"pcieGeneration": 6, "pcieGBs": 256}).pcie_bandwidth_gbs == 256


# --- the share, from the link counters -------------------------------------------------------------

# a gang's step on 8 A100-SXM4s: tensor pipe at 45 % (half the run at its 0.9), DRAM at 8 % (a tenth
# at 0.8), NVLink moving 199.2 GB/s both ways = 0.4 x 0.83 x 600: busy 40 % of the run
GANG_COUNTERS = {
    PIPE_TENSOR_ACTIVE: 0.45,
    PIPE_FP32_ACTIVE: 0.0,  # the extended counters: CUDA-core work seen, and none
    DRAM_ACTIVE: 0.08,
    GR_ENGINE_ACTIVE: 0.97,
    NVLINK_TX_BYTES: 99.6e9,
    NVLINK_RX_BYTES: 99.6e9,
    PCIE_TX_BYTES: 1.0e9,
    PCIE_RX_BYTES: 1.0e9,
}


def telemetry_profile(counters: dict[str, float], *, linked: bool, product: str = A100) -> WorkloadProfile:
    run = TelemetryRun("uid-0", product, 600.0, 8, counters, linked=linked)
    status = with_telemetry(None, run, now="2026-11-28T12:00:00Z", catalog=CATALOG)
    assert status is not None
    return WorkloadProfile.model_validate(
        {"metadata": {"name": "train-profile", "namespace": "team-a"}, "spec": {"workload": "train"},
         "status": status.as_status()}
    )  # fmt: skip


def test_a_gangs_link_counters_become_its_interconnect_share_and_the_shares_still_sum_to_1():
    profile = telemetry_profile(GANG_COUNTERS, linked=True)
    assert profile.status is not None and profile.status.time_shares is not None
    shares = profile.status.time_shares.model_dump(exclude_none=True)
    assert shares == {
        "tensor": "0.50", "fp32": "0.00", "fp64": "0.00", "memory": "0.10", "interconnect": "0.40", "latency": "0.00"
    }  # fmt: skip
    assert profile.status.telemetry[0].counters[NVLINK_TX_BYTES] == "9.96e+10", "rates kept as measured"
    reading = link_activity(GANG_COUNTERS, CATALOG.lookup(A100))
    assert reading.activity == pytest.approx(199.2 / 600) and reading.rates == {"NVLink": 199.2, "PCIe": 2.0}


def test_the_interconnect_claims_only_what_no_unit_computed_so_the_units_shares_are_those_without_it():
    """A collective that ran while a unit computed was hidden behind it: the units keep the shares a run
    without link counters gets, and the interconnect takes from what was latency."""
    busy = GANG_COUNTERS | {DRAM_ACTIVE: 0.4}  # DRAM half the run: the tensor pipe and DRAM claim it all
    with_links = telemetry_profile(busy, linked=True).status
    without = telemetry_profile(busy, linked=False).status
    assert with_links is not None and without is not None
    assert with_links.time_shares is not None and without.time_shares is not None
    assert (with_links.time_shares.tensor, with_links.time_shares.memory) == ("0.50", "0.50")
    assert with_links.time_shares.interconnect == "0.00" and without.time_shares.interconnect is None


def test_a_run_on_one_gpu_folds_no_link_counter_and_leaves_the_interconnect_unmeasured():
    profile = telemetry_profile(GANG_COUNTERS, linked=False)
    assert profile.status is not None and profile.status.time_shares is not None
    assert profile.status.time_shares.interconnect is None, "unmeasured, not 0"
    assert "interconnect" not in profile.status.as_status()["timeShares"]
    assert not set(profile.status.telemetry[0].counters) & {NVLINK_TX_BYTES, PCIE_TX_BYTES}


def test_without_the_link_counters_a_gang_still_gets_a_profile_whose_interconnect_is_unmeasured():
    """dcgm-exporter's defaults before 4.x have neither PROF_PCIE_* nor PROF_NVLINK_*: a profile all the
    same, the interconnect unmeasured, never 0, and the counters it lacks named."""
    kernels = {
        k: val
        for k, val in GANG_COUNTERS.items()
        if k in (PIPE_TENSOR_ACTIVE, PIPE_FP32_ACTIVE, DRAM_ACTIVE, GR_ENGINE_ACTIVE)
    }
    profile = telemetry_profile(kernels, linked=True)
    assert profile.status is not None and profile.status.phase == "Ready"
    assert profile.status.time_shares is not None and profile.status.time_shares.interconnect is None
    assert profile.status.time_shares.latency == "0.40", "the time stays where it was before links"
    reading = link_activity(kernels, CATALOG.lookup(A100))
    assert reading.activity is None and reading.missing == (
        f"{NVLINK_TX_BYTES}/{NVLINK_RX_BYTES} (or {NVLINK_BANDWIDTH_TOTAL})",
        f"{PCIE_TX_BYTES}/{PCIE_RX_BYTES}",
    )
    # NVLink through field 449 alone (MB/s, both ways), as dcgm-exporter's defaults have it
    total = {**kernels, NVLINK_BANDWIDTH_TOTAL: 199_200.0, PCIE_TX_BYTES: 1e9, PCIE_RX_BYTES: 1e9}
    assert link_activity(total, CATALOG.lookup(A100)).activity == pytest.approx(199.2 / 600)
    pcie_only = {**kernels, PCIE_TX_BYTES: 1e9, PCIE_RX_BYTES: 1e9}
    assert link_activity(pcie_only, CATALOG.lookup(A100)).activity is None, "NVLink unseen on an NVLink part"
    assert link_activity(pcie_only, CATALOG.lookup(L40S)).activity == pytest.approx(2 / 64)


# --- ranking ------------------------------------------------------------------------------------------


def ranked(
    profile: WorkloadProfile, nodes: list[str], gpus: int, strategy: Strategy = "performance"
) -> list[str]:
    found = rank_gpu_products(
        profile,
        nodes,
        catalog=CATALOG,
        strategy=strategy,
        reference_product=A100,
        gpus=gpus,
    )
    return [r.product.product for r in found]


@pytest.mark.parametrize("strategy", ["performance", "balanced"])
def test_a_gang_with_40_percent_on_its_links_ranks_nvlink_parts_first(strategy: Strategy):
    profile = telemetry_profile(GANG_COUNTERS, linked=True)
    assert ranked(profile, [H100_PCIE, H100_SXM], 8, strategy) == [H100_SXM, H100_PCIE]
    assert ranked(profile, [L40S, A100], 8, strategy) == [A100, L40S]
    found = rank_gpu_products(
        profile, [L40S, A100], catalog=CATALOG, strategy="balanced", reference_product=A100, gpus=8
    )
    assert [r.link for r in found] == ["NVLink 3 600 GB/s", "PCIe Gen4 64 GB/s"]
    # tensor 0.5 x 0.87 (the L40S's is 366 against 312) + memory 0.1 x 2.09 + links 0.4 x 600 / 64
    assert found[0].relative_time == 1.0 and found[1].relative_time == pytest.approx(4.3, abs=0.2)


def test_the_same_workload_on_one_gpu_ranks_as_it_did_before_links_were_measured():
    """At 1 GPU no link scales the interconnect's time: it counts as the latency it was, and every
    product's predicted time is that of the profile without link counters (the L40S, cheaper, first
    under the balanced strategy, as before)."""
    measured = telemetry_profile(GANG_COUNTERS, linked=True)
    before = telemetry_profile(GANG_COUNTERS, linked=False)
    nodes = [L40S, A100, H100_PCIE, H100_SXM]
    strategies: tuple[Strategy, ...] = ("performance", "balanced", "cost")
    for strategy in strategies:
        now = rank_gpu_products(measured, nodes, catalog=CATALOG, strategy=strategy, reference_product=A100)
        was = rank_gpu_products(before, nodes, catalog=CATALOG, strategy=strategy, reference_product=A100)
        assert [(r.product.product, round(r.relative_time, 9), r.weight) for r in now] == [
            (r.product.product, round(r.relative_time, 9), r.weight) for r in was
        ]
        assert all(r.link == "" and "link" not in r.as_dict() for r in now)
    assert ranked(measured, [L40S, A100], 1, "balanced") == [L40S, A100]


# --- placement ----------------------------------------------------------------------------------------


def test_placement_shows_the_interconnect_column_and_its_source_for_a_gang(tmp_path: Path):
    profile = telemetry_profile(GANG_COUNTERS, linked=True)
    path = tmp_path / "profile.yaml"
    path.write_text(json.dumps({"apiVersion": "gpu.scheduler.io/v1alpha1", "kind": "WorkloadProfile",
                                **profile.model_dump(by_alias=True, exclude_none=True)}))  # fmt: skip
    nodes = nodes_file(tmp_path, A100, L40S)
    code, out, err = run_kratos("placement", "-p", str(path), "--nodes", str(nodes), "--gpus", "8")
    assert code == 0, err
    header, table = out.split("\n\n", 1)
    assert "interconnect 40%" in header and "on 8 GPUs together" in header
    assert "interconnect: links 33% busy (NVLink 199.2 GB/s, PCIe 2.0 GB/s, both ways)" in header
    lines = table.splitlines()
    assert "INTERCONNECT GBS" in lines[0] and "INTERCONNECT FROM" in lines[0]
    assert (
        lines[1].startswith(A100)
        and "600.0" in lines[1]
        and "NVLink 3, datasheet: NVIDIA NVLink page" in lines[1]
    )
    assert lines[2].startswith(L40S) and "PCIe Gen4, datasheet: L40S datasheet" in lines[2]
    code, out, _ = run_kratos("placement", "-p", str(path), "--nodes", str(nodes))
    assert code == 0 and "INTERCONNECT" not in out, "one GPU: no link column"
    code, _, err = run_kratos("placement", "-p", str(path), "--gpus", "0")
    assert code == 2 and "'0' is not a GPU count" in err


# --- real dcgm-exporter captures -----------------------------------------------------------------


def capture_counters(name: str) -> dict[str, float]:
    text = (require_fixtures() / "dcgm" / name).read_text("utf-8")
    return pod_telemetry(parse_exposition(text).samples, TelemetryLabels()).counters


def test_real_captures_link_counters_parse_to_the_share_their_rates_give():
    """No public capture of a busy NVLink was found (the ones published show 0, or are made up for
    tests): the busy PCIe of a T4 and of an A100, the idle NVLink field 449 of eight A800s, and an L4
    at rest, each to the activity its own lines give by hand."""
    t4 = capture_counters("ericsson-t4-busy-no-help.txt")
    assert link_rates(t4) == {"PCIe": pytest.approx((4_791_810 + 6_935_930) / 1e9)}
    reading = link_activity(t4, CATALOG.lookup("Tesla-T4"))
    assert reading.activity == pytest.approx((4_791_810 + 6_935_930) / 1e9 / 32)
    busy = derive(t4, reading.activity)
    assert busy.time_shares is not None and busy.time_shares.interconnect == "0.00", "measured: 0.04 %"
    # the busy A100 (MIG-enabled): field 449 reads 0, PCIe 131 MB/s: its links were all but idle
    a100 = capture_counters("nvdocs-a100-mig-busy-prof.txt")
    assert link_rates(a100) == {"NVLink": 0.0, "PCIe": pytest.approx((33_011_804 + 97_863_601) / 1e9)}
    idle = link_activity(a100, CATALOG.lookup("NVIDIA-A100-SXM4-40GB"))
    assert idle.activity == pytest.approx((33_011_804 + 97_863_601) / 1e9 / 64)
    # the same GPU's kernel counters without any link line (dcgm-exporter's 2.x defaults): unmeasured
    kernels_only = {
        k: val for k, val in a100.items() if k not in (NVLINK_BANDWIDTH_TOTAL, PCIE_TX_BYTES, PCIE_RX_BYTES)
    }
    unmeasured = link_activity(kernels_only, CATALOG.lookup("NVIDIA-A100-SXM4-40GB"))
    assert unmeasured.activity is None and NVLINK_BANDWIDTH_TOTAL in unmeasured.missing[0]
    # eight A800s at rest: field 449 reads 0 on every GPU (and MIG instance), PCIe a few hundred kB/s
    a800 = capture_counters("johnsblog-a800x8-mig-idle.txt")
    pcie = [(143341 + 211846), (135469 + 207094), (172128 + 232474), (137399 + 209486),
            (154056 + 216347), (141257 + 210443), (145473 + 213124)]  # fmt: skip
    assert link_rates(a800) == {"NVLink": 0.0, "PCIe": pytest.approx(sum(pcie) / len(pcie) / 1e9)}
    assert (
        link_activity(a800, None).reason
        == "the catalog has no link figures for a product the catalog does not know"
    )
    l4 = capture_counters("kops-aws-l4-idle-full.txt")
    assert link_activity(l4, CATALOG.lookup("NVIDIA-L4")).activity == pytest.approx(
        (112_603 + 17_544) / 1e9 / 64
    )


# --- the controller: a gang's run through Prometheus -------------------------------------------------


def gang_gpus(namespace: str, pod: str, counters: dict[str, float]) -> list[DcgmGpu]:
    return [DcgmGpu(i, f"GPU-{pod}-{i}", namespace, pod, counters=tuple(counters.items())) for i in range(8)]


def gang_pod(name: str, workload: str, started: str, finished: str) -> dict[str, object]:
    """A Pod of an Indexed Job on 8 GPUs, as the Job controller labels it, with the hints record its
    template had from admission (a gang of one Pod of 8: ``gangGPUs`` 8)."""
    return (
        make_pod(name, "team-a")
        .label(v.WORKLOAD_LABEL, workload)
        .label(v.JOB_COMPLETION_INDEX, "0")
        .annotate(v.HINTS_ANNOTATION, json.dumps({"gang": "Indexed Job", "gangGPUs": 8}))
        .limits({v.GPU_RESOURCE: "8"})
        .ran("gpu-0", started, finished)
        .obj()
    )


async def test_a_gangs_run_makes_its_interconnect_share_and_one_without_link_counters_is_named():
    kube = KubeDouble()
    kube.put(*NODES, node("gpu-0", A100))
    kube.put(*PODS, gang_pod("train-0", "train", "2026-11-25T07:00:00Z", "2026-11-25T07:10:00Z"))
    kube.put(*PODS, gang_pod("bare-0", "bare", "2026-11-25T07:00:00Z", "2026-11-25T07:10:00Z"))
    kernels = {k: val for k, val in GANG_COUNTERS.items() if k in (PIPE_TENSOR_ACTIVE, PIPE_FP32_ACTIVE, DRAM_ACTIVE, GR_ENGINE_ACTIVE)}  # fmt: skip
    text = dcgm_exposition(
        [*gang_gpus("team-a", "train-0", GANG_COUNTERS), *gang_gpus("team-a", "bare-0", kernels)]
    )
    fake = FakePrometheus().load_text(text)
    async with api_server(kube) as server, prometheus_serving(fake) as url:
        config = Config.model_validate({"telemetry": {"prometheusURL": url}})
        async with controller_running(server, config=config):
            train = await eventually(lambda: (s := status_of(kube, "train")).get("timeShares") and s)
            assert train["timeShares"]["interconnect"] == "0.40" and train["source"] == "telemetry"
            assert train["telemetry"][0]["counters"][NVLINK_TX_BYTES] == "9.96e+10"
            assert train["gpu"]["gangGPUs"] == 8 and train["telemetry"][0]["gangGPUs"] == 8, "its link's size"
            bare = await eventually(lambda: (s := status_of(kube, "bare")).get("timeShares") and s)
            assert bare["phase"] == "Ready" and "interconnect" not in bare["timeShares"]
            assert bare["timeShares"]["latency"] == "0.40", "unmeasured, never 0: the time stays latency"
            [event] = await eventually(lambda: events_of(kube, "TelemetryUnavailable"))
            assert (
                event["regarding"]["name"] == "bare-0" and "team-a/bare-0" in event["note"]
            )  # no profile yet: on the Pod
            assert f"{NVLINK_TX_BYTES}/{NVLINK_RX_BYTES} (or {NVLINK_BANDWIDTH_TOTAL})" in event["note"]
            assert f"{PCIE_TX_BYTES}/{PCIE_RX_BYTES}" in event["note"]


async def scraped(url: str, name: str) -> None:
    """Until Prometheus has scraped a series of ``name`` (its targets appear a few seconds after it is
    ready), and a second more."""
    async with aiohttp.ClientSession() as session:
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            async with session.get(f"{url}/api/v1/query", params={"query": name}) as response:
                if (await response.json())["data"]["result"]:
                    break
            assert asyncio.get_running_loop().time() < deadline, f"Prometheus at {url} never scraped {name}"
            await asyncio.sleep(0.5)
    await asyncio.sleep(1)


async def test_a_real_prometheus_scraping_the_exporters_format_turns_link_counters_into_the_share(
    tmp_path: Path,
):
    """Debian's prometheus scrapes a dcgm-exporter stand-in serving a gang Pod's 8 GPUs with their link
    counters; the controller asks it as in a cluster, and the profile gets its interconnect share."""
    prometheus_binary()
    kube = KubeDouble()
    kube.put(*NODES, node("gpu-0", A100))
    exporter = TestServer(dcgm_exporter_app(lambda: gang_gpus("team-a", "train-0", GANG_COUNTERS)))
    await exporter.start_server()
    try:
        async with real_prometheus(
            [ScrapeJob("dcgm-exporter", f"127.0.0.1:{exporter.port}")], tmp_path
        ) as url:
            await scraped(url, NVLINK_TX_BYTES)  # Prometheus has the exporter's series before the run ends
            now = dt.datetime.now(dt.UTC)
            stamp = lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
            kube.put(*PODS, gang_pod("train-0", "train", stamp(now - dt.timedelta(seconds=60)), stamp(now)))
            config = Config.model_validate({"telemetry": {"prometheusURL": url}})
            async with api_server(kube) as server, controller_running(server, config=config):
                train = await eventually(
                    lambda: (s := status_of(kube, "train")).get("timeShares") and s, timeout=30
                )
    finally:
        await exporter.close()
    assert train["timeShares"]["interconnect"] == "0.40"
    assert float(train["telemetry"][0]["counters"][NVLINK_RX_BYTES]) == pytest.approx(99.6e9)


# --- simulate: gangs and single-GPU Jobs over SXM and PCIe products ----------------------------------

SIM_WORKLOADS: dict[str, tuple[dict[Unit, float], int, int, float]] = {
    # name: (time shares on the A100-SXM4, GPUs per Pod, Pods, seconds on 8 A100-SXM4s or one A100)
    "allreduce": ({"tensor": 0.5, "memory": 0.1, "interconnect": 0.4, "latency": 0.0}, 8, 1, 3600),
    "ddp2x8": ({"tensor": 0.6, "memory": 0.1, "interconnect": 0.3, "latency": 0.0}, 8, 2, 3600),
    "pairs": ({"tensor": 0.7, "memory": 0.1, "interconnect": 0.2, "latency": 0.0}, 2, 1, 2400),
    "gemm": ({"tensor": 0.9, "memory": 0.05, "latency": 0.05}, 1, 1, 1200),
    "stream": ({"memory": 0.95, "latency": 0.05}, 1, 1, 900),
    "fp32": ({"fp32": 0.85, "memory": 0.1, "latency": 0.05}, 1, 1, 1500),
}


def gang_trace(jobs: int = 120, gap: float = 450.0) -> Trace:
    """Three gang workloads (one Pod on 8 GPUs, two Pods on 8 each, a pair) whose collectives take 20 to
    40 % of a step on 8 A100-SXM4s, and three single-GPU ones, in turn, one every ``gap`` seconds."""
    names = sorted(SIM_WORKLOADS)
    found = []
    for i in range(jobs):
        workload = names[i % len(names)]
        shares, gpus, pods, seconds = SIM_WORKLOADS[workload]
        found.append(
            TraceJob(name=f"{workload}-{i}", workload=workload, arrival=gap * i, gpus=gpus, pods=pods,
                     reference_product=A100, reference_seconds=seconds, time_shares=shares,
                     metrics={"smThroughput": "50.00", "memoryThroughput": "20.00"})
        )  # fmt: skip
    return Trace(tuple(found))


def sxm_and_pcie_cluster() -> list[SimNode]:
    """Two 8-GPU Nodes of each: A100-SXM4 and H100 SXM5 (NVLink to 8), H100 PCIe (bridged pairs), L40S."""
    return [sim_node(f"{p.lower()}-{i}", p) for p in (A100, H100_SXM, H100_PCIE, L40S) for i in range(2)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_simulate_places_gangs_whole_and_kratos_comes_within_10_percent_of_the_oracle_for_both(seed: int):
    """Issue 50's trace: kratos's mean JCT within 1.10x of the oracle's and below the default's, for the
    gangs and for the single-GPU Jobs apart (seed 1: gangs 1921 s against 1859 s, default 4348 s;
    single 605 s against 593 s, default 1072 s), and every product's prediction error within 10 % for
    each (at most 3 %). The same trace with the Nodes listed in another order, so that the scheduler's
    ties fall otherwise, gives gangs 1.08x to 1.15x (docs/placement.md)."""
    result = simulate(
        gang_trace(), sxm_and_pcie_cluster(), truth=Truth(CATALOG, {}), config=Config(), catalog=CATALOG,
        seed=seed, policies=("default", "kratos", "oracle"),
    )  # fmt: skip
    for gang in (True, False):
        mean = {name: r.mean_jct_of(gang) for name, r in result.policies.items()}
        kratos, oracle, default = mean["kratos"], mean["oracle"], mean["default"]
        assert kratos is not None and oracle is not None and default is not None
        assert kratos <= 1.10 * oracle and kratos < default, (gang, mean)
    for errors in (result.gang_prediction_error, result.single_prediction_error):
        assert set(errors) == {A100, H100_SXM, H100_PCIE, L40S} and max(errors.values()) <= 0.10, errors
    # no link factor qualifies here: few of the gangs' runs on PCIe parts are bound by their links alone
    # (seeds 2 and 3: one L40S run), and the links are the catalog's: the factors stay within noise
    # of 1 (docs/ranking.md "The links' factors")
    products = result.learned.current().products.values()
    links = [support for p in products for support in (p.nvlink, p.pcie)]
    assert not any(link.qualifies(Config().min_calibration_runs) for link in links), [
        p.as_dict() for p in products
    ]
    assert all(abs(link.factor - 1) < 0.05 for link in links), [p.as_dict() for p in products]
    report = result.as_dict()
    gangs = result.policies["kratos"].mean_jct_of(True)
    assert gangs is not None and report["meanJctApart"]["kratos"]["gangs"] == round(gangs, 1)
    assert set(report["policies"]["kratos"]) == {
        "meanJctSeconds",
        "p95JctSeconds",
        "makespanSeconds",
        "gpuHours",
    }
    assert set(report["predictionErrorApart"]) == {"gangs", "singleGpu"}
    text = format_results(result)
    assert "GANGS MEAN JCT s" in text and "prediction error over the gangs' workloads alone" in text


def test_a_gang_of_two_8_gpu_pods_waits_until_one_product_has_room_for_both():
    """Two Pods of 8 on a cluster of one 8-GPU Node per product: no product holds both, so no Pod of
    it ever starts alone; with two Nodes of a product it runs there, both Pods at once."""
    job = TraceJob(
        name="ddp-0", workload="ddp", arrival=0.0, gpus=8, pods=2, reference_product=A100,
        reference_seconds=600.0, metrics={"smThroughput": "50.00", "memoryThroughput": "20.00"},
        time_shares=SIM_WORKLOADS["ddp2x8"][0],
    )  # fmt: skip
    lonely = [sim_node(f"{p.lower()}-0", p) for p in (A100, H100_PCIE)]
    with pytest.raises(SimulationError, match="ddp-0 never fits"):
        simulate(
            Trace((job,)),
            lonely,
            truth=Truth(CATALOG, {}),
            config=Config(),
            catalog=CATALOG,
            policies=("default",),
        )
    pair = [*lonely, sim_node("l40s-0", L40S), sim_node("l40s-1", L40S)]
    result = simulate(
        Trace((job,)), pair, truth=Truth(CATALOG, {}), config=Config(), catalog=CATALOG, policies=("default",)
    )
    truth = Truth(CATALOG, {}).relative_time(job.time_shares or {}, reference=A100, product=L40S, gpus=16)
    assert result.policies["default"].jct[0] == pytest.approx(600.0 * truth, rel=0.051)
    assert result.policies["default"].gpu_seconds == pytest.approx(16 * result.policies["default"].jct[0])
