"""The gateway over real HTTP in front of two simulated regions, with a real Redis."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from redline.core.servers import ServerThread
from redline.devstack.fakes.simulator import build_answer
from redline.devstack.processes import find_binary, free_port, start_redis
from redline.gateway.upstream import (
    UpstreamConnectError,
    UpstreamPool,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)
from redline.platform.golden import GOLDEN_SET, MODEL_VERSION_HEADER
from redline.platform.routing import DEFAULT_PREFIX, RoutingStore, override_key
from redline.slo import catalog
from tests.support.gateway import RunningGateway, gateway_starter, simulators

pytestmark = pytest.mark.integration

BASE = "redline-base"
REGIONS = ("primary", "secondary")


def chat(prompt: str = "hello", model: str = BASE, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], **extra}


class Gateway(RunningGateway):
    def total(self, name: str, **labels: str) -> float:
        """Sum of every sample of `name` whose labels include `labels`."""
        out = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    out += sample.value
        return out


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, ServerThread]]:
    with simulators(REGIONS) as servers:
        yield servers


@pytest.fixture()
def upstreams(sims: dict[str, ServerThread]) -> dict[str, str]:
    """The regions' URLs, their faults reset."""
    for server in sims.values():
        httpx.post(f"{server.url}/admin/faults", json={}).raise_for_status()
    return {region: server.url for region, server in sims.items()}


def faults(url: str, **knobs: Any) -> None:
    httpx.post(f"{url}/admin/faults", json=knobs).raise_for_status()


@pytest.fixture()
def start_gateway(redis_url: str) -> Iterator[Callable[..., Gateway]]:
    with gateway_starter(redis_url, Gateway, 10.0) as start:
        yield start


def test_proxies_and_counts_tokens_from_usage(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams)
    prompt_sum = completion_sum = 0
    for item in GOLDEN_SET[:4]:
        response = gw.client.post("/v1/chat/completions", json=chat(item.prompt))
        assert response.status_code == 200
        assert response.headers["x-redline-served-region"] == "primary"
        assert response.headers["x-redline-rerouted"] == "false"
        assert response.headers[MODEL_VERSION_HEADER] == "base"
        usage = response.json()["usage"]
        prompt_sum += usage["prompt_tokens"]
        completion_sum += usage["completion_tokens"]
    labels = {"served_region": "primary", "model": BASE, "model_version": "base"}
    assert gw.value(catalog.LLM_PROMPT_TOKENS_TOTAL.name, **labels) == prompt_sum
    assert gw.value(catalog.LLM_GENERATED_TOKENS_TOTAL.name, **labels) == completion_sum
    request_labels = {
        "region": "primary",
        "served_region": "primary",
        "rerouted": "false",
        "model": BASE,
        "model_version": "base",
        "status": "200",
    }
    assert gw.value(catalog.LLM_REQUESTS_TOTAL.name, **request_labels) == 4
    assert gw.value(catalog.LLM_REQUEST_DURATION_SECONDS.count, **request_labels) == 4
    assert gw.value(catalog.LLM_REQUEST_ERRORS_TOTAL.name, **request_labels) == 0


def sse_events(raw: bytes) -> list[Any]:
    assert raw.endswith(b"\n\n")
    out: list[Any] = []
    for event in raw[:-2].split(b"\n\n"):
        assert event.startswith(b"data: ")
        data = event[6:]
        out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


def test_streaming_token_counters_match_usage(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams)
    labels = {"served_region": "primary", "model": BASE, "model_version": "base"}
    prompt = "count these five words"
    # Asked for usage: the client gets the usage chunk, and the counters equal it.
    body = chat(prompt, max_tokens=9, stream=True, stream_options={"include_usage": True})
    events = sse_events(gw.client.post("/v1/chat/completions", json=body).content)
    usage = events[-2]["usage"]
    assert usage == {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13}
    assert gw.value(catalog.LLM_PROMPT_TOKENS_TOTAL.name, **labels) == 4
    assert gw.value(catalog.LLM_GENERATED_TOKENS_TOTAL.name, **labels) == 9
    # Not asked: the gateway still counts from upstream usage, and the client sees none of it.
    body = chat(prompt, max_tokens=6, stream=True)
    events = sse_events(gw.client.post("/v1/chat/completions", json=body).content)
    assert events[-1] == "[DONE]"
    assert all(event["choices"] for event in events[:-1])
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert len(content.split()) == 6
    assert gw.value(catalog.LLM_PROMPT_TOKENS_TOTAL.name, **labels) == 8
    assert gw.value(catalog.LLM_GENERATED_TOKENS_TOTAL.name, **labels) == 15
    assert gw.value(catalog.LLM_TIME_TO_FIRST_TOKEN_SECONDS.count, **labels) == 2


