"""The local stack's trace backend: an OTLP/HTTP receiver that keeps recent traces in memory.

A real OpenTelemetry Collector or Jaeger is not installable where the local stack runs (compose
uses Jaeger), so `redline up` runs this small receiver and points the gateway's OTLP exporter at
it. It speaks OTLP/HTTP as the specification asks of a server:

- `POST /v1/traces` takes an `ExportTraceServiceRequest`, as protobuf (`application/x-protobuf`)
  or OTLP/JSON (`application/json`: trace and span ids hex, not base64), optionally gzip'ed, and
  answers an `ExportTraceServiceResponse` in the request's encoding: 200 (with a partial success
  naming the spans it dropped), 400 on a body that does not decode, 413 over the size limit,
  415 on another content type or encoding; an error body is a `google.rpc.Status`.
- Spans are kept per trace, the last `max_traces` traces written to (the least recently written
  is evicted first), at most `max_spans_per_trace` spans each (more are rejected and counted).

Its read API (what tests and people read traces back with; a contract, keep the field names):

- `GET /api/traces/{trace_id}` (32 hex digits): `{"trace_id", "spans": [{"trace_id", "span_id",
  "parent_span_id" (hex or null), "name", "kind" (SERVER, CLIENT, INTERNAL, PRODUCER, CONSUMER,
  UNSPECIFIED), "status": {"code": "OK|ERROR|UNSET", "message"}, "service" (the resource's
  service.name), "attributes" (flat), "events": [{"name", "time_ns", "attributes"}], "start_ns",
  "end_ns"}]}` in start order; 404 for an unknown trace, 400 for a malformed id.
- `GET /api/traces?service=NAME&limit=N`: the most recently written traces first, each with its
  root span's name and service, start, duration and span count.
- `GET /healthz`: 200 with the store's counts.

Run it with `python -m redline.devstack.tracestore --config FILE` (what `redline up` starts) or
`redline simulate traces --host H --port P`.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import re
import sys
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from pydantic import Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from redline.core.settings import ServiceSettings, SettingsError, load_settings

DEFAULT_TRACE_STORE_PORT = 4318
"""OTLP/HTTP's registered port."""
TRACES_PATH = "/v1/traces"
HEALTH_PATH = "/healthz"
API_PATH = "/api/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
SERVICE_NAME_KEY = "service.name"
DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 1000

# google.rpc.Code values an OTLP error body carries.
INVALID_ARGUMENT = 3
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12

_TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")
_ID_FIELDS = {"traceId": 16, "trace_id": 16, "spanId": 8, "span_id": 8,
              "parentSpanId": 8, "parent_span_id": 8}  # fmt: skip
"""OTLP/JSON id fields (either spelling) and their byte length: hex on the wire, where
protobuf's JSON mapping would expect base64."""

log = logging.getLogger("redline.tracestore")


class OtlpDecodeError(Exception):
    """An export request's body is not a valid OTLP message (HTTP 400)."""


class BodyTooLargeError(Exception):
    """An export request's body (or what it inflates to) is over the size limit (HTTP 413)."""


class TraceStoreSettings(ServiceSettings):
    """Settings of the trace store."""

    max_traces: int = Field(
        1000, ge=1, le=1_000_000, description="Traces kept; the least recently written goes."
    )
    max_spans_per_trace: int = Field(
        1000, ge=1, le=100_000, description="Spans kept per trace; more are rejected."
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description="Largest export body accepted, after decompression (413 beyond).",
    )


# --- decoding -----------------------------------------------------------------------------------


def _hex_to_base64(value: Any, size: int, name: str) -> Any:
    if not isinstance(value, str) or value == "":
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise OtlpDecodeError(f"{name}: {value!r} is not hex") from None
    if len(raw) != size:
        raise OtlpDecodeError(f"{name}: {value!r} is not {size} bytes ({2 * size} hex digits)")
    return base64.b64encode(raw).decode("ascii")


