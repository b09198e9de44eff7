"""The service front (a region's round-robin proxy over its pods), driven as an ASGI app.

The pods are httpx mock transports (no process, no socket): one per URL, each counting what it
got; a dead pod raises a connection error as a refused TCP connection would.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from redline.devstack.fakes.service import (
    HEALTH_PATH,
    KEEPALIVE_SECONDS,
    RoundRobin,
    ServiceFront,
    ServiceFrontError,
    ServiceFrontSettings,
    build_service_app,
    forward_headers,
)

PODS = ["http://pod-a:8000", "http://pod-b:8000", "http://pod-c:8000"]


class Clock:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Pods:
    """Mock pods: each answers with its own name; `dead` ones refuse the connection."""

    def __init__(self) -> None:
        self.dead: set[str] = set()
        self.seen: Counter[str] = Counter()
        self.requests: list[httpx.Request] = []

    async def handle(self, request: httpx.Request) -> httpx.Response:
        pod = f"http://{request.url.host}:{request.url.port}"
        if pod in self.dead:
            raise httpx.ConnectError("connection refused", request=request)
        self.seen[pod] += 1
        self.requests.append(request)
        if request.url.path == "/v1/stream":
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  stream=_Chunks([b"data: 1\n\n", b"data: 2\n\n",
                                                  b"data: [DONE]\n\n"]))  # fmt: skip
        body = {"pod": pod, "path": request.url.path, "query": str(request.url.query, "ascii")}
        # A stream, as a real transport gives (MockTransport reads plain bodies at once).
        return httpx.Response(
            201 if request.method == "POST" else 200,
            stream=_Chunks([json.dumps(body).encode()]),
            headers={
                "content-type": "application/json",
                "x-redline-instance": pod,
                "connection": "keep-alive",
            },
        )


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            await asyncio.sleep(0)
            yield chunk


class Front(ServiceFront):
    """A front with the event loop its calls run in (its pooled client belongs to the loop)."""

    loop: asyncio.AbstractEventLoop


MakeFront = Callable[[Pods, Clock], Front]


@pytest.fixture()
def make_front() -> Iterator[Callable[[Pods, Clock], Front]]:
    fronts: list[Front] = []

    def make(pods: Pods, clock: Clock) -> Front:
        settings = ServiceFrontSettings(region="primary", pods=PODS, eject_seconds=2.0)
        front = Front(settings, clock, httpx.MockTransport(pods.handle))
        front.loop = asyncio.new_event_loop()
        fronts.append(front)
        return front

    yield make
    for front in fronts:
        if front._client is not None:
            front.loop.run_until_complete(front._client.aclose())
        front.loop.close()


def _call(
    front: Front, path: str, method: str = "GET", body: bytes = b"", query: bytes = b""
) -> tuple[int, dict[str, str], list[bytes]]:
    """One request through the ASGI app; (status, headers, the body messages as sent)."""
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": [(b"host", b"front"), (b"content-type", b"application/json")],
    }
    front.loop.run_until_complete(front(scope, receive, send))
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    chunks = [m["body"] for m in sent[1:] if m["body"]]
    return start["status"], headers, chunks


def test_round_robin_takes_the_pods_in_turn_and_skips_an_ejected_one() -> None:
    balancer = RoundRobin(PODS, eject_seconds=2.0)
    assert [balancer.order(0.0)[0] for _ in range(4)] == [*PODS, PODS[0]]
    balancer.eject(PODS[1], now=10.0)
    assert balancer.order(10.5) == [PODS[2], PODS[0]]  # pod b skipped while ejected
    assert balancer.states(10.5)[PODS[1]] == "ejected for 1.5 s"
    assert balancer.order(12.0) == [PODS[2], PODS[0], PODS[1]]  # back after eject_seconds
    for pod in PODS:
        balancer.eject(pod, now=20.0)
    assert sorted(balancer.order(20.5)) == sorted(PODS)  # none left: try them all anyway
    balancer.restore(PODS[2])
    assert balancer.states(20.5)[PODS[2]] == "serving"


def test_requests_reach_the_pods_in_turn_with_path_query_method_and_body(
    make_front: MakeFront,
) -> None:
    pods, clock = Pods(), Clock()
    front = make_front(pods, clock)
    answers = [json.loads(_call(front, "/v1/models")[2][0])["pod"] for _ in range(6)]
    assert answers == PODS * 2
    status, headers, chunks = _call(
        front, "/v1/chat/completions", "POST", b'{"model": "m"}', b"dry-run=true"
    )
    assert status == 201
    answer = json.loads(b"".join(chunks))
    assert answer["path"] == "/v1/chat/completions" and answer["query"] == "dry-run=true"
    assert pods.requests[-1].content == b'{"model": "m"}'
    # The pod's own headers pass; hop-by-hop ones do not (nor the client's Host).
    assert headers["x-redline-instance"] == answer["pod"]
    assert "connection" not in headers
    assert pods.requests[-1].headers["host"] == "pod-a:8000"


def test_a_dead_pod_is_skipped_and_nothing_fails(make_front: MakeFront) -> None:
    pods, clock = Pods(), Clock()
    front = make_front(pods, clock)
    pods.dead.add(PODS[1])
    statuses = [_call(front, "/v1/models")[0] for _ in range(9)]
    assert statuses == [200] * 9
    assert pods.seen[PODS[1]] == 0 and pods.seen[PODS[0]] + pods.seen[PODS[2]] == 9
    status, _, chunks = _call(front, HEALTH_PATH)
    health = json.loads(chunks[0])
    assert status == 200 and health["serving"] == 2
    assert health["pods"][PODS[1]].startswith("ejected")
    # Back up: taken in turn again once its ejection ran out.
    pods.dead.clear()
    clock.now += 2.0
    for _ in range(3):
        _call(front, "/v1/models")
    assert pods.seen[PODS[1]] == 1


def test_every_pod_dead_is_a_503_naming_them_and_the_health_says_so(make_front: MakeFront) -> None:
    pods, clock = Pods(), Clock()
    front = make_front(pods, clock)
    pods.dead.update(PODS)
    status, _, chunks = _call(front, "/v1/models")
    assert status == 503
    message = json.loads(chunks[0])["message"]
    assert "no pod accepted the request" in message and all(pod in message for pod in PODS)
    assert _call(front, HEALTH_PATH)[0] == 503


def test_a_stream_passes_through_chunk_by_chunk(make_front: MakeFront) -> None:
    pods, clock = Pods(), Clock()
    status, headers, chunks = _call(make_front(pods, clock), "/v1/stream", "POST", b"{}")
    assert status == 200 and headers["content-type"] == "text/event-stream"
    # Each event is sent on as the pod wrote it, not gathered into one body.
    assert chunks == [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    assert "content-length" not in headers


def test_settings_need_a_pod_and_http_urls() -> None:
    with pytest.raises(ServiceFrontError, match="list one pod URL at least"):
        build_service_app(ServiceFrontSettings(region="primary"))
    with pytest.raises(ValueError, match="not an http"):
        ServiceFrontSettings(pods=["pod-a:8000"])
    assert ServiceFrontSettings(pods=["http://a:1/"]).pods == ["http://a:1"]


def test_forward_headers_drops_hop_by_hop_ones() -> None:
    kept = forward_headers(
        [(b"Connection", b"close"), (b"Transfer-Encoding", b"chunked"), (b"X-Request-Id", b"7")]
    )
    assert kept == [("X-Request-Id", "7")]


def test_idle_connections_to_the_pods_expire_before_the_pods_close_them() -> None:
    """A connection the pod's uvicorn is closing (its keep-alive timeout) must never carry a
    request: the front lets idle ones go first (a request sent on one came back a 502)."""
    pods_close_after = uvicorn.Config(app=None).timeout_keep_alive
    assert KEEPALIVE_SECONDS < pods_close_after
    front = ServiceFront(ServiceFrontSettings(region="r", pods=["http://127.0.0.1:1"]))
    pool = front.client()._transport._pool  # the pool holds the expiry
    assert pool._keepalive_expiry == KEEPALIVE_SECONDS
