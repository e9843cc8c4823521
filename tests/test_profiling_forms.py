"""The two profiling forms (docs/profiling-forms.md): which one a Job gets and why; the in-image
rewrite (the workload's own image with its env, mounts, working directory and resources, its command
intact after the runner's ``--``) passing Pod Security "restricted" whenever the user's Pod does; the
staged form's output unchanged; and the controller recreating the user's original command."""

from __future__ import annotations

import io
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kratos_admit.cli.common import ExitStatus
from kratos_admit.cli.main import main
from kratos_admit.decisions.profiling import decode_original_template, is_interpreter
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.config import DEFAULT_INTERPRETERS
from kratos_controller.actions import ContainerEnd, CreateExecutionJob, Observed, PublishProfile
from kratos_controller.kube_io import container_ends, newest_node
from kratos_controller.reconcile import pod_failure, reconcile
from tests.builders import PYTORCH_IMAGE, make_job, make_training_job
from tests.harness import (
    DATA,
    EXAMPLES,
    REPO,
    TEST_KEY,
    admit,
    assert_valid_kubernetes,
    engine,
    finish,
    make_ctx,
    mutate_and_check,
    runner_summary,
)
from tests.pod_security import restricted_violations

RUNNER = "/kratos/tools/kratos-runner"
NCU = "/kratos/tools/nsight-compute/ncu"
IN_IMAGE = "profiling form in-image (Nsight Compute runs inside the workload's own image): "
STAGED = "profiling form staged (the executable is copied into the Nsight Compute image): "


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def after_dashes(command: list[str]) -> list[str]:
    return command[command.index("--") + 1 :]


