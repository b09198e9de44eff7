"""The trace store as a real process, fed by the OpenTelemetry SDK's own OTLP/HTTP exporter.

Spans of a rerouted request (a server span, a failed attempt with a reroute event, a retry in
another region) are exported exactly as an instrumented service exports them, then read back
through the store's API and rebuilt as a tree. The store runs as `redline up` starts it
(`python -m redline.devstack.tracestore --config`) and as `redline simulate traces`.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from redline.devstack.config import TRACE_STORE_MODULE, render_settings
from redline.devstack.processes import Service, free_port, http_ok, start_service
from redline.devstack.tracestore import build_span_tree, render_span_tree

pytestmark = pytest.mark.integration


def _start(tmp_path: Path, argv: list[str], port: int) -> Service:
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "trace-store.log"
    return start_service("trace-store", argv, log, port, http_ok(f"{url}/healthz"), 60.0)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp_path = tmp_path_factory.mktemp("tracestore")
    port = free_port()
    config = tmp_path / "trace-store.yaml"
    config.write_text(
        render_settings(
            {"host": "127.0.0.1", "port": port, "max_traces": 50, "log_level": "warning"}
        )
    )
    service = _start(tmp_path, [sys.executable, "-m", TRACE_STORE_MODULE, "--config", str(config)],
                     port)  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        service.stop(10.0)


def _provider(url: str, service: str, compression: Compression) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", compression=compression, timeout=5)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _rerouted_request(provider: TracerProvider) -> str:
    """Spans as the gateway makes them for a request rerouted after a failed attempt."""
    tracer = provider.get_tracer("redline.test")
    with tracer.start_as_current_span(
        "POST /v1/chat/completions", kind=SpanKind.SERVER, attributes={"http.route": "/v1/chat"}
    ) as server:
        with tracer.start_as_current_span(
            "attempt primary", kind=SpanKind.CLIENT, attributes={"region": "primary", "attempt": 1}
        ) as first:
            first.add_event("reroute", {"reason": "first byte budget", "to": "secondary"})
            first.set_status(Status(StatusCode.ERROR, "no first byte in 1 s"))
        with tracer.start_as_current_span(
            "attempt secondary",
            kind=SpanKind.CLIENT,
            attributes={"region": "secondary", "attempt": 2, "tokens": [3, 5]},
        ) as second:
            second.set_status(Status(StatusCode.OK))
        trace_id = server.get_span_context().trace_id
    return trace.format_trace_id(trace_id)


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_sdk_exported_spans_read_back_as_a_tree(store: str, compression: Compression) -> None:
    provider = _provider(store, "redline-gateway", compression)
    try:
        trace_id = _rerouted_request(provider)
        assert provider.force_flush(5000)
    finally:
        provider.shutdown()
    answer = httpx.get(f"{store}/api/traces/{trace_id}", timeout=5.0)
    assert answer.status_code == 200, answer.text
    spans: list[dict[str, Any]] = answer.json()["spans"]
    assert {span["trace_id"] for span in spans} == {trace_id}
    assert {span["service"] for span in spans} == {"redline-gateway"}
    (root,) = build_span_tree(spans)
    assert (root.name, root.span["kind"], root.span["parent_span_id"]) == (
        "POST /v1/chat/completions", "SERVER", None
    )  # fmt: skip
    first, second = root.children
    assert (first.name, first.span["kind"]) == ("attempt primary", "CLIENT")
    assert first.span["status"] == {"code": "ERROR", "message": "no first byte in 1 s"}
    assert first.span["attributes"] == {"region": "primary", "attempt": 1}
    (event,) = first.span["events"]
    assert event["name"] == "reroute"
    assert event["attributes"] == {"reason": "first byte budget", "to": "secondary"}
    assert first.span["start_ns"] <= event["time_ns"] <= first.span["end_ns"]
    assert second.span["status"]["code"] == "OK"
    assert second.span["attributes"]["tokens"] == [3, 5]
    assert root.span["start_ns"] <= first.span["start_ns"] < second.span["start_ns"]
    assert second.span["end_ns"] <= root.span["end_ns"]
    text = render_span_tree([root])
    assert text.splitlines()[1].startswith("  attempt primary [CLIENT, redline-gateway] ERROR")
    listing = httpx.get(f"{store}/api/traces", params={"service": "redline-gateway"}).json()
    assert listing["traces"][0]["trace_id"] == trace_id
    assert listing["traces"][0]["root_name"] == "POST /v1/chat/completions"
    assert listing["traces"][0]["span_count"] == 3


def test_the_store_answers_errors_over_http(store: str) -> None:
    with httpx.Client(base_url=store, timeout=5.0) as http:
        bad = http.post(
            "/v1/traces", content=b"\xff", headers={"content-type": "application/x-protobuf"}
        )
        assert bad.status_code == 400
        assert (
            http.post(
                "/v1/traces", content=b"x", headers={"content-type": "text/plain"}
            ).status_code
            == 415
        )
        assert http.get(f"/api/traces/{'ab' * 16}").status_code == 404
        health = http.get("/healthz").json()
        assert health["status"] == "ok" and health["max_traces"] == 50


def test_redline_simulate_traces_serves_the_same_store(tmp_path: Path) -> None:
    redline = shutil.which("redline", path=str(Path(sys.executable).parent))
    assert redline is not None
    port = free_port()
    service = _start(tmp_path, [redline, "simulate", "traces", "--host", "127.0.0.1", "--port",
                                str(port), "--max-traces", "7"], port)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        provider = _provider(url, "redline-cli", Compression.NoCompression)
        try:
            trace_id = _rerouted_request(provider)
            assert provider.force_flush(5000)
        finally:
            provider.shutdown()
        spans = httpx.get(f"{url}/api/traces/{trace_id}", timeout=5.0).json()["spans"]
        assert len(spans) == 3 and spans[0]["service"] == "redline-cli"
        assert httpx.get(f"{url}/healthz", timeout=5.0).json()["max_traces"] == 7
        assert "trace store on http://127.0.0.1:" in service.log_tail(20)
    finally:
        service.stop(10.0)
