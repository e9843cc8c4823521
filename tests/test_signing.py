from __future__ import annotations

from pathlib import Path

import pytest

from kratos_admit.domain import vocabulary as v
from kratos_admit.domain.signing import SigningKeyError, load_signing_key, sign_block, signature_valid
from tests.harness import TEST_KEY


def test_signature_covers_kratos_keys_and_namespace_only():
    meta = {"labels": {v.ROLE_LABEL: "profiling", "app": "x"}, "annotations": {v.HINTS_ANNOTATION: "{}"}}
    sign_block(meta, namespace="team-a", key=TEST_KEY)
    assert signature_valid(meta, namespace="team-a", key=TEST_KEY)
    meta["labels"]["batch.kubernetes.io/job-name"] = "added-by-the-job-controller"
    assert signature_valid(meta, namespace="team-a", key=TEST_KEY)
    assert not signature_valid(meta, namespace="team-b", key=TEST_KEY)
    assert not signature_valid(meta, namespace="team-a", key=TEST_KEY + b"x")
    meta["labels"][v.ROLE_LABEL] = "execution"
    assert not signature_valid(meta, namespace="team-a", key=TEST_KEY)


def test_signing_key_must_be_at_least_32_bytes(tmp_path: Path):
    short = tmp_path / "short.key"
    short.write_text("too-short\n")
    with pytest.raises(SigningKeyError, match="at least 32 bytes"):
        load_signing_key(short)
    with pytest.raises(SigningKeyError, match="No such file"):
        load_signing_key(tmp_path / "missing.key")
    good = tmp_path / "signing.key"
    good.write_text("a" * 64 + "\n")
    assert load_signing_key(good) == b"a" * 64
