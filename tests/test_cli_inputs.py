"""Issue 17: every bad input gets one answer. Each row is an input a user could give one of the
commands, the exit status DESIGN documents for it (2: unusable input, 1: a denial), and the part of
the one line on stderr that names the culprit: the file (and document or line), the key or the
flag, what was found. Never a traceback, never a second line."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kratos_admit.cli.common import ExitStatus
from kratos_admit.cli.main import main
from kratos_admit.webhook.certs import generate
from tests.harness import EXAMPLES, REPO, free_port, kubeconfig_for

JOB = (EXAMPLES / "vector-add-job.yaml").read_text()
PROFILE = (EXAMPLES / "profiles" / "vector-add-profile.yaml").read_text()
NODES = str(EXAMPLES / "nodes.yaml")


@dataclass
class Place:
    """What a row's arguments may refer to: a scratch directory, certificates, a kubeconfig naming a
    closed loopback port, and a loopback port something already listens on."""

    tmp: Path
    certs: Path
    unreachable: Path
    busy_port: int

    def file(self, name: str, content: str | bytes) -> str:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(path)

    def dir(self, name: str, files: dict[str, str | bytes]) -> str:
        for file, content in files.items():
            self.file(f"{name}/{file}", content)
        (self.tmp / name).mkdir(exist_ok=True)
        return str(self.tmp / name)

    @property
    def key(self) -> list[str]:
        return ["--signing-key", str(self.certs / "signing.key")]

    @property
    def tls(self) -> list[str]:
        return ["--tls-cert", str(self.certs / "tls.crt"), "--tls-key", str(self.certs / "tls.key")]


@dataclass(frozen=True)
class Row:
    argv: Callable[[Place], list[str]]
    culprit: str  # a part of the one stderr line
    status: int = ExitStatus.UNUSABLE
    env: dict[str, str] | None = None
    process: bool = False  # run as a real process (servers and cluster clients configure logging)


def review(*extra: str) -> list[str]:
    return ["review", *extra]


def job_with(**fields: object) -> str:
    job = yaml.safe_load(JOB)
    for dotted, value in fields.items():
        *parents, last = dotted.split("__")
        target = job
        for part in parents:
            target = target[part]
        target[last] = value
    return yaml.safe_dump(job)


SUITE = "apiVersion: cli.gpu.scheduler.io/v1alpha1\nkind: Test\nname: s\n"

ROWS = {
    # review: its inputs
    "review-profiles-dir-with-non-utf8-file": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), "--profiles", p.dir("bin", {"x.yaml": b"\xff\xfe"}), *p.key),
        "bin/x.yaml: not UTF-8 text"),
    "review-profiles-is-a-file": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), "--profiles", NODES, *p.key),
        "nodes.yaml: is a file; --profiles expects a directory"),
    "review-profiles-dir-holding-a-job": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), "--profiles", p.dir("jobs", {"j.yaml": JOB}), *p.key),
        "jobs/j.yaml: document 1 is a Job; --profiles expects"),
    "review-two-profiles-for-one-workload": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), *p.key, "--profiles",
                         p.dir("twice", {"a.yaml": PROFILE, "b.yaml": PROFILE.replace("name: vector-add-profile", "name: other")})),
        "twice/b.yaml (document 1): a second WorkloadProfile for workload vector-add in namespace team-a; the first is in"),
    "review-nodes-holding-a-job": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), "--nodes", str(EXAMPLES / "vector-add-job.yaml"), *p.key),
        "vector-add-job.yaml: document 1 is a Job; --nodes expects a file of Node objects"),
    "review-nodes-empty": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), "--nodes", p.file("nodes.yaml", ""), *p.key),
        "nodes.yaml: holds no Node"),
    "review-nodes-is-a-directory": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), "--nodes", str(EXAMPLES), *p.key),
        "examples: is a directory; --nodes expects a file"),
    "review-missing-file": Row(lambda p: review("-f", str(p.tmp / "nope.yaml"), *p.key), "nope.yaml: cannot read: No such file"),
    "review-non-utf8-manifest": Row(lambda p: review("-f", p.file("bin.yaml", b"kind: \xff"), *p.key), "bin.yaml: not UTF-8 text (byte 6 is 0xff)"),
    "review-directory-without-manifests": Row(
        lambda p: review("-f", p.dir("empty", {"notes.txt": "x"}), *p.key), "empty: a directory with no .yaml, .yml or .json file (-R"),
    "review-spec-a-string": Row(
        lambda p: review("-f", p.file("j.yaml", job_with(spec="oops")), *p.key),
        "j.yaml: document 1: spec: must be a mapping, found the string 'oops'"),
    "review-list-whose-items-is-a-mapping": Row(
        lambda p: review("-f", p.file("l.yaml", "apiVersion: v1\nkind: List\nitems: {a: 1}\n"), *p.key),
        "l.yaml: document 1: kind List: items: must be a list, found a mapping"),
    "review-joblist-whose-items-is-a-string": Row(
        lambda p: review("-f", p.file("l.yaml", "---\napiVersion: batch/v1\nkind: JobList\nitems: oops\n"), *p.key),
        "l.yaml: document 1: kind JobList: items: must be a list, found the string 'oops'"),
    "review-containers-not-a-list": Row(
        lambda p: review("-f", p.file("j.yaml", job_with(spec__template__spec__containers={"a": 1})), *p.key),
        "spec.template.spec.containers: must be a list, found a mapping"),
    "review-labels-a-list": Row(
        lambda p: review("-f", p.file("j.yaml", job_with(metadata__labels=["a"])), *p.key), "metadata.labels: must be a mapping, found a list"),
    "review-body-over-the-webhook-limit": Row(
        lambda p: review("-f", p.file("big.yaml", job_with(metadata__annotations={"x": "y" * 5_000_000})), *p.key),
        "big.yaml: document 1: its AdmissionReview would be 5000"),
    "review-bad-quantity": Row(
        lambda p: review("-f", p.file("q.yaml", JOB.replace("nvidia.com/gpu: 1", "cpu: '1000,'")), *p.key),
        "limits[cpu]: '1000,' is not a valid quantity"),
    "review-not-yaml": Row(lambda p: review("-f", p.file("y.yaml", "kind: [\n"), *p.key), "y.yaml: not valid YAML: line 2, column 1"),
    "review-no-api-version": Row(lambda p: review("-f", p.file("a.yaml", "kind: Job\n"), *p.key), "a.yaml: document 1: apiVersion is missing"),
    "review-empty-stdin": Row(lambda p: review("-f", "-", *p.key), "kratos-admit: <stdin>: no Kubernetes object in the input"),
    "review-short-signing-key": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), "--signing-key", p.file("short.key", "short")), "at least 32 bytes"),
    "review-integer-workload-label-is-a-denial": Row(
        lambda p: review("-f", p.file("five.yaml", job_with(metadata__labels={"gpu.scheduler.io/workload": 5})), *p.key),
        "denied: Job/vector-add: metadata.labels[gpu.scheduler.io/workload]: 5 (a number, not a string) must be a DNS-1123 label",
        status=ExitStatus.DENIED),
    # configuration, as every command reads it
    "config-capabilities-not-yaml": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), *p.key),
        "KRATOS_PROFILING_CAPABILITIES: '[PERFMON' is not valid YAML", env={"KRATOS_PROFILING_CAPABILITIES": "[PERFMON"}),
    "config-unknown-variable": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), *p.key), "KRATOS_BOGUS_KEY: no such setting", env={"KRATOS_BOGUS_KEY": "1"}),
    "config-unknown-key": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), "--config", p.file("c.yaml", "maxGpusPerPd: 4\n"), *p.key),
        "c.yaml: maxGpusPerPd: no such setting (did you mean maxGpusPerPod?)"),
    "config-bad-value": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), "--config", p.file("c.yaml", "scheduler: slurm\n"), *p.key),
        "c.yaml: scheduler: 'slurm' given, must be one of default, kai, volcano"),
    "config-is-a-directory": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), "--config", str(p.tmp), *p.key), "is a directory; --config expects a YAML file"),
    "config-missing": Row(
        lambda p: review("-f", str(EXAMPLES / "vector-add-job.yaml"), "--config", str(p.tmp / "c.yaml"), *p.key), "c.yaml: cannot read: No such file"),
    # placement
    "placement-profile-is-a-job": Row(lambda p: ["placement", "-p", str(EXAMPLES / "vector-add-job.yaml")],
                                      "vector-add-job.yaml: document 1 is a Job; -p expects a file holding one WorkloadProfile"),
    "placement-profile-missing": Row(lambda p: ["placement", "-p", str(p.tmp / "p.yaml")], "p.yaml: cannot read: No such file"),
    "placement-two-profiles": Row(
        lambda p: ["placement", "-p", p.file("two.yaml", PROFILE + "---\n" + PROFILE.replace("workload: vector-add", "workload: other"))],
        "two.yaml: must hold exactly one WorkloadProfile, holds 2"),
    "placement-nodes-holding-a-pod": Row(
        lambda p: ["placement", "-p", str(EXAMPLES / "profiles" / "vector-add-profile.yaml"), "--nodes",
                   p.file("pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")],
        "pod.yaml: document 1 is a Pod; --nodes expects"),
    # test
    "test-no-suite": Row(lambda p: ["test", p.dir("nothing", {"a.yaml": JOB})], "nothing: holds no kratos-test.yaml"),
    "test-unknown-field": Row(
        lambda p: ["test", p.file("s/kratos-test.yaml", SUITE + "manifests: [a.yaml]\nresults: [{kind: Job, name: a}]\nprofile: p\n")],
        "kratos-test.yaml: profile: no such field (did you mean profiles?)"),
    "test-expectation-unknown-action": Row(
        lambda p: ["test", p.file("s/kratos-test.yaml", SUITE + "manifests: [a.yaml]\nresults: [{kind: Job, name: a, action: hint}]\n")],
        "kratos-test.yaml: results[0].action: 'hint' given, must be one of hints, profiling, none"),
    "test-missing-manifest": Row(
        lambda p: ["test", p.file("s/kratos-test.yaml", SUITE + "manifests: [gone.yaml]\nresults: [{kind: Job, name: a}]\n")],
        "s/gone.yaml: cannot read: No such file"),
    "test-suite-not-a-mapping": Row(lambda p: ["test", p.file("s/kratos-test.yaml", "- a\n")], "kratos-test.yaml: must be a mapping"),
    # webhook
    "webhook-port-in-use": Row(
        lambda p: ["webhook", "--listen", f"127.0.0.1:{p.busy_port}", *p.tls, *p.key, "--profiles", str(EXAMPLES / "profiles")],
        "cannot listen on 127.0.0.1:{busy}: address already in use", process=True),
    "webhook-workers-port-in-use": Row(
        lambda p: ["webhook", "--workers", "2", "--listen", f"127.0.0.1:{p.busy_port}", *p.tls, *p.key, "--profiles", str(EXAMPLES / "profiles")],
        "cannot listen on 127.0.0.1:{busy}: address already in use", process=True),
    "webhook-metrics-port-in-use": Row(
        lambda p: ["webhook", "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen", f"127.0.0.1:{p.busy_port}", *p.tls, *p.key,
                   "--profiles", str(EXAMPLES / "profiles")],
        "cannot listen on 127.0.0.1:{busy}: address already in use", process=True),
    "webhook-no-tls": Row(lambda p: ["webhook", "--profiles", str(EXAMPLES / "profiles")], "--tls-cert and --tls-key are required"),
    "webhook-bad-listen": Row(lambda p: ["webhook", "--listen", "nowhere", *p.tls], "kratos-admit: --listen: listen: 'nowhere' is not HOST:PORT"),
    "webhook-api-server-unreachable": Row(
        lambda p: ["webhook", "--listen", f"127.0.0.1:{free_port()}", *p.tls, *p.key, "--kubeconfig", str(p.unreachable)],
        "cannot reach the API server at https://127.0.0.1:", process=True),
    # controller
    "controller-api-server-unreachable": Row(
        lambda p: ["controller", *p.key, "--kubeconfig", str(p.unreachable)], "cannot reach the API server at https://127.0.0.1:", process=True),
    "controller-no-signing-key": Row(lambda p: ["controller", "--kubeconfig", str(p.unreachable)], "the controller needs --signing-key FILE"),
    "controller-kubeconfig-missing": Row(
        lambda p: ["controller", *p.key, "--kubeconfig", str(p.tmp / "kc")], "kubeconfig", process=True),
    # certs
    "certs-inject-api-server-unreachable": Row(
        lambda p: ["certs", "inject", "--ca", str(p.certs / "ca.crt"), "--kubeconfig", str(p.unreachable)],
        "cannot reach the API server at https://127.0.0.1:"),
    "certs-inject-ca-not-a-certificate": Row(
        lambda p: ["certs", "inject", "--ca", p.file("ca.crt", "hello"), "--kubeconfig", str(p.unreachable)], "ca.crt: not a PEM certificate"),
    "certs-inject-ca-not-a-ca": Row(
        lambda p: ["certs", "inject", "--ca", str(p.certs / "tls.crt"), "--kubeconfig", str(p.unreachable)], "tls.crt: is not a CA certificate"),
    "certs-generate-force-over-a-ca": Row(
        lambda p: ["certs", "generate", "--service", "s", "--namespace", "n", "--out", str(p.certs), "--force"],
        "holds ca.crt and signing.key, which --force no longer replaces"),
    "certs-rotate-without-a-ca": Row(lambda p: ["certs", "rotate", "--dir", p.dir("none", {})], "none"),
    # release
    "release-api-server-unreachable": Row(
        lambda p: ["release", "-A", "--kubeconfig", str(p.unreachable)], "cannot reach the API server at https://127.0.0.1:"),
}  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    generate(service="kratos-webhook", namespace="kratos-system", out=out)
    return out


@pytest.fixture
def place(tmp_path: Path, certs: Path) -> Iterator[Place]:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        closed = free_port()  # nothing listens there: connecting is refused at once
        unreachable = kubeconfig_for(f"https://127.0.0.1:{closed}", tmp_path / "unreachable.kubeconfig")
        yield Place(tmp_path, certs, unreachable, busy.getsockname()[1])


def answer(row: Row, place: Place, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    argv = row.argv(place)
    if row.process:
        env = {k: val for k, val in os.environ.items() if not k.startswith("KRATOS_")} | (row.env or {})
        done = subprocess.run([sys.executable, "-m", "kratos_admit", *argv], capture_output=True, text=True,
                              env=env, cwd=REPO, timeout=60, check=False)  # fmt: skip
        return done.returncode, done.stdout, done.stderr
    for name, value in (row.env or {}).items():
        monkeypatch.setenv(name, value)
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, stdout=out, stderr=err, stdin=io.StringIO(""))
    return int(status), out.getvalue(), err.getvalue()


def test_the_table_covers_every_command_with_thirty_inputs_or_more():
    commands = {name.split("-")[0] for name in ROWS}
    assert commands == {"review", "config", "placement", "test", "webhook", "controller", "certs", "release"}
    assert len(ROWS) >= 30


@pytest.mark.parametrize("name", list(ROWS))
def test_a_bad_input_gets_its_exit_status_and_one_line_naming_the_culprit(
    name: str, place: Place, monkeypatch: pytest.MonkeyPatch
):
    row = ROWS[name]
    status, out, err = answer(row, place, monkeypatch)
    lines = err.splitlines()
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert row.culprit.format(busy=place.busy_port) in lines[0]
    assert status == row.status, err
    if status == ExitStatus.UNUSABLE:
        assert lines[0].startswith("kratos-admit: ") and out == ""


@pytest.mark.parametrize(
    ("argv", "usage", "error"),
    [
        pytest.param(["review", "-f", "x.yaml", "--bogus"], "usage: kratos-admit review", "unrecognized arguments: --bogus", id="review-unknown-flag"),
        pytest.param(["review"], "usage: kratos-admit review", "the following arguments are required: -f/--filename", id="review-no-file"),
        pytest.param(["review", "-f", "x.yaml", "-o", "xml"], "usage: kratos-admit review", "argument -o/--output: invalid choice: 'xml'", id="review-bad-output"),
        pytest.param(["placement", "-n", "x"], "usage: kratos-admit placement", "one of the arguments -p/--profile --summary is required", id="placement"),
        pytest.param(["certs", "inject"], "usage: kratos-admit certs inject", "the following arguments are required: --ca", id="certs-inject"),
        pytest.param(["test", "a", "b"], "usage: kratos-admit test", "unrecognized arguments: b", id="test-two-dirs"),
        pytest.param(["webhook", "--workers", "two"], "usage: kratos-admit webhook", "argument --workers: invalid int value: 'two'", id="webhook-workers"),
    ],
)  # fmt: skip
def test_an_argument_error_shows_the_subcommands_usage_then_one_line(argv: list[str], usage: str, error: str):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, stdout=out, stderr=err)
    assert status == ExitStatus.UNUSABLE and out.getvalue() == ""
    text = err.getvalue()
    assert text.startswith(usage), text
    *usage_lines, last = text.splitlines()
    assert error in last and all(error not in line for line in usage_lines)


def test_a_list_on_stdin_whose_items_is_not_a_list_is_refused_in_one_line_not_echoed():
    """Issue 23: `review -f -` echoed such a document and exited 0."""
    out, err = io.StringIO(), io.StringIO()
    status = main(
        ["review", "-f", "-"],
        stdout=out,
        stderr=err,
        stdin=io.StringIO("apiVersion: v1\nkind: List\nitems: {a: 1}\n"),
    )
    assert status == ExitStatus.UNUSABLE
    assert out.getvalue() == ""
    assert (
        err.getvalue()
        == "kratos-admit: <stdin>: document 1: kind List: items: must be a list, found a mapping\n"
    )


# --- a reader that stops early (issue 60) ------------------------------------------------------------

PLACEMENT = ["placement", "-p", str(EXAMPLES / "profiles" / "embed-server-profile.yaml"), "--nodes", NODES]
REVIEW_ALL = ["review", "-f", str(EXAMPLES), "--profiles", str(EXAMPLES / "profiles"), "--nodes", NODES]


@pytest.mark.parametrize("argv", [PLACEMENT, [*REVIEW_ALL, "-o", "json"]], ids=["placement", "review-json"])
def test_a_closed_pipe_ends_the_command_quietly_with_status_141(argv):
    """`... | head -1` made deterministic: the pipe's reading end is closed before the command writes,
    so every write meets a broken pipe. No traceback, nothing on stderr but the command's own notes,
    and 128 + SIGPIPE as a shell reports a command a closed pipe ended."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kratos_admit", *argv],
            check=False,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            timeout=60,
        )
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def test_head_takes_the_first_line_and_the_command_says_nothing_more():
    command = " ".join([sys.executable, "-m", "kratos_admit", *PLACEMENT, "| head -1"])
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.stdout.startswith("profile team-a/embed-server-profile") and done.stdout.count("\n") == 1
    assert done.stderr == "", done.stderr
    assert done.returncode in (0, 141)
