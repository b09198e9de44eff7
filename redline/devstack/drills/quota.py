"""The quota drill: a burst of long summarisation prompts from tenant `batch` meets its token
quota (design notes 4.2) while tenant `interactive` chats on, unaffected.

The local stack's gateway runs the quotas of `LOCAL_QUOTAS_FILE` (tenants by the
`x-redline-tenant` header): `batch` may summarise 2000 tokens/min per model, a request for the
adapter beyond that is downgraded to the base model (the lighter one), a request for the base
model rejected (429 with Retry-After); `interactive` has a roomy chat quota, and the load
generator's requests (no tenant) none at all. The drill sends `BURST` long summarisation
prompts for each model from `batch`, a few at a time, and meanwhile chat from `interactive` at
`INTERACTIVE_RATE`/s. Checks: the batch requests over the quota were throttled or downgraded as
configured (per limit's `overflow`), the gateway counted each outcome in
`llm_quota_requests_total` exactly as the client saw it, every interactive request succeeded and
their client-side P99 stayed under the latency red line.

No alert is part of this loop: `QuotaThrottlingSustained` needs `quotas.throttle_alert_for`
(10 min) of throttling, far longer than the burst, so the drill checks it does not fire."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from redline.devstack.config import LOCAL_QUOTAS_FILE
from redline.devstack.drills.base import DrillError, DrillResult
from redline.devstack.drills.context import DrillContext
from redline.devstack.layout import ADAPTER, BASE_MODEL
from redline.gateway.quotas import load_quotas_file, pick_limit
from redline.slo import catalog
from redline.slo.alerts import Alert

ALERT = Alert.QUOTA_THROTTLING_SUSTAINED
BATCH = "batch"
INTERACTIVE = "interactive"
BURST = 12
"""Long summarisation prompts per model from `batch`: a few fit the 2000-token bucket."""
BURST_CONCURRENCY = 3
INTERACTIVE_RATE = 8.0
"""Chat requests per second from `interactive` while the burst runs (two clients)."""
INTERACTIVE_TAIL_SECONDS = 8.0
"""Interactive traffic goes on this long after the burst (downgraded work still running)."""
SUMMARY_WORDS = 1200
INTERACTIVE_MAX_TOKENS = 16
SUMMARY_MAX_TOKENS = 64


def summarise_prompt(index: int) -> str:
    """A long summarisation request (about `SUMMARY_WORDS` words of an incident log)."""
    lines = [
        f"{minute:02d}:{index % 60:02d} gateway p99 rose to {300 + 7 * minute} ms in region "
        f"primary while the batch importer replayed shard {minute % 9} and retried its writes"
        for minute in range(SUMMARY_WORDS // 24)
    ]
    return "Summarise the incident log below in three bullet points.\n" + "\n".join(lines)


def quantile(values: list[float], q: float) -> float:
    """The `q` quantile of `values` (nearest rank; 0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Tally:
    """What one tenant's requests got back, by model asked for."""

    statuses: dict[str, list[int]] = field(default_factory=dict)
    served: dict[str, list[str]] = field(default_factory=dict)
    retry_after: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, asked: str, response: httpx.Response, elapsed: float) -> None:
        """One answer."""
        with self.lock:
            self.statuses.setdefault(asked, []).append(response.status_code)
            self.latencies.append(elapsed)
            if response.status_code == 200:
                self.served.setdefault(asked, []).append(str(response.json().get("model")))
            elif response.status_code == 429:
                self.retry_after.append(response.headers.get("retry-after", ""))
            else:
                self.errors.append(f"{asked}: HTTP {response.status_code}: {response.text[:160]}")

    def failed(self, asked: str, exc: Exception) -> None:
        """One request that got no answer."""
        with self.lock:
            self.statuses.setdefault(asked, []).append(0)
            self.errors.append(f"{asked}: {type(exc).__name__}: {exc}")


def _post(
    client: httpx.Client, tenant: str, model: str, text: str, max_tokens: int, tally: Tally
) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
    }
    started = time.perf_counter()
    try:
        response = client.post(
            "/v1/chat/completions", json=body, headers={"x-redline-tenant": tenant}
        )
    except httpx.HTTPError as exc:
        tally.failed(model, exc)
        return
    tally.record(model, response, time.perf_counter() - started)


