"""The README and docs/ are part of the product: the README's two opening commands and install steps
run as written, and the reference names every label, annotation, metric and field the code has."""

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

import yaml

from kratos_admit.domain import vocabulary
from tests.harness import REPO, kubectl, render


def readme() -> str:
    return (REPO / "README.md").read_text()


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
    """kubectl refuses -w with more than one resource type; the README's commands run as written."""
    for line in readme().splitlines():
        command = line.split("#", 1)[0]
        if command.startswith("kubectl") and " get " in command and " -w" in command.split():
            kinds = command.split(" get ", 1)[1].split()[0]
            assert "," not in kinds, line


def test_every_configuration_key_is_documented():
    from kratos_admit.domain.config import Config

    table = readme().split("## Configuration", 1)[1]
    missing = [f.alias for f in Config.model_fields.values() if f.alias and f"`{f.alias}`" not in table]
    assert missing == []


def test_every_validation_rule_is_documented():
    from kratos_admit.domain.fields import RULES

    assert [rule for rule in RULES if f"| `{rule}` |" not in readme()] == []


def install_step(number: int) -> list[str]:
    """The commands of one numbered step of the README's install block."""
    text = readme()
    start = text.index(f"# {number}. ")
    end = text.index(f"# {number + 1}. ", start)
    return [line for line in text[start:end].splitlines()[1:] if line.strip()]


def run_offline(line: str, cwd: Path) -> dict[str, Any] | None:
    """A README command as written, with kubectl kept off the cluster (--dry-run=client)."""
    words = shlex.split(line)
    if words[0] == ".venv/bin/kratos-admit":
        argv = [sys.executable, "-m", "kratos_admit", *words[1:]]
    else:
        assert words[0] == "kubectl", line
        argv = [kubectl(), *words[1:], "--dry-run=client", "-o", "json"]
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, (line, done.stderr)
    return json.loads(done.stdout) if words[0] == "kubectl" else None


def test_the_certificate_step_makes_the_secrets_the_deployments_read(tmp_path: Path):
    """Install step 2 as written (kubectl client-side only): the Secrets it creates are the ones
    the rendered Deployments mount, with every file their configuration names, holding what
    ``certs generate`` wrote."""
    made = [obj for line in install_step(2) if (obj := run_offline(line, tmp_path))]
    assert [o["kind"] for o in made] == ["Namespace", "Secret", "Secret"]
    secrets = {o["metadata"]["name"]: o for o in made if o["kind"] == "Secret"}
    assert {o["metadata"]["namespace"] for o in secrets.values()} == {made[0]["metadata"]["name"]}
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
