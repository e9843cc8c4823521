"""Every rule id: a table of objects it denies, and the nearest objects it allows."""

from __future__ import annotations

from typing import Any

import pytest

from kratos_admit.decisions.policy import validate
from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.fields import RULES
from tests.builders import make_job, make_pod, make_profile
from tests.harness import admit, engine, make_ctx

GPU = v.GPU_RESOURCE
PROFILE = make_profile()


def violations(obj: dict[str, Any], *, profile=PROFILE, operation: str = "CREATE", old=None, **config):
    decision = validate(
        obj,
        obj["kind"],
        old=old,
        operation=operation,
        namespace=obj["metadata"].get("namespace", "team-a"),
        profile=profile,
        ctx=make_ctx(**config),
    )
    assert decision.allowed == (not decision.violations)
    return [(e.rule, e.field) for e in decision.violations]


C0 = "spec.template.spec.containers[0]"
P0 = "spec.containers[0]"

DENIED = [
    # gpu-count
    pytest.param(
        make_job().limits({GPU: "1.5"}), "gpu-count", f"{C0}.resources.limits[{GPU}]", id="gpu-count-fraction"
    ),
    pytest.param(
        make_job().limits({GPU: 0}), "gpu-count", f"{C0}.resources.limits[{GPU}]", id="gpu-count-zero"
    ),
    pytest.param(
        make_pod().limits({GPU: "one"}),
        "gpu-count",
        f"{P0}.resources.limits[{GPU}]",
        id="gpu-count-not-a-number",
    ),
    pytest.param(
        make_job().no_resources().requests({GPU: 1}),
        "gpu-count",
        f"{C0}.resources.requests[{GPU}]",
        id="gpu-count-request-without-limit",
    ),
    pytest.param(
        make_job().limits({GPU: 1}).requests({GPU: 2}),
        "gpu-count",
        f"{C0}.resources.requests[{GPU}]",
        id="gpu-count-request-differs",
    ),
    # gpu-max
    pytest.param(make_job().limits({GPU: 9}), "gpu-max", "spec.template.spec", id="gpu-max-one-container"),
    pytest.param(
        make_job().limits({GPU: 5}).add_container("second", {GPU: 4}),
        "gpu-max",
        "spec.template.spec",
        id="gpu-max-sum-of-containers",
    ),
    pytest.param(
        make_pod().limits({GPU: 1}).add_container("init", {GPU: 9}, init=True),
        "gpu-max",
        "spec",
        id="gpu-max-init-container",
    ),
    # mig-profile
    pytest.param(
        make_job().limits({"nvidia.com/mig-9g.99gb": 1}),
        "mig-profile",
        f"{C0}.resources.limits[nvidia.com/mig-9g.99gb]",
        id="mig-unknown-profile",
    ),
    pytest.param(
        make_job().limits({"nvidia.com/mig-1g.5gb": 1, GPU: 1}),
        "mig-profile",
        f"{C0}.resources",
        id="mig-and-full-gpu",
    ),
    pytest.param(
        make_pod().limits({"nvidia.com/mig-1g.5gb": "0"}),
        "mig-profile",
        f"{P0}.resources.limits[nvidia.com/mig-1g.5gb]",
        id="mig-zero",
    ),
    # gpu-sharing
    pytest.param(
        make_pod().no_resources().pod_annotate("gpu-fraction", "0.5").pod_annotate("gpu-memory", "2000"),
        "gpu-sharing",
        "metadata.annotations[gpu-memory]",
        id="sharing-fraction-and-memory",
    ),
    pytest.param(
        make_pod().no_resources().pod_annotate("gpu-fraction", "1"),
        "gpu-sharing",
        "metadata.annotations[gpu-fraction]",
        id="sharing-fraction-one",
    ),
    pytest.param(
        make_pod().no_resources().pod_annotate("gpu-fraction", "0"),
        "gpu-sharing",
        "metadata.annotations[gpu-fraction]",
        id="sharing-fraction-zero",
    ),
    pytest.param(
        make_pod().no_resources().pod_annotate("gpu-fraction", "half"),
        "gpu-sharing",
        "metadata.annotations[gpu-fraction]",
        id="sharing-fraction-not-a-number",
    ),
    pytest.param(
        make_pod().no_resources().pod_annotate("gpu-memory", "2Gi"),
        "gpu-sharing",
        "metadata.annotations[gpu-memory]",
        id="sharing-memory-with-unit",
    ),
    pytest.param(
        make_pod().no_resources().pod_annotate("gpu-memory", "0"),
        "gpu-sharing",
        "metadata.annotations[gpu-memory]",
        id="sharing-memory-zero",
    ),
    pytest.param(
        make_job().pod_annotate("gpu-fraction", "0.5"),
        "gpu-sharing",
        f"{C0}.resources",
        id="sharing-with-gpu-limit",
    ),
    pytest.param(
        make_pod()
        .no_resources()
        .pod_annotate("gpu-fraction", "0.5")
        .pod_annotate("gpu-fraction-num-devices", "0"),
        "gpu-sharing",
        "metadata.annotations[gpu-fraction-num-devices]",
        id="sharing-num-devices-zero",
    ),
    pytest.param(
        make_pod().pod_annotate("gpu-fraction-num-devices", "2"),
        "gpu-sharing",
        "metadata.annotations[gpu-fraction-num-devices]",
        id="sharing-num-devices-alone",
    ),
    pytest.param(
        make_pod()
        .no_resources()
        .pod_annotate("gpu-fraction", "0.5")
        .pod_annotate("gpu-fraction-container-name", "nope"),
        "gpu-sharing",
        "metadata.annotations[gpu-fraction-container-name]",
        id="sharing-unknown-container",
    ),
    # no-gpu
    pytest.param(make_job().no_resources(), "no-gpu", "spec.template.spec", id="no-gpu-job"),
    pytest.param(make_pod().limits({"cpu": "1"}), "no-gpu", "spec", id="no-gpu-pod-cpu-only"),
    # hint-format
    pytest.param(
        make_job().annotate(v.MIN_CC_ANNOTATION, "8"),
        "hint-format",
        f"metadata.annotations[{v.MIN_CC_ANNOTATION}]",
        id="hint-cc-no-minor",
    ),
    pytest.param(
        make_job().annotate(v.MIN_MEMORY_ANNOTATION, "lots"),
        "hint-format",
        f"metadata.annotations[{v.MIN_MEMORY_ANNOTATION}]",
        id="hint-memory-not-quantity",
    ),
    pytest.param(
        make_job().annotate(v.MIN_MEMORY_ANNOTATION, "512Ki"),
        "hint-format",
        f"metadata.annotations[{v.MIN_MEMORY_ANNOTATION}]",
        id="hint-memory-too-small",
    ),
    pytest.param(
        make_job().annotate(v.PRIORITY_ANNOTATION, "urgent"),
        "hint-format",
        f"metadata.annotations[{v.PRIORITY_ANNOTATION}]",
        id="hint-priority",
    ),
    pytest.param(
        make_job().annotate(v.PROFILING_ANNOTATION, "yes"),
        "hint-format",
        f"metadata.annotations[{v.PROFILING_ANNOTATION}]",
        id="hint-profiling",
    ),
    pytest.param(
        make_job().annotate(v.EXECUTABLE_ANNOTATION, "bin/app"),
        "hint-format",
        f"metadata.annotations[{v.EXECUTABLE_ANNOTATION}]",
        id="hint-executable-relative",
    ),
    pytest.param(
        make_job().annotate(v.PROFILING_FORM_ANNOTATION, "inimage"),
        "hint-format",
        f"metadata.annotations[{v.PROFILING_FORM_ANNOTATION}]",
        id="hint-profiling-form-unknown",
    ),
    pytest.param(
        make_job().annotate(v.SCHEDULER_ANNOTATION, "yunikorn"),
        "hint-format",
        f"metadata.annotations[{v.SCHEDULER_ANNOTATION}]",
        id="hint-scheduler-unknown",
    ),
    pytest.param(
        make_job().annotate(v.PROFILE_SKIP_ANNOTATION, "-1"),
        "hint-format",
        f"metadata.annotations[{v.PROFILE_SKIP_ANNOTATION}]",
        id="hint-skip-kernels-negative",
    ),
    # workload-name
    pytest.param(
        make_job().label(v.WORKLOAD_LABEL, "Vector_Add"),
        "workload-name",
        f"metadata.labels[{v.WORKLOAD_LABEL}]",
        id="name-uppercase",
    ),
    pytest.param(
        make_job().label(v.WORKLOAD_LABEL, "a" * 64),
        "workload-name",
        f"metadata.labels[{v.WORKLOAD_LABEL}]",
        id="name-64-chars",
    ),
    pytest.param(
        make_pod().label(v.WORKLOAD_LABEL, "-lead"),
        "workload-name",
        f"metadata.labels[{v.WORKLOAD_LABEL}]",
        id="name-leading-dash",
    ),
    # reserved-key
    pytest.param(
        make_job().annotate(v.HINTS_ANNOTATION, "{}"),
        "reserved-key",
        f"metadata.annotations[{v.HINTS_ANNOTATION}]",
        id="reserved-hints-unsigned",
    ),
    pytest.param(
        make_job().label(v.ROLE_LABEL, "execution"),
        "reserved-key",
        f"metadata.labels[{v.ROLE_LABEL}]",
        id="reserved-role-unsigned",
    ),
    pytest.param(
        make_pod().annotate(v.PROFILE_ANNOTATION, "x@1").annotate(v.SIGNATURE_ANNOTATION, "hmac-sha256:00"),
        "reserved-key",
        f"metadata.annotations[{v.PROFILE_ANNOTATION}]",
        id="reserved-forged-signature",
    ),
    pytest.param(
        make_job().pod_annotate(v.SIGNATURE_ANNOTATION, "hmac-sha256:00"),
        "reserved-key",
        f"spec.template.metadata.annotations[{v.SIGNATURE_ANNOTATION}]",
        id="reserved-signature-alone",
    ),
]


