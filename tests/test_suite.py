"""`kratos-admit test`: declarative review suites (issue 17), as `kyverno test` and `gator verify` run them."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import yaml

from kratos_admit.cli.common import ExitStatus
from kratos_admit.cli.main import main
from tests.harness import EXAMPLES


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), stdout=out, stderr=err)
    return int(status), out.getvalue(), err.getvalue()


def test_the_examples_suite_passes_as_ci_runs_it():
    status, out, err = run("test", str(EXAMPLES))
    assert status == ExitStatus.OK, out + err
    rows = [line.split() for line in out.splitlines()[1:] if line.startswith("examples")]
    assert [(r[1], r[2]) for r in rows] == [
        ("Job/vector-add", "pass"),
        ("Job/nbody", "pass"),
        ("Job/matrix-mul", "pass"),
        ("Job/resnet-train", "pass"),
        ("Job/llama-ddp", "pass"),
    ]
    assert out.splitlines()[-1] == "kratos-admit test: all 5 expectations met" and err == ""


@pytest.fixture
def suite_copy(tmp_path: Path) -> Path:
    """The examples with their suite, to be changed by a test."""
    copy = tmp_path / "examples"
    shutil.copytree(EXAMPLES, copy)
    return copy


def edit(suite_dir: Path, index: int, **expected: object) -> None:
    path = suite_dir / "kratos-test.yaml"
    suite = yaml.safe_load(path.read_text())
    suite["results"][index].update(expected)
    path.write_text(yaml.safe_dump(suite, sort_keys=False))


@pytest.mark.parametrize(
    ("index", "change", "row", "reason"),
    [
        pytest.param(2, {"action": "hints"}, "Job/matrix-mul", "action: expected hints, got profiling", id="action"),
        pytest.param(0, {"allowed": False}, "Job/vector-add", "allowed: expected false, got true", id="allowed"),
        pytest.param(1, {"rules": ["gpu-count"]}, "Job/nbody", "rules: expected [gpu-count], got []", id="rules"),
        pytest.param(1, {"warnings": ["suspended"]}, "Job/nbody", "warnings: none contains 'suspended'", id="warning"),
        pytest.param(1, {"name": "n-body"}, "Job/n-body", "no such object in the manifests", id="missing-object"),
        pytest.param(0, {"namespace": "team-b"}, "Job/team-b/vector-add", "no such object in the manifests", id="other-namespace"),
    ],
)  # fmt: skip
def test_one_wrong_expectation_fails_with_exit_1_and_a_row_naming_the_mismatch(
    suite_copy: Path, index: int, change: dict[str, object], row: str, reason: str
):
    edit(suite_copy, index, **change)
    status, out, err = run("test", str(suite_copy))
    assert status == ExitStatus.DENIED and err == ""
    failed = [line for line in out.splitlines() if " FAIL " in line]
    assert len(failed) == 1, out
    assert failed[0].split()[:3] == ["examples", row, "FAIL"] and failed[0].endswith(reason)
    assert out.splitlines()[-1] == "kratos-admit test: 1 of 5 expectations not met"


def test_a_suite_reads_its_own_config_and_no_kratos_variable(
    suite_copy: Path, monkeypatch: pytest.MonkeyPatch
):
    """The same suite gives the same answer on a laptop and in CI: its config file counts, the
    environment does not. The config maps the priority vector-add asks for, which silences the
    warning the suite expects: that expectation fails, and only that one."""
    job_path = suite_copy / "vector-add-job.yaml"
    job = yaml.safe_load(job_path.read_text())
    job["metadata"]["annotations"]["gpu.scheduler.io/priority"] = "normal"
    job_path.write_text(yaml.safe_dump(job, sort_keys=False))
    edit(suite_copy, 0, warnings=["gpu.scheduler.io/priority: normal has no effect"])
    assert run("test", str(suite_copy))[0] == ExitStatus.OK, "without the config, the warning is given"
    (suite_copy / "config.yaml").write_text("priorityClasses: {normal: gpu-normal}\n")
    path = suite_copy / "kratos-test.yaml"
    suite = yaml.safe_load(path.read_text())
    suite["config"] = "config.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    monkeypatch.setenv("KRATOS_PROFILING_DEFAULT", "false")  # would turn matrix-mul's profiling off
    status, out, _ = run("test", str(suite_copy))
    assert status == ExitStatus.DENIED
    [failed] = [line for line in out.splitlines() if " FAIL " in line]
    assert (
        failed.split()[1] == "Job/vector-add"
        and "warnings: none contains 'gpu.scheduler.io/priority: normal has no effect'" in failed
    )


def test_suites_are_found_under_the_directory_and_each_runs_with_its_own_files(
    suite_copy: Path, tmp_path: Path
):
    second = tmp_path / "examples" / "nested" / "more"
    second.mkdir(parents=True)
    (second / "kratos-test.yaml").write_text(yaml.safe_dump({
        "apiVersion": "cli.gpu.scheduler.io/v1alpha1", "kind": "Test", "name": "denials",
        "manifests": ["pod.yaml"],
        "results": [{"kind": "Pod", "name": "p", "allowed": False, "action": "none", "rules": ["gpu-count", "workload-name"]}],
    }))  # fmt: skip
    (second / "pod.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {gpu.scheduler.io/workload: Bad_Name}}\n"
        "spec: {containers: [{name: c, image: i, resources: {limits: {nvidia.com/gpu: '0.5'}}}]}\n"
    )
    status, out, err = run("test", str(tmp_path / "examples"))
    assert status == ExitStatus.OK, out + err
    assert "denials   Pod/p" in out and out.splitlines()[-1] == "kratos-admit test: all 6 expectations met"


NEW_USER = Path(__file__).parent / "data" / "suites" / "new-user"


def test_what_a_new_user_meets_is_named_unknown_fields_objects_left_alone_and_launcher_mismatches():
    """Issue 60: its suite says what review names on each object: an unknown field (the Job admitted,
    or denied for the GPU request the misspelt field held), why an unlabelled GPU Job, a Service and
    a Node are left alone, and a torchrun whose counts disagree with its Indexed Job."""
    status, out, err = run("test", str(NEW_USER))
    assert status == ExitStatus.OK, out + err
    assert out.splitlines()[-1] == "kratos-admit test: all 7 expectations met"


def test_review_says_each_note_on_the_object_it_belongs_to_and_nothing_on_the_one_that_agrees():
    status, out, err = run(
        "review", "-f", str(NEW_USER / "manifests"), "--nodes", str(EXAMPLES / "nodes.yaml"), "-o", "json"
    )
    assert status == ExitStatus.DENIED, err
    by_name = {r["name"]: r for r in json.loads(out)}
    assert "disagrees" not in " ".join(by_name["torchrun-agrees"]["warnings"])
    assert [w for w in by_name["torchrun-disagrees"]["warnings"] if "disagrees" in w]
    assert [w for r in by_name.values() for w in r["warnings"] if "unknown field" in w] == [
        *(w for w in by_name["misspelt-parallelism"]["warnings"] if "unknown field" in w),
        *(w for w in by_name["misspelt-resources"]["warnings"] if "unknown field" in w),
    ]
    assert {n: r.get("reason", "")[:20] for n, r in by_name.items() if r.get("reason")} == {
        "not-opted-in": "not opted in: KRATOS",
        "rendezvous": "KRATOS does not revi",
        "gpu-node-1": "KRATOS does not revi",
    }
    assert "left alone: Job/not-opted-in: not opted in" in err
