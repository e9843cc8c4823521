"""webhook-config/components/prometheus: every alert and dashboard query names metrics the code
exports, with their labels; the component validates (Kubernetes and prometheus-operator schemas)
and composes; and the metrics the alerts need behave."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry, Counter, Histogram

from kratos_admit.decisions.record import recorded_ranking_source
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config, split_host_port
from kratos_admit.domain.profile import Observation, WorkloadProfile
from kratos_admit.webhook.certs import generate
from kratos_admit.webhook.metrics import AdmissionMetrics
from kratos_admit.webhook.server import create_app, running_site
from kratos_admit.webhook.tls import ServingCertificate
from kratos_controller.manager import Manager
from kratos_controller.metrics import ControllerMetrics
from tests.builders import make_job, make_pod, make_profile
from tests.harness import (
    HOSTNAME,
    JOBS,
    K8S_VERSION,
    PODS,
    REPO,
    api_server,
    controller_running,
    engine,
    eventually,
    free_port,
    github_anchor,
    make_ctx,
    readme_overlay,
    render,
    review_of,
)
from tests.kube_double import KubeDouble

COMPONENT = REPO / "webhook-config" / "components" / "prometheus"
OTHER_COMPONENTS = ["cert-manager", "failure-policy-ignore", "scheduler-kai"]
# labels Prometheus adds to every series it scrapes through a ServiceMonitor
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}
CRD_SCHEMAS = yaml.safe_load((REPO / "tests" / "data" / "prometheus-operator-crds.yaml").read_text())


def exported() -> dict[str, set[str]]:
    """Every series name the webhook's and the controller's registries export, with its labels.
    Labelled metrics with no sample yet do not show in a scrape, so the names and label names come
    from the collectors themselves (prometheus-client keeps them on the registry)."""
    found: dict[str, set[str]] = {}
    for registry in (AdmissionMetrics().registry, ControllerMetrics().registry):
        for collector, names in registry._collector_to_names.items():
            labels = set(getattr(collector, "_labelnames", ()))
            for name in names:
                if isinstance(collector, Counter | Histogram) and name == collector._name:
                    continue  # the family name: its series are _total / _bucket, _sum, _count
                found[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    return found


def component_objects() -> list[dict[str, Any]]:
    return [d for path in sorted(COMPONENT.glob("*.yaml")) if path.name != "kustomization.yaml"
            for d in yaml.safe_load_all(path.read_text()) if d]  # fmt: skip


def alert_rules() -> list[dict[str, Any]]:
    [rule] = [o for o in component_objects() if o["kind"] == "PrometheusRule"]
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((COMPONENT / "dashboard.json").read_text())
    return loaded


def queries() -> list[Any]:
    """(id, PromQL) of every alert and every dashboard panel target."""
    found = [pytest.param(r["expr"], id=f"alert-{r['alert']}") for r in alert_rules()]
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            found.append(pytest.param(target["expr"], id=f"panel-{panel['title']}-{target['refId']}"))
    return found


def selectors_and_groupings(expr: str) -> tuple[list[Any], list[tuple[list[str], set[str]]]]:
    """The vector selectors of an expression, and each aggregation or vector matching's label list
    with the metric names under it."""
    root = promql_parser.parse(expr)
    selectors: list[Any] = []
    groupings: list[tuple[list[str], Any]] = []

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            selectors.append(node)
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            groupings.append((list(node.modifier.labels), node.expr))
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier and node.modifier.matching:
            groupings.append((list(node.modifier.matching.labels), node))
        return True

    promql_parser.walk(root, visit)
    resolved = []
    for labels, subtree in groupings:
        names: set[str] = set()

        def collect(node: Any, into: set[str] = names) -> bool:
            if isinstance(node, promql_parser.VectorSelector) and node.name:
                into.add(node.name)
            return True

        promql_parser.walk(subtree, collect)
        resolved.append((labels, names))
    return selectors, resolved


@pytest.mark.parametrize("expr", queries())
def test_every_alert_and_panel_query_names_exported_metrics_with_their_labels(expr: str):
    metrics = exported()
    selectors, groupings = selectors_and_groupings(expr)
    assert selectors, "a query that reads no metric"
    for selector in selectors:
        assert selector.name in metrics, f"{selector.name} is not exported by the webhook or the controller"
        for matcher in selector.matchers.matchers:
            assert matcher.name in metrics[selector.name] | TARGET_LABELS, (selector.name, matcher.name)
    for labels, names in groupings:
        known = set().union(*(metrics[n] for n in names)) | TARGET_LABELS
        assert set(labels) <= known, (labels, names)


@pytest.mark.parametrize(
    ("alert", "metric"),
    [
        ("KratosCertificateExpiringSoon", "kratos_tls_certificate_expiry_timestamp_seconds"),
        ("KratosCACertificateExpiringSoon", "kratos_certificate_expiry_timestamp_seconds"),
        ("KratosCertificateRenewalFailing", "kratos_certificate_renewals_total"),
        ("KratosAdmissionErrors", "kratos_admission_requests_total"),
        ("KratosAdmissionSlow", "kratos_admission_duration_seconds_bucket"),
        ("KratosObjectsHeldTooLong", "kratos_held_oldest_age_seconds"),
        ("KratosControllerNoLeader", "kratos_controller_leader"),
        ("KratosTelemetryUnavailable", "kratos_telemetry_queries_total"),
        ("KratosProfilingFailsOnProduct", "kratos_profiling_failures_total"),
    ],
)
def test_each_alert_design_names_has_a_summary_a_description_and_a_runbook_in_the_operations_guide(
    alert: str, metric: str
):
    [rule] = [r for r in alert_rules() if r.get("alert") == alert]
    assert metric in rule["expr"]
    annotations = rule["annotations"]
    assert annotations["summary"] and annotations["description"]
    guide = (REPO / "docs" / "operations.md").read_text()
    alerts = guide.split("## Troubleshooting", 1)[1].split("\n### Alerts\n", 1)[1].split("\n## ", 1)[0]
    alerts = alerts.split("\n### ", 1)[0]
    anchors = {github_anchor(h) for h in re.findall(r"^#### (.+)$", alerts, re.M)}
    assert annotations["runbook_url"] == f"docs/operations.md#{github_anchor(alert)}"
    assert github_anchor(alert) in anchors, (
        f"docs/operations.md Troubleshooting > Alerts has no section {alert}"
    )
    assert rule["labels"]["severity"] in ("warning", "critical")


def test_the_certificate_alert_fires_within_14_days_and_the_latency_alert_over_1_second():
    rules = {r["alert"]: r["expr"] for r in alert_rules()}
    assert "< 14 * 24 * 3600" in rules["KratosCertificateExpiringSoon"]
    assert rules["KratosAdmissionSlow"].startswith("histogram_quantile(0.99,")
    assert rules["KratosAdmissionSlow"].rstrip().endswith("> 1")
    assert "kratos_profiling_deadline_seconds" in rules["KratosObjectsHeldTooLong"]


@pytest.mark.parametrize(
    ("view", "metric"),
    [
        ("admissions by decision", "kratos_admission_requests_total"),
        ("admissions by rule", "kratos_validation_violations_total"),
        ("latency", "kratos_admission_duration_seconds_bucket"),
        ("held objects", "kratos_held_objects"),
        ("profiling runs", "kratos_profiles_published_total"),
        ("ranking sources", "kratos_hints_total"),
    ],
)
def test_the_dashboard_has_a_panel_for_each_view_design_names(view: str, metric: str):
    panels = [p for p in dashboard()["panels"] if p["type"] != "row"]
    assert any(metric in t["expr"] for p in panels for t in p["targets"]), view
    assert len({p["id"] for p in dashboard()["panels"]}) == len(dashboard()["panels"]), "panel ids unique"
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    assert [t["name"] for t in dashboard()["templating"]["list"]] == ["datasource"]


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The README's overlay with this component and the others."""
    root = tmp_path_factory.mktemp("compose")
    shutil.copytree(REPO / "webhook-config", root / "webhook-config")
    overlay = yaml.safe_load(readme_overlay())
    overlay["components"] = [f"../webhook-config/components/{c}" for c in [*OTHER_COMPONENTS, "prometheus"]]
    (root / "my-kratos").mkdir()
    (root / "my-kratos" / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return render(root / "my-kratos")


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_the_component_composes_with_the_base_the_other_components_and_the_readme_overlay(composed):
    base = render(REPO / "webhook-config")
    assert {(o["kind"], o["metadata"]["name"]) for o in base} < {
        (o["kind"], o["metadata"]["name"]) for o in composed
    }
    added = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in composed} - {
        (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in base
    }
    assert {a for a in added if a[0] not in ("Issuer", "Certificate")} == {
        ("Service", "kratos-webhook-metrics", "kratos-system"),
        ("Service", "kratos-controller-metrics", "kratos-system"),
        ("ServiceMonitor", "kratos-webhook", "kratos-system"),
        ("ServiceMonitor", "kratos-controller", "kratos-system"),
        ("PrometheusRule", "kratos-admit", "kratos-system"),
        ("ConfigMap", "kratos-grafana-dashboard", "kratos-system"),
    }
    # the other parts' settings are all still there
    webhook = _one(composed, "Deployment", "kratos-webhook")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in webhook["env"]}
    assert env["KRATOS_SCHEDULER"] == "kai"
    assert env["KRATOS_NSIGHT_COMPUTE_IMAGE"] == "registry.example.com/gpu/kratos-nsight-compute-poc:0.1.0"
    mutating = _one(composed, "MutatingWebhookConfiguration", "kratos-admit")
    assert mutating["webhooks"][0]["failurePolicy"] == "Ignore"
    assert "cert-manager.io/inject-ca-from" in mutating["metadata"]["annotations"]


