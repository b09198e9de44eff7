"""The gateway's side of spot preemption over real HTTP: drain, triage, the SSE retry contract,
the Redis ledger, resume after the served prefix, never twice for requests that are not
retry-safe, round robin with a spill pool."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_answer, build_simulator_app
from redline.devstack.processes import free_port
from redline.gateway import GatewaySettings
from redline.platform.spot import RESUME_HEADER, RequestLedger, parse_spot_error
from redline.slo import catalog
from tests.support.gateway import RunningGateway, gateway_starter

pytestmark = pytest.mark.integration

BASE = "redline-base"
NODES = ("spot-a", "spot-b", "ondemand")


class Gw(RunningGateway):
    def drain(self, node: str, budget: float, **extra: Any) -> dict[str, Any]:
        response = self.client.post(
            "/admin/spot/drain", json={"node": node, "budget_seconds": budget, **extra}
        )
        assert response.status_code == 200, response.text
        report: dict[str, Any] = response.json()
        return report


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, ServerThread]]:
    versions = {"spot-a": "v1", "spot-b": "v1", "ondemand": "v2"}
    servers = {
        node: serve_in_thread(
            build_simulator_app(
                SimulatorSettings(region=node, seed=i, base_model_version=versions[node])
            )
        )
        for i, node in enumerate(NODES)
    }
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture()
def upstreams(sims: dict[str, ServerThread]) -> dict[str, str]:
    for server in sims.values():
        httpx.post(f"{server.url}/admin/faults", json={"tokens_per_second": 50}).raise_for_status()
    return {node: server.url for node, server in sims.items()}


ADMIN_TOKEN = "spot-admin-t0ken"


@pytest.fixture()
def start_gateway(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Gw]]:
    """Gateways whose /admin takes ADMIN_TOKEN, with clients that send it."""
    token = tmp_path / "admin-token"
    token.write_text(ADMIN_TOKEN + "\n")
    with gateway_starter(redis_url, Gw, 30.0) as start:

        def start_with_token(upstreams: dict[str, str], **overrides: Any) -> Gw:
            gw = start(upstreams, admin_token_file=token, **overrides)
            gw.client.headers["authorization"] = f"Bearer {ADMIN_TOKEN}"
            return gw

        yield start_with_token


def body(prompt: str, max_tokens: int, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "model": BASE,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }


def expected(prompt: str, max_tokens: int) -> str:
    return " ".join(build_answer(prompt, BASE, max_tokens, False)[0])


@dataclass
class Streamed:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    text: str = ""
    error: dict[str, Any] | None = None
    done: bool = False
    events: int = 0


def stream(
    client: httpx.Client, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> Streamed:
    out = Streamed()
    with client.stream(
        "POST", "/v1/chat/completions", json=payload, headers=headers or {}
    ) as response:
        out.status = response.status_code
        out.headers = dict(response.headers)
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out.done = True
                continue
            event = json.loads(line[6:])
            out.events += 1
            if "error" in event:
                out.error = event
            for choice in event.get("choices") or []:
                out.text += (choice.get("delta") or {}).get("content") or ""
    return out


def in_background(fn: Callable[[], Streamed]) -> tuple[threading.Thread, list[Streamed]]:
    box: list[Streamed] = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    return thread, box


def wait_inflight(gw: Gw, node: str, count: int = 1, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while gw.client.get(f"/admin/spot/nodes/{node}").json()["inflight"] < count:
        assert time.monotonic() < deadline, f"nothing in flight on {node}"
        time.sleep(0.02)


def test_abort_ends_the_stream_with_the_event_and_the_retry_resumes_after_the_prefix(
    upstreams: dict[str, str], start_gateway: Callable[..., Gw], redis_url: str
) -> None:
    gw = start_gateway({"spot-a": upstreams["spot-a"], "spot-b": upstreams["spot-b"]})
    prompt = "a long story about spot instances"
    payload = body(prompt, 200)
    thread, box = in_background(lambda: stream(gw.client, payload))
    wait_inflight(gw, "spot-a")
    time.sleep(0.6)  # some tokens reach the client
    report = gw.drain("spot-a", 1.0)
    thread.join(10)
    (first,) = box
    (decision,) = report["decisions"]
    assert decision["action"] == "abort" and report["aborted_ratio"] == 1.0
    assert 0.015 < decision["tpot_seconds"] < 0.03  # measured from the stream (50 tokens/s)
    assert first.status == 200 and first.done and first.error is not None
    info = parse_spot_error(first.error)
    assert info is not None and info.recoverable and info.resume_header == RESUME_HEADER
    assert info.served_prefix_tokens == len(first.text.split()) > 0
    assert first.error["error"]["retry"]["resumes_after_prefix"] is True
    # The ledger knows what the client has.
    client = redis.Redis.from_url(redis_url)
    entry = RequestLedger(client).get(info.request_id)
    client.close()
    assert entry is not None
    assert (entry.status, entry.attempt, entry.node, entry.model_revision) == (
        "interrupted", 1, "spot-a", "v1",
    )  # fmt: skip
    assert entry.served_prefix == first.text and entry.retry_safe
    assert entry.interruption_reason.startswith("SPOT_PREEMPTION: triage")
    # New requests go to the other replica while spot-a drains.
    assert stream(gw.client, body("new", 3)).headers["x-redline-served-region"] == "spot-b"
    second = stream(gw.client, payload, {RESUME_HEADER: info.request_id})
    assert second.status == 200 and second.error is None and second.done
    assert second.headers["x-redline-resumed"] == "true"
    assert second.headers["x-redline-attempt"] == "2"
    assert second.headers["x-redline-served-region"] == "spot-b"
    assert first.text + second.text == expected(prompt, 200)
    again = gw.client.post(
        "/v1/chat/completions", json=payload, headers={RESUME_HEADER: info.request_id}
    )
    assert again.status_code == 409 and "complete" in again.json()["error"]["message"]
    unknown = gw.client.post("/v1/chat/completions", json=payload, headers={RESUME_HEADER: "nope"})
    assert unknown.status_code == 404
    assert gw.value(catalog.LLM_SPOT_INFLIGHT_ABORTED_RATIO.name, node="spot-a") == 1.0
    assert (
        gw.value(catalog.LLM_SPOT_TRIAGED_REQUESTS_TOTAL.name, node="spot-a", decision="abort") == 1
    )
    assert (
        gw.value(
            catalog.LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL.name, node="spot-a", recoverable="true"
        )
        == 1
    )
    assert gw.value(catalog.LLM_SPOT_RETRIES_TOTAL.name, outcome="resumed") == 1
    assert gw.value(catalog.LLM_SPOT_RETRIES_TOTAL.name, outcome="refused") == 1
    assert gw.value(catalog.LLM_SPOT_WASTED_DECODE_TOKENS_TOTAL.name, node="spot-a",
                    reason="not_recoverable") == 0  # fmt: skip


def test_a_request_that_fits_the_budget_finishes_on_the_draining_node(
    upstreams: dict[str, str], start_gateway: Callable[..., Gw]
) -> None:
    gw = start_gateway({"spot-a": upstreams["spot-a"], "spot-b": upstreams["spot-b"]})
    prompt = "short answer"
    thread, box = in_background(lambda: stream(gw.client, body(prompt, 40)))
    wait_inflight(gw, "spot-a")
    report = gw.drain("spot-a", 5.0)
    thread.join(10)
    (result,) = box
    assert [d["action"] for d in report["decisions"]] == ["continue"]
    assert result.error is None and result.done and result.text == expected(prompt, 40)
    assert result.headers["x-redline-served-region"] == "spot-a"
    status = gw.client.get("/admin/spot/nodes/spot-a").json()
    assert (status["draining"], status["inflight"]) == (True, 0)
    assert gw.client.post("/admin/spot/release", json={"node": "spot-a"}).json()["released"]
    assert stream(gw.client, body("after", 2)).headers["x-redline-served-region"] == "spot-a"


def test_budget_spent_aborts_what_still_runs_and_a_non_streamed_request_is_retried(
    upstreams: dict[str, str], start_gateway: Callable[..., Gw], sims: dict[str, ServerThread]
) -> None:
    # Assumed 1 ms per token, triage keeps the request; at 10 tokens/s it cannot finish.
    gw = start_gateway(
        {"spot-a": upstreams["spot-a"], "ondemand": upstreams["ondemand"]},
        spot_default_tpot_seconds=0.001,
    )
    httpx.post(f"{upstreams['spot-a']}/admin/faults", json={"tokens_per_second": 10})
    prompt = "a whole answer at once"
    answer: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: answer.append(
            gw.client.post("/v1/chat/completions", json=body(prompt, 30, stream=False))
        )
    )
    thread.start()
    wait_inflight(gw, "spot-a")
    time.sleep(0.3)
    report = gw.drain("spot-a", 0.5)
    thread.join(15)
    assert [d["action"] for d in report["decisions"]] == ["continue"]
    (response,) = answer
    assert response.status_code == 200
    assert response.headers["x-redline-served-region"] == "ondemand"
    assert response.headers["x-redline-attempt"] == "2"
    assert response.json()["choices"][0]["message"]["content"] == expected(prompt, 30)
    wasted = gw.value(catalog.LLM_SPOT_WASTED_DECODE_TOKENS_TOTAL.name, node="spot-a",
                      reason="aborted_unserved")  # fmt: skip
    assert wasted > 0  # decoded on spot-a for ~0.8 s, never served
    assert (
        gw.value(
            catalog.LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL.name, node="spot-a", recoverable="true"
        )
        == 1
    )


def test_a_request_that_is_not_retry_safe_never_runs_twice(
    upstreams: dict[str, str], start_gateway: Callable[..., Gw], sims: dict[str, ServerThread]
) -> None:
    gw = start_gateway({"spot-a": upstreams["spot-a"], "spot-b": upstreams["spot-b"]})
    request_id = f"once-{time.time_ns()}"
    headers = {"x-request-id": request_id, "x-redline-retry-safe": "false"}
    payload = body("charge the card", 200)
    thread, box = in_background(lambda: stream(gw.client, payload, headers))
    wait_inflight(gw, "spot-a")
    time.sleep(0.3)
    gw.drain("spot-a", 1.0)
    thread.join(10)
    (first,) = box
    info = parse_spot_error(first.error)
    assert info is not None and not info.recoverable and not info.retry_safe
    assert info.resume_header is None and "will not run it again" in info.message
    resumed = gw.client.post("/v1/chat/completions", json=payload,
                             headers={**headers, RESUME_HEADER: request_id})  # fmt: skip
    assert resumed.status_code == 409
    assert resumed.json()["error"]["type"] == "SPOT_NOT_RETRY_SAFE"
    resent = gw.client.post("/v1/chat/completions", json=payload, headers=headers)
    assert resent.status_code == 409 and "not run twice" in resent.json()["error"]["message"]
    runs = sum(
        httpx.get(f"{s.url}/admin/stats").json()["request_ids"].get(request_id, 0)
        for s in sims.values()
    )
    assert runs == 1
    tools = body("call a tool", 3, tools=[{"type": "function", "function": {"name": "pay"}}])
    tool_id = f"tool-{time.time_ns()}"
    assert stream(gw.client, tools, {"x-request-id": tool_id}).status == 200
    second = gw.client.post("/v1/chat/completions", json=tools, headers={"x-request-id": tool_id})
    assert second.status_code == 409  # tools make it not retry-safe by default
    assert (
        gw.value(
            catalog.LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL.name, node="spot-a", recoverable="false"
        )
        == 1
    )
    assert gw.value(catalog.LLM_SPOT_WASTED_DECODE_TOKENS_TOTAL.name, node="spot-a",
                    reason="not_recoverable") == len(first.text.split())  # fmt: skip


def test_another_model_revision_regenerates_instead_of_resuming(
    upstreams: dict[str, str], start_gateway: Callable[..., Gw]
) -> None:
    gw = start_gateway({"spot-a": upstreams["spot-a"], "ondemand": upstreams["ondemand"]})
    prompt = "a story two revisions tell differently"
    payload = body(prompt, 150)
    thread, box = in_background(lambda: stream(gw.client, payload))
    wait_inflight(gw, "spot-a")
    time.sleep(0.4)
    gw.drain("spot-a", 0.5)
    thread.join(10)
    (first,) = box
    info = parse_spot_error(first.error)
    assert info is not None and info.recoverable
    second = stream(gw.client, payload, {RESUME_HEADER: info.request_id})
    assert second.headers["x-redline-served-region"] == "ondemand"
    assert second.headers["x-redline-model-version"] == "v2"
    assert second.headers["x-redline-resumed"] == "false"  # the client drops its prefix
    assert second.text == expected(prompt, 150)
    assert gw.value(catalog.LLM_SPOT_RETRIES_TOTAL.name, outcome="regenerated") == 1
    assert gw.value(catalog.LLM_SPOT_WASTED_DECODE_TOKENS_TOTAL.name, node="spot-a",
                    reason="regenerated") == info.served_prefix_tokens  # fmt: skip


def test_a_draining_node_that_dies_ends_its_streams_with_the_event(
    start_gateway: Callable[..., Gw], upstreams: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    config = tmp_path / "sim.yaml"
    config.write_text(
        f"port: {port}\nregion: spot-a\nbase_model_version: v1\n"
        "faults: {tokens_per_second: 50}\nlog_level: warning\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "redline.cli", "simulate", "upstream", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        gw = start_gateway({"spot-a": url, "spot-b": upstreams["spot-b"]})
        prompt = "interrupted by the node's death"
        payload = body(prompt, 300)
        thread, box = in_background(lambda: stream(gw.client, payload))
        wait_inflight(gw, "spot-a")
        report = gw.drain("spot-a", 30.0, continue_factor=1.0)
        assert report["continued"] == 1
        time.sleep(0.5)
        process.kill()  # preempted before the triage expected
        thread.join(10)
    finally:
        process.kill()
        process.wait(10)
    (first,) = box
    info = parse_spot_error(first.error)
    assert info is not None and info.recoverable, first  # an event, not a cut connection
    assert "went away" in info.message
    second = stream(gw.client, payload, {RESUME_HEADER: info.request_id})
    assert second.headers["x-redline-resumed"] == "true"
    assert first.text + second.text == expected(prompt, 300)


def test_without_the_ledger_an_abort_is_not_recoverable(
    upstreams: dict[str, str], start_gateway: Callable[..., Gw]
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    gw = start_gateway(
        {"spot-a": upstreams["spot-a"], "spot-b": upstreams["spot-b"]}, redis_url=dead
    )
    thread, box = in_background(lambda: stream(gw.client, body("no ledger", 200)))
    wait_inflight(gw, "spot-a")
    time.sleep(0.3)
    gw.drain("spot-a", 0.5)
    thread.join(10)
    (first,) = box
    info = parse_spot_error(first.error)
    assert info is not None and not info.recoverable and first.done
    resumed = gw.client.post("/v1/chat/completions", json=body("no ledger", 200),
                             headers={RESUME_HEADER: info.request_id})  # fmt: skip
    assert (
        resumed.status_code == 503 and resumed.json()["error"]["type"] == "SPOT_LEDGER_UNAVAILABLE"
    )


def test_admin_api_checks_token_node_and_body(
    upstreams: dict[str, str], start_gateway: Callable[..., Gw]
) -> None:
    gw = start_gateway({"spot-a": upstreams["spot-a"]})
    anonymous = {"authorization": ""}
    drain = {"node": "spot-a", "budget_seconds": 1}
    assert gw.client.post("/admin/spot/drain", json=drain, headers=anonymous).status_code == 401
    assert gw.client.post("/admin/spot/drain", json=drain,
                          headers={"authorization": "Bearer nope"}).status_code == 401  # fmt: skip
    assert gw.client.get("/admin/spot/nodes/spot-a", headers=anonymous).status_code == 401
    missing = gw.client.post("/admin/spot/drain", json={**drain, "node": "zz"})
    assert missing.status_code == 404 and "upstreams: spot-a" in missing.text
    bad = gw.client.post("/admin/spot/drain", json={"node": "spot-a", "budget_seconds": -1})
    assert bad.status_code == 422 and "budget_seconds" in bad.text
    extra = gw.client.post("/admin/spot/drain", json={**drain, "junk": 1})
    assert extra.status_code == 422
    assert gw.client.post("/admin/spot/drain", content=b"{").status_code == 400
    assert gw.client.get("/healthz", headers=anonymous).json()["draining"] == []
    assert gw.client.post("/admin/spot/drain", json=drain).status_code == 200
    assert gw.client.get("/healthz", headers=anonymous).json()["draining"] == ["spot-a"]
    # The only upstream is drained: routing state alone never fails a request.
    assert stream(gw.client, body("last resort", 2)).status == 200


def test_admin_api_without_a_token_is_closed_and_opens_only_with_the_flag(
    upstreams: dict[str, str], redis_url: str
) -> None:
    drain = {"node": "spot-a", "budget_seconds": 1}
    with gateway_starter(redis_url, Gw, 10.0) as start:
        closed = start({"spot-a": upstreams["spot-a"]})
        refused = closed.client.post("/admin/spot/drain", json=drain)
        assert refused.status_code == 403 and "--admin-token-file" in refused.text
        assert closed.client.get("/healthz").json()["draining"] == []
        opened = start({"spot-a": upstreams["spot-a"]}, admin_open=True)
        assert opened.client.post("/admin/spot/drain", json=drain).status_code == 200
        assert opened.client.get("/healthz").json()["draining"] == ["spot-a"]


def test_round_robin_over_spot_nodes_spills_to_on_demand_when_both_drain(
    upstreams: dict[str, str], start_gateway: Callable[..., Gw]
) -> None:
    gw = start_gateway(upstreams, balance="round_robin", spill_regions=["ondemand"])

    def served() -> str:
        response = gw.client.post("/v1/chat/completions", json=body("rr", 1, stream=False))
        return response.headers["x-redline-served-region"]

    assert sorted(served() for _ in range(4)) == ["spot-a", "spot-a", "spot-b", "spot-b"]
    gw.drain("spot-a", 1.0)
    assert {served() for _ in range(3)} == {"spot-b"}
    gw.drain("spot-b", 1.0)
    assert {served() for _ in range(3)} == {"ondemand"}
    with pytest.raises(ValueError, match="spill_regions"):
        GatewaySettings(upstreams=upstreams, spill_regions=["elsewhere"])
