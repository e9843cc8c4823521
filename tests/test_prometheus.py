"""The Prometheus HTTP API client (kratos_admit/prometheus.py) against a real aiohttp server that
answers ``/api/v1/query`` as Prometheus does: a Pod's counters from a capture, label spellings,
error answers, timeouts, an unreachable URL, a bearer token and a private CA."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kratos_admit.domain.config import TelemetryConfig
from kratos_admit.edge.prometheus import Prometheus, PrometheusError, vector_samples
from kratos_admit.model.telemetry import (
    DEFAULT_COUNTERS,
    DRAM_ACTIVE,
    GR_ENGINE_ACTIVE,
    PIPE_FP32_ACTIVE,
    PIPE_TENSOR_ACTIVE,
    QUERIED,
    Sample,
    derive,
    parse_exposition,
    pod_samples,
    pod_telemetry,
)
from kratos_admit.webhook.certs import generate
from tests.harness import (
    DATA,
    DcgmGpu,
    FakePrometheus,
    ScrapeJob,
    dcgm_exporter_app,
    free_port,
    prometheus_binary,
    prometheus_serving,
    real_prometheus,
)

END = dt.datetime(2026, 11, 25, 8, 0, tzinfo=dt.UTC)


def settings(url: str, **more: Any) -> TelemetryConfig:
    return TelemetryConfig.model_validate({"prometheusURL": url, **more})


async def ask(url: str, namespace: str, pod: str, **more: Any) -> list[Any]:
    client = Prometheus(settings(url, **more))
    try:
        return await client.pod_samples(namespace=namespace, pod=pod, end=END, seconds=1234.5)
    finally:
        await client.close()


async def test_a_pods_counters_come_back_per_series_and_map_to_its_profile():
    fake = FakePrometheus().load(DATA / "dcgm" / "k8s-h100x4-two-pods.txt")
    async with prometheus_serving(fake) as url:
        samples = await ask(url, "team-a", "train-llm-0-x7k2p")
    found = pod_telemetry(samples, settings(url).labels)
    assert len(found.gpus) == 2 and derive(found.counters).bound_type == "compute"
    assert {q["time"] for q in fake.queries} == {f"{END.timestamp():.3f}"}
    assert len(fake.queries) == len(QUERIED)
    assert all("[1235s]" in q["query"] and " or " in q["query"] for q in fake.queries)


async def test_series_renamed_by_a_servicemonitor_scrape_are_found_through_the_exported_labels():
    fake = FakePrometheus().load(DATA / "dcgm" / "servicemonitor-a100-extended-exported-labels.txt")
    async with prometheus_serving(fake) as url:
        samples = await ask(url, "team-c", "stream-triad-5")
        none_for_the_exporters_namespace = await ask(url, "team-c", "nvidia-dcgm-exporter-b8t4m")
    assert derive(pod_telemetry(samples, settings(url).labels).counters).bound_type == "memory"
    assert none_for_the_exporters_namespace == []


async def test_a_gpu_without_profiling_counters_answers_only_its_presence():
    fake = FakePrometheus().load(DATA / "dcgm" / "geforce-no-profiling-counters.txt")
    async with prometheus_serving(fake) as url:
        samples = await ask(url, "team-e", "render-job-8xq4t")
    found = pod_telemetry(samples, settings(url).labels)
    assert found.counters == {} and found.missing == DEFAULT_COUNTERS and len(found.gpus) == 1


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        pytest.param(400, '{"status":"error","errorType":"bad_data","error":"invalid parameter \\"query\\": 1:15: parse error"}', "HTTP 400: bad_data: invalid parameter \"query\": 1:15: parse error", id="bad-data"),
        pytest.param(503, '{"status":"error","errorType":"unavailable","error":"too many queries"}', "HTTP 503: unavailable: too many queries", id="unavailable"),
        pytest.param(502, "<html><body>Bad Gateway</body></html>\n", "HTTP 502: <html><body>Bad Gateway</body></html>", id="proxy-page"),
        pytest.param(200, '{"status":"success","data":{"resultType":"matrix","result":[]}}', "expected a vector answer, got matrix", id="matrix"),
        pytest.param(200, "not json", "the answer is not JSON: not json", id="not-json"),
        pytest.param(200, '{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"lots"]}]}}', "a sample value is not a number: lots", id="bad-value"),
    ],
)  # fmt: skip
async def test_an_error_answer_is_one_line_naming_the_url(status: int, body: str, message: str):
    async with prometheus_serving(FakePrometheus(fail=(status, body))) as url:
        with pytest.raises(PrometheusError) as err:
            await ask(url, "team-a", "p")
    assert str(err.value) == f"{url}: {message}"


async def test_a_slow_prometheus_is_given_up_after_the_timeout():
    async with prometheus_serving(FakePrometheus(delay=2.0)) as url:
        with pytest.raises(PrometheusError) as err:
            await ask(url, "team-a", "p", timeoutSeconds=0.2)
    assert str(err.value) == f"{url}: no answer within 0.2 s"


async def test_an_unreachable_prometheus_is_one_line_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusError) as err:
        await ask(url, "team-a", "p")
    assert str(err.value).startswith(f"{url}: ") and "\n" not in str(err.value)
    assert "connect" in str(err.value).lower()


async def test_the_bearer_token_is_read_from_its_file_and_sent(tmp_path: Path):
    token = tmp_path / "token"
    token.write_text("s3cr3t\n")
    fake = FakePrometheus(token="s3cr3t").load(DATA / "dcgm" / "k8s-h100x4-two-pods.txt")
    async with prometheus_serving(fake) as url:
        assert await ask(url, "team-a", "train-llm-0-x7k2p", bearerTokenFile=str(token))
        with pytest.raises(PrometheusError) as refused:
            await ask(url, "team-a", "train-llm-0-x7k2p")
        with pytest.raises(PrometheusError) as unreadable:
            await ask(url, "team-a", "train-llm-0-x7k2p", bearerTokenFile=str(tmp_path / "absent"))
    assert str(refused.value) == f"{url}: HTTP 401: Unauthorized"
    assert str(unreadable.value).startswith(f"{url}: cannot read bearerTokenFile {tmp_path / 'absent'}: ")


async def test_a_prometheus_with_a_private_ca_is_trusted_through_ca_file(tmp_path: Path):
    generate(service="localhost", namespace="monitoring", out=tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    fake = FakePrometheus().load(DATA / "dcgm" / "k8s-h100x4-two-pods.txt")
    runner = web.AppRunner(fake.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    url = f"https://localhost:{port}"
    try:
        assert await ask(url, "team-a", "train-llm-0-x7k2p", caFile=str(tmp_path / "ca.crt"))
        with pytest.raises(PrometheusError) as untrusted:
            await ask(url, "team-a", "train-llm-0-x7k2p")
        with pytest.raises(PrometheusError) as bad_ca:
            await ask(url, "team-a", "train-llm-0-x7k2p", caFile=str(tmp_path / "tls.key"))
    finally:
        await runner.cleanup()
    assert "certificate verify failed" in str(untrusted.value) and str(untrusted.value).startswith(url)
    assert str(bad_ca.value).startswith(f"{url}: cannot use caFile {tmp_path / 'tls.key'}: ")


def test_a_vector_answer_keeps_the_series_labels_and_takes_the_queried_name():
    body = json.loads(
        '{"status":"success","data":{"resultType":"vector","result":['
        '{"metric":{"UUID":"GPU-a","namespace":"ns","pod":"p"},"value":[1764057600,"0.71"]},'
        '{"metric":{"__name__":"DCGM_FI_PROF_DRAM_ACTIVE","UUID":"GPU-b"},"value":[1764057600,"NaN"]}]}}'
    )
    first, second = vector_samples(body, DRAM_ACTIVE, url="http://p")
    assert (first.name, dict(first.labels), first.value) == (
        DRAM_ACTIVE,
        {"UUID": "GPU-a", "namespace": "ns", "pod": "p"},
        0.71,
    )
    assert second.name == DRAM_ACTIVE and second.value != second.value  # NaN: dropped by the pure core


async def test_the_dcgm_exporter_stand_in_serves_what_its_pods_run_as_the_captures_show():
    """The stand-in a real Prometheus scrapes in the end-to-end suite: Kubernetes-mode labels for
    the Pods on its GPUs at each scrape, read back by the same parser as the real captures."""
    running = [
        DcgmGpu(0, "GPU-a", "team-a", "train-0", counters=((DRAM_ACTIVE, 0.25), (PIPE_TENSOR_ACTIVE, 0.8)))
    ]
    server = TestServer(dcgm_exporter_app(lambda: running))
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(server.make_url("/metrics")) as response:
                first = await response.text()
                assert response.content_type == "text/plain"
            running.clear()
            async with session.get(server.make_url("/metrics")) as response:
                later = await response.text()
    finally:
        await server.close()
    exposition = parse_exposition(first)
    assert not exposition.skipped and "# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge" in first
    labels = settings("http://p").labels
    found = pod_telemetry(
        pod_samples(exposition.samples, namespace="team-a", pod="train-0", labels=labels), labels
    )
    assert found.counters[DRAM_ACTIVE] == 0.25 and derive(found.counters).bound_type == "compute"
    assert parse_exposition(later).samples == ()


async def test_a_real_prometheus_answers_the_pod_queries_under_both_label_spellings(tmp_path: Path):
    """Debian's prometheus scrapes two dcgm-exporter stand-ins: one keeps the exporter's labels
    (honor_labels), one is scraped as a ServiceMonitor does, its namespace/pod clashing with the
    target's and renamed exported_*. The client's PromQL finds each Pod's GPUs either way."""
    prometheus_binary()
    memory_bound = (
        (DRAM_ACTIVE, 0.8),
        (PIPE_FP32_ACTIVE, 0.15),
        (PIPE_TENSOR_ACTIVE, 0.0),
        (GR_ENGINE_ACTIVE, 0.97),
    )
    direct = [DcgmGpu(i, f"GPU-{i}", "team-a", "train-0", counters=memory_bound) for i in range(2)]
    renamed = [DcgmGpu(0, "GPU-9", "team-c", "stream-triad-5", counters=memory_bound, hostname="gpu-1")]
    exporters = [
        TestServer(dcgm_exporter_app(lambda: direct)),
        TestServer(dcgm_exporter_app(lambda: renamed)),
    ]
    for exporter in exporters:
        await exporter.start_server()
    operator_labels = (
        ("namespace", "gpu-operator"),
        ("pod", "nvidia-dcgm-exporter-b8t4m"),
        ("container", "nvidia-dcgm-exporter"),
    )
    jobs = [
        ScrapeJob("dcgm-exporter", f"127.0.0.1:{exporters[0].port}"),
        ScrapeJob("dcgm-servicemonitor", f"127.0.0.1:{exporters[1].port}", honor_labels=False, target_labels=operator_labels),
    ]  # fmt: skip
    try:
        async with real_prometheus(jobs, tmp_path) as url:
            client = Prometheus(settings(url))
            try:
                found: dict[str, list[Sample]] = {}
                deadline = asyncio.get_running_loop().time() + 20
                while len(found) < 2 and asyncio.get_running_loop().time() < deadline:
                    for namespace, pod in (("team-a", "train-0"), ("team-c", "stream-triad-5")):
                        end = dt.datetime.now(dt.UTC)
                        samples = await client.pod_samples(namespace=namespace, pod=pod, end=end, seconds=30)
                        # every counter once scraped: its queries, one per counter, may straddle the first scrape
                        seen = pod_telemetry(pod_samples(samples, namespace=namespace, pod=pod,
                                                         labels=settings(url).labels), settings(url).labels)  # fmt: skip
                        if any(s.name == DRAM_ACTIVE for s in samples) and not seen.missing:
                            found[pod] = samples
                    await asyncio.sleep(0.5)
                assert set(found) == {"train-0", "stream-triad-5"}
                renamed_labels = found["stream-triad-5"][0].labels
                assert (
                    renamed_labels["exported_pod"] == "stream-triad-5"
                    and renamed_labels["pod"] == "nvidia-dcgm-exporter-b8t4m"
                )
                labels = settings(url).labels
                for pod, gpus in (("train-0", 2), ("stream-triad-5", 1)):
                    namespace = "team-a" if pod == "train-0" else "team-c"
                    telemetry = pod_telemetry(
                        pod_samples(found[pod], namespace=namespace, pod=pod, labels=labels), labels
                    )
                    assert len(telemetry.gpus) == gpus and telemetry.missing == ()
                    assert telemetry.counters[DRAM_ACTIVE] == pytest.approx(0.8)
                    assert derive(telemetry.counters).bound_type == "memory"
            finally:
                await client.close()
    finally:
        for exporter in exporters:
            await exporter.close()
