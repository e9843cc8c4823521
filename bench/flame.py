"""Where the live webhook's CPU goes under load: py-spy samples of the server, one scenario at a time.

    .venv/bin/pip install py-spy      # a sampling profiler (PyPI); wrk drives the load (apt-get install wrk)
    .venv/bin/python bench/flame.py   # every scenario, then the floor; prints the summaries as Markdown

For each scenario the KRATOS server of `bench/admission_bench.py` (same TLS, same keep-alive load) is
sampled for ``--seconds`` while wrk holds ``--connections`` connections open; the floor is sampled the
same way once (its answer does not depend on the scenario). Each summary gives the share of the
samples spent in groups of frames (each sample counts once, for the first group that claims it: see
GROUPS) and the functions with the most samples of their own (the leaf frame). The raw collapsed
stacks are kept under ``--out`` for a flame graph (any flamegraph.pl-style tool reads them).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from admission_bench import (
    EXAMPLES,
    REPO,
    Scenario,
    free_port,
    scenarios,
    server,
)

from kratos_admit.webhook.certs import generate

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
# Where a sample goes: the first group that claims it (each sample counted once, the shares add up
# to 100 %). The decision and the metrics claim every sample with one of their frames on the stack;
# the rest go by the frame the CPU was in (the leaf).
DECISION = ("kratos_admit/admission/", "kratos_admit/decisions/", "kratos_admit/domain/")
GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("decision (admission, decisions, domain)", "stack", DECISION),
    ("metrics (prometheus_client)", "stack", ("prometheus_client/",)),
    ("request log (logging, its JSON formatter)", "stack", ("logging/", "kratos_admit/edge/logs")),
    ("TLS and socket (ssl, sslproto, transport write/read)", "leaf", ("/ssl.py", "ssl.py", "sslproto.py", "selector_events.py", "socket.py")),
    ("JSON (orjson, json)", "leaf", ("orjson", "json/")),
    ("handler (server.py, floor.py)", "leaf", ("kratos_admit/webhook/",)),
    ("aiohttp (parsing, routing, writing)", "stack", ("aiohttp/",)),
    ("event loop and the rest", "stack", ("",)),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Summary:
    name: str
    samples: int
    groups: list[tuple[str, float]]
    own: list[tuple[str, float]]


def short(file: str) -> str:
    """A frame's file without the machine's prefixes (site-packages, the repository, the stdlib)."""
    for marker in ("site-packages/", "/lib/python3.", str(REPO) + "/"):
        if marker in file:
            tail = file.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python3." else tail
    return file


def parse_frame(frame: str) -> tuple[str, str]:
    found = _FRAME.match(frame.strip())
    return (found["function"], short(found["file"])) if found else (frame.strip(), "")


def summarise(name: str, collapsed: str, top: int = 12) -> Summary:
    """Group shares and the top functions by own samples, from py-spy's raw (collapsed) output."""
    total = 0
    groups: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [parse_frame(f) for f in stack.split(";")[1:]]  # the first is the process/thread
        if not frames:
            continue
        total += count
        files = [file for _, file in frames]
        for group, where, markers in GROUPS:
            looked = files if where == "stack" else files[-1:]
            if any(marker in file for file in looked for marker in markers):
                groups[group] += count
                break
        function, file = frames[-1]
        own[f"{function} ({file})"] += count
    if not total:
        return Summary(name, 0, [], [])
    return Summary(
        name,
        total,
        [(group, groups[group] / total) for group, _, _ in GROUPS],
        [(where, count / total) for where, count in own.most_common(top)],
    )


def markdown(summaries: list[Summary], *, seconds: float, connections: int, rate: int) -> str:
    lines = [
        f"py-spy {rate} samples/s for {seconds:g} s per scenario, wrk at {connections} connections.",
        "",
        "| frames in | " + " | ".join(s.name for s in summaries) + " |",
        "|---|" + "---|" * len(summaries),
    ]
    for index, (group, _, _) in enumerate(GROUPS):
        lines.append(
            f"| {group} | "
            + " | ".join(f"{s.groups[index][1]:.0%}" if s.groups else "-" for s in summaries)
            + " |"
        )
    lines.append("| samples | " + " | ".join(f"{s.samples:,}" for s in summaries) + " |")
    for s in summaries:
        lines += [
            "",
            f"Top functions by own samples, {s.name}:",
            "",
            "| own | function (file) |",
            "|---|---|",
        ]
        lines += [f"| {share:.1%} | `{where}` |" for where, share in s.own]
    return "\n".join(lines) + "\n"


