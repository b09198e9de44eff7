"""The gateway with `prompt_log` on: answered requests land, redacted, in a log a trace finds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.platform.promptlog import SESSION_HEADER, PromptLog
from tests.support.gateway import RunningGateway, gateway_starter

pytestmark = pytest.mark.integration


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