def _interactive(url: str, stop: threading.Event, tally: Tally, offset: float) -> None:
    """Chat from `interactive` at half `INTERACTIVE_RATE` (each of two clients) until stopped."""
    period = 2.0 / INTERACTIVE_RATE
    with httpx.Client(base_url=url, timeout=10.0, trust_env=False) as client:
        next_at = time.monotonic() + offset
        number = 0
        while not stop.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            number += 1
            text = f"Hi! Suggest a name for a golden retriever puppy, idea {number}."
            _post(client, INTERACTIVE, ADAPTER, text, INTERACTIVE_MAX_TOKENS, tally)
            next_at += period


def _quota_count(ctx: DrillContext, tenant: str, outcome: str) -> float:
    """The gateway's `llm_quota_requests_total` of a tenant and outcome, summed (0 if none)."""
    requests = catalog.LLM_QUOTA_REQUESTS_TOTAL
    value = ctx.probe.value(f'sum({requests}{{tenant="{tenant}",outcome="{outcome}"}})')
    return value or 0.0


def drill_quota(ctx: DrillContext) -> DrillResult:
    """Batch summarisation burst -> throttled/downgraded and counted; interactive chat
    unaffected (all succeed, client P99 under the red line)."""
    spec = ctx.spec
    red_line = spec.red_lines.latency_p99.threshold_seconds
    result = DrillResult("quota", ALERT, None, 0.0, expect_alert=False)
    if not ctx.endpoints.has_gateway:
        result.not_applicable = f"no gateway in the {ctx.endpoints.source} stack: no quotas"
        return result
    quotas = load_quotas_file(LOCAL_QUOTAS_FILE)
    overflow: dict[str, str] = {}
    for model in (ADAPTER, BASE_MODEL):
        limit = pick_limit(quotas, BATCH, "summarise", model)
        if limit is None:
            raise DrillError(
                f"{LOCAL_QUOTAS_FILE}: no summarise quota of tenant {BATCH} for {model}"
            )
        overflow[model] = limit.overflow
        if limit.overflow == "downgrade":
            result.notes.append(f"{model}: downgrade to {limit.downgrade_to}")
    outcomes = ("admitted", "throttled", "downgraded")
    before = {o: _quota_count(ctx, BATCH, o) for o in outcomes}
    admitted_interactive = _quota_count(ctx, INTERACTIVE, "admitted")
    clients_before = sum(ctx.probe.loadgen_failures().values())
    url = ctx.endpoints.gateway_url
    batch, chat = Tally(), Tally()
    stop = threading.Event()
    chatters = [
        threading.Thread(
            target=_interactive,
            args=(url, stop, chat, i / INTERACTIVE_RATE),
            name=f"quota-interactive-{i}",
            daemon=True,
        )
        for i in range(2)
    ]
    result.fault = (
        f"tenant {BATCH}: {BURST} long summarisation prompts (~{SUMMARY_WORDS} "
        f"words) for each of {ADAPTER} and {BASE_MODEL}, {BURST_CONCURRENCY} at a "
        f"time; tenant {INTERACTIVE}: chat at {INTERACTIVE_RATE:g}/s"
    )
    result.fault_at = time.time()
    ctx.say(result.drill, f"burst: {result.fault}")
    for chatter in chatters:
        chatter.start()
    try:
        with (
            httpx.Client(base_url=url, timeout=30.0, trust_env=False) as client,
            ThreadPoolExecutor(BURST_CONCURRENCY, thread_name_prefix="quota-batch") as pool,
        ):
            jobs = [
                pool.submit(
                    _post, client, BATCH, model, summarise_prompt(i), SUMMARY_MAX_TOKENS, batch
                )
                for i in range(BURST)
                for model in (ADAPTER, BASE_MODEL)
            ]
            for job in jobs:
                job.result()
        time.sleep(INTERACTIVE_TAIL_SECONDS)
    finally:
        stop.set()
        for chatter in chatters:
            chatter.join(timeout=15.0)
    burst_ended = time.time()
    throttled = downgraded = admitted = 0
    for model, action in overflow.items():
        statuses = batch.statuses.get(model, [])
        served = batch.served.get(model, [])
        refused = statuses.count(429)
        moved = sum(m != model for m in served)
        throttled, downgraded = throttled + refused, downgraded + moved
        admitted += len(served) - moved
        if action == "reject":
            retry_ok = all(r.isdigit() and int(r) >= 1 for r in batch.retry_after)
            result.check(
                f"{model}: the batch burst is throttled (429 with Retry-After)",
                refused > 0 and retry_ok and set(statuses) <= {200, 429} and not moved,
                f"{statuses.count(200)} admitted, {refused} throttled of {len(statuses)}; "
                f"Retry-After {sorted(set(batch.retry_after))} s",
            )
        else:
            result.check(
                f"{model}: the batch burst is downgraded to the lighter model",
                moved > 0 and set(statuses) == {200},
                f"{len(served) - moved} served by {model}, {moved} by "
                f"{sorted(set(served) - {model})} of {len(statuses)}",
            )
    expected = {"admitted": admitted, "throttled": throttled, "downgraded": downgraded}
    chat_total = len(chat.latencies) + sum(s == 0 for s in chat.statuses.get(ADAPTER, []))
    chat_ok = sum(s == 200 for s in chat.statuses.get(ADAPTER, []))

    def seen_now() -> tuple[dict[str, float], float]:
        batch_seen = {o: _quota_count(ctx, BATCH, o) - before[o] for o in outcomes}
        return batch_seen, _quota_count(ctx, INTERACTIVE, "admitted") - admitted_interactive

    def counted() -> tuple[dict[str, float], float] | None:
        now = seen_now()  # a scrape (1 s locally) behind the client
        complete = all(now[0][o] >= expected[o] for o in outcomes) and now[1] >= chat_ok
        return now if complete else None

    try:
        seen, interactive_counted = ctx.wait_for(
            result.drill, "the gateway's quota series to count the burst", counted, 20.0, 0.5
        )
    except DrillError:
        seen, interactive_counted = seen_now()
    result.check(
        "counted in the quota series",
        all(seen[o] == expected[o] for o in outcomes),
        ", ".join(f"{o} {seen[o]:g} (client saw {expected[o]})" for o in outcomes),
    )
    result.check(
        "every interactive request succeeds",
        chat_total > 0 and chat_ok == chat_total and not chat.errors,
        f"{chat_ok}/{chat_total} answered 200; {chat.errors[:3]}",
    )
    p99 = quantile(chat.latencies, 0.99)
    result.check(
        "interactive client P99 under the red line",
        0 < p99 < red_line,
        f"P99 {p99 * 1000:.0f} ms over {len(chat.latencies)} requests < {red_line:g} s "
        f"(P50 {quantile(chat.latencies, 0.5) * 1000:.0f} ms)",
    )
    result.check(
        "the interactive tenant is counted as admitted",
        interactive_counted >= chat_ok > 0,
        f"{interactive_counted:g} admitted in the series, {chat_ok} answered",
    )
    firing = [a for a in ctx.probe.alerts(ALERT, {"tenant": BATCH}) if a["state"] == "firing"]
    result.check(
        f"{ALERT} does not fire (a burst, not sustained)", not firing, f"{len(firing)} firing"
    )
    result.failed_requests = sum(ctx.probe.loadgen_failures().values()) - clients_before
    result.failed_requests += chat_total - chat_ok
    result.failed_detail = "load generator and interactive requests that failed during the drill"
    result.recovered_at = burst_ended  # nothing to recover from: the burst is over
    result.figure("batch admitted", admitted)
    result.figure("batch throttled", throttled)
    result.figure("batch downgraded", downgraded)
    result.figure("interactive requests", chat_total)
    result.figure("interactive P99", p99, "s")
    result.lost_detail = "n/a: a quota refuses or redirects requests, it writes no data"
    ctx.say(
        result.drill,
        f"batch: {admitted} admitted, {throttled} throttled, {downgraded} "
        f"downgraded; interactive: {chat_ok}/{chat_total} ok, P99 {p99 * 1000:.0f} ms "
        f"(red line {red_line:g} s)",
    )
    return result


__all__ = ["drill_quota"]
