"""The controller's Events, as pure objects (issue 18): what the API server accepts, and one Event
per report however often it is made."""

from __future__ import annotations

import datetime as dt

import pytest

from kratos_controller.events import Regarding, event_body, event_name
from tests.builders import make_job
from tests.kube_double import invalid_event

NOW = dt.datetime(2026, 11, 23, 10, 0, 0, 123456, tzinfo=dt.UTC)
JOB = {**make_job("sweep-0").obj(), "metadata": {"name": "sweep-0", "namespace": "team-a", "uid": "u-1"}}


def regarding() -> Regarding:
    return Regarding.of(JOB, api_version="batch/v1", kind="Job")


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        pytest.param("ProfilingStarted", "Normal", id="started"),
        pytest.param("ProfileFailed", "Warning", id="failed-is-a-warning"),
        pytest.param("Observed", "Normal", id="observed"),
    ],
)
def test_an_event_is_what_the_api_server_accepts(reason, kind):
    event = event_body(regarding(), reason, "a note", instance="kratos-controller-0", now=NOW)
    assert invalid_event(event) == ""
    assert event["type"] == kind and event["eventTime"] == "2026-11-23T10:00:00.123456Z"
    assert event["regarding"] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "namespace": "team-a",
        "name": "sweep-0",
        "uid": "u-1",
    }
    assert event["reportingController"] == "gpu.scheduler.io/kratos-controller"


def test_the_same_report_is_one_event_and_another_run_is_another():
    first = event_body(regarding(), "Observed", "run a", instance="a", now=NOW, detail="pod-1")
    again = event_body(
        regarding(), "Observed", "run a", instance="b", now=NOW + dt.timedelta(hours=1), detail="pod-1"
    )
    other = event_body(regarding(), "Observed", "run b", instance="a", now=NOW, detail="pod-2")
    assert first["metadata"]["name"] == again["metadata"]["name"] != other["metadata"]["name"]
    assert event_name(regarding(), "ProfileReady", "") != event_name(regarding(), "ProfileFailed", "")


def test_a_long_note_is_cut_to_the_servers_byte_limit():
    event = event_body(regarding(), "ProfileFailed", "é" * 2000, instance="a", now=NOW)
    assert len(event["note"].encode()) <= 1024 and invalid_event(event) == ""