def test_the_rendered_component_validates_against_kubernetes_and_the_prometheus_operator_crds(composed):
    kinds = set()
    for obj in composed:
        kinds.add(obj["kind"])
        if obj["apiVersion"] == "monitoring.coreos.com/v1":
            jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
        elif obj["apiVersion"].startswith("cert-manager.io/"):
            continue
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds


@pytest.mark.parametrize(
    ("obj", "error"),
    [
        ({"kind": "ServiceMonitor", "spec": {"selector": {}, "endpoints": [{"prot": "metrics"}]}}, "prot"),
        ({"kind": "ServiceMonitor", "spec": {"endpoints": [{"port": "metrics"}]}}, "selector"),
        ({"kind": "PrometheusRule", "spec": {"groups": [{"name": "g", "rules": [{"alert": "A"}]}]}}, "expr"),
        (
            {
                "kind": "PrometheusRule",
                "spec": {"groups": [{"name": "g", "rules": [{"expr": "1", "for": "5 min"}]}]},
            },
            "5 min",
        ),
    ],
    ids=["misspelt-endpoint-field", "no-selector", "rule-without-expr", "bad-duration"],
)
def test_the_crd_schemas_reject_what_the_api_server_would(obj: dict[str, Any], error: str):
    full = {"apiVersion": "monitoring.coreos.com/v1", "metadata": {"name": "x"}, **obj}
    with pytest.raises(jsonschema.ValidationError, match=re.escape(error)):
        jsonschema.validate(full, CRD_SCHEMAS[obj["kind"]])


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == val for k, val in selector.items())


