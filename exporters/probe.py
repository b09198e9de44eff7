"""The probe contract and the cache that keeps scrapes fast.

A probe measures one signal on a real component. The scheduler calls `Probe.run()` on its own
interval, in a worker thread; `ProbeCache` keeps the last result, and the collector only reads
that cache, so a slow or hanging probe never blocks or slows a scrape.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricDef:
    """A metric family a probe publishes: name (without `_total` for counters), type, labels."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sample:
    """One value of one series. Counters carry their cumulative total (the probe keeps it)."""

    name: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


class Probe(Protocol):
    """What the scheduler runs. `run` may block and may raise; it must not loop forever."""

    name: str
    interval_seconds: float
    metrics: tuple[MetricDef, ...]

    def run(self) -> list[Sample]:
        """Measure once and return every sample of the probe's metrics."""
        ...


@dataclass
class _State:
    samples: list[Sample] = field(default_factory=list)
    success: bool = False
    duration_seconds: float = 0.0
    last_success: float | None = None
    running_since: float | None = None
    error: str | None = None


PROBE_METRICS = (
    MetricDef("redline_probe_success", "gauge", "1 if the probe's last run succeeded.", ("probe",)),
    MetricDef(
        "redline_probe_duration_seconds", "gauge", "Duration of the probe's last run.", ("probe",)
    ),
    MetricDef(
        "redline_probe_last_success_timestamp_seconds",
        "gauge",
        "Unix time of the probe's last successful run.",
        ("probe",),
    ),
)


class ProbeCache(Collector):
    """Runs probes on demand and serves their last results to Prometheus without blocking."""

    def __init__(
        self,
        probes: Iterable[Probe],
        timeout_seconds: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.probes = {probe.name: probe for probe in probes}
        self.timeout_seconds = timeout_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._states = {name: _State() for name in self.probes}

    def run(self, name: str) -> None:
        """Run one probe now and cache its result; failures are logged, never raised."""
        probe = self.probes[name]
        started = time.monotonic()
        with self._lock:
            self._states[name].running_since = started
        try:
            samples = probe.run()
        except Exception as exc:  # a probe must never take the exporter down
            log.warning("probe %s failed: %s: %s", name, type(exc).__name__, exc)
            self._record(name, started, None, f"{type(exc).__name__}: {exc}")
        else:
            self._record(name, started, samples, None)

    def _record(
        self, name: str, started: float, samples: list[Sample] | None, error: str | None
    ) -> None:
        duration = time.monotonic() - started
        with self._lock:
            state = self._states[name]
            state.running_since = None
            state.duration_seconds = duration
            state.error = error
            state.success = samples is not None
            if samples is not None:
                state.samples = samples
                state.last_success = self._clock()
            else:
                # Gauges of a failed run are unknown, not zero; counters keep their totals.
                counters = {m.name for m in self.probes[name].metrics if m.kind == "counter"}
                state.samples = [s for s in state.samples if s.name in counters]

    def status(self) -> dict[str, dict[str, object]]:
        """Each probe's last outcome, for `/healthz` and logs."""
        with self._lock:
            return {
                name: {
                    "success": state.success,
                    "duration_seconds": round(state.duration_seconds, 4),
                    "last_success": state.last_success,
                    "error": state.error,
                }
                for name, state in self._states.items()
            }

    def describe(self) -> list[Metric]:
        """Families this collector yields (without samples), for registry checks."""
        return list(self._families(with_samples=False))

    def collect(self) -> Iterator[Metric]:
        """Yield every probe's cached samples and the probe health series."""
        yield from self._families(with_samples=True)

    def _families(self, with_samples: bool) -> Iterator[Metric]:
        with self._lock:
            states = {name: _snapshot(state) for name, state in self._states.items()}
        now = time.monotonic()
        families: dict[str, Metric] = {}
        for definition in PROBE_METRICS:
            families[definition.name] = _family(definition)
        for probe in self.probes.values():
            for definition in probe.metrics:
                if definition.name not in families:
                    families[definition.name] = _family(definition)
        if with_samples:
            for name, state in sorted(states.items()):
                hung = (
                    state.running_since is not None
                    and now - state.running_since > self.timeout_seconds
                )
                success = 0.0 if hung else float(state.success)
                _add(families["redline_probe_success"], [name], success)
                _add(families["redline_probe_duration_seconds"], [name], state.duration_seconds)
                if state.last_success is not None:
                    family = families["redline_probe_last_success_timestamp_seconds"]
                    _add(family, [name], state.last_success)
                definitions = {m.name: m for m in self.probes[name].metrics}
                for sample in state.samples:
                    found = definitions.get(sample.name)
                    if found is None:
                        log.error("probe %s returned undeclared metric %s", name, sample.name)
                        continue
                    values = [sample.labels.get(label, "") for label in found.labels]
                    _add(families[sample.name], values, sample.value)
        yield from families.values()


def _snapshot(state: _State) -> _State:
    return _State(
        samples=list(state.samples),
        success=state.success,
        duration_seconds=state.duration_seconds,
        last_success=state.last_success,
        running_since=state.running_since,
        error=state.error,
    )


def _family(definition: MetricDef) -> Metric:
    if definition.kind == "counter":
        return CounterMetricFamily(definition.name, definition.help, labels=definition.labels)
    return GaugeMetricFamily(definition.name, definition.help, labels=definition.labels)


def _add(family: Metric, labels: list[str], value: float) -> None:
    assert isinstance(family, GaugeMetricFamily | CounterMetricFamily)
    family.add_metric(labels, value)
