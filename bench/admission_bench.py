"""KRATOS admission benchmark: the webhook against a no-op aiohttp floor, in one run, on one machine.

    .venv/bin/python bench/admission_bench.py            # full run: writes docs/benchmarks.md and a JSON result
    .venv/bin/python bench/admission_bench.py --smoke    # seconds; what CI runs so the benchmark keeps working
    .venv/bin/python bench/admission_bench.py --event-loop uvloop   # both servers on uvloop

Both servers run as separate processes with the same TLS setup and the same --workers model, on
CPUs of their own where there are two or more (the load on the first; --no-pin leaves that to the
scheduler), and are driven by the same keep-alive HTTPS load (wrk when installed: `apt-get install wrk`; else a
Python asyncio client, which costs CPU on the same cores and so understates both servers).
Per scenario and concurrency it reports requests/s, p50/p95/p99/max latency, server CPU time per
request, and KRATOS's ratio to the floor, each the median of ``--repeat`` runs (3) with the two
servers alternating (on a shared machine one 5 s run of the same server varies by up to 2x); then a paced run at half the floor's peak rate for the
p99 target (and whether that rate was achieved, within 5 %), and an in-process benchmark of the
decision path with a profile of its hot spots: the same review again (answered from the decision
cache), a Job array (names and uids differ) and the same array with the cache off (each review
decided anew). Every line printed, and the page, name the commit measured (``+dirty``: with changes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import datetime as dt
import io
import json
import os
import platform
import pstats
import random
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kratos_admit.admission.cache import DEFAULT_SIZE, DecisionCache  # noqa: E402
from kratos_admit.admission.engine import AdmissionEngine, Webhook, build_engine, review  # noqa: E402
from kratos_admit.admission.request import admission_review  # noqa: E402
from kratos_admit.admission.review import review_document  # noqa: E402
from kratos_admit.domain.config import Config  # noqa: E402
from kratos_admit.edge.files import FileNodeStore, FileProfileStore  # noqa: E402
from kratos_admit.webhook.certs import generate  # noqa: E402

EXAMPLES = REPO / "examples"
HOST = "kratos-webhook.kratos-system.svc"
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Scenario:
    name: str
    path: str
    body: bytes
    what: str


@dataclass
class LoadResult:
    server: str
    scenario: str
    connections: int
    requests: int
    seconds: float
    errors: int
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    cpu_ms_per_request: float
    paced_rate: float | None = None
    commit: str = ""
    pause_ms: float | None = None  # of a paced wrk run: each connection's mean pause between requests


@dataclass
class Report:
    started: str
    machine: dict[str, Any]
    client: str
    workers: int
    duration_s: float
    load: list[LoadResult] = field(default_factory=list)
    paced: list[LoadResult] = field(default_factory=list)
    decision_path: dict[str, float] = field(default_factory=dict)  # the same review again: from the cache
    decision_path_array: dict[str, float] = field(default_factory=dict)  # names and uids differ
    decision_path_cold: dict[str, float] = field(default_factory=dict)  # cache off: decided anew
    profile_top: list[str] = field(default_factory=list)
    event_loop: str = "asyncio"
    targets: dict[str, Any] = field(default_factory=dict)
    repeat: int = 1  # runs per row, the two servers alternating; a row is their median
    pinning: str = "not pinned"
    load_runs: list[LoadResult] = field(default_factory=list)  # every run, as measured


def review_body(obj: dict[str, Any]) -> bytes:
    """A dry run: answered exactly like a real request, but the webhook notes no profiling run under
    way, so the profiling scenario stays a profiling rewrite on every request."""
    review = admission_review(obj, uid="bench", user="system:serviceaccount:team-a:ci", dry_run=True)
    return json.dumps(review).encode()


def make_engine(signing_key: bytes, *, cache: int = DEFAULT_SIZE) -> AdmissionEngine:
    engine = build_engine(
        Config(),
        signing_key=signing_key,
        profiles=FileProfileStore(EXAMPLES / "profiles"),
        nodes=FileNodeStore(EXAMPLES / "nodes.yaml"),
    )
    return dataclasses.replace(engine, decisions=DecisionCache(cache))


def array_bodies(scenario: Scenario, count: int) -> list[bytes]:
    """The scenario's review as ``count`` members of a Job array: each its own name and uid."""
    review = json.loads(scenario.body)
    bodies = []
    for index in range(count):
        review["request"]["uid"] = f"bench-{index}"
        review["request"]["object"]["metadata"]["name"] = f"array-{index}"
        bodies.append(json.dumps(review).encode())
    return bodies


