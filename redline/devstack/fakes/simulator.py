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
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from pydantic import Field, field_validator

# Re-exported: tests and benchmarks serve the simulator with these under this module's name.
from redline.core.servers import ServerThread as ServerThread
from redline.core.servers import serve_in_thread as serve_in_thread
from redline.core.settings import ServiceSettings
from redline.devstack.fakes.batch import Batch
from redline.devstack.fakes.engines import ENGINE_PROFILES
from redline.devstack.fakes.faults import VERSION, Faults, VersionFaults
from redline.devstack.fakes.lora import AdapterError, ServedModel, load_adapter
from redline.devstack.fakes.simulator_metrics import ChatSeen, EngineExposition, observed
from redline.devstack.fakes.wire import (
    ChatRequest,
    LoadRequest,
    UnloadRequest,
    error_response,
    model_card,
    parse_body,
    problems,
    stream_chunks,
)
from redline.platform.golden import MODEL_VERSION_HEADER, find_golden

REGION_HEADER = "x-redline-region"
INSTANCE_HEADER = "x-redline-instance"
DEFAULT_SIMULATOR_PORT = 8000
_FILLER = (
    "the model answers with tokens that stand for generated text in this simulated upstream "
    "region while latency errors and accuracy follow the configured fault knobs"
).split()


class SimulatorSettings(ServiceSettings):
    """Settings of `redline simulate upstream`."""

    region: str = Field("primary", pattern=r"^[a-z][a-z0-9-]*$", description="Region served.")
    base_model: str = Field("redline-base", min_length=1, description="Base model's name.")
    base_model_version: str = Field("base", pattern=VERSION.pattern, description="Its version.")
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
    batch: Batch = field(default_factory=Batch)

    def __post_init__(self) -> None:
        self.batch.on_change = self._batch_changed
        self.batch.set_limit(self.faults.max_concurrency)

    def _batch_changed(self, waiting: int, running: int, limit: int | None) -> None:
        if self.engine is not None:
            self.engine.set_saturation(self.base.name, waiting, running, limit)

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
            state.adapters[name] = load_adapter(name, path)
        except AdapterError as exc:
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
        found = problems(exc)
        return JSONResponse(
            {"detail": f"invalid {request.url.path}: " + "; ".join(found), "problems": found},
            status_code=422,
        )

    _add_serving_routes(app, state)
    _add_lora_routes(app, state)
    _add_chat_routes(app, state)
    _add_admin_routes(app, state)
    return app


def _headers(state: SimulatorState, served: ServedModel | None = None) -> dict[str, str]:
    out = {REGION_HEADER: state.settings.region, INSTANCE_HEADER: state.instance}
    if served is not None:
        out[MODEL_VERSION_HEADER] = served.version
    return out


async def _outage(state: SimulatorState, request: Request) -> Response | None:
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
    region = state.settings.region
    return error_response(503, f"region {region} is unavailable", "ServiceUnavailableError")


