"""The mutating path: hints, the profiling rewrite, idempotency, and its output passing validation."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kratos_admit.admission.request import Operation
from kratos_admit.decisions.profiling import decode_original_template
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.signing import sign_block
from tests.builders import make_job, make_pod, make_profile
from tests.harness import TEST_KEY, admit, engine, make_ctx, mutate_and_check
from tests.pod_security import restricted_violations

GPU = v.GPU_RESOURCE
PROFILE = make_profile()


TWO_TERMS = make_job().spec(
    affinity={
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
                        ]
                    },
                    {
                        "matchExpressions": [
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}
                        ]
                    },
                ]
            }
        }
    }
)
WORKLOADS = [
    pytest.param(make_job(), id="job"),
    pytest.param(make_pod(), id="pod"),
    pytest.param(
        make_job().annotate(v.MIN_CC_ANNOTATION, "8.6").annotate(v.MIN_MEMORY_ANNOTATION, "40Gi"),
        id="job-with-requirements",
    ),
    pytest.param(TWO_TERMS, id="job-with-two-required-terms"),
    pytest.param(
        make_job().spec(runtimeClassName="nvidia-cdi", tolerations=[{"operator": "Exists"}]),
        id="job-with-user-runtime-class",
    ),
]


@pytest.mark.parametrize("builder", WORKLOADS)
def test_hints_are_valid_idempotent_and_pass_validation(builder):
    result, mutated = mutate_and_check(builder.obj(), engine(make_ctx(), [PROFILE]))
    assert result.decision.action == "hints"
    meta = mutated["metadata"]
    assert meta["annotations"][v.PROFILE_ANNOTATION] == "vector-add-profile@7"
    hints = json.loads(meta["annotations"][v.HINTS_ANNOTATION])
    assert hints["boundType"] == "memory" and hints["profile"] == "vector-add-profile"


def _pod_spec(obj):
    return obj["spec"]["template"]["spec"] if obj["kind"] == "Job" else obj["spec"]


def test_hints_inject_runtime_class_affinity_and_toleration():
    _, mutated = mutate_and_check(make_job().obj(), engine(make_ctx(), [PROFILE]))
    spec = _pod_spec(mutated)
    assert spec["runtimeClassName"] == "nvidia"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # vector-add is memory-bound: the L4 (300 GB/s, a tenth of the H100's) is kept off by maxSlowdown
    acceptable = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": v.GPU_PRESENT_LABEL, "operator": "In", "values": ["true"]},
                {"key": v.GPU_PRODUCT_LABEL, "operator": "In", "values": acceptable},
            ]
        }
    ]
    preferred = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    products = [p["preference"]["matchExpressions"][0]["values"][0] for p in preferred]
    assert products[0] == "NVIDIA-H100-80GB-HBM3" and products.index(
        "NVIDIA-A100-SXM4-80GB"
    ) < products.index("NVIDIA-L40S")
    assert preferred[0]["weight"] == 100 and all(1 <= p["weight"] <= 100 for p in preferred)
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    template_annotations = mutated["spec"]["template"]["metadata"]["annotations"]
    assert v.HINTS_ANNOTATION in template_annotations and v.SIGNATURE_ANNOTATION in template_annotations


def test_required_requirements_are_anded_into_every_existing_term():
    obj = TWO_TERMS.obj()
    obj["metadata"]["annotations"] = {v.MIN_CC_ANNOTATION: "8.6", v.MIN_MEMORY_ANNOTATION: "40Gi"}
    _, mutated = mutate_and_check(obj, engine(make_ctx(), [PROFILE]))
    terms = _pod_spec(mutated)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert len(terms) == 4  # two user terms x (major > 8 | major == 8 and minor > 5)
    for term in terms:
        keys = [e["key"] for e in term["matchExpressions"]]
        assert keys[0] == "topology.kubernetes.io/zone"
        assert v.GPU_PRESENT_LABEL in keys
        assert {"key": v.GPU_MEMORY_LABEL, "operator": "Gt", "values": ["40959"]} in term["matchExpressions"]
    assert {"key": v.GPU_CC_MAJOR_LABEL, "operator": "Gt", "values": ["8"]} in terms[0]["matchExpressions"]
    assert {"key": v.GPU_CC_MINOR_LABEL, "operator": "Gt", "values": ["5"]} in terms[1]["matchExpressions"]
    preferred = _pod_spec(mutated)["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert "NVIDIA-A100-SXM4-80GB" not in json.dumps(preferred), (
        "cc 8.0 cannot meet 8.6: no preference for it"
    )


def test_hints_never_override_what_the_user_set():
    user_pref = {
        "weight": 5,
        "preference": {
            "matchExpressions": [{"key": v.GPU_PRODUCT_LABEL, "operator": "In", "values": ["NVIDIA-L4"]}]
        },
    }
    obj = (
        make_job()
        .spec(
            runtimeClassName="nvidia-cdi",
            schedulerName="my-scheduler",
            priorityClassName="mine",
            tolerations=[
                {"key": "nvidia.com/gpu", "operator": "Equal", "value": "x", "effect": "NoSchedule"}
            ],
            affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [user_pref]}},
        )
        .annotate(v.PRIORITY_ANNOTATION, "high")
        .obj()
    )
    eng = engine(make_ctx(scheduler="kai", priorityClasses={"high": "gpu-high"}), [PROFILE])
    _, mutated = mutate_and_check(obj, eng)
    spec = _pod_spec(mutated)
    assert spec["runtimeClassName"] == "nvidia-cdi"
    assert spec["schedulerName"] == "my-scheduler"
    assert spec["priorityClassName"] == "mine"
    assert spec["tolerations"] == obj["spec"]["template"]["spec"]["tolerations"]
    assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [user_pref]


@pytest.mark.parametrize(
    ("config", "scheduler", "queue"),
    [
        pytest.param({"scheduler": "default"}, None, None, id="default"),
        pytest.param({"scheduler": "kai", "kaiQueue": "research"}, "kai-scheduler", "research", id="kai"),
        pytest.param({"scheduler": "volcano"}, "volcano", None, id="volcano"),
        pytest.param(
            {"schedulerName": v.KRATOS_SCHEDULER_NAME},
            v.KRATOS_SCHEDULER_NAME,
            None,
            id="kratos-scheduler-profile",
        ),
        pytest.param(
            {"scheduler": "kai", "schedulerName": v.KRATOS_SCHEDULER_NAME},
            "kai-scheduler",
            "default-queue",
            id="kai-wins-over-the-profile",
        ),
    ],
)
def test_scheduler_backend_from_config(config, scheduler, queue):
    _, mutated = mutate_and_check(make_job().obj(), engine(make_ctx(**config), [PROFILE]))
    assert _pod_spec(mutated).get("schedulerName") == scheduler
    labels = mutated["spec"]["template"]["metadata"].get("labels", {})
    assert labels.get(v.KAI_QUEUE_LABEL) == queue


def test_priority_annotation_maps_to_priority_class_on_jobs():
    eng = engine(make_ctx(priorityClasses={"high": "gpu-high", "low": "gpu-low"}), [PROFILE])
    _, mutated = mutate_and_check(make_job().annotate(v.PRIORITY_ANNOTATION, "low").obj(), eng)
    assert _pod_spec(mutated)["priorityClassName"] == "gpu-low"
    result, mutated = mutate_and_check(make_pod().annotate(v.PRIORITY_ANNOTATION, "low").obj(), eng)
    assert "priorityClassName" not in _pod_spec(mutated)
    assert any("applied to Jobs only" in w for w in result.decision.warnings)


@pytest.mark.parametrize(
    "priority_classes",
    [
        pytest.param({}, id="default-config-maps-none"),
        pytest.param({"high": "gpu-high"}, id="other-keys-mapped"),
    ],
)
@pytest.mark.parametrize("make", [make_job, make_pod], ids=["job", "pod"])
def test_a_priority_mapped_to_no_class_sets_nothing_and_says_so(priority_classes, make):
    eng = engine(make_ctx(priorityClasses=priority_classes), [PROFILE])
    result, mutated = mutate_and_check(make().annotate(v.PRIORITY_ANNOTATION, "normal").obj(), eng)
    assert result.decision.allowed
    assert "priorityClassName" not in _pod_spec(mutated)
    assert [w for w in result.decision.warnings if v.PRIORITY_ANNOTATION in w] == [
        f"{v.PRIORITY_ANNOTATION}: normal has no effect: the configuration's priorityClasses maps 'normal' "
        "to no PriorityClass (set priorityClasses.normal to use it)"
    ]


def test_profile_runtime_class_overrides_the_configured_default():
    profile = make_profile(runtime_class="nvidia-legacy")
    _, mutated = mutate_and_check(make_job().obj(), engine(make_ctx(), [profile]))
    assert _pod_spec(mutated)["runtimeClassName"] == "nvidia-legacy"


def pod_of(job):
    """A Pod as the Job controller makes it: the template's metadata and spec, copied."""
    template = job["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": copy.deepcopy(template["metadata"]),
        "spec": copy.deepcopy(template["spec"]),
    }


