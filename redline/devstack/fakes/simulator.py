"""An OpenAI-compatible upstream simulator (one region of a serving fleet) with fault knobs.

It behaves like vLLM on the wire: real HTTP, real SSE (`chat.completion.chunk` events ending in
`data: [DONE]`, `stream_options.include_usage` honoured), `/v1/models`, and vLLM's runtime LoRA
API (`POST /v1/load_lora_adapter {"lora_name", "lora_path"[, "load_inplace"]}` and
`POST /v1/unload_lora_adapter {"lora_name"}`, answering 200 with a plain-text `Success: ...`, or
vLLM's JSON error with 400 (bad input, adapter already loaded) or 404 (no adapter at the path,
adapter not loaded)).

Conventions:

- A request for `model=<lora_name>` is served by that adapter; `model=<base_model>` by the base.
- An adapter's *version* is the first line of a `version` file inside its `lora_path` when there
  is one, else the path's last component (`/snapshots/chat-lora/v7` -> `v7`). The base model's
  version is a setting. Every completion carries it in the `x-redline-model-version` header.
- Tokens are whitespace-separated words: `usage.prompt_tokens` counts the words of every message,
  `usage.completion_tokens` the words of the answer, and a stream carries exactly one word per
  content chunk, so a proxy can check its counters against `usage`.
- Golden prompts (`redline.platform.golden`) get their reference answer; with an accuracy fault on
  the serving version they get the item's wrong answer with the configured probability. Other
  prompts get `max_tokens` deterministic filler words.
- `?dry-run=true` validates the request (model, body) and answers at once without generating;
  outage and error faults and the region's added latency still apply (it is a health probe).
- Assistant prefill as in vLLM: with `continue_final_message: true` (and `add_generation_prompt:
  false`; both true is a 400) the last message must be the assistant's, and the answer continues
  it: the words after the prefix's, as if the whole answer had been generated in one go, so a
  stream interrupted and resumed elsewhere joins up with what an uninterrupted one would say.
- Each process is one instance: answers carry its id in `x-redline-instance`, so a readiness gate
  can tell a replacement from the node it replaces. `load_seconds` simulates loading the model
  after start: until then `/v1/models` lists nothing and completions answer 503.
- `/admin/stats` counts completions per `x-request-id` (the last 10 000 ids), so a test can prove
  a request ran once.
- With `metrics_profile` set (`vllm`: `redline up --source vllm`), `/metrics` is the engine's own
  exposition (`redline.devstack.fakes.engines`) of the chat requests served, labelled with the
  model each named (the adapter for a LoRA request): latency from arrival to the last byte
  (a stream's end), time to first token, tokens, status; a stream the client abandons is an
  abort. Dry runs and requests refused by an outage count nowhere.

Fault knobs (`GET`/`POST /admin/faults`, the `Faults` model; a POST replaces every knob, 422 on
bad input): added latency (base + uniform or lognormal jitter), error rate and status, outage
(`unavailable`: 503 on every route but `/admin`; `hang`: requests hang until the client gives up
or the outage is lifted), first-byte delay, generation speed in tokens/s, and per model version an
added latency and a wrong-answer probability. One simulator is one region, so "per region"
knobs are set on each region's simulator.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Re-exported: tests and benchmarks serve the simulator with these under this module's name.
from redline.core.servers import ServerThread as ServerThread
from redline.core.servers import serve_in_thread as serve_in_thread
from redline.core.settings import ServiceSettings
from redline.devstack.fakes.engines import ABORTED, ENGINE_PROFILES, EngineMetrics
from redline.platform.golden import MODEL_VERSION_HEADER, find_golden

REGION_HEADER = "x-redline-region"
INSTANCE_HEADER = "x-redline-instance"
DEFAULT_SIMULATOR_PORT = 8000
M = TypeVar("M", bound=BaseModel)
_VERSION = re.compile(r"^[\x21-\x7e]{1,128}$")
_FILLER = (
    "the model answers with tokens that stand for generated text in this simulated upstream "
    "region while latency errors and accuracy follow the configured fault knobs"
).split()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LatencyDistribution(_Strict):
    """Added latency: `base_seconds` plus jitter drawn from the chosen distribution."""

    base_seconds: float = Field(0.0, ge=0, le=600, description="Constant added latency.")
    jitter: Literal["none", "uniform", "lognormal"] = Field(
        "none", description="none; uniform: U(0, jitter_seconds); lognormal: median jitter_seconds."
    )
    jitter_seconds: float = Field(0.0, ge=0, le=600, description="Scale of the jitter.")
    sigma: float = Field(0.5, gt=0, le=5, description="Shape of the lognormal jitter.")

    def sample(self, rng: random.Random) -> float:
        """One draw of the added latency in seconds (capped at 600 s)."""
        if self.jitter == "uniform":
            jitter = rng.uniform(0.0, self.jitter_seconds)
        elif self.jitter == "lognormal" and self.jitter_seconds > 0:
            jitter = rng.lognormvariate(math.log(self.jitter_seconds), self.sigma)
        else:
            jitter = 0.0
        return min(600.0, self.base_seconds + jitter)


class VersionFaults(_Strict):
    """Faults of one model version (an adapter version, or the base model's version)."""

    wrong_answer_probability: float = Field(
        0.0, ge=0, le=1, description="Chance that a golden prompt gets a wrong answer."
    )
    latency: LatencyDistribution = Field(
        default_factory=LatencyDistribution, description="Latency added on top of the region's."
    )


class Faults(_Strict):
    """Every fault knob of one simulated region; the defaults inject nothing."""

    latency: LatencyDistribution = Field(
        default_factory=LatencyDistribution, description="Latency added to every request."
    )
    error_rate: float = Field(0.0, ge=0, le=1, description="Share of requests answered with 5xx.")
    error_status: int = Field(500, ge=500, le=599, description="Status of injected errors.")
    outage: Literal["none", "unavailable", "hang"] = Field(
        "none", description="unavailable: 503 everywhere; hang: no answer until the client quits."
    )
    hang_max_seconds: float = Field(300, gt=0, le=3600, description="Longest a hang lasts.")
    first_byte_delay_seconds: float = Field(
        0.0, ge=0, le=600, description="Extra wait before the response's first byte."
    )
    tokens_per_second: float | None = Field(
        None, gt=0, le=1_000_000, description="Generation speed; None generates instantly."
    )
    versions: dict[str, VersionFaults] = Field(
        default_factory=dict, description="Faults per model version (x-redline-model-version)."
    )

    @field_validator("versions")
    @classmethod
    def _version_names(cls, value: dict[str, VersionFaults]) -> dict[str, VersionFaults]:
        for version in value:
            if not _VERSION.match(version):
                raise ValueError(f"version {version!r} must be 1-128 visible ASCII characters")
        return value


class SimulatorSettings(ServiceSettings):
    """Settings of `redline simulate upstream`."""

    region: str = Field("primary", pattern=r"^[a-z][a-z0-9-]*$", description="Region served.")
    base_model: str = Field("redline-base", min_length=1, description="Base model's name.")
    base_model_version: str = Field("base", pattern=_VERSION.pattern, description="Its version.")
    adapters: dict[str, str] = Field(
        default_factory=dict, description="LoRA adapters loaded at start: name -> path."
    )
    default_max_tokens: int = Field(16, ge=1, le=4096, description="max_tokens when unset.")
    max_model_len: int = Field(4096, ge=1, description="Largest max_tokens accepted.")
    seed: int | None = Field(None, description="Seed of the fault dice (None: random).")
    faults: Faults = Field(default_factory=Faults, description="Faults active at start.")
    load_seconds: float = Field(
        0.0, ge=0, le=3600, description="Time after start until the model is loaded."
    )
    metrics_profile: str | None = Field(
        None,
        description="Publish this engine's exposition on /metrics for the requests served "
        "(an engine source profile, e.g. vllm); None: no /metrics.",
    )

    @field_validator("metrics_profile")
    @classmethod
    def _engine_profile(cls, value: str | None) -> str | None:
        if value is not None and value not in ENGINE_PROFILES:
            allowed = ", ".join(ENGINE_PROFILES)
            raise ValueError(f"{value!r} is not an engine profile; allowed: {allowed}")
        return value


class SimulatorError(Exception):
    """The simulator cannot start (e.g. a configured adapter path does not exist)."""


@dataclass(frozen=True)
class ServedModel:
    """A model the simulator serves: the base model or a loaded LoRA adapter."""

    name: str
    version: str
    path: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))


