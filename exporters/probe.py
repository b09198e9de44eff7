"""The probe contract and the cache that keeps scrapes fast.

A probe measures one signal on a real component. The scheduler calls `Probe.run()` on its own
interval, in a worker thread; `ProbeCache` keeps the last result, and the collector only reads
that cache, so a slow or hanging probe never blocks or slows a scrape.

A probe that writes canaries (a canary vector, a canary session, canary prompts) says so with a
true `writes_canaries` class attribute; when several exporter replicas run, only the holder of the
canary lease runs those (`may_run`): the others skip them and publish none of their series.
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

from redline.slo import catalog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricDef:
    """A metric family a probe publishes: name (without `_total` for counters), type, labels."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...] = ()

    @classmethod
    def of(cls, metric: catalog.Metric) -> MetricDef:
        """The definition of a catalog entry (a gauge or a counter)."""
        if metric.kind not in ("gauge", "counter"):
            raise ValueError(f"{metric.name}: a probe publishes gauges and counters only")
        kind: Literal["gauge", "counter"] = "gauge" if metric.kind == "gauge" else "counter"
        return cls(metric.family, kind, metric.help, metric.labels)


@dataclass(frozen=True)
class Sample:
    """One value of one series. Counters carry their cumulative total (the probe keeps it)."""

    name: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


class Probe(Protocol):
    """What the scheduler runs. `run` may block and may raise; it must not loop forever.

    The attributes are read-only members, so a plain attribute, a class attribute of a
    fixed-length tuple or a property all satisfy the protocol.
    """

    @property
    def name(self) -> str:
        """Unique probe name (the `probe` label)."""
        ...

    @property
    def interval_seconds(self) -> float:
        """Seconds between two runs."""
        ...

    @property
    def metrics(self) -> tuple[MetricDef, ...]:
        """Every family `run` may return samples of."""
        ...

    def run(self) -> list[Sample]:
        """Measure once and return every sample of the probe's metrics."""
        ...


def writes_canaries(probe: Probe) -> bool:
    """True when the probe writes canaries (its class sets `writes_canaries = True`): with
    several exporter replicas, only the canary lease's holder runs it."""
    return bool(getattr(probe, "writes_canaries", False))


@dataclass
class _State:
    samples: list[Sample] = field(default_factory=list)
    success: bool = False
    duration_seconds: float = 0.0
    last_success: float | None = None
    running_since: float | None = None
    error: str | None = None
    runs: int = 0
    skipped: bool = False
    skipped_runs: int = 0


PROBE_METRICS = (
    MetricDef.of(catalog.REDLINE_PROBE_SUCCESS),
    MetricDef.of(catalog.REDLINE_PROBE_DURATION_SECONDS),
    MetricDef.of(catalog.REDLINE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS),
)


