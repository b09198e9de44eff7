"""Every engine profile against a real Prometheus: the engine's own exposition (a fake engine
serving its documented series) and redline's exporter pieces (the snapshot registry's
`model_active_info` and baselines, the accuracy tally) are scraped with the rules generated for
that profile, and traffic drives the red line, the availability burn alert and the two-signal
gate until they fire and resolve -- with the same alert names and labels whatever the engine.

One Prometheus per profile, all five at once. Per profile, in order:

- errors: failing requests in waves, enough to burn the availability budget past the page
  threshold with `slos[].min_events` met; they must page (checked last);
- latency: slow requests until `RedLineLatencyP99{region}` fires, then fast ones until it
  resolves;
- gate: v2 active, slow enough (>= rollback.min_samples) with accuracy at its baseline stays
  silent; accuracy verdicts dropping then fire `SemanticRollbackTwoSignal{model_version="v2"}`;
  v1 active again resolves it;
- the page fires, and a flood of good requests resolves it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from redline.devstack.fakes.engines import (
    ENGINE_PROFILES,
    EngineMetrics,
)
from redline.devstack.fakes.metrics_server import EngineMetricsServer, RegistryExposition
from redline.devstack.processes import start_prometheus
from redline.exporters.evaluations import EvalTally
from redline.exporters.models import ModelVersionsProbe
from redline.exporters.probe import ProbeCache
from redline.platform.prometheus import PrometheusClient
from redline.platform.snapshots import Baselines, SnapshotRegistry
from redline.rules import records
from redline.rules.build import build_rule_groups
from redline.rules.families.slo import BURN_WINDOWS, burn_factor
from redline.rules.model import AlertRule, format_duration
from redline.rules.render import render_rule_file
from redline.rules.signals import aggregate
from redline.slo import catalog
from redline.slo.load import apply_profile, load_spec
from redline.slo.sources import PROFILES
from redline.slo.spec import Sources, Spec, parse_duration

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "chat"
BASELINE_P99 = 0.5
BASELINE_ACCURACY = 0.95
GATE_WINDOW_SECONDS = 30
"""The rollback window of the test spec: after v1 is active again, v2's requests leave it soon."""
FAST, SLOW, ERROR_LATENCY = 0.2, 2.0, 0.1
LATENCY_ALERT = "RedLineLatencyP99"
GATE_ALERT = "SemanticRollbackTwoSignal"


def profile_spec(profile: str) -> Spec:
    """The default spec with the local profile's timing, reading `profile`'s series."""
    base = apply_profile(load_spec(None).spec, "local")
    model = None if "model" in PROFILES[profile].labels else MODEL
    return base.model_copy(
        update={
            "sources": Sources(profile=profile, model=model),
            "rollback": base.rollback.model_copy(update={"window_seconds": GATE_WINDOW_SECONDS}),
        }
    )


def _weights(base: Path, version: str) -> tuple[Path, Path]:
    weights = base / "weights" / version
    weights.mkdir(parents=True)
    (weights / "adapter_model.safetensors").write_bytes(f"{MODEL}:{version}".encode() * 256)
    config = weights / "adapter_config.json"
    config.write_text(json.dumps({"base_model": MODEL, "r": 8}))
    return weights, config


