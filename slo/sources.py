"""Source profiles: where each SLI comes from on the serving stack a user already runs.

redline's rules, dashboards and reports read one set of *canonical* series (the catalog's
`llm_request_duration_seconds`, `llm_requests_total`, ... with the catalog's labels). A source
profile says which series of an engine stand for each of them and how the engine's labels map
onto the catalog's:

- `redline-gateway`: redline's own gateway writes the canonical series itself (P99 including
  cross-region reroute); nothing is mapped.
- `vllm`, `sglang`, `tgi`, `nim`, `otel-genai`: the engine's own series, read where they are
  (`redline.rules.signals`): inside each aggregation the engine's labels are mapped onto the
  catalog's — `model` from the engine's model label (or a constant), `region` from a target or
  external label, `served_region` = `region` and `rerouted="false"` (no gateway, no reroute) —
  and `model_version` is joined from `model_active_info` (the snapshot registry's active
  version) after it. No engine series is copied.

`resolve_sources(spec.sources)` applies the spec's overrides to its profile; everything else
reads the result. Pure data and pure functions: nothing here touches the network.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import accumulate, repeat
from typing import Literal, get_args

from redline.slo import catalog
from redline.slo.alerts import Alert

ProfileName = Literal["redline-gateway", "vllm", "sglang", "tgi", "nim", "otel-genai"]
PROFILE_NAMES: tuple[str, ...] = get_args(ProfileName)

SignalName = Literal[
    "request_duration",
    "requests",
    "errors",
    "prompt_tokens",
    "generated_tokens",
    "time_to_first_token",
]
SIGNAL_NAMES: tuple[str, ...] = get_args(SignalName)

SaturationName = Literal["queue", "running", "queue_time", "kv_cache", "preemptions"]
"""An engine's saturation signals, the leading indicators of a latency breach: requests waiting,
requests running (the batch), time spent waiting, KV-cache usage (0-1), preemptions."""
SATURATION_NAMES: tuple[str, ...] = get_args(SaturationName)
SATURATION_KINDS: Mapping[str, Literal["gauge", "histogram", "counter"]] = {
    "queue": "gauge",
    "running": "gauge",
    "queue_time": "histogram",
    "kv_cache": "gauge",
    "preemptions": "counter",
}
"""How the rules read each saturation signal."""

MAPPABLE_LABELS = ("region", "model", "model_version", "status")
"""Catalog labels an engine profile can take from one of the engine's labels."""

SignalKind = Literal["histogram", "counter"]
CANONICAL: Mapping[str, catalog.Metric] = {
    "request_duration": catalog.LLM_REQUEST_DURATION_SECONDS,
    "requests": catalog.LLM_REQUESTS_TOTAL,
    "errors": catalog.LLM_REQUEST_ERRORS_TOTAL,
    "prompt_tokens": catalog.LLM_PROMPT_TOKENS_TOTAL,
    "generated_tokens": catalog.LLM_GENERATED_TOKENS_TOTAL,
    "time_to_first_token": catalog.LLM_TIME_TO_FIRST_TOKEN_SECONDS,
}
"""The catalog series each signal stands for (what the gateway writes under that name)."""

SIGNAL_KINDS: Mapping[str, SignalKind] = {
    "request_duration": "histogram",
    "requests": "counter",
    "errors": "counter",
    "prompt_tokens": "counter",
    "generated_tokens": "counter",
    "time_to_first_token": "histogram",
}
"""What the rules read of each signal: a histogram (`_bucket`, `_count`, `_sum`) or a counter."""


class SourceProfileError(ValueError):
    """A source profile or override that cannot be resolved (names the field and the allowed)."""


