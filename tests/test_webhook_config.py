"""webhook-config/ rendered by `kubectl kustomize`, every object checked against the Kubernetes schema."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kratos_admit import vocabulary as v
from kratos_controller.reconcile import ContainerEnd, Observed, PublishProfile, reconcile
from tests.harness import EXAMPLES, K8S_VERSION, REPO, TEST_KEY, finish, profiling_job, runner_summary

COMPONENTS = ["cert-manager", "failure-policy-ignore", "scheduler-kai", "scheduler-volcano"]
# kinds that are not part of Kubernetes itself (their CRDs come with cert-manager)
FOREIGN = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is needed to render webhook-config/ (kubectl kustomize)")
    return found


def render(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


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
            assert variant == "cert-manager"
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


@pytest.mark.parametrize(
    ("component", "scheduler"), [("scheduler-kai", "kai"), ("scheduler-volcano", "volcano")]
)
def test_scheduler_components_set_the_backend(rendered, component: str, scheduler: str):
    config = yaml.safe_load(find(rendered[component], "ConfigMap", "kratos-config")["data"]["config.yaml"])
    assert config["scheduler"] == scheduler


def test_the_shipped_config_loads(rendered, tmp_path: Path):
    from kratos_admit.config import load_config

    for variant in ("base", "scheduler-kai", "scheduler-volcano"):
        path = tmp_path / f"{variant}.yaml"
        path.write_text(find(rendered[variant], "ConfigMap", "kratos-config")["data"]["config.yaml"])
        assert load_config(path, environ={}).source == "cluster"


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
