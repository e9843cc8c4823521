"""`kratos-admit webhook` in cluster mode, as a process, against the Kubernetes API test double."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kratos_admit.domain import vocabulary as v
from kratos_admit.webhook.certs import generate
from tests.builders import make_job
from tests.harness import (
    HOSTNAME,
    NODES,
    PROFILES,
    REPO,
    double_in_thread,
    free_port,
    kubeconfig_for,
    node,
    profile,
    review_of,
)
from tests.kube_double import WEBHOOK, KubeDouble


def post(port: int, context: ssl.SSLContext, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/mutate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Host": HOSTNAME},
    )
    with urllib.request.urlopen(request, context=context, timeout=5) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def wait_ready(port: int, context: ssl.SSLContext, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"webhook exited: {process.stderr.read().decode() if process.stderr else ''}")
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    pytest.fail("webhook never became ready")


def test_cluster_mode_serves_hints_from_the_watched_profiles(tmp_path: Path):
    kube = KubeDouble()
    kube.put(*PROFILES, profile("vector-add"))
    kube.put(*NODES, node("gpu-a", "NVIDIA-A100-SXM4-80GB"))
    generate(service="kratos-webhook", namespace="kratos-system", out=tmp_path / "certs")
    context = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
    context.check_hostname = False
    port = free_port()
    with double_in_thread(kube) as url:
        process = subprocess.Popen(
            [sys.executable, "-m", "kratos_admit", "webhook", "--listen", f"127.0.0.1:{port}",
             "--tls-cert", str(tmp_path / "certs" / "tls.crt"), "--tls-key", str(tmp_path / "certs" / "tls.key"),
             "--signing-key", str(tmp_path / "certs" / "signing.key"),
             "--kubeconfig", str(kubeconfig_for(url, tmp_path / "kubeconfig", WEBHOOK))],
            cwd=REPO, env={**os.environ, "KUBERNETES_SERVICE_HOST": ""}, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            wait_ready(port, context, process)
            answer = post(port, context, review_of(make_job().obj()))["response"]
            patch = json.loads(base64.b64decode(answer["patch"]))
            preferred = next(op for op in patch if op["path"] == "/spec/template/spec/affinity")["value"][
                "nodeAffinity"
            ]
            assert preferred["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"][
                "matchExpressions"
            ][0]["values"] == ["NVIDIA-A100-SXM4-80GB"]
            # a profile the controller has just written is used by the very next admission
            kube.put(*PROFILES, profile("nbody", bound="compute"))
            answer = post(port, context, review_of(make_job("nbody").obj()))["response"]
            assert answer.get("patchType") == "JSONPatch"
            annotations = json.loads(base64.b64decode(answer["patch"]))[0]["value"]
            assert annotations[v.PROFILE_ANNOTATION].startswith("nbody-profile@")
        finally:
            process.terminate()
            assert process.wait(timeout=30) == 0


def test_cluster_mode_refuses_the_development_key(tmp_path: Path):
    generate(service="kratos-webhook", namespace="kratos-system", out=tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "kratos_admit", "webhook", "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "no signing key" in result.stderr


def test_cluster_mode_without_credentials_says_so(tmp_path: Path):
    generate(service="kratos-webhook", namespace="kratos-system", out=tmp_path)
    env = {k: val for k, val in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "kratos_admit", "webhook", "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key"),
         "--signing-key", str(tmp_path / "signing.key")],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert "no cluster credentials" in result.stderr and "Traceback" not in result.stderr
