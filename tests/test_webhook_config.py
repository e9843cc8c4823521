"""webhook-config/ rendered by `kubectl kustomize`, every object checked against the Kubernetes schema."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import Config, load_config
from kratos_admit.simulation.scheduling import KRATOS_NODE_AFFINITY_WEIGHT
from kratos_controller.actions import ContainerEnd, Observed, PublishProfile
from kratos_controller.reconcile import reconcile
from tests.harness import (
    EXAMPLES,
    K8S_VERSION,
    REPO,
    TEST_KEY,
    finish,
    profiling_job,
    readme_overlay,
    render,
    runner_summary,
)
from tests.service_links import for_pod, with_cluster_ips

COMPONENTS = [
    "cert-manager",
    "failure-policy-ignore",
    "scheduler-kai",
    "scheduler-volcano",
    "scheduler-affinity",
    "telemetry",
    "kueue-admission-check",
]
# kinds that are not part of Kubernetes itself, by the component that brings them (their CRDs come
# with cert-manager, and with Kueue; the real-node Kueue tier applies the latter to the real Kueue)
FOREIGN = {
    ("cert-manager.io/v1", "Issuer"): "cert-manager",
    ("cert-manager.io/v1", "Certificate"): "cert-manager",
    ("kueue.x-k8s.io/v1beta1", "AdmissionCheck"): "kueue-admission-check",
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The base, and the base with each component, as a user's overlay would use them."""
    root = tmp_path_factory.mktemp("kustomize")
    shutil.copytree(REPO / "webhook-config", root / "base")
    out = {"base": render(REPO / "webhook-config")}
    for component in COMPONENTS:
        overlay = root / component
        overlay.mkdir()
        (overlay / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources: [../base]\ncomponents: [../base/components/{component}]\n"
        )
        out[component] = render(overlay)
    return out


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, (kind, name, [o["metadata"]["name"] for o in matches])
    return matches[0]


@pytest.mark.parametrize("variant", ["base", *COMPONENTS])
def test_every_rendered_object_validates_strictly(rendered, variant: str):
    for obj in rendered[variant]:
        if (obj["apiVersion"], obj["kind"]) in FOREIGN:
            assert variant == FOREIGN[(obj["apiVersion"], obj["kind"])]
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_base_installs_what_design_lists(rendered):
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in rendered["base"])
    for expected in [
        ("Namespace", "kratos-system"), ("CustomResourceDefinition", "workloadprofiles.gpu.scheduler.io"),
        ("ServiceAccount", "kratos-webhook"), ("ServiceAccount", "kratos-controller"),
        ("Deployment", "kratos-webhook"), ("Deployment", "kratos-controller"), ("Service", "kratos-webhook"),
        ("PodDisruptionBudget", "kratos-webhook"), ("MutatingWebhookConfiguration", "kratos-admit"),
        ("ValidatingWebhookConfiguration", "kratos-admit"),
    ]:  # fmt: skip
        assert expected in kinds


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
def test_webhook_configurations_follow_design(rendered, kind: str):
    [hook] = find(rendered["base"], kind)["webhooks"]
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": v.NAMESPACE_LABEL, "operator": "In", "values": [v.NAMESPACE_LABEL_VALUE]},
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", "kratos-system"],
            },
        ]
    }
    assert hook["objectSelector"] == {"matchExpressions": [{"key": v.WORKLOAD_LABEL, "operator": "Exists"}]}
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None" and hook["timeoutSeconds"] == 5
    assert hook["matchPolicy"] == "Equivalent" and hook["admissionReviewVersions"] == ["v1"]
    assert hook["clientConfig"]["service"] == {
        "name": "kratos-webhook", "namespace": "kratos-system", "port": 443,
        "path": "/mutate" if kind.startswith("Mutating") else "/validate",
    }  # fmt: skip
    resources = {(r["apiGroups"][0], r["resources"][0]): r["operations"] for r in hook["rules"]}
    operations = ["CREATE"] if kind.startswith("Mutating") else ["CREATE", "UPDATE"]
    expected = {("batch", "jobs"): operations, ("", "pods"): operations}
    if kind.startswith("Validating"):  # parents get a warning from the validating webhook only
        expected |= {("batch", "cronjobs"): operations, ("apps", "deployments"): operations}
    assert resources == expected
    if kind.startswith("Mutating"):
        assert hook["reinvocationPolicy"] == "IfNeeded"


def test_failure_policy_is_one_component_away_from_ignore(rendered):
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert find(rendered["failure-policy-ignore"], kind)["webhooks"][0]["failurePolicy"] == "Ignore"


