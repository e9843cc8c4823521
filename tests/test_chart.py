"""The Helm chart (webhook-config/chart/, issue 32), run by Helm v4's own engine (PyPI helm-python-sdk,
the Go library behind ``helm`` loaded as a shared library; no binary): lint, the schema's refusals,
every rendered object against the Kubernetes schema, and the drift test against the kustomize base.

One source of truth: the chart reads every object's body from the kustomize base's and components'
own files (``chart/files/`` links to them) and changes only what a value chooses, the way a component
or an overlay would. The drift test renders both, for the base and for each component against its
value, and compares the objects; it fails when either side changes alone (shown below by changing
one side in a copy).
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from kratos_admit.cli.main import main
from tests.harness import (
    JOBS,
    K8S_VERSION,
    PODS,
    REPO,
    double_in_thread,
    install_rbac,
    kubeconfig_for,
    profiling_job,
    render,
    runner_pod,
)
from tests.kube_double import MUTATING, RELEASE, VALIDATING, KubeDouble

CHART = REPO / "webhook-config" / "chart"
NAMESPACE = "kratos-system"
# each kustomize component, and the chart value that chooses the same
VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "failure-policy-ignore": {"failurePolicy": "Ignore"},
    "cert-manager": {"certManager": {"enabled": True}},
    "scheduler-kai": {"scheduler": "kai"},
    "scheduler-volcano": {"scheduler": "volcano"},
    "scheduler-affinity": {"scheduler": "affinity"},
    "telemetry": {"telemetry": {"enabled": True}},
    "prometheus": {"monitoring": {"enabled": True}},
    "kueue-admission-check": {"kueue": {"admissionCheck": {"enabled": True}}},
}
# kinds outside Kubernetes itself (cert-manager's, prometheus-operator's, Kueue's): their own CRDs' schemas
FOREIGN_GROUPS = ("cert-manager.io/", "monitoring.coreos.com/", "kueue.x-k8s.io/")
# the labels Helm adds, and part-of, which the chart puts on every object while the base's `labels:`
# transformer does not reach the components' own resources
HELM_LABELS = (
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "helm.sh/chart",
    "app.kubernetes.io/part-of",
)
# what only the chart makes: the Secrets kustomize users create by hand (README step 2)
CHART_ONLY = {
    ("Secret", "kratos-webhook-ca"),
    ("Secret", "kratos-webhook-tls"),
    ("Secret", "kratos-signing-key"),
}
Obj = dict[str, Any]


def chart_objects(values: dict[str, Any], chart: Path = CHART, *, hooks: bool = False) -> list[Obj]:
    """``helm template``: the chart rendered by Helm's engine, as objects (hooks apart)."""
    rendered = helm.Chart.load(str(chart)).render(values, name="kratos", namespace=NAMESPACE, is_install=True)
    texts = [text for path, text in rendered.items() if path.endswith((".yaml", ".yml"))]
    objects = [o for text in texts for o in yaml.safe_load_all(text) if isinstance(o, dict)]
    hooked = [o for o in objects if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]
    return hooked if hooks else [o for o in objects if o not in hooked]


def kustomize_objects(component: str, root: Path) -> list[Obj]:
    """``kubectl kustomize`` of the base with one component, as a user's overlay composes it."""
    overlay = root / f"overlay-{component}"
    overlay.mkdir(exist_ok=True)
    components = "" if component == "base" else f"components: [../webhook-config/components/{component}]\n"
    (overlay / "kustomization.yaml").write_text(f"resources: [../webhook-config]\n{components}")
    return render(overlay)


def normal(obj: Obj) -> Obj:
    """What the drift test compares: kind, name, namespace and body; the labels Helm adds, the pod
    template's config checksum (a rollout on a config change) and the caBundle the chart fills are
    left out; config.yaml is compared as the mapping it holds."""
    o: Obj = yaml.safe_load(yaml.safe_dump(obj))
    labels = o["metadata"].get("labels") or {}
    for key in HELM_LABELS:
        labels.pop(key, None)
    if not labels:
        o["metadata"].pop("labels", None)
    if o["kind"] == "Deployment":
        template = o["spec"]["template"]["metadata"]
        (template.get("annotations") or {}).pop("checksum/config", None)
        if not template.get("annotations"):
            template.pop("annotations", None)
    for hook in o.get("webhooks") or []:
        hook["clientConfig"].pop("caBundle", None)
    if o["kind"] == "ConfigMap" and "config.yaml" in (o.get("data") or {}):
        o["data"]["config.yaml"] = yaml.safe_load(o["data"]["config.yaml"])
    return o


