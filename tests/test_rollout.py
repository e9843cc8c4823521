"""Issue 10: rollouts and node drains cost no admission, and ``webhook --workers N`` really serves.

The rollout is played with real processes. The Service is modelled by a TCP forwarder in the test
(what kube-proxy does with a ClusterIP): each new connection goes to a ready endpoint; when none
is ready it goes to one that is terminating but still serving (kube-proxy's fallback to
terminating endpoints, GA in 1.28); an open connection stays where it is (conntrack). Endpoints
follow each pod's ``/readyz`` and ``/healthz`` every 0.2 s: the time allowed for endpoints to
update (a real cluster drops a terminating pod at once, while the preStop pause runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from kratos_admit.cli.common import ExitStatus
from kratos_admit.webhook.certs import generate
from tests.builders import make_job
from tests.harness import (
    EXAMPLES,
    FAILURE_THRESHOLD,
    HOSTNAME,
    REPO,
    Service,
    free_port,
    probe,
    render,
    review_of,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    generate(service="kratos-webhook", namespace="kratos-system", out=out)
    return out


def start_webhook(certs: Path, port: int, *args: str, grace: float) -> subprocess.Popen[bytes]:
    """The webhook as a process; its log goes to a file beside the certificates (a pipe nobody
    reads while the test runs would fill and stall it)."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "KRATOS_LOG_LEVEL": "DEBUG",  # every admission logged, with the pid that answered it
        "KRATOS_SHUTDOWN_GRACE_SECONDS": str(grace),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "kratos_admit", "webhook", "--listen", f"127.0.0.1:{port}",
         "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
         "--signing-key", str(certs / "signing.key"), "--profiles", str(EXAMPLES / "profiles"),
         "--nodes", str(EXAMPLES / "nodes.yaml"), *args],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=(certs / f"webhook-{port}.log").open("wb"),
    )  # fmt: skip


def logs(certs: Path, port: int) -> list[dict[str, object]]:
    lines = (certs / f"webhook-{port}.log").read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def tls(certs: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs / "ca.crt"))


@dataclass
class Load:
    """The API server's side: keep-alive connections posting AdmissionReviews without pause."""

    port: int
    context: ssl.SSLContext
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self, session: aiohttp.ClientSession) -> None:
        body = review_of(make_job().obj())
        while not self.stop.is_set():
            try:
                async with session.post(
                    f"https://127.0.0.1:{self.port}/mutate",
                    json=body,
                    ssl=self.context,
                    server_hostname=HOSTNAME,
                    timeout=aiohttp.ClientTimeout(total=5),  # the webhook's timeoutSeconds
                ) as response:
                    answer = await response.json()
                    if response.status != 200 or not answer["response"]["allowed"]:
                        self.failures.append(f"{response.status}: {answer}")
                    else:
                        self.answered += 1
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.005)

    @contextlib.asynccontextmanager
    async def running(self, clients: int = 4) -> AsyncIterator[Load]:
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(self.client(session)) for _ in range(clients)]
            try:
                yield self
            finally:
                self.stop.set()
                await asyncio.gather(*tasks)


