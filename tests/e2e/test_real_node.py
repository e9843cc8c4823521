"""The second end-to-end tier: KRATOS as users run it, on one real node (issue 30).

Runs when ``KRATOS_E2E_KUBECONFIG`` names an admin kubeconfig of a cluster with a real node (a kubelet
with containerd and runc, fake GPUs advertised on it, a RuntimeClass ``nvidia``) and
``KRATOS_E2E_REAL_NODE`` names a local Debian 12 image with python3 and python3-venv to build from
(e.g. ``localhost/debian-python:bookworm``); podman builds the images and ``CONTAINERD_ADDRESS``
names the node's containerd, into which they are loaded. Skipped otherwise, and never beside the
first tier (both install into ``kratos-system``).

In order, each a test: (1) both images built from the repository with the commands of
docs/install.md "Building the images", loaded into the node; (2) the README's install, steps 2 and 3
run literally, then the webhook and controller Ready as Pods of those images, under their
ServiceAccounts, read-only and non-root, and the API server calling the webhook through its Service;
(3) both profiling forms with the real Nsight Compute (Debian's, in the runner image) on fake GPUs:
the README's step 4 (the example vectorAdd Job, staged) and a ``python train.py`` Job (in-image),
each profiling run failing in ncu's own words, the profile Failed saying so, and the execution Job
running the user's command in the user's image; (4) an upgrade to a second image tag while Jobs are
created at a steady rate; (5) the uninstall of docs/operations.md, each command exiting 0.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from kratos_admit.domain import vocabulary as v
from tests.e2e.real_cluster import Telemetry, admin_api, kubectl
from tests.e2e.real_node import (
    ADMIT_IMAGE,
    NAMESPACE,
    RUNNER_IMAGE,
    TAGS,
    TRAIN_IMAGE,
    USERS,
    Obj,
    SteadyCreates,
    Tier,
    build_images,
    chart_values,
    documented_uninstall,
    finished_in,
    helm_config,
    metric_histogram,
    pods,
    profile_status,
    quantiles,
    readme_install,
    readme_steps,
    running_pod,
    sh,
    train_job,
    until,
    why_not,
    working_copy,
)
from tests.harness import MEMORY_BOUND, REPO

pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    yield working_copy(tmp_path_factory)
    kubectl("delete", "namespace", USERS, "--ignore-not-found", "--wait=false", check=False)


# --- 1. images ---------------------------------------------------------------------------------


def test_1_both_images_build_from_the_repository_and_load_into_the_node(tier: Tier):
    build_images(tier)
    admit, runner = ADMIT_IMAGE, RUNNER_IMAGE
    for image in (admit, runner):
        size = sh(f"podman image inspect {image} --format '{{{{.Size}}}}'", tier).stdout.strip()
        tier.figures[f"size {image}"] = f"{int(size) / 1e6:.0f} MB"
    # the image as the Deployments run it: read-only, uid 65532
    out = sh(f"podman run --rm --network none --read-only --user 65532:65532 {admit} --help", tier).stdout
    assert "usage: kratos-admit" in out
    assert (
        "Version 2022.3"
        in sh(f"podman run --rm --network none --entrypoint ncu {runner} --version", tier).stdout
    )
    # the upgrade's second tag, and the users' images: the example's CUDA sample path with a real
    # executable, and a Debian Python image with train.py
    # the in-image tools tree in an image with no Python and no shell: only the C library, the dynamic
    # loader, libgcc_s and libz (what docs/install.md says a user's image needs for the in-image form)
    glibc = tier.work / "glibc-only"
    for library in ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1",
                    "libgcc_s.so.1", "libz.so.1"):  # fmt: skip
        (glibc / "lib" / "x86_64-linux-gnu").mkdir(parents=True, exist_ok=True)
        shutil.copy(Path("/lib/x86_64-linux-gnu") / library, glibc / "lib" / "x86_64-linux-gnu" / library)
    (glibc / "lib64").mkdir(exist_ok=True)
    shutil.copy("/lib64/ld-linux-x86-64.so.2", glibc / "lib64" / "ld-linux-x86-64.so.2")
    sh(f"tar -C {glibc} -c . | podman import -q - localhost/glibc-only:test > /dev/null", tier)
    sh(
        "podman volume rm -f kratos-tools-test > /dev/null; podman volume create kratos-tools-test > /dev/null",
        tier,
    )
    sh(
        f"podman run --rm --network none -v kratos-tools-test:/kratos/tools --entrypoint sh {runner} -c 'cp -RP /opt/kratos/tools/. /kratos/tools/'",
        tier,
    )
    tools = sh(
        "podman run --rm --network none --read-only -v kratos-tools-test:/kratos/tools localhost/glibc-only:test /kratos/tools/nsight-compute/ncu --version",
        tier,
    ).stdout
    assert "Version 2022.3" in tools, tools
    assert (
        "usage: kratos-runner"
        in sh(
            "podman run --rm --network none --read-only --tmpfs /tmp -v kratos-tools-test:/kratos/tools localhost/glibc-only:test /kratos/tools/kratos-runner --help",
            tier,
        ).stdout
    )
    print("images:", json.dumps(tier.figures))
    tier.done.add("images")


# --- 2. the README's install -------------------------------------------------------------------


def test_2_the_readmes_install_runs_literally_and_kratos_runs_as_pods_of_those_images(tier: Tier):
    tier.need("images")
    readme_install(tier)
    for deployment, account in (
        ("kratos-webhook", "kratos-webhook"),
        ("kratos-controller", "kratos-controller"),
    ):
        running = pods(NAMESPACE, f"app.kubernetes.io/name={deployment}")
        assert len(running) == 2, [p["metadata"]["name"] for p in running]
        for pod in running:
            spec, status = pod["spec"], pod["status"]
            assert spec["serviceAccountName"] == account and spec["enableServiceLinks"] is False
            [container] = spec["containers"]
            assert container["image"] == f"localhost/kratos-admit:{TAGS[0]}"
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            ready = {c["type"]: c for c in status["conditions"]}["Ready"]
            assert ready["status"] == "True", status
            started = time.mktime(time.strptime(pod["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
            became = time.mktime(time.strptime(ready["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ"))
            tier.figures.setdefault(f"start to Ready {deployment} s", []).append(round(became - started))
        # the process really runs as 65532 in the container
        name = running[0]["metadata"]["name"]
        assert (
            kubectl(
                "-n", NAMESPACE, "exec", name, "--", "python3", "-c", "import os; print(os.getuid())"
            ).strip()
            == "65532"
        )
    # the API server calls the webhook through its Service: a labelled namespace's Job is mutated
    kubectl("delete", "namespace", "kratos-probe", "--ignore-not-found", "--timeout=120s")
    kubectl("create", "namespace", "kratos-probe")
    kubectl("label", "namespace", "kratos-probe", f"{v.NAMESPACE_LABEL}=enabled")
    probe = yaml.safe_load((REPO / "examples" / "vector-add-job.yaml").read_text())
    probe["metadata"]["namespace"] = "kratos-probe"
    created = json.loads(
        kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=yaml.safe_dump(probe))
    )
    assert v.HINTS_ANNOTATION in created["metadata"]["annotations"], "mutated by the webhook Pods"
    # a burst of creates, 8 at a time, and the API server's own webhook latency histogram over it
    before = metric_histogram()
    started = time.monotonic()
    admitted = asyncio.run(burst(probe, 400, 8))
    seconds = time.monotonic() - started
    p50, p99 = quantiles(before, metric_histogram())
    tier.figures["burst"] = (
        f"{admitted} dry-run creates in {seconds:.1f} s; webhook p50 <= {p50 * 1000:g} ms, p99 <= {p99 * 1000:g} ms"
    )
    assert admitted == 400
    kubectl("delete", "namespace", "kratos-probe", "--wait=false")
    service_links_never_stop_the_pods(tier)
    print("install:", json.dumps(tier.figures))
    tier.done.add("install")


def service_links_never_stop_the_pods(tier: Tier) -> None:
    """Issue 33: with service links on (a manifest of one's own that leaves out enableServiceLinks:
    false), the kubelet gives both containers KRATOS_WEBHOOK_*, KRATOS_WEBHOOK_METRICS_* and a user's
    KRATOS_FOO_* variables, and both Deployments still roll out Ready; then back as shipped."""
    metrics = (REPO / "webhook-config" / "components" / "prometheus" / "metrics-services.yaml").read_text()
    foo = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kratos-foo", "namespace": NAMESPACE},
           "spec": {"selector": {"app": "nothing"}, "ports": [{"name": "http", "port": 8080}]}}  # fmt: skip
    kubectl("apply", "-f", "-", stdin=metrics + "\n---\n" + yaml.safe_dump(foo))

    def links(on: bool) -> None:
        for name in ("kratos-webhook", "kratos-controller"):
            patch = {"spec": {"template": {"spec": {"enableServiceLinks": on}}}}
            kubectl("-n", NAMESPACE, "patch", "deployment", name, "--type=merge", "-p", json.dumps(patch))
        sh(
            f"kubectl -n {NAMESPACE} rollout status deploy/kratos-webhook deploy/kratos-controller --timeout=180s",
            tier,
            timeout=200,
        )

    try:
        links(True)
        for name in ("kratos-webhook", "kratos-controller"):
            pod = pods(NAMESPACE, f"app.kubernetes.io/name={name}")[0]["metadata"]["name"]
            env = kubectl(
                "-n", NAMESPACE, "exec", pod, "--", "python3", "-c", "import os; print(sorted(os.environ))"
            )
            for variable in (
                "KRATOS_WEBHOOK_PORT",
                "KRATOS_WEBHOOK_METRICS_SERVICE_HOST",
                "KRATOS_FOO_PORT_8080_TCP",
            ):
                assert variable in env, (name, variable, env)
    finally:
        links(False)
        kubectl(
            "-n",
            NAMESPACE,
            "delete",
            "service",
            "kratos-foo",
            "kratos-webhook-metrics",
            "kratos-controller-metrics",
            "--ignore-not-found",
        )


async def burst(job: Obj, count: int, parallel: int) -> int:
    """``count`` server-side dry-run creates of ``job``, ``parallel`` at a time; how many were admitted."""
    admitted = 0
    async with admin_api() as api:
        batch = client.BatchV1Api(api)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(count):
            queue.put_nowait(i)

        async def worker() -> None:
            nonlocal admitted
            while not queue.empty():
                i = queue.get_nowait()
                body: Any = {**job, "metadata": {**job["metadata"], "name": f"burst-{i}"}}
                await batch.create_namespaced_job(job["metadata"]["namespace"], body, dry_run="All")
                admitted += 1

        await asyncio.gather(*(worker() for _ in range(parallel)))
    return admitted


# --- 3. both profiling forms with the real Nsight Compute ---------------------------------------


def job_status(name: str) -> Obj | None:
    found = kubectl("-n", USERS, "get", "job", name, "-o", "json", "--ignore-not-found")
    return json.loads(found) if found.strip() else None


def finished(name: str) -> Obj | None:
    job = job_status(name)
    if job is None:
        return None
    conditions = {c["type"]: c["status"] for c in job["status"].get("conditions", [])}
    return job if conditions.get("Complete") == "True" or conditions.get("Failed") == "True" else None


def events_for(kind: str, name: str) -> list[str]:
    listed = json.loads(kubectl("-n", USERS, "get", "events", "-o", "json"))["items"]
    return [
        e.get("reason", "")
        for e in listed
        if e["involvedObject"]["kind"] == kind and e["involvedObject"]["name"] == name
    ]


def profiled_then_executed(tier: Tier, job: str, workload: str, container: str, expected_log: str) -> Obj:
    """The profiling run of ``job`` really ran and failed in ncu's words; the profile says so; the
    execution Job ran the user's command in the user's image."""
    until(lambda: finished(job), timeout=240, what=f"the profiling Job {job} finished")
    [pod] = pods(USERS, f"job-name={job}")
    log = kubectl("-n", USERS, "logs", pod["metadata"]["name"], "-c", "profiling-runner")
    assert "Nsight Compute failed to connect to the CUDA driver" in log or "no CUDA-capable device" in log, (
        log
    )
    assert "No metrics to collect" not in log, log
    summary = json.loads(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert summary["ncuSet"] == "default" and summary["ncuVersion"].startswith("2022.3"), summary
    assert summary["failure"] == "no-gpu", summary
    profile = until(
        lambda: (p := json.loads(kubectl("-n", USERS, "get", "workloadprofile", f"{workload}-profile", "-o", "json",
                                         "--ignore-not-found") or "null")) and p.get("status", {}).get("phase") == "Failed" and p,
        timeout=120, what=f"the profile of {workload} Failed",
    )  # fmt: skip
    assert "CUDA driver" in profile["status"]["message"] or "CUDA-capable" in profile["status"]["message"], (
        profile
    )
    assert profile["status"]["failure"] == "no-gpu", profile["status"]
    conditions = [(c["type"], c["status"], c["reason"]) for c in profile["status"]["conditions"]]
    assert conditions == [("Failed", "True", "NoGpu")], conditions
    execution = f"{job}-execution"
    done = until(lambda: finished(execution), timeout=240, what=f"the execution Job {execution} finished")
    assert done["status"].get("succeeded") == 1, done["status"]
    [run] = pods(USERS, f"job-name={execution}")
    assert run["spec"]["containers"][0]["name"] == container
    assert expected_log in kubectl("-n", USERS, "logs", run["metadata"]["name"], "-c", container)
    reasons = events_for("Job", job)
    assert "ProfileFailed" in reasons and "ExecutionJobCreated" in reasons, reasons
    return pod


def test_3_both_profiling_forms_run_the_real_nsight_compute_and_the_user_command_runs_after(tier: Tier):
    tier.need("install")
    steps = readme_steps()
    # the README's step 4, but for its two watch/read lines, which wait for a person
    literal = "\n".join(
        line
        for line in steps[4].splitlines()
        if " -w " not in line and "jsonpath" not in line and "get workloadprofiles" not in line
    )
    sh(literal, tier)
    staged = profiled_then_executed(tier, "vector-add", "vector-add", "vector-add", "Test PASSED")
    assert [c["name"] for c in staged["spec"]["initContainers"]][-1] == "stage-workload"
    hints = sh(
        "kubectl -n team-a get job vector-add-execution -o jsonpath='{.metadata.annotations.gpu\\.scheduler\\.io/hints}'",
        tier,
    ).stdout
    assert json.loads(hints), "the README's last line shows the hints record"
    train = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": USERS, "labels": {v.WORKLOAD_LABEL: "train"}},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [{
            "name": "train", "image": TRAIN_IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["python", "train.py", "--epochs", "1"], "workingDir": "/workspace",
            "resources": {"limits": {"nvidia.com/gpu": 1}},
        }]}}},
    }  # fmt: skip
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(train))
    in_image = profiled_then_executed(tier, "train", "train", "train", "training --epochs 1")
    assert [c["name"] for c in in_image["spec"]["initContainers"]] == ["stage-profiler"]
    stage = in_image["status"]["initContainerStatuses"][0]["state"]["terminated"]
    copy = time.mktime(time.strptime(stage["finishedAt"], "%Y-%m-%dT%H:%M:%SZ")) - time.mktime(
        time.strptime(stage["startedAt"], "%Y-%m-%dT%H:%M:%SZ")
    )
    tier.figures["stage-profiler copy s (1 s resolution)"] = copy
    print("profiling forms:", json.dumps(tier.figures))
    tier.done.add("profiling")


def test_3b_the_runner_image_names_every_failure_class_from_the_real_programs_words(tier: Tier):
    """Issue 31: the runner in its image classifies the real ncu 2022.3 outputs (tests/data/ncu-2022.3)
    and the program's own strings (tests/test_runner_failures.py) as the unit tests do."""
    tier.need("install")
    texts = {
        p.name: p.read_text()
        for p in (REPO / "tests" / "data" / "ncu-2022.3").glob("*.txt")
        if p.name != "list-sets.txt"
    }
    script = (
        "import json, os\nfrom kratos_runner.failures import classify\n"
        "print(json.dumps({n: classify(open('/texts/' + n).read())[0] for n in sorted(os.listdir('/texts')) if n.endswith('.txt')}))\n"
    )
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ncu-texts", "namespace": USERS},
        "data": texts,
    }
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "classify", "namespace": USERS},
        "spec": {"restartPolicy": "Never", "tolerations": [{"operator": "Exists"}], "containers": [{
            "name": "runner", "image": f"localhost/kratos-nsight-compute-poc:{TAGS[0]}", "imagePullPolicy": "IfNotPresent",
            "command": ["python3", "-c", script], "volumeMounts": [{"name": "texts", "mountPath": "/texts"}],
        }], "volumes": [{"name": "texts", "configMap": {"name": "ncu-texts"}}]},
    }  # fmt: skip
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([config, pod]))
    until(
        lambda: json.loads(kubectl("-n", USERS, "get", "pod", "classify", "-o", "json"))["status"].get("phase") == "Succeeded",
        timeout=120, what="the classify Pod ran",
    )  # fmt: skip
    classes = json.loads(kubectl("-n", USERS, "logs", "classify").strip().splitlines()[-1])
    assert classes == {
        "missing-program.txt": "cannot-start",
        "no-driver.txt": "no-gpu",
        "static-program-no-kernels.txt": "no-kernels",
        "unknown-option-value.txt": "ncu-error",
    }
    print("runner image classes:", classes)


