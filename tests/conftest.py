from __future__ import annotations

from pathlib import Path

import pytest

from kratos_admit.decisions.policy import PolicyContext
from tests.harness import build_onefile_runner, make_ctx


@pytest.fixture
def ctx() -> PolicyContext:
    return make_ctx()


@pytest.fixture(autouse=True)
def _log_everything() -> None:
    """Build every log record in tests, so a bad log call fails here and not in production."""
    import logging

    logging.getLogger("kratos").setLevel(logging.DEBUG)


@pytest.fixture(scope="session")
def onefile_runner(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-file runner, built once for the session (a PyInstaller build takes seconds)."""
    return build_onefile_runner(tmp_path_factory.mktemp("onefile"))
