"""The load generator: realistic chat traffic through the gateway (or, in a stack without one,
straight to an engine), at a steady rate.

Requests arrive as a Poisson process at `rate` per second (enough for the rollback gate's
2000 requests per 300 s per model version at >= 7/s). The mix: most requests ask the fine-tuned
adapter, some the base model; some stream (SSE, read to `[DONE]`), some carry a multi-turn
history; a share are golden prompts, graded on arrival so the counters show what users saw.
Every prompt's embedding (`redline.platform.golden.embed`) is appended to a Redis stream that the
drift probe windows, against a reference drawn from the same prompt distribution at `up`.
A checkpoint of the adapter is recorded every `checkpoint_interval_seconds` (the stand-in for
its training job), so the adapter RPO holds while the stack runs.

The counters are rewritten to `stats_file` every second (`redline status` reads them).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import tempfile
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import redis.asyncio as aredis
from pydantic import Field, PositiveFloat, PositiveInt

from redline.core.redisconn import open_async_redis
from redline.core.settings import ServiceSettings
from redline.platform.golden import GOLDEN_SET, MODEL_VERSION_HEADER, GoldenPrompt, embed, grade
from redline.platform.snapshots import SnapshotError, SnapshotRegistry

log = logging.getLogger(__name__)

SERVED_REGION_HEADER = "x-redline-served-region"

_TEMPLATES = (
    "Summarize this support ticket in two sentences: {ticket}",
    "Draft a polite reply to a customer who wrote: {ticket}",
    "Translate into {language}: {sentence}",
    "Write a {code} function that {task}.",
    "What are the pros and cons of {thing} for {audience}?",
    "Explain {concept} to {audience} in simple terms.",
    "Give me three ideas for {thing} aimed at {audience}.",
    "Rewrite this sentence to sound more formal: {sentence}",
)
_FILL: dict[str, tuple[str, ...]] = {
    "ticket": (
        "my order arrived late and the box was damaged",
        "I was charged twice for the same subscription this month",
        "the app logs me out every time I switch networks",
        "the export to CSV drops the last column",
        "I cannot reset my password, the email never comes",
        "the invoice shows the wrong company address",
    ),
    "language": ("French", "German", "Spanish", "Japanese", "Portuguese"),
    "sentence": (
        "the meeting has been moved to Thursday afternoon",
        "please send the signed contract before Friday",
        "our team will reach out once the fix is deployed",
        "thanks for your patience while we look into it",
    ),
    "code": ("Python", "Go", "TypeScript", "SQL", "Rust"),
    "task": (
        "parses an ISO 8601 date",
        "deduplicates a list while keeping the order",
        "retries an HTTP call with exponential backoff",
        "computes a moving average over a window",
        "validates an email address",
    ),
    "thing": (
        "a four-day work week",
        "serverless hosting",
        "a loyalty program",
        "remote onboarding",
        "a mobile-first redesign",
    ),
    "audience": ("a small bakery", "new engineers", "a hospital IT team", "high-school students"),
    "concept": (
        "vector databases",
        "error budgets",
        "gradient descent",
        "eventual consistency",
        "LoRA fine-tuning",
    ),
}
_HISTORY = (
    ("Hi, I need help with my account.", "Of course. What seems to be the problem?"),
    ("Can you help me plan a trip?", "Happy to help. Where would you like to go?"),
    ("I'm writing a report for my manager.", "Great, what is the report about?"),
)


class LoadgenSettings(ServiceSettings):
    """Settings of `redline loadgen`."""

    gateway_url: str = Field(
        "http://127.0.0.1:8080",
        description="Base URL requests go to: the gateway, or an engine where none runs.",
    )
    more_gateway_urls: tuple[str, ...] = Field(
        (), description="Further gateway replicas: requests go to each URL in turn."
    )
    rate: PositiveFloat = Field(30.0, description="Requests per second (Poisson arrivals).")
    seed: int = Field(0, description="Seed of the prompt and arrival dice.")
    adapter: str = Field("chat-lora", min_length=1, description="The fine-tuned adapter's name.")
    base_model: str = Field("redline-base", min_length=1, description="The base model's name.")
    adapter_share: float = Field(0.85, ge=0, le=1, description="Share of requests to the adapter.")
    golden_share: float = Field(0.05, ge=0, le=1, description="Share of golden prompts.")
    stream_share: float = Field(0.3, ge=0, le=1, description="Share of streamed requests.")
    history_share: float = Field(0.3, ge=0, le=1, description="Share with a multi-turn history.")
    max_in_flight: PositiveInt = Field(256, description="Most requests in flight at once.")
    timeout_seconds: PositiveFloat = Field(30.0, description="Timeout of one request.")
    stats_file: Path | None = Field(None, description="Where the counters are written.")
    pause_file: Path | None = Field(
        None,
        description="While this file exists no new request is sent (the requests in flight "
        "finish): a drill's night-time traffic.",
    )
    snapshots_root: Path | None = Field(None, description="Registry to record checkpoints in.")
    checkpoint_interval_seconds: PositiveFloat = Field(30.0, description="Checkpoint cadence.")
    embeddings_stream: str | None = Field(None, description="Stream of prompt embeddings.")
    embeddings_field: str = Field("vector", min_length=1, description="Field of the vector.")
    embeddings_maxlen: PositiveInt = Field(5000, description="Approximate stream length kept.")


@dataclass(frozen=True)
class ChatCall:
    """One request to send: its body, whether it streams, and its golden item if any."""

    body: dict[str, Any]
    stream: bool
    golden: GoldenPrompt | None
    prompt: str


def build_prompt(rng: random.Random) -> str:
    """One user prompt from the demo's distribution of everyday requests."""
    template = rng.choice(_TEMPLATES)
    values = {key: rng.choice(options) for key, options in _FILL.items()}
    return template.format(**values)