def gpu_node() -> tuple[str, str, str]:
    """The real node's name, InternalIP and GPU product label."""
    node = json.loads(kubectl("get", "nodes", "-l", "nvidia.com/gpu.present=true", "-o", "json"))["items"][0]
    address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    return node["metadata"]["name"], address, node["metadata"]["labels"]["nvidia.com/gpu.product"]


def measured_by(url: str, namespace: str, tier: Tier) -> None:
    """The controller pointed at the Prometheus at ``url`` (a 60 s window, rolled out), and
    ``namespace`` made and opted in."""
    sh(
        f"kubectl -n {NAMESPACE} set env deploy/kratos-controller KRATOS_TELEMETRY=\"{{prometheusURL: '{url}', windowSeconds: 60}}\"",
        tier,
    )
    sh(f"kubectl -n {NAMESPACE} rollout status deploy/kratos-controller --timeout=180s", tier, timeout=200)
    kubectl("create", "namespace", namespace)
    kubectl("label", "namespace", namespace, f"{v.NAMESPACE_LABEL}=enabled")


def measured_run(telemetry: Telemetry, namespace: str, job: str, workload: str) -> Obj:
    """``job`` run to its end with the dcgm-exporter stand-in serving its Pod's GPUs, then the
    status of ``workload``'s profile once it is Ready from telemetry."""
    running = until(lambda: running_pod(namespace, job), timeout=240, what=f"{job} runs")
    telemetry.dcgm.attach(running)
    until(lambda: finished_in(namespace, job), timeout=240, what=f"{job} finished")
    telemetry.dcgm.detach(namespace, running["metadata"]["name"])
    status: Obj = until(
        lambda: (s := profile_status(namespace, workload)).get("source") == "telemetry" and s,
        timeout=180, what=f"the profile of {workload} Ready from telemetry",
    )  # fmt: skip
    return status


