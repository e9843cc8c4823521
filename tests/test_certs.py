from __future__ import annotations

import io
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from kratos_admit.cli.main import main
from kratos_admit.webhook.certs import FILES, generate

GENERATE = ["certs", "generate", "--service", "kratos-webhook", "--namespace", "kratos-system", "--out"]


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def _contents(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in FILES}


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_chain_verifies_and_sans_are_exact(tmp_path: Path):
    generate(service="kratos-webhook", namespace="kratos-system", out=tmp_path, days=30)
    ca, cert = _cert(tmp_path / "ca.crt"), _cert(tmp_path / "tls.crt")
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert sans == [
        "kratos-webhook",
        "kratos-webhook.kratos-system",
        "kratos-webhook.kratos-system.svc",
        "kratos-webhook.kratos-system.svc.cluster.local",
    ]
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days in (29, 30)


@pytest.mark.parametrize(
    ("name", "days"), [("ca.crt", 3650), ("tls.crt", 365)], ids=["ca-10-years", "serving-1-year"]
)
def test_validity_follows_kubeadm_ca_ten_years_serving_certificate_one(tmp_path: Path, name: str, days: int):
    generate(service="s", namespace="n", out=tmp_path)
    cert = _cert(tmp_path / name)
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime.days == days, "5 minutes of backdating round down to the whole days"


def test_private_keys_are_0600_and_signing_key_is_long_enough(tmp_path: Path):
    generate(service="s", namespace="n", out=tmp_path)
    for name in ("ca.key", "tls.key", "signing.key"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert len((tmp_path / "signing.key").read_bytes().strip()) >= 32
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no staged file left"


@pytest.mark.parametrize(
    ("flags", "replaced"),
    [
        ([], {"tls.crt", "tls.key"}),
        (["--new-ca"], {"tls.crt", "tls.key", "ca.crt", "ca.key"}),
        (["--new-signing-key"], {"tls.crt", "tls.key", "signing.key"}),
        (["--new-ca", "--new-signing-key"], set(FILES)),
        (["--new-ca", "--new-signing-key", "--force"], set(FILES)),
    ],
    ids=["no-flag-keeps-ca-and-key", "new-ca", "new-signing-key", "both", "both-with-force"],
)
def test_generate_over_an_existing_directory_replaces_only_what_the_flags_name(
    tmp_path: Path, flags: list[str], replaced: set[str]
):
    assert _run([*GENERATE, str(tmp_path)])[0] == 0
    before = _contents(tmp_path)
    status, out, err = _run([*GENERATE, str(tmp_path), *flags])
    assert status == 0, err
    after = _contents(tmp_path)
    assert {name for name in FILES if after[name] != before[name]} == replaced
    _cert(tmp_path / "tls.crt").verify_directly_issued_by(_cert(tmp_path / "ca.crt"))
    assert all(f"{name}" in out.split("; kept")[0] for name in replaced)


def test_generate_with_force_refuses_to_replace_the_ca_or_signing_key_in_one_line(tmp_path: Path):
    assert _run([*GENERATE, str(tmp_path)])[0] == 0
    before = _contents(tmp_path)
    status, _, err = _run([*GENERATE, str(tmp_path), "--force"])
    assert status == 2
    assert err.count("\n") == 1 and "ca.crt and signing.key" in err and "--new-ca" in err
    assert _contents(tmp_path) == before


def test_generate_with_force_into_an_empty_directory_still_works(tmp_path: Path):
    assert _run([*GENERATE, str(tmp_path / "fresh"), "--force"])[0] == 0
    assert sorted(p.name for p in (tmp_path / "fresh").iterdir()) == sorted(FILES)


def test_rotate_issues_a_new_serving_certificate_and_leaves_ca_and_signing_key_byte_identical(tmp_path: Path):
    generate(service="kratos-webhook", namespace="kratos-system", out=tmp_path, extra_names=("127.0.0.1",))
    before = _contents(tmp_path)
    old = _cert(tmp_path / "tls.crt")
    status, out, err = _run(["certs", "rotate", "--dir", str(tmp_path)])
    assert status == 0, err
    after = _contents(tmp_path)
    assert {name for name in FILES if after[name] != before[name]} == {"tls.crt", "tls.key"}
    new = _cert(tmp_path / "tls.crt")
    new.verify_directly_issued_by(_cert(tmp_path / "ca.crt"))
    assert new.subject == old.subject
    assert (
        new.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        == old.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ), "the same DNS names and IP addresses"
    assert new.serial_number != old.serial_number
    assert "wrote tls.crt, tls.key" in out and "kept ca.crt, ca.key, signing.key" in out


def _drop(directory: Path, name: str) -> Path:
    (directory / name).unlink()
    return directory


def _corrupt(directory: Path, name: str) -> Path:
    (directory / name).write_text("not pem\n")
    return directory


def _other_ca_key(directory: Path, name: str) -> Path:
    generate(service="x", namespace="y", out=directory.parent / "other")
    shutil.copy(directory.parent / "other" / name, directory / name)
    return directory


@pytest.mark.parametrize(
    ("command", "damage", "name", "message"),
    [
        ("rotate", _drop, "ca.key", "ca.key missing"),
        ("rotate", _drop, "tls.crt", "nothing to rotate"),
        ("rotate", _corrupt, "ca.crt", "ca.crt: not a PEM certificate"),
        ("rotate", _other_ca_key, "ca.key", "ca.key is not the key of"),
        ("generate", _drop, "ca.key", "ca.key missing"),
        ("generate", _corrupt, "ca.key", "ca.key: not an unencrypted PEM private key"),
    ],
    ids=[
        "rotate-without-ca-key",
        "rotate-without-serving-cert",
        "rotate-with-garbage-ca",
        "rotate-with-foreign-ca-key",
        "generate-with-half-a-ca",
        "generate-with-garbage-ca-key",
    ],
)
def test_unusable_certificate_directories_exit_2_with_one_line_naming_the_file(
    tmp_path: Path, command: str, damage: Callable[[Path, str], Path], name: str, message: str
):
    directory = tmp_path / "certs"
    generate(service="s", namespace="n", out=directory)
    damage(directory, name)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    argv = (
        ["certs", "rotate", "--dir", str(directory)] if command == "rotate" else [*GENERATE, str(directory)]
    )
    status, _, err = _run(argv)
    assert status == 2 and err.count("\n") == 1 and message in err, err
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before, "nothing written"


def test_a_serving_certificate_never_outlives_its_ca(tmp_path: Path):
    generate(service="s", namespace="n", out=tmp_path)
    before = _contents(tmp_path)
    status, _, err = _run(["certs", "rotate", "--dir", str(tmp_path), "--days", "4000"])
    assert status == 2 and "roll the CA first" in err
    assert _contents(tmp_path) == before
