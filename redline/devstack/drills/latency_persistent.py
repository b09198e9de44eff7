"""The persistent-latency drill: the primary stays slow long after the reroute, and the reroute
must hold. Zero flips back to the primary while it is slow, exactly one restore after it is
repaired, and the P99 users see (reroute included) under the red line except while the breach
is being detected.

1. +0.9 s on every request of the primary -> RedLineLatencyP99 -> `reroute` points the gateway
   at the secondary (the loop the `latency` drill times: detect, notify, playbook, verify).
2. The primary gets no traffic, its P99 window empties and the alert resolves: the resolved job
   holds down, then its `restore` step keeps finding the primary slow by the red line and keeps
   the override (the playbook before this drill handed the traffic back after one hold-down
   because the slow primary still answered its dry runs with HTTP 200).
3. The primary stays slow for SLOW_PERIODS restore periods (the stack's hold-down +
   restore period, `reroute` settings of the running worker) after the resolution.
4. The fault is removed: the routing must be restored once, no sooner than the restore period
   and within `restore_bound`.

Throughout, two threads sample every SAMPLE_SECONDS: one reads the routing override in Redis
and as the gateway applies it (its `/healthz`), one sends a chat request through the gateway
(the client's latency and the region that served it). Afterwards the recorded per-region P99
is read back from Prometheus for the whole drill. The counting is pure (`summarize_routing`,
`summarize_clients`, `max_outside`); the detection window is the fault -> the reroute as the
gateway applied it for the client's requests, and for the recorded P99 that plus the time its
rate window still holds the requests served before the reroute (`recorded_detection_end`).

Only the gateway stack reroutes: with `--source vllm` the drill does not apply and says so.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import redis

from redline.devstack.drills.base import DrillError, DrillResult, parse_time
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.latency import LATENCY_FAULT_SECONDS
from redline.devstack.drills.restore import (
    load_reroute_settings,
    restore_bound,
    restore_for_seconds,
)
from redline.devstack.drills.settle import settle_seconds, wait_daytime_window
from redline.devstack.drills.waits import (
    budget_for,
    job_matches,
    require_quiet,
    run_playbook_loop,
    wait_firing,
    wait_job,
    wait_job_done,
    wait_recovered,
)
from redline.devstack.layout import BASE_MODEL
from redline.platform.prometheus import PrometheusError
from redline.platform.routing import SERVED_REGION_HEADER, RoutingError, RoutingStore
from redline.rules.records import p99_record
from redline.slo.alerts import Alert
from redline.slo.spec import Spec, parse_duration

NAME = "latency-persistent"
PLAYBOOK = "reroute"
SLOW_PERIODS = 4
"""How many restore periods (hold-down + restore period) the primary stays slow after the
alert resolved: each is a chance for a restore that should not happen."""
SAMPLE_SECONDS = 0.5
TAIL_SECONDS = 5.0
"""Sampling after the restore: a restore that brought the breach back would show here."""
QUIET_SECONDS = 120.0
"""Longest wait before the fault for an earlier reroute's override to be restored."""


# ---- pure: what the samples say ------------------------------------------------------------


@dataclass(frozen=True)
class RoutingSample:
    """Where the routing sent the primary's traffic at `at`: the override's target region
    (None: no override, the configured order); `ok` False when it could not be read."""

    at: float
    target: str | None
    ok: bool = True


@dataclass(frozen=True)
class ClientSample:
    """One request through the gateway: when it started, how long it took, its HTTP status (or
    `error`) and the region that served it."""

    started_at: float
    seconds: float
    status: str
    served_region: str | None


@dataclass(frozen=True)
class RoutingSummary:
    """The routing's moves over a drill: reroutes (away from the primary), flips (back to it
    while it was slow) and restores (back to it after the repair)."""

    samples: int
    unread: int
    reroutes: int
    reroute_at: float | None
    flips: int
    flip_times: tuple[float, ...]
    restores: int
    restore_at: float | None


def routes_away(target: str | None, primary: str) -> bool:
    """True when an override sends the primary's traffic to another region."""
    return target is not None and target != primary


