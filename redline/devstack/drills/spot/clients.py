"""The spot drills' clients: requests through the gateway that follow the retry contract and
check every final answer against the one an uninterrupted request gets.

`SpotLoad` streams (and, for a share, waits for whole) completions of unique prompts. On a
recoverable `SPOT_PREEMPTION` event a client resends with `x-redline-resume`; on
`x-redline-resumed: false` it drops the prefix it held. A client-visible non-recoverable failure
is any other outcome: an HTTP error, a cut stream, a non-recoverable event, a wrong answer.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from redline.devstack.drills.spot.fleet import MODEL
from redline.devstack.fakes.simulator import build_answer
from redline.platform.spot import RESUME_HEADER, RESUMED_HEADER, parse_spot_error


@dataclass
class RequestOutcome:
    """What one client request (all its attempts) came to."""

    ok: bool
    failure: str = ""
    attempts: int = 0
    interruptions: int = 0
    resumed: int = 0
    regenerated: int = 0
    served_by: list[tuple[float, str]] = field(default_factory=list)


def expected_answer(prompt: str, max_tokens: int) -> str:
    """What an uninterrupted request for `prompt` answers."""
    return " ".join(build_answer(prompt, MODEL, max_tokens, False)[0])


def run_request(
    client: httpx.Client,
    prompt: str,
    max_tokens: int,
    stream: bool,
    max_attempts: int = 6,
    on_served: Callable[[str], None] | None = None,
) -> RequestOutcome:
    """One request under the retry contract, checked against the uninterrupted answer."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    request_id = uuid.uuid4().hex
    headers = {"x-request-id": request_id}
    outcome = RequestOutcome(ok=False)
    text = ""
    while outcome.attempts < max_attempts:
        outcome.attempts += 1
        try:
            step = _attempt(client, body, headers, stream, on_served)
        except httpx.HTTPError as exc:
            outcome.failure = f"{type(exc).__name__}: {exc}"  # a cut stream, a refused connect
            return outcome
        status, served, resumed, content, error, done = step
        outcome.served_by.append((time.time(), served))
        if status != 200:
            outcome.failure = f"HTTP {status}: {content[:200]}"
            return outcome
        if resumed == "true":
            outcome.resumed += 1
        elif resumed == "false":
            outcome.regenerated += 1
            text = ""  # regenerated from scratch: the prefix held so far is void
        text += content
        if error is not None:
            outcome.interruptions += 1
            info = parse_spot_error(error)
            if info is None or not info.recoverable or info.resume_header is None:
                outcome.failure = f"non-recoverable error event: {json.dumps(error)[:300]}"
                return outcome
            headers = {"x-request-id": request_id, RESUME_HEADER: info.request_id}
            time.sleep(info.retry_after_ms / 1000)
            continue
        if not done:
            outcome.failure = "stream ended without [DONE]"
            return outcome
        expected = expected_answer(prompt, max_tokens)
        if text != expected:
            outcome.failure = f"wrong answer: {len(text.split())} words, expected {max_tokens}"
            return outcome
        outcome.ok = True
        return outcome
    outcome.failure = f"gave up after {max_attempts} attempts"
    return outcome


def _attempt(
    client: httpx.Client,
    body: dict[str, Any],
    headers: dict[str, str],
    stream: bool,
    on_served: Callable[[str], None] | None = None,
) -> tuple[int, str, str | None, str, dict[str, Any] | None, bool]:
    """(status, served region, resumed header, content, spot error, saw [DONE])."""
    if not stream:
        response = client.post("/v1/chat/completions", json=body, headers=headers)
        served = response.headers.get("x-redline-served-region", "")
        if response.status_code != 200:
            return response.status_code, served, None, response.text, None, False
        content = response.json()["choices"][0]["message"]["content"]
        return 200, served, response.headers.get(RESUMED_HEADER), content, None, True
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        served = response.headers.get("x-redline-served-region", "")
        if on_served is not None:
            on_served(served)  # the stream is committed to that node from here on
        if response.status_code != 200:
            return response.status_code, served, None, response.read().decode(), None, False
        parts: list[str] = []
        error: dict[str, Any] | None = None
        done = False
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                error = event
                continue
            for choice in event.get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
        return 200, served, response.headers.get(RESUMED_HEADER), "".join(parts), error, done


@dataclass
class LoadMix:
    """The requests the load sends: lengths (max_tokens) and the share not streamed."""

    lengths: tuple[int, ...] = (30, 300)
    non_streaming_share: float = 0.2


class SpotLoad:
    """Client threads sending requests through the gateway until stopped."""

    def __init__(self, gateway_url: str, workers: int, mix: LoadMix, seed: int = 7) -> None:
        self.gateway_url = gateway_url
        self.mix = mix
        self.stop_event = threading.Event()
        self.outcomes: list[RequestOutcome] = []
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(i, seed + i), daemon=True)
            for i in range(workers)
        ]

    def _run(self, worker: int, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(
            base_url=self.gateway_url, timeout=httpx.Timeout(60.0, connect=2.0), trust_env=False
        ) as client:
            n = 0
            while not self.stop_event.is_set():
                n += 1
                length = self.mix.lengths[(worker + n) % len(self.mix.lengths)]
                stream = rng.random() >= self.mix.non_streaming_share
                prompt = f"spot drill {uuid.uuid4().hex[:8]} worker {worker} request {n}"
                outcome = run_request(client, prompt, length, stream)
                with self.lock:
                    self.outcomes.append(outcome)

    def burst(self, count: int, max_tokens: int) -> list[str]:
        """`count` more streams of `max_tokens` at once, beside the workers; the list fills with
        the node each one streams from as soon as it does."""
        served: list[str] = []

        def one(index: int) -> None:
            with httpx.Client(
                base_url=self.gateway_url, timeout=httpx.Timeout(60.0, connect=2.0), trust_env=False
            ) as client:
                prompt = f"spot drill burst {uuid.uuid4().hex[:8]} {index}"
                outcome = run_request(client, prompt, max_tokens, True, on_served=served.append)
            with self.lock:
                self.outcomes.append(outcome)

        for index in range(count):
            thread = threading.Thread(target=one, args=(index,), daemon=True)
            self.threads.append(thread)
            thread.start()
        return served

    def __enter__(self) -> SpotLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(90)

    def failures(self) -> list[str]:
        """The failure of every request that failed."""
        with self.lock:
            return [o.failure for o in self.outcomes if not o.ok]

    def summary(self) -> dict[str, Any]:
        """Counts over every request so far."""
        with self.lock:
            outcomes = list(self.outcomes)
        return {
            "requests": len(outcomes),
            "succeeded": sum(1 for o in outcomes if o.ok),
            "failed": sum(1 for o in outcomes if not o.ok),
            "interrupted": sum(1 for o in outcomes if o.interruptions),
            "resumed": sum(o.resumed for o in outcomes),
            "regenerated": sum(o.regenerated for o in outcomes),
        }

    def served_between(self, start: float, end: float) -> Counter[str]:
        """Attempts answered by each upstream between two times."""
        with self.lock:
            outcomes = list(self.outcomes)
        return Counter(s for o in outcomes for at, s in o.served_by if start <= at <= end)


__all__ = ["LoadMix", "RequestOutcome", "SpotLoad", "expected_answer", "run_request"]