def keyed(objects: Iterable[Obj]) -> dict[tuple[str, str, str], Obj]:
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): normal(o) for o in objects
    }


def drift(component: str, root: Path, chart: Path) -> list[str]:
    """Where the chart with the component's value and kustomize with the component differ."""
    from_chart = keyed(
        o
        for o in chart_objects(VARIANTS[component], chart)
        if (o["kind"], o["metadata"]["name"]) not in CHART_ONLY
    )
    from_kustomize = keyed(o for o in kustomize_objects(component, root) if o["kind"] != "Namespace")
    found = [f"only in the chart: {key}" for key in sorted(from_chart.keys() - from_kustomize.keys())]
    found += [f"only in kustomize: {key}" for key in sorted(from_kustomize.keys() - from_chart.keys())]
    for key in sorted(from_chart.keys() & from_kustomize.keys()):
        if from_chart[key] != from_kustomize[key]:
            found.append(
                f"{key} differs:\n{yaml.safe_dump(from_chart[key])}\n--- kustomize ---\n{yaml.safe_dump(from_kustomize[key])}"
            )
    return found


@pytest.fixture(scope="module")
def copy_of_the_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("install")
    shutil.copytree(REPO / "webhook-config", root / "webhook-config", symlinks=True)
    return root


def test_helms_lint_finds_no_warning_and_no_error():
    report = helm.lint(str(CHART), strict=True, kube_version="v1.28.7")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


@pytest.mark.parametrize("component", list(VARIANTS))
def test_the_chart_and_the_kustomize_base_never_drift(component: str, copy_of_the_install: Path):
    assert drift(component, copy_of_the_install, copy_of_the_install / "webhook-config" / "chart") == []


@pytest.mark.parametrize(
    ("edit", "what"),
    [
        pytest.param(("components/scheduler-kai/kustomization.yaml", "default-queue", "gpu-queue"), "Deployment", id="a-component-alone"),
        pytest.param(("chart/templates/_helpers.tpl", '"KRATOS_SCHEDULER" "value" "kai"', '"KRATOS_SCHEDULER" "value" "kai-scheduler"'), "Deployment", id="the-chart-alone"),
    ],
)  # fmt: skip
def test_the_drift_test_fails_when_one_side_changes_alone(
    tmp_path: Path, edit: tuple[str, str, str], what: str
):
    shutil.copytree(REPO / "webhook-config", tmp_path / "webhook-config", symlinks=True)
    path, old, new = edit
    target = tmp_path / "webhook-config" / path
    assert old in target.read_text()
    target.write_text(target.read_text().replace(old, new))
    found = drift("scheduler-kai", tmp_path, tmp_path / "webhook-config" / "chart")
    assert found and all(what in line for line in found), found


@pytest.mark.parametrize("component", list(VARIANTS))
def test_every_rendered_object_validates_against_the_kubernetes_schema(component: str):
    objects = chart_objects(VARIANTS[component]) + chart_objects(VARIANTS[component], hooks=True)
    assert len(objects) > 15
    for obj in objects:
        if obj["apiVersion"].startswith(FOREIGN_GROUPS):
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"failurePolicy": "Sometimes"}, "/failurePolicy"),
        ({"webhook": {"replicas": -1}}, "/webhook/replicas"),
        ({"scheduler": "yunikorn"}, "/scheduler"),
        ({"replicas": 2}, "'replicas' not allowed"),
        ({"telemetry": {"enabled": True, "prometheusURL": "prometheus:9090"}}, "/telemetry/prometheusURL"),
    ],
)
def test_a_bad_value_is_refused_naming_it(values: dict[str, Any], named: str):
    with pytest.raises(helm.HelmValuesError) as refused:
        helm.Chart.load(str(CHART)).validate_schema(values)
    assert named in str(refused.value)


