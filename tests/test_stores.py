from __future__ import annotations

from pathlib import Path

import pytest

from kratos_admit.edge.files import FileNodeStore, FileProfileStore, StoreError
from tests.harness import EXAMPLES


def test_example_profiles_and_nodes_load():
    profiles = FileProfileStore(EXAMPLES / "profiles")
    assert len(profiles) == 3 and profiles.ready()  # vector-add, nbody, embed-server (from telemetry)
    profile = profiles.get("team-a", "vector-add")
    assert profile is not None and profile.ready and profile.reference == "vector-add-profile@4711"
    assert profiles.get("team-b", "vector-add") is None
    embed = profiles.get("team-a", "embed-server")
    assert (
        embed is not None and embed.ready and embed.status is not None and embed.status.source == "telemetry"
    )
    nodes = FileNodeStore(EXAMPLES / "nodes.yaml")
    assert nodes.gpu_products() == {
        "NVIDIA-A100-SXM4-80GB",
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-L40S",
        "NVIDIA-L4",
        "Tesla-T4",
    }


def test_multi_document_and_list_files(tmp_path: Path):
    (tmp_path / "p.yaml").write_text(
        "apiVersion: v1\nkind: List\nitems:\n"
        "- {apiVersion: gpu.scheduler.io/v1alpha1, kind: WorkloadProfile, metadata: {name: a-profile, namespace: n},"
        " spec: {workload: a}, status: {phase: Ready, boundType: compute}}\n"
        "---\n"
        "{apiVersion: gpu.scheduler.io/v1alpha1, kind: WorkloadProfile, metadata: {name: b-profile, namespace: n},"
        " spec: {workload: b}, status: {phase: Failed, message: no ncu}}\n"
    )
    store = FileProfileStore(tmp_path)
    assert store.get("n", "a") is not None and store.get("n", "b") is not None
    b = store.get("n", "b")
    assert b is not None and b.status is not None and b.status.phase == "Failed"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "{apiVersion: gpu.scheduler.io/v1alpha1, kind: WorkloadProfile, metadata: {name: x}, spec: {workload: Bad_Name}}",
            "spec.workload",
        ),
        (
            "{apiVersion: gpu.scheduler.io/v1alpha1, kind: WorkloadProfile, metadata: {name: x}, spec: {workload: x, extra: 1}}",
            "spec.extra",
        ),
        (
            "{apiVersion: gpu.scheduler.io/v1alpha1, kind: WorkloadProfile, metadata: {name: x}, spec: {workload: x}, status: {phase: Done}}",
            "status.phase",
        ),
        ("kind: [", "not valid YAML"),
    ],
)
def test_bad_profile_file_names_file_and_field(tmp_path: Path, text, message):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(StoreError) as err:
        FileProfileStore(tmp_path)
    assert "bad.yaml" in str(err.value) and message in str(err.value)


def test_missing_profile_directory_is_a_clear_error(tmp_path: Path):
    with pytest.raises(StoreError, match="no such profile directory"):
        FileProfileStore(tmp_path / "nope")


PROFILE = "{apiVersion: gpu.scheduler.io/v1alpha1, kind: WorkloadProfile, metadata: {name: %s, namespace: team-a}, spec: {workload: vector-add}}\n"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        pytest.param({"odd.yaml": "kind: 5\nitems: [1]\n"}, "odd.yaml: document 1 is not a Kubernetes object", id="non-string-kind"),
        pytest.param({"job.yaml": (EXAMPLES / "vector-add-job.yaml").read_text()}, "job.yaml: document 1 is a Job; --profiles expects", id="a-job"),
        pytest.param({"a.yaml": PROFILE % "one", "b.yaml": PROFILE % "two"},
                     "b.yaml (document 1): a second WorkloadProfile for workload vector-add in namespace team-a; the first is in", id="two-for-one-workload"),
        pytest.param({"bin.yaml": b"\xff\xfe"}, "bin.yaml: not UTF-8 text", id="not-utf-8"),
    ],
)  # fmt: skip
def test_a_profile_directory_holding_anything_but_profiles_is_refused(tmp_path: Path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(StoreError) as err:
        FileProfileStore(tmp_path)
    assert message in str(err.value)
    if len(files) == 2:
        assert "a.yaml (document 1)" in str(err.value)  # both files named


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param((EXAMPLES / "vector-add-job.yaml").read_text(), "document 1 is a Job; --nodes expects a file of Node objects", id="a-job"),
        pytest.param("", "holds no Node", id="empty"),
        pytest.param("kind: Node\n---\n- a list\n", "document 2 is not a Kubernetes object", id="a-list"),
    ],
)  # fmt: skip
def test_a_nodes_file_holding_anything_but_nodes_is_refused(tmp_path: Path, text, message):
    (tmp_path / "nodes.yaml").write_text(text)
    with pytest.raises(StoreError, match=message):
        FileNodeStore(tmp_path / "nodes.yaml")


def test_profiles_must_be_a_directory_not_a_file():
    with pytest.raises(StoreError, match=r"nodes\.yaml: is a file; --profiles expects a directory"):
        FileProfileStore(EXAMPLES / "nodes.yaml")