class ProbeCache(Collector):
    """Runs probes on demand and serves their last results to Prometheus without blocking."""

    def __init__(
        self,
        probes: Iterable[Probe],
        timeout_seconds: float = 30.0,
        clock: Callable[[], float] = time.time,
        timeouts: Mapping[str, float] | None = None,
        may_run: Callable[[str], bool] | None = None,
    ) -> None:
        self.probes: dict[str, Probe] = {}
        for probe in probes:
            if probe.name in self.probes:
                raise ValueError(f"two probes are named {probe.name!r}; probe names must be unique")
            self.probes[probe.name] = probe
        self.timeout_seconds = timeout_seconds
        self.timeouts = dict(timeouts or {})
        unknown = sorted(set(self.timeouts) - set(self.probes))
        if unknown:
            raise ValueError(f"timeouts given for unknown probes: {', '.join(unknown)}")
        self._definitions = _check_definitions(self.probes.values())
        self._clock = clock
        # Whether a probe may run now (the canary lease); None: every probe always may.
        self._may_run = may_run
        self._lock = threading.Lock()
        self._states = {name: _State() for name in self.probes}

    def timeout_for(self, name: str) -> float:
        """Seconds after which a still-running probe counts as failed (hung)."""
        return self.timeouts.get(name, self.timeout_seconds)

    def allowed(self, name: str) -> bool:
        """True when the probe may run (and publish) now."""
        return self._may_run is None or self._may_run(name)

    def run(self, name: str) -> None:
        """Run one probe now and cache its result; failures are logged, never raised. A probe
        that may not run now is skipped and its cached series dropped (not stale values)."""
        probe = self.probes[name]
        if not self.allowed(name):
            with self._lock:
                state = self._states[name]
                state.skipped_runs += 1
                if not state.skipped:
                    log.info("probe %s skipped: another replica holds the canary lease", name)
                state.skipped = True
                state.samples, state.success, state.last_success = [], False, None
                state.error = None
            return
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
            state.runs += 1
            state.skipped = False
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
        now = time.monotonic()
        with self._lock:
            result: dict[str, dict[str, object]] = {}
            for name, state in self._states.items():
                running = None if state.running_since is None else now - state.running_since
                hung = running is not None and running > self.timeout_for(name)
                result[name] = {
                    "skipped": state.skipped or not self.allowed(name),
                    "runs": state.runs,
                    "skipped_runs": state.skipped_runs,
                    "success": state.success and not hung,
                    "duration_seconds": round(state.duration_seconds, 4),
                    "last_success": state.last_success,
                    "error": f"still running after {running:.1f} s" if hung else state.error,
                    "running_seconds": None if running is None else round(running, 4),
                }
            return result

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
        families = {name: _family(definition) for name, definition in self._definitions.items()}
        if with_samples:
            for name, state in sorted(states.items()):
                if state.skipped or not self.allowed(name):
                    continue  # another replica runs it: its series are that replica's
                running = None if state.running_since is None else now - state.running_since
                hung = running is not None and running > self.timeout_for(name)
                success = 0.0 if hung else float(state.success)
                duration = running if hung and running is not None else state.duration_seconds
                _add(families[catalog.REDLINE_PROBE_SUCCESS.family], [name], success)
                _add(families[catalog.REDLINE_PROBE_DURATION_SECONDS.family], [name], duration)
                if state.last_success is not None:
                    family = families[catalog.REDLINE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS.family]
                    _add(family, [name], state.last_success)
                definitions = {m.name: m for m in self.probes[name].metrics}
                for sample in state.samples:
                    found = definitions.get(sample.name)
                    if found is None:
                        log.error("probe %s returned undeclared metric %s", name, sample.name)
                        continue
                    if hung and found.kind == "gauge":
                        continue  # a hung probe's gauges are as unknown as a failed one's
                    values = [sample.labels.get(label, "") for label in found.labels]
                    _add(families[sample.name], values, sample.value)
        yield from families.values()


def _check_definitions(probes: Iterable[Probe]) -> dict[str, MetricDef]:
    """Every family by name; two probes may share a family only with the same definition."""
    definitions = {definition.name: definition for definition in PROBE_METRICS}
    owners = {definition.name: "redline" for definition in PROBE_METRICS}
    for probe in probes:
        for definition in probe.metrics:
            known = definitions.get(definition.name)
            if known is None:
                definitions[definition.name] = definition
                owners[definition.name] = probe.name
            elif (known.kind, known.labels) != (definition.kind, definition.labels):
                raise ValueError(
                    f"probe {probe.name!r} declares {definition.name} as {definition.kind} "
                    f"{definition.labels}, but {owners[definition.name]!r} declared it as "
                    f"{known.kind} {known.labels}"
                )
    return definitions


def _snapshot(state: _State) -> _State:
    return _State(
        samples=list(state.samples),
        success=state.success,
        duration_seconds=state.duration_seconds,
        last_success=state.last_success,
        running_since=state.running_since,
        error=state.error,
        runs=state.runs,
        skipped=state.skipped,
        skipped_runs=state.skipped_runs,
    )


def _family(definition: MetricDef) -> Metric:
    if definition.kind == "counter":
        return CounterMetricFamily(definition.name, definition.help, labels=definition.labels)
    return GaugeMetricFamily(definition.name, definition.help, labels=definition.labels)


def _add(family: Metric, labels: list[str], value: float) -> None:
    assert isinstance(family, GaugeMetricFamily | CounterMetricFamily)
    family.add_metric(labels, value)