def test_counts_stream_chunks_when_the_upstream_sends_no_usage(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams, inject_stream_usage=False)
    gw.client.post("/v1/chat/completions", json=chat("x", max_tokens=7, stream=True))
    labels = {"served_region": "primary", "model": BASE, "model_version": "base"}
    assert gw.value(catalog.LLM_GENERATED_TOKENS_TOTAL.name, **labels) == 7
    assert gw.value(catalog.LLM_PROMPT_TOKENS_TOTAL.name, **labels) == 0  # unknown without usage


def test_streams_are_passed_through_not_buffered(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams)
    faults(upstreams["primary"], tokens_per_second=25)
    arrivals: list[float] = []
    started = time.perf_counter()
    with gw.client.stream(
        "POST", "/v1/chat/completions", json=chat("x", max_tokens=10, stream=True)
    ) as response:
        for chunk in response.iter_raw():
            if b'"content":"' in chunk:
                arrivals.append(time.perf_counter() - started)
    # 10 tokens at 25/s: a buffering proxy would deliver them all at once after ~0.4 s.
    assert arrivals[0] < 0.2
    assert arrivals[-1] - arrivals[0] >= 0.3


def duration_labels(region: str, served: str, rerouted: str) -> dict[str, str]:
    return {
        "region": region,
        "served_region": served,
        "rerouted": rerouted,
        "model": BASE,
        "model_version": "base",
        "status": "200",
    }


def test_reroute_on_5xx_records_full_latency(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams)
    faults(upstreams["primary"], error_rate=1.0, latency={"base_seconds": 0.3})
    response = gw.client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200
    assert response.headers["x-redline-served-region"] == "secondary"
    assert response.headers["x-redline-rerouted"] == "true"
    labels = duration_labels("primary", "secondary", "true")
    assert gw.value(catalog.LLM_REQUEST_DURATION_SECONDS.count, **labels) == 1
    # The failed attempt's 0.3 s is in the recorded latency, so it is not in the 0.3 s bucket.
    assert gw.value(catalog.LLM_REQUEST_DURATION_SECONDS.sum, **labels) >= 0.3
    assert gw.value(catalog.LLM_REQUEST_DURATION_SECONDS.bucket, **labels, le="0.3") == 0
    assert gw.value(catalog.LLM_REQUEST_DURATION_SECONDS.bucket, **labels, le="0.5") == 1
    assert (
        gw.value(
            catalog.LLM_REROUTES_TOTAL.name,
            from_region="primary",
            to_region="secondary",
            reason="server_error",
        )
        == 1
    )
    assert gw.total(catalog.LLM_REQUEST_ERRORS_TOTAL.name) == 0


