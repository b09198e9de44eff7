"""Traces through the gateway: a SERVER span per request, a CLIENT span per upstream attempt.

OpenTelemetry SDK with the OTLP/HTTP (protobuf) exporter, configured by the standard variables:
`OTEL_SDK_DISABLED`, `OTEL_TRACES_EXPORTER` (`otlp`, the default; `console`; `none`),
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (and the exporter's
other `OTEL_EXPORTER_OTLP_*`), `OTEL_SERVICE_NAME` (default `redline-gateway`),
`OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (default `parentbased_always_on`) and the batch
processor's `OTEL_BSP_*`. The gateway setting `tracing` turns it on or off; unset, it is on only
when an OTLP endpoint variable is set. `OTEL_SDK_DISABLED=true` wins over everything.

Off costs one boolean test per request: no span objects, no context work, no SDK import
(only the light API package is imported).

Propagation is W3C trace context only (`traceparent`, `tracestate`): extracted from the client's
request (a new trace when absent), and each upstream attempt gets its own `traceparent` naming its
CLIENT span as the parent (the client's headers are replaced, never forwarded twice). While an
attempt runs its span is the current one, so `trace.get_current_span().add_event(...)` anywhere
on that path (a breaker transition) lands on it; around the attempts the request's SERVER span is.

Attribute names follow the OpenTelemetry semantic conventions where one exists (HTTP, GenAI:
`gen_ai.request.model`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, `error.type`);
the gateway's own are under `redline.` (region, served region, attempt, reroute reason, model
version, spot resume). A request's trace id goes on the latency histogram as an exemplar when the
trace is sampled (`RequestTrace.finish`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import (
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    # The SDK is imported only when tracing is on.
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)

SERVICE_NAME = "redline-gateway"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
SPOT_RESUME_EVENT = "redline.spot.resume"
SPOT_PREEMPTED_EVENT = "redline.spot.preempted"


class TracingConfigError(Exception):
    """The tracing variables name something the gateway cannot build (an unknown exporter)."""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def tracing_wanted(setting: bool | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the gateway traces: never with OTEL_SDK_DISABLED=true, else `setting`, else
    only when an OTLP endpoint variable is set."""
    env = os.environ if environ is None else environ
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return False
    if setting is not None:
        return setting
    return any(env.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def build_exporters(environ: Mapping[str, str] | None = None) -> list[SpanExporter]:
    """The span exporters `OTEL_TRACES_EXPORTER` names (comma-separated; default otlp)."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    env = os.environ if environ is None else environ
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    exporters: list[SpanExporter] = []
    for name in names:
        if name in ("", "none"):
            continue
        if name == "otlp":
            # The HTTP/protobuf exporter reads its endpoint, headers, timeout and compression from
            # the OTEL_EXPORTER_OTLP_* variables itself (default http://localhost:4318/v1/traces).
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        else:
            raise TracingConfigError(
                f"OTEL_TRACES_EXPORTER: unknown exporter {name!r}; use otlp, console or none"
            )
    return exporters


def build_provider(
    exporters: Sequence[SpanExporter], batch: bool = True, environ: Mapping[str, str] | None = None
) -> TracerProvider:
    """A tracer provider (sampler from OTEL_TRACES_SAMPLER, resource from OTEL_SERVICE_NAME and
    OTEL_RESOURCE_ATTRIBUTES) exporting to `exporters`, batched unless `batch` is False."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    env = os.environ if environ is None else environ
    resource = Resource.create()
    named = env.get("OTEL_SERVICE_NAME", "").strip() or "service.name=" in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    if not named:
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
    return provider


class GatewayTracing:
    """The gateway's tracer, or nothing (`on` False): the one boolean the proxy tests."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self.on = provider is not None
        self._tracer: Tracer | None = None
        self._propagator = TraceContextTextMapPropagator()
        if provider is not None:
            self._tracer = provider.get_tracer("redline.gateway")

    @classmethod
    def from_settings(
        cls, setting: bool | None, environ: Mapping[str, str] | None = None
    ) -> GatewayTracing:
        """Tracing as the `tracing` setting and the OTEL_* variables say (off: no SDK import)."""
        if not tracing_wanted(setting, environ):
            return cls()
        provider = build_provider(build_exporters(environ), environ=environ)
        log.info("tracing on: %s", os.environ.get("OTEL_TRACES_EXPORTER", "otlp"))
        return cls(provider)

    def start(
        self,
        headers: Mapping[str, str],
        method: str,
        path: str,
        model: str,
        request_id: str,
        started: float,
        resumed_from: str | None = None,
        resumed_tokens: int = 0,
    ) -> RequestTrace:
        """The SERVER span of one request (arrived at perf_counter `started`), a child of the
        client's `traceparent` when it sent one."""
        assert self._tracer is not None, "start() on tracing that is off"
        parent = self._propagator.extract(headers)
        start_ns = time.time_ns() - int((time.perf_counter() - started) * 1e9)
        # Few attributes, none twice in a trace: each costs validation now and encoding later
        # (most of tracing's CPU); the attempts carry the model, version and token counts.
        attributes: dict[str, Any] = {"http.request.method": method}
        if resumed_from is not None:
            attributes["redline.request_id"] = request_id
            attributes["redline.spot.resumed_from"] = resumed_from
            attributes["redline.spot.served_prefix_tokens"] = resumed_tokens
        span = self._tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=start_ns,
        )
        return RequestTrace(self, span, f"{_operation(path)} {model}", model, resumed_from)

    def shutdown(self) -> None:
        """Flush and stop the exporters (the batch processor's last spans go out)."""
        if self.provider is not None:
            self.provider.shutdown()


