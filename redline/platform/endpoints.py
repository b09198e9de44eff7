"""Pod discovery: the serving pods behind one region, from a static list, DNS or Kubernetes.

A region's URL (a Kubernetes Service, a load balancer) reaches one pod per request, so a change
made through it (loading an adapter) lands on whichever pod answered. What acts on every pod
finds them here, per region, from one `PodSource`:

- `urls`: a static list of pod base URLs;
- `dns`: a name whose A/AAAA records are the pods (a headless Service,
  `<service>.<namespace>.svc.cluster.local`), with the pods' `port` and `scheme`;
- `kubernetes`: the EndpointSlices (`discovery.k8s.io/v1`) of a Service, read from the API
  server with the pod's service-account token and CA (RBAC: `list` on `endpointslices`). Ready
  endpoints are the pods; not-ready and terminating ones are returned as skipped, with why.

Every pod is identified as `<region>/<name>` (the Kubernetes pod name, else `host:port`).
Transport failures, a temporary DNS failure and 5xx answers raise
`redline.core.errors.TransientError` (worth a retry); anything else that stops discovery raises
`EndpointsError` naming the source.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from redline.core.errors import TransientError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SLICES_PATH = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_PAGE = 500

Resolver = Callable[..., Sequence[tuple[Any, ...]]]
"""`socket.getaddrinfo`'s shape: (host, port, family, type, proto) -> address tuples."""


class EndpointsError(Exception):
    """The pods of a region cannot be found (bad answer, refused, nothing there)."""


@dataclass(frozen=True)
class Pod:
    """One serving pod: its region, name, base URL; `skipped` says why it is left alone."""

    region: str
    name: str
    url: str
    skipped: str | None = None

    @property
    def key(self) -> str:
        """`<region>/<name>`: how reports name the pod."""
        return f"{self.region}/{self.name}"


def check_base_url(value: str, where: str) -> str:
    """`value` without a trailing slash; ValueError naming `where` unless it is an http(s) URL."""
    try:
        parsed = urlsplit(value)
        valid = parsed.scheme in ("http", "https") and bool(parsed.hostname)
        valid = valid and (parsed.port or 1) > 0
    except ValueError:
        valid = False
    if not valid:
        raise ValueError(f"{where}: {value!r} is not an http(s) URL")
    return value.rstrip("/")


