"""A kubeconfig read as kubectl reads it: the context's server, CA and user; inline secrets
written to private files; credential plugins and broken files refused naming the field."""

from __future__ import annotations

import base64
import ssl
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from redline.platform.spot import KubernetesError
from redline.platform.spot.kubeconfig import load_kubeconfig


def _kubeconfig(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None,
                current: str | None = "ops") -> Path:  # fmt: skip
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "prod", "cluster": cluster or {"server": "http://127.0.0.1:6443"}}],
        "users": [{"name": "gameday", "user": user}],
        "contexts": [
            {"name": "ops", "context": {"cluster": "prod", "user": "gameday"}},
            {"name": "other", "context": {"cluster": "prod", "user": "gameday"}},
        ],
    }
    if current:
        doc["current-context"] = current
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_an_inline_token_is_written_to_a_private_file(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    target = load_kubeconfig(_kubeconfig(tmp_path, {"token": "s3cret"}), None, scratch)
    assert (target.context, target.api_url, target.verify) == (
        "ops",
        "http://127.0.0.1:6443",
        False,
    )
    assert target.token_file is not None and target.token_file.read_text() == "s3cret"
    assert stat.S_IMODE(target.token_file.stat().st_mode) == 0o600


def test_a_token_file_is_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t\n")
    path = _kubeconfig(tmp_path, {"tokenFile": "token"})
    target = load_kubeconfig(path, "other", tmp_path)
    assert target.context == "other" and target.token_file == tmp_path / "token"


def _self_signed() -> tuple[bytes, bytes]:
    """A self-signed certificate and its key, PEM (made in-process: unit tests start nothing)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gameday")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem_key = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), pem_key


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_ca_data_and_a_client_certificate_make_the_tls_context(tmp_path: Path) -> None:
    cert, key = _self_signed()
    path = _kubeconfig(
        tmp_path,
        {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)},
        {"server": "https://k8s.example:6443", "certificate-authority-data": _b64(cert)},
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    target = load_kubeconfig(path, None, scratch)
    assert isinstance(target.verify, ssl.SSLContext)
    assert target.verify.verify_mode == ssl.CERT_REQUIRED
    assert len(target.verify.get_ca_certs()) == 1
    assert target.token_file is None
    assert stat.S_IMODE((scratch / "client.key").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("user", "cluster", "current", "message"),
    [
        ({"exec": {"command": "aws"}}, None, "ops", "exec credential plugin"),
        ({"auth-provider": {"name": "gcp"}}, None, "ops", "auth-provider credential plugin"),
        ({}, None, None, "no current-context"),
        ({}, None, "nope", "no context named 'nope'"),
        ({}, {"server": "k8s:6443"}, "ops", "server must be an URL"),
        ({"tokenFile": "missing"}, None, "ops", "tokenFile"),
        ({"client-certificate-data": "@@"}, {"server": "https://k8s"}, "ops", "not base64"),
    ],
)
def test_unusable_kubeconfigs_are_refused_naming_the_field(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None, current: str | None,
    message: str,
) -> None:  # fmt: skip
    path = _kubeconfig(tmp_path, user, cluster, current)
    with pytest.raises(KubernetesError, match=message) as caught:
        load_kubeconfig(path, None, tmp_path)
    assert str(path) in str(caught.value)


def test_a_file_that_is_not_a_kubeconfig(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("- just\n- a list\n")
    with pytest.raises(KubernetesError, match="not a kubeconfig"):
        load_kubeconfig(path, None, tmp_path)