@dataclass(frozen=True)
class SourceSeries:
    """The engine series that stand for one signal.

    `names` are added together (e.g. NIM's successes + failures for all requests); for a
    histogram signal each name is a histogram's base name (`_bucket`/`_count`/`_sum` appended).
    `matchers` are PromQL label matchers applied to every name (`status="5xx"`), `name_matchers`
    to one name only.
    `note` says why this series stands in where the engine has no exact equivalent.
    """

    names: tuple[str, ...]
    matchers: tuple[str, ...] = ()
    note: str = ""
    name_matchers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Matchers of one of the names only, beside the shared `matchers` (vLLM's errors: the
    requests that finished with an error, plus every admission rejection)."""

    def matchers_of(self, name: str) -> tuple[str, ...]:
        """The matchers applied to `name`: the shared ones, then its own."""
        return (*self.matchers, *self.name_matchers.get(name, ()))

    def selector(self, name: str, suffix: str = "") -> str:
        """`name` + `suffix` with its matchers, as PromQL."""
        inner = ", ".join(self.matchers_of(name))
        return f"{name}{suffix}{{{inner}}}" if inner else f"{name}{suffix}"


@dataclass(frozen=True)
class SourceProfile:
    """One serving stack's series, labels and what it cannot provide."""

    name: str
    title: str
    docs: str
    series: Mapping[str, SourceSeries]
    """Signal name -> its series; a missing signal is not available from this stack."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Catalog label -> the engine's label carrying it (`model` -> `model_name`)."""
    buckets: tuple[float, ...] = ()
    """The latency histogram's bucket bounds as the engine ships them."""
    model: str | None = None
    """A constant `model` label for engines whose series name no model."""
    includes_reroute: bool = False
    """True only where the latency is measured end to end around cross-region reroutes."""
    missing: Mapping[str, str] = field(default_factory=dict)
    """Capability -> why this stack cannot provide it (printed by `redline validate`)."""
    saturation: Mapping[str, SourceSeries] = field(default_factory=dict)
    """Saturation signal -> the engine's series (`SATURATION_KINDS`); none for the gateway."""

    @property
    def mirrored(self) -> bool:
        """True when the rules map the engine's series onto the canonical ones."""
        return self.name != "redline-gateway"


_GATEWAY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
# vLLM's REQUEST_LATENCY_BUCKETS (vllm/v1/metrics/buckets.py; `request_latency_buckets` in
# vllm/v1/metrics/loggers.py before that module existed), shared by every phase histogram.
_VLLM_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# SGLang's default `bucket_e2e_request_latency` (TokenizerMetricsCollector in
# python/sglang/srt/metrics/collector.py; `--bucket-e2e-request-latency` overrides it).
_SGLANG_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0,
)  # fmt: skip
# TGI's router (router/src/server.rs) sets every `*duration` histogram to 35 buckets: start at
# 0.0001 s and multiply by 1.5 before each one (0.00015 ... 145.6 s). Computed the same way, so
# the floats -- and the `le` text metrics-exporter-prometheus prints for them -- are TGI's own.
_TGI_BUCKETS = tuple(accumulate(repeat(1.5, 35), operator.mul, initial=0.0001))[1:]
# OpenTelemetry's advisory buckets for gen_ai.client.operation.duration (semantic-conventions,
# docs/gen-ai/gen-ai-metrics.md).
_OTEL_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip

_NO_REROUTE = (
    "latency is measured inside the engine: cross-region reroutes and the network are not in "
    "it (P99 including reroute needs redline's gateway in the path)"
)
# vLLM 0.33.0: `vllm:request_success` {model_name, engine, finished_reason} counted in
# PrometheusStatLogger.record (vllm/v1/metrics/loggers.py) for every request the engine finished
# (FinishReason, vllm/v1/engine/__init__.py); `vllm:admission_rejections` {model_name, reason}
# counted in AsyncLLM before it raises QueueOverflowError (vllm/v1/engine/async_llm.py), which the
# API server answers 503.
# The OpenAI SDK's exceptions for the client's own errors (openai 3.63 _client.py
# _make_status_error: 400, 401, 403, 404, 409, 422); the instrumentation records the class name
# as error.type.
_OPENAI_CLIENT_ERRORS = (
    "BadRequestError", "AuthenticationError", "PermissionDeniedError", "NotFoundError",
    "ConflictError", "UnprocessableEntityError",
)  # fmt: skip
# SGLang 0.5.23 srt/observability/http_request_metrics.py: the HTTP middleware counts
# `sglang:http_responses_total{endpoint, status_code, method}` when a response starts.
_SGLANG_RESPONSES = "sglang:http_responses_total"
_SGLANG_GENERATION = 'endpoint=~"/v1/chat/completions|/v1/completions|/generate"'
# TGI 3.3 router/src/server.rs: tgi_request_success once per generation that reached its end,
# tgi_request_failure{err} once per one that did not (validation, overloaded, generation,
# incomplete; dropped and download_adapter in the queue).
_TGI_SUCCESS = "tgi_request_success"
_TGI_FAILURE = "tgi_request_failure"
_VLLM_FINISHED = "vllm:request_success_total"
_VLLM_REJECTED = "vllm:admission_rejections_total"

