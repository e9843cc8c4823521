"""The linter and the type checker, from the project's own pyproject configuration, as part of the suite."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness import REPO


@pytest.mark.parametrize(
    "command",
    [
        pytest.param([sys.executable, "-m", "ruff", "check", "."], id="ruff-check"),
        pytest.param([sys.executable, "-m", "ruff", "format", "--check", "."], id="ruff-format"),
        pytest.param([sys.executable, "-m", "mypy"], id="mypy-strict"),
    ],
)
def test_code_quality(command: list[str]):
    result = subprocess.run(command, check=False, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