@pytest.mark.parametrize(("builder", "rule", "field"), DENIED)
def test_rule_denies(builder, rule, field):
    found = violations(builder.obj())
    assert (rule, field) in found, found


ALLOWED = [
    pytest.param(make_job().limits({GPU: "1"}), id="gpu-count-string-one"),
    pytest.param(make_job().limits({GPU: 2}).requests({GPU: "2"}), id="gpu-count-request-equals-limit"),
    pytest.param(make_job().limits({GPU: 8}), id="gpu-max-exactly-max"),
    pytest.param(
        make_pod()
        .limits({GPU: 4})
        .add_container("second", {GPU: 4})
        .add_container("init", {GPU: 8}, init=True),
        id="gpu-max-init-overlaps",
    ),
    pytest.param(
        make_job().limits({"nvidia.com/mig-1g.5gb": "1"}).requests({"nvidia.com/mig-1g.5gb": "1"}),
        id="mig-known-profile",
    ),
    pytest.param(
        make_pod().limits({"nvidia.com/mig-3g.20gb": 1, "nvidia.com/mig-1g.10gb.me": 1}),
        id="mig-media-engine-variant",
    ),
    pytest.param(make_pod().no_resources().pod_annotate("gpu-fraction", "0.5"), id="sharing-fraction"),
    pytest.param(make_pod().no_resources().pod_annotate("gpu-memory", "2000"), id="sharing-memory"),
    pytest.param(
        make_pod()
        .no_resources()
        .pod_annotate("gpu-fraction", "0.25")
        .pod_annotate("gpu-fraction-num-devices", "2"),
        id="sharing-num-devices",
    ),
    pytest.param(
        make_pod()
        .no_resources()
        .add_container("gpu-init", init=True)
        .pod_annotate("gpu-fraction", "0.5")
        .pod_annotate("gpu-fraction-container-name", "gpu-init"),
        id="sharing-init-container",
    ),
    pytest.param(make_pod().dra_claim("gpu", "one-gpu"), id="dra-claim-counts-as-gpu"),
    pytest.param(make_job().dra_claim("gpu", "one-gpu"), id="dra-claim-in-job-template"),
    pytest.param(
        make_job()
        .annotate(v.MIN_CC_ANNOTATION, "8.6")
        .annotate(v.MIN_MEMORY_ANNOTATION, "40Gi")
        .annotate(v.PRIORITY_ANNOTATION, "high")
        .annotate(v.PROFILING_ANNOTATION, "false")
        .annotate(v.EXECUTABLE_ANNOTATION, "/usr/bin/app")
        .annotate(v.SCHEDULER_ANNOTATION, "volcano")
        .annotate(v.PROFILE_SKIP_ANNOTATION, "10")
        .annotate(v.PROFILING_FORM_ANNOTATION, "in-image"),
        id="hint-formats",
    ),
    pytest.param(make_job().label(v.WORKLOAD_LABEL, "a" * 63), id="name-63-chars"),
    pytest.param(make_job().label(v.WORKLOAD_LABEL, "vector-add-2"), id="name-with-digits"),
]