class _AdapterError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


def adapter_version(lora_path: str) -> str:
    """The version of the adapter at `lora_path`: its `version` file, else the last component."""
    path = Path(lora_path)
    version_file = path / "version"
    if version_file.is_file():
        lines = version_file.read_text("utf-8", errors="replace").strip().splitlines()
        if lines and lines[0].strip():
            return lines[0].strip()
    return path.name or str(path)


def _load_adapter(name: str, lora_path: str) -> ServedModel:
    if not name or not lora_path:
        raise _AdapterError(
            400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."
        )
    if not Path(lora_path).is_dir():
        raise _AdapterError(404, "NotFoundError", f"No adapter found for {lora_path}")
    version = adapter_version(lora_path)
    if not _VERSION.match(version):
        raise _AdapterError(
            400,
            "InvalidUserInput",
            f"adapter version {version!r} (from {lora_path}) must be 1-128 visible ASCII "
            "characters",
        )
    return ServedModel(name=name, version=version, path=lora_path)


class _ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[_ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if self.content is None:
            return ""
        return " ".join(part.text or "" for part in self.content if part.type == "text")


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields of an OpenAI chat-completions request the simulator uses (others are accepted)."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    messages: list[_Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: _StreamOptions | None = None
    n: int = Field(1, ge=1, le=1)
    continue_final_message: bool = False
    add_generation_prompt: bool = True


class _LoadRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    lora_name: str = ""
    lora_path: str = ""
    load_inplace: bool = False


class _UnloadRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    lora_name: str = ""
    lora_int_id: int | None = None


def count_tokens(text: str) -> int:
    """The simulator's tokens: whitespace-separated words."""
    return len(text.split())


def build_answer(
    prompt: str, model: str, max_tokens: int, wrong: bool
) -> tuple[list[str], Literal["stop", "length"]]:
    """The answer's tokens and finish reason: golden reference (or wrong) answer, else filler."""
    item = find_golden(prompt)
    if item is not None:
        words = (item.wrong if wrong else item.reference).split()
        if len(words) > max_tokens:
            return words[:max_tokens], "length"
        return words, "stop"
    seed = int.from_bytes(hashlib.blake2b(f"{model}\0{prompt}".encode(), digest_size=8).digest())
    rng = random.Random(seed)
    return [rng.choice(_FILLER) for _ in range(max_tokens)], "length"


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """vLLM's (and OpenAI's) error body."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def _problems(exc: ValidationError | RequestValidationError) -> list[str]:
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ())) or "body"
        got = error.get("input")
        shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
        lines.append(f"{where}: {error.get('msg', 'invalid')}{shown}")
    return lines


def merge_families(families: Iterable[Metric]) -> list[Metric]:
    """Families of several registries as one page: a series in more than one (the API server's,
    which carry no model label) is added up (counters, histograms), its largest value kept
    (gauges) or its earliest creation time (`_created`)."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for family in families:
        if family.name not in merged:
            merged[family.name] = Metric(
                family.name, family.documentation, family.type, family.unit
            )
            values[family.name] = {}
        slots = values[family.name]
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            seen = slots.get(key)
            if seen is None:
                slots[key] = sample.value
            elif sample.name.endswith("_created"):
                slots[key] = min(seen, sample.value)
            elif family.type in ("counter", "histogram", "summary"):
                slots[key] = seen + sample.value
            else:
                slots[key] = max(seen, sample.value)
    for name, family in merged.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    return list(merged.values())


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class EngineExposition:
    """The engine's own `/metrics` of one simulator (`metrics_profile`): vLLM labels its series
    with the model a request was served by, so there is an `EngineMetrics` per served model
    name (the base model, each adapter), rendered as one page."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        self.models: dict[str, EngineMetrics] = {}
        self._lock = threading.Lock()

    def add_model(self, model: str, lora: bool = False) -> EngineMetrics:
        """The series of `model` (created on first use, so they show before any request)."""
        with self._lock:
            found = self.models.get(model)
            if found is None:
                adapters = (model,) if lora else ()
                found = EngineMetrics(self.profile, model=model, lora_adapters=adapters)
                self.models[model] = found
            return found

    def observe(
        self,
        model: str,
        latency: float,
        status: int,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        ttft: float | None = None,
    ) -> None:
        """Record one request the engine answered (`status` as the client saw it; 499: the
        client went away mid-stream)."""
        self.add_model(model).observe(
            max(latency, 0.0),
            status=status,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            ttft_seconds=None if ttft is None else min(max(ttft, 0.0), max(latency, 0.0)),
        )

    def render(self) -> bytes:
        """The text exposition (format 0.0.4)."""
        with self._lock:
            engines = list(self.models.values())
        if len(engines) == 1:
            return engines[0].render()
        registry = CollectorRegistry(auto_describe=False)
        families = [family for engine in engines for family in engine.registry.collect()]
        registry.register(_Families(merge_families(families)))
        return generate_latest(registry)


@dataclass
class SimulatorState:
    """Mutable state of one simulator app: faults, loaded adapters, counters, the dice."""

    settings: SimulatorSettings
    faults: Faults
    rng: random.Random
    base: ServedModel
    adapters: dict[str, ServedModel] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    request_ids: dict[str, int] = field(default_factory=dict)
    instance: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    loaded_at: float = 0.0
    engine: EngineExposition | None = None

    def loaded(self) -> bool:
        """True once the model has finished loading."""
        return time.monotonic() >= self.loaded_at

    def count_request(self, request_id: str | None) -> None:
        """Count a completion of `request_id` (bounded: the oldest ids are forgotten)."""
        if not request_id:
            return
        self.request_ids[request_id] = self.request_ids.get(request_id, 0) + 1
        while len(self.request_ids) > 10_000:
            del self.request_ids[next(iter(self.request_ids))]

    def resolve(self, model: str) -> ServedModel | None:
        """The served model a request's `model` names, or None."""
        if model == self.base.name:
            return self.base
        return self.adapters.get(model)

    def version_faults(self, version: str) -> VersionFaults | None:
        """Faults configured for a model version."""
        return self.faults.versions.get(version)


def build_simulator_app(settings: SimulatorSettings) -> FastAPI:
    """The simulator's ASGI app, with its own state (one app per simulated region)."""
    state = SimulatorState(
        settings=settings,
        faults=settings.faults,
        rng=random.Random(settings.seed),
        base=ServedModel(settings.base_model, settings.base_model_version),
        loaded_at=time.monotonic() + settings.load_seconds,
    )
    for name, path in settings.adapters.items():
        try:
            state.adapters[name] = _load_adapter(name, path)
        except _AdapterError as exc:
            raise SimulatorError(f"adapters.{name}: {exc.message}") from None
    if settings.metrics_profile is not None:
        state.engine = EngineExposition(settings.metrics_profile)
        state.engine.add_model(state.base.name)
        for name in state.adapters:
            state.engine.add_model(name, lora=True)

    app = FastAPI(title=f"redline upstream simulator ({settings.region})", docs_url=None)
    app.state.simulator = state

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = _problems(exc)
        return JSONResponse(
            {"detail": f"invalid {request.url.path}: " + "; ".join(problems), "problems": problems},
            status_code=422,
        )

    def headers(served: ServedModel | None = None) -> dict[str, str]:
        out = {REGION_HEADER: settings.region, INSTANCE_HEADER: state.instance}
        if served is not None:
            out[MODEL_VERSION_HEADER] = served.version
        return out

    async def outage(request: Request) -> Response | None:
        """The outage's answer, or None when the region is up."""
        mode = state.faults.outage
        if mode == "none":
            return None
        state.counts["outage"] += 1
        if mode == "hang":
            deadline = time.monotonic() + state.faults.hang_max_seconds
            while state.faults.outage == "hang" and time.monotonic() < deadline:
                if await request.is_disconnected():
                    break
                await asyncio.sleep(0.05)
        return _error(503, f"region {settings.region} is unavailable", "ServiceUnavailableError")

    @app.get("/healthz")
    async def healthz(request: Request) -> Response:
        down = await outage(request)
        if down is not None:
            return down
        return JSONResponse({"status": "ok", "region": settings.region}, headers=headers())

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if state.engine is None:
            return _error(404, "no metrics_profile: this simulator publishes no /metrics",
                          "NotFoundError")  # fmt: skip
        down = await outage(request)  # a region that is down has no /metrics either
        if down is not None:
            return down
        return Response(state.engine.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        down = await outage(request)
        if down is not None:
            return down
        cards = []
        if state.loaded():  # a model still loading is not listed yet
            cards = [_card(state.base, None, settings.max_model_len)]
            cards += [_card(a, state.base.name, None) for a in state.adapters.values()]
        return JSONResponse({"object": "list", "data": cards}, headers=headers())

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        down = await outage(request)
        if down is not None:
            return down
        parsed = await _parse(request, _LoadRequest)
        if isinstance(parsed, Response):
            return parsed
        if parsed.lora_name in state.adapters and not parsed.load_inplace:
            return _error(
                400,
                f"The lora adapter '{parsed.lora_name}' has already been loaded.",
                "InvalidUserInput",
            )
        if parsed.lora_name == state.base.name:
            return _error(400, f"'{parsed.lora_name}' is the base model", "InvalidUserInput")
        try:
            state.adapters[parsed.lora_name] = _load_adapter(parsed.lora_name, parsed.lora_path)
        except _AdapterError as exc:
            return _error(exc.status, exc.message, exc.kind)
        if state.engine is not None:
            state.engine.add_model(parsed.lora_name, lora=True)
        return PlainTextResponse(
            f"Success: LoRA adapter '{parsed.lora_name}' added successfully.", headers=headers()
        )

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        down = await outage(request)
        if down is not None:
            return down
        parsed = await _parse(request, _UnloadRequest)
        if isinstance(parsed, Response):
            return parsed
        if not parsed.lora_name:
            return _error(
                400,
                "either 'lora_name' and 'lora_int_id' needs to be provided.",
                "InvalidUserInput",
            )
        if state.adapters.pop(parsed.lora_name, None) is None:
            return _error(
                404, f"The lora adapter '{parsed.lora_name}' cannot be found.", "NotFoundError"
            )
        return PlainTextResponse(
            f"Success: LoRA adapter '{parsed.lora_name}' removed successfully.", headers=headers()
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        started = time.monotonic()
        down = await outage(request)
        if down is not None:
            return down  # the engine is down: it sees (and counts) nothing
        seen = _Seen(state.base.name, started)
        response = await complete(request, seen)
        if state.engine is not None and not seen.dry_run and not seen.streaming:
            seen.record(state.engine, response.status_code)
        return response

    async def complete(request: Request, seen: _Seen) -> Response:
        parsed = await _parse(request, ChatRequest)
        if isinstance(parsed, Response):
            return parsed
        if parsed.stream_options is not None and not parsed.stream:
            return _error(
                400, "Stream options can only be defined when `stream=True`.", "BadRequestError"
            )
        if parsed.continue_final_message and parsed.add_generation_prompt:
            return _error(
                400,
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                "BadRequestError",
            )
        if parsed.continue_final_message and parsed.messages[-1].role != "assistant":
            return _error(
                400,
                "`continue_final_message` needs the final message to be the assistant's.",
                "BadRequestError",
            )
        if not state.loaded():
            return _error(503, "the model is still loading", "ServiceUnavailableError")
        served = state.resolve(parsed.model)
        if served is None:
            return _error(
                404, f"The model `{parsed.model}` does not exist.", "NotFoundError", "model"
            )
        seen.model = served.name
        max_tokens = parsed.max_completion_tokens or parsed.max_tokens
        max_tokens = max_tokens or settings.default_max_tokens
        if max_tokens > settings.max_model_len:
            return _error(
                400,
                f"max_tokens={max_tokens} exceeds the model's maximum of {settings.max_model_len}",
                "BadRequestError",
                "max_tokens",
            )
        faults = state.faults
        version_faults = state.version_faults(served.version)
        delay = faults.latency.sample(state.rng)
        dry_run = request.query_params.get("dry-run", "").lower() in ("1", "true", "yes")
        if not dry_run and version_faults is not None:
            delay += version_faults.latency.sample(state.rng)
        if delay > 0:
            await asyncio.sleep(delay)
        if faults.error_rate > 0 and state.rng.random() < faults.error_rate:
            state.counts["errors"] += 1
            return _error(faults.error_status, "injected fault", "InternalServerError")
        prompt_tokens = sum(count_tokens(m.text()) for m in parsed.messages)
        if dry_run:
            # Not a vLLM request (a health probe of this simulator): no engine series count it.
            seen.dry_run = True
            state.counts["dry_runs"] += 1
            body = {
                "object": "chat.completion.dry_run",
                "model": parsed.model,
                "model_version": served.version,
                "region": settings.region,
                "prompt_tokens": prompt_tokens,
                "max_tokens": max_tokens,
                "valid": True,
            }
            return JSONResponse(body, headers=headers(served))
        wrong = bool(
            version_faults is not None
            and version_faults.wrong_answer_probability > 0
            and state.rng.random() < version_faults.wrong_answer_probability
        )
        prefix = parsed.messages[-1].text() if parsed.continue_final_message else ""
        asked = [m for m in parsed.messages if m.role != "assistant"] or parsed.messages
        prompt = asked[-1].text() if prefix else parsed.messages[-1].text()
        skip = count_tokens(prefix)
        tokens, finish = build_answer(prompt, parsed.model, skip + max_tokens, wrong)
        tokens = tokens[skip:]
        joiner = " " if prefix and not prefix[-1].isspace() else ""
        state.counts["completions"] += 1
        state.count_request(request.headers.get("x-request-id"))
        state.counts[f"version:{served.version}"] += 1
        if faults.first_byte_delay_seconds > 0:
            await asyncio.sleep(faults.first_byte_delay_seconds)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(tokens),
            "total_tokens": prompt_tokens + len(tokens),
        }
        seen.prompt_tokens, seen.completion_tokens = prompt_tokens, len(tokens)
        if parsed.stream:
            include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)
            events: AsyncGenerator[bytes, None] = _stream(
                completion_id,
                created,
                parsed.model,
                tokens,
                finish,
                usage if include_usage else None,
                faults.tokens_per_second,
                joiner,
            )
            if state.engine is not None:
                seen.streaming = True
                events = _observed(events, seen, state.engine)
            return StreamingResponse(
                events,
                media_type="text/event-stream",
                headers={**headers(served), "cache-control": "no-cache"},
            )
        if faults.tokens_per_second is not None and tokens:
            seen.first_token_at = time.monotonic() + 1 / faults.tokens_per_second
            await asyncio.sleep(len(tokens) / faults.tokens_per_second)
        else:
            seen.first_token_at = time.monotonic()
        body = {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": parsed.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": joiner + " ".join(tokens)},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": usage,
        }
        return JSONResponse(body, headers=headers(served))

    @app.get("/admin/faults")
    async def get_faults() -> Faults:
        return state.faults

    @app.post("/admin/faults")
    async def set_faults(faults: Faults) -> Faults:
        state.faults = faults
        return state.faults

    @app.get("/admin/stats")
    async def stats() -> dict[str, Any]:
        return {
            "region": settings.region,
            "instance": state.instance,
            "request_ids": dict(state.request_ids),
            "counts": dict(state.counts),
            "adapters": {
                a.name: {"version": a.version, "path": a.path} for a in state.adapters.values()
            },
        }

    return app