def scenarios(signing_key: bytes) -> list[Scenario]:
    job = yaml.safe_load((EXAMPLES / "vector-add-job.yaml").read_text())
    new = yaml.safe_load((EXAMPLES / "new-workload-job.yaml").read_text())
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "bad", "namespace": "team-a", "labels": {"gpu.scheduler.io/workload": "vector-add"},
                     "annotations": {"gpu.scheduler.io/priority": "urgent"}},
        "spec": {"containers": [{"name": "c", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}}]},
    }  # fmt: skip
    hinted = review_document(
        job, index=0, engine=make_engine(signing_key), namespace=None, user="bench"
    ).object
    return [
        Scenario("hints", "/mutate", review_body(job), "Job with a Ready profile: hints injected"),
        Scenario("profiling", "/mutate", review_body(new), "Job without a profile: rewritten for profiling"),
        Scenario("denied-pod", "/validate", review_body(pod), "Pod with two violations: denied"),
        Scenario("validate", "/validate", review_body(hinted), "the hinted Job re-validated: allowed"),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime+stime of a process and its direct children (the --workers forks)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


@contextlib.contextmanager
def server(
    name: str, command: list[str], port: int, ca: Path, cpus: set[int] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A server process (on ``cpus`` only, where given) answering /healthz, stopped after the block."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,  # noqa: PLW1509 (no threads yet)
    )
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context, timeout=1):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start: {' '.join(command)}") from None
            time.sleep(0.1)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def run_wrk(
    port: int, scenario: Scenario, *, connections: int, duration: float, body_file: Path, delay_ms: float = 0
) -> tuple[int, float, int, list[float]]:
    env = {**os.environ, "KRATOS_BODY": str(body_file), "KRATOS_DELAY_MS": f"{delay_ms:.3f}"}
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--timeout", "5s", "-s", str(REPO / "bench" / "wrk_post.lua"),
         f"https://127.0.0.1:{port}{scenario.path}"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    line = next(row for row in out.stdout.splitlines() if row.startswith("KRATOS_RESULT "))
    data = json.loads(line.split(" ", 1)[1])
    lat = [data["p50_us"] / 1000, data["p95_us"] / 1000, data["p99_us"] / 1000, data["max_us"] / 1000]
    return data["requests"], data["duration_us"] / 1e6, data["errors"] + data["non2xx"], lat


async def _python_load(
    port: int, scenario: Scenario, *, connections: int, duration: float, ca: Path, rate: float | None
) -> tuple[int, float, int, list[float]]:
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    latencies: list[float] = []
    errors = 0
    url = f"https://127.0.0.1:{port}{scenario.path}"
    interval = connections / rate if rate else 0.0

    async def worker(session: aiohttp.ClientSession, stop_at: float) -> None:
        nonlocal errors
        next_at = time.perf_counter() + random.uniform(0, interval)  # not every connection in step
        while (now := time.perf_counter()) < stop_at:
            if interval:
                await asyncio.sleep(max(0.0, next_at - now))
                next_at += interval
            started = time.perf_counter()
            try:
                async with session.post(
                    url, data=scenario.body, headers={"Content-Type": "application/json"}, ssl=context
                ) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
            latencies.append(time.perf_counter() - started)

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session, start + duration) for _ in range(connections)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    return (
        len(latencies),
        elapsed,
        errors,
        [_percentile(latencies, q) for q in (0.50, 0.95, 0.99, 1.0)],
    )


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def load(client: str, name: str, pid: int, port: int, scenario: Scenario, *, connections: int, duration: float,
         ca: Path, body_file: Path, rate: float | None = None, pause_ms: float | None = None) -> LoadResult:  # fmt: skip
    """A load run; with ``rate``, paced: the Python client sends at that rate, wrk's connections each
    pause ``pause_ms`` on average between a response and the next request (default: the pause that
    gives the rate were answers instant; see ``paced_pause``)."""
    cpu_before = cpu_seconds(pid)
    if client == "wrk":
        delay_ms = (pause_ms if pause_ms is not None else connections * 1000 / rate) if rate else 0
        requests, seconds, errors, lat = run_wrk(
            port, scenario, connections=connections, duration=duration, body_file=body_file, delay_ms=delay_ms
        )
    else:
        requests, seconds, errors, lat = asyncio.run(
            _python_load(port, scenario, connections=connections, duration=duration, ca=ca, rate=rate)
        )
    cpu = cpu_seconds(pid) - cpu_before
    return LoadResult(
        server=name, scenario=scenario.name, connections=connections, requests=requests, seconds=round(seconds, 3),
        errors=errors, rps=round(requests / seconds, 1) if seconds else 0.0, p50_ms=round(lat[0], 3),
        p95_ms=round(lat[1], 3), p99_ms=round(lat[2], 3), max_ms=round(lat[3], 3),
        cpu_ms_per_request=round(cpu * 1000 / requests, 4) if requests else 0.0, paced_rate=rate,
    )  # fmt: skip


