"""Fake serving engines' `/metrics`: the exposition each engine profile documents, no GPU needed.

`EngineMetrics(profile, model="chat", extra_labels={})` holds the series one vLLM, SGLang, TGI,
NIM (1.x) or OpenTelemetry-instrumented client would publish, written with prometheus-client on a
`CollectorRegistry` of its own (no global state): the names the profile maps
(`redline.slo.sources.PROFILES`, read from there), the engine's label names, and histograms with
the engine's own bucket bounds, spelled here as each engine's code spells them (so a unit test
comparing them with the profile's `buckets` checks two transcriptions against each other).
Around them sit the series no rule reads but a real scrape shows (vLLM's
`vllm:request_success_total{finished_reason}`, `vllm:num_requests_running`,
`vllm:lora_requests_info`, the API server's `http_requests_total` ...), so dashboards and
queries meet a realistic page.

`observe(latency_seconds, status=200, prompt_tokens=..., completion_tokens=..., ttft_seconds=...,
count=1, streamed=False)` records `count` identical requests the way the engine would: a 2xx
finishes normally; a 5xx is what each engine counts as a failure (vLLM 0.33: a 503 is an admission
rejection, `vllm:admission_rejections_total`, before the engine; another 5xx finishes with
`finished_reason="error"` and answers a 5xx, or, streamed, fails inside the 200 the API server
already counted 2xx; SGLang: an aborted request; TGI: `tgi_request_failure{err}`; NIM:
`request_failure_total`; OpenTelemetry: an operation with `error.type`); a 4xx is a client error
(vLLM: HTTP 4xx only; TGI: `err="validation"` for 422, `"overloaded"` for 429; the others record
nothing); 499 is a client abort (vLLM 0.33 records no finished stats for it:
`OutputProcessor.abort_requests`). `lora_adapters` fills vLLM's `vllm:lora_requests_info`.
`render()` is the text exposition; `EngineMetricsServer(exposition)`
(`redline.devstack.fakes.metrics_server`) serves any object with `render()` on `/metrics` (and
NIM's `/v1/metrics`) from a thread.

Where prometheus-client cannot write what a non-Python engine writes, the text is adjusted (TGI's
counters carry no `_total`); prometheus-client's `_created` series stay (TGI and OpenTelemetry's
Prometheus translation have none; no rule reads them).
"""

from __future__ import annotations

import operator
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from redline.slo.sources import PROFILES, SourceProfile

ENGINE_PROFILES = tuple(name for name, profile in PROFILES.items() if profile.mirrored)
"""Profiles with an engine exposition here (every profile but redline's own gateway)."""

# vLLM (vllm/v1/metrics/buckets.py): REQUEST_LATENCY_BUCKETS, TIME_TO_FIRST_TOKEN_BUCKETS and
# INTER_TOKEN_LATENCY_BUCKETS.
VLLM_REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
VLLM_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
VLLM_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
VLLM_FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
"""vLLM's FINISH_REASON_STRINGS: every value is a `finished_reason` series from the start."""
VLLM_ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
"""vLLM 0.33.0's ADMISSION_REASONS (vllm/v1/metrics/loggers.py)."""
OVERLOADED = 503
"""The status vLLM answers a request its admission refuses (QueueOverflowError)."""
VLLM_HTTP_REQUESTS = "http_requests_total"
"""vLLM's API server's request counter (prometheus-fastapi-instrumentator; status grouped)."""
TGI_REQUEST_COUNT = "tgi_request_count"
"""TGI's request counter, which a chat request increments twice (no profile reads it)."""
VLLM_MAX_MODEL_LEN = 4096
# SGLang (TokenizerMetricsCollector defaults, python/sglang/srt/metrics/collector.py).
SGLANG_E2E_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0,
)  # fmt: skip
SGLANG_QUEUE_TIME_BUCKETS = (
    0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0,
    30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0,
)  # fmt: skip
"""SGLang 0.5.23's sglang:queue_time_seconds buckets (SchedulerMetricsCollector)."""
SGLANG_TTFT_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0,
)  # fmt: skip
# TGI's router (router/src/server.rs): every `*duration` histogram gets 35 buckets, a geometric
# sequence that multiplies 0.0001 by 1.5 before each push; token histograms get 100 equal steps
# up to max_input_tokens / max_total_tokens.
TGI_DURATION_BUCKETS = tuple(accumulate(repeat(1.5, 35), operator.mul, initial=0.0001))[1:]
TGI_MAX_INPUT_TOKENS = 4095
TGI_MAX_TOTAL_TOKENS = 4096
# OpenTelemetry semantic conventions (docs/gen-ai/gen-ai-metrics.md), advisory bucket bounds.
OTEL_DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
OTEL_TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
OTEL_SERVER_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip

