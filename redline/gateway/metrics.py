"""The gateway's series, declared from one table of metric-catalog entries.

Every family is registered on the registry passed in (the app's own, never the global one), and
`GatewayMetrics.observe` records one finished request in every request series. Series a dashboard
or alert divides by are created at zero for every region, so ratios are never absent before the
first event: upstream health, draining, interruptions and every reroute pair.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import Counter, Gauge, Histogram, MetricWrapperBase

from redline.slo import catalog
from redline.slo.catalog import REQUEST_LABELS, TOKEN_LABELS

REROUTE_REASONS = (
    "connect_error",
    "server_error",
    "first_byte_budget",
    "timeout",
    "upstream_error",
)
TTFT_BUCKETS = catalog.LLM_TIME_TO_FIRST_TOKEN_SECONDS.buckets

# attribute of GatewayMetrics -> catalog entry, in exposition order.
SERIES: tuple[tuple[str, catalog.Metric], ...] = (
    ("duration", catalog.LLM_REQUEST_DURATION_SECONDS),
    ("requests", catalog.LLM_REQUESTS_TOTAL),
    ("errors", catalog.LLM_REQUEST_ERRORS_TOTAL),
    ("reroutes", catalog.LLM_REROUTES_TOTAL),
    ("generated_tokens", catalog.LLM_GENERATED_TOKENS_TOTAL),
    ("prompt_tokens", catalog.LLM_PROMPT_TOKENS_TOTAL),
    ("ttft", catalog.LLM_TIME_TO_FIRST_TOKEN_SECONDS),
    ("upstream_healthy", catalog.LLM_GATEWAY_UPSTREAM_HEALTHY),
    ("routing_store_up", catalog.LLM_GATEWAY_ROUTING_STORE_UP),
    ("spot_aborted_ratio", catalog.LLM_SPOT_INFLIGHT_ABORTED_RATIO),
    ("spot_wasted_tokens", catalog.LLM_SPOT_WASTED_DECODE_TOKENS_TOTAL),
    ("spot_triaged", catalog.LLM_SPOT_TRIAGED_REQUESTS_TOTAL),
    ("spot_interrupted", catalog.LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL),
    ("spot_retries", catalog.LLM_SPOT_RETRIES_TOTAL),
    ("spot_draining", catalog.LLM_GATEWAY_NODE_DRAINING),
    ("breaker_state", catalog.LLM_GATEWAY_BREAKER_STATE),
    ("breaker_transitions", catalog.LLM_GATEWAY_BREAKER_TRANSITIONS_TOTAL),
)
BREAKER_STATES = ("closed", "open", "half_open")
"""The values of the breaker state gauge's `state` label."""
BREAKER_MOVES = (
    ("closed", "open"),
    ("open", "half_open"),
    ("half_open", "open"),
    ("half_open", "closed"),
)
"""Every transition a breaker makes (its counters start at zero)."""


def build_series(
    metric: catalog.Metric, registry: CollectorRegistry, buckets: Sequence[float]
) -> MetricWrapperBase:
    """A prometheus-client metric for a catalog entry; `buckets` when the entry fixes none."""
    if metric.kind == "counter":
        return Counter(metric.family, metric.help, metric.labels, registry=registry)
    if metric.kind == "gauge":
        return Gauge(metric.family, metric.help, metric.labels, registry=registry)
    if metric.kind == "histogram":
        return Histogram(
            metric.family,
            metric.help,
            metric.labels,
            buckets=metric.buckets or tuple(buckets),
            registry=registry,
        )
    raise ValueError(f"{metric.name}: the gateway declares no {metric.kind} series")


class GatewayMetrics:
    """The gateway's series (`SERIES`), registered on the registry passed in."""

    duration: Histogram
    requests: Counter
    errors: Counter
    reroutes: Counter
    generated_tokens: Counter
    prompt_tokens: Counter
    ttft: Histogram
    upstream_healthy: Gauge
    routing_store_up: Gauge
    spot_aborted_ratio: Gauge
    spot_wasted_tokens: Counter
    spot_triaged: Counter
    spot_interrupted: Counter
    spot_retries: Counter
    spot_draining: Gauge
    breaker_state: Gauge
    breaker_transitions: Counter

    def __init__(
        self,
        registry: CollectorRegistry,
        buckets: Sequence[float],
        regions: Sequence[str],
        max_model_labels: int = 32,
    ) -> None:
        self.max_model_labels = max_model_labels
        self.models_seen: set[str] = set()
        for attribute, metric in SERIES:
            setattr(self, attribute, build_series(metric, registry, buckets))
        for source in regions:
            self.upstream_healthy.labels(source).set(1)
            self.spot_draining.labels(source).set(0)
            for state in BREAKER_STATES:
                self.breaker_state.labels(source, state).set(1 if state == "closed" else 0)
            for before, after in BREAKER_MOVES:
                self.breaker_transitions.labels(source, before, after)
            for recoverable in ("true", "false"):
                self.spot_interrupted.labels(source, recoverable)
            for destination in regions:
                if source != destination:
                    for reason in REROUTE_REASONS:
                        self.reroutes.labels(source, destination, reason)

    def breaker_moved(self, region: str, before: str, after: str) -> None:
        """Count a breaker transition and show the region's new state."""
        self.breaker_transitions.labels(region, before, after).inc()
        for state in BREAKER_STATES:
            self.breaker_state.labels(region, state).set(1 if state == after else 0)

    def model_label(self, model: str) -> str:
        """`model` as a label value, bounded so clients cannot explode the series count."""
        if model in self.models_seen:
            return model
        if len(self.models_seen) < self.max_model_labels:
            self.models_seen.add(model)
            return model
        return "other"

    def observe(
        self,
        started: float,
        model: str,
        region: str,
        served: str,
        rerouted: bool,
        version: str,
        status: int,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        first_token_at: float | None = None,
        trace_id: str | None = None,
    ) -> None:
        """Observe one finished request (arrived at perf_counter `started`) in every series;
        a sampled request's `trace_id` goes on the latency histogram as an exemplar."""
        model = self.model_label(model)
        labels = (region, served, "true" if rerouted else "false", model, version, str(status))
        self.duration.labels(*labels).observe(
            time.perf_counter() - started, None if trace_id is None else {"trace_id": trace_id}
        )
        self.requests.labels(*labels).inc()
        errors = self.errors.labels(*labels)  # created at 0 so error ratios are never absent
        if status >= 500:
            errors.inc()
        if prompt_tokens is not None or completion_tokens is not None:
            tokens = (served, model, version)
            self.prompt_tokens.labels(*tokens).inc(prompt_tokens or 0)
            self.generated_tokens.labels(*tokens).inc(completion_tokens or 0)
        if first_token_at is not None:
            self.ttft.labels(served, model, version).observe(first_token_at - started)


__all__ = [
    "BREAKER_MOVES",
    "BREAKER_STATES",
    "REQUEST_LABELS",
    "REROUTE_REASONS",
    "SERIES",
    "TOKEN_LABELS",
    "TTFT_BUCKETS",
    "GatewayMetrics",
    "build_series",
]