def summarize_routing(
    samples: Iterable[RoutingSample], primary: str, repaired_at: float | None
) -> RoutingSummary:
    """Count the routing's moves in time order: a move away from the primary is a reroute; a
    move back is a flip when seen at or before `repaired_at` (the primary still slow; None:
    never repaired) and a restore after it. Unread samples are skipped, not guessed."""
    ordered = sorted(samples, key=lambda s: s.at)
    readable = [s for s in ordered if s.ok]
    reroutes = restores = 0
    reroute_at: float | None = None
    restore_at: float | None = None
    flips: list[float] = []
    away: bool | None = None
    for sample in readable:
        now_away = routes_away(sample.target, primary)
        if away is not None and now_away != away:
            if now_away:
                reroutes += 1
                reroute_at = sample.at if reroute_at is None else reroute_at
            elif repaired_at is None or sample.at <= repaired_at:
                flips.append(sample.at)
            else:
                restores += 1
                restore_at = sample.at if restore_at is None else restore_at
        away = now_away
    return RoutingSummary(
        samples=len(readable),
        unread=len(ordered) - len(readable),
        reroutes=reroutes,
        reroute_at=reroute_at,
        flips=len(flips),
        flip_times=tuple(flips),
        restores=restores,
        restore_at=restore_at,
    )


def nearest_rank(values: Sequence[float], quantile: float) -> float | None:
    """The nearest-rank quantile of `values` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]


@dataclass(frozen=True)
class ClientSummary:
    """The drill's own requests: how many, how many failed, how many the slow primary served
    after the reroute, and their latency outside the detection window."""

    requests: int
    failed: int
    outside_detection: int
    served_by_slow_primary: int
    p99_seconds: float | None
    max_seconds: float | None


def summarize_clients(
    samples: Iterable[ClientSample],
    primary: str,
    fault_at: float,
    detected_until: float | None,
    repaired_at: float | None,
    quantile: float,
) -> ClientSummary:
    """Latency of the requests started outside [fault_at, detected_until) (the detection
    window; None: it never ended), and the requests the primary served between the reroute and
    the repair (while it was slow)."""
    ordered = list(samples)
    end = math.inf if detected_until is None else detected_until
    outside = [s.seconds for s in ordered if not fault_at <= s.started_at < end]
    until = math.inf if repaired_at is None else repaired_at
    slow_primary = [
        s for s in ordered if s.served_region == primary and end <= s.started_at <= until
    ]
    return ClientSummary(
        requests=len(ordered),
        failed=sum(1 for s in ordered if s.status != "200"),
        outside_detection=len(outside),
        served_by_slow_primary=len(slow_primary),
        p99_seconds=nearest_rank(outside, quantile),
        max_seconds=max(outside, default=None),
    )


def max_outside(
    points: Iterable[tuple[float, float]], start: float, end: float
) -> tuple[float | None, int]:
    """The largest finite value at a time outside [start, end), and how many such points."""
    kept = [v for t, v in points if not start <= t < end and math.isfinite(v)]
    return max(kept, default=None), len(kept)


def recorded_detection_end(reroute_at: float, spec: Spec, federated: bool) -> float:
    """Until when the recorded P99 still holds requests served before the reroute: its rate
    window, the slowest such request's latency, and the scrapes and evaluations carrying it."""
    t = spec.timing
    scrapes = 2 if federated else 1
    window = parse_duration(spec.red_lines.latency_p99.window)
    return (
        reroute_at
        + window
        + LATENCY_FAULT_SECONDS
        + scrapes * t.scrape_interval_seconds
        + 2 * t.evaluation_interval_seconds
    )


def build_not_applicable(spec: Spec, source: str) -> DrillResult:
    """The result on a stack without redline's gateway: nothing reroutes there, so there is
    nothing to flap; the drill runs nothing and says why."""
    red = spec.red_lines.latency_p99
    result = DrillResult(NAME, Alert.RED_LINE_LATENCY_P99, red.playbook, 0.0, expect_alert=False)
    result.not_applicable = (
        f"the {source} stack has no gateway: nothing reroutes (the latency red line pages a "
        "human), so there is no reroute to flap; the `latency` drill covers its red line"
    )
    result.lost_detail = "n/a: nothing was injected"
    return result


# ---- I/O: the samplers and the drill -------------------------------------------------------