ABORTED = 499
"""The status `observe` takes for a request the client gave up on (nginx's convention)."""


class EngineProfileError(ValueError):
    """A profile with no engine exposition (unknown, or redline's own gateway)."""


@dataclass(frozen=True)
class Request:
    """One finished request as an engine sees it."""

    latency: float
    status: int
    prompt_tokens: int
    completion_tokens: int
    ttft: float
    streamed: bool = False
    queue_seconds: float | None = None
    """How long it waited for the running batch (None: not measured, a few ms are recorded)."""

    @property
    def ok(self) -> bool:
        """True for a 2xx answer."""
        return 200 <= self.status < 300

    @property
    def status_group(self) -> str:
        """The status as prometheus-fastapi-instrumentator groups it ("2xx", "5xx", ...)."""
        return f"{self.status // 100}xx"

    @property
    def per_token(self) -> float:
        """Mean time per output token after the first."""
        return max(self.latency - self.ttft, 0.0) / max(self.completion_tokens - 1, 1)

    @property
    def queued(self) -> float:
        """Its time in the engine's waiting queue."""
        return min(0.01, self.latency) if self.queue_seconds is None else self.queue_seconds


def _names(profile: SourceProfile, signal: str) -> tuple[str, ...]:
    found = profile.series.get(signal)
    if found is None:
        raise EngineProfileError(f"the {profile.name} profile maps no {signal} series")
    return found.names


def _child(metric: Histogram, labels: Mapping[str, str]) -> Histogram:
    # prometheus-client refuses labels() on a metric declared without label names (TGI's).
    return metric.labels(**labels) if labels else metric


def _observe(histogram: Histogram, value: float, count: int) -> None:
    # prometheus-client has no bulk observe; a loop keeps its buckets, sum and count exact.
    for _ in range(count):
        histogram.observe(value)