@dataclass
class Stack:
    """One profile's engine, exporter pieces and Prometheus."""

    profile: str
    spec: Spec
    engine: EngineMetrics
    prometheus: PrometheusClient
    registry: SnapshotRegistry
    cache: ProbeCache
    probe: ModelVersionsProbe
    tally: EvalTally
    snapshots: dict[str, str]
    log: list[str] = field(default_factory=list)

    @property
    def region(self) -> str:
        """The region the engine's target is labelled with."""
        return self.spec.regions[0]

    def note(self, what: str) -> None:
        """Remember a step (printed with the evidence when a wait fails)."""
        self.log.append(f"{time.strftime('%H:%M:%S')} {what}")

    def activate(self, version: str) -> None:
        """Make `version` the registry's active one and publish it (the exporter's probe run)."""
        self.registry.activate(MODEL, self.snapshots[version])
        self.cache.run(self.probe.name)
        self.note(f"activated {version}")

    def push(self, latency: float, count: int, waves: int = 1, status: int = 200) -> None:
        """`count` requests in `waves` a little over a scrape apart, as traffic arrives."""
        for wave in range(waves):
            self.engine.observe(latency, status=status, count=count // waves)
            if wave < waves - 1:
                time.sleep(1.2)
        self.note(f"pushed {count} x {latency}s status {status}")

    def value(self, query: str) -> float | None:
        """The single value of an instant query, None when it has none."""
        result = self.prometheus.instant(query)
        return result[0][1] if result else None

    def alerts(self, name: str, **labels: str) -> list[dict[str, Any]]:
        """Active alerts named `name` carrying `labels` (pending and firing)."""
        return [
            alert
            for alert in self.prometheus.alerts()
            if alert["labels"].get("alertname") == name
            and all(alert["labels"].get(k) == v for k, v in labels.items())
        ]

    def firing(self, name: str, **labels: str) -> bool:
        """True while an alert named `name` with `labels` fires."""
        return any(alert["state"] == "firing" for alert in self.alerts(name, **labels))

    def wait_firing(self, name: str, timeout: float, **labels: str) -> dict[str, Any]:
        """Wait for the alert to fire; the alert as seen firing (a missed scrape on a busy
        machine may end it a moment later, which is not what the scenario asks)."""
        seen: list[dict[str, Any]] = []

        def fires() -> bool:
            seen.extend(a for a in self.alerts(name, **labels) if a["state"] == "firing")
            return bool(seen)

        self.wait(fires, timeout, f"{name} fires")
        return seen[0]

    def evidence(self) -> str:
        """What the rules see now: the recordings each scenario turns on, and the alerts."""
        window = records.rollback_window(self.spec)
        by_version = records.rollback_records(self.spec)
        queries = {
            "p99 by region": records.p99_record(self.spec),
            "latency SLO 5m": f'{catalog.slo_errors_record("5m")}{{slo="latency"}}',
            "latency buckets read": aggregate(
                self.spec, "request_duration", "5m", ("le",), suffix="_bucket"
            ),
            "availability 5m": f'{catalog.slo_errors_record("5m")}{{slo="availability"}}',
            "availability 1h": f'{catalog.slo_errors_record("1h")}{{slo="availability"}}',
            "events 1h": f'{catalog.slo_events_record("1h")}{{slo="availability"}}',
            "requests read": aggregate(self.spec, "requests", "5m"),
            "errors read": aggregate(self.spec, "errors", "5m"),
            "active version": catalog.MODEL_ACTIVE_VERSION_RECORD,
            "p99 by version": by_version["p99"],
            "requests by version": by_version["requests"],
            "accuracy upper bound": catalog.accuracy_upper_bound_record(window),
            "verdicts": catalog.eval_verdicts_record(window),
        }
        lines = [f"profile {self.profile}, steps:", *self.log, "recordings:"]
        for what, query in queries.items():
            try:
                shown = [(labels, value) for labels, value in self.prometheus.instant(query)]
            except Exception as exc:  # evidence only: show the failure, keep the rest
                shown = [({"error": str(exc)}, float("nan"))]
            lines.append(f"  {what} ({query}): {shown}")
        active = [(a["labels"], a["state"]) for a in self.prometheus.alerts()]
        lines.append(f"active alerts: {active}")
        return "\n".join(lines)

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> float:
        """Poll until `predicate` holds; the seconds it took. AssertionError with evidence."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if predicate():
                took = time.monotonic() - started
                self.note(f"{what} after {took:.1f}s")
                return took
            time.sleep(0.5)
        raise AssertionError(f"{what}: not within {timeout}s\n{self.evidence()}")

    def hold(self, predicate: Callable[[], bool], seconds: float, what: str) -> None:
        """`predicate` must hold throughout `seconds`; AssertionError with evidence if not."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not predicate():
                raise AssertionError(f"{what}: broken\n{self.evidence()}")
            time.sleep(0.5)
        self.note(f"{what} held {seconds}s")


def _prometheus_config(spec: Spec, engine: str, exporter: str, rules: Path) -> dict[str, Any]:
    timing = spec.timing
    return {
        "global": {
            "scrape_interval": format_duration(timing.scrape_interval_seconds),
            "evaluation_interval": format_duration(timing.evaluation_interval_seconds),
        },
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "engine",
                "static_configs": [{"targets": [engine], "labels": {"region": spec.regions[0]}}],
            },
            {"job_name": "redline-exporter", "static_configs": [{"targets": [exporter]}]},
        ],
    }