def _rate(
    bodies: list[bytes], webhook: Webhook, engine: AdmissionEngine, rounds: int, per_round: int
) -> float:
    """Reviews per CPU second, best of ``rounds`` (process time: what this process spent)."""
    best = 0.0
    for _ in range(rounds):
        started = time.process_time()
        for index in range(per_round):
            review(bodies[index % len(bodies)], webhook=webhook, engine=engine)
        elapsed = time.process_time() - started
        best = max(best, per_round / elapsed if elapsed else 0.0)
    return round(best, 1)


def decision_path(
    all_scenarios: list[Scenario], signing_key: bytes, rounds: int, per_round: int
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Reviews per second of the decision path on one core (best of several rounds): the same
    review again, a Job array's members (from the cache) and, cache off, each member decided anew."""
    rates: dict[str, dict[str, float]] = {"again": {}, "array": {}, "cold": {}}
    for scenario in all_scenarios:
        webhook: Webhook = "mutate" if scenario.path == "/mutate" else "validate"
        rates["again"][scenario.name] = _rate(
            [scenario.body], webhook, make_engine(signing_key), rounds, per_round
        )
        array = array_bodies(scenario, per_round)
        rates["array"][scenario.name] = _rate(array, webhook, make_engine(signing_key), rounds, per_round)
        cold = make_engine(signing_key, cache=0)
        rates["cold"][scenario.name] = _rate(array, webhook, cold, rounds, per_round)
    profiler = cProfile.Profile()
    hints = all_scenarios[0]
    engine = make_engine(signing_key, cache=0)
    profiler.enable()
    for _ in range(per_round):
        review(hints.body, webhook="mutate", engine=engine)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
    rows = [
        row.replace(str(REPO) + "/", "").replace(sys.prefix + "/", "")
        for row in text.getvalue().splitlines()
        if row.strip()[:1].isdigit() and "function calls" not in row
    ]
    return rates, rows[:12]


def pin(wanted: bool) -> tuple[set[int] | None, str]:
    """The load generator (this process and the wrk it starts) on the first CPU this process may
    use, both servers on the others, so the load and the server under test do not take turns on
    one CPU (on a 2-CPU machine they did, and a 5 s run of one server varied by up to 2x). The
    CPUs for the servers, or None; and how the run was pinned, for the page."""
    cpus = sorted(os.sched_getaffinity(0))
    if not wanted or len(cpus) < 2:
        return None, "not pinned"
    os.sched_setaffinity(0, {cpus[0]})
    servers = set(cpus[1:])
    return servers, f"load on CPU {cpus[0]}, each server on CPU {','.join(map(str, sorted(servers)))}"


def commit() -> str:
    """The commit measured: ``git rev-parse --short HEAD``, ``+dirty`` when the tree has changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO, check=False
        ).stdout.strip()
        changes = subprocess.run(
            ["git", "status", "--porcelain"], capture_output=True, text=True, cwd=REPO, check=False
        ).stdout.strip()
    except OSError:  # no git here (a copy of the tree)
        return "unknown"
    return (head or "unknown") + ("+dirty" if changes else "")


def machine() -> dict[str, Any]:
    wrk = shutil.which("wrk")
    version = (
        subprocess.run(["wrk", "--version"], capture_output=True, text=True, check=False).stdout.splitlines()[
            0
        ]
        if wrk
        else ""
    )
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "wrk": version,
        "commit": commit(),
    }


KEPT = "<!-- kept: sections below are written by other benchmarks (bench/review_bench.py) -->"


def write_docs(path: Path, text: str) -> None:
    """The page, keeping what other benchmarks recorded below the KEPT marker."""
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(KEPT) :] if KEPT in old else ""
    path.write_text(text + ("\n" + kept if kept else ""))


def markdown(report: Report) -> str:
    commit_id = report.machine["commit"]
    lines = [
        "# Admission benchmark",
        "",
        f"Produced by `.venv/bin/python bench/admission_bench.py` on {report.started} (commit {commit_id}),",
        f"{report.machine['cpus']} CPUs, Python {report.machine['python']}, load from {report.client}"
        + (f" ({report.machine['wrk']})" if report.client == "wrk" else "")
        + f", {report.workers} server worker(s) each, event loop {report.event_loop}, {report.duration_s:g} s per run;",
        f"each row the median of {report.repeat} run(s), the floor and KRATOS alternating (every run is in the JSON result);",
        f"CPUs: {report.pinning}.",
        "The floor is `python -m kratos_admit.webhook.floor`: the same aiohttp, TLS, keep-alive and event loop,",
        "answering `allowed: true` with the uid echoed. CPU time per request is the server processes'",
        "user+system time divided by the requests served. Every request of a run carries the same body,",
        "so after the first KRATOS answers from its decision cache, as it does for a Job array's members;",
        "the in-process table below gives the decision decided anew as well.",
        "",
        "## Throughput and latency at each concurrency",
        "",
        "| scenario | conns | floor req/s | KRATOS req/s | ratio | KRATOS p50 / p95 / p99 / max ms | floor p99 ms | KRATOS CPU ms/req | floor CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    floors = {(r.scenario, r.connections): r for r in report.load if r.server == "floor"}
    for r in (r for r in report.load if r.server == "kratos"):
        f = floors[(r.scenario, r.connections)]
        ratio = r.rps / f.rps if f.rps else 0.0
        lines.append(
            f"| {r.scenario} | {r.connections} | {f.rps:,.0f} | {r.rps:,.0f} | {ratio:.0%} | "
            f"{r.p50_ms:.2f} / {r.p95_ms:.2f} / {r.p99_ms:.2f} / {r.max_ms:.1f} | {f.p99_ms:.2f} | "
            f"{r.cpu_ms_per_request:.3f} | {f.cpu_ms_per_request:.3f} |"
        )
    lines += ["", "## Latency at half the floor's peak rate (hints scenario, paced)", "",
              "Each connection pauses between a response and its next request, each pause drawn from 0 to twice",
              "the mean (the connections' requests spread out in time, as an API server's calls do; a fixed pause",
              "keeps them in step, and measures bursts as large as the connection count). The mean pause is the",
              "one that gives the floor the rate (a probe run first); both servers get the same pause.", "",
              "| server | target req/s | mean pause ms | achieved req/s | achieved within 5 % | p50 ms | p95 ms | p99 ms | max ms | errors |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in report.paced:
        pause = f"{r.pause_ms:.2f}" if r.pause_ms is not None else "-"
        lines.append(
            f"| {r.server} | {r.paced_rate or 0:,.0f} | {pause} | {r.rps:,.0f} | {'yes' if achieved(r) else 'no'} | "
            f"{r.p50_ms:.2f} | {r.p95_ms:.2f} | {r.p99_ms:.2f} | {r.max_ms:.1f} | {r.errors} |"
        )
    lines += [
        "",
        "## Decision path in process (one core, no HTTP, no TLS)",
        "",
        "Reviews per CPU second, best of the rounds: the same review again (answered from the decision",
        "cache), a Job array (each review its own name and uid; the cache answers all but a profiling",
        "rewrite, whose original template holds the name), and the same array with the cache off (every",
        "review decided anew, as the first of an array is).",
        "",
        "| scenario | same review again | Job array | cache off |",
        "|---|---|---|---|",
    ]
    for name, rate in report.decision_path.items():
        array = report.decision_path_array.get(name)
        cold = report.decision_path_cold.get(name)
        lines.append(
            f"| {name} | {rate:,.0f} | {f'{array:,.0f}' if array else '-'} | {f'{cold:,.0f}' if cold else '-'} |"
        )
    lines += [
        "",
        "Where a hinted review decided anew spends its time (cProfile, sorted by own time):",
        "",
        "```",
    ]
    lines += [
        "   ncalls  tottime  percall  cumtime  percall filename:lineno(function)",
        *report.profile_top,
        "```",
        "",
    ]
    lines += [
        "## Reading the figures",
        "",
        "Both servers share this machine's CPUs with the load generator (and, on a shared machine, with",
        "whatever else runs), so throughput is CPU-bound and the ratio to the floor is, to first order,",
        "the ratio of CPU time per request. The floor's cost is aiohttp's HTTP handling and TLS; KRATOS",
        "adds the decision (a key and a lookup when the cache answers; else parse, validate, hint, sign,",
        "diff), its metrics and a larger TLS write (the base64 patch). Where the time goes on the live",
        'server: `bench/flame.py` (py-spy), summarised under "Admission at the floor (issue 44)" below.',
        "The paced row asks for half the floor's peak; where an achieved rate falls short by more than",
        "5 %, that server (or the load generator) could not keep the pace on the CPUs it had.",
        "Absolute figures move by up to 2x between runs on a shared machine: compare rows of one run.",
        "",
    ]
    lines += ["## Targets (issue 44)", "", "| target | measured | met |", "|---|---|---|"]
    lines += [
        f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no'} |" for t in report.targets["rows"]
    ]
    lines.append("")
    return "\n".join(lines)


def paced_pause(connections: int, rate: float, probe: LoadResult) -> float:
    """The mean pause (ms) between a response and a connection's next request that gives ``rate``:
    a wrk connection's cycle is its pause plus the request's time in the loop, so the probe's cycle
    (run with the pause that gives the rate were answers instant) less its pause is that time, and
    the pause asked for is the cycle the rate needs less it. The same pause for both servers: a
    server that answers slower gets a longer cycle, and falls short of the rate."""
    wanted_cycle = connections * 1000 / rate
    in_loop = max(0.0, connections * 1000 / probe.rps - wanted_cycle) if probe.rps else 0.0
    return max(0.0, wanted_cycle - in_loop)


def median_of(runs: list[LoadResult]) -> LoadResult:
    """One row for runs of one server, scenario and concurrency: the median of each figure (req/s,
    latencies, CPU per request), the requests, seconds and errors summed."""
    first = runs[0]
    return dataclasses.replace(
        first,
        requests=sum(r.requests for r in runs),
        seconds=round(sum(r.seconds for r in runs), 3),
        errors=sum(r.errors for r in runs),
        **{name: statistics.median(getattr(r, name) for r in runs)
           for name in ("rps", "p50_ms", "p95_ms", "p99_ms", "max_ms", "cpu_ms_per_request")},
    )  # fmt: skip


def achieved(paced: LoadResult) -> bool:
    """The paced run got within 5 % of the rate it asked for."""
    return paced.rps >= 0.95 * (paced.paced_rate or 0)


# issue 44: each scenario's throughput against the floor's, at its worst concurrency
RATIO_TARGETS: dict[str, float] = {"hints": 0.7, "profiling": 0.5, "denied-pod": 0.8, "validate": 0.8}
PER_CORE_TARGET = 25_000.0


def targets(report: Report) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for scenario, wanted in RATIO_TARGETS.items():
        floors = {r.connections: r for r in report.load if r.server == "floor" and r.scenario == scenario}
        ours = {r.connections: r for r in report.load if r.server == "kratos" and r.scenario == scenario}
        ratios = [(ours[c].rps / floors[c].rps, c) for c in ours if c in floors and floors[c].rps]
        if not ratios:
            continue
        worst = min(ratios)
        rows.append({"target": f"{scenario} req/s >= {wanted:.0%} of the floor at every concurrency (worst level)",
                     "measured": f"{worst[0]:.0%} at {worst[1]} connections", "met": worst[0] >= wanted})  # fmt: skip
    paced = next((r for r in report.paced if r.server == "kratos"), None)
    per_core = report.decision_path.get("hints", 0.0)
    array = report.decision_path_array.get("hints", 0.0)
    cold = report.decision_path_cold.get("hints", 0.0)
    rows += [
        {"target": "hints p99 < 10 ms at half the floor's peak rate, that rate achieved (within 5%)",
         "measured": f"p99 {paced.p99_ms:.2f} ms at {paced.rps:,.0f} of {paced.paced_rate or 0:,.0f} req/s asked" if paced else "not run",
         "met": bool(paced and paced.p99_ms < 10 and achieved(paced))},
        {"target": f"decision path >= {PER_CORE_TARGET:,.0f} hint reviews/s per core",
         "measured": f"{per_core:,.0f}/s the same review, {array:,.0f}/s a Job array, {cold:,.0f}/s decided anew",
         "met": per_core >= PER_CORE_TARGET and array >= PER_CORE_TARGET},
    ]  # fmt: skip
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per load run (5)")
    parser.add_argument("--concurrency", default="1,8,32,64", help="connection counts (1,8,32,64)")
    parser.add_argument("--workers", type=int, default=1, help="server processes for both servers (1)")
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave CPUs to the scheduler (default: the load on the first CPU, both servers on the others)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs per row, the servers alternating; the row is their median (3)",
    )
    parser.add_argument("--paced-connections", type=int, default=64, help="connections of the paced run (64)")
    parser.add_argument(
        "--out-dir", type=Path, default=REPO, help="writes docs/benchmarks.md and bench/results/ under it"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a few seconds in all: proves the benchmark still runs"
    )
    parser.add_argument("--from-json", type=Path, help="re-render docs/benchmarks.md from an earlier result")
    parser.add_argument(
        "--event-loop", choices=("asyncio", "uvloop"), default="asyncio", help="of both servers"
    )
    args = parser.parse_args(argv)
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        report = Report(**{k: val for k, val in data.items() if k not in ("load", "paced", "load_runs")})
        report.load = [LoadResult(**r) for r in data["load"]]
        report.paced = [LoadResult(**r) for r in data["paced"]]
        report.load_runs = [LoadResult(**r) for r in data.get("load_runs", [])]
        report.targets = targets(report)
        write_docs(args.out_dir / "docs" / "benchmarks.md", markdown(report))
        return 0
    client = args.client if args.client != "auto" else ("wrk" if shutil.which("wrk") else "python")
    if client == "wrk" and not shutil.which("wrk"):
        parser.error("wrk is not installed (apt-get install wrk), use --client python")
    duration = 1.0 if args.smoke else args.duration
    levels = [4] if args.smoke else [int(c) for c in args.concurrency.split(",")]
    repeat = 1 if args.smoke else args.repeat
    if repeat < 1:
        parser.error("--repeat must be at least 1")
    signing_key = b"kratos-benchmark-signing-key-0123456789abcdef"
    report = Report(started=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), machine=machine(), client=client,
                    workers=args.workers, duration_s=duration, event_loop=args.event_loop, repeat=repeat)  # fmt: skip
    measured = report.machine["commit"]
    all_scenarios = scenarios(signing_key)
    server_cpus, report.pinning = pin(not args.no_pin)
    with tempfile.TemporaryDirectory(prefix="kratos-bench-") as tmp:
        work = Path(tmp)
        generate(service="kratos-webhook", namespace="kratos-system", out=work / "certs")
        (work / "signing.key").write_bytes(signing_key)
        bodies = {}
        for scenario in all_scenarios:
            bodies[scenario.name] = work / f"{scenario.name}.json"
            bodies[scenario.name].write_bytes(scenario.body)
        ca, cert, key = work / "certs" / "ca.crt", work / "certs" / "tls.crt", work / "certs" / "tls.key"
        floor_port, kratos_port = free_port(), free_port()
        floor_cmd = [sys.executable, "-m", "kratos_admit.webhook.floor", "--listen", f"127.0.0.1:{floor_port}",
                     "--tls-cert", str(cert), "--tls-key", str(key), "--workers", str(args.workers),
                     "--event-loop", args.event_loop]  # fmt: skip
        kratos_cmd = [sys.executable, "-m", "kratos_admit", "webhook", "--listen", f"127.0.0.1:{kratos_port}",
                      "--tls-cert", str(cert), "--tls-key", str(key), "--signing-key", str(work / "signing.key"),
                      "--profiles", str(EXAMPLES / "profiles"), "--nodes", str(EXAMPLES / "nodes.yaml"),
                      "--workers", str(args.workers), "--event-loop", args.event_loop]  # fmt: skip
        with (
            server("floor", floor_cmd, floor_port, ca, server_cpus) as floor,
            server("kratos", kratos_cmd, kratos_port, ca, server_cpus) as kratos,
        ):
            for scenario in all_scenarios:
                for connections in levels:
                    runs: dict[str, list[LoadResult]] = {"floor": [], "kratos": []}
                    for _ in range(repeat):  # the two servers alternate: a slow spell hits both
                        for name, process, port in (
                            ("floor", floor, floor_port),
                            ("kratos", kratos, kratos_port),
                        ):
                            result = load(
                                client,
                                name,
                                process.pid,
                                port,
                                scenario,
                                connections=connections,
                                duration=duration,
                                ca=ca,
                                body_file=bodies[scenario.name],
                            )
                            result.commit = measured
                            runs[name].append(result)
                            report.load_runs.append(result)
                    for name in ("floor", "kratos"):
                        result = median_of(runs[name])
                        report.load.append(result)
                        print(f"[{measured}] {scenario.name:>10} c={connections:<3} {name:>6}: {result.rps:8.0f} req/s  "
                              f"p99 {result.p99_ms:7.2f} ms  cpu {result.cpu_ms_per_request:.3f} ms/req  errors {result.errors}"
                              f"  (median of {repeat}: {', '.join(f'{r.rps:.0f}' for r in runs[name])} req/s)",
                              flush=True)  # fmt: skip
            peak = max(r.rps for r in report.load if r.server == "floor" and r.scenario == "hints")
            rate = peak / 2
            paced_connections = min(args.paced_connections, 4) if args.smoke else args.paced_connections
            pause_ms = None
            if client == "wrk":  # a closed loop: find the pause that gives the rate against the floor
                probe = load(client, "floor", floor.pid, floor_port, all_scenarios[0], connections=paced_connections,
                             duration=duration, ca=ca, body_file=bodies["hints"], rate=rate)  # fmt: skip
                pause_ms = paced_pause(paced_connections, rate, probe)
            paced: dict[str, list[LoadResult]] = {"floor": [], "kratos": []}
            for _ in range(repeat):
                for name, process, port in (("floor", floor, floor_port), ("kratos", kratos, kratos_port)):
                    result = load(
                        client,
                        name,
                        process.pid,
                        port,
                        all_scenarios[0],
                        connections=paced_connections,
                        duration=duration,
                        ca=ca,
                        body_file=bodies["hints"],
                        rate=rate,
                        pause_ms=pause_ms,
                    )
                    result.commit = measured
                    result.pause_ms = round(pause_ms, 3) if pause_ms is not None else None
                    paced[name].append(result)
                    report.load_runs.append(result)
            for name in ("floor", "kratos"):
                result = median_of(paced[name])
                report.paced.append(result)
                print(
                    f"[{measured}] paced {rate:.0f} req/s {name:>6}: achieved {result.rps:.0f} req/s "
                    f"({'within' if achieved(result) else 'NOT within'} 5 %)  p99 {result.p99_ms:.2f} ms"
                    f"  (median of {repeat}: p99 {', '.join(f'{r.p99_ms:.2f}' for r in paced[name])} ms)",
                    flush=True,
                )
    rounds, per_round = (1, 50) if args.smoke else (5, 2000)
    rates, report.profile_top = decision_path(all_scenarios, signing_key, rounds, per_round)
    report.decision_path, report.decision_path_array, report.decision_path_cold = (
        rates["again"],
        rates["array"],
        rates["cold"],
    )
    for name, rate in report.decision_path.items():
        print(f"[{measured}] decision path {name:>10}: {rate:8.0f} reviews/s per core the same review, "
              f"{rates['array'][name]:8.0f} a Job array, {rates['cold'][name]:8.0f} decided anew")  # fmt: skip
    report.targets = targets(report)
    for row in report.targets["rows"]:
        print(f"[{measured}] {'MET ' if row['met'] else 'MISS'} {row['target']}: {row['measured']}")
    results = args.out_dir / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "latest.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    docs = args.out_dir / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    write_docs(docs / "benchmarks.md", markdown(report))
    print(f"wrote {docs / 'benchmarks.md'} and {results / 'latest.json'}")
    errors = sum(r.errors for r in report.load + report.paced)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
