"""The night-time latency drill: at a trickle of traffic, slow requests never reroute a region on
a P99 that is one request, but enough of them page a human (with or without the gateway: without
one the trickle goes to the primary's service, and nothing could reroute anyway).

The load generator is paused (its pause file: the requests in flight finish, no new one starts),
so the red line's window holds only the golden probe's few requests and the drill's own: a few a
window, every one slowed on the primary (the base model's version only, which the drill asks
for: the probe's adapter requests stay fast). Under `min_requests` the P99 over them is their
slowest, so `RedLineLatencyP99` (and its reroute) must stay silent; first with fewer slow
requests than `slow_requests_page` nothing fires at all, then with enough of them
`RedLineLatencySlowRequests` pages (no playbook: the receiver acknowledges it). The fault is
removed, the page resolves once the slow requests leave the window, the load generator resumes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from redline.devstack.drills.base import DrillError, DrillResult, parse_time
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.waits import (
    LoadgenPause,
    budget_for,
    job_matches,
    require_quiet,
    wait_acknowledged,
    wait_firing,
    wait_recovered,
)
from redline.devstack.layout import BASE_MODEL
from redline.platform.routing import RoutingStore
from redline.rules.records import window_requests_record, window_slow_requests_record
from redline.slo.alerts import Alert
from redline.slo.spec import parse_duration

NAME = "latency-night"
SLOW_SECONDS = 0.9
"""The base model's added latency on the primary: every night-time request is over 0.8 s."""
QUIET_ATTEMPTS = 3
"""How often the quiet phase is tried when the machine's own slow requests spoil it."""
BASE_VERSION = "base"
"""The simulators' version of the base model (`SimulatorSettings.base_model_version`)."""


