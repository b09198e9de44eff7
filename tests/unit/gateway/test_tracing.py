"""Traces through the gateway: span tree of a rerouted request, propagation upstream, exemplars.

The real gateway app and a small upstream app are served on uvicorn threads (no processes);
spans are collected by the SDK's InMemorySpanExporter behind a synchronous processor.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from redline.core.servers import ServerThread, serve_in_thread
from redline.gateway import GatewaySettings, build_gateway_app
from redline.gateway.tracing import (
    GatewayTracing,
    TracingConfigError,
    build_exporters,
    build_provider,
    tracing_wanted,
)
from redline.slo import catalog
from redline.slo.load import load_spec

SPEC = load_spec(None).spec
CLOSED_REDIS = "redis://127.0.0.1:9/0"  # nothing listens: the configured order is used
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


@dataclass
class Upstream:
    """A region's upstream: answers as told and keeps the headers of every request."""

    server: ServerThread
    seen: list[list[tuple[str, str]]] = field(default_factory=list)
    fail: bool = False

    def header(self, index: int, name: str) -> list[str]:
        return [v for k, v in self.seen[index] if k == name]


def _upstream_app(upstream: dict[str, Upstream], region: str) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        me = upstream[region]
        me.seen.append(list(request.headers.items()))
        if me.fail:
            return JSONResponse({"error": "boom"}, status_code=503)
        payload = await request.json()
        if payload.get("stream"):

            async def events() -> Iterator[bytes]:  # type: ignore[misc]
                for word in ("a", "b", "c"):
                    chunk = {"choices": [{"delta": {"content": word}}]}
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}
                yield f"data: {json.dumps(usage)}\n\n".encode()
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        answer = {
            "choices": [{"message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 5},
        }
        return JSONResponse(answer, headers={"x-redline-model-version": "v7"})

    return app


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, Upstream]]:
    found: dict[str, Upstream] = {}
    for region in ("primary", "secondary"):
        found[region] = Upstream(serve_in_thread(_upstream_app(found, region)))
    yield found
    for upstream in found.values():
        upstream.server.stop()


@pytest.fixture()
def regions(upstreams: dict[str, Upstream]) -> dict[str, Upstream]:
    for upstream in upstreams.values():
        upstream.seen.clear()
        upstream.fail = False
    return upstreams


@dataclass
class Traced:
    client: httpx.Client
    registry: CollectorRegistry
    spans: InMemorySpanExporter

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())


@pytest.fixture()
def start(regions: dict[str, Upstream]) -> Iterator[Any]:
    running: list[tuple[ServerThread, httpx.Client]] = []

    def start(on: bool = True) -> Traced:
        exporter = InMemorySpanExporter()
        tracing = GatewayTracing(build_provider([exporter], batch=False)) if on else None
        settings = GatewaySettings(
            upstreams={r: u.server.url for r, u in regions.items()},
            redis_url=CLOSED_REDIS,
            tracing=on,
        )
        registry = CollectorRegistry()
        server = serve_in_thread(build_gateway_app(settings, SPEC, registry, tracing))
        client = httpx.Client(base_url=server.url, timeout=10)
        running.append((server, client))
        return Traced(client, registry, exporter)

    yield start
    for server, client in running:
        client.close()
        server.stop()


def chat(stream: bool = False) -> dict[str, Any]:
    return {
        "model": "redline-base",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
    }


def traceparent(flags: str = "01") -> dict[str, str]:
    return {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-{flags}", "tracestate": "vendor=1"}


def by_kind(spans: list[ReadableSpan], kind: SpanKind) -> list[ReadableSpan]:
    found = [s for s in spans if s.kind == kind]
    return sorted(found, key=lambda s: str((s.attributes or {}).get("redline.attempt", 0)))


def hexid(value: int, width: int = 16) -> str:
    return format(value, f"0{width}x")


def test_a_rerouted_request_is_a_server_span_over_a_failed_and_a_good_attempt(
    start: Any, regions: dict[str, Upstream]
) -> None:
    gw = start()
    regions["primary"].fail = True
    answer = gw.client.post("/v1/chat/completions", json=chat(), headers=traceparent())
    assert answer.status_code == 200
    spans = gw.finished()
    assert len(spans) == 3
    (server,) = by_kind(spans, SpanKind.SERVER)
    failed, good = by_kind(spans, SpanKind.CLIENT)
    # The client's trace continues: same trace id, the client's span is the server span's parent.
    assert hexid(server.context.trace_id, 32) == CLIENT_TRACE
    assert server.parent is not None and hexid(server.parent.span_id) == CLIENT_SPAN
    for attempt in (failed, good):
        assert attempt.parent is not None and attempt.parent.span_id == server.context.span_id
        assert attempt.context.trace_id == server.context.trace_id
    assert failed.attributes is not None and good.attributes is not None
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["redline.region"] == "primary"
    assert failed.attributes["redline.attempt"] == 1
    assert failed.attributes["redline.reroute_reason"] == "server_error"
    assert failed.attributes["http.response.status_code"] == 503
    assert good.status.status_code == StatusCode.UNSET
    assert good.attributes["redline.region"] == "secondary"
    assert good.attributes["redline.attempt"] == 2
    assert good.attributes["gen_ai.request.model"] == "redline-base"
    assert good.attributes["gen_ai.usage.input_tokens"] == 7
    assert good.attributes["gen_ai.usage.output_tokens"] == 5
    assert good.attributes["redline.model_version"] == "v7"
    assert server.attributes is not None
    assert server.attributes["redline.served_region"] == "secondary"
    assert server.attributes["redline.rerouted"] is True
    assert server.attributes["http.response.status_code"] == 200
    # The attempts lie inside the request, in order.
    assert server.start_time is not None and server.end_time is not None
    assert failed.end_time is not None and good.start_time is not None
    assert server.start_time <= failed.start_time <= failed.end_time <= good.start_time  # type: ignore[operator]
    assert good.end_time is not None and good.end_time <= server.end_time


def test_each_attempt_sends_its_own_traceparent_upstream(
    start: Any, regions: dict[str, Upstream]
) -> None:
    gw = start()
    regions["primary"].fail = True
    gw.client.post("/v1/chat/completions", json=chat(), headers=traceparent())
    failed, good = by_kind(gw.finished(), SpanKind.CLIENT)
    for region, attempt in (("primary", failed), ("secondary", good)):
        (sent,) = regions[region].header(0, "traceparent")  # the client's own is not forwarded
        version, trace_id, parent, flags = sent.split("-")
        assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "01")
        assert parent == hexid(attempt.context.span_id)  # the attempt is the upstream's parent
        assert regions[region].header(0, "tracestate") == ["vendor=1"]