def test_reroute_when_the_primary_refuses_connections(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    gw = start_gateway({"primary": dead, "secondary": upstreams["secondary"]})
    response = gw.client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200
    assert response.headers["x-redline-served-region"] == "secondary"
    assert (
        gw.value(
            catalog.LLM_REQUEST_DURATION_SECONDS.count,
            **duration_labels("primary", "secondary", "true"),
        )
        == 1
    )
    assert (
        gw.value(
            catalog.LLM_REROUTES_TOTAL.name,
            from_region="primary",
            to_region="secondary",
            reason="connect_error",
        )
        == 1
    )


def test_reroute_when_the_first_byte_misses_the_budget(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams, first_byte_budget_seconds=0.15)
    faults(upstreams["primary"], outage="hang")
    for body in (chat(), chat(stream=True)):
        started = time.perf_counter()
        response = gw.client.post("/v1/chat/completions", json=body)
        elapsed = time.perf_counter() - started
        assert response.status_code == 200
        assert response.headers["x-redline-served-region"] == "secondary"
        assert 0.15 <= elapsed < 0.6
    labels = duration_labels("primary", "secondary", "true")
    assert gw.value(catalog.LLM_REQUEST_DURATION_SECONDS.count, **labels) == 2
    assert gw.value(catalog.LLM_REQUEST_DURATION_SECONDS.sum, **labels) >= 0.3
    reason = {"from_region": "primary", "to_region": "secondary", "reason": "first_byte_budget"}
    assert gw.value(catalog.LLM_REROUTES_TOTAL.name, **reason) == 2


def test_the_last_region_is_not_cut_by_the_budget(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams, first_byte_budget_seconds=0.1)
    for url in upstreams.values():
        faults(url, first_byte_delay_seconds=0.25)
    started = time.perf_counter()
    response = gw.client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200
    assert response.headers["x-redline-served-region"] == "secondary"
    assert time.perf_counter() - started >= 0.35  # 0.1 s budget on the primary + 0.25 s


def test_every_region_failing(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams)
    for url in upstreams.values():
        faults(url, error_rate=1.0, error_status=503)
    response = gw.client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 503  # the last region's own answer, passed through
    assert response.json()["error"]["message"] == "injected fault"
    labels = {**duration_labels("primary", "secondary", "true"), "model_version": "unknown"}
    assert gw.value(catalog.LLM_REQUEST_ERRORS_TOTAL.name, **{**labels, "status": "503"}) == 1

    dead = {region: f"http://127.0.0.1:{free_port()}" for region in REGIONS}
    gw = start_gateway(dead)
    response = gw.client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert "primary: connect error" in message and "secondary: connect error" in message
    assert gw.total(catalog.LLM_REQUEST_ERRORS_TOTAL.name, status="502") == 1


def test_4xx_is_passed_through_without_reroute(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams)
    response = gw.client.post("/v1/chat/completions", json=chat(model="nope"))
    assert response.status_code == 404
    assert response.headers["x-redline-served-region"] == "primary"
    assert gw.total(catalog.LLM_REROUTES_TOTAL.name) == 0
    assert gw.total(catalog.LLM_REQUESTS_TOTAL.name, status="404", model="nope") == 1
    assert gw.total(catalog.LLM_REQUEST_ERRORS_TOTAL.name) == 0


def test_bad_input_is_rejected_by_the_gateway(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams, max_body_bytes=1024)
    response = gw.client.post(
        "/v1/chat/completions", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]
    big = chat("word " * 400)
    response = gw.client.post("/v1/chat/completions", json=big)
    assert response.status_code == 413
    assert gw.total(catalog.LLM_REQUESTS_TOTAL.name, region="none") == 2
    assert gw.client.post("/v1/embeddings", json={}).status_code == 404


def test_repeatedly_failing_region_is_tried_last(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams, unhealthy_after_failures=2, unhealthy_cooldown_seconds=0.5)
    faults(upstreams["primary"], error_rate=1.0)
    for _ in range(2):
        assert gw.client.post("/v1/chat/completions", json=chat()).status_code == 200
    assert gw.client.get("/healthz").json()["unhealthy"] == ["primary"]
    response = gw.client.post("/v1/chat/completions", json=chat())
    assert response.headers["x-redline-rerouted"] == "false"  # went straight to the secondary
    assert (
        gw.value(
            catalog.LLM_REQUESTS_TOTAL.name, **duration_labels("secondary", "secondary", "false")
        )
        == 1
    )
    faults(upstreams["primary"])
    time.sleep(0.55)
    response = gw.client.post("/v1/chat/completions", json=chat())
    assert response.headers["x-redline-served-region"] == "primary"


def wait_for(predicate: Callable[[], bool], timeout: float = 3.0) -> float:
    started = time.perf_counter()
    while not predicate():
        assert time.perf_counter() - started < timeout, "condition not reached"
        time.sleep(0.02)
    return time.perf_counter() - started


def served_by(gw: Gateway) -> str:
    response = gw.client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200
    return response.headers["x-redline-served-region"]


def test_routing_override_moves_traffic(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway], redis_url: str
) -> None:
    gw = start_gateway(upstreams, routing_refresh_seconds=0.2)
    store = RoutingStore.from_url(redis_url, regions=REGIONS)
    try:
        assert served_by(gw) == "primary"
        store.set_override("secondary", "drill: primary degraded")
        assert wait_for(lambda: served_by(gw) == "secondary") <= 1.0
        for _ in range(5):
            assert served_by(gw) == "secondary"
        labels = duration_labels("secondary", "secondary", "false")
        assert gw.value(catalog.LLM_REQUESTS_TOTAL.name, **labels) >= 6
        assert gw.client.get("/healthz").json()["override"] == "secondary"
        store.clear_override()
        assert wait_for(lambda: served_by(gw) == "primary") <= 1.0
        store.set_override("secondary", "short", ttl_seconds=0.4)
        wait_for(lambda: served_by(gw) == "secondary")
        wait_for(lambda: served_by(gw) == "primary")  # the override lapsed by itself
        store.close_admission("primary", "spot notice")
        wait_for(lambda: served_by(gw) == "secondary")
        assert store.get_admission("primary").open is False
        store.open_admission("primary")
        wait_for(lambda: served_by(gw) == "primary")
    finally:
        store.close()