class _Engine:
    """One engine's series on a registry; subclasses record requests the engine's way."""

    def __init__(
        self,
        profile: SourceProfile,
        registry: CollectorRegistry,
        model: str,
        extra_labels: Mapping[str, str],
        lora_adapters: Sequence[str] = (),
    ) -> None:
        self.profile = profile
        self.registry = registry
        self.model = model
        self.extra = dict(sorted(extra_labels.items()))
        self.lora_adapters = tuple(lora_adapters)
        self.bound: dict[str, str] = {}
        self.setup()

    def setup(self) -> None:
        """Create the engine's series."""
        raise NotImplementedError

    @property
    def model_label(self) -> str | None:
        """The engine's label carrying the model (None for TGI: one server, one model)."""
        return self.profile.labels.get("model")

    def base_labels(self, **engine_labels: str) -> dict[str, str]:
        """The model label, `engine_labels` and the extra labels, as label name -> value."""
        labels = {self.model_label: self.model} if self.model_label else {}
        return {**labels, **engine_labels, **self.extra}

    def signal(self, signal: str) -> str:
        """The profile's (first) series name for `signal`."""
        return _names(self.profile, signal)[0]

    def bind(self, **engine_labels: str) -> dict[str, str]:
        """Label the `bound_*` series with `base_labels(**engine_labels)`; those labels."""
        self.bound = self.base_labels(**engine_labels)
        return self.bound

    def bound_histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        """A histogram with the bound labels: its one child."""
        return self.histogram(name, doc, list(self.bound), buckets).labels(**self.bound)

    def bound_counter(self, name: str, doc: str) -> Counter:
        """A counter with the bound labels: its one child."""
        return self.counter(name, doc, list(self.bound)).labels(**self.bound)

    def bound_gauge(self, name: str, doc: str) -> Gauge:
        """A gauge with the bound labels: its one child."""
        return self.gauge(name, doc, list(self.bound)).labels(**self.bound)

    def histogram(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> Histogram:
        """A histogram on this engine's registry."""
        return Histogram(name, doc, labels, registry=self.registry, buckets=buckets)

    def counter(self, name: str, doc: str, labels: Sequence[str]) -> Counter:
        """A counter on this engine's registry (prometheus-client adds `_total`)."""
        return Counter(name, doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str]) -> Gauge:
        """A gauge on this engine's registry."""
        return Gauge(name, doc, labels, registry=self.registry)

    def record(self, request: Request, count: int) -> None:
        """Count `count` identical requests."""
        raise NotImplementedError

    def saturation(self, waiting: int, running: int, usage: float | None) -> None:
        """Set the scheduler's gauges: requests waiting and running, KV-cache usage (None:
        left as it is). An engine without such gauges (OpenTelemetry's client) ignores it."""

    def fix_text(self, text: str) -> str:
        """The exposition as the engine writes it (prometheus-client's text, unless overridden)."""
        return text