def _add_serving_routes(app: FastAPI, state: SimulatorState) -> None:
    settings = state.settings

    @app.get("/healthz")
    async def healthz(request: Request) -> Response:
        down = await _outage(state, request)
        if down is not None:
            return down
        return JSONResponse({"status": "ok", "region": settings.region}, headers=_headers(state))

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if state.engine is None:
            return error_response(404, "no metrics_profile: this simulator publishes no /metrics",
                                  "NotFoundError")  # fmt: skip
        down = await _outage(state, request)  # a region that is down has no /metrics either
        if down is not None:
            return down
        return Response(state.engine.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        down = await _outage(state, request)
        if down is not None:
            return down
        cards = []
        if state.loaded():  # a model still loading is not listed yet
            cards = [model_card(state.base, None, settings.max_model_len)]
            cards += [model_card(a, state.base.name, None) for a in state.adapters.values()]
        return JSONResponse({"object": "list", "data": cards}, headers=_headers(state))


def _add_lora_routes(app: FastAPI, state: SimulatorState) -> None:
    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        down = await _outage(state, request)
        if down is not None:
            return down
        parsed = await parse_body(request, LoadRequest)
        if isinstance(parsed, Response):
            return parsed
        if parsed.lora_name in state.adapters and not parsed.load_inplace:
            return error_response(
                400,
                f"The lora adapter '{parsed.lora_name}' has already been loaded.",
                "InvalidUserInput",
            )
        if parsed.lora_name == state.base.name:
            return error_response(
                400, f"'{parsed.lora_name}' is the base model", "InvalidUserInput"
            )
        try:
            state.adapters[parsed.lora_name] = load_adapter(parsed.lora_name, parsed.lora_path)
        except AdapterError as exc:
            return error_response(exc.status, exc.message, exc.kind)
        if state.engine is not None:
            state.engine.add_model(parsed.lora_name, lora=True)
        return PlainTextResponse(
            f"Success: LoRA adapter '{parsed.lora_name}' added successfully.",
            headers=_headers(state),
        )

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        down = await _outage(state, request)
        if down is not None:
            return down
        parsed = await parse_body(request, UnloadRequest)
        if isinstance(parsed, Response):
            return parsed
        if not parsed.lora_name:
            return error_response(
                400,
                "either 'lora_name' and 'lora_int_id' needs to be provided.",
                "InvalidUserInput",
            )
        if state.adapters.pop(parsed.lora_name, None) is None:
            return error_response(
                404, f"The lora adapter '{parsed.lora_name}' cannot be found.", "NotFoundError"
            )
        return PlainTextResponse(
            f"Success: LoRA adapter '{parsed.lora_name}' removed successfully.",
            headers=_headers(state),
        )


def _add_admin_routes(app: FastAPI, state: SimulatorState) -> None:
    @app.get("/admin/faults")
    async def get_faults() -> Faults:
        return state.faults

    @app.post("/admin/faults")
    async def set_faults(faults: Faults) -> Faults:
        state.faults = faults
        state.batch.set_limit(faults.max_concurrency)
        return state.faults

    @app.get("/admin/stats")
    async def stats() -> dict[str, Any]:
        return {
            "region": state.settings.region,
            "instance": state.instance,
            "request_ids": dict(state.request_ids),
            "counts": dict(state.counts),
            "adapters": {
                a.name: {"version": a.version, "path": a.path} for a in state.adapters.values()
            },
        }


def _add_chat_routes(app: FastAPI, state: SimulatorState) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        started = time.monotonic()
        down = await _outage(state, request)
        if down is not None:
            return down  # the engine is down: it sees (and counts) nothing
        seen = ChatSeen(state.base.name, started)
        response = await _complete(state, request, seen)
        if state.engine is not None and not seen.dry_run and not seen.streaming:
            seen.record(state.engine, response.status_code)
        return response


@dataclass(frozen=True)
class _Answer:
    """A chat completion's answer, ready to send as JSON or as a stream."""

    completion_id: str
    created: int
    model: str
    tokens: list[str]
    finish: Literal["stop", "length"]
    usage: dict[str, int]
    joiner: str


async def _complete(state: SimulatorState, request: Request, seen: ChatSeen) -> Response:
    """One chat completion: checks, faults, a dry run or the answer (JSON or streamed)."""
    settings = state.settings
    parsed = await parse_body(request, ChatRequest)
    if isinstance(parsed, Response):
        return parsed
    refused = _refusal(state, parsed)
    if refused is not None:
        return refused
    served = state.resolve(parsed.model)
    if served is None:
        return error_response(
            404, f"The model `{parsed.model}` does not exist.", "NotFoundError", "model"
        )
    seen.model = served.name
    max_tokens = parsed.max_completion_tokens or parsed.max_tokens
    max_tokens = max_tokens or settings.default_max_tokens
    if max_tokens > settings.max_model_len:
        return error_response(
            400,
            f"max_tokens={max_tokens} exceeds the model's maximum of {settings.max_model_len}",
            "BadRequestError",
            "max_tokens",
        )
    # The knobs as they were at arrival: a POST to /admin/faults mid-request does not change it.
    faults = state.faults
    dry_run = request.query_params.get("dry-run", "").lower() in ("1", "true", "yes")
    if dry_run:  # a health probe of this simulator: not scheduled
        return await _serve(state, parsed, served, request, seen, faults, max_tokens, dry_run)
    async with state.batch.slot() as waited:
        seen.queue_seconds = waited
        return await _serve(state, parsed, served, request, seen, faults, max_tokens, dry_run)


async def _serve(
    state: SimulatorState,
    parsed: ChatRequest,
    served: ServedModel,
    request: Request,
    seen: ChatSeen,
    faults: Faults,
    max_tokens: int,
    dry_run: bool,
) -> Response:
    """Serve a checked request: its faults, then a dry run's answer or the completion (a
    stream's slot of the batch ends when its response starts)."""
    settings = state.settings
    version_faults = state.version_faults(served.version)
    injected = await _inject_faults(state, faults, version_faults, dry_run)
    if injected is not None:
        return injected
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
        return JSONResponse(body, headers=_headers(state, served))
    wrong = bool(
        version_faults is not None
        and version_faults.wrong_answer_probability > 0
        and state.rng.random() < version_faults.wrong_answer_probability
    )
    tokens, finish, joiner = _answer_tokens(parsed, max_tokens, wrong)
    state.counts["completions"] += 1
    state.count_request(request.headers.get("x-request-id"))
    state.counts[f"version:{served.version}"] += 1
    if faults.first_byte_delay_seconds > 0:
        await asyncio.sleep(faults.first_byte_delay_seconds)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(tokens),
        "total_tokens": prompt_tokens + len(tokens),
    }
    answer = _Answer(
        f"chatcmpl-{uuid.uuid4().hex}",
        int(time.time()),
        parsed.model,
        tokens,
        finish,
        usage,
        joiner,
    )
    seen.prompt_tokens, seen.completion_tokens = prompt_tokens, len(tokens)
    if parsed.stream:
        include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)
        return _streamed(state, answer, include_usage, faults.tokens_per_second, served, seen)
    return await _answered(state, answer, faults.tokens_per_second, served, seen)


