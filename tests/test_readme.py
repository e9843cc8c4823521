"""The README is part of the product: its two opening commands and its install overlay are checked."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from kratos_admit.config import load_config
from tests.harness import REPO


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


def test_install_overlay_in_the_readme_renders(tmp_path: Path):
    text = readme()
    overlay = re.search(r"cat > my-kratos/kustomization.yaml <<YAML\n(.*?)\nYAML\n", text, re.S)
    assert overlay, "the install section's overlay"
    shutil.copytree(REPO / "webhook-config", tmp_path / "webhook-config")
    (tmp_path / "my-kratos").mkdir()
    (tmp_path / "my-kratos" / "kustomization.yaml").write_text(
        overlay.group(1).replace("REGISTRY", "registry.example.com/gpu")
    )
    kubectl = shutil.which("kubectl")
    assert kubectl
    out = subprocess.run(
        [kubectl, "kustomize", str(tmp_path / "my-kratos")], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    objects = [d for d in yaml.safe_load_all(out.stdout) if d]
    images = {
        c["image"]
        for o in objects
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.example.com/gpu/kratos-admit:0.1.0"}
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]["config.yaml"]
    (tmp_path / "config.yaml").write_text(config)
    loaded = load_config(tmp_path / "config.yaml", environ={})
    assert loaded.nsight_compute_image == "registry.example.com/gpu/kratos-nsight-compute-poc:0.1.0"
    assert loaded.signing_key_file == Path("/etc/kratos/signing/signing.key")


def test_every_configuration_key_is_documented():
    from kratos_admit.config import Config

    table = readme().split("## Configuration", 1)[1]
    missing = [f.alias for f in Config.model_fields.values() if f.alias and f"`{f.alias}`" not in table]
    assert missing == []


def test_every_validation_rule_is_documented():
    from kratos_admit.fields import RULES

    assert [rule for rule in RULES if f"| `{rule}` |" not in readme()] == []
