from __future__ import annotations

import io
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from kratos_admit.certs import generate
from kratos_admit.cli import main


def test_chain_verifies_and_sans_are_exact(tmp_path: Path):
    generate(service="kratos-webhook", namespace="kratos-system", out=tmp_path, days=30)
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
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


def test_private_keys_are_0600_and_signing_key_is_long_enough(tmp_path: Path):
    generate(service="s", namespace="n", out=tmp_path)
    for name in ("ca.key", "tls.key", "signing.key"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert len((tmp_path / "signing.key").read_bytes().strip()) >= 32


def test_cli_refuses_to_overwrite_without_force(tmp_path: Path):
    out, err = io.StringIO(), io.StringIO()
    argv = ["certs", "generate", "--service", "s", "--namespace", "n", "--out", str(tmp_path)]
    assert main(argv, stdout=out, stderr=err) == 0
    first = (tmp_path / "tls.crt").read_bytes()
    assert main(argv, stdout=out, stderr=err) == 2
    assert "already exist; pass --force to overwrite" in err.getvalue()
    assert (tmp_path / "tls.crt").read_bytes() == first
    assert main([*argv, "--force"], stdout=out, stderr=err) == 0
    assert (tmp_path / "tls.crt").read_bytes() != first
