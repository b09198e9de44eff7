"""A region's service front: a round-robin HTTP reverse proxy over the region's pods.

It stands in for a Kubernetes Service in the local stack: the region's URL, what the gateway,
the probes and clients call, reaches one pod per request, so a change made through it (loading
an adapter) lands on whichever pod answered, and what must reach every pod (the rollback, the
drills' fault knobs) talks to the pods themselves.

- Requests go to the pods in turn. A pod that refuses the connection (it is down, restarting)
  is skipped for `eject_seconds` and the request goes to the next one: nothing was sent, so a
  retry cannot run it twice (kube-proxy drops an endpoint that fails its readiness probe in the
  same way). Once a pod has the request, its answer is the answer, errors included.
- Answers stream through chunk by chunk as the pod writes them (SSE keeps its pacing; a client
  that leaves closes the pod's stream), with the pod's status and headers, less hop-by-hop ones.
- `GET /-/healthz` is the front's own health: 200 with every pod's state while one is
  serving, 503 when every pod is ejected. Every other path is the pods'.

Lean on purpose (a plain ASGI app, httpx, uvicorn): the stack runs one per region.
Run it with `python -m redline.devstack.fakes.service --config FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from pydantic import Field, field_validator

from redline.core.settings import ServiceSettings, SettingsError, load_settings

HEALTH_PATH = "/-/healthz"
KEEPALIVE_SECONDS = 2.0
"""How long an idle connection to a pod is kept: under uvicorn's timeout_keep_alive (5 s)."""
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)
"""Headers that belong to one connection, not to the request or answer (content-length is
recomputed by each side: the body is streamed)."""

log = logging.getLogger("redline.service")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ServiceFrontError(Exception):
    """The service front cannot start as configured."""


class ServiceFrontSettings(ServiceSettings):
    """Settings of one region's service front."""

    region: str = Field("primary", pattern=r"^[a-z][a-z0-9-]*$", description="Region served.")
    pods: list[str] = Field(
        default_factory=list, description="Base URLs of the region's pods (one at least)."
    )
    eject_seconds: float = Field(
        2.0, gt=0, le=300, description="How long a pod that refused a connection is skipped."
    )
    connect_timeout_seconds: float = Field(
        2.0, gt=0, le=60, description="Longest wait for a pod to accept a connection."
    )
    read_timeout_seconds: float = Field(
        600.0, gt=0, description="Longest silence of a pod while it answers (a hang fault)."
    )

    @field_validator("pods")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"pod {url!r} is not an http(s) URL")
        return [url.rstrip("/") for url in value]


class RoundRobin:
    """The pods in turn, skipping the ones ejected until their time is up (pure; the clock is
    passed in)."""

    def __init__(self, pods: Sequence[str], eject_seconds: float) -> None:
        if not pods:
            raise ValueError("a service needs at least one pod")
        self.pods = tuple(pods)
        self.eject_seconds = eject_seconds
        self._next = 0
        self._ejected_until: dict[str, float] = {}

    def order(self, now: float) -> list[str]:
        """The pods to try for one request: the live ones from the next in turn, then (when
        every pod is ejected) all of them, so a pod back early is found at once."""
        start = self._next
        self._next = (self._next + 1) % len(self.pods)
        turn = [self.pods[(start + i) % len(self.pods)] for i in range(len(self.pods))]
        live = [pod for pod in turn if self._ejected_until.get(pod, 0.0) <= now]
        return live or turn

    def eject(self, pod: str, now: float) -> None:
        """Skip `pod` for `eject_seconds` (it refused a connection)."""
        self._ejected_until[pod] = now + self.eject_seconds

    def restore(self, pod: str) -> None:
        """`pod` answered: take it back in turn at once."""
        self._ejected_until.pop(pod, None)

    def states(self, now: float) -> dict[str, str]:
        """Pod -> `serving` or `ejected for N s`."""
        return {
            pod: (
                "serving"
                if (until := self._ejected_until.get(pod, 0.0)) <= now
                else f"ejected for {until - now:.1f} s"
            )
            for pod in self.pods
        }


def forward_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """A request's or answer's headers without the hop-by-hop ones."""
    kept = []
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1")
        if name.lower() not in HOP_BY_HOP:
            kept.append((name, raw_value.decode("latin-1")))
    return kept


def _error_body(status: int, message: str) -> bytes:
    body = {"object": "error", "message": message, "type": "ServiceUnavailable", "code": status}
    return json.dumps(body).encode()


