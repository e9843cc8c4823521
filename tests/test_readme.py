"""The README is part of the product: its two opening commands and its install overlay are checked."""

from __future__ import annotations

import base64
import json
import posixpath
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

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
    from kratos_admit.config import Config

    table = readme().split("## Configuration", 1)[1]
    missing = [f.alias for f in Config.model_fields.values() if f.alias and f"`{f.alias}`" not in table]
    assert missing == []


def test_every_validation_rule_is_documented():
    from kratos_admit.fields import RULES

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