@dataclass
class _Seen:
    """What the engine's series record of one chat request."""

    model: str
    started: float
    dry_run: bool = False
    streaming: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None

    def record(self, engine: EngineExposition, status: int) -> None:
        """Count the request, its latency measured until now."""
        now = time.monotonic()
        first = self.first_token_at
        engine.observe(
            self.model,
            now - self.started,
            status,
            self.prompt_tokens,
            self.completion_tokens,
            None if first is None else first - self.started,
        )


async def _observed(
    events: AsyncGenerator[bytes, None], seen: _Seen, engine: EngineExposition
) -> AsyncGenerator[bytes, None]:
    """The stream, counted once it ends: its first content chunk is the first token; a client
    that goes away before `[DONE]` is an abort (499)."""
    status = ABORTED
    try:
        index = 0
        async for chunk in events:
            if index == 1:  # the first chunk only carries the assistant role
                seen.first_token_at = time.monotonic()
            index += 1
            yield chunk
        status = 200
    finally:
        seen.record(engine, status)


def _card(model: ServedModel, parent: str | None, max_model_len: int | None) -> dict[str, Any]:
    return {
        "id": model.name,
        "object": "model",
        "created": model.created,
        "owned_by": "redline",
        "root": model.path or model.name,
        "parent": parent,
        "max_model_len": max_model_len,
        "permission": [],
    }


