"""The webhook's request log: every notable answer is a line or a count, and a burst of one answer is
one line and a count, not thousands of lines (kratos_admit/webhook/requestlog.py)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kratos_admit.admission.engine import ReviewResult, answer
from kratos_admit.admission.request import admission_review, parse_review
from kratos_admit.domain import vocabulary as v
from kratos_admit.edge.logs import configure_logging
from kratos_admit.webhook.certs import generate
from kratos_admit.webhook.metrics import AdmissionMetrics
from kratos_admit.webhook.requestlog import RequestLog
from kratos_admit.webhook.server import STATE, create_app, running_site
from kratos_admit.webhook.tls import ServingCertificate
from tests.builders import make_job, make_pod
from tests.harness import HOSTNAME, engine, free_port, make_ctx


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging("INFO", stream)
    logging.getLogger("kratos").setLevel(logging.NOTSET)  # the root's INFO, as in production
    yield stream
    logging.getLogger("kratos").setLevel(logging.DEBUG)  # as conftest's _log_everything sets it
    root.handlers[:] = handlers
    root.setLevel(level)


def logged(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


ENGINE = engine(make_ctx())


def bad_pod(name: str, gpus: str = "1.5", namespace: str = "team-a") -> ReviewResult:
    pod = make_pod(name, namespace).label(v.WORKLOAD_LABEL, "vector-add").limits({v.GPU_RESOURCE: gpus}).obj()
    review = admission_review(pod, uid=f"uid-{name}", namespace=namespace)
    result = answer(parse_review(review), webhook="validate", engine=ENGINE)
    assert result.outcome == "denied"
    return result


def test_a_burst_of_one_denial_is_its_first_line_and_then_a_count_with_the_last_one(lines: io.StringIO):
    clock = Clock()
    log = RequestLog(logging.getLogger("kratos.webhook"), window=10.0, clock=clock)
    for index in range(100):
        log.write("validate", bad_pod(f"bad-{index}"), 0.0001)
        clock.now += 0.05  # 5 s in all: within the window
    first = logged(lines)
    assert [entry["msg"] for entry in first] == ["admission"]
    assert first[0]["uid"] == "uid-bad-0" and first[0]["outcome"] == "denied"
    assert first[0]["violations"] and "repeatsBefore" not in first[0]
    log.flush()  # the window has not passed since the line: nothing yet
    assert len(logged(lines)) == 1
    clock.now += 5.5
    log.flush()
    summary = logged(lines)[1]
    assert summary["msg"] == "admission repeated"
    assert summary["repeats"] == 99 and summary["lastUid"] == "uid-bad-99"
    assert summary["lastObjectName"] == "bad-99" and summary["violations"] == first[0]["violations"]
    assert summary["namespace"] == "team-a" and summary["kind"] == "Pod" and summary["outcome"] == "denied"
    log.flush(everything=True)  # nothing counted since: no line, and the kind is forgotten
    assert len(logged(lines)) == 2


def test_the_next_line_after_the_window_carries_the_count_before_it(lines: io.StringIO):
    clock = Clock()
    log = RequestLog(logging.getLogger("kratos.webhook"), window=10.0, clock=clock)
    for index in range(3):
        log.write("validate", bad_pod(f"bad-{index}"), 0.0001)
    clock.now += 11
    log.write("validate", bad_pod("bad-late"), 0.0001)
    entries = logged(lines)
    assert [e["uid"] for e in entries] == ["uid-bad-0", "uid-bad-late"]
    assert entries[1]["repeatsBefore"] == 2


def test_answers_that_differ_are_each_logged(lines: io.StringIO):
    log = RequestLog(logging.getLogger("kratos.webhook"), clock=Clock())
    log.write("validate", bad_pod("a"), 0.0001)
    log.write("validate", bad_pod("b", gpus="-1"), 0.0001)  # another message
    log.write("validate", bad_pod("c", namespace="team-b"), 0.0001)  # another namespace
    assert [e["uid"] for e in logged(lines)] == ["uid-a", "uid-b", "uid-c"]


def test_the_oldest_kind_is_flushed_with_its_count_when_too_many_are_remembered(lines: io.StringIO):
    log = RequestLog(logging.getLogger("kratos.webhook"), max_kinds=2, clock=Clock())
    log.write("validate", bad_pod("a"), 0.0001)
    log.write("validate", bad_pod("a2"), 0.0001)  # counted under the first kind
    log.write("validate", bad_pod("b", namespace="team-b"), 0.0001)
    log.write("validate", bad_pod("c", namespace="team-c"), 0.0001)  # a third kind: the first goes
    entries = logged(lines)
    assert [e["msg"] for e in entries] == ["admission", "admission", "admission", "admission repeated"]
    assert entries[3]["namespace"] == "team-a" and entries[3]["repeats"] == 1


def test_at_debug_every_answer_is_a_line_and_at_info_a_plain_allow_is_none(lines: io.StringIO):
    logger = logging.getLogger("kratos.webhook")
    log = RequestLog(logger, clock=Clock())
    job = make_job("plain", "team-a").obj()  # not opted in: allowed untouched
    allowed = answer(parse_review(admission_review(job, uid="uid-plain")), webhook="validate", engine=ENGINE)
    log.write("validate", allowed, 0.0001)
    assert logged(lines) == []
    logging.getLogger().setLevel("DEBUG")
    for index in range(3):
        log.write("validate", bad_pod(f"bad-{index}"), 0.0001)
    log.write("validate", allowed, 0.0001)
    assert [e["uid"] for e in logged(lines)] == ["uid-bad-0", "uid-bad-1", "uid-bad-2", "uid-plain"]
    assert [e["level"] for e in logged(lines)] == ["info", "info", "info", "debug"]


async def test_the_server_writes_the_counts_left_when_it_stops(tmp_path: Path, lines: io.StringIO):
    """The live server: a burst of denials is one line while it runs, and the count follows at the
    end (``serve`` flushes after the drain; here the same call after the site stops)."""
    generate(service="kratos-webhook", namespace="kratos-system", out=tmp_path)
    certificate = ServingCertificate(tmp_path / "tls.crt", tmp_path / "tls.key")
    app = create_app(ENGINE, metrics=AdmissionMetrics(), max_body_bytes=1 << 20)
    port = free_port()
    pod = (
        make_pod("bad", "team-a").label(v.WORKLOAD_LABEL, "vector-add").limits({v.GPU_RESOURCE: "1.5"}).obj()
    )
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    async with (
        running_site(app, "127.0.0.1", port, certificate=certificate),
        aiohttp.ClientSession() as session,
    ):

        async def post(index: int) -> bool:
            body = admission_review(pod, uid=f"uid-{index}", namespace="team-a")
            async with session.post(
                f"https://127.0.0.1:{port}/validate", json=body, ssl=context, server_hostname=HOSTNAME
            ) as response:
                return (await response.json())["response"]["allowed"] is False

        assert all(await asyncio.gather(*(post(i) for i in range(20))))
        assert [e["msg"] for e in logged(lines) if e["msg"].startswith("admission")] == ["admission"]
    app[STATE].request_log.flush(everything=True)
    entries = [e for e in logged(lines) if e["msg"].startswith("admission")]
    assert [e["msg"] for e in entries] == ["admission", "admission repeated"]
    assert entries[1]["repeats"] == 19