async def wait_for(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail("condition not met in time")
        await asyncio.sleep(0.05)


async def test_a_rollout_fails_no_admission(certs: Path):
    """A rollout as the Deployment makes it (maxSurge 1, maxUnavailable 0): pod B starts and turns
    ready, then pod A gets SIGTERM under load, turns unready but keeps serving (3 s) while endpoints
    catch up, and drains. Endpoints update every 0.2 s."""
    old_port, new_port = free_port(), free_port()
    service = Service(tls(certs), pods=[old_port, new_port])
    old = start_webhook(certs, old_port, grace=3)
    new: subprocess.Popen[bytes] | None = None
    try:
        async with service.running():
            await wait_for(lambda: service.ready == [old_port])
            async with Load(service.port, tls(certs)).running() as load:
                await wait_for(lambda: load.answered > 50)
                before_new = load.answered
                new = start_webhook(certs, new_port, grace=0.5)
                await wait_for(lambda: sorted(service.ready) == sorted([old_port, new_port]))
                old.send_signal(signal.SIGTERM)
                await wait_for(lambda: service.ready == [new_port])  # A left the endpoints
                await wait_for(lambda: old.poll() is not None)
                after_old = load.answered
                await wait_for(lambda: load.answered > after_old + 50)
            assert load.failures == [], load.failures[:5]
        assert old.wait(timeout=10) == 0
        old_logs = logs(certs, old_port)
        sigterm = next(i for i, e in enumerate(old_logs) if str(e["msg"]).startswith("SIGTERM"))
        served_after = [e for e in old_logs[sigterm:] if e["msg"] == "admission"]
        assert served_after, "the terminating pod answered requests while endpoints caught up"
        print(
            f"rollout: {load.answered} answered, {len(load.failures)} failed, {len(served_after)} by the old pod after SIGTERM"
        )
        assert before_new > 50 and load.answered > after_old
    finally:
        for proc in (old, new):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def metrics_text(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        return str(response.read().decode())


def answered_total(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kratos_admission_requests_total{")
    )


async def test_workers_answer_from_several_processes_sum_metrics_and_stop_cleanly(certs: Path):
    port, metrics_port = free_port(), free_port()
    proc = start_webhook(
        certs, port, "--workers", "2", "--metrics-listen", f"127.0.0.1:{metrics_port}", grace=0.2
    )
    try:
        connector = aiohttp.TCPConnector(force_close=True)  # a new connection per request
        async with aiohttp.ClientSession(connector=connector) as session:
            deadline = time.monotonic() + 20
            while not await probe(session, port, "/readyz", tls(certs)):
                assert proc.poll() is None and time.monotonic() < deadline, logs(certs, port)
                await asyncio.sleep(0.1)
            for _ in range(60):
                async with session.post(
                    f"https://127.0.0.1:{port}/mutate",
                    json=review_of(make_job().obj()),
                    ssl=tls(certs),
                    server_hostname=HOSTNAME,
                ) as response:
                    assert response.status == 200
        assert answered_total(metrics_text(metrics_port)) == 60, "the parent serves the workers' sum"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        entries = logs(certs, port)
        answering = {e["pid"] for e in entries if e["msg"] == "admission"}
        assert len(answering) == 2, f"answered by {answering}"
        assert proc.pid not in answering
        assert next(e for e in entries if e["msg"] == "workers stopped")["failed"] is False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_worker_that_cannot_start_is_logged_and_the_parent_fails(certs: Path, tmp_path: Path):
    """A worker that dies at start (here: a serving key it cannot load) takes the others down and
    the parent exits 3. A port already in use never gets that far: the parent tries it before
    forking and says so in one line, exit 2 (tests/test_cli_inputs.py)."""
    broken = tmp_path / "certs"
    shutil.copytree(certs, broken)
    (broken / "tls.key").write_text("not a key\n")
    port = free_port()
    proc = start_webhook(broken, port, "--workers", "2", grace=0)
    try:
        assert proc.wait(timeout=30) == ExitStatus.FAILED
    finally:
        if proc.poll() is None:
            proc.kill()
    entries = logs(broken, port)
    failed = [e for e in entries if e["msg"] == "worker failed"]
    assert failed and "tls.key" in str(failed[0]["error"]), entries
    assert [e for e in entries if e["msg"] == "worker exited"], "the parent says which worker ended"


def test_workers_do_not_outlive_a_killed_parent(certs: Path):
    """A supervisor SIGKILLed (OOM, kubelet) must not leave workers serving unsupervised."""
    port = free_port()
    proc = start_webhook(certs, port, "--workers", "2", grace=0)
    try:
        deadline = time.monotonic() + 20
        workers: list[int] = []
        while len(workers) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, logs(certs, port)
            workers = [int(e["pid"]) for e in logs(certs, port) if e["msg"] == "serving"]  # type: ignore[call-overload]
            time.sleep(0.1)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 15
        while any(alive(pid) for pid in workers):
            assert time.monotonic() < deadline, f"workers {workers} outlived their parent"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError):  # reap it if it became ours
        os.waitpid(pid, os.WNOHANG)
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_the_webhook_deployment_rolls_as_the_rollout_test_plays_it():
    """The order above (new Pod ready first, then the old one stopped) is the Deployment's own."""
    [deployment] = [
        o
        for o in render(REPO / "webhook-config")
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "kratos-webhook"
    ]
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    probe_spec = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe_spec["failureThreshold"] == FAILURE_THRESHOLD, (
        "the Service model drops endpoints as the kubelet does"
    )