class _Vllm(_Engine):
    """vLLM V1 (vllm/v1/metrics/loggers.py) behind its OpenAI API server."""

    HANDLER = "/v1/chat/completions"

    def setup(self) -> None:
        """The engine's series, the API server's, and LoRA info when adapters are loaded."""
        base = self.bind(engine="0")
        names = list(base)
        tokens = _one_two_five(VLLM_MAX_MODEL_LEN)
        self.e2e = self.bound_histogram(
            self.signal("request_duration"),
            "Histogram of e2e request latency in seconds.",
            VLLM_REQUEST_LATENCY_BUCKETS,
        )
        self.ttft = self.bound_histogram(
            self.signal("time_to_first_token"),
            "Histogram of time to first token in seconds.",
            VLLM_TTFT_BUCKETS,
        )
        self.itl = self.bound_histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            VLLM_ITL_BUCKETS,
        )
        self.queue = self.bound_histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            VLLM_REQUEST_LATENCY_BUCKETS,
        )
        self.prompt_hist = self.bound_histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.generation_hist = self.bound_histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.prompt_tokens = self.bound_counter(
            self.signal("prompt_tokens"), "Number of prefill tokens processed."
        )
        self.generation_tokens = self.bound_counter(
            self.signal("generated_tokens"), "Number of generation tokens processed."
        )
        success = self.counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
        )
        self.finished = {
            reason: success.labels(**base, finished_reason=reason)
            for reason in VLLM_FINISHED_REASONS
        }
        # Labelled by model_name and reason only (no engine): counted in the API process.
        model_only = {k: v for k, v in base.items() if k != "engine"}
        rejections = self.counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            [*(n for n in names if n != "engine"), "reason"],
        )
        self.rejected = {
            reason: rejections.labels(**model_only, reason=reason)
            for reason in VLLM_ADMISSION_REASONS
        }
        self.preemptions = self.bound_counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.running = self.bound_gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = self.bound_gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_cache = self.bound_gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.lora_info = (
            self.gauge(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters", *self.extra],
            )
            if self.lora_adapters
            else None
        )
        self._setup_api_server()
        self.kv_cache.set(0.05)

    def saturation(self, waiting: int, running: int, usage: float | None) -> None:
        """The scheduler's gauges (PrometheusStatLogger.record, every engine step)."""
        self.waiting.set(waiting)
        self.running.set(running)
        if usage is not None:
            self.kv_cache.set(usage)

    def _setup_api_server(self) -> None:
        # prometheus-fastapi-instrumentator's default metrics, on vLLM's registry. It creates a
        # status series at its first request (no zero before it), so a burst of 5xx on a fresh
        # series is partly invisible to rate(), as on a real vLLM.
        http_labels = ["handler", "method", "status", *self.extra]
        self.http_requests = self.counter(
            VLLM_HTTP_REQUESTS,
            "Total number of requests by method, status and handler.",
            http_labels,
        )
        self.http_duration = self.histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by "
            "handler is important.",
            ["handler", "method", *self.extra],
            (0.1, 0.5, 1.0),
        ).labels(handler=self.HANDLER, method="POST", **self.extra)

    def record(self, request: Request, count: int) -> None:
        """Finished requests go through the engine's stats; every request through the API's."""
        # A stream's 200 is out before its engine fails: the instrumentator counts it 2xx.
        status = "2xx" if request.streamed else request.status_group
        self.http_requests.labels(
            handler=self.HANDLER, method="POST", status=status, **self.extra
        ).inc(count)
        _observe(self.http_duration, request.latency, count)
        if 400 <= request.status < 500:
            # Refused by the API server (validation), or the client hung up: abort_requests
            # records no finished stats for a frontend abort.
            return
        if request.status == OVERLOADED:
            self.rejected["max_num_queued_reqs"].inc(count)
            return
        self.finished["stop" if request.ok else "error"].inc(count)
        _observe(self.e2e, request.latency, count)
        _observe(self.queue, request.queued, count)
        if request.ok:
            _observe(self.ttft, request.ttft, count)
            _observe(self.itl, request.per_token, count)
            _observe(self.prompt_hist, request.prompt_tokens, count)
            _observe(self.generation_hist, request.completion_tokens, count)
            self.prompt_tokens.inc(request.prompt_tokens * count)
            self.generation_tokens.inc(request.completion_tokens * count)
        if self.lora_info is not None:
            # vLLM stamps the gauge with the time of the last iteration that saw the adapters.
            self.lora_info.labels(
                max_lora=str(len(self.lora_adapters)),
                waiting_lora_adapters="",
                running_lora_adapters=",".join(self.lora_adapters),
                **self.extra,
            ).set(time.time())