def test_pods_created_by_a_hinted_job_are_left_alone():
    eng = engine(make_ctx(), [PROFILE])
    _, job = mutate_and_check(make_job().obj(), eng)
    pod = pod_of(job)
    pod["metadata"].update(name="vector-add-x7k2p", namespace="team-a")
    pod["metadata"].setdefault("labels", {}).update(
        {v.WORKLOAD_LABEL: "vector-add", "batch.kubernetes.io/job-name": "vector-add"}
    )
    result = admit(pod, eng)
    assert result.outcome == "allowed" and result.patch == []
    assert admit(pod, eng, webhook="validate").decision.allowed


# --- the profiling rewrite ---------------------------------------------------------------------


def test_profiling_rewrite_shape():
    obj = (
        make_job("matrix-mul")
        .command("/opt/app/matrixMul", "-wA=2048")
        .args("--check")
        .add_container("fetch", init=True)
        .add_container("sidecar")
        .job_spec(
            backoffLimit=6, completions=4, parallelism=1, completionMode="Indexed", ttlSecondsAfterFinished=0
        )
        .annotate(v.PROFILE_SKIP_ANNOTATION, "5")
        .obj()
    )
    obj["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    obj["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "data", "mountPath": "/data"}
    ]
    obj["spec"]["template"]["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    eng = engine(make_ctx(profilingCapabilities=["PERFMON"], nsightComputeImage="registry.example/ncu:1"))
    result, mutated = mutate_and_check(obj, eng)
    assert result.decision.action == "profiling"
    assert mutated["metadata"]["name"] == "matrix-mul"
    spec = mutated["spec"]
    assert (spec["parallelism"], spec["completions"], spec["backoffLimit"]) == (1, 1, 0)
    assert spec["activeDeadlineSeconds"] == 3600
    assert spec["completionMode"] == "Indexed", "the run is index 0: JOB_COMPLETION_INDEX is set in it"
    assert "ttlSecondsAfterFinished" not in spec, "a TTL could delete the run before the controller reads it"
    assert mutated["metadata"]["finalizers"] == [v.RELEASE_FINALIZER]
    assert spec["template"]["metadata"]["finalizers"] == [v.RELEASE_FINALIZER]
    pod = spec["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["fetch", "stage-workload"]
    stage = pod["initContainers"][1]
    assert stage["image"] == obj["spec"]["template"]["spec"]["containers"][0]["image"]
    assert stage["command"][:2] == ["sh", "-c"] and stage["command"][-1] == "/opt/app/matrixMul"
    assert "cp -L" in stage["command"][2]
    [runner] = pod["containers"]
    assert runner["name"] == "profiling-runner" and runner["image"] == "registry.example/ncu:1"
    assert runner["command"] == [
        "python3",
        "-m",
        "kratos_runner",
        "--set",
        "basic",
        "--launch-skip",
        "5",  # the profile-skip-kernels annotation wins; the runner counts 20 from there
        "--",
        "/kratos/stage/matrixMul",
        "-wA=2048",
        "--check",
    ]
    assert runner["env"] == [{"name": "A", "value": "1"}]
    assert runner["resources"] == {"limits": {GPU: 1}, "requests": {"cpu": "100m", "memory": "128Mi"}}
    assert stage["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }
    assert any("PERFMON" in w and "restricted" in w for w in result.decision.warnings)
    assert runner["terminationMessagePolicy"] == "File"
    assert runner["securityContext"]["capabilities"]["add"] == ["PERFMON"]
    assert {"name": "kratos-stage", "mountPath": "/kratos/stage", "readOnly": True} in runner["volumeMounts"]
    assert {"name": "data", "mountPath": "/data"} in runner["volumeMounts"]
    assert {"name": "kratos-stage", "emptyDir": {}} in pod["volumes"]
    assert pod["restartPolicy"] == "Never"
    assert mutated["metadata"]["labels"][v.ROLE_LABEL] == "profiling"
    assert spec["template"]["metadata"]["labels"][v.ROLE_LABEL] == "profiling"
    original = decode_original_template(mutated, namespace="team-a", signing_key=TEST_KEY)
    assert original["spec"] == obj["spec"], "the original Job spec is kept exactly"
    assert original["metadata"]["labels"] == obj["metadata"]["labels"]


def test_profiling_uses_the_executable_annotation_when_there_is_no_command():
    obj = (
        make_job()
        .command()
        .args("--size", "1024")
        .annotate(v.EXECUTABLE_ANNOTATION, "/usr/local/bin/app")
        .obj()
    )
    _, mutated = mutate_and_check(obj, engine(make_ctx()))
    runner = mutated["spec"]["template"]["spec"]["containers"][0]
    assert runner["command"][-3:] == ["/kratos/stage/app", "--size", "1024"]


def test_pods_of_a_profiling_job_are_left_alone():
    eng = engine(make_ctx())
    _, job = mutate_and_check(make_job().obj(), eng)
    pod = pod_of(job)
    pod["metadata"]["labels"][v.WORKLOAD_LABEL] = "vector-add"
    result = admit(pod, eng)
    assert result.patch == [] and result.decision.warnings == []


# --- tampering: the validating path denies what a user changes by hand ---------------------------


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(
            lambda o: o["metadata"]["annotations"].update({v.PROFILE_ANNOTATION: "other-profile@1"}),
            id="edit-profile-reference",
        ),
        pytest.param(
            lambda o: o["metadata"]["annotations"].update({v.HINTS_ANNOTATION: "{}"}), id="edit-hints"
        ),
        pytest.param(
            lambda o: o["spec"]["template"]["metadata"]["annotations"].pop(v.SIGNATURE_ANNOTATION),
            id="drop-template-signature",
        ),
        pytest.param(
            lambda o: o["metadata"].setdefault("labels", {}).update({v.ROLE_LABEL: "execution"}),
            id="add-role-label",
        ),
    ],
)
def test_editing_a_kratos_key_of_a_hinted_job_is_denied(edit):
    eng = engine(make_ctx(), [PROFILE])
    _, mutated = mutate_and_check(make_job().obj(), eng)
    stored = copy.deepcopy(mutated)
    edit(mutated)
    cases: tuple[tuple[Operation, dict[str, Any] | None], ...] = (("CREATE", None), ("UPDATE", stored))
    for operation, old in cases:
        result = admit(mutated, eng, webhook="validate", operation=operation, old=old)
        assert not result.decision.allowed
        assert {e.rule for e in result.decision.violations} == {"reserved-key"}


def test_editing_the_original_template_of_a_profiling_job_is_denied():
    eng = engine(make_ctx())
    _, mutated = mutate_and_check(make_job().obj(), eng)
    forged = copy.deepcopy(mutated)
    forged["metadata"]["annotations"][v.ORIGINAL_TEMPLATE_ANNOTATION] = "H4sIAAAAAAAA/6uuBQBDv6ajAgAAAA=="
    result = admit(forged, eng, webhook="validate", operation="UPDATE", old=mutated)
    assert {e.rule for e in result.decision.violations} == {"reserved-key"}
    assert f"metadata.annotations[{v.ORIGINAL_TEMPLATE_ANNOTATION}]" in {
        e.field for e in result.decision.violations
    }


def test_a_signature_from_another_namespace_is_not_valid():
    eng = engine(make_ctx(), [PROFILE])
    _, mutated = mutate_and_check(make_job().obj(), eng)
    mutated["metadata"]["namespace"] = "team-b"
    result = admit(mutated, eng, webhook="validate")
    assert not result.decision.allowed


def execution_job():
    """An execution Job as the controller creates it: role execution, signed."""
    job = (
        make_job("vector-add-execution")
        .label(v.WORKLOAD_LABEL, "vector-add")
        .label(v.ROLE_LABEL, "execution")
        .obj()
    )
    sign_block(job["metadata"], namespace="team-a", key=TEST_KEY)
    return job


def test_execution_job_from_the_controller_gets_hints_and_is_re_signed():
    job = execution_job()
    eng = engine(make_ctx(), [PROFILE])
    result, mutated = mutate_and_check(job, eng)
    assert result.decision.action == "hints"
    assert mutated["metadata"]["labels"][v.ROLE_LABEL] == "execution"


# --- base hints: every opted-in GPU object, profile or not (DESIGN "Hints") ----------------------

ENTRYPOINT_JOB = make_job("entrypoint").command()  # runs its image's entrypoint: cannot be profiled
TWO_GPU_CONTAINERS = make_job("two-gpus").add_container("second", {GPU: 1})


def assert_base_hints(mutated: dict[str, Any], kind: str, *, ranked: bool) -> dict[str, Any]:
    pod = mutated["spec"] if kind == "Pod" else mutated["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert all(
        {"key": v.GPU_PRESENT_LABEL, "operator": "In", "values": ["true"]} in t["matchExpressions"]
        for t in terms
    )
    preferred = pod["affinity"]["nodeAffinity"].get("preferredDuringSchedulingIgnoredDuringExecution", [])
    assert bool(preferred) == ranked
    record: dict[str, Any] = json.loads(mutated["metadata"]["annotations"][v.HINTS_ANNOTATION])
    return record


@pytest.mark.parametrize(
    ("builder", "profiles", "warning", "reason"),
    [
        pytest.param(
            make_job().annotate(v.PROFILING_ANNOTATION, "false"), [], "profiling is off", "profiling is off",
            id="profiling-off",
        ),
        pytest.param(
            make_job(), [make_profile(phase="Failed", message="ncu: ERR_NVGPUCTRPERM")],
            "is Failed (ncu: ERR_NVGPUCTRPERM)", "WorkloadProfile vector-add-profile is Failed", id="failed-profile",
        ),
        pytest.param(make_pod(), [], "Pods are never rewritten", "no WorkloadProfile", id="bare-pod"),
        pytest.param(
            ENTRYPOINT_JOB, [], "runs its image's entrypoint", "cannot be profiled", id="entrypoint-job",
        ),
        pytest.param(
            TWO_GPU_CONTAINERS, [], "2 containers that use a GPU", "cannot be profiled", id="two-gpu-containers",
        ),
    ],
)  # fmt: skip
def test_objects_without_ranked_hints_get_base_hints_and_a_reason(builder, profiles, warning, reason):
    obj = builder.obj()
    result, mutated = mutate_and_check(obj, engine(make_ctx(), profiles))
    assert result.decision.action == "hints"
    assert any(warning in w for w in result.decision.warnings), result.decision.warnings
    record = assert_base_hints(mutated, obj["kind"], ranked=False)
    assert record["profile"] is None and record["ranked"] == [] and reason in record["reason"]
    assert v.PROFILE_ANNOTATION not in mutated["metadata"]["annotations"]


def test_a_job_that_cannot_be_profiled_says_how_to_enable_profiling():
    result = admit(ENTRYPOINT_JOB.obj(), engine(make_ctx()))
    [warning] = result.decision.warnings
    assert "command[0]" in warning and v.EXECUTABLE_ANNOTATION in warning


def test_execution_job_without_a_profile_is_never_profiled_again_but_gets_base_hints():
    result, mutated = mutate_and_check(execution_job(), engine(make_ctx()))
    assert result.decision.action == "hints"
    assert "execution Job admitted with base hints only" in result.decision.warnings[0]
    assert mutated["metadata"]["labels"][v.ROLE_LABEL] == "execution"
    assert_base_hints(mutated, "Job", ranked=False)


def test_the_profiling_run_gets_base_hints_so_it_reaches_tainted_gpu_nodes():
    """Base hints, and no ranking: only one preferred term, for the product whose catalog figures are
    all measured (the H100 80GB HBM3 of this cluster: issue 52, profile where the figures are known)."""
    result, mutated = mutate_and_check(make_job().obj(), engine(make_ctx()))
    assert result.decision.action == "profiling"
    record = assert_base_hints(mutated, "Job", ranked=True)
    [term] = mutated["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["weight"] == 100 and term["preference"]["matchExpressions"][0]["values"] == [
        "NVIDIA-H100-80GB-HBM3"
    ]
    assert record["reason"] == "profiling run" and record["ranked"] == []
    template_annotations = mutated["spec"]["template"]["metadata"]["annotations"]
    assert template_annotations[v.HINTS_ANNOTATION] == mutated["metadata"]["annotations"][v.HINTS_ANNOTATION]


@pytest.mark.parametrize(
    ("backend", "annotation", "expected"),
    [
        pytest.param("kai", None, v.KAI_SCHEDULER_NAME, id="kai"),
        pytest.param("volcano", None, v.VOLCANO_SCHEDULER_NAME, id="volcano"),
        pytest.param("kai", "default", v.DEFAULT_SCHEDULER_NAME, id="annotation-keeps-default"),
        pytest.param("default", "volcano", v.VOLCANO_SCHEDULER_NAME, id="annotation-chooses-volcano"),
    ],
)
def test_the_servers_default_scheduler_name_is_no_choice(backend, annotation, expected):
    builder = make_job().spec(schedulerName=v.DEFAULT_SCHEDULER_NAME, dnsPolicy="ClusterFirst")
    if annotation:
        builder = builder.annotate(v.SCHEDULER_ANNOTATION, annotation)
    for profiles in ([PROFILE], []):
        _, mutated = mutate_and_check(builder.obj(), engine(make_ctx(scheduler=backend), profiles))
        assert mutated["spec"]["template"]["spec"]["schedulerName"] == expected


def test_a_scheduler_the_user_chose_is_kept():
    obj = make_job().spec(schedulerName="my-scheduler").obj()
    _, mutated = mutate_and_check(obj, engine(make_ctx(scheduler="kai"), [PROFILE]))
    assert mutated["spec"]["template"]["spec"]["schedulerName"] == "my-scheduler"


def test_unlabelled_objects_are_never_touched():
    result = admit(make_job().unlabelled().obj(), engine(make_ctx(), [PROFILE]))
    assert result.outcome == "allowed" and result.patch == [] and not result.decision.warnings


def test_mutating_denies_a_broken_object_with_every_reason():
    obj = make_job().limits({GPU: "1.5"}).annotate(v.PRIORITY_ANNOTATION, "urgent").obj()
    result = admit(obj, engine(make_ctx(), [PROFILE]))
    assert not result.decision.allowed
    message = result.body["response"]["status"]["message"]
    assert f"spec.template.spec.containers[0].resources.limits[{GPU}]: must be a positive integer" in message
    assert "(gpu-count)" in message and "(hint-format)" in message
    assert result.body["response"]["status"]["code"] == 403


def test_profile_in_another_namespace_does_not_apply():
    result = admit(make_job(namespace="team-b").obj(), engine(make_ctx(), [PROFILE]))
    assert result.decision.action == "profiling"


# --- Pod Security "restricted" (tests/pod_security.py, v1.28 of the standard) --------------------

RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.mark.parametrize(
    "builder",
    [
        pytest.param(
            make_job().spec(
                securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            ),
            id="pod-level-context",
        ),
        pytest.param(make_job().spec(securityContext={}), id="container-level-context"),
    ],
)
def test_the_profiling_rewrite_passes_restricted_whenever_the_users_pod_does(builder):
    obj = builder.obj()
    container = obj["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"] = (
        {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        if obj["spec"]["template"]["spec"]["securityContext"]
        else dict(RESTRICTED_CONTAINER)
    )
    template = obj["spec"]["template"]
    assert restricted_violations(template.get("metadata", {}), template["spec"]) == []
    result, mutated = mutate_and_check(obj, engine(make_ctx()))
    assert result.decision.action == "profiling"
    rewritten = mutated["spec"]["template"]
    assert restricted_violations(rewritten["metadata"], rewritten["spec"]) == []
    stage = rewritten["spec"]["initContainers"][-1]
    assert stage["resources"]["requests"] and stage["resources"]["limits"]


def test_the_checker_sees_what_restricted_refuses_in_a_plain_pod():
    """The checker itself is not vacuous: an ordinary pod fails restricted, and so does its rewrite."""
    obj = make_job().obj()
    template = obj["spec"]["template"]
    refused = restricted_violations({}, template["spec"])
    assert any("allowPrivilegeEscalation" in r for r in refused) and any("runAsNonRoot" in r for r in refused)
    _, mutated = mutate_and_check(obj, engine(make_ctx(profilingCapabilities=["SYS_ADMIN"])))
    rewritten = mutated["spec"]["template"]
    assert any("SYS_ADMIN" in r for r in restricted_violations(rewritten["metadata"], rewritten["spec"]))


# --- one profiling run per workload: Jobs created back to back --------------------------------------


def test_jobs_created_back_to_back_are_held_behind_the_first_profiling_run():
    eng = engine(make_ctx())
    first = admit(make_job("sweep-0").label(v.WORKLOAD_LABEL, "sweep").obj(), eng)
    assert first.decision.action == "profiling"
    for i in (1, 2):
        follower = admit(make_job(f"sweep-{i}").label(v.WORKLOAD_LABEL, "sweep").obj(), eng)
        mutated = follower.decision.mutated
        assert follower.decision.action == "hints" and mutated is not None
        assert mutated["spec"]["suspend"] is True
        assert mutated["metadata"]["annotations"][v.AWAITING_PROFILE_ANNOTATION] == "sweep-profile"


def test_a_dry_run_notes_no_run_and_the_note_expires():
    clock = [0.0]
    eng = engine(make_ctx())
    eng.runs.clock = lambda: clock[0]
    job = make_job("sweep-0").label(v.WORKLOAD_LABEL, "sweep").obj()
    dry = admit(job, eng, dry_run=True)
    assert dry.decision.action == "profiling"
    assert admit(job, eng).decision.action == "profiling", "the dry run left nothing behind"
    other = make_job("sweep-1").label(v.WORKLOAD_LABEL, "sweep").obj()
    assert admit(other, eng).decision.action == "hints", "held behind the run just admitted"
    clock[0] = eng.runs.ttl + 1  # the API server may have refused the first Job: profile again
    assert admit(other, eng).decision.action == "profiling"


def test_the_same_job_submitted_again_after_its_create_was_refused_is_profiled_not_held():
    """Issue 36: Kueue's webhook down refuses the create after KRATOS rewrote it; the user's retry of
    the same Job is no follower of a run that never was. KRATOS's own rewrite seen again (reinvoked
    after another webhook) and the validating call keep the memory for the real followers."""
    eng = engine(make_ctx())
    job = make_job("sweep-0").label(v.WORKLOAD_LABEL, "sweep").obj()
    first = admit(job, eng)
    assert first.decision.action == "profiling" and first.decision.mutated is not None
    assert admit(first.decision.mutated, eng).patch == [], "reinvoked on its own rewrite: unchanged"
    assert admit(first.decision.mutated, eng, webhook="validate").decision.allowed
    follower = make_job("sweep-1").label(v.WORKLOAD_LABEL, "sweep").obj()
    assert admit(follower, eng).decision.action == "hints", "the memory is still there"
    assert admit(job, eng).decision.action == "profiling", "the same Job again: profiled"


@pytest.mark.parametrize(
    ("failure", "promise"),
    [
        ("counters-in-use", "with telemetry configured, the workload's runs make the profile Ready"),
        ("no-kernels", "delete the profile to profile again"),
    ],
)
def test_a_failed_profile_never_promises_a_profiling_run_its_class_makes_impossible(
    failure: str, promise: str
):
    """Issue 31: after counters-in-use (or counter-permission, no-gpu) a new profiling run meets the
    same nodes; the warning says so and names telemetry, not "delete the profile to profile again"."""
    failed = make_profile(phase="Failed", message="another profiler holds this GPU's performance counters")
    assert failed.status is not None
    failed = failed.model_copy(update={"status": failed.status.model_copy(update={"failure": failure})})
    result, _ = mutate_and_check(make_job().obj(), engine(make_ctx(), [failed]))
    [warning] = [w for w in result.decision.warnings if "is Failed" in w]
    assert promise in warning
    assert ("delete the profile to profile again" in warning) == (failure == "no-kernels")
