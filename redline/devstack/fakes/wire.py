"""The simulator's side of the OpenAI and vLLM wire format: the request bodies it reads, vLLM's
error body, the model cards of `/v1/models`, and a chat completion as SSE chunks."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from redline.devstack.fakes.lora import ServedModel

M = TypeVar("M", bound=BaseModel)


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


class LoadRequest(BaseModel):
    """`POST /v1/load_lora_adapter`'s body."""

    model_config = ConfigDict(extra="allow")
    lora_name: str = ""
    lora_path: str = ""
    load_inplace: bool = False


class UnloadRequest(BaseModel):
    """`POST /v1/unload_lora_adapter`'s body."""

    model_config = ConfigDict(extra="allow")
    lora_name: str = ""
    lora_int_id: int | None = None


def error_response(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """vLLM's (and OpenAI's) error body."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def problems(exc: ValidationError | RequestValidationError) -> list[str]:
    """One `where: what (got ...)` line per validation error."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ())) or "body"
        got = error.get("input")
        shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
        lines.append(f"{where}: {error.get('msg', 'invalid')}{shown}")
    return lines


def model_card(model: ServedModel, parent: str | None, max_model_len: int | None) -> dict[str, Any]:
    """A model's entry in `/v1/models` (an adapter's `parent` is the base model)."""
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


async def parse_body(request: Request, model: type[M]) -> M | Response:
    """The request's JSON body as `model`, or the 400 vLLM answers when it is not one."""
    try:
        raw = await request.body()
        data = json.loads(raw)
    except ValueError as exc:
        return error_response(400, f"request body is not valid JSON: {exc}", "BadRequestError")
    if not isinstance(data, dict):
        return error_response(400, "request body must be a JSON object", "BadRequestError")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        return error_response(400, "; ".join(problems(exc)), "BadRequestError")


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


async def stream_chunks(
    completion_id: str,
    created: int,
    model: str,
    tokens: list[str],
    finish: str,
    usage: dict[str, int] | None,
    tokens_per_second: float | None,
    joiner: str = "",
) -> AsyncGenerator[bytes, None]:
    """A chat completion as SSE events: the role, one chunk per token (paced at
    `tokens_per_second`), the finish reason, the usage when asked for, `[DONE]`."""
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