def test_3c_a_workload_whose_profiling_met_no_gpu_learns_from_the_execution_runs_dcgm_counters(
    tier: Tier, tmp_path: Path
):
    """Issue 31 on the real node: the controller (a Pod) pointed at a real Prometheus that scrapes a
    dcgm-exporter stand-in for the node; the runner image's real ncu fails (no-gpu on a node that has
    GPUs); the execution Job's Pod is measured; the profile turns Ready from telemetry, keeping why
    profiling failed; the workload's next Job gets ranked hints."""
    tier.need("install")
    name, address, product = gpu_node()
    namespace = "team-learn"
    with Telemetry(tmp_path, nodes={name: product}, host=address) as telemetry:
        telemetry.dcgm.serve(namespace, dict(MEMORY_BOUND))
        measured_by(telemetry.url, namespace, tier)
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump(train_job("learn", namespace, seconds=12)))
        until(lambda: finished_in(namespace, "learn"), timeout=240, what="the profiling Job learn finished")
        status = measured_run(telemetry, namespace, "learn-execution", "learn")
        assert (status["phase"], status["boundType"], status["failure"]) == ("Ready", "memory", "no-gpu"), (
            status
        )
        assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
            ("Failed", "False", "NoGpu")
        ]
        created = json.loads(
            kubectl("create", "-o", "json", "-f", "-", stdin=yaml.safe_dump(train_job("learn-2", namespace)))
        )
        hints = json.loads(created["metadata"]["annotations"][v.HINTS_ANNOTATION])
        assert hints["ranked"] and hints["ranked"][0]["product"] == product, hints
        assert created["metadata"]["labels"].get(v.ROLE_LABEL) != "profiling"
        print(f"telemetry on the real node: profile {status['phase']} from {status['source']} ({status['message']}); "
              f"failure kept: {status['failure']}; next Job ranked {[r['product'] for r in hints['ranked']]}")  # fmt: skip
    sh(f"kubectl -n {NAMESPACE} set env deploy/kratos-controller KRATOS_TELEMETRY-", tier)
    kubectl("delete", "namespace", namespace, "--wait=false")