@pytest.mark.parametrize("deployment", ["kratos-webhook", "kratos-controller"])
def test_each_deployment_has_a_metrics_service_and_a_servicemonitor_on_its_metrics_port(
    composed, deployment: str
):
    pod = _one(composed, "Deployment", deployment)["spec"]["template"]
    [container] = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config_map = _one(composed, "ConfigMap", "kratos-config")
    config = Config.model_validate(yaml.safe_load(config_map["data"]["config.yaml"]))
    listen = config.metrics_listen if deployment == "kratos-webhook" else config.controller_metrics_listen
    assert listen is not None and split_host_port(listen)[1] == ports["metrics"]
    service = _one(composed, "Service", f"{deployment}-metrics")
    assert _labels_match(service["spec"]["selector"], pod["metadata"]["labels"])
    [port] = service["spec"]["ports"]
    assert port["targetPort"] == "metrics"
    monitor = _one(composed, "ServiceMonitor", deployment)
    assert _labels_match(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    others = [o for o in composed if o["kind"] == "Service" and o is not service]
    assert not any(_labels_match(monitor["spec"]["selector"]["matchLabels"], o["metadata"].get("labels", {}))
                   for o in others), "each ServiceMonitor selects its own Service only"  # fmt: skip
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [port["name"]]


def test_the_dashboard_ships_in_a_configmap_with_the_label_grafanas_sidecar_reads(composed):
    config_map = _one(composed, "ConfigMap", "kratos-grafana-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    [(name, text)] = config_map["data"].items()
    assert name.endswith(".json") and json.loads(text) == dashboard()


# --- the metrics the alerts and the dashboard need ---------------------------------------------


NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def _object(created: str, *, annotations: dict[str, str] | None = None, finalizers: list[str] | None = None):
    meta: dict[str, Any] = {"name": "x", "namespace": "team-a", "creationTimestamp": created}
    if annotations:
        meta["annotations"] = annotations
    if finalizers:
        meta["finalizers"] = finalizers
    return {"metadata": meta}


@pytest.mark.parametrize(
    ("objects", "held", "oldest"),
    [
        ([], 0, 0.0),
        ([_object("2026-01-01T11:00:00Z")], 0, 0.0),
        ([_object("2026-01-01T11:00:00Z", annotations={v.AWAITING_PROFILE_ANNOTATION: "w-profile"})], 1, 3600.0),
        ([_object("2026-01-01T10:00:00Z", finalizers=[v.RELEASE_FINALIZER]),
          _object("2026-01-01T11:30:00Z", annotations={v.AWAITING_PROFILE_ANNOTATION: "w-profile"}),
          _object("2026-01-01T09:00:00Z", finalizers=["other.example/keep"])], 2, 7200.0),
        ([_object("not a time", finalizers=[v.RELEASE_FINALIZER])], 0, 0.0),
    ],
    ids=["nothing", "not-held", "a-follower", "a-profiling-job-and-a-follower", "no-timestamp"],
)  # fmt: skip
def test_held_objects_and_the_oldest_ones_age_are_read_from_the_caches_at_each_scrape(
    objects: list[dict[str, Any]], held: int, oldest: float
):
    metrics = ControllerMetrics()
    metrics.watch_held(lambda: objects, clock=lambda: NOW)
    assert metrics.registry.get_sample_value("kratos_held_objects") == held
    assert metrics.registry.get_sample_value("kratos_held_oldest_age_seconds") == oldest


def _observed(profile: WorkloadProfile, *runs: tuple[str, int, float]) -> WorkloadProfile:
    assert profile.status is not None
    found = [Observation(product=p, runs=n, meanSeconds=str(t)) for p, n, t in runs]
    return profile.model_copy(update={"status": profile.status.model_copy(update={"observations": found})})


async def test_hinted_admissions_are_counted_by_ranking_source(tmp_path: Path):
    generate(service="kratos-webhook", namespace="kratos-system", out=tmp_path)
    observed = _observed(make_profile("seen"), ("NVIDIA-A100-SXM4-80GB", 3, 400.0), ("NVIDIA-L40S", 3, 10.0))
    metrics = AdmissionMetrics()
    app = create_app(engine(make_ctx(), [make_profile(), observed]), metrics=metrics, max_body_bytes=1 << 20)
    certificate = ServingCertificate(tmp_path / "tls.crt", tmp_path / "tls.key")
    reviews = [  # (object, ranking source counted)
        (make_job().obj(), "model"),
        (make_job("seen-1").label(v.WORKLOAD_LABEL, "seen").obj(), "observed"),
        (make_pod("stranger").label(v.WORKLOAD_LABEL, "stranger").obj(), "none"),
        (make_job("denied").limits({v.GPU_RESOURCE: "1.5"}).obj(), None),
    ]
    port = free_port()
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    async with (
        running_site(app, "127.0.0.1", port, certificate=certificate),
        aiohttp.ClientSession() as session,
    ):
        for i, (obj, _) in enumerate(reviews):
            async with session.post(
                f"https://127.0.0.1:{port}/mutate", json=review_of(obj, uid=f"u{i}"), ssl=context,
                server_hostname=HOSTNAME,
            ) as r:  # fmt: skip
                assert r.status == 200
    for source in ("model", "observed", "none"):
        expected = sum(1 for _, s in reviews if s == source)
        assert metrics.registry.get_sample_value("kratos_hints_total", {"source": source}) == expected, source


@pytest.mark.parametrize(
    ("record", "source"),
    [
        (
            {"ranked": [{"product": "NVIDIA-L40S", "source": "observed"}, {"product": "NVIDIA-L4"}]},
            "observed",
        ),
        ({"ranked": [{"product": "NVIDIA-L4"}, {"product": "NVIDIA-L40S", "source": "observed"}]}, "model"),
        ({"ranked": [], "reason": "WorkloadProfile w-profile is Failed"}, "none"),
        ("not json", "none"),
        (None, "none"),
    ],
    ids=["observed-first", "model-first", "base-hints", "unreadable", "no-record"],
)
def test_a_released_followers_ranking_source_is_read_from_its_hints_record(record: Any, source: str):
    annotations = {} if record is None else {
        v.HINTS_ANNOTATION: record if isinstance(record, str) else json.dumps(record)
    }  # fmt: skip
    assert recorded_ranking_source({"metadata": {"annotations": annotations}}) == source


async def test_the_controller_exports_the_profiling_deadline_it_runs_with():
    metrics = ControllerMetrics(CollectorRegistry())
    api = client.ApiClient()
    try:
        Manager(
            api, signing_key=b"k" * 32, metrics=metrics,
            config=Config.model_validate({"profilingDeadlineSeconds": 1800}),
        )  # fmt: skip
    finally:
        await api.close()
    assert metrics.registry.get_sample_value("kratos_profiling_deadline_seconds") == 1800
    assert metrics.registry.get_sample_value("kratos_controller_leader") == 0


async def test_the_controllers_cached_objects_are_counted_once_its_informers_have_synced():
    """kratos_cached_objects{kind}: NaN until the informer's first list is read to its end (pages of
    2 here), then the opted-in Jobs and Pods its cache holds; what is not opted in is never listed."""
    kube = KubeDouble()
    for i in range(5):
        kube.put(*JOBS, make_job(f"train-{i}", "team-a").label(v.WORKLOAD_LABEL, "train").obj())
    kube.put(*JOBS, make_job("not-ours", "team-a").unlabelled().obj())
    kube.put(*PODS, make_pod("train-0-abcde", "team-a").label(v.WORKLOAD_LABEL, "train").obj())
    async with api_server(kube) as server, controller_running(server) as running:
        samples = running.metrics.registry.get_sample_value
        assert samples("kratos_cached_objects", {"kind": "Job"}) != samples(
            "kratos_cached_objects", {"kind": "Job"}
        )
        running.informer.page_size = 2
        await eventually(lambda: running.informer.synced.is_set() and running.pod_informer.synced.is_set())
        assert samples("kratos_cached_objects", {"kind": "Job"}) == 5
        assert samples("kratos_cached_objects", {"kind": "Pod"}) == 1
        kube.remove(*JOBS, "team-a", "train-4")
        await eventually(lambda: samples("kratos_cached_objects", {"kind": "Job"}) == 4)
    pages = [r.query for r in kube.requests if r.path == "/apis/batch/v1/jobs" and "watch" not in r.query]
    assert [q.get("limit") for q in pages] == ["2", "2", "2"]
