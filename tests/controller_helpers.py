"""Builders shared by the controller tests: a profiling Job exactly as the webhook writes it."""

from __future__ import annotations

import copy
import json
from typing import Any

from kratos_admit import vocabulary as v
from kratos_runner.parse import parse_report
from kratos_runner.summary import encode_summary, summarise
from tests.builders import make_job
from tests.conftest import (
    TEST_KEY,
    make_ctx,
    require_fixtures,
)
from tests.helpers import admit, engine


def profiling_job(
    name: str = "vector-add", namespace: str = "team-a", workload: str | None = None
) -> dict[str, Any]:
    """The user's Job after the mutating webhook rewrote it (signed with TEST_KEY)."""
    user = make_job(name, namespace).label(v.WORKLOAD_LABEL, workload or name).args("--n", "4096").build()
    result = admit(user, engine(make_ctx()))
    assert result.decision.action == "profiling"
    job = copy.deepcopy(result.decision.mutated)
    assert job is not None
    job["metadata"]["uid"] = f"uid-{name}"
    return job


def finish(
    job: dict[str, Any], condition: str = "Complete", *, reason: str = "", message: str = ""
) -> dict[str, Any]:
    job = copy.deepcopy(job)
    status: dict[str, Any] = {
        "conditions": [
            {
                "type": condition,
                "status": "True",
                "lastTransitionTime": "2026-11-22T10:03:00Z",
                "reason": reason,
                "message": message,
            }
        ]
    }
    if condition == "Complete":
        status["completionTime"] = "2026-11-22T10:03:00Z"
    job["status"] = status
    return job


def runner_summary(fixture: str = "mdinfo-t4-two-kernel-basic-text.txt", exit_code: int = 0) -> str:
    """What the profiling-runner writes to its termination log, from a real ncu output."""
    text = (require_fixtures() / "ncu" / fixture).read_text(encoding="utf-8")
    return encode_summary(summarise(parse_report(text), exit_code=exit_code, ncu_version="2024.3.2.0"))


def runner_pod(
    job: dict[str, Any], message: str | None, *, exit_code: int = 0, name: str | None = None
) -> dict[str, Any]:
    meta = job["metadata"]
    terminated: dict[str, Any] = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
    if message is not None:
        terminated["message"] = message
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or f"{meta['name']}-abcde",
            "namespace": meta["namespace"],
            "labels": {"job-name": meta["name"], "batch.kubernetes.io/job-name": meta["name"]},
            "creationTimestamp": "2026-11-22T10:00:00Z",
        },
        "spec": {"containers": [{"name": v.RUNNER_CONTAINER, "image": "kratos-nsight-compute-poc:latest"}]},
        "status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": v.RUNNER_CONTAINER,
                    "ready": False,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "state": {"terminated": terminated},
                }
            ],
        },
    }


def summary_json(message: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(message)
    return parsed


__all__ = ["TEST_KEY", "finish", "profiling_job", "runner_pod", "runner_summary", "summary_json"]