@pytest.mark.parametrize("builder", ALLOWED)
def test_nearest_allowed_case_passes(builder):
    assert violations(builder.obj()) == []


def test_every_rule_has_a_denied_case():
    covered = {p.values[1] for p in DENIED} | {"profiling-target"}
    assert covered == set(RULES)


@pytest.mark.parametrize(
    ("builder", "field"),
    [
        pytest.param(
            make_job().add_container("second", {GPU: 1}),
            "spec.template.spec.containers",
            id="two-gpu-containers",
        ),
        pytest.param(
            make_job().command("python3", "train.py").annotate(v.PROFILING_FORM_ANNOTATION, "staged"),
            f"{C0}.command",
            id="relative-command-staged-by-annotation",
        ),
        pytest.param(make_job().command(), f"{C0}.command", id="no-command-no-annotation"),
        pytest.param(
            make_job().command().annotate(v.PROFILING_FORM_ANNOTATION, "in-image"),
            f"{C0}.command",
            id="no-command-in-image",
        ),
    ],
)
def test_profiling_target_denies_only_profiling_asked_for_explicitly(builder, field):
    asked = builder.annotate(v.PROFILING_ANNOTATION, "true").obj()
    assert ("profiling-target", field) in violations(asked, profile=None)
    by_default = builder.obj()
    del by_default["metadata"]["annotations"][v.PROFILING_ANNOTATION]
    assert violations(by_default, profile=None) == [], "profiling by default never denies a Job"