@contextmanager
def profile_stack(profile: str, workdir: Path) -> Iterator[Stack]:
    """The engine exposition, the exporter's model versions and tally, and a Prometheus."""
    spec = profile_spec(profile)
    workdir.mkdir(parents=True, exist_ok=True)
    rules = workdir / "redline.rules.yml"
    rules.write_text(render_rule_file(build_rule_groups(spec), f"test spec, {profile} profile"))
    registry = SnapshotRegistry(workdir / "registry")
    snapshots = {}
    for version in ("v1", "v2"):
        weights, config = _weights(workdir, version)
        snapshot = registry.create(MODEL, version, weights, config, adapter=f"{MODEL}-lora")
        registry.mark_verified(
            MODEL,
            snapshot.snapshot_id,
            Baselines(p99_seconds=BASELINE_P99, accuracy_ratio=BASELINE_ACCURACY),
        )
        snapshots[version] = snapshot.snapshot_id
    registry.activate(MODEL, snapshots["v1"])
    probe = ModelVersionsProbe(registry, models=[MODEL])
    cache = ProbeCache([probe])
    cache.run(probe.name)
    tally = EvalTally()
    exporter = CollectorRegistry()
    exporter.register(cache)
    exporter.register(tally)
    engine = EngineMetrics(profile, model=MODEL)
    with ExitStack() as stack:
        engine_server = stack.enter_context(EngineMetricsServer(engine))
        exporter_server = stack.enter_context(EngineMetricsServer(RegistryExposition(exporter)))
        config = workdir / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                _prometheus_config(spec, engine_server.target, exporter_server.target, rules)
            )
        )
        service = start_prometheus(workdir / "prometheus", config)
        stack.callback(service.stop)
        client = stack.enter_context(PrometheusClient(service.url, timeout=10))
        yield Stack(profile, spec, engine, client, registry, cache, probe, tally, snapshots)


def _total(spec: Spec, signal: str) -> str:
    """The engine's counter for `signal`, summed over all its series (its whole life so far).
    Its last value in the past minute: one scrape missed on a busy machine makes the series
    stale, not absent from the question."""
    found = spec.sources.resolve().series(signal)
    assert found is not None
    return " + ".join(f"sum(last_over_time({found.selector(name)}[1m]))" for name in found.names)


def _has(stack: Stack, query: str) -> Callable[[], bool]:
    return lambda: bool(stack.prometheus.instant(query))


