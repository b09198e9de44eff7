"""The trace store (the local stack's OTLP/HTTP receiver), driven in process through httpx's ASGI
transport (no socket, no process): export requests are built with opentelemetry-proto's own
messages, sent as protobuf and as OTLP/JSON, and read back through the read API."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status
from starlette.applications import Starlette

from redline.core.settings import load_settings
from redline.devstack.tracestore import (
    JSON,
    PROTOBUF,
    TraceStore,
    TraceStoreSettings,
    build_span_tree,
    build_trace_store_app,
    encode_status,
    parse_trace_id,
    render_span_tree,
)

TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
OTHER = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
ROOT = bytes.fromhex("00f067aa0ba902b7")
CHILD = bytes.fromhex("b7ad6b7169203331")
RETRY = bytes.fromhex("c7ad6b7169203332")
T0 = 1_700_000_000_000_000_000


def kv(key: str, value: Any) -> KeyValue:
    pair = KeyValue(key=key)
    if isinstance(value, bool):
        pair.value.bool_value = value
    elif isinstance(value, int):
        pair.value.int_value = value
    elif isinstance(value, float):
        pair.value.double_value = value
    elif isinstance(value, list):
        pair.value.array_value.values.extend(AnyValue(string_value=v) for v in value)
    else:
        pair.value.string_value = value
    return pair


def span(
    trace: bytes,
    span_id: bytes,
    name: str,
    *,
    parent: bytes = b"",
    kind: int = Span.SPAN_KIND_INTERNAL,
    start_ms: int = 0,
    end_ms: int = 10,
    status: int = Status.STATUS_CODE_UNSET,
    message: str = "",
    attrs: dict[str, Any] | None = None,
    events: Sequence[tuple[str, int, dict[str, Any]]] = (),
) -> Span:
    out = Span(
        trace_id=trace,
        span_id=span_id,
        parent_span_id=parent,
        name=name,
        kind=kind,  # type: ignore[arg-type]
        start_time_unix_nano=T0 + start_ms * 1_000_000,
        end_time_unix_nano=T0 + end_ms * 1_000_000,
    )
    out.status.code = status  # type: ignore[assignment]
    out.status.message = message
    out.attributes.extend(kv(k, v) for k, v in (attrs or {}).items())
    for event_name, at_ms, event_attrs in events:
        event = out.events.add(name=event_name, time_unix_nano=T0 + at_ms * 1_000_000)
        event.attributes.extend(kv(k, v) for k, v in event_attrs.items())
    return out


def request(spans: Sequence[Span], service: str | None = "redline-gateway") -> bytes:
    message = ExportTraceServiceRequest()
    resource_spans: ResourceSpans = message.resource_spans.add()
    if service is not None:
        resource_spans.resource.attributes.append(kv("service.name", service))
    resource_spans.scope_spans.add().spans.extend(spans)
    return message.SerializeToString()


def rerouted() -> list[Span]:
    """A server span with one failed attempt and a retry elsewhere."""
    return [
        span(TRACE, ROOT, "POST /v1/chat/completions", kind=Span.SPAN_KIND_SERVER,
             end_ms=120, attrs={"http.response.status_code": 200}),
        span(TRACE, CHILD, "attempt primary", parent=ROOT, kind=Span.SPAN_KIND_CLIENT,
             start_ms=1, end_ms=40, status=Status.STATUS_CODE_ERROR, message="503",
             attrs={"region": "primary", "attempt": 1, "ratio": 0.5, "spot": False,
                    "tags": ["a", "b"]},
             events=[("reroute", 39, {"reason": "status 503"})]),
        span(TRACE, RETRY, "attempt secondary", parent=ROOT, kind=Span.SPAN_KIND_CLIENT,
             start_ms=41, end_ms=118, status=Status.STATUS_CODE_OK,
             attrs={"region": "secondary", "attempt": 2}),
    ]  # fmt: skip


def as_otlp_json(body: bytes) -> dict[str, Any]:
    """A protobuf export body in OTLP/JSON: camelCase, ids in hex (not protobuf's base64)."""
    message = ExportTraceServiceRequest.FromString(body)
    document = json_format.MessageToDict(message)
    for resource_spans in document["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for item in scope_spans["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in item:
                        item[key] = base64.b64decode(item[key]).hex()
    return document


@dataclass
class StoreClient:
    """Requests to the app through httpx's ASGI transport."""

    app: Starlette

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://store") as c:
                return await c.request(method, path, **kwargs)

        return asyncio.run(send())

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)


def client(**settings: Any) -> StoreClient:
    return StoreClient(build_trace_store_app(TraceStoreSettings(**settings)))


def post(http: StoreClient, body: bytes, content_type: str = PROTOBUF, **headers: str) -> Any:
    return http.post("/v1/traces", content=body, headers={"content-type": content_type, **headers})


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def accepted(answer: Any) -> ExportTraceServiceResponse:
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == PROTOBUF
    return ExportTraceServiceResponse.FromString(answer.content)


def status_of(answer: Any) -> status_pb2.Status:
    assert answer.headers["content-type"] == PROTOBUF
    return status_pb2.Status.FromString(answer.content)


def test_a_protobuf_export_reads_back_as_the_api_promises() -> None:
    http = client()
    response = accepted(post(http, request(rerouted())))
    assert not response.HasField("partial_success")
    answer = http.get(f"/api/traces/{TRACE.hex()}")
    assert answer.status_code == 200
    body = answer.json()
    assert body["trace_id"] == TRACE.hex()
    assert [s["name"] for s in body["spans"]] == [
        "POST /v1/chat/completions", "attempt primary", "attempt secondary"
    ]  # fmt: skip
    failed = body["spans"][1]
    assert failed == {
        "trace_id": TRACE.hex(),
        "span_id": CHILD.hex(),
        "parent_span_id": ROOT.hex(),
        "name": "attempt primary",
        "kind": "CLIENT",
        "status": {"code": "ERROR", "message": "503"},
        "service": "redline-gateway",
        "attributes": {
            "region": "primary",
            "attempt": 1,
            "ratio": 0.5,
            "spot": False,
            "tags": ["a", "b"],
        },  # fmt: skip
        "events": [
            {"name": "reroute", "time_ns": T0 + 39_000_000, "attributes": {"reason": "status 503"}}
        ],
        "start_ns": T0 + 1_000_000,
        "end_ns": T0 + 40_000_000,
    }
    root = body["spans"][0]
    assert root["parent_span_id"] is None and root["kind"] == "SERVER"
    assert root["status"] == {"code": "UNSET", "message": ""}
    assert body["spans"][2]["status"]["code"] == "OK"


def test_otlp_json_and_gzip_decode_to_the_same_spans() -> None:
    body = request(rerouted())
    expected = None
    for encoded, content_type, headers in (
        (body, PROTOBUF, {}),
        (json.dumps(as_otlp_json(body)).encode(), JSON, {}),
        (gzip.compress(body), PROTOBUF, {"content-encoding": "gzip"}),
    ):
        http = client()
        answer = post(http, encoded, content_type, **headers)
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith(content_type)
        spans = http.get(f"/api/traces/{TRACE.hex()}").json()["spans"]
        expected = expected or spans
        assert spans == expected
    json_answer = post(client(), json.dumps(as_otlp_json(body)).encode(), JSON)
    assert json_answer.json() == {}  # an ExportTraceServiceResponse without partial success


def test_json_ignores_unknown_fields_and_takes_the_charset_parameter() -> None:
    document = as_otlp_json(request(rerouted()))
    document["somethingNew"] = {"x": 1}
    document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["futureField"] = 7
    http = client()
    answer = post(http, json.dumps(document).encode(), "application/json; charset=utf-8")
    assert answer.status_code == 200, answer.text
    assert len(http.get(f"/api/traces/{TRACE.hex()}").json()["spans"]) == 3


def test_span_tree_puts_attempts_under_the_server_span() -> None:
    http = client()
    post(http, request(rerouted()))
    spans = http.get(f"/api/traces/{TRACE.hex()}").json()["spans"]
    (root,) = build_span_tree(list(reversed(spans)))
    assert root.name == "POST /v1/chat/completions"
    assert [c.name for c in root.children] == ["attempt primary", "attempt secondary"]
    assert [(depth, node.name) for depth, node in root.walk()][1:] == [
        (1, "attempt primary"), (1, "attempt secondary")
    ]  # fmt: skip
    text = render_span_tree([root])
    assert text.splitlines()[1] == (
        "  attempt primary [CLIENT, redline-gateway] ERROR (503) 39.0 ms; events: reroute"
    )
    # Without the root, its children are roots of their own.
    assert [n.name for n in build_span_tree(spans[1:])] == ["attempt primary", "attempt secondary"]


def test_malformed_bodies_are_400_with_a_status_naming_the_problem() -> None:
    http = client()
    protobuf = post(http, b"\xff\xff\xff")
    assert protobuf.status_code == 400
    status = status_of(protobuf)
    assert status.code == 3 and "protobuf ExportTraceServiceRequest" in status.message
    for body, words in (
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"resourceSpans": 5}', "not an ExportTraceServiceRequest"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": ""}]}]}]}',
            "traceId: 'zz' is not hex",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "abcd"}]}]}]}',
            "is not 16 bytes",
        ),
    ):
        answer = post(http, body, JSON)
        assert answer.status_code == 400, body
        assert answer.json()["code"] == 3 and words in answer.json()["message"], answer.json()
    bad_gzip = post(http, b"not gzip", PROTOBUF, **{"content-encoding": "gzip"})
    assert bad_gzip.status_code == 400 and "gzip" in status_of(bad_gzip).message
    assert http.get("/healthz").json()["traces"] == 0


