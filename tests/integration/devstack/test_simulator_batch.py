"""A simulator with a batch limit (`Faults.max_concurrency`, vLLM's --max-num-seqs) queues what
does not fit: the engine's waiting and running gauges show the queue while it lasts, its
queue-time histogram records each wait, and raising the limit admits the waiting at once."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from redline.core.servers import serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.slo.sources import PROFILES

pytestmark = pytest.mark.integration

SERVICE_SECONDS = 1.0
"""Long enough for three clients started together to all arrive within the first service, on a
busy machine too."""
SATURATION = PROFILES["vllm"].saturation


def _values(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_requests_beyond_the_batch_wait_and_the_engine_shows_it() -> None:
    settings = SimulatorSettings(region="primary", metrics_profile="vllm")
    with serve_in_thread(build_simulator_app(settings)) as server:
        faults = {"latency": {"base_seconds": SERVICE_SECONDS, "jitter": "none"},
                  "max_concurrency": 1}  # fmt: skip
        httpx.post(f"{server.url}/admin/faults", json=faults, timeout=10).raise_for_status()
        body = {"model": settings.base_model, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4}  # fmt: skip
        answers: list[int] = []

        def ask() -> None:
            with httpx.Client(timeout=30) as client:
                answers.append(
                    client.post(f"{server.url}/v1/chat/completions", json=body).status_code
                )

        started = time.monotonic()
        threads = [threading.Thread(target=ask) for _ in range(3)]
        for thread in threads:
            thread.start()
        waiting, running = SATURATION["queue"].names[0], SATURATION["running"].names[0]
        seen: list[tuple[float, float]] = []
        while any(thread.is_alive() for thread in threads):
            values = _values(server.url)
            seen.append((values[waiting], values[running]))
            time.sleep(0.05)
        assert answers == [200, 200, 200]
        # one at a time: the three took three service times, not one
        assert time.monotonic() - started >= 3 * SERVICE_SECONDS
        assert (2.0, 1.0) in seen, seen
        assert all(r <= 1.0 for _, r in seen), seen
        values = _values(server.url)
        assert (values[waiting], values[running]) == (0.0, 0.0)
        queue_time = SATURATION["queue_time"].names[0]
        # waits of about 0, one and two service times (less what a late start took off)
        assert values[f"{queue_time}_count"] == 3
        assert values[f"{queue_time}_sum"] >= 1.5 * SERVICE_SECONDS
        assert values[SATURATION["kv_cache"].names[0]] == 0.0  # an empty batch holds no KV cache


def test_raising_the_limit_admits_the_waiting_at_once() -> None:
    settings = SimulatorSettings(region="primary", metrics_profile="vllm")
    with serve_in_thread(build_simulator_app(settings)) as server:
        slow = {"latency": {"base_seconds": 2.0, "jitter": "none"}, "max_concurrency": 1}
        httpx.post(f"{server.url}/admin/faults", json=slow, timeout=10).raise_for_status()
        body = {"model": settings.base_model, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4}  # fmt: skip
        done: list[float] = []
        started = time.monotonic()

        def ask() -> None:
            with httpx.Client(timeout=30) as client:
                client.post(f"{server.url}/v1/chat/completions", json=body).raise_for_status()
            done.append(time.monotonic() - started)

        threads = [threading.Thread(target=ask) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        assert _values(server.url)[SATURATION["queue"].names[0]] == 1.0
        unlimited = {**slow, "max_concurrency": None}
        httpx.post(f"{server.url}/admin/faults", json=unlimited, timeout=10).raise_for_status()
        for thread in threads:
            thread.join(30)
        # the second ran beside the first from the change on: both done in under two services
        assert len(done) == 2 and max(done) < 3.5, done