@pytest.mark.parametrize(
    ("builder", "config", "message_part"),
    [
        pytest.param(
            make_job().command("python3", "train.py"),
            {"profilingForm": "staged"},
            "profiling-form: in-image",
            id="relative-command-staged-by-config",
        ),
        pytest.param(make_job().command(), {}, "give it a command", id="entrypoint-auto"),
    ],
)
def test_profiling_target_says_what_the_requested_form_needs(builder, config, message_part):
    obj = builder.annotate(v.PROFILING_ANNOTATION, "true").obj()
    decision = validate(
        obj, "Job", old=None, operation="CREATE", namespace="team-a", profile=None, ctx=make_ctx(**config)
    )
    [error] = decision.violations
    assert (error.rule, error.field) == ("profiling-target", f"{C0}.command")
    assert message_part in error.detail


def test_a_bad_profiling_form_is_denied_with_what_is_allowed():
    obj = make_job().annotate(v.PROFILING_FORM_ANNOTATION, "inimage").obj()
    decision = validate(
        obj, "Job", old=None, operation="CREATE", namespace="team-a", profile=PROFILE, ctx=make_ctx()
    )
    [error] = decision.violations
    assert error.rule == "hint-format" and error.detail == "'inimage' must be one of staged, in-image"


@pytest.mark.parametrize(
    ("builder", "profile"),
    [
        pytest.param(make_job(), None, id="absolute-command"),
        pytest.param(make_job().command("python3", "train.py"), None, id="relative-command-in-image"),
        pytest.param(make_job().command("./bin/app"), None, id="relative-path-in-image"),
        pytest.param(
            make_job().command().annotate(v.EXECUTABLE_ANNOTATION, "/usr/bin/python3"),
            None,
            id="entrypoint-with-executable-annotation",
        ),
        pytest.param(
            make_job().command("python3", "train.py").annotate(v.EXECUTABLE_ANNOTATION, "/usr/bin/python3"),
            None,
            id="annotation-names-executable",
        ),
        pytest.param(
            make_job().add_container("second", {GPU: 1}).annotate(v.PROFILING_ANNOTATION, "false"),
            None,
            id="profiling-off",
        ),
        pytest.param(make_job().add_container("second", {GPU: 1}), PROFILE, id="profile-exists"),
        pytest.param(make_pod().command(), None, id="pods-are-never-profiled"),
    ],
)
def test_profiling_target_allows_nearest_cases(builder, profile):
    obj = builder.obj()
    obj["metadata"].setdefault("annotations", {}).setdefault(v.PROFILING_ANNOTATION, "true")
    assert violations(obj, profile=profile) == []