def _ids_to_base64(node: Any) -> Any:
    """The OTLP/JSON document with every trace and span id re-encoded as protobuf's JSON mapping
    expects bytes (base64); OTLP/JSON writes them as hex."""
    if isinstance(node, list):
        return [_ids_to_base64(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted: dict[str, Any] = {}
    for key, value in node.items():
        if key in _ID_FIELDS and not isinstance(value, dict | list):
            converted[key] = _hex_to_base64(value, _ID_FIELDS[key], key)
        elif key in ("attributes", "resource"):
            # Attribute values are the sender's data: an attribute named traceId stays as sent.
            converted[key] = value
        else:
            converted[key] = _ids_to_base64(value)
    return converted


def parse_otlp_json(body: bytes) -> ExportTraceServiceRequest:
    """An OTLP/JSON export body as the request message; OtlpDecodeError when malformed."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OtlpDecodeError(f"body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise OtlpDecodeError("body is not a JSON object (an ExportTraceServiceRequest)")
    request = ExportTraceServiceRequest()
    try:
        # Unknown fields are ignored, as the OTLP specification asks of a receiver.
        json_format.ParseDict(_ids_to_base64(document), request, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise OtlpDecodeError(f"not an ExportTraceServiceRequest: {exc}") from None
    return request


def decode_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """An export body in `content_type` (protobuf or JSON) as the request message;
    OtlpDecodeError when it does not decode."""
    if content_type == JSON:
        return parse_otlp_json(body)
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise OtlpDecodeError(f"body is not a protobuf ExportTraceServiceRequest: {exc}") from None
    return request


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """The body without its content encoding (identity or gzip); BodyTooLargeError when it
    inflates past `limit`, OtlpDecodeError when it does not inflate."""
    if encoding in ("", "identity"):
        return body
    inflater = zlib.decompressobj(wbits=31)  # 31: gzip framing
    try:
        plain = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise OtlpDecodeError(f"body is not valid gzip: {exc}") from None
    if len(plain) > limit or inflater.unconsumed_tail:
        raise BodyTooLargeError(f"body inflates past the limit of {limit} bytes")
    if not inflater.eof:
        raise OtlpDecodeError("body is not valid gzip: truncated")
    return plain


def any_value(value: AnyValue) -> Any:
    """An OTLP attribute value as plain JSON (arrays as lists, maps as dicts, bytes as hex)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    """OTLP key-values as a flat dict (the last of a repeated key wins)."""
    return {pair.key: any_value(pair.value) for pair in pairs}


def _enum_name(names: Mapping[int, str], number: int, prefix: str) -> str:
    name = names.get(number)
    return name.removeprefix(prefix) if name is not None else f"UNKNOWN_{number}"


_KINDS = {int(number): name for name, number in Span.SpanKind.items()}
_STATUS_CODES = {int(number): name for name, number in Status.StatusCode.items()}


def build_span(span: Span, service: str | None) -> dict[str, Any]:
    """One span in the read API's shape."""
    return {
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex() or None,
        "name": span.name,
        "kind": _enum_name(_KINDS, span.kind, "SPAN_KIND_"),
        "status": {
            "code": _enum_name(_STATUS_CODES, span.status.code, "STATUS_CODE_"),
            "message": span.status.message,
        },
        "service": service,
        "attributes": attributes(span.attributes),
        "events": [
            {"name": e.name, "time_ns": e.time_unix_nano, "attributes": attributes(e.attributes)}
            for e in span.events
        ],
        "start_ns": span.start_time_unix_nano,
        "end_ns": span.end_time_unix_nano,
    }


def build_spans(request: ExportTraceServiceRequest) -> tuple[list[dict[str, Any]], list[str]]:
    """The request's spans in the read API's shape, and why each invalid one was rejected (a
    trace id that is not 16 bytes or is all zeros, a span id that is not 8)."""
    spans: list[dict[str, Any]] = []
    problems: list[str] = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        service = resource.get(SERVICE_NAME_KEY)
        name = service if isinstance(service, str) else None
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if len(span.trace_id) != 16 or not any(span.trace_id):
                    problems.append(f"span {span.name!r}: invalid trace id")
                elif len(span.span_id) != 8 or not any(span.span_id):
                    problems.append(f"span {span.name!r}: invalid span id")
                else:
                    spans.append(build_span(span, name))
    return spans, problems


# --- storage ------------------------------------------------------------------------------------


def parse_trace_id(text: str) -> str:
    """A trace id as 32 lowercase hex digits; ValueError when it is not one (or all zeros)."""
    if not _TRACE_ID.match(text) or not int(text, 16):
        raise ValueError(f"trace id {text!r} is not 32 hex digits (and not all zeros)")
    return text.lower()


def _start_key(span: Mapping[str, Any]) -> tuple[int, str]:
    return int(span["start_ns"]), str(span["name"])


def find_roots(spans: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The spans whose parent is not in `spans` (the trace's root, or orphans whose parent has
    not arrived), in start order."""
    ids = {span["span_id"] for span in spans}
    roots = [span for span in spans if span["parent_span_id"] not in ids]
    return sorted(roots, key=_start_key)


def summarize_trace(trace_id: str, spans: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A trace's line in `GET /api/traces`: its root span's name and service (the earliest
    span without a parent; null while the root has not arrived), start and duration."""
    root = next((s for s in find_roots(spans) if s["parent_span_id"] is None), None)
    start = min(int(s["start_ns"]) for s in spans)
    end = max(int(s["end_ns"]) for s in spans)
    if root is not None:
        start, end = int(root["start_ns"]), int(root["end_ns"])
    return {
        "trace_id": trace_id,
        "root_name": root["name"] if root is not None else None,
        "root_service": root["service"] if root is not None else None,
        "services": sorted({str(s["service"]) for s in spans if s["service"] is not None}),
        "span_count": len(spans),
        "start_ns": start,
        "duration_ns": max(0, end - start),
    }


class TraceStore:
    """Recent traces in memory: the last `max_traces` written to (least recently written evicted
    first), `max_spans_per_trace` spans each. A span sent again (an exporter's retry) replaces
    the copy stored. Thread-safe."""

    def __init__(self, max_traces: int, max_spans_per_trace: int) -> None:
        if max_traces < 1 or max_spans_per_trace < 1:
            raise ValueError("a trace store keeps one trace and one span at least")
        self.max_traces = max_traces
        self.max_spans_per_trace = max_spans_per_trace
        self._traces: OrderedDict[str, dict[str, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self.evicted_traces = 0
        self.rejected_spans = 0

    def add(self, spans: Iterable[dict[str, Any]]) -> int:
        """Store spans; returns how many were rejected (their trace was full)."""
        rejected = 0
        with self._lock:
            for span in spans:
                trace_id = span["trace_id"]
                trace = self._traces.get(trace_id)
                if trace is None:
                    trace = self._traces[trace_id] = {}
                self._traces.move_to_end(trace_id)
                if span["span_id"] not in trace and len(trace) >= self.max_spans_per_trace:
                    rejected += 1
                    continue
                trace[span["span_id"]] = span
            while len(self._traces) > self.max_traces:
                self._traces.popitem(last=False)
                self.evicted_traces += 1
            self.rejected_spans += rejected
        return rejected

    def get(self, trace_id: str) -> list[dict[str, Any]] | None:
        """A trace's spans in start order, or None when it is not (or no longer) stored."""
        with self._lock:
            trace = self._traces.get(trace_id)
            spans = list(trace.values()) if trace is not None else None
        return None if spans is None else sorted(spans, key=_start_key)

    def recent(
        self, service: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> list[dict[str, Any]]:
        """Summaries of the most recently written traces first; only those with a span of
        `service` when given."""
        with self._lock:
            traces = [(tid, list(spans.values())) for tid, spans in reversed(self._traces.items())]
        found: list[dict[str, Any]] = []
        for trace_id, spans in traces:
            if len(found) >= limit:
                break
            if service is None or any(span["service"] == service for span in spans):
                found.append(summarize_trace(trace_id, spans))
        return found

    def counts(self) -> dict[str, int]:
        """Traces and spans stored, traces evicted, spans rejected."""
        with self._lock:
            return {
                "traces": len(self._traces),
                "spans": sum(len(spans) for spans in self._traces.values()),
                "max_traces": self.max_traces,
                "evicted_traces": self.evicted_traces,
                "rejected_spans": self.rejected_spans,
            }


# --- span trees ---------------------------------------------------------------------------------


@dataclass
class SpanNode:
    """A span and its children (start order)."""

    span: Mapping[str, Any]
    children: list[SpanNode] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The span's name."""
        return str(self.span["name"])

    def walk(self, depth: int = 0) -> Iterable[tuple[int, SpanNode]]:
        """(depth, node) of this node and every descendant, depth first in start order."""
        yield depth, self
        for child in self.children:
            yield from child.walk(depth + 1)


def build_span_tree(spans: Sequence[Mapping[str, Any]]) -> list[SpanNode]:
    """Spans (the read API's shape) as trees, parent -> children, each level in start order; the
    roots are the spans whose parent is not among `spans`."""
    nodes = {span["span_id"]: SpanNode(span) for span in sorted(spans, key=_start_key)}
    roots: list[SpanNode] = []
    for node in nodes.values():
        parent = nodes.get(node.span["parent_span_id"])
        (parent.children if parent is not None else roots).append(node)
    return roots


def render_span_tree(roots: Sequence[SpanNode]) -> str:
    """The trees as indented text: name, kind, service, status and duration of each span."""
    lines = []
    for root in roots:
        for depth, node in root.walk():
            span = node.span
            millis = (int(span["end_ns"]) - int(span["start_ns"])) / 1e6
            status = span["status"]["code"]
            if span["status"]["message"]:
                status += f" ({span['status']['message']})"
            events = ", ".join(str(e["name"]) for e in span["events"])
            lines.append(
                f"{'  ' * depth}{node.name} [{span['kind']}, {span['service']}] {status} "
                f"{millis:.1f} ms" + (f"; events: {events}" if events else "")
            )
    return "\n".join(lines)


# --- HTTP ---------------------------------------------------------------------------------------


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        if number:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_status(code: int, message: str) -> bytes:
    """A `google.rpc.Status {code, message}` in protobuf (what OTLP/HTTP puts in an error body;
    encoded by hand: opentelemetry-proto does not ship the googleapis types)."""
    text = message.encode("utf-8")
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _status_response(status: int, code: int, message: str, content_type: str) -> Response:
    if content_type == PROTOBUF:
        return Response(encode_status(code, message), status, media_type=PROTOBUF)
    return JSONResponse({"code": code, "message": message}, status)


def _media_type(header: str) -> str:
    return header.split(";", 1)[0].strip().lower()


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(f"body of {declared} bytes is over the limit of {limit} bytes")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _encode_response(response: ExportTraceServiceResponse, content_type: str) -> Response:
    if content_type == PROTOBUF:
        return Response(response.SerializeToString(), 200, media_type=PROTOBUF)
    body = json_format.MessageToJson(response, indent=None)
    return Response(body, 200, media_type=JSON)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status)


def build_trace_store_app(
    settings: TraceStoreSettings, store: TraceStore | None = None
) -> Starlette:
    """The trace store's ASGI app (a store of the settings' bounds unless one is given)."""
    traces = store or TraceStore(settings.max_traces, settings.max_spans_per_trace)
    limit = settings.max_body_bytes

    async def export(request: Request) -> Response:
        content_type = _media_type(request.headers.get("content-type", ""))
        if content_type not in (PROTOBUF, JSON):
            message = f"content type {content_type or '(none)'!r}: send {PROTOBUF} or {JSON}"
            return _status_response(415, INVALID_ARGUMENT, message, JSON)
        encoding = request.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity", "gzip"):
            message = f"content encoding {encoding!r}: send gzip or identity"
            return _status_response(415, UNIMPLEMENTED, message, content_type)
        try:
            body = inflate(await _read_limited(request, limit), encoding, limit)
            message_in = decode_request(body, content_type)
        except BodyTooLargeError as exc:
            return _status_response(413, RESOURCE_EXHAUSTED, str(exc), content_type)
        except OtlpDecodeError as exc:
            return _status_response(400, INVALID_ARGUMENT, str(exc), content_type)
        spans, invalid = build_spans(message_in)
        full = traces.add(spans)
        answer = ExportTraceServiceResponse()
        if invalid or full:
            # OTLP's partial success: the export is accepted, the sender learns what was not.
            problems = invalid[:5]
            if full:
                problems.append(f"{full} span(s) over {traces.max_spans_per_trace} in a trace")
            answer.partial_success.rejected_spans = len(invalid) + full
            answer.partial_success.error_message = "; ".join(problems)
            log.warning("export: %s", answer.partial_success.error_message)
        return _encode_response(answer, content_type)

    async def trace(request: Request) -> Response:
        try:
            trace_id = parse_trace_id(request.path_params["trace_id"])
        except ValueError as exc:
            return _error(400, str(exc))
        spans = traces.get(trace_id)
        if spans is None:
            return _error(404, f"trace {trace_id} is not stored (unknown, or evicted)")
        return JSONResponse({"trace_id": trace_id, "spans": spans})

    async def listing(request: Request) -> Response:
        raw = request.query_params.get("limit", str(DEFAULT_LIST_LIMIT))
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST_LIMIT:
            return _error(400, f"limit {raw!r}: a whole number from 1 to {MAX_LIST_LIMIT}")
        service = request.query_params.get("service") or None
        return JSONResponse({"traces": traces.recent(service, int(raw))})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", **traces.counts()})

    routes = [
        Route(TRACES_PATH, export, methods=["POST"]),
        Route(f"{API_PATH}/{{trace_id}}", trace, methods=["GET"]),
        Route(API_PATH, listing, methods=["GET"]),
        Route(HEALTH_PATH, health, methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.state.store = traces
    return app


def banner(settings: TraceStoreSettings, port: int) -> str:
    """The line printed at start."""
    return (
        f"trace store on http://{settings.host}:{port} (OTLP/HTTP at {TRACES_PATH}, read at "
        f"{API_PATH}; the last {settings.max_traces} traces)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m redline.devstack.tracestore --config FILE`: serve the trace store."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--config", type=Path, required=True, help="Settings YAML.")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(TraceStoreSettings, args.config)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import uvicorn  # imported here: the module is imported by tests that start no server

    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(message)s")
    port = settings.port or DEFAULT_TRACE_STORE_PORT
    print(banner(settings, port), flush=True)
    uvicorn.run(
        build_trace_store_app(settings),
        host=settings.host,
        port=port,
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
