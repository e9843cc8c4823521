"""The README is part of the product: its two opening commands and its install overlay are checked."""

from __future__ import annotations

import re

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
