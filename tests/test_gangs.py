"""Gangs (issue 49, DESIGN "Distributed training (gangs)"): what KRATOS reads as a gang, and that a gang
runs as written: never profiled, never held, base hints or ranked hints, and its Pods kept on one GPU
product by the scheduler's own inter-Pod affinity."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kratos_admit.admission.engine import Webhook
from kratos_admit.decisions.gangs import GANG_AFFINITY_WEIGHT, expand_kube_vars, read_gang
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.gpu_requests import read_pod_gpus
from kratos_admit.domain.workload import Workload
from tests.builders import JobBuilder, PodBuilder, jobset_child, llama_ddp, make_job, make_pod, make_profile
from tests.harness import admit, engine, make_ctx, mutate_and_check


def eight_gpu_torchrun() -> JobBuilder:
    return (
        make_job("llama-single")
        .command("torchrun", "--standalone", "--nproc-per-node=8", "train.py")
        .limits({v.GPU_RESOURCE: 8})
    )


def owned(builder: JobBuilder | PodBuilder, kind: str, name: str = "owner") -> JobBuilder | PodBuilder:
    builder._obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "example.com/v1", "kind": kind, "name": name, "uid": "u-1", "controller": True}
    ]
    return builder


def one_gpu_job(*command: str, env: dict[str, str] | None = None) -> JobBuilder:
    job = make_job("train").command(*command).limits({v.GPU_RESOURCE: 1})
    if env:
        job.container()["env"] = [{"name": k, "value": val} for k, val in env.items()]
    return job


def gang_of(builder: JobBuilder | PodBuilder) -> Any:
    obj = builder.obj()
    workload = Workload(obj["kind"], obj)
    return read_gang(workload, read_pod_gpus(workload))


# (id, object, what the reading says: a substring of why, "doubt: ..." for a gang by default, or None)
READINGS: list[tuple[str, JobBuilder | PodBuilder, str | None]] = [
    ("indexed-parallel", llama_ddp(), "Indexed Job whose 4 Pods run at once"),
    ("indexed-one-at-a-time", make_job("sweep").job_spec(completionMode="Indexed", completions=8), None),
    ("parallel-workers-one-gpu", make_job("queue").job_spec(parallelism=4, completions=8), None),
    ("subdomain", make_job("peers").spec(subdomain="peers"), "subdomain peers"),
    ("jobset-child", jobset_child(), "owned by JobSet llama"),
    ("cronjob-child", owned(make_job("nightly"), "CronJob"), None),
    ("unknown-owner", owned(make_job("x"), "Experiment"), "doubt: owned by Experiment owner"),
    ("eight-gpus", eight_gpu_torchrun(), "8 GPUs in container main"),
    ("one-gpu-in-each-of-two-containers", make_job("two").add_container("second", {v.GPU_RESOURCE: 1}), None),
    (
        "two-mig-slices",
        make_job("mig").limits({"nvidia.com/mig-1g.10gb": 2}),
        "2 MIG devices in container main",
    ),
    (
        "kai-several-devices",
        make_pod("kai")
        .no_resources()
        .pod_annotate(v.KAI_FRACTION_ANNOTATION, "0.5")
        .pod_annotate(v.KAI_NUM_DEVICES_ANNOTATION, "2"),
        "KAI GPU sharing on 2 devices",
    ),
    ("dra-claim", make_pod("dra").dra_claim("gpu", "one-gpu"), "doubt: container main claims devices"),
    ("torchrun-one-process", one_gpu_job("torchrun", "--nnodes=1", "--nproc-per-node=1", "t.py"), None),
    ("torchrun-per-gpu-on-one", one_gpu_job("torchrun", "--nproc-per-node=gpu", "t.py"), None),
    ("torchrun-elastic", one_gpu_job("torchrun", "--nnodes", "1:4", "t.py"), "torchrun --nnodes=1:4"),
    (
        "torchrun-env-expanded",
        one_gpu_job("torchrun", "--nnodes=$(NNODES)", "t.py", env={"NNODES": "2"}),
        "torchrun --nnodes=2",
    ),
    (
        "torchrun-env-unknown",
        one_gpu_job("torchrun", "--nnodes=$(NNODES)", "t.py"),
        "doubt: torchrun --nnodes",
    ),
    ("torchrun-garbled", one_gpu_job("torchrun", "--nproc-per-node=eight", "t.py"), "doubt: torchrun"),
    (
        "torch-distributed-run",
        one_gpu_job("python3", "-m", "torch.distributed.run", "--nproc_per_node", "2", "t.py"),
        "torchrun --nproc_per_node=2",
    ),
    (
        "shell-script",
        one_gpu_job("/bin/bash", "-c", "cd /w && exec torchrun --nnodes 2 train.py # rank $RANK"),
        "torchrun --nnodes=2",
    ),
    ("shell-unbalanced-quote", one_gpu_job("sh", "-c", "mpirun -np 4 'x"), "mpirun -np=4"),
    ("mpirun", one_gpu_job("mpirun", "-np", "4", "python", "t.py"), "mpirun -np=4"),
    ("mpirun-one", one_gpu_job("mpirun", "-np", "1", "python", "t.py"), None),
    ("mpirun-slots", one_gpu_job("mpirun", "python", "t.py"), "doubt: mpirun without -np"),
    ("deepspeed-gpus", one_gpu_job("deepspeed", "--num_gpus=2", "t.py"), "deepspeed --num_gpus=2"),
    ("deepspeed-one-gpu", one_gpu_job("deepspeed", "t.py"), None),
    ("deepspeed-hostfile", one_gpu_job("deepspeed", "--hostfile", "/job/hostfile", "t.py"), "--hostfile"),
    ("accelerate-multi", one_gpu_job("accelerate", "launch", "--multi_gpu", "t.py"), "--multi_gpu"),
    ("accelerate-config", one_gpu_job("accelerate", "launch", "t.py"), "doubt: accelerate launch"),
    ("python-alone", one_gpu_job("python", "train.py", "--epochs", "90"), None),
    (
        "training-operator-pod",
        make_pod("pt-worker-0").label(v.TRAINING_JOB_NAME_LABEL, "pt"),
        "label training.kubeflow.org/job-name=pt",
    ),
    ("pytorchjob-pod", owned(make_pod("pt-master-0"), "PyTorchJob", "pt"), "owned by PyTorchJob pt"),
    ("replicaset-pod", owned(make_pod("web-1"), "ReplicaSet"), None),
    (
        "indexed-job-pod",
        make_pod("sweep-0").label(v.JOB_COMPLETION_INDEX, "0"),
        "doubt: a Pod of an Indexed Job",
    ),
    ("workflow-pod", owned(make_pod("step"), "Workflow"), "doubt: owned by Workflow"),
    ("parallelism-unreadable", make_job("odd").job_spec(parallelism="four"), "doubt: spec.parallelism"),
]


@pytest.mark.parametrize("builder, expected", [r[1:] for r in READINGS], ids=[r[0] for r in READINGS])
def test_a_gang_is_read_from_the_object_alone(builder: JobBuilder | PodBuilder, expected: str | None):
    gang = gang_of(builder)
    if expected is None:
        assert gang is None
        return
    assert gang is not None
    doubt = expected.startswith("doubt: ")
    assert expected.removeprefix("doubt: ") in gang.why
    assert bool(gang.doubt) == doubt, gang


def test_kubernetes_variables_expand_as_the_kubelet_expands_them():
    env = {"N": "4"}
    assert expand_kube_vars("--nnodes=$(N)", env) == "--nnodes=4"
    assert expand_kube_vars("$$(N) $(M)", env) == "$(N) $(M)"


def test_a_gangs_peers_are_the_pods_its_job_or_jobset_names():
    assert gang_of(llama_ddp()).peers == ((v.JOB_NAME_LABEL, "llama-ddp"),)
    assert gang_of(jobset_child()).peers == ((v.JOBSET_NAME_LABEL, "llama"),)
    assert gang_of(eight_gpu_torchrun()).peers == (), "one Pod: no peers to keep it with"
    unnamed = llama_ddp().obj()
    unnamed["metadata"]["generateName"] = unnamed["metadata"].pop("name") + "-"
    workload = Workload("Job", unnamed)
    gang = read_gang(workload, read_pod_gpus(workload))
    assert gang is not None and gang.peers == (), "no name at admission"


# --- the three reviews: run as written --------------------------------------------------------

AS_WRITTEN = [
    ("indexed-gang", llama_ddp),
    ("jobset-child", jobset_child),
    ("one-pod-8-gpus", eight_gpu_torchrun),
]


def written(job: dict[str, Any]) -> tuple[Any, ...]:
    spec = job["spec"]
    container = spec["template"]["spec"]["containers"][0]
    return (
        spec.get("parallelism"),
        spec.get("completions"),
        spec.get("completionMode"),
        container.get("command"),
        container.get("args"),
        spec.get("suspend"),
        spec["template"]["spec"].get("schedulingGates"),
    )


def record_of(obj: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(obj["metadata"]["annotations"][v.HINTS_ANNOTATION])
    return record


@pytest.mark.parametrize("build", [b for _, b in AS_WRITTEN], ids=[i for i, _ in AS_WRITTEN])
def test_a_gang_without_a_profile_runs_as_written_with_base_hints(build: Any):
    job = build().obj()
    result, mutated = mutate_and_check(job, engine(make_ctx()))
    assert result.decision.action == "hints"
    assert written(mutated) == written(job)
    assert v.ROLE_LABEL not in mutated["metadata"].get("labels", {})
    pod = mutated["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert {"key": v.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    record = record_of(mutated)
    assert record["gang"] == result.decision.gang and record["gang"]
    assert record["ranked"] == [] and record["profile"] is None
    assert (
        mutated["spec"]["template"]["metadata"]["labels"][v.WORKLOAD_LABEL]
        == job["metadata"]["labels"][v.WORKLOAD_LABEL]
    ), "its Pods carry the workload label: the controller's telemetry sees them while they run"
    warning = result.decision.warnings[0]
    assert "runs as a gang" in warning and "never rewritten into a profiling run nor held" in warning
    assert any("set telemetry.prometheusURL" in w for w in result.decision.warnings)


def test_a_gang_with_a_ready_profile_gets_ranked_hints_and_stays_on_one_product():
    profile = make_profile("llama-ddp", bound="compute", sm="85", mem="20")
    ctx = make_ctx(explorationShare=1.0)  # every one-GPU Job would explore: a gang never does
    result, mutated = mutate_and_check(llama_ddp().obj(), engine(ctx, [profile]))
    record = record_of(mutated)
    assert record["profile"] == "llama-ddp-profile" and record["ranked"]
    assert "explore" not in record and result.decision.explored == ""
    assert record["gang"].startswith("Indexed Job whose 4 Pods run at once")
    affinity = mutated["spec"]["template"]["spec"]["affinity"]
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {
            "weight": GANG_AFFINITY_WEIGHT,
            "podAffinityTerm": {
                "labelSelector": {"matchLabels": {v.JOB_NAME_LABEL: "llama-ddp"}},
                "topologyKey": v.GPU_PRODUCT_LABEL,
            },
        }
    ]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["podAffinity"], (
        "never a requirement: a gang never waits for KRATOS"
    )
    assert not any("telemetry" in w for w in result.decision.warnings)


def test_a_users_own_pod_affinity_stays_beside_the_gangs():
    job = llama_ddp()
    own = {
        "weight": 5,
        "podAffinityTerm": {"labelSelector": {"matchLabels": {"a": "b"}}, "topologyKey": "zone"},
    }
    job.spec(affinity={"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [own]}})
    _, mutated = mutate_and_check(job.obj(), engine(make_ctx()))
    terms = mutated["spec"]["template"]["spec"]["affinity"]["podAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms[0] == own and len(terms) == 2


@pytest.mark.parametrize("phase", ["Profiling", "Failed"])
def test_a_gang_is_never_held_while_its_workload_profiles(phase: str):
    profile = make_profile("llama-ddp", phase=phase, message="ncu failed")
    job = llama_ddp().label(v.KUEUE_QUEUE_LABEL, "gpus").obj()
    result, mutated = mutate_and_check(job, engine(make_ctx(), [profile]))
    assert written(mutated) == written(job)
    assert v.AWAITING_PROFILE_ANNOTATION not in mutated["metadata"].get("annotations", {})
    assert any(f"is {phase}: the gang is not held for it" in w for w in result.decision.warnings)
    pod = make_pod("pt-worker-1").label(v.TRAINING_JOB_NAME_LABEL, "pt").label(v.WORKLOAD_LABEL, "llama-ddp")
    result, mutated = mutate_and_check(pod.obj(), engine(make_ctx(), [profile]))
    assert "schedulingGates" not in mutated["spec"], "a gang's Pod is never gated"


def test_telemetry_configured_silences_the_telemetry_warning():
    ctx = make_ctx(telemetry={"prometheusURL": "http://prometheus.monitoring:9090"})
    result = admit(llama_ddp().obj(), engine(ctx))
    assert result.decision.allowed and not any(
        "telemetry is not configured" in w for w in result.decision.warnings
    )


def test_a_gang_that_cannot_be_read_is_a_gang_and_the_warning_says_so():
    job = one_gpu_job("torchrun", "--nnodes=$(NNODES)", "train.py").obj()
    result, mutated = mutate_and_check(job, engine(make_ctx()))
    assert result.decision.action == "hints" and written(mutated) == written(job)
    assert "by default: torchrun --nnodes=$(NNODES) cannot be read" in result.decision.warnings[0]
    unknown = owned(make_job("x").command("python", "t.py"), "Experiment").obj()
    result = admit(unknown, engine(make_ctx()))
    assert result.decision.action == "hints"
    assert "owned by Experiment owner, which KRATOS does not know" in result.decision.warnings[0]


def test_asking_a_gang_for_profiling_is_no_denial_and_no_profiling_run():
    job = (
        llama_ddp()
        .limits({v.GPU_RESOURCE: 4})
        .annotate(v.PROFILING_ANNOTATION, "true")
        .add_container("second", {v.GPU_RESOURCE: 1})
    )
    result, _ = mutate_and_check(job.obj(), engine(make_ctx()))
    assert result.decision.action == "hints"
    assert any('"true" has no effect on a gang' in w for w in result.decision.warnings)
    assert admit(job.obj(), engine(make_ctx()), webhook="validate").decision.allowed


def test_a_gangs_bad_gpu_request_is_denied_with_every_reason():
    job = (
        llama_ddp()
        .limits({v.GPU_RESOURCE: 8})
        .requests({v.GPU_RESOURCE: 4})
        .add_container("sidecar", {v.GPU_RESOURCE: "half"})
        .annotate(v.PRIORITY_ANNOTATION, "urgent")
        .obj()
    )
    webhooks: tuple[Webhook, ...] = ("mutate", "validate")
    for webhook in webhooks:
        result = admit(job, engine(make_ctx()), webhook=webhook)
        assert not result.decision.allowed
        rules = sorted(e.rule for e in result.decision.violations)
        assert rules == ["gpu-count", "gpu-count", "hint-format"], result.decision.violations


def test_a_non_gang_indexed_job_is_profiled_as_index_0():
    job = make_job("sweep").job_spec(completionMode="Indexed", completions=16, parallelism=1).obj()
    result, mutated = mutate_and_check(job, engine(make_ctx()))
    assert result.decision.action == "profiling"
    spec = mutated["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 1, 1)


# --- a launcher whose counts disagree with its Job (issue 60) -------------------------------------


def indexed(pods: int, gpus: int, *command: str) -> JobBuilder:
    return (
        make_job("ddp")
        .command(*command)
        .limits({v.GPU_RESOURCE: gpus})
        .job_spec(completionMode="Indexed", completions=pods, parallelism=pods)
    )


MISMATCHES = [
    # (id, builder, the part of the one warning expected, or None for no warning)
    ("torchrun-nodes-and-procs", indexed(4, 2, "torchrun", "--nnodes=2", "--nproc-per-node=8", "t.py"),
     "torchrun --nnodes=2 --nproc-per-node=8 disagrees with the Job, which runs 4 Pod(s) and 2 GPU(s) in container"),
    ("torchrun-agrees", indexed(4, 2, "torchrun", "--nnodes=4", "--nproc-per-node=2", "t.py"), None),
    ("torchrun-elastic-range-holds-it", indexed(4, 2, "torchrun", "--nnodes=2:4", "--nproc-per-node=2", "t.py"), None),
    ("torchrun-gpu-per-node", indexed(4, 2, "torchrun", "--nnodes=4", "--nproc-per-node=gpu", "t.py"), None),
    ("torchrun-module", indexed(2, 8, "python", "-m", "torch.distributed.run", "--nnodes", "3", "t.py"),
     "torchrun --nnodes=3 disagrees with the Job, which runs 2 Pod(s)"),
    ("mpirun-total", indexed(2, 4, "mpirun", "-np", "16", "python", "t.py"),
     "mpirun -np=16 disagrees with the Job, which runs 2 Pod(s) x 4 GPU(s) = 8"),
    ("mpirun-agrees", indexed(2, 4, "mpirun", "-np", "8", "python", "t.py"), None),
    ("deepspeed", indexed(2, 4, "deepspeed", "--num_nodes=2", "--num_gpus=8", "t.py"),
     "deepspeed --num_gpus=8 disagrees with the Job, which runs 4 GPU(s) in container"),
    ("accelerate", indexed(2, 4, "accelerate", "launch", "--num_machines", "2", "--num_processes", "4", "t.py"),
     "accelerate --num_processes=4 disagrees with the Job, which runs 2 Pod(s) x 4 GPU(s) = 8"),
    ("srun", indexed(3, 1, "srun", "-N", "2", "python", "t.py"),
     "srun -N=2 disagrees with the Job, which runs 3 Pod(s)"),
    ("pod-a-job-made", owned(make_pod("ddp-x1").command("torchrun", "--nnodes=4", "t.py").limits({v.GPU_RESOURCE: 1}), "Job"), None),
    ("bare-pod", make_pod("p").command("torchrun", "--nnodes=2", "--nproc-per-node=1", "t.py").limits({v.GPU_RESOURCE: 1}),
     "torchrun --nnodes=2 disagrees with the Pod, which runs 1 Pod(s)"),
    ("single-pod-torchrun-in-a-shell", make_job("one").command("sh", "-c", "torchrun --nproc-per-node=4 t.py").limits({v.GPU_RESOURCE: 8}),
     "torchrun --nproc-per-node=4 disagrees with the Job, which runs 8 GPU(s) in container"),
]  # fmt: skip


@pytest.mark.parametrize("builder, expected", [r[1:] for r in MISMATCHES], ids=[r[0] for r in MISMATCHES])
def test_a_launcher_whose_counts_disagree_with_the_job_is_named_with_both(
    builder: JobBuilder | PodBuilder, expected: str | None
):
    gang = gang_of(builder)
    assert gang is not None
    assert [m for m in gang.mismatches if expected and expected in m] == list(gang.mismatches)
    assert len(gang.mismatches) == (expected is not None), gang.mismatches
    warnings = admit(builder.obj(), engine(make_ctx())).decision.warnings
    assert [w for w in warnings if "disagrees" in w] == list(gang.mismatches)


def test_a_launcher_mismatch_is_said_even_when_the_gang_has_a_ready_profile():
    job = indexed(4, 2, "torchrun", "--nnodes=2", "--nproc-per-node=8", "t.py")
    result = admit(job.obj(), engine(make_ctx(), [make_profile("ddp")]))
    assert result.decision.action == "hints" and result.decision.ranking_source != "none"
    warnings = result.decision.warnings
    assert any("torchrun --nnodes=2 --nproc-per-node=8 disagrees" in w for w in warnings), warnings