def test_3d_a_gangs_link_counters_become_its_interconnect_share(tier: Tier, tmp_path: Path):
    """Issue 50 on the real node: a Job on 2 GPUs (a gang, admitted as written) runs; the real
    Prometheus scrapes the dcgm-exporter stand-in serving its GPUs' counters, NVLink's and PCIe's
    among them; the controller (a Pod) folds them in and the profile is Ready from telemetry with the
    interconnect share the same counters give offline."""
    from kratos_admit.model.catalog import load_catalog
    from kratos_admit.model.telemetry import TelemetryRun, with_telemetry

    tier.need("install")
    name, address, product = gpu_node()
    entry = load_catalog().placement(product)
    assert entry is not None and entry.link(2) is not None, f"{product}: no link figure in the catalog"
    link_gbs = entry.link(2).gbs  # type: ignore[union-attr]
    counters = {
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.45, "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.0, "DCGM_FI_PROF_DRAM_ACTIVE": 0.08,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.97,
        # 40 % of the run at 0.83 of the link the pair gets, half each way
        "DCGM_FI_PROF_NVLINK_TX_BYTES": 0.2 * 0.83 * link_gbs * 1e9, "DCGM_FI_PROF_NVLINK_RX_BYTES": 0.2 * 0.83 * link_gbs * 1e9,
        "DCGM_FI_PROF_PCIE_TX_BYTES": 1e9, "DCGM_FI_PROF_PCIE_RX_BYTES": 1e9,
    }  # fmt: skip
    offline = with_telemetry(
        None,
        TelemetryRun("offline", product, 60.0, 2, counters, linked=True),
        now="2026-11-28T00:00:00Z",
        catalog=load_catalog(),
    )  # fmt: skip
    assert offline is not None and offline.time_shares is not None and offline.time_shares.interconnect
    namespace = "team-gang"
    gang = train_job("pair", namespace, seconds=20)
    gang["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][v.GPU_RESOURCE] = 2
    with Telemetry(tmp_path, nodes={name: product}, host=address) as telemetry:
        telemetry.dcgm.serve(namespace, counters)
        measured_by(telemetry.url, namespace, tier)
        created = json.loads(kubectl("create", "-o", "json", "-f", "-", stdin=yaml.safe_dump(gang)))
        hints = json.loads(created["metadata"]["annotations"][v.HINTS_ANNOTATION])
        assert hints.get("gang") and created["metadata"]["labels"].get(v.ROLE_LABEL) != "profiling", hints
        assert hints.get("gangGPUs") == 2, "the gang's size, which its Pods carry to the controller"
        status = measured_run(telemetry, namespace, "pair", "pair")
        shares = status["timeShares"]
        assert shares.get("interconnect") == offline.time_shares.interconnect, (shares, offline.time_shares)
        assert status["gpu"].get("gangGPUs") == 2 and status["telemetry"][0].get("gangGPUs") == 2, status
        recorded = status["telemetry"][0]["counters"]
        assert float(recorded["DCGM_FI_PROF_NVLINK_TX_BYTES"]) == pytest.approx(
            counters["DCGM_FI_PROF_NVLINK_TX_BYTES"], rel=1e-3
        )
        print(f"a gang on the real node: profile {status['phase']} from {status['source']}, time shares {shares}; "
              f"NVLink {recorded['DCGM_FI_PROF_NVLINK_TX_BYTES']} B/s each way on {product}, "
              f"measured at gangGPUs {status['gpu'].get('gangGPUs')}")  # fmt: skip
    sh(f"kubectl -n {NAMESPACE} set env deploy/kratos-controller KRATOS_TELEMETRY-", tier)
    kubectl("delete", "namespace", namespace, "--wait=false")


# --- 4. an upgrade under load ------------------------------------------------------------------


def test_4_an_upgrade_to_a_second_tag_under_steady_creates_fails_none(tier: Tier):
    tier.need("install")
    before = metric_histogram()
    with SteadyCreates("kratos-load") as load:
        overlay = tier.work / "my-kratos" / "kustomization.yaml"
        overlay.write_text(overlay.read_text().replace(f'newTag: "{TAGS[0]}"', f'newTag: "{TAGS[1]}"'))
        sh("kubectl apply -k my-kratos/", tier)
        sh(
            f"kubectl -n {NAMESPACE} rollout status deploy/kratos-webhook deploy/kratos-controller --timeout=300s",
            tier,
            timeout=320,
        )
    after = metric_histogram()
    images = {
        p["spec"]["containers"][0]["image"] for p in pods(NAMESPACE, "app.kubernetes.io/name=kratos-webhook")
    }
    assert images == {f"localhost/kratos-admit:{TAGS[1]}"}
    pdb = json.loads(kubectl("-n", NAMESPACE, "get", "pdb", "kratos-webhook", "-o", "json"))
    assert pdb["status"]["currentHealthy"] >= pdb["status"]["desiredHealthy"]
    p50, p99 = quantiles(before, after)
    print(f"upgrade: {load.answered} dry-run creates during the rollout, {len(load.failures)} failed; "
          f"API server webhook latency p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms")  # fmt: skip
    assert load.failures == [], load.failures[:3]
    tier.done.add("upgrade")


# --- 5. uninstall ------------------------------------------------------------------------------


def test_5_the_documented_uninstall_exits_0_at_every_command_and_leaves_nothing_held(tier: Tier):
    tier.need("install")
    documented_uninstall(tier)
    started = time.monotonic()
    kubectl("delete", "namespace", USERS, "--ignore-not-found", "--timeout=120s")
    until(
        lambda: "kratos-system" not in kubectl("get", "namespaces", "-o", "name"),
        timeout=120,
        what="kratos-system deleted",
    )
    print(
        f"uninstall: every command exited 0; {USERS} and {NAMESPACE} deleted in {time.monotonic() - started:.1f} s"
    )


# --- 6-9. the Helm chart, run by Helm's own engine (issue 32) ------------------------------------

RELEASE_NAME = "kratos"
HELM_USERS = "team-helm"


def kept_secrets() -> dict[str, Obj]:
    """The CA, the serving Secret and the signing key, as stored."""
    found = {}
    for name in ("kratos-webhook-ca", "kratos-webhook-tls", "kratos-signing-key"):
        found[name] = json.loads(kubectl("-n", NAMESPACE, "get", "secret", name, "-o", "json"))["data"]
    return found


def signed_job_still_accepted(name: str) -> None:
    """An UPDATE of a Job KRATOS signed (its execution Job): the validating webhook checks the
    signature of its KRATOS-only keys on UPDATE, so it passes only if the signing key is the same."""
    kubectl("-n", HELM_USERS, "label", "job", name, f"touched-at={int(time.time())}", "--overwrite")


def webhook_images() -> set[str]:
    return {
        p["spec"]["containers"][0]["image"] for p in pods(NAMESPACE, "app.kubernetes.io/name=kratos-webhook")
    }


def test_6_helm_install_runs_kratos_and_an_opted_in_job_is_profiled_then_hinted(tier: Tier):
    tier.need("images")
    kubectl("delete", "namespace", NAMESPACE, HELM_USERS, "--ignore-not-found", "--timeout=120s")
    started = time.monotonic()
    release = helm_config().install(
        str(REPO / "webhook-config" / "chart"), RELEASE_NAME, chart_values(TAGS[0]),
        namespace=NAMESPACE, create_namespace=True, wait="watcher", timeout=300,
    )  # fmt: skip
    assert release["status"] == "deployed" and release["revision"] == 1
    tier.figures["helm install s"] = round(time.monotonic() - started, 1)
    for deployment in ("kratos-webhook", "kratos-controller"):
        running = pods(NAMESPACE, f"app.kubernetes.io/name={deployment}")
        assert len(running) == 2
        assert all(
            {c["type"]: c["status"] for c in p["status"]["conditions"]}["Ready"] == "True" for p in running
        )
    kubectl("create", "namespace", HELM_USERS)
    kubectl("label", "namespace", HELM_USERS, f"{v.NAMESPACE_LABEL}=enabled")
    job = yaml.safe_load((REPO / "examples" / "vector-add-job.yaml").read_text())
    job["metadata"]["namespace"] = HELM_USERS
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(job))
    until(lambda: finished_in(HELM_USERS, "vector-add"), timeout=240, what="the profiling Job finished")
    assert profile_status(HELM_USERS, "vector-add").get("failure") == "no-gpu"
    until(
        lambda: finished_in(HELM_USERS, "vector-add-execution"),
        timeout=240,
        what="the execution Job finished",
    )
    execution = json.loads(kubectl("-n", HELM_USERS, "get", "job", "vector-add-execution", "-o", "json"))
    hints = json.loads(execution["metadata"]["annotations"][v.HINTS_ANNOTATION])
    assert "runtimeClassName" in hints["injected"], hints
    tier.figures["secrets"] = kept_secrets()
    print(
        f"helm install: deployed in {tier.figures['helm install s']} s; vector-add profiled (no-gpu), then run with hints {hints['injected']}"
    )
    tier.done.add("helm")