# (command, args, the reason the warning gives): the acceptance cases, and args kept apart
IN_IMAGE_CASES = [
    pytest.param(
        ["python", "train.py"], [], "command[0] 'python' is an interpreter or launcher", id="python-train"
    ),
    pytest.param(
        ["/usr/bin/python3", "train.py"], [], "command[0] '/usr/bin/python3' is an interpreter or launcher",
        id="absolute-python3",
    ),
    pytest.param(
        ["torchrun", "--nproc_per_node=1", "train.py"], [], "command[0] 'torchrun' is an interpreter or launcher",
        id="torchrun",
    ),
    pytest.param(
        ["bash", "-c", 'python train.py --data "$DATA_DIR" && echo done'], [],
        "command[0] 'bash' is an interpreter or launcher", id="bash-c",
    ),
    pytest.param(
        ["./bin/app", "--size", "4096"], [], "command[0] './bin/app' is not an absolute path", id="relative-app",
    ),
    pytest.param(
        ["python"], ["train.py", "--epochs", "90"], "command[0] 'python' is an interpreter or launcher",
        id="command-and-args",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("command", "args", "why"), IN_IMAGE_CASES)
def test_the_in_image_form_runs_the_users_command_in_the_users_own_image(command, args, why):
    builder = make_training_job().command(*command)
    if args:
        builder.args(*args)
    obj = builder.obj()
    user = pod_spec(obj)["containers"][0]
    eng = engine(make_ctx(nsightComputeImage="registry.example/kratos-ncu:2"))
    result, mutated = mutate_and_check(obj, eng)
    assert result.decision.action == "profiling"
    assert IN_IMAGE + why in result.decision.warnings[1], result.decision.warnings
    pod = pod_spec(mutated)
    [runner] = pod["containers"]
    assert runner["name"] == v.RUNNER_CONTAINER and runner["image"] == PYTORCH_IMAGE
    for kept in ("env", "envFrom", "workingDir", "resources", "imagePullPolicy"):
        assert runner[kept] == user[kept], kept
    assert runner["volumeMounts"] == [
        *user["volumeMounts"],
        {"name": "kratos-tools", "mountPath": "/kratos/tools", "readOnly": True},
    ]
    assert runner["command"][:5] == [RUNNER, "--ncu", NCU, "--target-processes", "all"]
    assert after_dashes(runner["command"]) == [*command, *args], "the user's command and args, unchanged"
    assert "args" not in runner and runner["terminationMessagePolicy"] == "File"
    [stage] = pod["initContainers"]
    assert stage["name"] == v.STAGE_PROFILER_CONTAINER and stage["image"] == "registry.example/kratos-ncu:2"
    assert (
        stage["command"][:2] == ["sh", "-c"]
        and "cp -RP /opt/kratos/tools/. /kratos/tools/" in stage["command"][2]
    )
    assert stage["volumeMounts"] == [{"name": "kratos-tools", "mountPath": "/kratos/tools"}]
    assert {"name": "kratos-tools", "emptyDir": {}} in pod["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}} in pod["volumes"]
    assert all(vol["name"] != v.STAGE_VOLUME for vol in pod["volumes"]), "nothing of the staged form"
    original = decode_original_template(mutated, namespace="team-a", signing_key=TEST_KEY)
    assert original["spec"] == obj["spec"]


RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_LEVEL = {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize("level", ["pod-level", "container-level"])
@pytest.mark.parametrize(("command", "args", "why"), IN_IMAGE_CASES)
def test_the_in_image_pod_passes_restricted_whenever_the_users_pod_does(command, args, why, level):
    builder = make_training_job().command(*command).args(*args)
    if level == "pod-level":
        builder.spec(securityContext=dict(POD_LEVEL))
        builder.container()["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
    else:
        builder.container()["securityContext"] = dict(RESTRICTED_CONTAINER)
    obj = builder.obj()
    template = obj["spec"]["template"]
    assert restricted_violations(template.get("metadata", {}), template["spec"]) == []
    _, mutated = mutate_and_check(obj, engine(make_ctx()))
    rewritten = mutated["spec"]["template"]
    assert restricted_violations(rewritten["metadata"], rewritten["spec"]) == []
    runner, stage = rewritten["spec"]["containers"][0], rewritten["spec"]["initContainers"][-1]
    assert runner["securityContext"] == obj["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert stage["securityContext"]["allowPrivilegeEscalation"] is False


def test_an_in_image_pod_the_user_left_open_is_refused_by_the_checker_as_the_users_was():
    """The checker is not vacuous on this form: a pod that is not "restricted" stays not restricted."""
    obj = make_training_job().command("python", "train.py").obj()
    assert restricted_violations({}, pod_spec(obj)) != []
    _, mutated = mutate_and_check(obj, engine(make_ctx(profilingCapabilities=["SYS_ADMIN"])))
    rewritten = mutated["spec"]["template"]
    assert any("SYS_ADMIN" in r for r in restricted_violations(rewritten["metadata"], rewritten["spec"]))


# --- which form, and why ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("builder", "config", "form", "why"),
    [
        pytest.param(make_job(), {}, "staged", "/cuda-samples/vectorAdd is an absolute executable, not an interpreter or launcher", id="auto-absolute-executable"),
        pytest.param(make_job().command("/usr/bin/python3.11", "train.py"), {}, "in-image", "'/usr/bin/python3.11' is an interpreter", id="auto-versioned-python"),
        pytest.param(make_job().command("/opt/conda/bin/torchrun", "train.py"), {}, "in-image", "'/opt/conda/bin/torchrun' is an interpreter", id="auto-absolute-launcher"),
        pytest.param(make_job().command("/usr/bin/env", "python3", "train.py"), {}, "in-image", "'/usr/bin/env' is an interpreter", id="auto-env-wrapper"),
        pytest.param(make_job().command("app", "--n", "4"), {}, "in-image", "'app' is not an absolute path", id="auto-bare-name-on-path"),
        pytest.param(make_job().command().args("train.py").annotate(v.EXECUTABLE_ANNOTATION, "/usr/bin/python3"), {}, "in-image", f"the {v.EXECUTABLE_ANNOTATION} annotation '/usr/bin/python3' is an interpreter", id="auto-entrypoint-named-interpreter"),
        pytest.param(make_job().command().args("--n", "4").annotate(v.EXECUTABLE_ANNOTATION, "/opt/app/bin"), {}, "staged", "/opt/app/bin is an absolute executable", id="auto-entrypoint-named-executable"),
        pytest.param(make_job().annotate(v.PROFILING_FORM_ANNOTATION, "in-image"), {}, "in-image", f"the {v.PROFILING_FORM_ANNOTATION} annotation asks for it", id="annotation-in-image"),
        pytest.param(make_job().command("/usr/bin/python3", "x.py").annotate(v.PROFILING_FORM_ANNOTATION, "staged"), {}, "staged", f"the {v.PROFILING_FORM_ANNOTATION} annotation asks for it", id="annotation-staged"),
        pytest.param(make_job(), {"profilingForm": "in-image"}, "in-image", "config profilingForm is in-image", id="config-in-image"),
        pytest.param(make_job().annotate(v.PROFILING_FORM_ANNOTATION, "staged"), {"profilingForm": "in-image"}, "staged", "annotation asks for it", id="annotation-over-config"),
        pytest.param(make_job().command("/usr/bin/python3", "x.py"), {"profilingForm": "staged"}, "staged", "config profilingForm is staged", id="config-staged"),
        pytest.param(make_job().command("/opt/bin/myrunner", "job.yaml"), {"interpreters": ["myrunner"]}, "in-image", "'/opt/bin/myrunner' is an interpreter", id="config-interpreters-add"),
        pytest.param(make_job().command("/usr/bin/python3", "x.py"), {"interpreters": ["bash"]}, "staged", "/usr/bin/python3 is an absolute executable", id="config-interpreters-replace"),
    ],
)  # fmt: skip
def test_the_form_follows_the_annotation_config_and_command(builder, config, form, why):
    result, mutated = mutate_and_check(builder.obj(), engine(make_ctx(**config)))
    assert result.decision.action == "profiling"
    [said] = [w for w in result.decision.warnings if w.startswith("profiling form ")]
    assert said.startswith(IN_IMAGE if form == "in-image" else STAGED) and why in said, said
    init = pod_spec(mutated)["initContainers"][-1]["name"]
    assert init == (v.STAGE_PROFILER_CONTAINER if form == "in-image" else v.STAGE_CONTAINER)


@pytest.mark.parametrize(
    ("builder", "config", "reason"),
    [
        pytest.param(make_job().command(), {}, "runs its image's entrypoint", id="entrypoint-auto"),
        pytest.param(make_job().command().args("--n", "4").annotate(v.PROFILING_FORM_ANNOTATION, "in-image"), {}, "runs its image's entrypoint", id="entrypoint-in-image"),
        pytest.param(make_job().command("python", "train.py"), {"profilingForm": "staged"}, f"set {v.PROFILING_FORM_ANNOTATION}: in-image", id="relative-command-staged"),
    ],
)  # fmt: skip
def test_what_no_form_can_wrap_gets_base_hints_and_a_warning_that_says_how(builder, config, reason):
    result, mutated = mutate_and_check(builder.obj(), engine(make_ctx(**config)))
    assert result.decision.action == "hints"
    [warning] = result.decision.warnings
    assert "this Job cannot be profiled" in warning and reason in warning, warning
    assert v.ROLE_LABEL not in mutated["metadata"].get("labels", {})


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("python", True, id="python"),
        pytest.param("/usr/bin/python3", True, id="python3"),
        pytest.param("/usr/local/bin/python3.11", True, id="python3.11"),
        pytest.param("pypy3.10", True, id="pypy3.10"),
        pytest.param("node18", True, id="node18"),
        pytest.param("Rscript", True, id="Rscript"),
        pytest.param("/opt/conda/bin/accelerate", True, id="accelerate"),
        pytest.param("/bin/sh", True, id="sh"),
        pytest.param("/cuda-samples/vectorAdd", False, id="cuda-sample"),
        pytest.param("/opt/app/matrixMul2", False, id="versioned-app"),
        pytest.param("python3-config", False, id="not-a-version-suffix"),
        pytest.param("/usr/bin/3", False, id="only-digits"),
    ],
)
def test_interpreters_match_by_file_name_with_a_version_suffix(path, expected):
    assert is_interpreter(path, DEFAULT_INTERPRETERS) is expected


def test_the_docs_list_every_default_interpreter_and_no_other():
    text = (REPO / "docs" / "profiling-forms.md").read_text("utf-8")
    section = text.split("The default:", 1)[1].split("\n\n", 1)[1].split("\n\nEach of these", 1)[0]
    listed = re.findall(r"`([^`]+)`", section)
    assert sorted(listed) == sorted(DEFAULT_INTERPRETERS)


# --- review: the staged form byte for byte, the PyTorch example in the in-image form -----------------


def review(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(["review", *argv], stdout=out, stderr=err)
    return int(status), out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("example", "golden", "why"),
    [
        pytest.param("vector-add-job.yaml", "vector-add-staged.yaml", "/cuda-samples/vectorAdd is an absolute executable", id="vector-add"),
        pytest.param("new-workload-job.yaml", "matrix-mul-staged.yaml", "/opt/app/matrixMul is an absolute executable", id="matrix-mul"),
    ],
)  # fmt: skip
def test_review_gives_the_staged_form_byte_for_byte_as_before_the_in_image_form(
    example: str, golden: str, why: str, tmp_path: Path
):
    """tests/data/profiling/ holds `review -o yaml` of the examples without a profile, as written
    before the in-image form existed: a self-contained executable's rewrite did not change, but for
    one line since, the workload label on the pod template (issue 37: the controller sees the
    profiling Pods, and the kubelet's word on them, as it happens), and the runner's launch window,
    now passed only where config or the profile-skip-kernels annotation sets one (issue 43: the
    runner finds the steady state itself). Without
    --nodes: where the cluster's products are known, a profiling run now also prefers the product
    to profile on (issue 26, tests/test_calibration.py), which is not the form's doing."""
    status, out, err = review("-f", str(EXAMPLES / example), "--profiles", str(tmp_path), "-o", "yaml")
    assert status == ExitStatus.OK, err
    assert out == (DATA / "profiling" / golden).read_text("utf-8")
    assert STAGED + why in err


def test_review_of_the_pytorch_example_shows_the_in_image_form(tmp_path: Path):
    status, out, err = review(
        "-f", str(EXAMPLES / "pytorch-train-job.yaml"), "--profiles", str(tmp_path),
        "--nodes", str(EXAMPLES / "nodes.yaml"), "-o", "yaml",
    )  # fmt: skip
    assert status == ExitStatus.OK, err
    assert (
        "warning: Job/resnet-train: " + IN_IMAGE + "command[0] 'python' is an interpreter or launcher "
        "(config interpreters)\n"
    ) in err
    job = yaml.safe_load(out)
    assert_valid_kubernetes(job)
    [runner] = pod_spec(job)["containers"]
    assert runner["image"] == "nvcr.io/nvidia/pytorch:24.05-py3" and runner["workingDir"] == "/workspace"
    assert after_dashes(runner["command"]) == ["python", "train.py", "--epochs", "90"]
    assert [c["name"] for c in pod_spec(job)["initContainers"]] == [v.STAGE_PROFILER_CONTAINER]


# --- the controller: the execution Job is the user's original, whatever the form ---------------------


def in_image_profiling_job() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the user's Job, the webhook's in-image rewrite of it, as the API server stores it)."""
    user = (
        make_training_job().command("torchrun", "--nproc_per_node=1", "train.py").args("--epochs", "90").obj()
    )
    result = admit(user, engine(make_ctx()))
    assert result.decision.action == "profiling" and result.decision.mutated is not None
    job = result.decision.mutated
    job["metadata"]["uid"] = "uid-train"
    return user, job


def test_the_execution_job_after_an_in_image_run_has_the_users_original_command():
    user, job = in_image_profiling_job()
    summary = runner_summary()
    observed = Observed(
        job=finish(job), runner=ContainerEnd(exit_code=0, reason="Completed", message=summary)
    )
    [create] = [a for a in reconcile(observed, signing_key=TEST_KEY) if isinstance(a, CreateExecutionJob)]
    execution = create.manifest
    assert execution["spec"] == user["spec"], "the user's Job spec, exactly"
    [container] = pod_spec(execution)["containers"]
    assert container["command"] == ["torchrun", "--nproc_per_node=1", "train.py"]
    assert container["args"] == ["--epochs", "90"] and container["image"] == PYTORCH_IMAGE
    assert "initContainers" not in pod_spec(execution)
    assert_valid_kubernetes(execution)


STAGE_PROFILER_FAILED = ContainerEnd(66, "Error", "kratos: this image has no /opt/kratos/tools/kratos-runner")


def test_a_failed_stage_profiler_is_named_in_the_profile_and_the_execution_job_is_still_created():
    _, job = in_image_profiling_job()
    observed = Observed(job=finish(job, "Failed"), pods_seen=True, stage=STAGE_PROFILER_FAILED)
    assert pod_failure(observed) == (
        "stage-profiler failed (exit 66): kratos: this image has no /opt/kratos/tools/kratos-runner"
    )
    actions = reconcile(observed, signing_key=TEST_KEY)
    [status] = [a.status for a in actions if isinstance(a, PublishProfile)]
    assert status.phase == "Failed" and "stage-profiler failed (exit 66)" in (status.message or "")
    assert any(isinstance(a, CreateExecutionJob) for a in actions)


def pod_with_init(name: str, exit_code: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "train-abcde", "creationTimestamp": "2026-11-22T10:00:00Z"},
        "status": {
            "initContainerStatuses": [
                {
                    "name": name,
                    "state": {"terminated": {"exitCode": exit_code, "reason": "Error", "message": "m"}},
                }
            ]
        },
    }


@pytest.mark.parametrize("name", [v.STAGE_CONTAINER, v.STAGE_PROFILER_CONTAINER])
def test_the_controller_reads_the_failure_of_either_staging_container(name):
    runner, stage = container_ends([pod_with_init(name, 66)])
    assert runner is None and stage == ContainerEnd(66, "Error", "m", container=name)
    assert container_ends([pod_with_init(name, 0)]) == (None, None), (
        "a staging copy that succeeded is no failure"
    )


# --- stage-profiler's copy, run for real --------------------------------------------------------------


def stage_profiler_script(source: Path, target: Path) -> list[str]:
    """stage-profiler's command from a real rewrite, its two fixed folders moved under tmp_path."""
    _, mutated = mutate_and_check(make_training_job().command("python", "train.py").obj(), engine(make_ctx()))
    [stage] = pod_spec(mutated)["initContainers"]
    sh, flag, script = stage["command"]
    moved = script.replace(v.TOOLS_IMAGE_PATH, "\0").replace(v.TOOLS_MOUNT_PATH, str(target))
    return [sh, flag, moved.replace("\0", str(source))]


def test_stage_profiler_copies_the_tools_keeping_modes_and_relative_links(tmp_path: Path):
    """nsight-compute/ncu is a relative link to the real program under target/, which loads its
    libraries from beside itself: the copy keeps the link, so it still resolves there."""
    source, target = tmp_path / "opt-kratos-tools", tmp_path / "kratos-tools"
    (source / "nsight-compute" / "target" / "linux-desktop-glibc_2_11_3-x64").mkdir(parents=True)
    target.mkdir()
    for relative, text in (("kratos-runner", "#!runner"), ("nsight-compute/target/linux-desktop-glibc_2_11_3-x64/ncu", "#!ncu")):  # fmt: skip
        (source / relative).write_text(text)
        (source / relative).chmod(0o755)
    (source / "nsight-compute" / "ncu").symlink_to("target/linux-desktop-glibc_2_11_3-x64/ncu")
    done = subprocess.run(stage_profiler_script(source, target), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (target / "kratos-runner").read_text() == "#!runner" and os.access(
        target / "kratos-runner", os.X_OK
    )
    ncu = target / "nsight-compute" / "ncu"
    assert ncu.is_symlink() and ncu.resolve() == (
        target / "nsight-compute" / "target" / "linux-desktop-glibc_2_11_3-x64" / "ncu"
    )
    assert ncu.read_text() == "#!ncu" and os.access(ncu, os.X_OK)


def test_stage_profiler_in_an_image_without_the_tools_fails_saying_which_image_to_use(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "kratos-tools").mkdir()
    done = subprocess.run(
        stage_profiler_script(tmp_path / "empty", tmp_path / "kratos-tools"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 66 and "set nsightComputeImage to the runner image" in done.stderr
    assert list((tmp_path / "kratos-tools").iterdir()) == []


def test_the_node_of_a_profiling_run_is_the_newest_bound_pods():
    """kratos_profiling_failures_total{node}: the newest Pod the scheduler bound; a newer one still
    Pending (no nodeName) does not hide it, and with none bound there is no node."""

    def pod(created: str, node: str = "") -> dict[str, object]:
        return {"metadata": {"creationTimestamp": created}, "spec": {"nodeName": node} if node else {}}

    assert newest_node([pod("2026-11-25T10:00:00Z", "a"), pod("2026-11-25T10:05:00Z", "b")]) == "b"
    assert newest_node([pod("2026-11-25T10:05:00Z", "b"), pod("2026-11-25T10:09:00Z")]) == "b"
    assert newest_node([pod("2026-11-25T10:09:00Z")]) == "" and newest_node([]) == ""