def sample(
    name: str,
    pid: int,
    port: int,
    scenario: Scenario,
    body: Path,
    *,
    seconds: float,
    connections: int,
    rate: int,
    out: Path,
) -> Summary:
    """wrk against the server, py-spy on it in the middle of the load."""
    env = {"KRATOS_BODY": str(body), "KRATOS_DELAY_MS": "0", "PATH": "/usr/bin:/bin"}
    load = subprocess.Popen(
        ["wrk", "-t1", f"-c{connections}", f"-d{round(seconds) + 3}s", "--timeout", "5s", "-s", str(REPO / "bench" / "wrk_post.lua"),
         f"https://127.0.0.1:{port}{scenario.path}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        time.sleep(1.0)
        raw = out / f"{name}.collapsed"
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        subprocess.run(
            [py_spy, "record", "-p", str(pid), "-d", str(round(seconds)), "-r", str(rate), "-f", "raw", "-o", str(raw), "--nonblocking"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        load.wait()
    return summarise(name, raw.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds sampled per scenario (8)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (32)")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second (200)")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "flame", help="collapsed stacks go here"
    )
    parser.add_argument(
        "--event-loop", choices=("asyncio", "uvloop"), default="asyncio", help="of both servers"
    )
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        parser.error("wrk is not installed (apt-get install wrk)")
    args.out.mkdir(parents=True, exist_ok=True)
    signing_key = b"kratos-benchmark-signing-key-0123456789abcdef"
    summaries: list[Summary] = []
    with tempfile.TemporaryDirectory(prefix="kratos-flame-") as tmp:
        work = Path(tmp)
        generate(service="kratos-webhook", namespace="kratos-system", out=work / "certs")
        (work / "signing.key").write_bytes(signing_key)
        cert, key, ca = work / "certs" / "tls.crt", work / "certs" / "tls.key", work / "certs" / "ca.crt"
        port = free_port()
        kratos_cmd = [sys.executable, "-m", "kratos_admit", "webhook", "--listen", f"127.0.0.1:{port}",
                      "--tls-cert", str(cert), "--tls-key", str(key), "--signing-key", str(work / "signing.key"),
                      "--profiles", str(EXAMPLES / "profiles"), "--nodes", str(EXAMPLES / "nodes.yaml")]  # fmt: skip
        floor_cmd = [sys.executable, "-m", "kratos_admit.webhook.floor", "--listen", f"127.0.0.1:{port}",
                     "--tls-cert", str(cert), "--tls-key", str(key)]  # fmt: skip
        kratos_cmd += ["--event-loop", args.event_loop]
        floor_cmd += ["--event-loop", args.event_loop]
        all_scenarios = scenarios(signing_key)
        bodies = {}
        for scenario in all_scenarios:
            bodies[scenario.name] = work / f"{scenario.name}.json"
            bodies[scenario.name].write_bytes(scenario.body)
        with server("kratos", kratos_cmd, port, ca) as kratos:
            for scenario in all_scenarios:
                summaries.append(sample(scenario.name, kratos.pid, port, scenario, bodies[scenario.name],
                                        seconds=args.seconds, connections=args.connections, rate=args.rate, out=args.out))  # fmt: skip
                print(f"sampled {scenario.name}: {summaries[-1].samples} samples", file=sys.stderr)
        with server("floor", floor_cmd, port, ca) as floor:
            summaries.append(sample("floor", floor.pid, port, all_scenarios[0], bodies["hints"],
                                    seconds=args.seconds, connections=args.connections, rate=args.rate, out=args.out))  # fmt: skip
    print(markdown(summaries, seconds=args.seconds, connections=args.connections, rate=args.rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