async def _parse(request: Request, model: type[M]) -> M | Response:
    try:
        raw = await request.body()
        data = json.loads(raw)
    except ValueError as exc:
        return _error(400, f"request body is not valid JSON: {exc}", "BadRequestError")
    if not isinstance(data, dict):
        return _error(400, "request body must be a JSON object", "BadRequestError")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        return _error(400, "; ".join(_problems(exc)), "BadRequestError")


def _chunk(
    completion_id: str,
    created: int,
    model: str,
    delta: dict[str, str],
    finish: str | None,
    with_usage: bool,
) -> bytes:
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if with_usage:
        body["usage"] = None  # OpenAI: every chunk but the last carries a null usage
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def _stream(
    completion_id: str,
    created: int,
    model: str,
    tokens: list[str],
    finish: str,
    usage: dict[str, int] | None,
    tokens_per_second: float | None,
    joiner: str = "",
) -> AsyncGenerator[bytes, None]:
    with_usage = usage is not None
    yield _chunk(
        completion_id, created, model, {"role": "assistant", "content": ""}, None, with_usage
    )
    started = time.monotonic()
    for index, token in enumerate(tokens):
        if tokens_per_second is not None:
            # Pace against the start so per-token sleep overheads do not add up.
            wait = started + (index + 1) / tokens_per_second - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        text = joiner + token if index == 0 else f" {token}"
        yield _chunk(completion_id, created, model, {"content": text}, None, with_usage)
    yield _chunk(completion_id, created, model, {}, finish, with_usage)
    if usage is not None:
        final = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }
        yield b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"