class Samplers:
    """Two threads, each every `interval` until stopped: the routing override (Redis and the
    gateway's view) and one chat request through the gateway."""

    def __init__(self, redis_url: str, prefix: str, gateway_url: str, interval: float) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.gateway_url = gateway_url.rstrip("/")
        self.interval = interval
        self.store: list[RoutingSample] = []
        self.gateway: list[RoutingSample] = []
        self.clients: list[ClientSample] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._guarded, args=(self._routing,), daemon=True,
                             name="drill-routing-sampler"),
            threading.Thread(target=self._guarded, args=(self._requests,), daemon=True,
                             name="drill-client-sampler"),
        ]  # fmt: skip

    def __enter__(self) -> Samplers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15.0)

    def snapshot(self) -> tuple[list[RoutingSample], list[RoutingSample], list[ClientSample]]:
        """Copies of what was sampled so far."""
        with self._lock:
            return list(self.store), list(self.gateway), list(self.clients)

    def _add(self, into: list[Any], item: Any) -> None:
        with self._lock:
            into.append(item)

    def _guarded(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except Exception as exc:  # a dead sampler must fail the drill, not vanish in a thread
            with self._lock:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _pace(self, next_at: float) -> float:
        """Wait until the next tick (never bursting to catch up); the tick after it."""
        now = time.monotonic()
        next_at = max(next_at + self.interval, now)
        self._stop.wait(next_at - now)
        return next_at

    def _routing(self) -> None:
        store = RoutingStore.from_url(self.redis_url, self.prefix, timeout_seconds=1.0)
        try:
            with httpx.Client(timeout=2.0, trust_env=False) as http:
                next_at = time.monotonic()
                while not self._stop.is_set():
                    at = time.time()
                    try:
                        override = store.get_override()
                    except (redis.RedisError, RoutingError):
                        self._add(self.store, RoutingSample(at, None, ok=False))
                    else:
                        target = override.target_region if override is not None else None
                        self._add(self.store, RoutingSample(at, target))
                    at = time.time()
                    try:
                        response = http.get(f"{self.gateway_url}/healthz")
                        response.raise_for_status()
                        seen = response.json().get("override")
                    except (httpx.HTTPError, ValueError, AttributeError):
                        self._add(self.gateway, RoutingSample(at, None, ok=False))
                    else:
                        target = seen if isinstance(seen, str) else None
                        self._add(self.gateway, RoutingSample(at, target))
                    next_at = self._pace(next_at)
        finally:
            store.close()

    def _requests(self) -> None:
        body = {
            "model": BASE_MODEL,
            "messages": [{"role": "user", "content": "Is the primary region still slow?"}],
            "max_tokens": 8,
            "temperature": 0,
        }
        url = f"{self.gateway_url}/v1/chat/completions"
        with httpx.Client(timeout=httpx.Timeout(10.0, connect=2.0), trust_env=False) as http:
            next_at = time.monotonic()
            while not self._stop.is_set():
                started_at, started = time.time(), time.perf_counter()
                status, served = "error", None
                try:
                    response = http.post(url, json=body)
                    status = str(response.status_code)
                    served = response.headers.get(SERVED_REGION_HEADER)
                except httpx.HTTPError:
                    pass  # counted as a failed request: status stays "error"
                seconds = time.perf_counter() - started
                self._add(self.clients, ClientSample(started_at, seconds, status, served))
                next_at = self._pace(next_at)


@dataclass
class RunState:
    """How far a run got (kept when it breaks off, so what was sampled is still judged)."""

    slow_for: float
    restore_for: float
    bound: float
    repaired_at: float | None = None
    resolved_job: dict[str, Any] | None = None


def drill_latency_persistent(ctx: DrillContext) -> DrillResult:
    """The primary stays slow for several restore periods after the reroute: zero flips back,
    one restore after the repair, P99 under the red line outside detection."""
    spec = ctx.spec
    if not ctx.endpoints.has_gateway:
        result = build_not_applicable(spec, ctx.endpoints.source)
        ctx.say(NAME, f"does not apply: {result.not_applicable}")
        return result
    red = spec.red_lines.latency_p99
    if red.playbook != PLAYBOOK:
        raise DrillError(f"red_lines.latency_p99.playbook is {red.playbook!r}, not {PLAYBOOK!r}: "
                         "there is no reroute to hold")  # fmt: skip
    result = DrillResult(
        NAME, Alert.RED_LINE_LATENCY_P99, red.playbook, budget_for(ctx, red.for_seconds)
    )
    settings = load_reroute_settings(ctx.probe.layout)
    restore_for = restore_for_seconds(settings, spec)
    run = RunState(
        slow_for=SLOW_PERIODS * (settings.hold_down_seconds + restore_for),
        restore_for=restore_for,
        bound=restore_bound(
            restore_for, settings.restore_check_seconds, spec, ctx.endpoints.federated
        ),
    )
    primary = ctx.endpoints.regions[0]
    # The recorded P99 is judged from just before the fault: every region's window must hold
    # daytime traffic under the line first (after the night drill, a window of a few requests
    # read one slowish request as a P99 of 0.854 s), and any breach of an earlier drill's
    # requests must be resolved (below).
    wait_daytime_window(ctx, NAME, settle_seconds(spec, result.alert, budget_for(ctx, 0.0)))
    require_quiet(ctx, result, {"region": primary})
    store = RoutingStore.from_url(
        ctx.endpoints.redis_url, settings.key_prefix, tuple(ctx.endpoints.regions)
    )
    samplers = Samplers(
        ctx.endpoints.redis_url, settings.key_prefix, ctx.endpoints.gateway_url, SAMPLE_SECONDS
    )
    saved = ctx.probe.faults(primary)
    try:

        def configured_order() -> bool | None:
            return True if store.get_override() is None else None

        # A reroute of an earlier breach (another drill's, another region's) restores only once
        # its region is healthy for the restore period: wait for it rather than count its move.
        try:
            ctx.wait_for(NAME, "the routing override of an earlier reroute to clear",
                         configured_order, QUIET_SECONDS, SAMPLE_SECONDS)  # fmt: skip
        except DrillError:
            raise DrillError(f"a routing override is still set ({store.get_override()}) after "
                             f"{QUIET_SECONDS:g} s; clear it first") from None  # fmt: skip
        with samplers:
            time.sleep(2 * SAMPLE_SECONDS)  # the routing as it was before the fault
            try:
                _run(ctx, result, store, saved, run)
            except DrillError as exc:
                # Judge what was sampled anyway: a flip is the likeliest reason a wait broke.
                result.error = str(exc)
                ctx.say(NAME, f"FAILED: {exc}; judging what was sampled until now")
        if samplers.errors:
            raise DrillError(f"a sampler failed: {'; '.join(samplers.errors)}")
        if result.fault_at is not None:
            _judge(ctx, result, samplers, run)
    finally:
        ctx.probe.set_faults(primary, saved)
        store.close()
    result.lost_detail = "n/a: a reroute moves requests, it writes no data"
    return result


def _run(
    ctx: DrillContext,
    result: DrillResult,
    store: RoutingStore,
    saved: dict[str, Any],
    run: RunState,
) -> None:
    """Fault -> reroute -> resolution -> slow for `slow_for` s more -> repair -> restore."""
    red = ctx.spec.red_lines.latency_p99
    primary, secondary = ctx.endpoints.regions[0], ctx.endpoints.regions[1]
    labels = {"region": primary}
    slow = {**saved, "latency": {"base_seconds": LATENCY_FAULT_SECONDS, "jitter": "none"}}
    result.fault = (
        f"{primary}: +{LATENCY_FAULT_SECONDS} s on every request, kept for "
        f"{run.slow_for:g} s ({SLOW_PERIODS} hold-down + restore periods) after the "
        "resolution"
    )
    result.fault_at = time.time()
    ctx.probe.set_faults(primary, slow)
    result.condition_delay = LATENCY_FAULT_SECONDS
    result.condition_basis = "the first slow request completes one injected latency later"
    ctx.say(NAME, f"fault injected: {result.fault}")
    wait_firing(ctx, result, labels, 60.0)
    run_playbook_loop(ctx, result, labels, 60.0)
    now = store.get_override()
    result.check(
        "gateway routes to the secondary",
        now is not None and now.target_region == secondary,
        f"override: {now.target_region if now else None}",
    )
    wait_recovered(ctx, result, labels, parse_duration(red.window) + 60.0)
    resolved = wait_job(ctx, result, PLAYBOOK, labels, "resolved", 30.0)
    job_id = str(resolved["id"])
    result.resolved_notified_at = parse_time(resolved["created_at"])
    until = result.resolved_notified_at + run.slow_for
    ctx.say(NAME, f"alert resolved with {primary} still slow; keeping it slow for "
                  f"{run.slow_for:g} s (restore job {job_id})")  # fmt: skip

    def slow_long_enough() -> bool | None:
        return True if time.time() >= until else None

    ctx.wait_for(NAME, f"{primary} to stay slow for {run.slow_for:g} s after the resolution",
                 slow_long_enough, run.slow_for + 10.0, SAMPLE_SECONDS)  # fmt: skip

    def between_checks() -> dict[str, Any] | None:
        # Each restore check runs for about a second (a slow probe); read the job between two
        # of them, when it is parked or finished.
        job = ctx.probe.job(job_id)
        return job if job["status"] not in ("running", "queued") else None

    waiting = ctx.wait_for(NAME, f"job {job_id} between two restore checks", between_checks,
                           15.0)  # fmt: skip
    seen = (waiting.get("step_state") or {}).get("status")
    result.check(
        f"the restore waits while {primary} is slow",
        waiting["status"] == "waiting" and seen == "slow",
        f"job {job_id} {waiting['status']} (restore check saw {primary} {seen}): "
        f"{waiting.get('reason')}",
    )
    ctx.say(NAME, f"repairing {primary} (fault removed)")
    ctx.probe.set_faults(primary, saved)
    run.repaired_at = time.time()

    def restored() -> bool | None:
        return True if store.get_override() is None else None

    ctx.wait_for(NAME, "the routing to be restored", restored, run.bound + 30.0, 0.2)
    run.resolved_job = wait_job_done(ctx, NAME, PLAYBOOK, job_id, 30.0)
    ctx.say(NAME, f"routing restored; sampling {TAIL_SECONDS:g} s more")
    time.sleep(TAIL_SECONDS)


def _restore_step(job: dict[str, Any]) -> dict[str, Any]:
    """The data of the job's last recorded restore step that restored the routing ({} if none)."""
    for step in reversed(job.get("steps") or []):
        data = step.get("data") or {}
        if step.get("name") == "restore" and data.get("restored"):
            return dict(data)
    return {}


def _judge(
    ctx: DrillContext,
    result: DrillResult,
    samplers: Samplers,
    run: RunState,
) -> None:
    """Count flips and restores, read the recorded P99 back, record checks and figures."""
    assert result.fault_at is not None
    repaired_at, restore_for, bound = run.repaired_at, run.restore_for, run.bound
    spec, red = ctx.spec, ctx.spec.red_lines.latency_p99
    primary = ctx.endpoints.regions[0]
    threshold = red.threshold_seconds
    in_store, in_gateway, clients = samplers.snapshot()
    store = summarize_routing(in_store, primary, repaired_at)
    gateway = summarize_routing(in_gateway, primary, repaired_at)
    slow_seconds = (repaired_at or time.time()) - (store.reroute_at or result.fault_at)
    flips = max(store.flips, gateway.flips)
    result.check(
        f"no flip back to {primary} while it is slow",
        flips == 0,
        f"{store.flips} in Redis ({store.samples} samples, {store.unread} unread), "
        f"{gateway.flips} in the gateway's routing ({gateway.samples} samples, "
        f"{gateway.unread} unread), every {SAMPLE_SECONDS:g} s over {slow_seconds:.0f} s of "
        f"{primary} slow after the reroute",
    )
    result.check(
        "one reroute",
        store.reroutes == 1 and gateway.reroutes == 1,
        f"{store.reroutes} in Redis, {gateway.reroutes} in the gateway's routing",
    )
    result.check(
        "one restore after the repair",
        store.restores == 1 and gateway.restores == 1,
        f"{store.restores} in Redis, {gateway.restores} in the gateway's routing",
    )
    to_restore = (
        None if store.restore_at is None or repaired_at is None else store.restore_at - repaired_at
    )
    step = _restore_step(run.resolved_job or {})
    result.check(
        f"restored within {bound:g} s of the repair, after {restore_for:g} s healthy",
        to_restore is not None and restore_for <= to_restore <= bound,
        f"repair -> restore {_s(to_restore)}; the playbook saw {primary} healthy for "
        f"{_s(step.get('healthy_for_seconds'))} (latency {_s(step.get('latency_seconds'))})",
    )
    firing = [
        job
        for job in ctx.probe.jobs(PLAYBOOK)
        if job_matches(job, result.alert, {"region": primary})
        and (job.get("alert") or {}).get("status") == "firing"
        and parse_time(job["created_at"]) >= result.fault_at - 1.0
    ]
    result.check(
        "one reroute job",
        len(firing) == 1,
        f"{len(firing)} firing job(s) of {PLAYBOOK} for {primary} since the fault",
    )
    client = summarize_clients(clients, primary, result.fault_at, gateway.reroute_at, repaired_at,
                               red.quantile)  # fmt: skip
    result.check(
        f"no client request served by the slow {primary} after the reroute",
        client.served_by_slow_primary == 0,
        f"{client.served_by_slow_primary} of {client.requests} drill requests "
        f"({client.failed} failed)",
    )
    result.check(
        "client P99 under the red line outside detection",
        client.p99_seconds is not None and client.p99_seconds <= threshold,
        f"P{red.quantile * 100:g} {_s(client.p99_seconds)}, max {_s(client.max_seconds)} over "
        f"{client.outside_detection} requests (detection: the fault -> the gateway's reroute, "
        f"{_s(None if gateway.reroute_at is None else gateway.reroute_at - result.fault_at)})",
    )
    recorded, points, detail = _recorded_p99(ctx, result, store.reroute_at)
    result.check(
        "recorded P99 under the red line outside detection",
        recorded is not None and recorded <= threshold,
        f"max {_s(recorded)} over {points} points of {p99_record(spec)} (every region) {detail}",
    )
    result.figure("flips while slow", flips)
    result.figure("restores after repair", store.restores)
    result.figure("repair -> restore", to_restore, "s")
    result.figure("max recorded P99 outside detection", recorded, "s")
    result.figure("client P99 outside detection", client.p99_seconds, "s")
    result.figure("client requests served by the slow primary", client.served_by_slow_primary)
    result.figure("slow after the resolution", run.slow_for, "s")


def _recorded_p99(
    ctx: DrillContext, result: DrillResult, reroute_at: float | None
) -> tuple[float | None, int, str]:
    """The largest recorded per-region P99 outside the detection window, from the fault -
    `SAMPLE_SECONDS` x 4 to now, read back every SAMPLE_SECONDS."""
    assert result.fault_at is not None
    if reroute_at is None:
        return None, 0, "(never rerouted)"
    end = recorded_detection_end(reroute_at, ctx.spec, ctx.endpoints.federated)
    start, stop = result.fault_at - 4 * SAMPLE_SECONDS, time.time()
    record = p99_record(ctx.spec)
    try:
        series = ctx.probe.prometheus.range(record, start, stop, SAMPLE_SECONDS)
        stamps = ctx.probe.prometheus.range(f"timestamp({record})", start, stop, SAMPLE_SECONDS)
    except PrometheusError as exc:
        return None, 0, f"(unreadable: {exc})"
    # Each point at the time its recording was evaluated, not the query step that shows it: a
    # loaded Prometheus misses evaluations, and a step then shows the last one, from before.
    evaluated = {_key(labels): dict(points) for labels, points in stamps}
    worst: float | None = None
    where = ""
    total = 0
    for labels, values in series:
        at = evaluated.get(_key(labels), {})
        values = [(at.get(t, t), v) for t, v in values]
        value, count = max_outside(values, result.fault_at, end)
        total += count
        if value is not None and (worst is None or value > worst):
            # Which region and when: a spike of the machine's own (a loaded CPU stalls the
            # surviving region too) reads differently from the fault outliving its window.
            worst_at = next(t for t, v in values if v == value and not result.fault_at <= t < end)
            worst = value
            where = f"; worst in {dict(labels)} at fault {worst_at - result.fault_at:+.1f} s"
    window = f"{end - result.fault_at:.1f}"
    return (
        worst,
        total,
        f"outside the fault -> reroute + its rate window (the first {window} s){where}",
    )


def _key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def _s(value: Any) -> str:
    return "-" if value is None else f"{float(value):.3f} s"


__all__ = [
    "ClientSample",
    "ClientSummary",
    "RoutingSample",
    "RoutingSummary",
    "Samplers",
    "build_not_applicable",
    "drill_latency_persistent",
    "max_outside",
    "nearest_rank",
    "recorded_detection_end",
    "routes_away",
    "summarize_clients",
    "summarize_routing",
]
