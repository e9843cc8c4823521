"""CronJobs and Deployments that carry the workload label: allowed unchanged, with a word on what
KRATOS will do with the Jobs or Pods they make (issue 9: kinds that make Jobs)."""

from __future__ import annotations

from typing import Any

import pytest

from kratos_admit.domain import vocabulary as v
from tests.builders import make_job
from tests.harness import admit, assert_valid_kubernetes, engine, make_ctx


def cronjob(*, on_template: bool, on_parent: bool) -> dict[str, Any]:
    job = make_job("nightly").obj()
    template_meta: dict[str, Any] = {"labels": dict(job["metadata"]["labels"])} if on_template else {}
    labels = {v.WORKLOAD_LABEL: "nightly"} if on_parent else {"app": "nightly"}
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "team-a", "labels": labels},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"metadata": template_meta, "spec": job["spec"]}},
    }


def deployment(*, on_template: bool) -> dict[str, Any]:
    pod = {
        "containers": [{"name": "serve", "image": "vllm:0.6", "resources": {"limits": {v.GPU_RESOURCE: 1}}}]
    }
    template_labels = {"app": "serve", **({v.WORKLOAD_LABEL: "serve"} if on_template else {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "serve", "namespace": "team-a", "labels": {v.WORKLOAD_LABEL: "serve"}},
        "spec": {
            "selector": {"matchLabels": {"app": "serve"}},
            "template": {"metadata": {"labels": template_labels}, "spec": pod},
        },
    }


@pytest.mark.parametrize(
    ("obj", "said"),
    [
        pytest.param(
            cronjob(on_template=True, on_parent=False), "short profiling run", id="cronjob-template"
        ),
        pytest.param(
            cronjob(on_template=False, on_parent=True),
            "spec.jobTemplate.metadata.labels",
            id="cronjob-parent-only",
        ),
        pytest.param(deployment(on_template=True), "Pods are never profiled", id="deployment-template"),
        pytest.param(
            deployment(on_template=False), "spec.template.metadata.labels", id="deployment-parent-only"
        ),
    ],
)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_labelled_parent_is_allowed_unchanged_with_a_warning(obj, said, operation):
    assert_valid_kubernetes(obj)
    old = obj if operation == "UPDATE" else None
    result = admit(obj, engine(make_ctx()), webhook="validate", operation=operation, old=old)
    assert result.outcome == "allowed" and result.patch == []
    [warning] = result.decision.warnings
    assert said in warning
    assert result.body["response"]["warnings"] == [warning]


def test_the_mutating_webhook_says_nothing_so_the_warning_is_given_once():
    result = admit(cronjob(on_template=True, on_parent=True), engine(make_ctx()))
    assert result.outcome == "allowed" and result.decision.warnings == []


def test_an_unlabelled_cronjob_gets_no_word():
    result = admit(cronjob(on_template=False, on_parent=False), engine(make_ctx()), webhook="validate")
    assert result.outcome == "allowed" and result.decision.warnings == []