def _operation(path: str) -> str:
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "text_completion"
    return "other"


class RequestTrace:
    """One request's spans: the SERVER span and its attempts' CLIENT spans."""

    __slots__ = (
        "_attempt",
        "_attempt_name",
        "_model",
        "_resumed_from",
        "_token",
        "_tracing",
        "attempts",
        "headers",
        "server",
    )

    def __init__(
        self,
        tracing: GatewayTracing,
        server: Span,
        attempt_name: str,
        model: str,
        resumed_from: str | None,
    ) -> None:
        self._tracing = tracing
        self.server = server
        self._attempt_name = attempt_name
        self._model = model
        self._resumed_from = resumed_from
        self._attempt: Span | None = None
        self._token: object | None = None
        self.attempts = 0
        self.headers: list[tuple[str, str]] = []
        """The trace headers of the current attempt's upstream call."""

    @property
    def trace_id(self) -> str | None:
        """The trace id (32 hex digits) when the trace is sampled, else None."""
        context = self.server.get_span_context()
        return format(context.trace_id, "032x") if context.trace_flags.sampled else None

    def server_context(self) -> Context:
        """A context whose current span is the SERVER span."""
        return set_span_in_context(self.server)

    def enter(self) -> object:
        """Make the SERVER span current; the token goes back to `detach`."""
        return otel_context.attach(set_span_in_context(self.server))

    def begin_attempt(self, region: str, resume: bool) -> object:
        """Start the CLIENT span of the next attempt on `region`, make it current and set the
        trace headers for its upstream call; the token goes back to `detach`."""
        tracer = self._tracing._tracer  # noqa: SLF001 - the tracing and its traces are one unit
        assert tracer is not None
        if self._attempt is not None:
            # A committed attempt given up for a fresh one (another model revision on resume).
            self._attempt.set_attribute("redline.attempt.outcome", "superseded")
            self._attempt.end()
        self.attempts += 1
        span = tracer.start_span(
            self._attempt_name,
            context=self.server_context(),
            kind=SpanKind.CLIENT,
            attributes={
                "redline.region": region,
                "redline.attempt": self.attempts,
                "gen_ai.request.model": self._model,
            },
        )
        if resume:
            span.add_event(
                SPOT_RESUME_EVENT,
                {"redline.spot.resumed_from": self._resumed_from or "", "redline.region": region},
            )
        self._attempt = span
        current = set_span_in_context(span)
        carrier: dict[str, str] = {}
        self._tracing._propagator.inject(carrier, context=current)  # noqa: SLF001
        self.headers = list(carrier.items())
        return otel_context.attach(current)

    def detach(self, token: object) -> None:
        """Make the span that was current before `enter` or `begin_attempt` current again."""
        otel_context.detach(token)  # type: ignore[arg-type]

    def attempt_failed(self, reason: str, detail: str, status: int | None) -> None:
        """End the current attempt's span as failed: `reason` is why the gateway moved on."""
        span = self._attempt
        if span is None:
            return
        self._attempt = None
        span.set_attribute("error.type", reason)
        span.set_attribute("redline.reroute_reason", reason)
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if reason == "spot_preemption":
            span.add_event(SPOT_PREEMPTED_EVENT, {"redline.detail": detail})
        span.set_status(Status(StatusCode.ERROR, detail))
        span.end()

    def preempted(self, detail: str) -> None:
        """A spot drain ended the committed attempt mid-answer: an event on its span (the span
        ends in `finish`, as a 503)."""
        if self._attempt is not None:
            self._attempt.add_event(SPOT_PREEMPTED_EVENT, {"redline.detail": detail})

    def attempt_committed(self, status: int) -> None:
        """The current attempt answered and the request is committed to it (it ends in
        `finish`, after the body, with the token counts)."""
        if self._attempt is not None:
            self._attempt.set_attribute("http.response.status_code", status)

    def finish(
        self,
        status: int,
        region: str,
        served: str,
        rerouted: bool,
        version: str,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
    ) -> str | None:
        """End the committed attempt's span and the SERVER span; the trace id when sampled."""
        tokens: dict[str, Any] = {}
        if prompt_tokens is not None:
            tokens["gen_ai.usage.input_tokens"] = prompt_tokens
        if completion_tokens is not None:
            tokens["gen_ai.usage.output_tokens"] = completion_tokens
        attempt = self._attempt
        if attempt is not None:
            self._attempt = None
            attempt.set_attributes({"redline.model_version": version, **tokens})
            if status >= 500:
                attempt.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            attempt.end()
        server = self.server
        server.set_attributes(
            {
                "http.response.status_code": status,
                "redline.served_region": served,
                "redline.rerouted": rerouted,
            }
        )
        if status >= 500:
            server.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        server.end()
        return self.trace_id


__all__ = [
    "ENDPOINT_VARIABLES",
    "SERVICE_NAME",
    "SPOT_PREEMPTED_EVENT",
    "SPOT_RESUME_EVENT",
    "TRACE_HEADERS",
    "GatewayTracing",
    "RequestTrace",
    "TracingConfigError",
    "build_exporters",
    "build_provider",
    "tracing_wanted",
]
