"""The layering of docs/architecture.md, checked: imports point one way and the version lives once."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import kratos_admit
from tests.harness import REPO

PURE = [
    "kratos_admit.policy",
    "kratos_admit.validation",
    "kratos_admit.hints",
    "kratos_admit.ranking",
    "kratos_admit.profiling",
    "kratos_admit.workload",
    "kratos_admit.catalog",
    "kratos_admit.profile",
    "kratos_admit.request",
    "kratos_admit.responses",
    "kratos_admit.admission",
    "kratos_admit.review",
    "kratos_admit.calibration",
    "kratos_admit.scheduling",
    "kratos_admit.simulation",
    "kratos_admit.telemetry",
    "kratos_controller.reconcile",
]
PACKAGES = {
    "kratos_admit": REPO / "kratos_admit",
    "kratos_controller": REPO / "profiler-controller" / "kratos_controller",
}


def loaded_after_importing(modules: list[str]) -> set[str]:
    """The modules a fresh interpreter holds after importing ``modules`` (transitive imports too)."""
    code = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\nprint('\\n'.join(sys.modules))"
    env_path = f"{REPO / 'runner'}:{REPO / 'profiler-controller'}:{REPO}"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONPATH": env_path}
    )
    return set(out.stdout.split())


@pytest.mark.parametrize("framework", ["aiohttp", "kubernetes_asyncio"])
def test_pure_modules_import_neither_aiohttp_nor_kubernetes_asyncio(framework):
    loaded = loaded_after_importing(PURE)
    assert framework not in loaded, f"a pure module pulls in {framework}"


def test_the_controller_does_not_import_the_webhook_server():
    loaded = loaded_after_importing(["kratos_controller.main", "kratos_controller.controller"])
    assert "kratos_admit.server" not in loaded


def test_the_webhook_commands_do_not_import_the_controller():
    loaded = loaded_after_importing(["kratos_admit.cli", "kratos_admit.server"])
    assert not {m for m in loaded if m.startswith("kratos_controller")}


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for package, directory in PACKAGES.items():
        for path in sorted(directory.glob("*.py")):
            name = f"{package}.{path.stem}"
            graph[name] = set()
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                    graph[name] |= {t for t in targets if t.split(".")[0] in PACKAGES}
    return {m: {t for t in deps if t in graph} for m, deps in graph.items()}


def test_no_module_imports_itself_through_others():
    graph = import_graph()
    cycles = []
    for start in graph:
        seen: set[str] = set()
        stack = list(graph[start])
        while stack:
            module = stack.pop()
            if module == start:
                cycles.append(start)
                break
            if module not in seen:
                seen.add(module)
                stack.extend(graph[module])
    assert cycles == []


def test_every_module_is_named_in_the_architecture_doc():
    doc = (REPO / "docs" / "architecture.md").read_text("utf-8")
    modules = [p.name for d in PACKAGES.values() for p in d.glob("*.py") if not p.name.startswith("__")]
    modules += [
        p.name for p in (REPO / "runner" / "kratos_runner").glob("*.py") if not p.name.startswith("__")
    ]
    assert [m for m in modules if f"`{m}`" not in doc] == []


def test_the_version_is_written_once_and_the_image_tag_follows_it():
    pyproject = (REPO / "pyproject.toml").read_text("utf-8")
    assert 'dynamic = ["version"]' in pyproject and 'attr = "kratos_admit.__version__"' in pyproject
    kustomization = yaml.safe_load((REPO / "webhook-config" / "kustomization.yaml").read_text("utf-8"))
    tags = {image["newTag"] for image in kustomization["images"]}
    assert tags == {kratos_admit.__version__}
    assert Path(kratos_admit.__file__).read_text("utf-8").count("__version__ =") == 1


SHARED_TEST_HELPERS = {"tests.builders", "tests.harness", "tests.kube_double", "tests.pod_security"}


@pytest.mark.parametrize("module", sorted((REPO / "tests").glob("*.py")), ids=lambda p: p.name)
def test_tests_share_helpers_only_through_the_helper_modules(module: Path):
    """Issue 8: a test module imports builders, the harness, the double and the Pod Security checker,
    never another test module or conftest (which holds fixtures only)."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests")
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("tests")
    }
    assert imported <= SHARED_TEST_HELPERS, f"{module.name} imports {sorted(imported - SHARED_TEST_HELPERS)}"