PROFILES: Mapping[str, SourceProfile] = {
    profile.name: profile
    for profile in (
        SourceProfile(
            "redline-gateway",
            "redline's gateway (OpenAI-compatible, in the data path)",
            "docs/spec-and-rules.md",
            {
                "request_duration": SourceSeries((catalog.LLM_REQUEST_DURATION_SECONDS.name,)),
                "requests": SourceSeries((catalog.LLM_REQUESTS_TOTAL.name,)),
                "errors": SourceSeries((catalog.LLM_REQUEST_ERRORS_TOTAL.name,)),
                "prompt_tokens": SourceSeries((catalog.LLM_PROMPT_TOKENS_TOTAL.name,)),
                "generated_tokens": SourceSeries((catalog.LLM_GENERATED_TOKENS_TOTAL.name,)),
                "time_to_first_token": SourceSeries(
                    (catalog.LLM_TIME_TO_FIRST_TOKEN_SECONDS.name,)
                ),
            },
            buckets=_GATEWAY_BUCKETS,
            includes_reroute=True,
        ),
        SourceProfile(
            "vllm",
            "vLLM OpenAI-compatible server (V1 engine; counting as of 0.33)",
            "https://docs.vllm.ai/en/latest/design/metrics.html (vllm/v1/metrics/loggers.py)",
            {
                "request_duration": SourceSeries(
                    ("vllm:e2e_request_latency_seconds",),
                    note="labels model_name and engine (the data-parallel engine index)",
                ),
                "requests": SourceSeries(
                    (_VLLM_FINISHED, _VLLM_REJECTED),
                    note="every request the engine finished, whatever its finished_reason "
                    "(stop, length, repetition, error, abort by the engine), and every request "
                    "refused at admission (HTTP 503). A client that hangs up is in neither "
                    "(OutputProcessor.abort_requests records no finished stats), nor is a request "
                    "the API server refuses before the engine (4xx: the client's own)",
                ),
                "errors": SourceSeries(
                    (_VLLM_FINISHED, _VLLM_REJECTED),
                    note='finished_reason="error" (FinishReason.ERROR, "always converted to 500 '
                    'Internal Server Error": as a 500, or inside the 200 of a stream, where '
                    "http_requests_total counts it 2xx) plus admission rejections (a queue limit, "
                    "HTTP 503); engine aborts are not errors",
                    name_matchers={_VLLM_FINISHED: ('finished_reason="error"',)},
                ),
                "prompt_tokens": SourceSeries(("vllm:prompt_tokens_total",)),
                "generated_tokens": SourceSeries(("vllm:generation_tokens_total",)),
                "time_to_first_token": SourceSeries(("vllm:time_to_first_token_seconds",)),
            },
            labels={"model": "model_name", "region": "region"},
            buckets=_VLLM_BUCKETS,
            missing={
                "p99_including_reroute": _NO_REROUTE,
                "errors_in_older_vllm": "vLLM before 0.32 has no "
                "vllm:admission_rejections_total (a request refused at admission is in no engine "
                "series; from 0.13 on the profile reads the rest as it is), and before 0.13 no "
                'finished_reason="error": there, override sources.series with '
                'http_requests_total (handler=~"/v1/chat/completions|/v1/completions", errors '
                'status="5xx"), which counts a stream that fails after its 200 as a success',
                "latency_by_lora_adapter": "vLLM labels latency with the served model name, not "
                "the LoRA adapter (vllm:lora_requests_info only lists running/waiting adapter "
                "names): the version joined is the registry's active one for that name",
            },
            saturation={
                # vLLM 0.33.0 vllm/v1/metrics/loggers.py, PrometheusStatLogger: the scheduler's
                # gauges per engine (multiprocess_mode mostrecent), recorded every step.
                "queue": SourceSeries(("vllm:num_requests_waiting",)),
                "running": SourceSeries(("vllm:num_requests_running",)),
                "queue_time": SourceSeries(("vllm:request_queue_time_seconds",)),
                "kv_cache": SourceSeries(("vllm:kv_cache_usage_perc",)),
                "preemptions": SourceSeries(("vllm:num_preemptions_total",)),
            },
        ),
        SourceProfile(
            "sglang",
            "SGLang runtime (--enable-metrics)",
            "https://docs.sglang.ai/references/production_metrics.html "
            "(python/sglang/srt/observability/metrics_collector.py; srt/metrics/ before 0.5.x)",
            {
                "request_duration": SourceSeries(
                    ("sglang:e2e_request_latency_seconds",),
                    note="labels model_name and engine_type (unified, prefill or decode); "
                    "earlier releases' documented example shows vLLM's buckets (0.3 ... 60 s)",
                ),
                "requests": SourceSeries(
                    (_SGLANG_RESPONSES,),
                    (_SGLANG_GENERATION,),
                    note="every answer of the generation endpoints, 4xx included, counted by "
                    "SGLang's HTTP middleware when the response starts (srt/observability/"
                    "http_request_metrics.py, 0.5.23, --enable-metrics): one per request. "
                    "sglang:num_requests_total is not used: it counts what the scheduler "
                    "finished, client aborts included, and no request refused before it",
                ),
                "errors": SourceSeries(
                    (_SGLANG_RESPONSES,),
                    (_SGLANG_GENERATION, 'status_code=~"5.."'),
                    "server errors (5xx) of the generation endpoints. "
                    "sglang:num_aborted_requests_total is not used: it counts the tokenizer "
                    "manager's abort_request, mostly clients that hung up, and no 500",
                ),
                "prompt_tokens": SourceSeries(("sglang:prompt_tokens_total",)),
                "generated_tokens": SourceSeries(("sglang:generation_tokens_total",)),
                "time_to_first_token": SourceSeries(("sglang:time_to_first_token_seconds",)),
            },
            labels={"model": "model_name", "region": "region"},
            buckets=_SGLANG_BUCKETS,
            missing={
                "p99_including_reroute": _NO_REROUTE,
                "errors_by_model": "sglang:http_responses_total has no model label: the "
                "availability SLO counts every model the server serves",
                "stream_failures": "a request that fails after its stream's 200 is counted as "
                "a 200 by the middleware, and SGLang labels no finished request with its "
                "finish reason: put redline's gateway in the path to count it",
            },
            saturation={
                # SGLang 0.5.23 srt/observability/metrics_collector.py, SchedulerMetricsCollector
                # (retracted requests: KV-cache pressure sends running requests back to the queue).
                "queue": SourceSeries(("sglang:num_queue_reqs",)),
                "running": SourceSeries(("sglang:num_running_reqs",)),
                "queue_time": SourceSeries(("sglang:queue_time_seconds",)),
                "kv_cache": SourceSeries(("sglang:token_usage",)),
                "preemptions": SourceSeries(("sglang:num_retracted_requests_total",)),
            },
        ),
        SourceProfile(
            "tgi",
            "Hugging Face Text Generation Inference",
            "https://huggingface.co/docs/text-generation-inference/reference/metrics "
            "(router/src/server.rs)",
            {
                "request_duration": SourceSeries(
                    ("tgi_request_duration",),
                    note="no labels: one TGI serves one model (set sources.model)",
                ),
                "requests": SourceSeries(
                    (_TGI_SUCCESS, _TGI_FAILURE),
                    note="every generation ends once, as a success or a failure (router/src/"
                    "server.rs, TGI 3.3); tgi_request_count is not used: /v1/chat/completions "
                    "increments it in chat_completions and again in generate_internal or "
                    "generate_stream_internal, a chat request twice. A /v1/completions call "
                    "with several prompts counts each prompt; TGI's counters carry no _total "
                    "suffix (metrics-exporter-prometheus)",
                ),
                "errors": SourceSeries(
                    (_TGI_FAILURE,),
                    ('err!~"validation|dropped"',),
                    "failures by kind (err: overloaded, generation, incomplete, "
                    "download_adapter, ...); validation (422) and dropped (the client hung up "
                    "before its batch) are the client's own and left out; a failure inside a "
                    "stream is counted here like any other",
                ),
                "prompt_tokens": SourceSeries(
                    ("tgi_request_input_length_sum",),
                    note="the sum of the input-length histogram",
                ),
                "generated_tokens": SourceSeries(
                    ("tgi_request_generated_tokens_sum",),
                    note="the sum of the generated-tokens histogram",
                ),
            },
            labels={"region": "region"},
            buckets=_TGI_BUCKETS,
            missing={
                "p99_including_reroute": _NO_REROUTE,
                "time_to_first_token": "TGI publishes no time-to-first-token histogram",
                "exact_latency_thresholds": "TGI's exponential buckets (0.0001 s x 1.5^i, "
                "i = 1..35) hold no round thresholds: slow requests are counted at the nearest "
                "bucket below",
                "kv_cache_saturation": "TGI publishes neither its KV-cache (block) usage nor "
                "preemptions: its saturation is read from the queue alone",
            },
            saturation={
                # TGI 3.3 backends/v3/src/queue.rs (tgi_queue_size, set after every next_batch)
                # and backends/v3/src/backend.rs (tgi_batch_current_size); the router records
                # tgi_request_queue_duration when a generation ends (router/src/server.rs).
                "queue": SourceSeries(("tgi_queue_size",)),
                "running": SourceSeries(("tgi_batch_current_size",)),
                "queue_time": SourceSeries(("tgi_request_queue_duration",)),
            },
        ),
        SourceProfile(
            "nim",
            "NVIDIA NIM for LLMs 1.x (unprefixed metrics at /v1/metrics)",
            "https://docs.nvidia.com/nim/large-language-models/latest/observability.html",
            {
                "request_duration": SourceSeries(("e2e_request_latency_seconds",)),
                "requests": SourceSeries(
                    ("request_success_total", "request_failure_total"),
                    note="successes (finish reason stop or length) + failures (any other)",
                ),
                "errors": SourceSeries(
                    ("request_failure_total",),
                    note="requests that finished for any reason but stop or length",
                ),
                "prompt_tokens": SourceSeries(("prompt_tokens_total",)),
                "generated_tokens": SourceSeries(("generation_tokens_total",)),
                "time_to_first_token": SourceSeries(("time_to_first_token_seconds",)),
            },
            labels={"model": "model_name", "region": "region"},
            buckets=_VLLM_BUCKETS,
            missing={
                "p99_including_reroute": _NO_REROUTE,
                "metric_names_of_nim_2x": "NIM for LLMs 2.x passes its backend's own metrics "
                "through unchanged (docs: reference/logging-and-observability): use the vllm "
                "(or sglang) profile there, with a scrape path of /v1/metrics",
                "documented_bucket_bounds": "NIM 1.x documents no bucket bounds: vLLM's are "
                "assumed; set sources.histogram_buckets to the le values your NIM exposes",
                "queue_time_and_preemptions": "NIM 1.x documents its queue and KV-cache gauges "
                "only: the saturation warning reads those two",
            },
            saturation={
                "queue": SourceSeries(("num_requests_waiting",)),
                "running": SourceSeries(("num_requests_running",)),
                "kv_cache": SourceSeries(("gpu_cache_usage_perc",)),
            },
        ),
        SourceProfile(
            "otel-genai",
            "OpenTelemetry GenAI semantic conventions (as Prometheus translates them)",
            "https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-metrics/",
            {
                "request_duration": SourceSeries(
                    ("gen_ai_client_operation_duration_seconds",),
                    note="gen_ai.client.operation.duration (unit s) with Prometheus' default "
                    "OTLP translation (dots to underscores, unit suffix added)",
                ),
                "requests": SourceSeries(("gen_ai_client_operation_duration_seconds_count",)),
                "errors": SourceSeries(
                    ("gen_ai_client_operation_duration_seconds_count",),
                    (f'error_type!~"|{"|".join(_OPENAI_CLIENT_ERRORS)}"',),
                    "operations that recorded an error.type (the exception's class: "
                    "InternalServerError for a 5xx, RateLimitError, APIConnectionError, "
                    "APITimeoutError ...) but the client's own (the OpenAI SDK's exceptions "
                    "for 400, 401, 403, 404, 409 and 422); a call the client cancels records no "
                    "error.type (CancelledError is not an Exception the instrumentation catches)",
                ),
                "prompt_tokens": SourceSeries(
                    ("gen_ai_client_token_usage_sum",), ('gen_ai_token_type="input"',)
                ),
                "generated_tokens": SourceSeries(
                    ("gen_ai_client_token_usage_sum",), ('gen_ai_token_type="output"',)
                ),
                "time_to_first_token": SourceSeries(
                    ("gen_ai_server_time_to_first_token_seconds",),
                    note="a model-server metric: only where the server emits it (a streaming "
                    "client's gen_ai.client.operation.time_to_first_chunk can be named in "
                    "sources.series.time_to_first_token instead)",
                ),
            },
            labels={"model": "gen_ai_request_model", "region": "region"},
            buckets=_OTEL_BUCKETS,
            missing={
                "p99_including_reroute": "the client span measures one operation; a client "
                "library's own retries across regions are only included if it records one "
                "operation around them",
                "exact_latency_thresholds": "OpenTelemetry's advisory buckets (0.01 x 2^i) hold "
                "no round thresholds: slow requests are counted at the nearest bucket below",
                "streamed_calls": "the OpenAI instrumentation (opentelemetry-instrumentation-"
                "openai-v2 2.4b0, patch.py) records a streamed call when it hands the stream "
                "back: its duration is the time to the response headers, not to the last token, "
                "with no token usage, and a failure later in the stream carries no error.type; "
                "streamed calls read fast, successful and tokenless: put redline's gateway in "
                "the path to measure them",
                "saturation": "a client-side convention: no queue, batch or KV-cache signal "
                "of the server, so no saturation warning",
            },
        ),
    )
}
"""Every built-in profile by name."""


