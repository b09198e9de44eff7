"""The engine's own `/metrics` of one simulator (`metrics_profile`): an engine exposition per
served model, merged into one page, and what it records of each chat request (a stream counted
once it ends)."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncGenerator, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from redline.devstack.fakes.engines import ABORTED, EngineMetrics


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


def render_engines(engines: Sequence[EngineMetrics]) -> bytes:
    """Several engines' series as one text exposition (format 0.0.4), merged as one pod
    serving them shows them (`merge_families`)."""
    registry = CollectorRegistry(auto_describe=False)
    families = [family for engine in engines for family in engine.registry.collect()]
    registry.register(_Families(merge_families(families)))
    return generate_latest(registry)


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
        streamed: bool = False,
        queue_seconds: float | None = None,
    ) -> None:
        """Record one request the engine answered (`status` as the client saw it; 499: the
        client went away mid-stream; `streamed`: a stream, whose 200 went out first;
        `queue_seconds`: its wait for the running batch)."""
        self.add_model(model).observe(
            max(latency, 0.0),
            status=status,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            ttft_seconds=None if ttft is None else min(max(ttft, 0.0), max(latency, 0.0)),
            streamed=streamed,
            queue_seconds=queue_seconds,
        )

    def set_saturation(self, model: str, waiting: int, running: int, limit: int | None) -> None:
        """The scheduler's gauges, on the base `model`'s series (one scheduler serves every
        adapter): the KV cache filled in proportion to the batch when it has a limit."""
        usage = None if not limit else min(running / limit, 1.0)
        self.add_model(model).set_saturation(waiting, running, usage)

    def render(self) -> bytes:
        """The text exposition (format 0.0.4)."""
        with self._lock:
            engines = list(self.models.values())
        if len(engines) == 1:
            return engines[0].render()
        return render_engines(engines)


@dataclass
class ChatSeen:
    """What the engine's series record of one chat request."""

    model: str
    started: float
    dry_run: bool = False
    streaming: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    queue_seconds: float | None = None

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
            self.streaming,
            self.queue_seconds,
        )


async def observed(
    events: AsyncGenerator[bytes, None], seen: ChatSeen, engine: EngineExposition
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