def test_profiling_default_off_in_config_skips_profiling_target():
    obj = make_job().add_container("second", {GPU: 1}).obj()
    assert violations(obj, profile=None, profilingDefault=False) == []


def test_object_with_several_problems_lists_all_of_them():
    obj = (
        make_job()
        .label(v.WORKLOAD_LABEL, "Bad_Name")
        .annotate(v.PRIORITY_ANNOTATION, "urgent")
        .annotate(v.HINTS_ANNOTATION, "{}")
        .limits({GPU: "1.5"})
        .add_container("second", {"nvidia.com/mig-9g.99gb": 1})
        .obj()
    )
    rules = [rule for rule, _ in violations(obj)]
    assert set(rules) == {"workload-name", "hint-format", "reserved-key", "gpu-count", "mig-profile"}


@pytest.mark.parametrize("webhook", ["validate", "mutate"])
def test_unlabelled_objects_are_never_checked(webhook):
    unlabelled = make_job().unlabelled().no_resources().obj()
    result = admit(unlabelled, engine(make_ctx(), [PROFILE]), webhook=webhook)
    assert result.decision.allowed and result.decision.violations == [] and result.patch == []
    assert result.request.opted_in is False


def test_max_gpus_per_pod_comes_from_config():
    obj = make_job().limits({GPU: 4}).obj()
    assert violations(obj, maxGpusPerPod=2) == [("gpu-max", "spec.template.spec")]


def test_update_denies_only_what_the_update_introduced():
    old = make_job().limits({GPU: "1.5"}).obj()  # stored before KRATOS was installed
    new = make_job().limits({GPU: "1.5"}).annotate(v.PRIORITY_ANNOTATION, "urgent").obj()
    assert violations(new, old=old, operation="UPDATE") == [
        ("hint-format", f"metadata.annotations[{v.PRIORITY_ANNOTATION}]")
    ]


def test_update_that_removes_the_label_still_checks_reserved_keys():
    old = make_job().obj()
    new = make_job().unlabelled().annotate(v.HINTS_ANNOTATION, "{}").obj()
    assert ("reserved-key", f"metadata.annotations[{v.HINTS_ANNOTATION}]") in violations(
        new, old=old, operation="UPDATE"
    )