def test_garbage_in_the_routing_store_is_ignored(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway], redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set(override_key(DEFAULT_PREFIX), b"\x00not json")
    client.close()
    gw = start_gateway(upstreams)
    assert served_by(gw) == "primary"


def test_redis_down_does_not_break_the_gateway(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    own = start_redis(tmp_path / "redis")
    try:
        gw = start_gateway(upstreams, redis_url=own.extra["url"], routing_refresh_seconds=0.2)
        store = RoutingStore.from_url(own.extra["url"])
        store.set_override("secondary", "test")
        store.close()
        wait_for(lambda: served_by(gw) == "secondary")
        assert gw.value(catalog.LLM_GATEWAY_ROUTING_STORE_UP.name) == 1
        own.kill()
        wait_for(lambda: gw.value(catalog.LLM_GATEWAY_ROUTING_STORE_UP.name) == 0)
        # Redis is gone: the configured order applies and no request fails or waits on it.
        for _ in range(20):
            started = time.perf_counter()
            assert served_by(gw) == "primary"
            assert time.perf_counter() - started < 0.2
    finally:
        own.stop()
    never = start_gateway(upstreams, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    assert served_by(never) == "primary"
    assert never.client.get("/healthz").json()["routing_store_up"] is False


def test_model_version_label_follows_the_served_adapter(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    gw = start_gateway(upstreams)
    adapter = tmp_path / "chat" / "v3"
    adapter.mkdir(parents=True)
    url = upstreams["primary"]
    loaded = httpx.post(
        f"{url}/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": str(adapter)}
    )
    assert loaded.status_code == 200
    try:
        response = gw.client.post("/v1/chat/completions", json=chat(model="chat"))
        assert response.headers[MODEL_VERSION_HEADER] == "v3"
        labels = {**duration_labels("primary", "primary", "false"), "model": "chat"}
        assert gw.value(catalog.LLM_REQUESTS_TOTAL.name, **{**labels, "model_version": "v3"}) == 1
    finally:
        httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "chat"})


def test_model_label_is_bounded(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams, max_model_labels=2)
    for name in ("a", "b", "c", "d"):
        gw.client.post("/v1/chat/completions", json=chat(model=name))
    models = {
        sample.labels["model"]
        for family in gw.registry.collect()
        for sample in family.samples
        if sample.name == catalog.LLM_REQUESTS_TOTAL.name
    }
    assert models == {"a", "b", "other"}


def test_client_that_walks_away_is_recorded_as_499(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams)
    faults(upstreams["primary"], tokens_per_second=20)
    with gw.client.stream(
        "POST", "/v1/chat/completions", json=chat(max_tokens=40, stream=True)
    ) as response:
        next(response.iter_raw())
    wait_for(lambda: gw.total(catalog.LLM_REQUESTS_TOTAL.name, status="499") == 1)
    assert gw.total(catalog.LLM_REQUEST_ERRORS_TOTAL.name) == 0