class ServiceFront:
    """The ASGI app of one service front."""

    def __init__(
        self,
        settings: ServiceFrontSettings,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.balancer = RoundRobin(settings.pods, settings.eject_seconds)
        self.clock = clock
        self.transport = transport
        """None: TCP to the pods (tests pass their own)."""
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        """The pooled client to the pods (created in the server's event loop)."""
        if self._client is None:
            timeout = httpx.Timeout(
                self.settings.read_timeout_seconds,
                connect=self.settings.connect_timeout_seconds,
            )
            # Idle connections expire here before the pods' uvicorn closes them (its
            # timeout_keep_alive, 5 s): at equal timeouts a request could go out on a connection
            # the pod was closing and come back a 502 ("server disconnected"), one in a few
            # thousand (the vllm stack's regression-negative drill saw one).
            limits = httpx.Limits(
                max_connections=256,
                max_keepalive_connections=64,
                keepalive_expiry=KEEPALIVE_SECONDS,
            )
            self._client = httpx.AsyncClient(
                timeout=timeout, limits=limits, trust_env=False, transport=self.transport
            )
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["path"] == HEALTH_PATH:
            await self._health(send)
            return
        body = await _read_body(receive)
        await self._proxy(scope, body, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _health(self, send: Send) -> None:
        states = self.balancer.states(self.clock())
        serving = sum(1 for state in states.values() if state == "serving")
        status = 200 if serving else 503
        body = {"region": self.settings.region, "serving": serving, "pods": states}
        await _answer(send, status, json.dumps(body).encode())

    async def _proxy(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string") or b""
        target = path.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
        headers = forward_headers(scope.get("headers") or [])
        client = self.client()
        refused: list[str] = []
        for pod in self.balancer.order(self.clock()):
            request = client.build_request(
                scope["method"], pod + target, headers=headers, content=body
            )
            try:
                response = await client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Nothing reached the pod: another may take the request without running it twice.
                self.balancer.eject(pod, self.clock())
                refused.append(f"{pod}: {type(exc).__name__}")
                log.warning("pod %s refused a connection; ejected for %g s", pod,
                            self.settings.eject_seconds)  # fmt: skip
                continue
            except httpx.HTTPError as exc:
                message = f"pod {pod} failed before answering: {type(exc).__name__}: {exc}"
                await _answer(send, 502, _error_body(502, message))
                return
            self.balancer.restore(pod)
            await _stream_until_gone(response, receive, send)
            return
        message = (
            f"service {self.settings.region}: no pod accepted the request ({'; '.join(refused)})"
        )
        await _answer(send, 503, _error_body(503, message))


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _stream(response: httpx.Response, send: Send) -> None:
    """Pass the pod's answer through as it arrives; a client gone closes the pod's stream."""
    headers = [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in forward_headers(response.headers.raw)
    ]
    try:
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": headers})  # fmt: skip
        async for chunk in response.aiter_raw():
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    except (httpx.HTTPError, OSError) as exc:
        # The pod broke off mid-answer: the client sees a cut answer, as behind a Service.
        log.warning("pod answer broken off: %s: %s", type(exc).__name__, exc)
    finally:
        await response.aclose()


async def _stream_until_gone(response: httpx.Response, receive: Receive, send: Send) -> None:
    """Stream the answer; if the client disconnects first, stop and close the pod's stream (a
    streamed completion the client abandoned is aborted on the pod, as without the front)."""

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    streaming = asyncio.ensure_future(_stream(response, send))
    watching = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({streaming, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (streaming, watching):
            task.cancel()
        await asyncio.gather(streaming, watching, return_exceptions=True)
        await response.aclose()


def build_service_app(settings: ServiceFrontSettings) -> ServiceFront:
    """The ASGI app of a service front; ServiceFrontError without a pod."""
    if not settings.pods:
        raise ServiceFrontError(f"service {settings.region}: pods: list one pod URL at least")
    return ServiceFront(settings)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m redline.devstack.fakes.service --config FILE`: serve one service front."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--config", type=Path, required=True, help="Settings YAML.")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(ServiceFrontSettings, args.config)
        app = build_service_app(settings)
    except (SettingsError, ServiceFrontError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import uvicorn  # imported here: the module is imported by tests that start no server

    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(message)s")
    port = settings.port or 8080
    print(f"service front of {settings.region} on http://{settings.host}:{port} -> "
          f"{', '.join(settings.pods)}", flush=True)  # fmt: skip
    uvicorn.run(
        app,
        host=settings.host,
        port=port,
        log_level=settings.log_level.lower(),
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=2,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