def changed_under_load(tier: Tier, what: str, change: Any, tag: str) -> Obj:
    """``change()`` (a Helm upgrade or rollback) while Jobs are created at a steady rate, then the
    rollout: no create refused, the webhook Pods on ``tag``, the CA, serving Secret and signing key
    unchanged, and a Job signed before still accepted. Returns what ``change()`` returned."""
    with SteadyCreates("kratos-helm-load") as load:
        result: Obj = change() or {}
        sh(
            f"kubectl -n {NAMESPACE} rollout status deploy/kratos-webhook deploy/kratos-controller --timeout=300s",
            tier,
            timeout=320,
        )
    assert webhook_images() == {f"localhost/kratos-admit:{tag}"}
    assert kept_secrets() == tier.figures["secrets"], "CA, serving Secret and signing key unchanged"
    signed_job_still_accepted("vector-add-execution")
    print(f"helm {what}: {load.answered} dry-run creates during it, {len(load.failures)} failed; "
          "CA, serving Secret and signing key unchanged; a Job signed before still accepted")  # fmt: skip
    assert load.failures == [], load.failures[:3]
    return result


def test_7_helm_upgrade_to_a_new_tag_and_value_under_steady_creates_keeps_the_ca_and_the_key(tier: Tier):
    tier.need("helm")
    values = chart_values(TAGS[1], config={"maxGpusPerPod": 4})
    chart = str(REPO / "webhook-config" / "chart")
    release = changed_under_load(
        tier, "upgrade", lambda: helm_config().upgrade(chart, RELEASE_NAME, values, namespace=NAMESPACE, wait="watcher", timeout=300), TAGS[1]
    )  # fmt: skip
    assert release["status"] == "deployed" and release["revision"] == 2
    stored = json.loads(kubectl("-n", NAMESPACE, "get", "configmap", "kratos-config", "-o", "json"))
    assert yaml.safe_load(stored["data"]["config.yaml"])["maxGpusPerPod"] == 4, "the changed value"