def test_cert_manager_component_injects_the_ca(rendered):
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = find(rendered["cert-manager"], kind)["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from": "kratos-system/kratos-webhook"}
    certificate = find(rendered["cert-manager"], "Certificate")
    assert certificate["spec"]["secretName"] == "kratos-webhook-tls"
    assert certificate["spec"]["dnsNames"][-1] == "kratos-webhook.kratos-system.svc.cluster.local"


# a user's own Service in the KRATOS namespace whose name starts with kratos- (issue 33)
USERS_SERVICE: dict[str, Any] = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kratos-foo"},
                 "spec": {"ports": [{"name": "http", "port": 8080}, {"port": 53, "protocol": "UDP"}]}}  # fmt: skip


def effective_config(objects: list[dict[str, Any]], deployment: str, tmp_path: Path) -> Config:
    """What a Deployment's process reads: the ConfigMap's config.yaml, then its environment as a
    kubelet gives it: the container's own env over the service links of every rendered Service (and a
    user's ``kratos-foo``), as the Pod spec asks for them (tests/service_links.py)."""
    path = tmp_path / f"{deployment}-config.yaml"
    path.write_text(find(objects, "ConfigMap", "kratos-config")["data"]["config.yaml"])
    pod = find(objects, "Deployment", deployment)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    services = [o for o in objects if o["kind"] == "Service"] + [USERS_SERVICE]
    env = for_pod(pod, with_cluster_ips(services))
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return load_config(path, environ=env)