def test_without_a_traceparent_a_new_trace_starts_and_goes_upstream(
    start: Any, regions: dict[str, Upstream]
) -> None:
    gw = start()
    assert gw.client.post("/v1/chat/completions", json=chat()).status_code == 200
    (server,) = by_kind(gw.finished(), SpanKind.SERVER)
    assert server.parent is None
    (sent,) = regions["primary"].header(0, "traceparent")
    assert sent.split("-")[1] == hexid(server.context.trace_id, 32) != CLIENT_TRACE


def test_a_streamed_attempt_ends_with_the_stream_and_its_token_counts(start: Any) -> None:
    gw = start()
    with gw.client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as answer:
        body = answer.read()
    assert b"[DONE]" in body
    (attempt,) = by_kind(gw.finished(), SpanKind.CLIENT)
    assert attempt.attributes is not None
    assert attempt.attributes["gen_ai.usage.output_tokens"] == 3
    assert attempt.attributes["gen_ai.usage.input_tokens"] == 4


def _exemplars(text: str) -> list[str]:
    bucket = catalog.LLM_REQUEST_DURATION_SECONDS.bucket
    return [
        line.split('trace_id="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith(bucket + "{") and " # {" in line
    ]


def test_the_latency_histogram_carries_the_trace_id_in_openmetrics_only(start: Any) -> None:
    gw = start()
    gw.client.post("/v1/chat/completions", json=chat(), headers=traceparent())
    # Another model: another series, so both requests' exemplars stay (one per bucket series).
    gw.client.post("/v1/chat/completions", json={**chat(), "model": "redline-other"})
    ids = {hexid(s.context.trace_id, 32) for s in by_kind(gw.finished(), SpanKind.SERVER)}
    assert len(ids) == 2 and CLIENT_TRACE in ids
    open_metrics = gw.client.get("/metrics", headers={"accept": OPENMETRICS})
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    assert open_metrics.text.rstrip().endswith("# EOF")
    assert set(_exemplars(open_metrics.text)) == ids
    classic = gw.client.get("/metrics")
    assert classic.headers["content-type"].startswith("text/plain")
    assert not _exemplars(classic.text)
    assert catalog.LLM_REQUEST_DURATION_SECONDS.bucket in classic.text


def test_an_unsampled_trace_is_propagated_but_neither_exported_nor_an_exemplar(
    start: Any, regions: dict[str, Upstream]
) -> None:
    gw = start()
    gw.client.post("/v1/chat/completions", json=chat(), headers=traceparent(flags="00"))
    assert gw.finished() == []
    (sent,) = regions["primary"].header(0, "traceparent")
    assert sent.startswith(f"00-{CLIENT_TRACE}-") and sent.endswith("-00")
    assert not _exemplars(gw.client.get("/metrics", headers={"accept": OPENMETRICS}).text)


def test_off_no_spans_no_header_no_exemplar(start: Any, regions: dict[str, Upstream]) -> None:
    gw = start(on=False)
    gw.client.post("/v1/chat/completions", json=chat())
    assert regions["primary"].header(0, "traceparent") == []
    assert not _exemplars(gw.client.get("/metrics", headers={"accept": OPENMETRICS}).text)
    # Off, the gateway is not a tracing hop: a client's own header goes through untouched.
    gw.client.post("/v1/chat/completions", json=chat(), headers=traceparent())
    assert regions["primary"].header(1, "traceparent") == [traceparent()["traceparent"]]


@pytest.mark.parametrize(
    ("setting", "env", "on"),
    [
        (None, {}, False),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/v1/traces"}, True),
        (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
        (True, {}, True),
        (True, {"OTEL_SDK_DISABLED": "true"}, False),
        (None, {"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
    ],
)
def test_tracing_is_on_when_asked_or_when_an_endpoint_is_set(
    setting: bool | None, env: dict[str, str], on: bool
) -> None:
    assert tracing_wanted(setting, env) is on
    assert GatewayTracing.from_settings(setting, {**env, "OTEL_TRACES_EXPORTER": "none"}).on is on


def test_the_exporters_follow_otel_traces_exporter() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    (otlp,) = build_exporters({})
    assert isinstance(otlp, OTLPSpanExporter)
    assert build_exporters({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert len(build_exporters({"OTEL_TRACES_EXPORTER": "otlp,console"})) == 2
    with pytest.raises(TracingConfigError, match="zipkin"):
        build_exporters({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_the_service_name_defaults_to_the_gateway_and_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert build_provider([], environ={}).resource.attributes["service.name"] == "redline-gateway"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "edge-gw")
    provider = build_provider([], environ={"OTEL_SERVICE_NAME": "edge-gw"})
    assert provider.resource.attributes["service.name"] == "edge-gw"