def test_8_helm_rollback_to_revision_1_the_same(tier: Tier):
    tier.need("helm")
    changed_under_load(
        tier,
        "rollback",
        lambda: helm_config().rollback(RELEASE_NAME, version=1, wait="watcher", timeout=300),
        TAGS[0],
    )
    stored = json.loads(kubectl("-n", NAMESPACE, "get", "configmap", "kratos-config", "-o", "json"))
    assert yaml.safe_load(stored["data"]["config.yaml"])["maxGpusPerPod"] == 8, "revision 1's value"


def test_9_helm_uninstall_with_a_job_held_leaves_nothing_held_and_nothing_of_kratos(tier: Tier):
    tier.need("helm")
    # a Job held: its profiling run's finalizer, with no controller left to take it off
    sh(f"kubectl -n {NAMESPACE} scale deploy/kratos-controller --replicas=0", tier)
    until(
        lambda: not pods(NAMESPACE, "app.kubernetes.io/name=kratos-controller"),
        timeout=120,
        what="no controller",
    )
    held = train_job("held", HELM_USERS)
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(held))
    until(
        lambda: v.RELEASE_FINALIZER in json.loads(kubectl("-n", HELM_USERS, "get", "job", "held", "-o", "json"))["metadata"].get("finalizers", []),
        timeout=60, what="the profiling Job held",
    )  # fmt: skip
    started = time.monotonic()
    helm_config().uninstall(RELEASE_NAME, wait="watcher", timeout=300)
    job = json.loads(kubectl("-n", HELM_USERS, "get", "job", "held", "-o", "json"))
    assert v.RELEASE_FINALIZER not in job["metadata"].get("finalizers", []), "the hook let go of it"
    kubectl("delete", "namespace", HELM_USERS, "--timeout=120s")
    left = kubectl(
        "get",
        "mutatingwebhookconfigurations,validatingwebhookconfigurations,crd,clusterroles,clusterrolebindings,priorityclasses",
        "-o",
        "name",
    )
    assert not [line for line in left.splitlines() if "kratos" in line or "workloadprofiles" in line], left
    assert (
        kubectl(
            "-n",
            NAMESPACE,
            "get",
            "all,secrets,configmaps,serviceaccounts,roles,rolebindings",
            "-o",
            "name",
            "-l",
            "app.kubernetes.io/part-of=kratos-admit",
        ).strip()
        == ""
    )
    kubectl("delete", "namespace", NAMESPACE, "--timeout=120s")
    print(
        f"helm uninstall: with a Job held; nothing held, nothing of KRATOS left, both namespaces deleted in {time.monotonic() - started:.1f} s"
    )