def test_other_content_types_and_encodings_are_415() -> None:
    http = client()
    plain = post(http, b"hello", "text/plain")
    assert plain.status_code == 415 and "text/plain" in plain.json()["message"]
    assert http.post("/v1/traces", content=b"x").status_code == 415  # no content type at all
    brotli = post(http, request(rerouted()), PROTOBUF, **{"content-encoding": "br"})
    assert brotli.status_code == 415 and "'br'" in status_of(brotli).message
    assert http.get("/v1/traces").status_code == 405


def test_bodies_over_the_limit_are_413_before_and_after_inflating() -> None:
    http = client(max_body_bytes=2048)
    small = request([span(TRACE, ROOT, "x")])
    assert post(http, small).status_code == 200
    big = request([span(TRACE, ROOT, "x" * 4096)])
    too_big = post(http, big)
    assert too_big.status_code == 413 and "limit of 2048 bytes" in status_of(too_big).message
    # Sent without a length (chunked): the limit holds while reading.
    chunked = http.post(
        "/v1/traces", content=chunks(big[:1000], big[1000:]), headers={"content-type": PROTOBUF}
    )
    assert chunked.status_code == 413
    # A small gzip body that inflates past the limit.
    bomb = gzip.compress(request([span(TRACE, ROOT, "a" * 100_000)]))
    assert len(bomb) < 2048
    inflated = post(http, bomb, PROTOBUF, **{"content-encoding": "gzip"})
    assert inflated.status_code == 413 and "inflates" in status_of(inflated).message
    assert len(http.get(f"/api/traces/{TRACE.hex()}").json()["spans"]) == 1