@dataclass(frozen=True)
class ResolvedSources:
    """A profile with the spec's overrides applied: what the rules read for each signal."""

    profile: SourceProfile

    @property
    def name(self) -> str:
        """The profile's name."""
        return self.profile.name

    @property
    def mirrored(self) -> bool:
        """True when the rules map engine series onto the canonical ones."""
        return self.profile.mirrored

    @property
    def buckets(self) -> tuple[float, ...]:
        """The latency histogram's bucket bounds."""
        return self.profile.buckets

    def series(self, signal: str) -> SourceSeries | None:
        """The series standing for `signal`, None where this stack has none."""
        return self.profile.series.get(signal)

    def read_name(self, signal: str) -> str | None:
        """The source's own series for `signal` (its first name: histogram signals give the
        base name, `_bucket`/`_count`/`_sum` appended); None where the stack has none. The
        rules read it through `redline.rules.signals`, which maps an engine's labels."""
        found = self.series(signal)
        return None if found is None else found.names[0]

    def required_name(self, signal: str) -> str:
        """`read_name` of a signal every profile provides (latency, requests, errors)."""
        name = self.read_name(signal)
        if name is None:
            raise SourceProfileError(f"sources.series.{signal}: the {self.name} profile has none")
        return name

    def record_base(self) -> str:
        """The histogram name recorded series are named after: the canonical one whatever the
        engine, or the gateway's own histogram where it was renamed."""
        if self.mirrored:
            return catalog.LLM_REQUEST_DURATION_SECONDS.name
        return self.required_name("request_duration")

    def slow_bucket(self, threshold: float) -> float | None:
        """The bucket bound counting requests slower than `threshold`: the threshold itself when
        it is a bucket, else (engine profiles, whose buckets the user cannot choose) the nearest
        bound below it, which counts a little more as slow, never less; None when no bound is
        at or below it."""
        if threshold in self.buckets:
            return threshold
        below = [bound for bound in self.buckets if bound < threshold]
        if not self.mirrored or not below:
            return None
        return max(below)

    def version_from_registry(self) -> bool:
        """True when `model_version` is joined from the snapshot registry's active version."""
        return self.mirrored and "model_version" not in self.profile.labels


