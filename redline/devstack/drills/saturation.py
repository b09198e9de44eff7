"""The saturation drill (engine stacks: `redline up --source vllm`, sglang, tgi, nim): load rises
on the primary until its engines queue; `EngineSaturationRising` (a ticket) must fire at least
`MIN_LEAD_SECONDS` before `RedLineLatencyP99`.

The primary's two pods get a batch limit of two requests each (`Faults.max_concurrency`, vLLM's
--max-num-seqs) and a 0.1 s service time, so the region serves about 25 requests/s (HTTP's own
cost included). The load generator is paused, and the drill's own users arrive one more every
`STEP_SECONDS`, each sending its next request as soon as the last one is answered (a closed
loop): past the four slots the engines queue, and every new user adds one request to the queue
and a quarter of a service time to every request's wait, until the P99 crosses the red line
(at about 18 users). The warning fires a window (20 s locally) after the queue stops emptying
(at about 5 users), so the lead is about (18 - 5) steps less the window: 84 s at 8 s a step.
Measured before: one slot per pod, 45 s; two slots at 6 s a step with a 30 s window, 52 s.
The lead is the time from the warning to the red line's alert, both read from Prometheus'
alerts. Then the users leave, the fault is removed, and both alerts must resolve before the
load generator resumes.
"""

from __future__ import annotations

import threading
import time

import httpx

from redline.devstack.drills.base import DrillError, DrillResult
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.waits import (
    LoadgenPause,
    budget_for,
    require_quiet,
    wait_acknowledged,
    wait_recovered,
)
from redline.devstack.layout import BASE_MODEL
from redline.rules.families.saturation import saturation_expr, saturation_records
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import parse_duration

NAME = "saturation"
SERVICE_SECONDS = 0.1
"""Each request's service time on the primary (a short answer's decode)."""
BATCH = 2
"""Requests each primary pod runs at once."""
STEP_SECONDS = 8.0
"""One more user this often: the queue grows by about one request a step."""
MAX_USERS = 60
"""Users the ramp stops at (the red line breaks long before, at about 20)."""
MIN_LEAD_SECONDS = 60.0
"""The warning's lead over the red line the drill requires (issue #26's target)."""


