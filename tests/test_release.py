"""``kratos-admit release`` against the API double (issue 16: nothing left stuck).

The held objects are the webhook's own output (a profiling Job and its Pod with the release
finalizer, followers held while a run is under way); the double serves them with the install's
RBAC, and ``release`` runs as the cluster admin, as a user's kubectl would.
"""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest

from kratos_admit.cli.common import ExitStatus
from kratos_admit.cli.main import main
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.profile import WorkloadProfile
from kratos_admit.edge.release import plan_release
from tests.builders import make_job, make_pod
from tests.harness import (
    JOBS,
    PODS,
    admit,
    double_in_thread,
    engine,
    free_port,
    install_rbac,
    kubeconfig_for,
    make_ctx,
    profile,
    profiling_job,
)
from tests.kube_double import Identity, KubeDouble

UNDER_WAY = WorkloadProfile.model_validate(profile("sweep", phase="Profiling"))


def held(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as the webhook holds it while the sweep's run is under way."""
    result = admit(obj, engine(make_ctx(), [UNDER_WAY]))
    assert result.decision.mutated is not None and result.decision.allowed
    return result.decision.mutated


def runner_pod_of(job: dict[str, Any], name: str) -> dict[str, Any]:
    """A Pod the Job controller made from the profiling Job's template (finalizer included)."""
    template = copy.deepcopy(job["spec"]["template"])
    meta = template["metadata"]
    meta.update(name=name, namespace=job["metadata"]["namespace"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def cluster_holding_things(namespace: str = "team-a") -> KubeDouble:
    kube = KubeDouble()
    install_rbac(kube)
    run = profiling_job("sweep-0", namespace, workload="sweep")
    assert v.RELEASE_FINALIZER in run["metadata"]["finalizers"]
    kube.put(*JOBS, run)
    kube.put(*PODS, runner_pod_of(run, "sweep-0-abcde"))
    kube.put(*JOBS, held(make_job("sweep-1", namespace).label(v.WORKLOAD_LABEL, "sweep").obj()))
    user_suspended = (
        make_job("sweep-2", namespace).label(v.WORKLOAD_LABEL, "sweep").job_spec(suspend=True).obj()
    )
    kube.put(*JOBS, held(user_suspended))
    pod = make_pod("solo", namespace).label(v.WORKLOAD_LABEL, "sweep").obj()
    pod["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    kube.put(*PODS, held(pod))
    kube.put(*JOBS, make_job("unrelated", namespace).obj())
    return kube


def release(url: str, tmp_path: Path, *args: str, identity: Identity | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    config = kubeconfig_for(url, tmp_path / "kubeconfig", *([identity] if identity else []))
    status = main(["release", *args, "--kubeconfig", str(config)], stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def spec_of(kube: KubeDouble, resource: tuple[str, str], name: str) -> dict[str, Any]:
    found = kube.get(*resource, "team-a", name)
    assert found is not None, name
    spec: dict[str, Any] = found["spec"]
    return spec


def finalizers(kube: KubeDouble, resource: tuple[str, str], name: str) -> list[str]:
    found = kube.get(*resource, "team-a", name)
    assert found is not None, name
    return list(found["metadata"].get("finalizers") or [])


def test_release_lets_go_of_everything_kratos_holds_and_nothing_else(tmp_path: Path):
    kube = cluster_holding_things()
    unrelated_before = kube.get(*JOBS, "team-a", "unrelated")
    assert spec_of(kube, JOBS, "sweep-1")["suspend"] is True
    with double_in_thread(kube) as url:
        status, out, err = release(url, tmp_path, "-A")
        assert (status, err) == (ExitStatus.OK, "")
        assert out.splitlines() == [
            f"team-a/job.batch/sweep-0: finalizer {v.RELEASE_FINALIZER} removed",
            "team-a/job.batch/sweep-1: resumed",
            f"team-a/pod/solo: scheduling gate {v.PROFILE_SCHEDULING_GATE} removed",
            f"team-a/pod/sweep-0-abcde: finalizer {v.RELEASE_FINALIZER} removed",
        ]
        assert finalizers(kube, JOBS, "sweep-0") == [] and finalizers(kube, PODS, "sweep-0-abcde") == []
        assert spec_of(kube, JOBS, "sweep-1")["suspend"] is False
        assert spec_of(kube, JOBS, "sweep-2")["suspend"] is True, "the user suspended it: it stays so"
        assert spec_of(kube, PODS, "solo")["schedulingGates"] == [{"name": "example.com/quota"}], (
            "only KRATOS's gate goes"
        )
        assert kube.get(*JOBS, "team-a", "unrelated") == unrelated_before
        again = release(url, tmp_path, "-A")
        assert again == (ExitStatus.OK, "nothing held by KRATOS in any namespace\n", ""), "idempotent"


def test_a_dry_run_says_what_it_would_do_and_changes_nothing(tmp_path: Path):
    kube = cluster_holding_things()
    before = copy.deepcopy(kube.objects)
    with double_in_thread(kube) as url:
        status, out, _ = release(url, tmp_path, "-A", "--dry-run")
    assert status == ExitStatus.OK
    assert len(out.splitlines()) == 4 and all(line.endswith(" (dry run)") for line in out.splitlines())
    assert kube.objects == before
    assert not kube.calls("PATCH", ".")


def test_one_namespace_only(tmp_path: Path):
    kube = cluster_holding_things()
    for obj in cluster_holding_things("team-b").items(*JOBS):
        kube.put(*JOBS, obj)
    with double_in_thread(kube) as url:
        status, out, _ = release(url, tmp_path, "-n", "team-b")
    assert status == ExitStatus.OK
    assert {line.split("/")[0] for line in out.splitlines()} == {"team-b"}
    assert finalizers(kube, JOBS, "sweep-0") == [v.RELEASE_FINALIZER], "team-a is left alone"


def test_a_job_being_deleted_goes_once_released(tmp_path: Path):
    kube = cluster_holding_things()
    kube.delete(*JOBS, "team-a", "sweep-0", "Foreground")
    assert kube.get(*JOBS, "team-a", "sweep-0"), "the finalizer keeps it"
    with double_in_thread(kube) as url:
        assert release(url, tmp_path, "-n", "team-a")[0] == ExitStatus.OK
    assert kube.get(*JOBS, "team-a", "sweep-0") is None


@pytest.mark.parametrize(
    ("who", "expected"),
    [
        pytest.param(
            Identity("alice", ("system:authenticated",)),
            'kratos-admit: API error 403 Forbidden: jobs.batch is forbidden: User "alice" cannot list '
            'resource "jobs" in API group "batch" at the cluster scope',
            id="no-rights",
        ),
    ],
)
def test_a_user_without_the_rights_gets_one_line(tmp_path: Path, who: Identity, expected: str):
    kube = cluster_holding_things()
    kube.tokens["alice-token"] = who
    with double_in_thread(kube) as url:
        config = kubeconfig_for(url, tmp_path / "kubeconfig")
        config.write_text(config.read_text().replace("admin-token", "alice-token"))
        out, err = io.StringIO(), io.StringIO()
        status = main(["release", "-A", "--kubeconfig", str(config)], stdout=out, stderr=err)
    assert (status, err.getvalue().splitlines()) == (ExitStatus.UNUSABLE, [expected])


def test_an_api_server_that_cannot_be_reached_is_one_line(tmp_path: Path):
    status, out, err = release(f"http://127.0.0.1:{free_port()}", tmp_path, "-A")
    assert status == ExitStatus.UNUSABLE and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(
        "kratos-admit: cannot reach the API server at http://127.0.0.1:"
    )
    assert "Traceback" not in err


def test_scope_is_required_and_exclusive(tmp_path: Path):
    for args in ([], ["-n", "a", "-A"]):
        err = io.StringIO()
        assert main(["release", *args], stdout=io.StringIO(), stderr=err) == ExitStatus.UNUSABLE
        assert "-n/--namespace" in err.getvalue()


def test_the_plan_touches_only_what_kratos_holds():
    assert plan_release("Job", make_job().obj()) is None
    assert plan_release("Pod", make_pod().obj()) is None
    user_gate = make_pod().obj()
    user_gate["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    assert plan_release("Pod", user_gate) is None
