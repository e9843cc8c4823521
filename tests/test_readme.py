"""The README and docs/ are part of the product: the README's two opening commands and install steps
run as written, every relative link and alert runbook lands on a page and a heading that exist, and
the reference names every label, annotation, rule, setting, metric and field the code has."""

from __future__ import annotations

import base64
import json
import os
import posixpath
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kratos_admit.domain import vocabulary
from tests.harness import (
    REPO,
    double_in_thread,
    github_anchor,
    kubeconfig_for,
    kubectl,
    markdown_anchors,
    markdown_links,
    render,
)
from tests.kube_double import KubeDouble


def readme() -> str:
    return (REPO / "README.md").read_text()


def section(page: str, heading: str) -> str:
    """One ``## heading`` section of a page, up to the next ``## `` heading."""
    text = (REPO / page).read_text(encoding="utf-8")
    assert f"\n{heading}\n" in text, f"{page} has no section {heading!r}"
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_is_a_front_page():
    """Issue 23: what it is, how to try it, how to install it, and links into docs/ (which hold the rest)."""
    text = readme()
    assert len(text.splitlines()) <= 250
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    wanted = ["## What it does", "## Install on a cluster", "## Documentation"]
    assert [h for h in headings if h in wanted] == wanted, headings
    linked = {target.split("#", 1)[0] for target in markdown_links(REPO / "README.md")}
    pages = {str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")}
    assert pages - linked == set(), "the README links every page of docs/"


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second():
    blocks = re.findall(r"```sh\n(.*?)\n```", readme(), re.S)
    first, second = blocks[0].strip(), blocks[1].strip()
    head = readme().split("```sh", 3)
    assert head[0].strip() == "# KRATOS admission", "nothing but the title before the two commands"
    assert (
        "kratos-admit review -f examples/vector-add-job.yaml --profiles examples/profiles --nodes examples/nodes.yaml"
        in first
    )
    assert second.endswith("python -m pytest")
    assert second in (REPO / ".ci" / "run").read_text(), ".ci/run runs the README's test command verbatim"


def test_every_kubectl_get_with_watch_names_one_resource_type():
    """kubectl refuses -w with more than one resource type; the docs' commands run as written."""
    for line in "\n".join(docs().values()).splitlines():
        command = line.split("#", 1)[0]
        if command.startswith("kubectl") and " get " in command and " -w" in command.split():
            kinds = command.split(" get ", 1)[1].split()[0]
            assert "," not in kinds, line


def test_every_configuration_key_is_documented():
    from kratos_admit.domain.config import Config

    table = section("docs/reference.md", "## Configuration")
    missing = [f.alias for f in Config.model_fields.values() if f.alias and f"`{f.alias}`" not in table]
    assert missing == []


def test_every_validation_rule_is_documented():
    from kratos_admit.domain.fields import RULES

    table = section("docs/reference.md", "## Validation rules")
    assert [rule for rule in RULES if f"| `{rule}` |" not in table] == []


def install_step(number: int) -> list[str]:
    """The commands of one numbered step of the README's install block."""
    text = readme()
    start = text.index(f"# {number}. ")
    end = text.index(f"# {number + 1}. ", start)
    return [line for line in text[start:end].splitlines()[1:] if line.strip()]


def run_offline(line: str, cwd: Path, *, kubeconfig: Path | None = None) -> dict[str, Any] | None:
    """A README command as written, with kubectl kept off the cluster (--dry-run=client), and
    kratos-admit's own cluster calls sent to ``kubeconfig`` (the API double) when it makes any."""
    words = shlex.split(line)
    if words[0] == ".venv/bin/kratos-admit":
        argv = [sys.executable, "-m", "kratos_admit", *words[1:]]
        if "--in-cluster" in words:
            assert kubeconfig is not None, line
            argv += ["--kubeconfig", str(kubeconfig)]
    else:
        assert words[0] == "kubectl", line
        argv = [kubectl(), *words[1:], "--dry-run=client", "-o", "json"]
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, (line, done.stderr)
    return json.loads(done.stdout) if words[0] == "kubectl" else None


def test_the_certificate_step_makes_the_secrets_the_deployments_read(tmp_path: Path):
    """Install step 2 as written, against the API double (kubectl kept client-side): the Secrets it
    creates are the ones the rendered Deployments mount, with every file their configuration names,
    holding what ``certs generate`` wrote; and the CA's, which the controller renews from."""
    kube = KubeDouble()
    with double_in_thread(kube) as url:
        kubeconfig = kubeconfig_for(url, tmp_path / "kubeconfig")
        made = [
            obj for line in install_step(2) if (obj := run_offline(line, tmp_path, kubeconfig=kubeconfig))
        ]
    assert [o["kind"] for o in made] == ["Namespace"]
    secrets = {o["metadata"]["name"]: o for o in kube.items("api/v1", "secrets")}
    assert set(secrets) == {"kratos-webhook-ca", "kratos-webhook-tls", "kratos-signing-key"}
    assert {o["metadata"]["namespace"] for o in secrets.values()} == {made[0]["metadata"]["name"]}
    assert (
        base64.b64decode(secrets["kratos-webhook-ca"]["data"]["ca.key"])
        == (tmp_path / "certs" / "ca.key").read_bytes()
    )
    rendered = render(REPO / "webhook-config")
    [config_map] = [o for o in rendered if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {})]
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    files = [config[key] for key in ("tlsCertFile", "tlsKeyFile", "signingKeyFile")]
    for deployment in [o for o in rendered if o["kind"] == "Deployment"]:
        pod = deployment["spec"]["template"]["spec"]
        secret_volumes = {vol["name"]: vol["secret"] for vol in pod["volumes"] if "secret" in vol}
        assert secret_volumes, deployment["metadata"]["name"]
        for volume in secret_volumes.values():
            assert volume["secretName"] in secrets, f"the README creates no Secret {volume['secretName']}"
        for container in pod["containers"]:
            for mount in container.get("volumeMounts", []):
                volume = secret_volumes.get(mount["name"])
                if volume is None:
                    continue
                data = secrets[volume["secretName"]]["data"]
                wanted = [f for f in files if posixpath.dirname(f) == mount["mountPath"]]
                assert wanted, (deployment["metadata"]["name"], mount)
                for path in wanted:
                    key = posixpath.basename(path)
                    assert key in data, f"{volume['secretName']} has no {key} for {path}"
                    written = (tmp_path / "certs" / key).read_bytes()
                    assert base64.b64decode(data[key]) == written, key