class KubernetesSource(BaseModel):
    """A Service whose EndpointSlices list the pods (in-cluster service-account by default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str = Field(min_length=1, description="The Service's name.")
    namespace: str | None = Field(
        None, description="Its namespace (None: the service account's own namespace)."
    )
    port_name: str | None = Field(
        None, description="The EndpointSlice port to use (None: the slice's only or first port)."
    )
    scheme: Literal["http", "https"] = Field("http", description="Scheme of the pods' URLs.")
    api_url: str | None = Field(
        None,
        description="API server (None: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).",
    )
    token_file: Path = Field(SERVICE_ACCOUNT / "token", description="Bearer token file.")
    ca_file: Path | None = Field(
        SERVICE_ACCOUNT / "ca.crt", description="CA bundle of the API server (None: system CAs)."
    )
    namespace_file: Path = Field(
        SERVICE_ACCOUNT / "namespace", description="Read when `namespace` is not set."
    )

    @field_validator("api_url")
    @classmethod
    def _api(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value, "api_url")

    def problems(self, environ: Mapping[str, str] | None = None) -> list[str]:
        """What stops this source from working outside of the request itself (start-up check)."""
        env = os.environ if environ is None else environ
        if self.api_url is None and not env.get("KUBERNETES_SERVICE_HOST"):
            return [
                "kubernetes.api_url is not set and KUBERNETES_SERVICE_HOST is not in the "
                "environment (not running in a cluster)"
            ]
        return []


class PodSource(BaseModel):
    """How to find a region's pods: exactly one of `urls`, `dns` (with `port`), `kubernetes`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    urls: list[str] = Field(default_factory=list, description="Static pod base URLs.")
    dns: str | None = Field(None, description="A name whose A/AAAA records are the pods.")
    port: int | None = Field(None, ge=1, le=65535, description="The pods' port (dns).")
    scheme: Literal["http", "https"] = Field("http", description="Scheme of the pods (dns).")
    kubernetes: KubernetesSource | None = Field(None, description="A Service's EndpointSlices.")

    @field_validator("urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        return [check_base_url(url, "urls") for url in value]

    @model_validator(mode="after")
    def _one_source(self) -> PodSource:
        given = [name for name in ("urls", "dns", "kubernetes") if getattr(self, name)]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of urls, dns, kubernetes"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.dns and self.port is None:
            raise ValueError("dns needs port (the pods' port)")
        return self

    def describe(self) -> str:
        """One line naming the source, for plans and reports."""
        if self.urls:
            return f"{len(self.urls)} listed URL(s)"
        if self.dns:
            return f"DNS {self.dns}:{self.port}"
        assert self.kubernetes is not None
        where = f"{self.kubernetes.namespace}/" if self.kubernetes.namespace else ""
        return f"Kubernetes EndpointSlices of {where}{self.kubernetes.service}"


# ---- static and DNS -----------------------------------------------------------------------------


def _host_port(url: str) -> str:
    parsed = urlsplit(url)
    return parsed.netloc or url


def pods_from_urls(region: str, urls: Iterable[str]) -> list[Pod]:
    """Pods at the listed base URLs (duplicates dropped), named `host:port`."""
    seen: dict[str, Pod] = {}
    for url in urls:
        base = url.rstrip("/")
        seen.setdefault(base, Pod(region, _host_port(base), base))
    return list(seen.values())


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def pods_from_dns(
    region: str,
    name: str,
    port: int,
    scheme: str = "http",
    resolver: Resolver = socket.getaddrinfo,
) -> list[Pod]:
    """One pod per A/AAAA record of `name`, in the resolver's order (duplicates dropped).

    TransientError on a temporary resolver failure; EndpointsError when the name does not
    resolve (a headless Service with no ready pod has no records)."""
    try:
        infos = resolver(name, port, 0, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        if exc.errno == socket.EAI_AGAIN:
            raise TransientError(f"DNS {name}: {exc.strerror}") from exc
        raise EndpointsError(f"DNS {name}: {exc.strerror or exc}") from None
    except OSError as exc:
        raise TransientError(f"DNS {name}: {exc}") from exc
    urls = []
    for info in infos:
        address = str(info[4][0]).split("%", 1)[0]  # an IPv6 scope id is not part of a URL
        urls.append(f"{scheme}://{_url_host(address)}:{port}")
    if not urls:
        raise EndpointsError(f"DNS {name}: no A/AAAA records")
    return pods_from_urls(region, urls)


# ---- Kubernetes EndpointSlices -----------------------------------------------------------------


def _slice_port(item: Mapping[str, Any], port_name: str | None) -> int | None:
    ports = [p for p in item.get("ports") or [] if isinstance(p, Mapping)]
    if port_name is not None:
        ports = [p for p in ports if p.get("name") == port_name]
    number = ports[0].get("port") if ports else None
    return number if isinstance(number, int) else None


def build_pods_from_slices(
    region: str,
    slices: Iterable[Mapping[str, Any]],
    port_name: str | None = None,
    scheme: str = "http",
) -> list[Pod]:
    """The pods an EndpointSlice list names: ready endpoints as pods, not-ready and terminating
    ones as skipped (with why), one per URL (the first slice naming it wins). Pure.

    A nil `ready` condition counts as ready (the API's rule); `FQDN` slices are used as names."""
    pods: dict[str, Pod] = {}
    for item in slices:
        port = _slice_port(item, port_name)
        wanted = f"port {port_name!r}" if port_name else "a port"
        slice_name = str((item.get("metadata") or {}).get("name", "?"))
        for endpoint in item.get("endpoints") or []:
            if not isinstance(endpoint, Mapping):
                continue
            addresses = [a for a in endpoint.get("addresses") or [] if isinstance(a, str)]
            if not addresses:
                continue
            address = addresses[0]  # the API: every address of an endpoint is the same pod
            ref = endpoint.get("targetRef") or {}
            name = ref.get("name") if isinstance(ref, Mapping) else None
            conditions = endpoint.get("conditions") or {}
            if port is None:
                url = f"{scheme}://{_url_host(address)}"
                skipped: str | None = f"slice {slice_name} has no {wanted}"
            else:
                url = f"{scheme}://{_url_host(address)}:{port}"
                skipped = None
            if conditions.get("terminating") is True:
                skipped = "terminating"
            elif conditions.get("ready") is False:
                skipped = "not ready"
            label = str(name) if name else _host_port(url)
            pods.setdefault(url, Pod(region, label, url, skipped))
    return sorted(pods.values(), key=lambda pod: pod.name)


def _api_url(source: KubernetesSource, environ: Mapping[str, str]) -> str:
    if source.api_url is not None:
        return source.api_url
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise EndpointsError(
            "kubernetes: api_url is not set and KUBERNETES_SERVICE_HOST is not in the environment"
        )
    return f"https://{_url_host(host)}:{port}"


def _read(path: Path, what: str) -> str:
    try:
        text = path.read_text("utf-8").strip()
    except OSError as exc:
        raise EndpointsError(f"kubernetes: cannot read the {what} {path}: {exc.strerror}") from None
    if not text:
        raise EndpointsError(f"kubernetes: the {what} {path} is empty")
    return text


def fetch_endpoint_slices(
    client: httpx.Client, api_url: str, namespace: str, service: str, token: str
) -> list[dict[str, Any]]:
    """Every EndpointSlice of `service` (all pages); TransientError on transport failures and
    5xx, EndpointsError on any other non-200 answer (401/403: the token or its RBAC)."""
    url = api_url.rstrip("/") + SLICES_PATH.format(namespace=quote(namespace, safe=""))
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    params = {"labelSelector": f"{SERVICE_NAME_LABEL}={service}", "limit": str(_PAGE)}
    items: list[dict[str, Any]] = []
    while True:
        try:
            response = client.get(url, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise TransientError(f"kubernetes GET {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise TransientError(f"kubernetes GET {url}: HTTP {response.status_code}")
        if response.status_code != 200:
            hint = (
                " (the service account needs `list` on discovery.k8s.io endpointslices)"
                if response.status_code in (401, 403)
                else ""
            )
            raise EndpointsError(
                f"kubernetes GET {url}: HTTP {response.status_code}: {response.text[:200]}{hint}"
            )
        try:
            data = response.json()
            page = data["items"]
            follow = (data.get("metadata") or {}).get("continue")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise EndpointsError(f"kubernetes GET {url}: not an EndpointSliceList") from None
        if not isinstance(page, list):
            raise EndpointsError(f"kubernetes GET {url}: `items` is not a list")
        items += [item for item in page if isinstance(item, dict)]
        if not follow:
            return items
        params = {**params, "continue": str(follow)}


def pods_from_kubernetes(
    region: str,
    source: KubernetesSource,
    timeout_seconds: float = 10.0,
    environ: Mapping[str, str] | None = None,
) -> list[Pod]:
    """The pods of a Service per its EndpointSlices (ready ones; the rest skipped, with why)."""
    env = os.environ if environ is None else environ
    api = _api_url(source, env)
    token = _read(source.token_file, "token file")  # re-read each time: projected tokens rotate
    namespace = source.namespace or _read(source.namespace_file, "namespace file")
    verify: ssl.SSLContext | bool = False  # plain http (a proxy, a test): no TLS to verify
    if api.startswith("https://"):
        if source.ca_file is None:
            verify = ssl.create_default_context()
        elif not source.ca_file.is_file():
            raise EndpointsError(f"kubernetes: the CA file {source.ca_file} does not exist")
        else:
            try:
                verify = ssl.create_default_context(cafile=str(source.ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise EndpointsError(
                    f"kubernetes: the CA file {source.ca_file} is unusable: {exc}"
                ) from None
    with httpx.Client(timeout=timeout_seconds, trust_env=False, verify=verify) as client:
        slices = fetch_endpoint_slices(client, api, namespace, source.service, token)
    pods = build_pods_from_slices(region, slices, source.port_name, source.scheme)
    if not pods:
        raise EndpointsError(
            f"kubernetes: Service {namespace}/{source.service} has no endpoints "
            f"({len(slices)} EndpointSlice(s))"
        )
    return pods


# ---- one entry point ----------------------------------------------------------------------------


def discover_pods(
    region: str,
    source: PodSource,
    timeout_seconds: float = 10.0,
    resolver: Resolver = socket.getaddrinfo,
    environ: Mapping[str, str] | None = None,
) -> list[Pod]:
    """The pods of `region` per `source` (skipped ones included, marked)."""
    if source.urls:
        return pods_from_urls(region, source.urls)
    if source.dns:
        assert source.port is not None  # validated
        return pods_from_dns(region, source.dns, source.port, source.scheme, resolver)
    assert source.kubernetes is not None  # validated: exactly one source
    return pods_from_kubernetes(region, source.kubernetes, timeout_seconds, environ)


__all__ = [
    "EndpointsError",
    "KubernetesSource",
    "Pod",
    "PodSource",
    "build_pods_from_slices",
    "check_base_url",
    "discover_pods",
    "fetch_endpoint_slices",
    "pods_from_dns",
    "pods_from_kubernetes",
    "pods_from_urls",
]