def _refusal(state: SimulatorState, parsed: ChatRequest) -> Response | None:
    """The 4xx or 503 of a request vLLM would refuse before looking at its model (None: none)."""
    if parsed.stream_options is not None and not parsed.stream:
        return error_response(
            400, "Stream options can only be defined when `stream=True`.", "BadRequestError"
        )
    if parsed.continue_final_message and parsed.add_generation_prompt:
        return error_response(
            400,
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "BadRequestError",
        )
    if parsed.continue_final_message and parsed.messages[-1].role != "assistant":
        return error_response(
            400,
            "`continue_final_message` needs the final message to be the assistant's.",
            "BadRequestError",
        )
    if not state.loaded():
        return error_response(503, "the model is still loading", "ServiceUnavailableError")
    return None


async def _inject_faults(
    state: SimulatorState, faults: Faults, version_faults: VersionFaults | None, dry_run: bool
) -> Response | None:
    """Wait the added latency (the version's too, but not for a dry run); the injected error's
    answer, or None."""
    delay = faults.latency.sample(state.rng)
    if not dry_run and version_faults is not None:
        delay += version_faults.latency.sample(state.rng)
    if delay > 0:
        await asyncio.sleep(delay)
    if faults.error_rate > 0 and state.rng.random() < faults.error_rate:
        state.counts["errors"] += 1
        return error_response(faults.error_status, "injected fault", "InternalServerError")
    return None


def _answer_tokens(
    parsed: ChatRequest, max_tokens: int, wrong: bool
) -> tuple[list[str], Literal["stop", "length"], str]:
    """The answer's tokens, finish reason and what joins them to an assistant prefill: with
    one, the words after the prefix's."""
    prefix = parsed.messages[-1].text() if parsed.continue_final_message else ""
    asked = [m for m in parsed.messages if m.role != "assistant"] or parsed.messages
    prompt = asked[-1].text() if prefix else parsed.messages[-1].text()
    skip = count_tokens(prefix)
    tokens, finish = build_answer(prompt, parsed.model, skip + max_tokens, wrong)
    joiner = " " if prefix and not prefix[-1].isspace() else ""
    return tokens[skip:], finish, joiner


def _streamed(
    state: SimulatorState,
    answer: _Answer,
    include_usage: bool,
    tokens_per_second: float | None,
    served: ServedModel,
    seen: ChatSeen,
) -> Response:
    events: AsyncGenerator[bytes, None] = stream_chunks(
        answer.completion_id,
        answer.created,
        answer.model,
        answer.tokens,
        answer.finish,
        answer.usage if include_usage else None,
        tokens_per_second,
        answer.joiner,
    )
    if state.engine is not None:
        seen.streaming = True
        events = observed(events, seen, state.engine)
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={**_headers(state, served), "cache-control": "no-cache"},
    )


async def _answered(
    state: SimulatorState,
    answer: _Answer,
    tokens_per_second: float | None,
    served: ServedModel,
    seen: ChatSeen,
) -> Response:
    if tokens_per_second is not None and answer.tokens:
        seen.first_token_at = time.monotonic() + 1 / tokens_per_second
        await asyncio.sleep(len(answer.tokens) / tokens_per_second)
    else:
        seen.first_token_at = time.monotonic()
    body = {
        "id": answer.completion_id,
        "object": "chat.completion",
        "created": answer.created,
        "model": answer.model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": answer.joiner + " ".join(answer.tokens),
                },
                "logprobs": None,
                "finish_reason": answer.finish,
            }
        ],
        "usage": answer.usage,
    }
    return JSONResponse(body, headers=_headers(state, served))