class _Trickle:
    """The drill's own night-time requests (to the stack's client URL), and how they ended."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=30.0, trust_env=False)
        self.sent = 0
        self.failed: list[str] = []

    def send(self) -> None:
        """One chat request to the adapter, as a night-time user sends it."""
        self.sent += 1
        body = {
            "model": BASE_MODEL,
            "messages": [{"role": "user", "content": f"Good evening! Question {self.sent}."}],
            "max_tokens": 16,
        }
        try:
            response = self.http.post("/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            self.failed.append(type(exc).__name__)
            return
        if response.status_code != 200:
            self.failed.append(str(response.status_code))

    def close(self) -> None:
        """Close the client."""
        self.http.close()


def _window_requests(ctx: DrillContext, region: str) -> float:
    value = ctx.probe.value(f'{window_requests_record(ctx.spec)}{{region="{region}"}}')
    return value or 0.0


def _window_slow_requests(ctx: DrillContext, region: str) -> float:
    value = ctx.probe.value(f'{window_slow_requests_record(ctx.spec)}{{region="{region}"}}')
    return value or 0.0


def _quiet_phase(
    ctx: DrillContext,
    result: DrillResult,
    labels: dict[str, str],
    few: int,
    watch_p99: Callable[[], None],
) -> float | None:
    """Watch the page stay silent for twice the pipeline budget; the window's slow requests
    when it fired instead (None: silent throughout)."""
    red = ctx.spec.red_lines.latency_p99
    quiet_until = time.monotonic() + 2 * budget_for(ctx, red.for_seconds)
    while time.monotonic() < quiet_until:
        watch_p99()
        if ctx.probe.alerts(result.alert, labels):
            return max(_window_slow_requests(ctx, labels["region"]), float(few))
        time.sleep(0.5)
    return None


def drill_latency_night(ctx: DrillContext) -> DrillResult:
    """Trickle of slow requests -> no P99 red line, no reroute -> enough of them -> a page."""
    spec = ctx.spec
    red = spec.red_lines.latency_p99
    result = DrillResult(NAME, Alert.RED_LINE_LATENCY_SLOW_REQUESTS, None,
                         budget_for(ctx, red.for_seconds))  # fmt: skip
    if not red.min_requests or not red.slow_requests_page:
        result.not_applicable = (
            "red_lines.latency_p99.min_requests or slow_requests_page is 0: no evidence guard"
        )
        return result
    primary = ctx.endpoints.regions[0]
    labels = {"region": primary}
    require_quiet(ctx, result, labels)
    require_quiet(ctx, result, labels, Alert.RED_LINE_LATENCY_P99)
    window = parse_duration(red.window)
    few, more = red.slow_requests_page - 1, 3
    store = RoutingStore.from_url(ctx.endpoints.redis_url, regions=tuple(ctx.endpoints.regions))
    saved = ctx.probe.faults(primary)
    trickle = _Trickle(ctx.endpoints.client_url)
    loadgen = LoadgenPause(ctx)
    fired_p99: list[float] = []

    def watch_p99() -> None:
        if ctx.probe.alerts(Alert.RED_LINE_LATENCY_P99, labels):
            fired_p99.append(time.time())

    try:
        loadgen.pause("night: the latency-night drill")
        ctx.say(NAME, "night falls: the load generator paused")

        # Room under min_requests for the trickle twice over: the window stays a night's.
        room = red.min_requests - 2 * (few + more)

        def night() -> float | None:
            seen = _window_requests(ctx, primary)
            slow = _window_slow_requests(ctx, primary)
            quiet = slow == 0 and not ctx.probe.alerts(result.alert, labels)
            return seen if seen <= room and quiet else None

        versions = {**saved.get("versions", {}), BASE_VERSION: {"latency": {
            "base_seconds": SLOW_SECONDS, "jitter": "none"}}}  # fmt: skip
        # Phase 1: fewer slow requests than a page needs. A page now is wrong only if the window
        # holds no more slow requests than the drill's: on a busy machine the golden probe's own
        # requests can be slow too, and the phase is run again once the window has cleared.
        for attempt in range(1, QUIET_ATTEMPTS + 1):
            background = ctx.wait_for(NAME, f"the {red.window} window to hold night-time traffic",
                                      night, window + 60.0, 0.5)  # fmt: skip
            ctx.probe.set_faults(primary, {**saved, "versions": versions})
            for _ in range(few):
                trickle.send()
                watch_p99()
            paged_on = _quiet_phase(ctx, result, labels, few, watch_p99)
            if paged_on is None:
                break
            ctx.probe.set_faults(primary, saved)
            if paged_on <= few:
                raise DrillError(f"{result.alert} fired on {few} slow requests")
            ctx.say(
                NAME,
                f"{result.alert} fired on {paged_on:.0f} slow requests, {paged_on - few:.0f} "
                "not the drill's (a busy machine): phase 1 again",
            )
            result.figure("quiet phases retried (slow background requests)", attempt)
        else:
            raise DrillError(
                f"the machine's own requests kept the window over {few} slow requests "
                f"({QUIET_ATTEMPTS} tries): the quiet phase proved nothing"
            )
        result.figure("background requests in the window (golden probe)", round(background))
        result.check(f"{few} slow requests in {red.window} page nobody", True,
                     f"{_window_requests(ctx, primary):.0f} requests in the window")  # fmt: skip
        # Phase 2: enough slow requests for a human (those of phase 1 included), still far
        # under min_requests.
        result.fault = (
            f"night-time traffic: {few + more} requests of {BASE_MODEL} in {red.window}, each "
            f"+{SLOW_SECONDS} s on {primary} (min_requests {red.min_requests})"
        )
        result.fault_at = time.time()
        ctx.say(NAME, f"fault injected: {result.fault}")
        for _ in range(more):
            trickle.send()
            watch_p99()
        result.condition_delay = SLOW_SECONDS
        result.condition_basis = "the slow requests complete one injected latency later"
        wait_firing(ctx, result, labels, 60.0)
        result.notified_at = wait_acknowledged(ctx, result, labels, "firing", 60.0)
        watch_p99()
        override = store.get_override()
        result.check("the P99 red line never fired on too few requests", not fired_p99,
                     f"fired {len(fired_p99)} time(s)" if fired_p99 else "silent")  # fmt: skip
        reroutes = [
            job
            for job in ctx.probe.jobs("reroute")
            if job_matches(job, Alert.RED_LINE_LATENCY_P99, labels)
            and parse_time(job["created_at"]) >= (result.fault_at or 0.0)
        ]
        result.check("no reroute", override is None and not reroutes,
                     f"override: {override.target_region if override else None}")  # fmt: skip
        result.check("a human is paged (acknowledged, no playbook)", True,
                     f"{result.alert} firing, acknowledged by the receiver")  # fmt: skip
        ctx.say(NAME, f"repairing {primary}")
        ctx.probe.set_faults(primary, saved)
        result.remediated_at = time.time()
        # Still at night: resumed now, the morning's traffic would put the slow requests over
        # 1 % of a busy window (a P99 with evidence); they leave the window first.
        wait_recovered(ctx, result, labels, window + 60.0)
        result.resolved_notified_at = wait_acknowledged(ctx, result, labels, "resolved", 60.0)

        # The page resolves under `slow_requests_page` slow requests, not at none: the last few
        # must leave the window too, or the morning's traffic makes them a P99 with evidence
        # (4 of 300 is over 1 %) and the next drill starts on a reroute of this one's.
        def no_slow_left() -> bool | None:
            return True if _window_slow_requests(ctx, primary) == 0 else None

        ctx.wait_for(NAME, f"the night's slow requests to leave the {red.window} window",
                     no_slow_left, window + 60.0, 0.5)  # fmt: skip
        ctx.say(NAME, "morning: the load generator resumes")
        loadgen.resume()
    finally:
        ctx.probe.set_faults(primary, saved)
        loadgen.resume()
        trickle.close()
        store.close()
    result.failed_requests = len(trickle.failed)
    result.failed_detail = f"{len(trickle.failed)} of {trickle.sent} night-time requests failed" + (
        f": {', '.join(sorted(set(trickle.failed)))}" if trickle.failed else ""
    )
    result.figure("night-time requests", trickle.sent)
    result.lost_detail = "n/a: no data is written"
    return result


__all__ = ["drill_latency_night"]