def _one_two_five(max_value: int) -> tuple[float, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to `max_value`."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


class _Sglang(_Engine):
    """SGLang 0.5.23's TokenizerMetricsCollector, scheduler gauges and HTTP middleware
    (--enable-metrics)."""

    ENDPOINT = "/v1/chat/completions"

    def setup(self) -> None:
        """The engine's series."""
        self.bind(engine_type="unified")
        self.e2e = self.bound_histogram(
            self.signal("request_duration"),
            "Histogram of End-to-end request latency in seconds",
            SGLANG_E2E_BUCKETS,
        )
        self.ttft = self.bound_histogram(
            self.signal("time_to_first_token"),
            "Histogram of time to first token in seconds.",
            SGLANG_TTFT_BUCKETS,
        )
        self.requests = self.bound_counter(
            "sglang:num_requests_total", "Number of requests processed."
        )
        self.aborted = self.bound_counter(
            "sglang:num_aborted_requests_total", "Number of requests aborted."
        )
        # The HTTP middleware's (srt/observability/http_request_metrics.py): no model label.
        self.http_requests = self.counter(
            "sglang:http_requests_total",
            "Total number of HTTP requests by endpoint and method",
            ["endpoint", "method", *self.extra],
        ).labels(endpoint=self.ENDPOINT, method="POST", **self.extra)
        self.http_responses = self.counter(
            _names(self.profile, "requests")[0],
            "Total number of HTTP responses by endpoint and status code",
            ["endpoint", "status_code", "method", *self.extra],
        )
        self.prompt_tokens = self.bound_counter(
            self.signal("prompt_tokens"), "Number of prefill tokens processed."
        )
        self.generation_tokens = self.bound_counter(
            self.signal("generated_tokens"), "Number of generation tokens processed."
        )
        self.cached_tokens = self.bound_counter(
            "sglang:cached_tokens_total", "Number of cached prompt tokens."
        )
        self.running = self.bound_gauge(
            "sglang:num_running_reqs", "The number of running requests."
        )
        self.queued = self.bound_gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue."
        )
        self.token_usage = self.bound_gauge("sglang:token_usage", "The token usage.")
        self.token_usage.set(0.05)
        self.queue_time = self.bound_histogram(
            "sglang:queue_time_seconds",
            "Histogram of queueing time in seconds.",
            SGLANG_QUEUE_TIME_BUCKETS,
        )
        self.retracted = self.bound_counter(
            "sglang:num_retracted_requests", "Total number of retracted requests."
        )

    def saturation(self, waiting: int, running: int, usage: float | None) -> None:
        """The scheduler's gauges (SchedulerMetricsCollector.log_stats)."""
        self.queued.set(waiting)
        self.running.set(running)
        if usage is not None:
            self.token_usage.set(usage)

    def record(self, request: Request, count: int) -> None:
        """The middleware counts every answer when it starts (a stream's at its 200); the
        scheduler's num_requests_total what it finished, aborts as num_aborted_requests."""
        self.http_requests.inc(count)
        if request.streamed or request.status != ABORTED:
            status = "200" if request.streamed else str(request.status)
            self.http_responses.labels(
                endpoint=self.ENDPOINT, status_code=status, method="POST", **self.extra
            ).inc(count)
        if 400 <= request.status < 500 and request.status != ABORTED:
            return  # rejected by the tokenizer manager before it was scheduled
        self.requests.inc(count)
        _observe(self.e2e, request.latency, count)
        _observe(self.queue_time, request.queued, count)
        if not request.ok:
            self.aborted.inc(count)
            return
        _observe(self.ttft, request.ttft, count)
        self.prompt_tokens.inc(request.prompt_tokens * count)
        self.generation_tokens.inc(request.completion_tokens * count)


_OPENAI_STATUS_ERRORS = {
    400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
    404: "NotFoundError", 409: "ConflictError", 422: "UnprocessableEntityError",
    429: "RateLimitError",
}  # fmt: skip


def _openai_error(status: int) -> str:
    """The OpenAI SDK's exception class for an HTTP status (openai 3.63 _make_status_error)."""
    if status >= 500:
        return "InternalServerError"
    return _OPENAI_STATUS_ERRORS.get(status, "APIStatusError")