class _Users:
    """Closed-loop users of the primary's service: each sends its next request once answered."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.sent = 0
        self.failed: list[str] = []

    def __len__(self) -> int:
        return len(self.threads)

    def add(self) -> None:
        """One more user."""
        thread = threading.Thread(
            target=self._loop, args=(len(self.threads),), name=f"saturation-user-{len(self)}"
        )
        thread.start()
        self.threads.append(thread)

    def _loop(self, user: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60.0, trust_env=False) as http:
            while not self.stop.is_set():
                body = {
                    "model": BASE_MODEL,
                    "messages": [{"role": "user", "content": f"User {user}: one more question."}],
                    "max_tokens": 8,
                }
                try:
                    response = http.post("/v1/chat/completions", json=body)
                    failure = None if response.status_code == 200 else str(response.status_code)
                except httpx.HTTPError as exc:
                    failure = type(exc).__name__
                with self.lock:
                    self.sent += 1
                    if failure is not None:
                        self.failed.append(failure)
                if failure is not None:
                    self.stop.wait(0.5)

    def close(self) -> None:
        """Every user leaves (the requests in flight end first)."""
        self.stop.set()
        for thread in self.threads:
            thread.join(90.0)


def _firing(ctx: DrillContext, alert: str, labels: dict[str, str]) -> bool:
    return any(a["state"] == "firing" for a in ctx.probe.alerts(alert, labels))


def drill_saturation(ctx: DrillContext) -> DrillResult:
    """Users pile up on the primary's engines -> EngineSaturationRising -> (later)
    RedLineLatencyP99; the lead between them is the drill's figure."""
    spec = ctx.spec
    red = spec.red_lines.latency_p99
    result = DrillResult(NAME, Alert.ENGINE_SATURATION_RISING, None, budget_for(ctx, 0.0))
    expr = saturation_expr(spec, saturation_records(spec))
    if expr is None:
        result.not_applicable = (
            f"the {ctx.endpoints.source} source publishes no engine queue: run it on an engine "
            "stack (`redline up --source vllm`, sglang, tgi or nim)"
        )
        ctx.say(NAME, f"does not apply: {result.not_applicable}")
        return result
    primary = ctx.endpoints.regions[0]
    labels = {"region": primary}
    require_quiet(ctx, result, labels)
    require_quiet(ctx, result, labels, Alert.RED_LINE_LATENCY_P99)
    # The warning's condition for the primary alone, as Prometheus evaluates it.
    queue = f'{catalog.ENGINE_QUEUE_RECORD}{{region="{primary}"}}'
    condition = f"count(({expr}) and on (region) {queue})"
    saved = ctx.probe.faults(primary)
    users = _Users(ctx.endpoints.client_url)
    loadgen = LoadgenPause(ctx)
    try:
        loadgen.pause("saturation: the saturation drill's users replace it")
        slow = {**saved, "latency": {"base_seconds": SERVICE_SECONDS, "jitter": "none"},
                "max_concurrency": BATCH}  # fmt: skip
        ctx.probe.set_faults(primary, slow)
        result.fault = (
            f"{primary}: a batch of {BATCH} per pod at {SERVICE_SECONDS} s a request, one more "
            f"user every {STEP_SECONDS:g} s (load generator paused)"
        )
        result.fault_at = time.time()
        ctx.say(NAME, f"fault injected: {result.fault}")
        condition_at = warned_at = breached_at = None
        users_at_warning = 0
        next_user = time.monotonic()
        deadline = next_user + MAX_USERS * STEP_SECONDS + 120.0
        while breached_at is None and time.monotonic() < deadline:
            if time.monotonic() >= next_user and len(users) < MAX_USERS:
                users.add()
                next_user += STEP_SECONDS
            if condition_at is None and ctx.probe.value(condition) is not None:
                condition_at = time.time()
            if warned_at is None and _firing(ctx, result.alert, labels):
                warned_at = result.firing_at = time.time()
                users_at_warning = len(users)
                ctx.say(NAME, f"{result.alert} firing with {len(users)} users")
            if _firing(ctx, Alert.RED_LINE_LATENCY_P99, labels):
                breached_at = time.time()
                ctx.say(NAME, f"{Alert.RED_LINE_LATENCY_P99} firing with {len(users)} users")
            time.sleep(0.5)
        if breached_at is None:
            raise DrillError(
                f"{Alert.RED_LINE_LATENCY_P99} did not fire with {len(users)} users queueing"
            )
        if warned_at is None or condition_at is None:
            raise DrillError(f"{Alert.RED_LINE_LATENCY_P99} fired, but {result.alert} never did")
        result.condition_delay = condition_at - result.fault_at
        result.condition_basis = (
            f"the primary's queue held requests for {red.saturation.window} and grew "
            "(the alert's own expression, polled)"
        )
        lead = breached_at - warned_at
        result.figure(f"warning lead over {Alert.RED_LINE_LATENCY_P99}", round(lead, 1), "s")
        result.figure("users at the warning", users_at_warning)
        result.figure("users at the red line", len(users))
        result.check(
            f"{result.alert} leads {Alert.RED_LINE_LATENCY_P99} by at least {MIN_LEAD_SECONDS:g} s",
            lead >= MIN_LEAD_SECONDS,
            f"{lead:.1f} s ({users_at_warning} users, then {len(users)})",
        )
        result.notified_at = wait_acknowledged(ctx, result, labels, "firing", 60.0)
        ctx.say(NAME, "the users leave; the primary's batch limit is lifted")
        users.close()
        ctx.probe.set_faults(primary, saved)
        result.remediated_at = time.time()
        wait_recovered(ctx, result, labels, parse_duration(red.saturation.window) + 60.0)

        def p99_clear() -> bool | None:
            return None if ctx.probe.alerts(Alert.RED_LINE_LATENCY_P99, labels) else True

        ctx.wait_for(NAME, f"{Alert.RED_LINE_LATENCY_P99} to resolve", p99_clear,
                     parse_duration(red.window) + 60.0, 0.5)  # fmt: skip
    finally:
        users.close()
        ctx.probe.set_faults(primary, saved)
        loadgen.resume()
    result.failed_requests = len(users.failed)
    result.failed_detail = f"{len(users.failed)} of {users.sent} users' requests failed" + (
        f": {', '.join(sorted(set(users.failed)))}" if users.failed else ""
    )
    result.lost_detail = "n/a: no data is written"
    return result


__all__ = ["MIN_LEAD_SECONDS", "drill_saturation"]
