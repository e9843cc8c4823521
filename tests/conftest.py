from __future__ import annotations

import pytest

from kratos_admit.decisions.policy import PolicyContext
from tests.harness import make_ctx


@pytest.fixture
def ctx() -> PolicyContext:
    return make_ctx()


@pytest.fixture(autouse=True)
def _log_everything() -> None:
    """Build every log record in tests, so a bad log call fails here and not in production."""
    import logging

    logging.getLogger("kratos").setLevel(logging.DEBUG)