class _BareCounters(Collector):
    """Counters named without `_total`, as metrics-exporter-prometheus (Rust) writes TGI's."""

    def __init__(self, docs: Mapping[str, str]) -> None:
        self.docs = dict(docs)
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def inc(self, name: str, amount: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        """Add `amount` to the counter `name` with `labels`."""
        key = (name, tuple(sorted((labels or {}).items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def collect(self) -> Iterator[Metric]:
        """One counter family per name, its samples under the bare name."""
        with self._lock:
            values = dict(self._values)
        for name, doc in self.docs.items():
            family = Metric(name, doc, "counter")
            for (sample, labels), value in sorted(values.items()):
                if sample == name:
                    family.add_sample(name, dict(labels), value)
            yield family

    def fix_headers(self, text: str) -> str:
        """HELP and TYPE lines under the bare name, as metrics-exporter-prometheus writes them."""
        # prometheus-client names every counter family `<name>_total` in those two lines.
        for name in self.docs:
            text = re.sub(
                rf"^# (HELP|TYPE) {re.escape(name)}_total ", rf"# \1 {name} ", text, flags=re.M
            )
        return text


class _Tgi(_Engine):
    """TGI's router (metrics crate + metrics-exporter-prometheus): no model label."""

    FAILURE_KINDS = {422: "validation", 429: "overloaded", 424: "generation", 500: "incomplete"}

    def setup(self) -> None:
        """The engine's series."""
        labels = self.base_labels()
        names = list(labels)
        self.count_name = TGI_REQUEST_COUNT
        self.success_name, self.failure_name = _names(self.profile, "requests")
        self.counters = _BareCounters(
            {
                self.count_name: "Total number of requests",
                self.success_name: "Number of successful requests",
                self.failure_name: "Number of failed requests",
            }
        )
        self.registry.register(self.counters)

        def duration(name: str, doc: str) -> Histogram:
            return self.histogram(name, doc, names, TGI_DURATION_BUCKETS)

        self.total = duration(
            self.signal("request_duration"), "Total time spent processing the request"
        )
        self.validation = duration(
            "tgi_request_validation_duration", "Time spent validating the request"
        )
        self.queue = duration("tgi_request_queue_duration", "Time spent in the queue per request")
        self.inference = duration("tgi_request_inference_duration", "Request inference duration")
        self.per_token = duration(
            "tgi_request_mean_time_per_token_duration", "Mean time per token per request"
        )
        input_buckets = [TGI_MAX_INPUT_TOKENS / 100 * (x + 1) for x in range(100)]
        total_buckets = [TGI_MAX_TOTAL_TOKENS / 100 * (x + 1) for x in range(100)]
        self.input_length = self.histogram(
            self.signal("prompt_tokens").removesuffix("_sum"),
            "Input token length per request",
            names,
            input_buckets,
        )
        self.generated = self.histogram(
            self.signal("generated_tokens").removesuffix("_sum"),
            "Generated tokens per request",
            names,
            total_buckets,
        )
        self.queue_size = self.gauge("tgi_queue_size", "Current queue size", names)
        self.batch_size = self.gauge("tgi_batch_current_size", "Current batch size", names)
        self.labels = labels
        for gauge in (self.queue_size, self.batch_size):
            (gauge.labels(**labels) if labels else gauge).set(0)
        for name in (self.count_name, self.success_name):
            self.counters.inc(name, 0.0, labels)

    def saturation(self, waiting: int, running: int, usage: float | None) -> None:
        """tgi_queue_size (the queue task) and tgi_batch_current_size (the batching task)."""
        for gauge, value in ((self.queue_size, waiting), (self.batch_size, running)):
            (gauge.labels(**self.labels) if self.labels else gauge).set(value)

    def record(self, request: Request, count: int) -> None:
        """A chat request is two tgi_request_count (chat_completions, then generate_internal
        or generate_stream_internal); it ends once, a success or a failure by kind."""
        labels = self.labels
        self.counters.inc(self.count_name, 2 * count, labels)
        if not request.ok:
            kind = self.FAILURE_KINDS.get(request.status)
            if kind is None:
                kind = "dropped" if request.status == ABORTED else "generation"
            self.counters.inc(self.failure_name, count, {"err": kind, **labels})
            return
        self.counters.inc(self.success_name, count, labels)
        for histogram, value in (
            (self.total, request.latency),
            (self.validation, 0.001),
            (self.queue, request.queued),
            (self.inference, max(request.latency - 0.011, 0.0)),
            (self.per_token, request.per_token),
            (self.input_length, float(request.prompt_tokens)),
            (self.generated, float(request.completion_tokens)),
        ):
            _observe(_child(histogram, labels), value, count)

    def fix_text(self, text: str) -> str:
        """TGI's counters keep their bare names in HELP and TYPE lines."""
        return self.counters.fix_headers(text)


class _Nim(_Engine):
    """NVIDIA NIM for LLMs 1.x: unprefixed, per-model series at /v1/metrics."""

    def setup(self) -> None:
        """The engine's series."""
        base = self.bind()
        failure = self.signal("errors")
        (success,) = (n for n in _names(self.profile, "requests") if n != failure)
        self.e2e = self.bound_histogram(
            self.signal("request_duration"),
            "Histogram of end to end request latency in seconds",
            VLLM_REQUEST_LATENCY_BUCKETS,
        )
        self.ttft = self.bound_histogram(
            self.signal("time_to_first_token"),
            "Histogram of time to first token in seconds",
            VLLM_TTFT_BUCKETS,
        )
        self.tpot = self.bound_histogram(
            "time_per_output_token_seconds",
            "Histogram of time per output token in seconds",
            VLLM_ITL_BUCKETS,
        )
        self.success = self.bound_counter(success, "Number of successful requests")
        self.failure = self.bound_counter(failure, "Number of failed requests")
        finish = self.counter(
            "request_finish", "Number of finished requests", [*base, "finished_reason"]
        )
        self.finished = {
            reason: finish.labels(**base, finished_reason=reason)
            for reason in ("stop", "length", "abort")
        }
        self.prompt_tokens = self.bound_counter(
            self.signal("prompt_tokens"), "Number of prefill tokens processed"
        )
        self.generation_tokens = self.bound_counter(
            self.signal("generated_tokens"), "Number of generation tokens processed"
        )
        self.gauges = {
            gauge_name: self.bound_gauge(gauge_name, doc)
            for gauge_name, doc in (
                ("num_requests_running", "Number of requests currently running on GPU"),
                ("num_requests_waiting", "Number of requests waiting to be processed"),
                ("num_request_max", "Max number of requests that can be run concurrently"),
                ("gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage"),
            )
        }
        self.gauges["num_request_max"].set(256)
        self.gauges["gpu_cache_usage_perc"].set(0.05)

    def saturation(self, waiting: int, running: int, usage: float | None) -> None:
        """NIM 1.x's scheduler gauges."""
        self.gauges["num_requests_waiting"].set(waiting)
        self.gauges["num_requests_running"].set(running)
        if usage is not None:
            self.gauges["gpu_cache_usage_perc"].set(usage)

    def record(self, request: Request, count: int) -> None:
        """Success is a finish by stop or length; any other finish is a failure."""
        if 400 <= request.status < 500 and request.status != ABORTED:
            return  # refused before it reached the model
        _observe(self.e2e, request.latency, count)
        if not request.ok:
            self.failure.inc(count)
            self.finished["abort"].inc(count)
            return
        self.success.inc(count)
        self.finished["stop"].inc(count)
        _observe(self.ttft, request.ttft, count)
        _observe(self.tpot, request.per_token, count)
        self.prompt_tokens.inc(request.prompt_tokens * count)
        self.generation_tokens.inc(request.completion_tokens * count)


class _OtelGenai(_Engine):
    """An OpenTelemetry-instrumented OpenAI client (and server TTFT), as Prometheus stores them
    after its OTLP translation: dots become underscores and the unit becomes a suffix."""

    SCOPE = "opentelemetry.instrumentation.openai_v2"

    def setup(self) -> None:
        """The engine's series."""
        model_label = self.model_label or "gen_ai_request_model"
        self.common = {
            "gen_ai_operation_name": "chat",
            "gen_ai_provider_name": "openai",
            model_label: self.model,
            "gen_ai_response_model": self.model,
            "server_address": "inference.internal",
            "server_port": "8000",
            "otel_scope_name": self.SCOPE,
            **self.extra,
        }
        names = list(self.common)
        self.duration = self.histogram(
            self.signal("request_duration"),
            "GenAI operation duration.",
            [*names, "error_type"],
            OTEL_DURATION_BUCKETS,
        )
        usage = self.signal("prompt_tokens").removesuffix("_sum")
        self.tokens = self.histogram(
            usage,
            "Number of input and output tokens used.",
            [*names, "gen_ai_token_type"],
            OTEL_TOKEN_BUCKETS,
        )
        self.ttft = self.histogram(
            self.signal("time_to_first_token"),
            "Time to generate first token for successful responses.",
            names,
            OTEL_SERVER_TTFT_BUCKETS,
        ).labels(**self.common)
        info = self.gauge(
            "target_info",
            "Target metadata",
            ["service_name", "telemetry_sdk_language", "telemetry_sdk_name"],
        )
        info.labels(
            service_name="chat-frontend",
            telemetry_sdk_language="python",
            telemetry_sdk_name="opentelemetry",
        ).set(1)

    def record(self, request: Request, count: int) -> None:
        """Every operation has a duration; a failed one carries error.type (the status code).
        A streamed call is recorded when its stream is handed back (openai-v2 2.4b0 patch.py):
        after its first token, successful, without token usage."""
        if request.streamed:
            labels = {**self.common, "error_type": ""}
            _observe(self.duration.labels(**labels), min(request.ttft, request.latency), count)
            return
        error = "" if request.ok or request.status == ABORTED else _openai_error(request.status)
        _observe(self.duration.labels(**self.common, error_type=error), request.latency, count)
        if not request.ok:
            return
        for kind, tokens in (
            ("input", request.prompt_tokens),
            ("output", request.completion_tokens),
        ):
            _observe(self.tokens.labels(**self.common, gen_ai_token_type=kind), tokens, count)
        _observe(self.ttft, request.ttft, count)


_ENGINES: Mapping[str, type[_Engine]] = {
    "vllm": _Vllm,
    "sglang": _Sglang,
    "tgi": _Tgi,
    "nim": _Nim,
    "otel-genai": _OtelGenai,
}


class EngineMetrics:
    """One engine's exposition: record requests, render `/metrics`."""

    def __init__(
        self,
        profile: str,
        model: str = "chat",
        extra_labels: Mapping[str, str] | None = None,
        lora_adapters: Sequence[str] = (),
    ) -> None:
        if profile not in _ENGINES:
            raise EngineProfileError(
                f"no engine exposition for profile {profile!r}; allowed: {', '.join(_ENGINES)}"
            )
        self.profile = PROFILES[profile]
        self.model = model
        self.registry = CollectorRegistry()
        self._engine = _ENGINES[profile](
            self.profile, self.registry, model, dict(extra_labels or {}), lora_adapters
        )
        self._lock = threading.Lock()
        self.observed = 0

    def observe(
        self,
        latency_seconds: float,
        *,
        status: int = 200,
        prompt_tokens: int = 120,
        completion_tokens: int = 60,
        ttft_seconds: float | None = None,
        count: int = 1,
        streamed: bool = False,
        queue_seconds: float | None = None,
    ) -> None:
        """Record `count` identical requests (thousands at once are fine); `streamed`: answered
        as a stream, whose 200 is sent before the engine finishes; `queue_seconds`: the wait
        for the running batch."""
        if count < 0 or latency_seconds < 0:
            raise ValueError("count and latency_seconds must not be negative")
        ttft = min(latency_seconds, 0.05) if ttft_seconds is None else ttft_seconds
        request = Request(
            latency_seconds, status, prompt_tokens, completion_tokens, ttft, streamed,
            queue_seconds,
        )  # fmt: skip
        with self._lock:
            self._engine.record(request, count)
            self.observed += count

    def set_saturation(self, waiting: int, running: int, usage: float | None = None) -> None:
        """The scheduler's gauges: requests waiting and running, KV-cache usage (0-1)."""
        with self._lock:
            self._engine.saturation(waiting, running, usage)

    def render(self) -> bytes:
        """The text exposition (format 0.0.4), as the engine writes it."""
        return self._engine.fix_text(generate_latest(self.registry).decode()).encode()