def secret(objects: list[Obj], name: str) -> dict[str, bytes]:
    [found] = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == name]
    return {key: base64.b64decode(value) for key, value in found["data"].items()}


def test_first_install_makes_a_ten_year_ca_a_one_year_serving_certificate_and_a_signing_key():
    objects = chart_objects({})
    ca = x509.load_pem_x509_certificate(secret(objects, "kratos-webhook-ca")["ca.crt"])
    tls = secret(objects, "kratos-webhook-tls")
    serving = x509.load_pem_x509_certificate(tls["tls.crt"])
    assert tls["ca.crt"] == secret(objects, "kratos-webhook-ca")["ca.crt"]
    for cert, years in ((ca, 10), (serving, 1)):
        key = cert.public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
        days = (cert.not_valid_after_utc - cert.not_valid_before_utc) / dt.timedelta(days=1)
        assert abs(days - 365 * years) <= 3 * years, (years, days)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert set(names) == {"kratos-webhook", "kratos-webhook.kratos-system", "kratos-webhook.kratos-system.svc",
                          "kratos-webhook.kratos-system.svc.cluster.local"}  # fmt: skip
    assert serving.issuer == ca.subject
    assert len(secret(objects, "kratos-signing-key")["signing.key"]) == 64
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        [config] = [o for o in objects if o["kind"] == kind]
        assert {base64.b64decode(h["clientConfig"]["caBundle"]) for h in config["webhooks"]} == {
            secret(objects, "kratos-webhook-ca")["ca.crt"]
        }


def test_with_cert_manager_its_injection_takes_the_place_of_the_charts_certificate():
    objects = chart_objects({"certManager": {"enabled": True}})
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Certificate", "kratos-webhook") in names and ("Secret", "kratos-webhook-tls") not in names
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        [config] = [o for o in objects if o["kind"] == kind]
        assert config["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": "kratos-system/kratos-webhook"
        }
        assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"])


def test_the_uninstall_hook_may_do_exactly_what_it_does(tmp_path: Path):
    """The pre-delete hook's RBAC, stored in the API double beside the install's, and its command run
    under its own ServiceAccount: the webhook configurations go, what KRATOS holds is let go of, and
    the double answers 403 to anything the ClusterRole does not grant, as the API server would."""
    hooks = chart_objects({}, hooks=True)
    assert {o["kind"] for o in hooks} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"}
    [job] = [o for o in hooks if o["kind"] == "Job"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["release", "--all-namespaces", "--delete-webhooks", "kratos-admit"]
    kube = KubeDouble()
    install_rbac(kube)
    install_rbac(kube, [o for o in hooks if o["kind"] in ("ClusterRole", "ClusterRoleBinding")])
    held = profiling_job("sweep-0", "team-a", workload="sweep")
    kube.put(*JOBS, held)
    kube.put(*PODS, runner_pod(held, None))
    for resource in (MUTATING, VALIDATING):
        kube.put(*resource, {"metadata": {"name": "kratos-admit"}, "webhooks": []})
    with double_in_thread(kube) as url:
        out, err = io.StringIO(), io.StringIO()
        config = kubeconfig_for(url, tmp_path / "kubeconfig", RELEASE)
        status = main([*container["args"], "--kubeconfig", str(config)], stdout=out, stderr=err)
        again = main([*container["args"], "--kubeconfig", str(config)], stdout=io.StringIO(), stderr=err)
    assert (status, again, err.getvalue()) == (0, 0, "")
    lines = out.getvalue().splitlines()
    assert lines[:2] == [
        "mutatingwebhookconfiguration/kratos-admit: deleted",
        "validatingwebhookconfiguration/kratos-admit: deleted",
    ]
    assert any(line.startswith("team-a/job.batch/sweep-0: finalizer") for line in lines[2:]), lines
    assert (
        kube.get(*MUTATING, "", "kratos-admit") is None and kube.get(*VALIDATING, "", "kratos-admit") is None
    )
    stored = kube.get(*JOBS, "team-a", "sweep-0")
    assert stored is not None and not stored["metadata"].get("finalizers")
