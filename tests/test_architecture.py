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

# The layers of docs/architecture.md, bottom up: each folder of kratos_admit/ and the folders it may
# import. A module outside these folders, or an import that points up or sideways, fails the tests.
LAYERS: dict[str, set[str]] = {
    "domain": set(),
    "model": {"domain"},
    "decisions": {"domain", "model"},
    "admission": {"domain", "model", "decisions"},
    "edge": {"domain", "model", "decisions"},
    "webhook": {"domain", "model", "decisions", "admission", "edge"},
    "simulation": {"domain", "model", "decisions", "admission", "edge"},
    "cli": {"domain", "model", "decisions", "admission", "edge", "webhook", "simulation"},
}
# the profiler controller sits beside the webhook: it shares the domain, the GPU model, the decisions
# and the edge
CONTROLLER_MAY_IMPORT = {"domain", "model", "decisions", "edge"}
# layers that do no I/O: neither the HTTP server nor the Kubernetes client may load with them
PURE_LAYERS = ("domain", "model", "decisions", "admission")
PURE_CONTROLLER = ["kratos_controller.reconcile", "kratos_controller.events", "kratos_controller.faults"]
PACKAGE = REPO / "kratos_admit"
CONTROLLER = REPO / "profiler-controller" / "kratos_controller"
MAX_TOP_LEVEL_ENTRIES = 11  # the eight layer folders, __init__.py, __main__.py and py.typed
MAX_MODULES_PER_FOLDER = 12
MAX_MODULE_LINES = 500
# modules allowed past MAX_MODULE_LINES, each with the reason it stays whole
WHOLE: dict[str, str] = {
    "kratos_admit/model/calibration_fit.py": "one alternating fit (issue 43 made it per unit): each pass"
    " fits the products' factors from the workloads' last shares, then the shares from those factors, over"
    " the same private per-sample terms; split, that state would have to become an interface of its own",
}
# the controllers the manager runs (docs/architecture.md): each a class in a module of its own, which
# shares the manager's informers and runtime but never imports another controller (the manager wires
# what one tells another)
CONTROLLERS = ["profiling", "release", "observation", "telemetry", "calibration"]


def module_name(path: Path, root: Path, package: str) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join((package, *(p for p in parts if p != "__init__")))


def layer_of(module: str) -> str | None:
    """The layer folder of a kratos_admit module, or None for the package's own __init__/__main__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def imported_modules(path: Path) -> set[str]:
    """Every absolute import a module makes, with ``from X import name`` also counted as X.name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def package_modules() -> dict[str, Path]:
    return {
        module_name(p, PACKAGE, "kratos_admit"): p
        for p in sorted(PACKAGE.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def layer_violations(modules: dict[str, Path]) -> list[str]:
    """Each import of a kratos_admit module that its layer may not make, as 'module -> target'."""
    problems = []
    for name, path in modules.items():
        layer = layer_of(name)
        if layer is None:
            continue
        allowed = LAYERS[layer] | {layer}
        for target in sorted(imported_modules(path)):
            if not target.startswith("kratos_admit."):
                continue
            target_layer = target.split(".")[1]
            if target_layer in LAYERS and target_layer not in allowed:
                problems.append(f"{name} ({layer}) -> {target} ({target_layer})")
            if target.startswith("kratos_controller"):
                problems.append(f"{name} -> {target}")
    return problems


def test_every_module_lives_in_a_layer_folder():
    strays = [
        name
        for name, path in package_modules().items()
        if layer_of(name) is None and path.name not in ("__init__.py", "__main__.py")
    ]
    assert strays == [], "a module outside the layer folders; put it in the folder of its layer"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYERS), "a folder that is not a layer of docs/architecture.md"


def test_imports_point_down_the_layers():
    assert layer_violations(package_modules()) == []


def test_an_upward_import_is_caught(tmp_path: Path):
    """The check itself can fail: a domain module that imports a decision is named."""
    planted = tmp_path / "planted.py"
    planted.write_text("from kratos_admit.decisions.hints import apply_hints\n", "utf-8")
    assert layer_violations({"kratos_admit.domain.planted": planted}) == [
        "kratos_admit.domain.planted (domain) -> kratos_admit.decisions.hints (decisions)",
        "kratos_admit.domain.planted (domain) -> kratos_admit.decisions.hints.apply_hints (decisions)",
    ]


def test_the_controller_imports_only_the_domain_the_decisions_and_the_edge():
    bad = []
    for path in sorted(CONTROLLER.glob("*.py")):
        for target in imported_modules(path):
            if target.startswith("kratos_admit.") and target.split(".")[1] not in CONTROLLER_MAY_IMPORT:
                bad.append(f"{path.name} -> {target}")
    assert bad == []


def every_folder_each_package_dir() -> list[Path]:
    return [PACKAGE / layer for layer in LAYERS]


def test_each_layer_folder_says_what_lives_there_and_what_it_may_import():
    for folder in every_folder_each_package_dir():
        init = folder / "__init__.py"
        tree = ast.parse(init.read_text("utf-8"))
        doc = ast.get_docstring(tree)
        assert doc and "import" in doc, f"{init}: a one-line docstring naming what it may import"
        assert len(tree.body) == 1, f"{init} re-exports nothing: every import names its layer"


def loaded_after_importing(modules: list[str]) -> set[str]:
    """The modules a fresh interpreter holds after importing ``modules`` (transitive imports too)."""
    code = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\nprint('\\n'.join(sys.modules))"
    env_path = f"{REPO / 'runner'}:{REPO / 'profiler-controller'}:{REPO}"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONPATH": env_path}
    )
    return set(out.stdout.split())