def test_a_lone_clone_collects_everything_and_skips_only_the_outside_data_tests(tmp_path: Path):
    """What `git clone` alone gives, with no ../shared/fixtures beside it: collection never errors and
    the tests of outside data skip with their one-line reason while the project's own data runs."""
    env = {**os.environ, "KRATOS_TEST_OUTSIDE_DATA": str(tmp_path / "absent")}
    pytest_cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    collected = subprocess.run(
        [*pytest_cmd, "--collect-only"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr
    assert re.search(r"^\d+ tests collected in ", collected.stdout, re.M), collected.stdout[-2000:]
    ran = subprocess.run(
        [*pytest_cmd, "-rs", "tests/test_runner_parse.py"],
        cwd=REPO,
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout[-2000:]
    summary = ran.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed, \d+ skipped in .*", summary), summary
    assert f"outside data not found at {tmp_path / 'absent'}: " in ran.stdout


def docs() -> dict[str, str]:
    """What a user reads: the README and every page under docs/ and certs/."""
    pages = [REPO / "README.md", REPO / "certs" / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
    return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in pages}


def test_nothing_in_the_docs_sends_a_reader_outside_the_repository():
    outside = re.compile(r"\.\./shared|shared/(?:DESIGN|STYLE|fixtures)|\bDESIGN\b")
    found = [(page, m.group(0)) for page, text in docs().items() for m in outside.finditer(text)]
    assert found == []
    for page, text in docs().items():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            resolved = ((REPO / page).parent / target).resolve()
            assert resolved.is_relative_to(REPO) and resolved.exists(), (page, target)


def test_every_relative_link_lands_on_a_file_and_a_heading_that_exist():
    """A link in the README or docs/ names a file in the repository, and its ``#anchor`` (GitHub's
    anchor of a heading) exists in that page, or in the same page for a bare ``#anchor``."""
    broken = []
    checked = 0
    for page in docs():
        source = REPO / page
        for target in markdown_links(source):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (source.parent / path).resolve() if path else source
            checked += 1
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                broken.append((page, target, "no such file"))
            elif anchor and resolved.suffix == ".md" and anchor not in markdown_anchors(resolved):
                broken.append((page, target, "no such heading"))
    assert checked > 50, "the link pattern still finds the links"
    assert broken == []


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        pytest.param("Review suites (`kratos-admit test`)", "review-suites-kratos-admit-test", id="code-and-brackets"),
        pytest.param("Calibration: learning the cluster's own GPUs", "calibration-learning-the-clusters-own-gpus", id="punctuation"),
        pytest.param("Who may write KRATOS-only keys", "who-may-write-kratos-only-keys", id="hyphen-kept"),
        pytest.param("KratosCertificateExpiringSoon", "kratoscertificateexpiringsoon", id="alert"),
        pytest.param("The [ranking](ranking.md) model", "the-ranking-model", id="link-text-only"),
        pytest.param("snake_case stays", "snake_case-stays", id="underscore-kept"),
    ],
)  # fmt: skip
def test_anchors_follow_githubs_rule(heading: str, anchor: str):
    assert github_anchor(heading) == anchor


def test_a_repeated_heading_and_a_heading_in_a_code_block_are_anchored_as_github_does(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Steps\n\n```sh\n# 1. not a heading\n```\n\n## Steps\n")
    assert markdown_anchors(page) == {"title", "steps", "steps-1"}


def runbook_urls() -> list[tuple[str, str]]:
    rules = yaml.safe_load((REPO / "webhook-config/components/prometheus/prometheusrule.yaml").read_text())
    return [
        (r["alert"], r["annotations"]["runbook_url"]) for g in rules["spec"]["groups"] for r in g["rules"]
    ]


def test_every_alert_runbook_url_names_a_page_and_a_heading_that_exist():
    urls = runbook_urls()
    assert len(urls) >= 5
    for alert, url in urls:
        path, _, anchor = url.partition("#")
        assert (REPO / path).is_file() and anchor, (alert, url)
        assert anchor in markdown_anchors(REPO / path), (alert, url)


def reference() -> str:
    return docs()["README.md"] + docs()["docs/reference.md"]


VOCABULARY_KEYS = {
    name: value
    for name, value in vars(vocabulary).items()
    if re.fullmatch(r"[A-Z0-9_]+_(LABEL|ANNOTATION|FINALIZER|SCHEDULING_GATE)", name)
    and isinstance(value, str)
}


def test_every_label_annotation_finalizer_and_gate_is_in_the_reference():
    assert len(VOCABULARY_KEYS) >= 20, "the pattern still finds the vocabulary"
    assert {name: key for name, key in VOCABULARY_KEYS.items() if f"`{key}" not in reference()} == {}


def registered_metrics() -> dict[str, str]:
    """Every metric the code registers with prometheus-client, as Prometheus exposes it (name: type)."""
    sources = [*(REPO / "kratos_admit").rglob("*.py"), *(REPO / "profiler-controller").rglob("*.py")]
    found = {}
    for path in sources:
        for kind, name in re.findall(
            r"\b(Counter|Gauge|Histogram|Summary|Info|Enum)\(\s*\"([a-z_:]+)\"", path.read_text()
        ):
            found[name + ("_total" if kind == "Counter" and not name.endswith("_total") else "")] = kind
    return found


def test_every_metric_the_code_registers_is_in_the_reference():
    metrics = registered_metrics()
    assert "kratos_admission_requests_total" in metrics and "kratos_reconcile_errors_total" in metrics
    table = docs()["docs/reference.md"].split("## Metrics", 1)[1]
    assert [name for name in metrics if f"| `{name}` |" not in table] == []


def crd_fields(schema: dict[str, Any], path: str) -> list[str]:
    """Dotted paths of every property under ``schema`` (objects only; array items by their own names)."""
    fields = []
    for name, prop in schema.get("properties", {}).items():
        fields.append(f"{path}.{name}")
        items = prop.get("items", {})
        fields += crd_fields(prop, f"{path}.{name}") + crd_fields(items, f"{path}.{name}")
    return fields


def test_every_workloadprofile_field_is_in_the_reference():
    crd = yaml.safe_load((REPO / "webhook-config" / "crd-workloadprofiles.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    fields = crd_fields(schema["spec"], "spec") + crd_fields(schema["status"], "status")
    section = docs()["docs/reference.md"].split("## WorkloadProfile", 1)[1].split("\n## ", 1)[0]
    assert len(fields) > 20
    # a top-level field is named in full, a nested one by its own name in its parent's row
    missing = [f for f in fields if f"`{f}`" not in section and f"`{f.rsplit('.', 1)[1]}`" not in section]
    assert missing == []


def test_every_event_reason_is_in_the_reference():
    from typing import get_args

    from kratos_controller.events import Reason

    table = (REPO / "docs" / "reference.md").read_text("utf-8").split("## Events", 1)[1].split("\n## ", 1)[0]
    assert [reason for reason in get_args(Reason) if f"| `{reason}` |" not in table] == []
