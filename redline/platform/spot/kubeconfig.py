"""A kubeconfig file read into a Kubernetes API connection, as kubectl reads it.

The context is `--context` or the file's `current-context`; its cluster gives `server`,
`certificate-authority` or `certificate-authority-data` and `insecure-skip-tls-verify`; its user
a bearer token (`token`, `tokenFile`) or a client certificate (`client-certificate(-data)` with
`client-key(-data)`). Relative paths are relative to the kubeconfig's directory, as kubectl does.
An `exec` or `auth-provider` user (cloud plugins: aws-iam-authenticator, gke-gcloud-auth-plugin)
is refused with what to do instead: redline runs no credential plugin.

Inline data (a token, a certificate, a key) is written to files in a private temporary directory
that lives as long as the connection (`open_kubeconfig`), because the client re-reads its token
file on every call and `ssl` loads client certificates from files.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from redline.platform.spot.errors import KubernetesError
from redline.platform.spot.kubernetes import KubernetesClient


@dataclass(frozen=True)
class KubeconfigTarget:
    """Where the API is and how to authenticate, read from a kubeconfig."""

    context: str
    api_url: str
    verify: ssl.SSLContext | bool
    token_file: Path | None


def _named(doc: Mapping[str, Any], section: str, name: str, where: str) -> Mapping[str, Any]:
    for item in doc.get(section) or []:
        if isinstance(item, Mapping) and item.get("name") == name:
            body = item.get(section.removesuffix("s"))
            if isinstance(body, Mapping):
                return body
            raise KubernetesError(f"{where}: {section} entry {name!r} has no {section[:-1]} body")
    raise KubernetesError(f"{where}: no {section[:-1]} named {name!r} in {section}")


def _data(value: str, where: str, field: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise KubernetesError(f"{where}: {field} is not base64") from None


def _file(base: Path, value: str, where: str, field: str) -> Path:
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise KubernetesError(f"{where}: {field} {path} does not exist")
    return path


def _secret(scratch: Path, name: str, content: bytes) -> Path:
    path = scratch / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
    return path


def load_kubeconfig(path: Path, context: str | None, scratch: Path) -> KubeconfigTarget:
    """The connection of `context` (None: the current one); KubernetesError naming the file
    and field on anything unusable. Inline secrets are written under `scratch`."""
    where = str(path)
    try:
        doc = yaml.safe_load(path.read_text("utf-8"))
    except OSError as exc:
        raise KubernetesError(f"{where}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise KubernetesError(f"{where}: not YAML: {exc}") from None
    if not isinstance(doc, Mapping):
        raise KubernetesError(f"{where}: not a kubeconfig (expected a mapping)")
    name = context or doc.get("current-context")
    if not name:
        raise KubernetesError(f"{where}: no current-context; name one with --context")
    ctx = _named(doc, "contexts", str(name), where)
    cluster = _named(doc, "clusters", str(ctx.get("cluster")), where)
    user = _named(doc, "users", str(ctx.get("user")), where) if ctx.get("user") else {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubernetesError(f"{where}: cluster {ctx.get('cluster')!r}: server must be an URL")
    base = path.parent
    for plugin in ("exec", "auth-provider"):
        if plugin in user:
            raise KubernetesError(
                f"{where}: user {ctx.get('user')!r} uses an {plugin} credential plugin, which "
                "redline does not run: give a token instead (kubectl create token SERVICEACCOUNT "
                "> token; a kubeconfig user with tokenFile: token), or --api-url and --token-file"
            )
    verify: ssl.SSLContext | bool = False
    if server.startswith("https://"):
        if cluster.get("insecure-skip-tls-verify"):
            context_ = ssl.create_default_context()
            context_.check_hostname = False
            context_.verify_mode = ssl.CERT_NONE
        elif "certificate-authority-data" in cluster:
            pem = _data(str(cluster["certificate-authority-data"]), where,
                        "certificate-authority-data").decode("ascii", "replace")  # fmt: skip
            context_ = ssl.create_default_context(cadata=pem)
        elif "certificate-authority" in cluster:
            ca = _file(base, str(cluster["certificate-authority"]), where, "certificate-authority")
            context_ = ssl.create_default_context(cafile=str(ca))
        else:
            context_ = ssl.create_default_context()
        cert = _client_cert(user, base, scratch, where)
        if cert is not None:
            context_.load_cert_chain(str(cert[0]), str(cert[1]))
        verify = context_
    token_file: Path | None = None
    if "token" in user:
        token_file = _secret(scratch, "token", str(user["token"]).encode("utf-8"))
    elif "tokenFile" in user:
        token_file = _file(base, str(user["tokenFile"]), where, "tokenFile")
    return KubeconfigTarget(str(name), server.rstrip("/"), verify, token_file)


def _client_cert(
    user: Mapping[str, Any], base: Path, scratch: Path, where: str
) -> tuple[Path, Path] | None:
    if "client-certificate-data" in user:
        cert = _secret(scratch, "client.crt", _data(str(user["client-certificate-data"]), where,
                                                     "client-certificate-data"))  # fmt: skip
    elif "client-certificate" in user:
        cert = _file(base, str(user["client-certificate"]), where, "client-certificate")
    else:
        return None
    if "client-key-data" in user:
        key = _secret(scratch, "client.key",
                      _data(str(user["client-key-data"]), where, "client-key-data"))  # fmt: skip
    elif "client-key" in user:
        key = _file(base, str(user["client-key"]), where, "client-key")
    else:
        raise KubernetesError(f"{where}: a client certificate without client-key(-data)")
    return cert, key


@contextmanager
def open_kubeconfig(
    path: Path, context: str | None = None, timeout_seconds: float = 5.0
) -> Iterator[KubernetesClient]:
    """A client of the kubeconfig's context, its inline secrets removed when it closes."""
    with tempfile.TemporaryDirectory(prefix="redline-kubeconfig-") as scratch:
        try:
            target = load_kubeconfig(path, context, Path(scratch))
        except ssl.SSLError as exc:
            raise KubernetesError(f"{path}: unusable certificate or key: {exc}") from None
        client = KubernetesClient(
            target.api_url, target.token_file, verify=target.verify, timeout_seconds=timeout_seconds
        )
        try:
            yield client
        finally:
            client.close()