def test_promtool_accepts_the_exposition(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams, first_byte_budget_seconds=0.2)
    gw.client.post("/v1/chat/completions", json=chat())
    gw.client.post("/v1/chat/completions", json=chat(stream=True))
    faults(upstreams["primary"], error_rate=1.0)
    gw.client.post("/v1/chat/completions", json=chat())
    gw.client.post("/v1/chat/completions", content=b"nope")
    response = gw.client.get("/metrics")
    assert response.status_code == 200
    text = response.text
    for name in (
        catalog.LLM_REQUEST_DURATION_SECONDS.bucket,
        catalog.LLM_REQUESTS_TOTAL.name,
        catalog.LLM_REQUEST_ERRORS_TOTAL.name,
        catalog.LLM_REROUTES_TOTAL.name,
        catalog.LLM_GENERATED_TOKENS_TOTAL.name,
        catalog.LLM_PROMPT_TOKENS_TOTAL.name,
        catalog.LLM_TIME_TO_FIRST_TOKEN_SECONDS.bucket,
    ):
        assert f"\n{name}{{" in text, name
    assert 'le="0.8"' in text
    assert "_created" not in text
    result = subprocess.run(
        [find_binary("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_created_series_can_be_turned_on(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams, created_series=True)
    gw.client.post("/v1/chat/completions", json=chat())
    assert f"{catalog.LLM_REQUESTS_TOTAL.family}_created{{" in gw.client.get("/metrics").text


def test_models_are_proxied(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(upstreams)
    response = gw.client.get("/v1/models")
    assert response.status_code == 200
    assert response.json()["data"][0]["id"] == BASE
    assert gw.total(catalog.LLM_REQUESTS_TOTAL.name) == 0  # not an inference request


# --- the gateway's upstream HTTP/1.1 client, against a scripted raw-socket server -------------

Action = bytes | float | None  # bytes: send; float: sleep; None: close the connection


class RawServer:
    """A loopback TCP server answering each request (any method) with scripted raw bytes."""

    def __init__(self, script: Callable[[int], list[Action]]) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with server._lock:
                    server.connections += 1
                sock: socket.socket = self.request
                buffer = b""
                while True:
                    while b"\r\n\r\n" not in buffer:
                        data = sock.recv(65536)
                        if not data:
                            return
                        buffer += data
                    head, _, buffer = buffer.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(buffer) < length:
                        buffer += sock.recv(65536)
                    buffer = buffer[length:]
                    with server._lock:
                        index = len(server.requests)
                        server.requests.append(head)
                    for action in server.script(index):
                        if action is None:
                            sock.close()
                            return
                        if isinstance(action, float):
                            time.sleep(action)
                        else:
                            sock.sendall(action)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def raw_server() -> Iterator[Callable[[Callable[[int], list[Action]]], RawServer]]:
    servers: list[RawServer] = []

    def start(script: Callable[[int], list[Action]]) -> RawServer:
        servers.append(RawServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def ok(body: bytes = b"hello", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def fetch(pool: UpstreamPool, method: str = "POST") -> tuple[int, list[bytes]]:
    response = await pool.request(method, "/v1/x?a=1", [("x-test", "1")], b"{}")
    pieces = [piece async for piece in response.chunks()]
    return response.status, pieces


def test_upstream_pool_reuses_keep_alive_connections(
    raw_server: Callable[[Callable[[int], list[Action]]], RawServer],
) -> None:
    server = raw_server(lambda i: [ok(b"answer %d" % i)])

    async def run() -> list[bytes]:
        pool = UpstreamPool(server.url + "/prefix")
        try:
            return [b"".join((await fetch(pool))[1]) for _ in range(3)]
        finally:
            await pool.aclose()

    assert asyncio.run(run()) == [b"answer 0", b"answer 1", b"answer 2"]
    assert server.connections == 1
    first = server.requests[0].split(b"\r\n")
    assert first[0] == b"POST /prefix/v1/x?a=1 HTTP/1.1"
    assert b"x-test: 1" in first and b"content-length: 2" in first


def test_upstream_pool_relays_chunks_as_they_arrive(
    raw_server: Callable[[Callable[[int], list[Action]]], RawServer],
) -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    server = raw_server(
        lambda i: [head, b"5;ext=1\r\nfirst\r\n", 0.2, b"6\r\nsecond\r\n0\r\nx-trailer: 1\r\n\r\n"]
    )

    async def run() -> list[tuple[float, bytes]]:
        pool = UpstreamPool(server.url)
        try:
            response = await pool.request("POST", "/", [], b"")
            started = time.perf_counter()
            out = [(time.perf_counter() - started, piece) async for piece in response.chunks()]
            out.append((0.0, b"%d" % (await fetch(pool))[0]))  # the connection was reused
            return out
        finally:
            await pool.aclose()

    pieces = asyncio.run(run())
    assert [p for _, p in pieces] == [b"first", b"second", b"200"]
    assert pieces[0][0] < 0.1 <= pieces[1][0]
    assert server.connections == 1


def test_upstream_pool_reads_close_delimited_and_empty_bodies(
    raw_server: Callable[[Callable[[int], list[Action]]], RawServer],
) -> None:
    scripts: dict[int, list[Action]] = {
        0: [b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil ", b"the end", None],
        1: [b"HTTP/1.1 204 No Content\r\n\r\n"],
        2: [b"HTTP/1.1 100 Continue\r\n\r\n", ok(b"after continue")],
        3: [b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n"],  # HEAD: no body follows
    }
    server = raw_server(lambda i: scripts[i])

    async def run() -> list[tuple[int, bytes]]:
        pool = UpstreamPool(server.url)
        try:
            out = []
            for method in ("POST", "POST", "POST", "HEAD"):
                status, pieces = await fetch(pool, method)
                out.append((status, b"".join(pieces)))
            return out
        finally:
            await pool.aclose()

    assert asyncio.run(run()) == [
        (200, b"until the end"),
        (204, b""),
        (200, b"after continue"),
        (200, b""),
    ]
    assert server.connections == 2  # the close-delimited body used up its connection


def test_upstream_pool_retries_a_reused_connection_the_server_dropped(
    raw_server: Callable[[Callable[[int], list[Action]]], RawServer],
) -> None:
    # The second request arrives on the kept-alive connection, which the server then drops
    # without answering (as an upstream closing an idle connection does): retried once.
    server = raw_server(lambda i: [None] if i == 1 else [ok(b"fine %d" % i)])

    async def run() -> list[bytes]:
        pool = UpstreamPool(server.url)
        try:
            return [b"".join((await fetch(pool))[1]) for _ in range(2)]
        finally:
            await pool.aclose()

    assert asyncio.run(run()) == [b"fine 0", b"fine 2"]
    assert server.connections == 2


@pytest.mark.parametrize(
    ("script", "error", "fragment"),
    [
        ([b"HTTP/1.1 2OO OK\r\n\r\n"], UpstreamProtocolError, "bad status line"),
        ([b"SMTP ready\r\n\r\n"], UpstreamProtocolError, "bad status line"),
        ([b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"], UpstreamProtocolError, "header"),
        ([b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"], UpstreamProtocolError, "length"),
        (
            [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", None],
            UpstreamProtocolError,
            "body bytes missing",
        ),
        (
            [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"],
            UpstreamProtocolError,
            "chunk size",
        ),
        ([b"HTTP/1.1 200 OK\r\n"], UpstreamProtocolError, "head"),  # then closed below
        ([0.5], UpstreamTimeoutError, "no response head within 0.2 s"),
        ([None], UpstreamProtocolError, "without answering"),
    ],
)
def test_upstream_pool_reports_bad_responses(
    raw_server: Callable[[Callable[[int], list[Action]]], RawServer],
    script: list[Action],
    error: type[Exception],
    fragment: str,
) -> None:
    if script == [b"HTTP/1.1 200 OK\r\n"]:
        script = [*script, None]
    server = raw_server(lambda i: script)

    async def run() -> None:
        pool = UpstreamPool(server.url, read_timeout=0.2)
        try:
            await fetch(pool)
        finally:
            await pool.aclose()

    with pytest.raises(error, match=fragment):
        asyncio.run(run())


def test_upstream_pool_closes_abandoned_responses_and_refused_connects(
    raw_server: Callable[[Callable[[int], list[Action]]], RawServer],
) -> None:
    server = raw_server(lambda i: [ok(b"x" * 100_000)])

    async def run() -> None:
        pool = UpstreamPool(server.url)
        try:
            response = await pool.request("POST", "/", [], b"")
            await response.aclose()  # body never read: the connection cannot be reused
            await fetch(pool)
        finally:
            await pool.aclose()
        with pytest.raises(UpstreamConnectError, match="connect to"):
            await fetch(UpstreamPool(f"http://127.0.0.1:{free_port()}"))

    asyncio.run(run())
    assert server.connections == 2


def test_a_stream_cut_by_the_upstream_is_a_502_error(
    raw_server: Callable[[Callable[[int], list[Action]]], RawServer],
    start_gateway: Callable[..., Gateway],
) -> None:
    event = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    server = raw_server(
        lambda i: [
            head + b"x-redline-model-version: v9\r\n\r\n",
            b"%x\r\n%s\r\n" % (len(event), event),
            None,
        ]
    )
    gw = start_gateway({"primary": server.url})
    with pytest.raises(httpx.RemoteProtocolError):
        gw.client.post("/v1/chat/completions", json=chat(stream=True))
    labels = {
        **duration_labels("primary", "primary", "false"),
        "model_version": "v9",
        "status": "502",
    }
    wait_for(lambda: gw.value(catalog.LLM_REQUEST_ERRORS_TOTAL.name, **labels) == 1)
    assert (
        gw.value(
            catalog.LLM_GENERATED_TOKENS_TOTAL.name,
            served_region="primary",
            model=BASE,
            model_version="v9",
        )
        == 1
    )


def test_upstream_pool_times_out_a_stalled_body(
    raw_server: Callable[[Callable[[int], list[Action]]], RawServer],
) -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    server = raw_server(lambda i: [head, b"2\r\nok\r\n", 0.6])

    async def run() -> list[bytes]:
        pool = UpstreamPool(server.url, read_timeout=0.2)
        got: list[bytes] = []
        try:
            response = await pool.request("POST", "/", [], b"")
            with pytest.raises(UpstreamTimeoutError, match="read timed out after 0.2 s"):
                async for piece in response.chunks():
                    got.append(piece)
        finally:
            await pool.aclose()
        return got

    assert asyncio.run(run()) == [b"ok"]


def test_stream_token_counting_is_not_fooled_by_content_text(
    raw_server: Callable[[Callable[[int], list[Action]]], RawServer],
    start_gateway: Callable[..., Gateway],
) -> None:
    events = [
        b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
        b'{"choices":[{"index":0,"delta":{"content": "a"}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"say \\"content\\":\\"x\\" now"}}]}',
        b'{"choices":[{"index":0,"delta":{"content":null},"finish_reason":"stop"}]}',
        b"[DONE]",
    ]
    body = b"".join(b"data: %s\n\n" % event for event in events)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    server = raw_server(lambda i: [head + b"content-length: %d\r\n\r\n" % len(body) + body])
    gw = start_gateway({"primary": server.url})
    response = gw.client.post("/v1/chat/completions", json=chat(stream=True))
    assert response.content == body  # passed through byte for byte
    labels = {"served_region": "primary", "model": BASE, "model_version": "unknown"}
    assert gw.value(catalog.LLM_GENERATED_TOKENS_TOTAL.name, **labels) == 2
    assert gw.value(catalog.LLM_PROMPT_TOKENS_TOTAL.name, **labels) == 0
    assert gw.value(catalog.LLM_TIME_TO_FIRST_TOKEN_SECONDS.count, **labels) == 1


def test_budget_can_spare_non_streaming_requests(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    gw = start_gateway(
        upstreams, first_byte_budget_seconds=0.1, first_byte_budget_streaming_only=True
    )
    faults(upstreams["primary"], first_byte_delay_seconds=0.25)
    response = gw.client.post("/v1/chat/completions", json=chat())
    assert response.headers["x-redline-served-region"] == "primary"
    response = gw.client.post("/v1/chat/completions", json=chat(stream=True))
    assert response.headers["x-redline-served-region"] == "secondary"


def test_cli_serves_a_simulator_and_a_gateway(redis_url: str, tmp_path: Path) -> None:
    sim_port, gw_port = free_port(), free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"upstreams:\n  primary: http://127.0.0.1:{sim_port}\nfirst-byte-budget-seconds: 0.5\n"
    )
    argv = [sys.executable, "-m", "redline.cli"]
    processes = [
        subprocess.Popen(
            [*argv, "simulate", "upstream", "--region", "primary", "--port", str(sim_port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [
                *argv,
                "gateway",
                "--port",
                str(gw_port),
                "--redis-url",
                redis_url,
                "--config",
                str(config),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        ),
    ]
    try:
        lines = [process.stdout.readline().decode() for process in processes if process.stdout]
        assert f"region primary on http://127.0.0.1:{sim_port}" in lines[0]
        assert f"gateway on http://127.0.0.1:{gw_port}" in lines[1]
        url = f"http://127.0.0.1:{gw_port}"
        # Both banners print before uvicorn binds: wait for the upstream as well as the gateway.
        wait_for(lambda: _up(f"http://127.0.0.1:{sim_port}/healthz"), timeout=15)
        wait_for(lambda: _up(f"{url}/healthz"), timeout=15)
        response = httpx.post(f"{url}/v1/chat/completions", json=chat(GOLDEN_SET[0].prompt))
        assert response.json()["choices"][0]["message"]["content"] == GOLDEN_SET[0].reference
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)
            if process.stdout:
                process.stdout.close()


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "upstreams: no upstream configured"),
        (["--upstream", "primary"], "expected REGION=URL"),
        (["--upstream", "Primary=http://x"], "must be lowercase"),
        (["--upstream", "primary=ftp://x"], "is not an http(s) URL"),
        (["--upstream", "primary=http://x", "--first-byte-budget", "-1"], "greater than 0"),
    ],
)
def test_cli_rejects_bad_gateway_settings(
    args: list[str], fragment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("REDLINE_"):
            monkeypatch.delenv(name)
    from redline.cli import app  # the whole CLI imports every package: only here

    result = CliRunner().invoke(app, ["gateway", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_concurrent_requests_share_the_pool_correctly(
    upstreams: dict[str, str], start_gateway: Callable[..., Gateway]
) -> None:
    # Sixty requests at once share one process with their upstreams: on a busy machine a first
    # byte can take over the 1 s budget, and a breaker opening would move the requests this test
    # counts. Pool sharing, not timing, is under test here.
    gw = start_gateway(upstreams, first_byte_budget_seconds=None, connect_timeout_seconds=5.0)
    jitter = {"base_seconds": 0.02, "jitter": "uniform", "jitter_seconds": 0.05}
    faults(upstreams["primary"], latency=jitter)

    async def one(client: httpx.AsyncClient, index: int) -> tuple[str, str, int]:
        stream = index % 2 == 0
        prompt, max_tokens = f"request number {index}", 1 + index % 7
        body = chat(prompt, max_tokens=max_tokens, stream=stream)
        if stream:
            body["stream_options"] = {"include_usage": True}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        if stream:
            events = sse_events(response.content)
            usage = events[-2]["usage"]
            text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
        else:
            usage = response.json()["usage"]
            text = response.json()["choices"][0]["message"]["content"]
        expected = " ".join(build_answer(prompt, BASE, max_tokens, wrong=False)[0])
        return text, expected, usage["prompt_tokens"] + usage["completion_tokens"]

    async def run() -> list[tuple[str, str, int]]:
        async with httpx.AsyncClient(base_url=gw.server.url, timeout=10) as client:
            return await asyncio.gather(*(one(client, i) for i in range(60)))

    results = asyncio.run(run())
    assert all(text == expected for text, expected, _ in results)  # nothing cross-wired
    labels = {"served_region": "primary", "model": BASE, "model_version": "base"}
    expected_tokens = sum(tokens for _, _, tokens in results)

    def counted() -> float:
        return gw.value(catalog.LLM_PROMPT_TOKENS_TOTAL.name, **labels) + gw.value(
            catalog.LLM_GENERATED_TOKENS_TOTAL.name, **labels
        )

    # A stream is counted when its generator closes, which may be just after the client has
    # read the last chunk: give the last few streams a moment under load.
    deadline = time.monotonic() + 5.0
    while counted() != expected_tokens and time.monotonic() < deadline:
        time.sleep(0.05)
    assert counted() == expected_tokens
    assert gw.total(catalog.LLM_REQUESTS_TOTAL.name, status="200") == 60


def test_upstream_pool_coalesces_chunks_that_arrived_together(
    raw_server: Callable[[Callable[[int], list[Action]]], RawServer],
) -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    burst = b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n"
    server = raw_server(lambda i: [head + burst, 0.2, b"4\r\nfour\r\n0\r\n\r\n"])

    async def run() -> list[bytes]:
        pool = UpstreamPool(server.url)
        try:
            response = await pool.request("POST", "/", [], b"")
            return [piece async for piece in response.chunks()]
        finally:
            await pool.aclose()

    assert asyncio.run(run()) == [b"onetwothree", b"four"]