def resolve_sources(
    profile: str,
    *,
    series: Mapping[str, SourceSeries] | None = None,
    labels: Mapping[str, str] | None = None,
    model: str | None = None,
    buckets: tuple[float, ...] | None = None,
) -> ResolvedSources:
    """`profile` with overrides applied; SourceProfileError names the field and allowed values."""
    if profile not in PROFILES:
        raise SourceProfileError(
            f"sources.profile: unknown profile {profile!r}; allowed: {', '.join(PROFILE_NAMES)}"
        )
    base = PROFILES[profile]
    for signal in series or {}:
        if signal not in SIGNAL_NAMES:
            raise SourceProfileError(
                f"sources.series.{signal}: unknown signal; allowed: {', '.join(SIGNAL_NAMES)}"
            )
    for label in labels or {}:
        if not base.mirrored:
            raise SourceProfileError(
                f"sources.labels.{label}: the redline-gateway profile writes the catalog's "
                "labels itself and maps none; label overrides apply to engine profiles "
                f"({', '.join(p for p in PROFILE_NAMES if p != 'redline-gateway')})"
            )
        if label not in MAPPABLE_LABELS:
            raise SourceProfileError(
                f"sources.labels.{label}: the {profile} profile cannot map a catalog label "
                f"{label!r}; allowed: {', '.join(MAPPABLE_LABELS)}"
            )
    if model is not None and not base.mirrored:
        raise SourceProfileError(
            "sources.model: the redline-gateway profile labels every request with its model; "
            "a constant model applies to engine profiles"
        )
    merged_labels = {**base.labels, **(labels or {})}
    if model is not None:
        merged_labels.pop("model", None)
    resolved = replace(
        base,
        series={**base.series, **(series or {})},
        labels=merged_labels,
        model=model if model is not None else base.model,
        buckets=tuple(buckets) if buckets else base.buckets,
    )
    if resolved.mirrored and "model" not in resolved.labels and resolved.model is None:
        raise SourceProfileError(
            f"sources.model: the {profile} profile's series carry no model label; set "
            "sources.model to the model it serves, or sources.labels.model to the target "
            "label that carries it"
        )
    return ResolvedSources(resolved)