def run_scenarios(stack: Stack) -> None:
    """Drive the three scenarios of one profile; AssertionError with evidence on any failure."""
    spec = stack.spec
    region = stack.region
    # The engine's counters as the rules read them (summed over their whole life: `sum by ()`
    # of the raw counters, their labels mapped) and the red line's window of them.
    window_requests = records.window_requests_record(spec)
    availability = next(slo for slo in spec.slos if slo.sli.kind == "errors")
    page = {"slo": availability.name, "severity": "page"}
    budget = 1 - availability.objective
    page_factors = [
        burn_factor(w, parse_duration(availability.period))
        for w in BURN_WINDOWS
        if w.severity == "page"
    ]
    by_version = records.rollback_records(spec)

    # Baseline: a little good traffic, scraped and read by the rules, v1 active.
    stack.push(FAST, 40)
    stack.wait(_has(stack, window_requests), 30, "requests read by the rules")
    stack.wait(
        _has(stack, f'{catalog.MODEL_ACTIVE_VERSION_RECORD}{{model_version="v1"}}'),
        30,
        "v1 active in Prometheus",
    )

    # (b) errors: 1000 failures in waves (the first wave of a fresh error series is partly
    # invisible to rate(), as on a real engine); the page is checked at the end.
    stack.push(ERROR_LATENCY, 1000, waves=5, status=500)
    errors_pushed = time.monotonic()
    fastest = f'{catalog.slo_errors_record("5m")}{{slo="{availability.name}"}}'
    burning = f"{fastest} > {max(page_factors) * budget}"
    stack.wait(_has(stack, burning), 30, "availability burning past the page threshold")
    stack.wait(lambda: bool(stack.alerts(availability.burn_alert_name, **page)), 30, "page pending")

    # (a) the latency red line: slow requests fire it, a flood of fast ones resolves it.
    stack.push(SLOW, 150, waves=3)
    fired = stack.wait_firing(LATENCY_ALERT, 40, region=region)
    # The latency SLO counts them too: its slow bucket (the threshold, or the engine's nearest
    # bound below it) must be one the engine really writes.
    latency_slo = next(slo for slo in spec.slos if slo.sli.kind == "slow_requests")
    slow_share = f'{catalog.slo_errors_record("5m")}{{slo="{latency_slo.name}"}} > 0'
    stack.wait(_has(stack, slow_share), 20, "the latency SLO counts the slow requests")
    assert fired["labels"]["severity"] == "critical"
    assert fired["labels"]["playbook"] == spec.red_lines.latency_p99.playbook
    stack.push(FAST, 20000, waves=4)
    stack.wait(lambda: not stack.alerts(LATENCY_ALERT, region=region), 60, f"{LATENCY_ALERT} ends")

    # (c) the two-signal gate on v2.
    stack.activate("v2")
    stack.wait(
        _has(stack, f'{catalog.MODEL_ACTIVE_VERSION_RECORD}{{model_version="v2"}}'),
        30,
        "v2 active in Prometheus",
    )
    min_samples = spec.rollback.min_samples
    slow_enough = (
        f'{by_version["requests"]}{{model_version="v2"}} >= {min_samples} '
        f'and {by_version["p99"]}{{model_version="v2"}} '
        f">= {(1 + spec.rollback.p99_increase_ratio) * BASELINE_P99}"
    )
    # Latency alone: slow and plenty of traffic, accuracy at its baseline: silent.
    stack.tally.add(MODEL, "v2", 300, 300)
    stack.push(SLOW, min_samples + 400, waves=3)
    stack.wait(_has(stack, slow_enough), 30, "v2's latency leg holds")
    stack.hold(
        lambda: not stack.alerts(GATE_ALERT, model_version="v2"),
        spec.rollback.for_seconds + 5,
        "latency alone stays silent",
    )
    # Accuracy drops too (significantly, with enough verdicts): the gate fires on v2.
    stack.tally.add(MODEL, "v2", 900, 450)
    stack.push(SLOW, min_samples + 400, waves=2)
    gate = stack.wait_firing(GATE_ALERT, 40, model=MODEL, model_version="v2")
    assert gate["labels"]["playbook"] == spec.rollback.playbook
    # Rolled back: v1 serves again, v2's requests leave the gate's window and it resolves.
    stack.activate("v1")
    stack.wait(
        lambda: not stack.alerts(GATE_ALERT, model_version="v2"),
        GATE_WINDOW_SECONDS + 40,
        f"{GATE_ALERT} on v2 ends",
    )
    assert not stack.alerts(GATE_ALERT), "the gate fired on another version"

    # (b) the page fires (it has no `for`: it fires as soon as both windows burn); a flood of
    # good requests ends it.
    (page_rule,) = [
        rule
        for group in build_rule_groups(spec)
        for rule in group.rules
        if isinstance(rule, AlertRule)
        and rule.alert == availability.burn_alert_name
        and rule.labels.get("severity") == "page"
    ]
    left = page_rule.for_seconds + 60 - (time.monotonic() - errors_pushed)
    stack.wait(
        lambda: stack.firing(availability.burn_alert_name, **page), max(left, 30), "page fires"
    )
    # Every page condition must end (14.4x over 1h/5m, 6x over 6h/30m: the whole test is inside
    # each window): good requests until failures are 2/3 of the slowest page burn's share.
    errors = stack.value(_total(spec, "errors"))
    served = stack.value(_total(spec, "requests"))
    assert errors and served, stack.evidence()
    flood = int(errors / (min(page_factors) * budget * 2 / 3) - served)
    stack.push(FAST, max(flood, 1000), waves=4)
    stack.wait(lambda: not stack.alerts(availability.burn_alert_name, **page), 60, "page resolves")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    """Each profile's scenarios, all at once: None when they passed, else the failure."""

    def one(profile: str) -> str | None:
        try:
            with profile_stack(profile, tmp_path_factory.mktemp(profile)) as stack:
                run_scenarios(stack)
                return None
        except Exception as exc:  # reported by the profile's test, the others still run
            return f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(max_workers=len(ENGINE_PROFILES)) as pool:
        return dict(zip(ENGINE_PROFILES, pool.map(one, ENGINE_PROFILES), strict=True))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("profile", ENGINE_PROFILES)
def test_red_line_burn_alert_and_gate_fire_and_resolve(
    profile: str, outcomes: dict[str, str | None]
) -> None:
    failure = outcomes[profile]
    assert failure is None, failure
