from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from kratos_admit.catalog import load_catalog
from kratos_admit.config import Config
from kratos_admit.policy import PolicyContext

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures"
EXAMPLES = REPO / "examples"
K8S_VERSION = "1.32"
TEST_KEY = b"0123456789abcdef0123456789abcdef-test-key"

CATALOG = load_catalog()


def make_ctx(**config: Any) -> PolicyContext:
    return PolicyContext(config=Config.model_validate(config), catalog=CATALOG, signing_key=TEST_KEY)


@pytest.fixture
def ctx() -> PolicyContext:
    return make_ctx()


def assert_valid_kubernetes(obj: dict[str, Any]) -> None:
    """Strict validation against the official Kubernetes OpenAPI schema (kubernetes-validate)."""
    kubernetes_validate.validate(copy.deepcopy(obj), K8S_VERSION, strict=True)


def apply_patch(obj: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = jsonpatch.apply_patch(obj, patch)
    return result


def require_fixtures() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"shared fixtures not found at {FIXTURES}: the repo must sit beside shared/")
    return FIXTURES


@pytest.fixture(autouse=True)
def _log_everything() -> None:
    """Build every log record in tests, so a bad log call fails here and not in production."""
    import logging

    logging.getLogger("kratos").setLevel(logging.DEBUG)