def test_trace_ids_unknown_are_404_and_malformed_are_400() -> None:
    http = client()
    unknown = http.get(f"/api/traces/{OTHER.hex()}")
    assert unknown.status_code == 404 and OTHER.hex() in unknown.json()["error"]
    for bad in ("xyz", TRACE.hex()[:-1], "0" * 32, TRACE.hex() + "00"):
        answer = http.get(f"/api/traces/{bad}")
        assert answer.status_code == 400 and "32 hex digits" in answer.json()["error"], bad
    post(http, request(rerouted()))
    assert http.get(f"/api/traces/{TRACE.hex().upper()}").json()["trace_id"] == TRACE.hex()
    assert parse_trace_id(TRACE.hex().upper()) == TRACE.hex()


def _trace_id(n: int) -> bytes:
    return (n + 1).to_bytes(16, "big")


def test_the_store_keeps_the_last_n_traces_written_to() -> None:
    http = client(max_traces=3)
    for n in range(4):
        post(http, request([span(_trace_id(n), ROOT, f"t{n}", start_ms=n)]))
    # Trace 1 written again: trace 2 is now the least recently written and goes next.
    post(http, request([span(_trace_id(1), CHILD, "late", parent=ROOT, start_ms=9)]))
    post(http, request([span(_trace_id(4), ROOT, "t4")]))
    stored = [
        n for n in range(5) if http.get(f"/api/traces/{_trace_id(n).hex()}").status_code == 200
    ]
    assert stored == [1, 3, 4]
    listing = http.get("/api/traces").json()["traces"]
    assert [t["trace_id"] for t in listing] == [_trace_id(n).hex() for n in (4, 1, 3)]
    health = http.get("/healthz").json()
    assert (health["traces"], health["spans"], health["evicted_traces"]) == (3, 4, 2)


