"""Static checks of the two Dockerfiles (no container runtime on the CI machine builds them)."""

from __future__ import annotations

import re
import tomllib

from tests.harness import REPO


def instructions(path: str) -> list[tuple[str, str]]:
    text = (REPO / path).read_text().replace("\\\n", " ")
    return [
        (m.group(1).upper(), m.group(2).strip())
        for m in re.finditer(r"^(\w+)\s+(.*)$", text, re.M)
        if not m.group(0).startswith("#")
    ]


def test_main_image_is_multi_stage_non_root_and_runs_kratos_admit():
    steps = instructions("Dockerfile")
    assert steps[0] == ("ARG", "PYTHON_IMAGE=python:3.12-slim"), "the base is a build argument"
    froms = [arg for op, arg in steps if op == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"], "a build stage, then a runtime stage"
    runtime = steps[[i for i, (op, _) in enumerate(steps) if op == "FROM"][1] :]
    users = [arg for op, arg in runtime if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), "runs as a non-root user"
    assert ("ENTRYPOINT", '["kratos-admit"]') in runtime
    assert any(op == "ENV" and "PYTHONDONTWRITEBYTECODE=1" in arg for op, arg in runtime), (
        "read-only root filesystem: no .pyc writes"
    )
    # a virtual environment, so a distribution's externally managed python3 (PEP 668) is no obstacle,
    # and python3 (Debian has no `python` outside a venv)
    build = " ".join(arg for op, arg in steps if op == "RUN")
    assert "python3 -m venv /opt/kratos/venv" in build and "/opt/kratos/venv/bin/pip install" in build
    assert ("COPY", "--from=build /opt/kratos/venv /opt/kratos/venv") in runtime
    assert any(op == "ENV" and "PATH=/opt/kratos/venv/bin:" in arg for op, arg in runtime)
    assert not any(op == "RUN" and ("gcc" in arg or "build-essential" in arg) for op, arg in runtime)
    copied = " ".join(arg for op, arg in steps if op == "COPY")
    assert "kratos_admit" in copied and "profiler-controller" in copied
    mapped = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    sources = [arg.split()[0] for op, arg in steps if op == "COPY" and not arg.startswith("--from")]
    missing = [d for d in mapped.values() if not any(d == s or d.startswith(s + "/") for s in sources)]
    assert missing == [], "the wheel build needs every package pyproject.toml maps"


def test_the_deployments_user_matches_the_image_user():
    image_user = next(arg for op, arg in reversed(instructions("Dockerfile")) if op == "USER").split(":")[0]
    deployment = (REPO / "webhook-config" / "webhook-deployment.yaml").read_text()
    assert f"runAsUser: {image_user}" in deployment


def test_runner_image_takes_its_base_and_its_nsight_compute_source_as_arguments():
    steps = instructions("runner/Dockerfile")
    arguments = {arg.split("=")[0]: arg.partition("=")[2] for op, arg in steps if op == "ARG"}
    assert arguments["NSIGHT_SOURCE"] == "cuda" and "nvidia/cuda" in arguments["RUNNER_BASE"]
    assert "ONEFILE_BASE" in arguments and "nsight-compute" in arguments["NSIGHT_PACKAGE"]
    froms = [arg for op, arg in steps if op == "FROM"]
    assert "${RUNNER_BASE} AS nsight-cuda" in froms and "${RUNNER_BASE} AS nsight-debian" in froms
    assert "nsight-${NSIGHT_SOURCE} AS nsight" in froms and froms[-1] == "${RUNNER_BASE}"
    run = " ".join(arg for op, arg in steps if op == "RUN")
    assert "${NSIGHT_PACKAGE}" in run and "nsight-compute" in run and "non-free" in run
    # the tools tree is laid out by the real program's place, the same for both sources
    assert "python3 -B -m kratos_runner.tools /opt/kratos/tools" in run
    final = steps[[i for i, (op, _) in enumerate(steps) if op == "FROM"][-1] :]
    assert (
        "COPY",
        "--from=nsight /opt/kratos/tools/nsight-compute /opt/kratos/tools/nsight-compute",
    ) in final
    assert ("COPY", "kratos_runner /opt/kratos/kratos_runner") in final
    assert "ncu --version" in " ".join(arg for op, arg in final if op == "RUN"), "the build runs ncu once"


def test_runner_image_runs_as_a_numeric_non_root_user():
    """runAsNonRoot: true (Pod Security "restricted") needs a numeric, non-zero image user."""
    steps = instructions("runner/Dockerfile")
    user = [arg for op, arg in steps if op == "USER"][-1].split(":")[0]
    assert user.isdigit() and int(user) != 0
    assert f"--uid {user}" in " ".join(arg for op, arg in steps if op == "RUN")


def test_runner_image_builds_the_one_file_runner_in_a_stage_and_keeps_python_m_kratos_runner():
    """The in-image form copies /opt/kratos/tools/kratos-runner into the user's container: a build stage
    makes it with the same script a local build runs (runner/build_onefile.py, PyInstaller), and the
    final image still starts the staged form with python3 -m kratos_runner."""
    steps = instructions("runner/Dockerfile")
    starts = [i for i, (op, _) in enumerate(steps) if op == "FROM"]
    assert len(starts) == 5 and steps[starts[0]][1].endswith("AS onefile")
    stage = steps[starts[0] : starts[1]]
    run = " ".join(arg for op, arg in stage if op == "RUN")
    assert "pyinstaller==${PYINSTALLER_VERSION}" in run and "binutils" in run
    assert ("RUN", "/opt/build/bin/python /src/build_onefile.py --out /out") in stage
    assert ("COPY", "build_onefile.py /src/build_onefile.py") in stage
    final = steps[starts[-1] :]
    assert ("COPY", "--from=onefile /out/kratos-runner /opt/kratos/tools/kratos-runner") in final
    assert final[-1] == ("ENTRYPOINT", '["python3", "-m", "kratos_runner"]')
