"""A spot-resumed request's trace, as the local stack's trace store holds it: the real gateway
(tracing on, exporting OTLP/HTTP to the store) in front of two spot replicas, real Redis for the
request ledger. The first request is aborted by a drain on its replica; the client's retry,
in the same trace, resumes on the other replica after the served prefix."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from prometheus_client import CollectorRegistry

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.devstack.tracestore import TraceStoreSettings, build_trace_store_app
from redline.gateway import GatewaySettings, build_gateway_app
from redline.gateway.tracing import (
    SPOT_PREEMPTED_EVENT,
    SPOT_RESUME_EVENT,
    GatewayTracing,
    build_provider,
)
from redline.platform.spot import RESUME_HEADER, parse_spot_error
from redline.slo.load import load_spec

pytestmark = pytest.mark.integration

ADMIN_TOKEN = "spot-trace-admin-t0ken"
NODES = ("spot-a", "spot-b")


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, ServerThread]]:
    servers = {
        node: serve_in_thread(build_simulator_app(SimulatorSettings(region=node, seed=i)))
        for i, node in enumerate(NODES)
    }
    for server in servers.values():
        httpx.post(f"{server.url}/admin/faults", json={"tokens_per_second": 50}).raise_for_status()
    yield servers
    for server in servers.values():
        server.stop()


def _stream(
    client: httpx.Client, payload: dict[str, Any], headers: dict[str, str]
) -> dict[str, Any]:
    """Read a streamed answer: its status, headers, text and the error event if one came."""
    out: dict[str, Any] = {"text": "", "error": None}
    with client.stream("POST", "/v1/chat/completions", json=payload, headers=headers) as answer:
        out["status"], out["headers"] = answer.status_code, dict(answer.headers)
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                out["error"] = event if "error" in event else out["error"]
                for choice in event.get("choices") or []:
                    out["text"] += (choice.get("delta") or {}).get("content") or ""
    return out


def test_a_spot_resumed_requests_trace_shows_the_preemption_and_the_resume(
    sims: dict[str, ServerThread], redis_url: str, tmp_path: Any
) -> None:
    token = tmp_path / "admin-token"
    token.write_text(ADMIN_TOKEN + "\n")
    with serve_in_thread(build_trace_store_app(TraceStoreSettings())) as store:
        tracing = GatewayTracing(
            build_provider([OTLPSpanExporter(endpoint=f"{store.url}/v1/traces")])
        )
        settings = GatewaySettings(
            upstreams={node: sims[node].url for node in NODES},
            redis_url=redis_url,
            tracing=True,
            admin_token_file=token,
        )
        spec = load_spec(None).spec
        gateway = serve_in_thread(build_gateway_app(settings, spec, CollectorRegistry(), tracing))
        trace_id = secrets.token_hex(16)
        headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
        payload = {
            "model": "redline-base",
            "messages": [{"role": "user", "content": "a long story about spot instances"}],
            "max_tokens": 200,
            "stream": True,
        }
        try:
            with httpx.Client(base_url=gateway.url, timeout=30) as client:
                box: list[dict[str, Any]] = []
                thread = threading.Thread(
                    target=lambda: box.append(_stream(client, payload, headers))
                )
                thread.start()
                time.sleep(0.8)  # some tokens reach the client from spot-a
                drain = client.post(
                    "/admin/spot/drain",
                    json={"node": "spot-a", "budget_seconds": 1.0},
                    headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
                )
                assert drain.status_code == 200, drain.text
                thread.join(15)
                (first,) = box
                info = parse_spot_error(first["error"])
                assert info is not None and info.recoverable and first["text"]
                second = _stream(client, payload, {**headers, RESUME_HEADER: info.request_id})
            assert second["headers"]["x-redline-resumed"] == "true"
            assert second["headers"]["x-redline-served-region"] == "spot-b"
            tracing.provider.force_flush()  # type: ignore[union-attr]

            def spans() -> list[dict[str, Any]] | None:
                answer = httpx.get(f"{store.url}/api/traces/{trace_id}")
                found: list[dict[str, Any]] = answer.json()["spans"] if answer.is_success else []
                return found if sum(s["kind"] == "SERVER" for s in found) == 2 else None

            deadline = time.monotonic() + 10
            found = spans()
            while found is None and time.monotonic() < deadline:
                time.sleep(0.2)
                found = spans()
            assert found is not None, "the trace store did not get both requests' spans"
        finally:
            gateway.stop()
            tracing.shutdown()
    servers = sorted((s for s in found if s["kind"] == "SERVER"), key=lambda s: s["start_ns"])
    attempts = {s["parent_span_id"]: s for s in found if s["kind"] == "CLIENT"}
    aborted, resumed = (attempts[server["span_id"]] for server in servers)
    # One trace, both requests: the client's span is the parent of both server spans.
    assert {s["parent_span_id"] for s in servers} == {headers["traceparent"].split("-")[2]}
    assert aborted["attributes"]["redline.region"] == "spot-a"
    assert SPOT_PREEMPTED_EVENT in [e["name"] for e in aborted["events"]]
    assert resumed["attributes"]["redline.region"] == "spot-b"
    assert SPOT_RESUME_EVENT in [e["name"] for e in resumed["events"]]
    assert resumed["status"]["code"] != "ERROR"