def test_spans_past_the_per_trace_limit_are_rejected_as_a_partial_success() -> None:
    http = client(max_spans_per_trace=2)
    spans = rerouted()
    response = accepted(post(http, request(spans)))
    assert response.partial_success.rejected_spans == 1
    assert "over 2 in a trace" in response.partial_success.error_message
    # A retried span replaces its stored copy: not a new one, not rejected.
    again = accepted(post(http, request(spans[:2])))
    assert again.partial_success.rejected_spans == 0
    assert len(http.get(f"/api/traces/{TRACE.hex()}").json()["spans"]) == 2
    assert http.get("/healthz").json()["rejected_spans"] == 1


def test_spans_with_invalid_ids_are_rejected_the_rest_kept() -> None:
    http = client()
    bad = [span(b"\0" * 16, ROOT, "zero trace"), span(TRACE, b"\x01", "short span id")]
    response = accepted(post(http, request([*bad, span(TRACE, ROOT, "fine")])))
    assert response.partial_success.rejected_spans == 2
    assert "'zero trace': invalid trace id" in response.partial_success.error_message
    assert "'short span id': invalid span id" in response.partial_success.error_message
    spans = http.get(f"/api/traces/{TRACE.hex()}").json()["spans"]
    assert [s["name"] for s in spans] == ["fine"]


def test_listing_filters_by_service_and_summarizes_the_root() -> None:
    http = client()
    post(http, request(rerouted()))
    orphan = span(OTHER, CHILD, "orphan", parent=ROOT, start_ms=5, end_ms=25)
    post(http, request([orphan], service="redline-simulator"))
    post(http, request([span(_trace_id(7), ROOT, "unnamed")], service=None))
    listing = http.get("/api/traces", params={"limit": "5"}).json()["traces"]
    assert [t["trace_id"] for t in listing] == [_trace_id(7).hex(), OTHER.hex(), TRACE.hex()]
    gateway = http.get("/api/traces", params={"service": "redline-gateway"}).json()["traces"]
    assert gateway == [
        {
            "trace_id": TRACE.hex(),
            "root_name": "POST /v1/chat/completions",
            "root_service": "redline-gateway",
            "services": ["redline-gateway"],
            "span_count": 3,
            "start_ns": T0,
            "duration_ns": 120_000_000,
        }
    ]
    (simulator,) = http.get("/api/traces?service=redline-simulator").json()["traces"]
    assert simulator["root_name"] is None and simulator["duration_ns"] == 20_000_000
    assert http.get("/api/traces?limit=1").json()["traces"][0]["root_service"] is None
    for bad in ("0", "-1", "x", "1001"):
        answer = http.get(f"/api/traces?limit={bad}")
        assert answer.status_code == 400 and "limit" in answer.json()["error"]


def test_store_bounds_and_settings_are_validated(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="one trace"):
        TraceStore(0, 1)
    path = tmp_path / "trace-store.yaml"
    path.write_text("host: 127.0.0.1\nport: 4318\nmax_traces: 5\nmax_body_bytes: 4096\n")
    settings = load_settings(TraceStoreSettings, path)
    assert (settings.max_traces, settings.max_spans_per_trace) == (5, 1000)
    http = StoreClient(build_trace_store_app(settings))
    assert http.get("/healthz").json()["max_traces"] == 5


def test_the_error_status_is_a_google_rpc_status() -> None:
    long = "é" * 200  # a message longer than 127 bytes needs a two-byte length
    decoded = status_pb2.Status.FromString(encode_status(8, long))
    assert (decoded.code, decoded.message) == (8, long)