@pytest.mark.parametrize("framework", ["aiohttp", "kubernetes_asyncio"])
def test_pure_layers_load_neither_aiohttp_nor_kubernetes_asyncio(framework):
    pure = [name for name in package_modules() if layer_of(name) in PURE_LAYERS] + PURE_CONTROLLER
    loaded = loaded_after_importing(pure)
    assert framework not in loaded, f"a pure module pulls in {framework}"


def test_the_controller_does_not_import_the_webhook_server():
    loaded = loaded_after_importing(["kratos_controller.main", "kratos_controller.manager"])
    assert not {m for m in loaded if m.startswith("kratos_admit.webhook")}


def test_each_controller_is_a_class_of_its_own_module_that_imports_no_other_controller():
    for name in CONTROLLERS:
        path = CONTROLLER / f"{name}.py"
        classes = [n.name for n in ast.parse(path.read_text("utf-8")).body if isinstance(n, ast.ClassDef)]
        assert classes == [f"{name.capitalize()}Controller"], f"{path.name} holds {classes}"
        others = {f"kratos_controller.{other}" for other in CONTROLLERS if other != name}
        assert not imported_modules(path) & others, f"{path.name} imports another controller"
    assert not imported_modules(CONTROLLER / "runtime.py") & {
        f"kratos_controller.{name}" for name in [*CONTROLLERS, "manager"]
    }, "the runtime the controllers share imports none of them"


def test_the_webhook_commands_do_not_import_the_controller():
    loaded = loaded_after_importing(["kratos_admit.cli.main", "kratos_admit.webhook.server"])
    assert not {m for m in loaded if m.startswith("kratos_controller")}


def test_the_webhook_commands_do_not_load_numpy():
    """Only the calibration's fit reads numpy arrays (the controller and ``simulate``): the webhook,
    which only reads the fit's result, keeps its resident set and its start without it (issue 59)."""
    loaded = loaded_after_importing(
        ["kratos_admit.cli.main", "kratos_admit.webhook.server", "kratos_admit.edge.cluster"]
    )
    assert "numpy" not in loaded and "kratos_admit.model.calibration_fit" not in loaded


def tracked(path: Path) -> list[str]:
    """The entries git tracks directly under ``path`` (a clean checkout's ``ls``)."""
    out = subprocess.run(
        ["git", "ls-files", "--", str(path.relative_to(REPO))],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0 or not out.stdout:
        return sorted(p.name for p in path.iterdir() if p.name != "__pycache__")
    prefix = len(path.relative_to(REPO).parts)
    return sorted({Path(line).parts[prefix] for line in out.stdout.splitlines()})


def test_the_package_tree_stays_small_enough_to_read():
    assert len(tracked(PACKAGE)) <= MAX_TOP_LEVEL_ENTRIES, tracked(PACKAGE)
    for folder in every_folder_each_package_dir():
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= MAX_MODULES_PER_FOLDER, f"{folder.name}/ holds {len(modules)} modules"
    long = {
        str(p.relative_to(REPO)): n
        for p in [*PACKAGE.rglob("*.py"), *CONTROLLER.glob("*.py")]
        if (n := len(p.read_text("utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert {k: n for k, n in long.items() if k not in WHOLE} == {}


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    sources = {**package_modules(), **{f"kratos_controller.{p.stem}": p for p in CONTROLLER.glob("*.py")}}
    for name, path in sources.items():
        graph[name] = {
            t for t in imported_modules(path) if t.split(".")[0] in ("kratos_admit", "kratos_controller")
        }
    return {m: {t for t in deps if t in graph and t != m} for m, deps in graph.items()}


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
    """Package modules by their path in kratos_admit/ (the folder tells the layer); the controller's and
    the runner's by name."""
    doc = (REPO / "docs" / "architecture.md").read_text("utf-8")
    modules = [
        p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if not p.name.startswith("__")
    ]
    modules += [p.name for p in CONTROLLER.glob("*.py") if not p.name.startswith("__")]
    modules += [
        p.name for p in (REPO / "runner" / "kratos_runner").glob("*.py") if not p.name.startswith("__")
    ]
    assert [m for m in modules if f"`{m}`" not in doc] == []
    assert [layer for layer in LAYERS if f"`{layer}/`" not in doc] == []


def test_the_version_is_written_once_and_the_image_tag_follows_it():
    pyproject = (REPO / "pyproject.toml").read_text("utf-8")
    assert 'dynamic = ["version"]' in pyproject and 'attr = "kratos_admit.__version__"' in pyproject
    kustomization = yaml.safe_load((REPO / "webhook-config" / "kustomization.yaml").read_text("utf-8"))
    tags = {image["newTag"] for image in kustomization["images"]}
    assert tags == {kratos_admit.__version__}
    assert Path(kratos_admit.__file__).read_text("utf-8").count("__version__ =") == 1


SHARED_TEST_HELPERS = {
    "tests.builders",
    "tests.harness",
    "tests.kube_double",
    "tests.local_kubelet",
    "tests.pod_security",
    "tests.service_links",
}


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