def build_call(rng: random.Random, settings: LoadgenSettings) -> ChatCall:
    """The next request of the mix."""
    golden = rng.choice(GOLDEN_SET) if rng.random() < settings.golden_share else None
    prompt = golden.prompt if golden is not None else build_prompt(rng)
    model = settings.adapter if rng.random() < settings.adapter_share else settings.base_model
    messages: list[dict[str, str]] = []
    if golden is None and rng.random() < settings.history_share:
        user, assistant = rng.choice(_HISTORY)
        messages += [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": user},
            {"role": "assistant", "content": assistant},
        ]
    messages.append({"role": "user", "content": prompt})
    stream = golden is None and rng.random() < settings.stream_share
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": 32 if golden is not None else rng.choice((16, 32, 48, 64, 96)),
        "temperature": 0 if golden is not None else 0.7,
        "stream": stream,
    }
    return ChatCall(body, stream, golden, prompt)


def build_reference_embeddings(count: int, seed: int) -> npt.NDArray[np.float32]:
    """Embeddings of `count` prompts of the traffic's distribution (the drift reference)."""
    rng = random.Random(seed)
    return np.stack([embed(build_prompt(rng)).astype(np.float32) for _ in range(count)])


def write_reference(path: Path, count: int, seed: int) -> None:
    """Save the drift reference as .npy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, build_reference_embeddings(count, seed))


@dataclass
class LoadStats:
    """Counters of the load generator."""

    started_at: float = field(default_factory=time.time)
    sent: int = 0
    completed: int = 0
    failed: int = 0
    in_flight: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    versions: Counter[str] = field(default_factory=Counter)
    served_regions: Counter[str] = field(default_factory=Counter)
    golden: dict[str, list[int]] = field(default_factory=dict)
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=5000))
    checkpoints: int = 0
    embeddings: int = 0

    def record(self, status: str, version: str, region: str, seconds: float) -> None:
        """Count one finished request."""
        self.completed += 1
        self.statuses[status] += 1
        self.versions[version] += 1
        self.served_regions[region] += 1
        self.recent.append((time.time(), seconds))

    def summary(self, now: float | None = None, window: float = 30.0) -> dict[str, Any]:
        """The counters as JSON, with the last `window` seconds' rate and latency quantiles."""
        now = time.time() if now is None else now
        recent = sorted(s for t, s in self.recent if t >= now - window)
        quantiles = {
            name: (recent[min(len(recent) - 1, int(q * len(recent)))] if recent else None)
            for name, q in (("p50", 0.5), ("p99", 0.99))
        }
        return {
            "updated_at": now,
            "started_at": self.started_at,
            "sent": self.sent,
            "completed": self.completed,
            "failed": self.failed,
            "in_flight": self.in_flight,
            "statuses": dict(self.statuses),
            "versions": dict(self.versions),
            "served_regions": dict(self.served_regions),
            "golden": {v: {"asked": a, "correct": c} for v, (a, c) in self.golden.items()},
            "recent_rate": round(len(recent) / window, 3),
            "recent_seconds": quantiles,
            "checkpoints": self.checkpoints,
            "embeddings": self.embeddings,
        }


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` with `data` as JSON (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


MAX_BACKLOG_SECONDS = 1.0
"""How far behind its arrival schedule the load generator may fall before it skips ahead."""


class LoadGenerator:
    """Sends the traffic, records the counters, feeds the embeddings stream, checkpoints."""

    def __init__(self, settings: LoadgenSettings) -> None:
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.stats = LoadStats()
        self._pending_vectors: list[bytes] = []
        bases = (settings.gateway_url, *settings.more_gateway_urls)
        self._urls = itertools.cycle([b.rstrip("/") + "/v1/chat/completions" for b in bases])

    async def _send(self, client: httpx.AsyncClient, call: ChatCall) -> None:
        url = next(self._urls)
        started = time.perf_counter()
        status, version, region, text = "error", "unknown", "unknown", ""
        try:
            if call.stream:
                async with client.stream("POST", url, json=call.body) as response:
                    status = str(response.status_code)
                    version = response.headers.get(MODEL_VERSION_HEADER, "unknown")
                    region = response.headers.get(SERVED_REGION_HEADER, "unknown")
                    async for line in response.aiter_lines():
                        if line.strip() == "data: [DONE]":
                            break
            else:
                response = await client.post(url, json=call.body)
                status = str(response.status_code)
                version = response.headers.get(MODEL_VERSION_HEADER, "unknown")
                region = response.headers.get(SERVED_REGION_HEADER, "unknown")
                if response.status_code == 200 and call.golden is not None:
                    text = response.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            self.stats.failed += 1
            log.debug("request failed: %s: %s", type(exc).__name__, exc)
        self.stats.record(status, version, region, time.perf_counter() - started)
        if status != "200":
            return
        if call.golden is not None:
            totals = self.stats.golden.setdefault(version, [0, 0])
            totals[0] += 1
            totals[1] += int(grade(text, call.golden.expected))

    async def _traffic(self, stop: asyncio.Event) -> None:
        limits = httpx.Limits(
            max_connections=self.settings.max_in_flight, max_keepalive_connections=64
        )
        timeout = httpx.Timeout(self.settings.timeout_seconds, connect=2.0)
        slots = asyncio.Semaphore(self.settings.max_in_flight)
        tasks: set[asyncio.Task[None]] = set()
        pause = self.settings.pause_file
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
            next_at = time.monotonic()
            while not stop.is_set():
                next_at += self.rng.expovariate(self.settings.rate)
                delay = next_at - time.monotonic()
                if delay < -MAX_BACKLOG_SECONDS:
                    # Paused (a drill's SIGSTOP) or starved of CPU: the arrivals missed are
                    # dropped, not sent at once as a burst the stack never saw in a real day.
                    next_at, delay = time.monotonic(), 0.0
                if delay > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        break
                if pause is not None and pause.exists():
                    continue
                await slots.acquire()
                call = build_call(self.rng, self.settings)
                self._pending_vectors.append(embed(call.prompt).astype("<f4").tobytes())
                self.stats.sent += 1
                self.stats.in_flight += 1
                task = asyncio.create_task(self._run(client, call, slots))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=5.0)
                for task in tasks:
                    task.cancel()

    async def _run(
        self, client: httpx.AsyncClient, call: ChatCall, slots: asyncio.Semaphore
    ) -> None:
        try:
            await self._send(client, call)
        finally:
            self.stats.in_flight -= 1
            slots.release()

    async def _embeddings(self, stop: asyncio.Event) -> None:
        stream = self.settings.embeddings_stream
        if stream is None:
            return
        client = open_async_redis(self.settings.redis_url, socket_timeout=2.0)
        try:
            while not stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
                batch, self._pending_vectors = self._pending_vectors, []
                if not batch:
                    continue
                try:
                    async with client.pipeline(transaction=False) as pipe:
                        for vector in batch:
                            pipe.xadd(
                                stream,
                                {self.settings.embeddings_field: vector},
                                maxlen=self.settings.embeddings_maxlen,
                                approximate=True,
                            )
                        await pipe.execute()
                    self.stats.embeddings += len(batch)
                except (aredis.RedisError, OSError) as exc:
                    log.warning("embeddings stream: %s: %s", type(exc).__name__, exc)
        finally:
            await client.aclose()

    async def _checkpoints(self, stop: asyncio.Event) -> None:
        root = self.settings.snapshots_root
        if root is None:
            return
        registry = SnapshotRegistry(root)
        while not stop.is_set():
            try:
                await asyncio.to_thread(registry.record_checkpoint, self.settings.adapter)
                self.stats.checkpoints += 1
            except (SnapshotError, OSError) as exc:
                log.warning("checkpoint of %s failed: %s", self.settings.adapter, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.checkpoint_interval_seconds)

    async def _report(self, stop: asyncio.Event) -> None:
        path = self.settings.stats_file
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if path is not None:
                await asyncio.to_thread(write_json_atomic, path, self.stats.summary())

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set."""
        log.info(
            "load generator: %.1f req/s to %s (%s %.0f%%, %s)",
            self.settings.rate,
            " ".join((self.settings.gateway_url, *self.settings.more_gateway_urls)),
            self.settings.adapter,
            100 * self.settings.adapter_share,
            self.settings.base_model,
        )
        await asyncio.gather(
            self._traffic(stop), self._embeddings(stop), self._checkpoints(stop), self._report(stop)
        )


def summarize_stats(path: Path) -> dict[str, Any] | None:
    """The load generator's last counters, or None when it has written none."""
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


__all__: Sequence[str] = (
    "ChatCall",
    "LoadGenerator",
    "LoadStats",
    "LoadgenSettings",
    "build_call",
    "build_prompt",
    "build_reference_embeddings",
    "summarize_stats",
    "write_reference",
)
