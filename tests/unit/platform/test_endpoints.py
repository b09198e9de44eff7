"""Pod discovery: static lists, DNS records, and Kubernetes EndpointSlices read over HTTP from a
small local server speaking the API (no cluster here)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from pydantic import ValidationError

from redline.core.errors import TransientError
from redline.platform.endpoints import (
    EndpointsError,
    KubernetesSource,
    Pod,
    PodSource,
    build_pods_from_slices,
    discover_pods,
    pods_from_dns,
    pods_from_urls,
)

# ---- static ----------------------------------------------------------------------------------


def test_a_static_list_is_the_pods_named_host_port() -> None:
    pods = pods_from_urls(
        "eu", ["http://10.0.0.1:8000/", "http://10.0.0.2:8000", "http://10.0.0.1:8000"]
    )
    assert pods == [
        Pod("eu", "10.0.0.1:8000", "http://10.0.0.1:8000"),
        Pod("eu", "10.0.0.2:8000", "http://10.0.0.2:8000"),
    ]
    assert pods[0].key == "eu/10.0.0.1:8000"


def test_a_source_is_exactly_one_of_urls_dns_kubernetes() -> None:
    with pytest.raises(ValidationError, match="set exactly one of urls, dns, kubernetes"):
        PodSource()
    with pytest.raises(ValidationError, match=r"\(got urls, dns\)"):
        PodSource(urls=["http://a:1"], dns="svc", port=80)
    with pytest.raises(ValidationError, match="dns needs port"):
        PodSource(dns="chat.serving.svc.cluster.local")
    with pytest.raises(ValidationError, match="is not an http"):
        PodSource(urls=["ftp://a:1"])
    assert PodSource(dns="chat", port=8000).describe() == "DNS chat:8000"
    source = PodSource(kubernetes=KubernetesSource(service="chat", namespace="serving"))
    assert source.describe() == "Kubernetes EndpointSlices of serving/chat"


# ---- DNS -------------------------------------------------------------------------------------


def test_dns_resolves_localhost_to_one_pod_per_address() -> None:
    pods = pods_from_dns("eu", "localhost", 8000)
    addresses = {
        str(info[4][0]) for info in socket.getaddrinfo("localhost", 8000, 0, socket.SOCK_STREAM)
    }
    expected = {f"http://{'[' + a + ']' if ':' in a else a}:8000" for a in addresses}
    assert {pod.url for pod in pods} == expected
    assert "http://127.0.0.1:8000" in expected


def _records(*addresses: str) -> Any:
    def resolve(host: str, port: int, *args: Any) -> list[tuple[Any, ...]]:
        assert host == "chat-headless.serving.svc.cluster.local"
        out: list[tuple[Any, ...]] = []
        for address in addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sockaddr = (address, port, 0, 0) if ":" in address else (address, port)
            out.append((family, socket.SOCK_STREAM, 6, "", sockaddr))
        return out

    return resolve


def test_dns_a_and_aaaa_records_of_a_headless_service_are_the_pods() -> None:
    resolver = _records("10.1.0.4", "10.1.0.5", "fd00::7", "fe80::1%eth0", "10.1.0.4")
    pods = pods_from_dns("us", "chat-headless.serving.svc.cluster.local", 8000, "https", resolver)
    assert [pod.url for pod in pods] == [
        "https://10.1.0.4:8000",
        "https://10.1.0.5:8000",
        "https://[fd00::7]:8000",
        "https://[fe80::1]:8000",
    ]
    assert [pod.name for pod in pods][2] == "[fd00::7]:8000"


def test_dns_failures_a_temporary_one_is_worth_a_retry() -> None:
    def again(*args: Any) -> Any:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    def nothing(*args: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(TransientError, match="Temporary failure"):
        pods_from_dns("us", "svc", 80, resolver=again)
    with pytest.raises(EndpointsError, match="DNS svc: Name or service not known"):
        pods_from_dns("us", "svc", 80, resolver=nothing)
    with pytest.raises(EndpointsError, match="no A/AAAA records"):
        pods_from_dns("us", "svc", 80, resolver=lambda *a: [])


def test_discover_pods_dispatches_to_the_configured_source() -> None:
    source = PodSource(dns="chat-headless.serving.svc.cluster.local", port=9000)
    pods = discover_pods("us", source, resolver=_records("10.1.0.9"))
    assert pods == [Pod("us", "10.1.0.9:9000", "http://10.1.0.9:9000")]
    assert discover_pods("us", PodSource(urls=["http://a:1"])) == [Pod("us", "a:1", "http://a:1")]


# ---- EndpointSlices, pure -------------------------------------------------------------------


def _endpoint(address: str, name: str, **conditions: Any) -> dict[str, Any]:
    return {
        "addresses": [address],
        "conditions": conditions,
        "targetRef": {"kind": "Pod", "name": name},
    }


def _slice(
    name: str, endpoints: list[dict[str, Any]], ports: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports,
    }


def test_ready_endpoints_are_pods_the_rest_are_skipped_with_why() -> None:
    slices = [
        _slice(
            "chat-abc",
            [
                _endpoint("10.0.0.1", "chat-0", ready=True, serving=True, terminating=False),
                _endpoint("10.0.0.2", "chat-1"),  # no conditions: nil ready counts as ready
                _endpoint("10.0.0.3", "chat-2", ready=False, serving=False),
                _endpoint("10.0.0.4", "chat-3", ready=False, serving=True, terminating=True),
            ],
            [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8000}],
        ),
        # An endpoint listed by two slices (while they are rebalanced) is one pod.
        _slice(
            "chat-def",
            [_endpoint("10.0.0.1", "chat-0", ready=True)],
            [{"name": "http", "port": 8000}],
        ),
    ]
    pods = build_pods_from_slices("eu", slices, port_name="http")
    assert pods == [
        Pod("eu", "chat-0", "http://10.0.0.1:8000"),
        Pod("eu", "chat-1", "http://10.0.0.2:8000"),
        Pod("eu", "chat-2", "http://10.0.0.3:8000", "not ready"),
        Pod("eu", "chat-3", "http://10.0.0.4:8000", "terminating"),
    ]
    # Without a port name the slice's first port is used.
    assert build_pods_from_slices("eu", slices[1:])[0].url == "http://10.0.0.1:8000"


def test_a_slice_without_the_named_port_skips_its_pods_and_ipv6_is_bracketed() -> None:
    v6 = _slice("chat-v6", [_endpoint("fd00::1", "chat-0")], [{"name": "grpc", "port": 9000}])
    [pod] = build_pods_from_slices("eu", [v6], port_name="http", scheme="https")
    assert pod.skipped == "slice chat-v6 has no port 'http'"
    [pod] = build_pods_from_slices("eu", [v6])
    assert pod.url == "http://[fd00::1]:9000" and pod.skipped is None
    nameless = {"addresses": ["10.0.0.8"]}
    [pod] = build_pods_from_slices("eu", [_slice("s", [nameless], [{"port": 80}])])
    assert pod.name == "10.0.0.8:80"
    assert (
        build_pods_from_slices("eu", [{"endpoints": None}, {"endpoints": [{"addresses": []}]}])
        == []
    )


# ---- EndpointSlices over HTTP ---------------------------------------------------------------


@dataclass
class ApiServer:
    """A Kubernetes API server stand-in: answers the EndpointSlice list, in pages of one."""

    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    slices: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    token: str = "sa-token"


@pytest.fixture()
def api() -> Iterator[ApiServer]:
    state = ApiServer("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            parts = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            state.requests.append(
                {"path": parts.path, "query": query, "auth": self.headers.get("Authorization")}
            )
            if self.headers.get("Authorization") != f"Bearer {state.token}":
                self._answer(401, {"kind": "Status", "message": "Unauthorized", "code": 401})
            elif state.status != 200:
                self._answer(state.status, {"kind": "Status", "code": state.status})
            else:
                start = int(query.get("continue", "0"))
                page = state.slices[start : start + 1]
                follow = str(start + 1) if start + 1 < len(state.slices) else ""
                body = {
                    "kind": "EndpointSliceList",
                    "metadata": {"continue": follow},
                    "items": page,
                }
                self._answer(200, body)

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def _files(tmp_path: Path, token: str = "sa-token", namespace: str = "serving") -> dict[str, Path]:
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "namespace").write_text(namespace)
    return {
        "token_file": tmp_path / "token",
        "namespace_file": tmp_path / "namespace",
        "ca_file": tmp_path / "ca.crt",
    }


def test_endpoint_slices_are_listed_by_service_label_with_the_token_every_page(
    api: ApiServer, tmp_path: Path
) -> None:
    api.slices = [
        _slice("chat-a", [_endpoint("10.0.0.1", "chat-0")], [{"name": "http", "port": 8000}]),
        _slice(
            "chat-b",
            [_endpoint("10.0.0.2", "chat-1"), _endpoint("10.0.0.3", "chat-2", ready=False)],
            [{"name": "http", "port": 8000}],
        ),
    ]
    source = PodSource(
        kubernetes=KubernetesSource(service="chat", api_url=api.url, **_files(tmp_path))
    )
    pods = discover_pods("eu", source)
    assert [(p.name, p.url, p.skipped) for p in pods] == [
        ("chat-0", "http://10.0.0.1:8000", None),
        ("chat-1", "http://10.0.0.2:8000", None),
        ("chat-2", "http://10.0.0.3:8000", "not ready"),
    ]
    assert [r["path"] for r in api.requests] == [
        "/apis/discovery.k8s.io/v1/namespaces/serving/endpointslices"
    ] * 2
    assert {r["query"]["labelSelector"] for r in api.requests} == {
        "kubernetes.io/service-name=chat"
    }
    assert [r["query"].get("continue") for r in api.requests] == [None, "1"]
    assert {r["auth"] for r in api.requests} == {"Bearer sa-token"}


def test_the_token_is_read_again_each_time_it_rotates(api: ApiServer, tmp_path: Path) -> None:
    api.slices = [_slice("chat-a", [_endpoint("10.0.0.1", "chat-0")], [{"port": 8000}])]
    files = _files(tmp_path, token="old-token")
    source = KubernetesSource(service="chat", namespace="other", api_url=api.url, **files)
    with pytest.raises(
        EndpointsError, match="HTTP 401.*needs `list` on discovery.k8s.io endpointslices"
    ):
        discover_pods("eu", PodSource(kubernetes=source))
    files["token_file"].write_text("sa-token")
    assert len(discover_pods("eu", PodSource(kubernetes=source))) == 1
    assert api.requests[-1]["path"] == "/apis/discovery.k8s.io/v1/namespaces/other/endpointslices"


def test_api_failures_5xx_is_transient_a_service_without_endpoints_is_named(
    api: ApiServer, tmp_path: Path
) -> None:
    source = PodSource(
        kubernetes=KubernetesSource(service="chat", api_url=api.url, **_files(tmp_path))
    )
    with pytest.raises(EndpointsError, match="Service serving/chat has no endpoints"):
        discover_pods("eu", source)
    api.status = 503
    with pytest.raises(TransientError, match="HTTP 503"):
        discover_pods("eu", source)
    api.status = 404
    with pytest.raises(EndpointsError, match="HTTP 404"):
        discover_pods("eu", source)
    dead = PodSource(
        kubernetes=KubernetesSource(
            service="chat", api_url="http://127.0.0.1:1", **_files(tmp_path)
        )
    )
    with pytest.raises(TransientError, match="ConnectError"):
        discover_pods("eu", dead, timeout_seconds=2)


def test_in_cluster_defaults_the_api_server_from_the_environment(tmp_path: Path) -> None:
    files = _files(tmp_path)
    source = KubernetesSource(service="chat", **files)
    assert source.problems({}) == [
        "kubernetes.api_url is not set and KUBERNETES_SERVICE_HOST is not in the environment "
        "(not running in a cluster)"
    ]
    assert source.problems({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == []
    with pytest.raises(EndpointsError, match="KUBERNETES_SERVICE_HOST is not in the environment"):
        discover_pods("eu", PodSource(kubernetes=source), environ={})
    # https with the service account's CA: a missing CA file is named, not silently skipped.
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(EndpointsError, match=r"the CA file .*ca\.crt does not exist"):
        discover_pods("eu", PodSource(kubernetes=source), environ=env)
    files["ca_file"].write_text("not a certificate")
    with pytest.raises(EndpointsError, match=r"the CA file .*ca\.crt is unusable"):
        discover_pods("eu", PodSource(kubernetes=source), environ=env)
    missing = KubernetesSource(
        service="chat", api_url="http://127.0.0.1:1", token_file=tmp_path / "nope"
    )
    with pytest.raises(EndpointsError, match="cannot read the token file"):
        discover_pods("eu", PodSource(kubernetes=missing))