def _cell(text: str) -> str:
    """Markdown table cell text (a `|` in a regex matcher must not end the cell)."""
    return text.replace("|", "\\|")


def _series_cell(found: SourceSeries | None) -> str:
    if found is None:
        return "–"
    return _cell(" + ".join(f"`{found.selector(name)}`" for name in found.names))


def _labels_cell(profile: SourceProfile) -> str:
    if not profile.mirrored:
        return "the catalog's own (the gateway writes them)"
    parts = [f"`{label}` ← `{engine}`" for label, engine in profile.labels.items()]
    if profile.model is not None:
        parts.append(f"`model` = `{profile.model}`")
    elif "model" not in profile.labels:
        parts.append("`model` = `sources.model`")
    if "model_version" not in profile.labels:
        parts.append(f"`model_version` ← the snapshot registry (`{catalog.MODEL_ACTIVE_INFO}`)")
    return "; ".join(parts)


def _available(yes: bool, note: str = "") -> str:
    return ("✓" + (f" ({note})" if note else "")) if yes else "–"


def render_profiles_markdown() -> str:
    """Every built-in profile as Markdown: what each red line and signal gets from it, its
    series and labels, and what it cannot provide (the table in docs/spec-and-rules.md)."""
    lines = [
        "| profile | latency red line | P99 incl. reroute | latency SLO | availability SLO "
        "| two-signal gate | tokens/s | TTFT P99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for profile in PROFILES.values():
        has = profile.series
        exact = "exact_latency_thresholds" not in profile.missing
        version = "version joined from the registry" if profile.mirrored else ""
        tokens = "prompt_tokens" in has and "generated_tokens" in has
        cells = [
            f"`{profile.name}`",
            _available("request_duration" in has),
            _available(profile.includes_reroute),
            _available("request_duration" in has, "" if exact else "nearest bucket below"),
            _available("requests" in has and "errors" in has),
            _available("request_duration" in has, version),
            _available(tokens),
            _available("time_to_first_token" in has),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| profile | latency histogram | requests | errors | prompt tokens | generated tokens "
        "| TTFT histogram | labels |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for profile in PROFILES.values():
        cells = [f"`{profile.name}`"]
        cells += [_series_cell(profile.series.get(signal)) for signal in SIGNAL_NAMES]
        cells.append(_labels_cell(profile))
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Saturation signals (`{Alert.ENGINE_SATURATION_RISING}`, a ticket before the latency "
        "red line; redline's gateway sees no engine queue):",
        "",
        "| profile | " + " | ".join(name.replace("_", " ") for name in SATURATION_NAMES) + " |",
        "|---|" + "---|" * len(SATURATION_NAMES),
    ]
    for profile in PROFILES.values():
        cells = [f"`{profile.name}`"]
        cells += [_series_cell(profile.saturation.get(name)) for name in SATURATION_NAMES]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Not available, per profile:", ""]
    for profile in PROFILES.values():
        gaps = [f"{key.replace('_', ' ')}: {reason}" for key, reason in profile.missing.items()]
        lines.append(f"- `{profile.name}`: " + ("; ".join(gaps) if gaps else "nothing missing"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_profiles_markdown(), end="")
