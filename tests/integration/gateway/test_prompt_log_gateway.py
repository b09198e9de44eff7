"""The gateway with `prompt_log` on: answered requests land, redacted, in a log a trace finds."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

import httpx
import pytest
import redis
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.gateway.promptcapture import SESSION_HEADER
from redline.platform.promptlog import PromptLog, Trace
from tests.support.gateway import RunningGateway, gateway_starter

pytestmark = pytest.mark.integration


class UpstreamDiedError(Exception):
    """What the test upstream raises to cut its stream."""


@pytest.fixture()
def sim() -> Iterator[ServerThread]:
    server = serve_in_thread(build_simulator_app(SimulatorSettings(region="primary", seed=1)))
    yield server
    server.stop()


def test_prompt_log_records_what_a_trace_finds(
    redis_url: str, sim: ServerThread, tmp_path: Path
) -> None:
    directory = tmp_path / "prompts"
    settings = {
        "enabled": True,
        "directory": directory,
        "key_prefix": "gw",
        "flush_seconds": 0.05,
        "fsync": False,
        "patterns": {"employee": r"EMP-\d{6}"},
    }
    with gateway_starter(redis_url, RunningGateway, 10.0) as start:
        gateway = start({"primary": sim.url}, prompt_log=settings)
        for k in range(3):
            prompt = f"I am eve@corp.com (EMP-12345{k}), card 4111 1111 1111 1111: question {k}"
            answer = gateway.client.post(
                "/v1/chat/completions",
                json={"model": "redline-base", "messages": [{"role": "user", "content": prompt}]},
                headers={SESSION_HEADER: "sess-42"},
            )
            assert answer.status_code == 200
        other = gateway.client.post(
            "/v1/chat/completions",
            json={
                "model": "redline-base",
                "messages": [{"role": "user", "content": "hi"}],
                "user": "u-9",
            },
        )
        assert other.status_code == 200
        log = PromptLog(redis.Redis.from_url(redis_url), directory, "gw")
        deadline = time.monotonic() + 10
        while len(log.trace("sess-42").records) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    trace = log.trace("sess-42")
    assert len(trace.records) == 3 and trace.ok
    for k, traced in enumerate(trace.records):
        prompt = traced.record["prompt"]
        assert prompt == (
            f"user: I am [REDACTED:email] ([REDACTED:employee]), card [REDACTED:card]: question {k}"
        )
        assert traced.record["answer"]  # the simulator's answer, non-streamed
    assert [r.record["session"] for r in log.trace("u-9").records] == ["u-9"]
    assert log.verify(deep=True).ok


def test_prompt_log_is_off_by_default(redis_url: str, sim: ServerThread) -> None:
    with gateway_starter(redis_url, RunningGateway, 10.0) as start:
        gateway = start({"primary": sim.url})
        assert (
            gateway.client.post(
                "/v1/chat/completions",
                json={"model": "redline-base", "messages": [{"role": "user", "content": "hi"}]},
            ).status_code
            == 200
        )
    assert redis.Redis.from_url(redis_url).keys("*prompts*") == []


def streamed_content(lines: Iterable[str]) -> str:
    """The content deltas of an SSE stream, as a client reads them."""
    out = []
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices", []):
                out.append(choice.get("delta", {}).get("content") or "")
    return "".join(out)


def wait_trace(log: PromptLog, session: str, count: int) -> Trace:
    deadline = time.monotonic() + 10
    while len(log.trace(session).records) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return log.trace(session)


def test_streamed_answers_are_logged_whole_or_marked_truncated(
    redis_url: str, sim: ServerThread, tmp_path: Path
) -> None:
    directory = tmp_path / "prompts"
    settings = {
        "enabled": True,
        "directory": directory,
        "key_prefix": "gw",
        "flush_seconds": 0.05,
        "fsync": False,
        "patterns": {"word": r"\b(?:the|model|tokens)\b"},
    }
    ask = {
        "model": "redline-base",
        "messages": [{"role": "user", "content": "call me on +1 415 555 0132"}],
        "max_tokens": 30,
        "stream": True,
    }
    log = PromptLog(redis.Redis.from_url(redis_url), directory, "gw")
    with gateway_starter(redis_url, RunningGateway, 10.0) as start:
        gateway = start({"primary": sim.url}, prompt_log=settings)
        with gateway.client.stream(
            "POST", "/v1/chat/completions", json=ask, headers={SESSION_HEADER: "whole"}
        ) as response:
            assert response.status_code == 200
            received = streamed_content(response.iter_lines())
        assert len(received.split()) == 30

        # The same prompt again (the simulator's answer depends on it alone), slowly, and the
        # client walks away after the first events: the log keeps what was sent so far.
        httpx.post(f"{sim.url}/admin/faults", json={"tokens_per_second": 20}).raise_for_status()
        with gateway.client.stream(
            "POST", "/v1/chat/completions", json=ask, headers={SESSION_HEADER: "gone"}
        ) as response:
            lines = response.iter_lines()
            partial = streamed_content(next(lines) for _ in range(6))
        whole = wait_trace(log, "whole", 1)
        gone = wait_trace(log, "gone", 1)

    redacted = re.sub(r"\b(?:the|model|tokens)\b", "[REDACTED:word]", received)
    assert "[REDACTED:word]" in redacted
    (record,) = [r.record for r in whole.records]
    assert record["prompt"] == "user: call me on [REDACTED:phone]"
    assert record["answer"] == redacted and "truncated" not in record
    (cut,) = [r.record for r in gone.records]
    assert cut["truncated"] is True
    assert partial and redacted.startswith(cut["answer"]) and len(cut["answer"]) < len(redacted)
    assert whole.ok and gone.ok and log.verify(deep=True).ok


def test_a_stream_the_upstream_cut_is_logged_truncated_and_redacted_whole(
    redis_url: str, tmp_path: Path
) -> None:
    upstream = FastAPI()

    @upstream.post("/v1/chat/completions")
    async def chat() -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            for text in ("my card 4111 1111", " 1111 1111 and", " then"):
                delta = {"choices": [{"index": 0, "delta": {"content": text}}]}
                yield b"data: " + json.dumps(delta).encode() + b"\n\n"
            raise UpstreamDiedError("the upstream dies mid-stream")

        return StreamingResponse(events(), media_type="text/event-stream")

    server = serve_in_thread(upstream)
    directory = tmp_path / "prompts"
    settings = {"enabled": True, "directory": directory, "flush_seconds": 0.05, "fsync": False}
    try:
        with gateway_starter(redis_url, RunningGateway, 10.0) as start:
            gateway = start({"primary": server.url}, prompt_log=settings)
            ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            with pytest.raises(httpx.RemoteProtocolError):
                gateway.client.post("/v1/chat/completions", json=ask, headers={SESSION_HEADER: "c"})
            log = PromptLog(redis.Redis.from_url(redis_url), directory)
            trace = wait_trace(log, "c", 1)
    finally:
        server.stop()
    (record,) = [r.record for r in trace.records]
    # The card number came in two deltas: redaction saw the joined answer.
    assert record["answer"] == "my card [REDACTED:card] and then"
    assert record["truncated"] is True and trace.ok