@pytest.mark.parametrize("deployment", ["kratos-webhook", "kratos-controller"])
def test_service_links_never_stop_a_deployment_from_starting(deployment: str, tmp_path: Path):
    """Issue 33: the kubelet gives every container KRATOS_WEBHOOK_SERVICE_HOST, KRATOS_WEBHOOK_PORT,
    KRATOS_WEBHOOK_PORT_443_TCP... for the Service kratos-webhook (and the metrics Services, and any
    Service a user names kratos-...). The Deployments ask for none (enableServiceLinks: false); a
    manifest that leaves that out (a Helm user's own) still starts with the same configuration."""
    shutil.copytree(REPO / "webhook-config", tmp_path / "webhook-config")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "kustomization.yaml").write_text(
        "resources: [../webhook-config]\ncomponents: [../webhook-config/components/prometheus]\n"
    )
    objects = render(tmp_path / "o")
    pod = find(objects, "Deployment", deployment)["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False
    shipped = effective_config(objects, deployment, tmp_path)
    del pod["enableServiceLinks"]  # the kubelet's default is true
    services = with_cluster_ips(o for o in objects if o["kind"] == "Service")
    links = for_pod(
        pod, [*services, USERS_SERVICE | {"spec": {**USERS_SERVICE["spec"], "clusterIP": "fd00::7"}}]
    )
    for name in ("KRATOS_WEBHOOK_SERVICE_HOST", "KRATOS_WEBHOOK_PORT", "KRATOS_WEBHOOK_PORT_443_TCP_ADDR",
                 "KRATOS_WEBHOOK_METRICS_SERVICE_PORT_METRICS", "KRATOS_CONTROLLER_METRICS_PORT_9090_TCP_PROTO",
                 "KRATOS_FOO_PORT_53_UDP", "KRATOS_FOO_SERVICE_PORT_HTTP"):  # fmt: skip
        assert name in links, name
    assert effective_config(objects, deployment, tmp_path) == shipped
    path = tmp_path / "config.yaml"
    path.write_text(find(objects, "ConfigMap", "kratos-config")["data"]["config.yaml"])
    assert load_config(path, environ=links) == shipped


@pytest.mark.parametrize(
    ("component", "scheduler"), [("scheduler-kai", "kai"), ("scheduler-volcano", "volcano")]
)
def test_scheduler_components_set_the_backend(rendered, component: str, scheduler: str, tmp_path: Path):
    for deployment in ("kratos-webhook", "kratos-controller"):
        assert effective_config(rendered[component], deployment, tmp_path).scheduler == scheduler


def test_the_telemetry_component_sets_the_prometheus_url_and_nothing_else(rendered, tmp_path: Path):
    """The controller asks that Prometheus; the webhook only knows it is set (a gang's admission says
    where its profile comes from, or that telemetry is missing) and mounts nothing."""
    for deployment in ("kratos-controller", "kratos-webhook"):
        config = effective_config(rendered["telemetry"], deployment, tmp_path)
        assert config.telemetry.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
        assert config.telemetry.labels == Config().telemetry.labels, "the default label names stay"
        dumped = config.model_dump(by_alias=True, mode="json")
        base = effective_config(rendered["base"], deployment, tmp_path).model_dump(by_alias=True, mode="json")
        assert {k for k in dumped if dumped[k] != base[k]} == {"telemetry"}
    webhook = find(rendered["telemetry"], "Deployment", "kratos-webhook")["spec"]["template"]["spec"]
    assert webhook == find(rendered["base"], "Deployment", "kratos-webhook")["spec"]["template"]["spec"] | {
        "containers": webhook["containers"]
    } and "prometheus-client" not in json.dumps(webhook)
    pod = find(rendered["telemetry"], "Deployment", "kratos-controller")["spec"]["template"]["spec"]
    [volume] = [vol for vol in pod["volumes"] if vol["name"] == "prometheus-client"]
    assert volume["secret"] == {"secretName": "kratos-prometheus-client", "optional": True}
    assert {"name": "prometheus-client", "mountPath": "/etc/kratos/prometheus", "readOnly": True} in pod[
        "containers"
    ][0]["volumeMounts"]


def test_the_dcgm_counters_file_is_dcgm_exporters_csv_with_every_counter_kratos_reads(rendered):
    from kratos_admit.model.telemetry import QUERIED

    configmap = find(rendered["telemetry"], "ConfigMap", "kratos-dcgm-metrics")
    assert configmap["metadata"]["namespace"] == "gpu-operator" and set(configmap["data"]) == {
        "dcgm-metrics.csv"
    }
    fields = {}
    for line in configmap["data"]["dcgm-metrics.csv"].splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, kind, help_text = (part.strip() for part in line.split(",", 2))
        assert (
            re.fullmatch(r"DCGM_FI_[A-Z0-9_]+", name) and kind in ("gauge", "counter", "label") and help_text
        )
        fields[name] = kind
    assert set(QUERIED) <= set(fields) and all(fields[name] == "gauge" for name in QUERIED)


def test_the_scheduler_affinity_component_runs_a_second_scheduler_and_kratos_names_its_profile(
    rendered, tmp_path: Path
):
    """Issue 26, hints that hold: KRATOS sets schedulerName to the profile the component's
    kube-scheduler serves, and that profile weighs NodeAffinity far above the default's 2."""
    objects = rendered["scheduler-affinity"]
    settings = yaml.safe_load(find(objects, "ConfigMap", "kratos-scheduler-config")["data"]["config.yaml"])
    assert (settings["apiVersion"], settings["kind"]) == (
        "kubescheduler.config.k8s.io/v1",
        "KubeSchedulerConfiguration",
    )
    [profile] = settings["profiles"]
    assert "scheduler" in profile["schedulerName"] and profile["schedulerName"] == v.KRATOS_SCHEDULER_NAME
    weights = {p["name"]: p["weight"] for p in profile["plugins"]["score"]["enabled"]}
    assert weights == {"NodeAffinity": KRATOS_NODE_AFFINITY_WEIGHT}
    # a gap of 7 points of normalised affinity outweighs the three weight-1 scores a node can differ by
    assert KRATOS_NODE_AFFINITY_WEIGHT * 7 > 3 * 100
    for deployment in ("kratos-webhook", "kratos-controller"):
        config = effective_config(objects, deployment, tmp_path)
        assert (config.scheduler, config.scheduler_name) == ("default", profile["schedulerName"])
    scheduler = find(objects, "Deployment", "kratos-scheduler")["spec"]["template"]["spec"]
    assert scheduler["serviceAccountName"] == "kratos-scheduler"
    bound = {
        o["roleRef"]["name"]
        for o in objects
        if o["kind"] == "ClusterRoleBinding" and o["metadata"]["name"].startswith("kratos-scheduler")
    }
    assert bound == {"system:kube-scheduler", "system:volume-scheduler"}


def test_the_shipped_config_loads(rendered, tmp_path: Path):
    for variant in ("base", "scheduler-kai", "scheduler-volcano", "telemetry"):
        assert effective_config(rendered[variant], "kratos-webhook", tmp_path).source == "cluster"


@pytest.mark.parametrize("scheduler", ["kai", "volcano"])
def test_base_components_and_the_readme_overlay_compose(tmp_path: Path, scheduler: str):
    """Issue 9: every part's settings survive together. The README's overlay plus cert-manager,
    fail-open and a scheduler: each component's change and the overlay's own setting are all
    there, and so is every key of the base configuration."""
    shutil.copytree(REPO / "webhook-config", tmp_path / "webhook-config")
    overlay = yaml.safe_load(readme_overlay())
    overlay["components"] = [
        f"../webhook-config/components/{c}"
        for c in ("cert-manager", "failure-policy-ignore", f"scheduler-{scheduler}", "telemetry")
    ]
    (tmp_path / "my-kratos").mkdir()
    (tmp_path / "my-kratos" / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    objects = render(tmp_path / "my-kratos")
    base = yaml.safe_load(find(render(REPO / "webhook-config"), "ConfigMap")["data"]["config.yaml"])
    webhook = effective_config(objects, "kratos-webhook", tmp_path)
    controller = effective_config(objects, "kratos-controller", tmp_path)
    # the scheduler and telemetry components, on both Deployments
    assert webhook.scheduler == controller.scheduler == scheduler
    assert controller.telemetry.prometheus_url == webhook.telemetry.prometheus_url is not None
    if scheduler == "kai":
        assert webhook.kai_queue == controller.kai_queue == "default-queue"
    # the overlay's own setting and images
    assert webhook.nsight_compute_image == "registry.example.com/gpu/kratos-nsight-compute-poc:0.1.0"
    images = {
        c["image"]
        for o in objects
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.example.com/gpu/kratos-admit:0.1.0"}
    # every base key the parts did not set is still the base's
    dumped = webhook.model_dump(by_alias=True, mode="json")
    for key, value in base.items():
        if key not in ("scheduler", "nsightComputeImage", "telemetry"):
            assert dumped[key] == value, key
    # the other components
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = find(objects, kind)
        assert (
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            == "kratos-system/kratos-webhook"
        )
        assert {hook["failurePolicy"] for hook in config["webhooks"]} == {"Ignore"}
    assert find(objects, "Certificate")["spec"]["secretName"] == "kratos-webhook-tls"
    pod = find(objects, "Deployment", "kratos-webhook")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == find(objects, "PriorityClass")["metadata"]["name"]
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) not in FOREIGN:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_webhook_pods_shut_down_within_their_grace_period(rendered, tmp_path: Path):
    """Issue 10: the preStop pause, then shutdownGraceSeconds of serving, then the drain bound,
    all inside terminationGracePeriodSeconds, so kubelet never SIGKILLs a draining webhook."""
    from kratos_admit.webhook.server import DRAIN_SECONDS

    pod = find(rendered["base"], "Deployment", "kratos-webhook")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    seconds = float(re.search(r"sleep\((\d+(?:\.\d+)?)\)", " ".join(pause)).group(1))  # type: ignore[union-attr]
    grace = effective_config(rendered["base"], "kratos-webhook", tmp_path).shutdown_grace_seconds
    assert seconds > 0 and seconds + grace + DRAIN_SECONDS < pod["terminationGracePeriodSeconds"]


def test_rbac_grants_no_wildcards_and_never_delete(rendered):
    for obj in rendered["base"]:
        if obj["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in obj["rules"]:
            for field in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule[field], (obj["metadata"]["name"], rule)
            assert "delete" not in rule["verbs"] and "deletecollection" not in rule["verbs"]
    webhook = find(rendered["base"], "ClusterRole", "kratos-webhook")
    assert {v for rule in webhook["rules"] for v in rule["verbs"]} == {"get", "list", "watch"}


@pytest.mark.parametrize("name", ["kratos-webhook", "kratos-controller"])
def test_deployments_are_hardened(rendered, name: str):
    deployment = find(rendered["base"], "Deployment", name)
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    [container] = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    if name == "kratos-webhook":
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert {v["name"]: v for v in pod["volumes"]}["tls"]["secret"]["secretName"] == "kratos-webhook-tls"
        assert find(rendered["base"], "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def crd_schema(rendered) -> dict[str, Any]:
    crd = find(rendered["base"], "CustomResourceDefinition")
    [version] = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert {"Phase", "Bound", "Age"} <= set(columns)
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _structural(schema: dict[str, Any], path: str = "") -> None:
    assert "type" in schema, f"{path or '<root>'} has no type (a structural schema needs one everywhere)"
    for name, sub in schema.get("properties", {}).items():
        _structural(sub, f"{path}.{name}")


def test_crd_schema_is_structural_and_admits_what_kratos_writes(rendered):
    schema = crd_schema(rendered)
    _structural(schema)
    for path in sorted((EXAMPLES / "profiles").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    action = next(
        a
        for a in reconcile(
            Observed(job=finish(profiling_job()), runner=ContainerEnd(0, "Completed", runner_summary())),
            signing_key=TEST_KEY,
        )
        if isinstance(a, PublishProfile)
    )
    published: dict[str, Any] = {"apiVersion": "gpu.scheduler.io/v1alpha1", "kind": "WorkloadProfile",
                 "metadata": {"name": action.name}, "spec": action.spec, "status": action.status.as_status()}  # fmt: skip
    jsonschema.validate(published, schema)
    observed = {
        **published,
        "status": {
            **published["status"],
            "observations": [{"product": "NVIDIA-L40S", "runs": 3, "meanSeconds": "412.5"}],
            "observedRuns": 3,
            "countedRuns": ["a", "b", "c"],
        },
    }
    jsonschema.validate(observed, schema)
    running = next(
        a
        for a in reconcile(Observed(job=profiling_job()), signing_key=TEST_KEY)
        if isinstance(a, PublishProfile)
    )
    jsonschema.validate({**published, "status": running.status.as_status()}, schema)
    bad = {**published, "spec": {"workload": "Bad_Name"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
