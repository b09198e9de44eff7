"""Token quotas per tenant x intent (design notes 4.2), token buckets shared through Redis.

Per request (`QuotaGate.admit`): the tenant (`TenantResolver`: API key from the keys file, then
the tenant header, then the default), the intent (`redline.gateway.intent`), the token estimate
(`redline.gateway.tokens`: prompt + expected completion), then the most specific limit of the
spec's `quotas.limits` matching them (named tenant over `*`, named intent over `*`, a `model`
scope over none). Its bucket is charged estimate + the limit's safety buffer by one atomic Lua
script (`BUCKET_SCRIPT`) in Redis, so every gateway replica draws from the same bucket; the
keys carry the tenant as a hash tag (`{tenant}`) so one tenant's buckets live in one Redis
Cluster slot. A prompt longer than usual may overdraw the bucket by (factor - 1) x capacity, the
factor 1 + slope x prompt / per_tokens capped at `elastic.max_factor` (<= 2).

An empty bucket rejects (429 with `Retry-After`: the seconds until the refill covers the
request) or, with `overflow: downgrade`, sends the request to the lighter model (its `model`
rewritten) without charging the bucket. When the upstream has answered (`settle`), the
reservation is trued up against the reported usage: the unused part is refunded, an overrun
charged; a failed request is refunded whole. The estimator's error is observed then too. The
true-ups are summed per bucket and sent by one background task every
`SETTLE_INTERVAL_SECONDS`, so the request path holds one Redis round trip (the take, an EVALSHA
over `redline.gateway.resp`'s pipelined connection) and a response never waits for Redis.

Redis unreachable: `on_store_error` admits every request (`fail_open`) or answers 503
(`fail_closed`), counted in `llm_quota_store_failures_total{action}`; after a failure Redis is
not asked again for `STORE_RETRY_SECONDS`, so an outage costs one timeout, not one per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import Counter, Gauge, Histogram
from pydantic import ValidationError

from redline.core.redisconn import is_cluster, open_async_redis
from redline.gateway.intent import IntentClassifier, load_classifier
from redline.gateway.metrics import build_series
from redline.gateway.resp import RespConnection, RespError, lean_url
from redline.gateway.settings import GatewaySettings
from redline.gateway.tokens import Estimate, TokenEstimator, error_ratio, load_tokenizer
from redline.platform.spot import requested_max_tokens
from redline.slo import catalog
from redline.slo.spec import ANY, QuotaLimit, Quotas

log = logging.getLogger(__name__)

DEFAULT_KEY_PREFIX = "redline:quota:"
STORE_RETRY_SECONDS = 1.0
MAX_CACHED_CHILDREN = 4096
"""(tenant, intent, outcome) triples whose counter children are kept (header tenants beyond
the label bound all map to "other", so this is only a ceiling)."""
SETTLE_INTERVAL_SECONDS = 0.1
"""Settlements are sent at most this long after the answer, all buckets in one round trip."""
OTHER_TENANT = "other"
BUCKET_TTL_MS = 3_600_000
"""A bucket idle this long is dropped (it would be full again anyway)."""

BUCKET_SCRIPT = """
-- KEYS[1]: the bucket (hash: level, ts). ARGV: op ('take' | 'adjust'), refill per second,
-- capacity, amount, floor (how far below zero a take may go), ttl in ms.
-- Redis' own clock, so replicas with skewed clocks agree.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, capacity = tonumber(ARGV[2]), tonumber(ARGV[3])
local amount, floor = tonumber(ARGV[4]), tonumber(ARGV[5])
local state = redis.call('HMGET', KEYS[1], 'level', 'ts')
local level, ts = tonumber(state[1]), tonumber(state[2])
if level == nil or ts == nil then level = capacity; ts = now end
level = math.min(capacity, level + math.max(0, now - ts) * rate)
local ok = 1
if ARGV[1] == 'take' then
  if level - amount >= -floor then level = level - amount else ok = 0 end
else
  level = math.min(capacity, level + amount)
end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[6]))
return {ok, tostring(level)}
"""


class QuotaConfigError(Exception):
    """The quotas cannot be enforced with this configuration (an unreadable keys file)."""


class QuotaStoreError(Exception):
    """Redis did not answer a bucket operation."""


def bucket_key(prefix: str, tenant: str, limit: QuotaLimit) -> str:
    """The Redis key of `tenant`'s bucket of `limit`; `{tenant}` is the Cluster hash tag."""
    return f"{prefix}{{{tenant}}}:{limit.intent}:{limit.model or ANY}"


def elastic_factor(quotas: Quotas, prompt_tokens: int) -> float:
    """1 + slope x prompt / per_tokens, capped at elastic.max_factor."""
    e = quotas.elastic
    return min(e.max_factor, 1.0 + e.slope * prompt_tokens / e.per_tokens)


def retry_after(level: float, cost: float, floor: float, capacity: float, rate: float) -> int:
    """Whole seconds until the bucket's refill lets a `cost` take through (at least 1); a cost
    the bucket can never hold waits for a full bucket."""
    if cost > capacity + floor:
        need = capacity - level
    else:
        need = cost - floor - level
    return max(1, math.ceil(need / rate))


def pick_limit(quotas: Quotas, tenant: str, intent: str, model: str) -> QuotaLimit | None:
    """The most specific limit matching (tenant, intent, model); None when none does."""
    best: QuotaLimit | None = None
    best_rank = -1
    for limit in quotas.limits:
        if limit.tenant not in (ANY, tenant) or limit.intent not in (ANY, intent):
            continue
        if limit.model is not None and limit.model != model:
            continue
        rank = 4 * (limit.tenant != ANY) + 2 * (limit.intent != ANY) + (limit.model is not None)
        if rank > best_rank:
            best, best_rank = limit, rank
    return best


def load_api_keys(path: Path) -> dict[str, str]:
    """API key -> tenant from a YAML or JSON mapping; QuotaConfigError naming the file."""
    where = f"quotas.tenants.api_keys_file: {path}"
    try:
        data = yaml.safe_load(path.read_text("utf-8"))
    except OSError as exc:
        raise QuotaConfigError(f"{where}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise QuotaConfigError(f"{where}: malformed YAML: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise QuotaConfigError(f"{where}: expected a non-empty mapping of API key -> tenant")
    keys = {}
    for key, tenant in data.items():
        if not isinstance(key, str) or not isinstance(tenant, str) or not key or not tenant:
            raise QuotaConfigError(f"{where}: every key and tenant must be a non-empty string")
        keys[key] = tenant
    return keys


class TenantResolver:
    """A request's tenant: its API key in the keys file, its tenant header, or the default."""

    def __init__(self, quotas: Quotas, max_labels: int = 64) -> None:
        tenants = quotas.tenants
        path = tenants.api_keys_file
        self.keys = {} if path is None else load_api_keys(Path(path))
        self.header = tenants.header
        self.default = tenants.default
        self.known = {self.default, *self.keys.values()}
        self.known.update(limit.tenant for limit in quotas.limits if limit.tenant != ANY)
        self.max_labels = max_labels
        self.seen: set[str] = set()

    def resolve(self, headers: Mapping[str, str]) -> str:
        """The tenant of a request with these headers."""
        if self.keys:
            auth = headers.get("authorization", "")
            key = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key")
            if key and key in self.keys:
                return self.keys[key]
        if self.header is not None:
            named = headers.get(self.header)
            if (
                named
                and len(named) <= 64
                and named.replace("-", "").replace("_", "").replace(".", "").isalnum()
            ):
                return named
        return self.default

    def label(self, tenant: str) -> str:
        """`tenant` as a label value, bounded: header tenants past `max_labels` are "other"."""
        if tenant in self.known or tenant in self.seen:
            return tenant
        if len(self.seen) < self.max_labels:
            self.seen.add(tenant)
            return tenant
        return OTHER_TENANT


class TokenBuckets:
    """The buckets in Redis, through `BUCKET_SCRIPT`: over `lean` (a `RespConnection`) when
    the Redis URL is a plain one, else over redis-py (Sentinel, TLS)."""

    def __init__(self, client: aioredis.Redis, lean: RespConnection | None = None) -> None:
        self.client = client
        self.lean = lean
        self.script = client.register_script(BUCKET_SCRIPT)

    async def _evalsha_once(self, *args: str | float | int) -> Any:
        if self.lean is not None:
            return await self.lean.execute("EVALSHA", self.script.sha, 1, *args)
        return await self.client.evalsha(self.script.sha, 1, *args)

    async def _evalsha(self, *args: str | float | int) -> Any:
        """EVALSHA of `BUCKET_SCRIPT` (KEYS[1] first in `args`); the script is loaded again
        only when Redis has lost it (a restart, SCRIPT FLUSH). QuotaStoreError otherwise."""
        try:
            try:
                return await self._evalsha_once(*args)
            except (redis.exceptions.NoScriptError, RespError) as exc:
                # redis-py's NoScriptError is NOSCRIPT without the code in its message
                if isinstance(exc, RespError) and "NOSCRIPT" not in str(exc):
                    raise
                self.script.sha = await self.client.script_load(BUCKET_SCRIPT)
                return await self._evalsha_once(*args)
        except (redis.exceptions.RedisError, RespError, OSError) as exc:
            raise QuotaStoreError(f"{type(exc).__name__}: {exc}") from exc

    async def take(
        self, key: str, rate: float, capacity: float, amount: float, floor: float
    ) -> tuple[bool, float]:
        """Charge `amount` if the level stays >= -floor: (taken, level after); one round trip."""
        ok, level = await self._evalsha(key, "take", rate, capacity, amount, floor, BUCKET_TTL_MS)
        return int(ok) == 1, float(level)

    async def adjust_many(self, adjustments: list[tuple[str, float, float, float]]) -> list[float]:
        """Add each (key, rate, capacity, amount)'s amount (negative: charge), capped at
        capacity, all sent at once (pipelined); the levels after, in order."""
        if self.lean is not None or is_cluster(self.client):
            # Pipelined on the lean connection: one wait for all. A Cluster pipeline refuses
            # scripts by name: concurrent calls on the pool instead (each bucket its own slot).
            calls = [self._adjust_lean(*adjustment) for adjustment in adjustments]
            return list(await asyncio.gather(*calls))
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for key, rate, capacity, amount in adjustments:
                    args = ("adjust", rate, capacity, amount, 0.0, BUCKET_TTL_MS)
                    await self.script(keys=[key], args=args, client=pipe)
                replies = await pipe.execute()
        except (redis.exceptions.RedisError, OSError) as exc:
            raise QuotaStoreError(f"{type(exc).__name__}: {exc}") from exc
        return [float(level) for _, level in replies]

    async def _adjust_lean(self, key: str, rate: float, capacity: float, amount: float) -> float:
        _, level = await self._evalsha(key, "adjust", rate, capacity, amount, 0.0, BUCKET_TTL_MS)
        return float(level)


@dataclass
class QuotaTicket:
    """What `settle` needs of an admitted request."""

    tenant: str
    intent: str
    model: str
    estimate: Estimate
    key: str | None = None
    rate: float = 0.0
    capacity: float = 0.0
    reserved: int = 0


@dataclass(frozen=True)
class Refusal:
    """A request the quotas turn away: status, message, headers."""

    status: int
    message: str
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Admission:
    """The quota verdict: the ticket to settle, a model to rewrite to, or a refusal."""

    ticket: QuotaTicket | None
    model: str | None = None
    refusal: Refusal | None = None


class QuotaMetrics:
    """The quota series, registered on the gateway's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def series(metric: catalog.Metric) -> Any:
            return build_series(metric, registry, ())

        self.requests: Counter = series(catalog.LLM_QUOTA_REQUESTS_TOTAL)
        self.tokens: Counter = series(catalog.LLM_QUOTA_TOKENS_TOTAL)
        self.refunded: Counter = series(catalog.LLM_QUOTA_REFUNDED_TOKENS_TOTAL)
        self.utilisation: Gauge = series(catalog.LLM_QUOTA_UTILISATION_RATIO)
        self.store_failures: Counter = series(catalog.LLM_QUOTA_STORE_FAILURES_TOTAL)
        self.estimate_error: Histogram = series(catalog.LLM_TOKEN_ESTIMATE_ERROR_RATIO)
        for action in ("fail_open", "fail_closed"):
            self.store_failures.labels(action)


class QuotaGate:
    """Classify, estimate, draw from the bucket; settle against the real usage."""

    def __init__(
        self,
        quotas: Quotas,
        classifier: IntentClassifier,
        estimator: TokenEstimator,
        client: aioredis.Redis,
        registry: CollectorRegistry,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        max_tenant_labels: int = 64,
        lean: RespConnection | None = None,
    ) -> None:
        self.quotas = quotas
        self.classifier = classifier
        self.estimator = estimator
        self.client = client
        self.buckets = TokenBuckets(client, lean)
        self.tenants = TenantResolver(quotas, max_tenant_labels)
        self.metrics = QuotaMetrics(registry)
        self.key_prefix = key_prefix
        self.store_down_until = 0.0
        # True-ups wait here, summed per bucket, for one pipelined flush by one task at a
        # time: a settlement costs the request a dict update, never a round trip.
        self._pending: dict[str, _Settlement] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._children: dict[tuple[str, str, str], tuple[Counter, Counter]] = {}
        self._gauges: dict[tuple[str, str], Gauge] = {}
        self._errors: dict[tuple[str, str], Histogram] = {}

    async def aclose(self) -> None:
        """Send the pending settlements (waiting a second at most), then close the client."""
        if self._flusher is not None:
            self._flusher.cancel()
        try:
            await asyncio.wait_for(self.flush(), timeout=1.0)
        except TimeoutError:
            log.info("quota settlements still pending at shutdown were dropped")
        if self.buckets.lean is not None:
            self.buckets.lean.close()
        await self.client.aclose()

    def _count(self, tenant: str, intent: str, outcome: str, tokens: int) -> None:
        children = self._children.get((tenant, intent, outcome))
        if children is None:  # label lookups cost more than the increments: once per triple
            label = self.tenants.label(tenant)
            children = (
                self.metrics.requests.labels(label, intent, outcome),
                self.metrics.tokens.labels(label, intent, outcome),
            )
            if len(self._children) < MAX_CACHED_CHILDREN:
                self._children[(tenant, intent, outcome)] = children
        children[0].inc()
        children[1].inc(tokens)

    def _utilisation(self, tenant: str, intent: str, level: float, capacity: float) -> None:
        gauge = self._gauges.get((tenant, intent))
        if gauge is None:
            gauge = self.metrics.utilisation.labels(self.tenants.label(tenant), intent)
            if len(self._gauges) < MAX_CACHED_CHILDREN:
                self._gauges[(tenant, intent)] = gauge
        gauge.set(1.0 - level / capacity)

    def _estimate_error(self, intent: str, kind: str) -> Histogram:
        histogram = self._errors.get((intent, kind))
        if histogram is None:  # intents are a closed set: no bound needed
            histogram = self._errors[(intent, kind)] = self.metrics.estimate_error.labels(
                intent, kind
            )
        return histogram

    def _classify(self, payload: Mapping[str, Any]) -> str:
        try:
            return self.classifier.classify(payload)
        except Exception:  # noqa: BLE001 - a user's classifier must not fail the request
            log.exception("intent classifier failed; counting the request as chat")
            return "chat"

    async def admit(
        self, payload: Mapping[str, Any], headers: Mapping[str, str], model: str
    ) -> Admission:
        """The verdict on one request (never raises for a Redis outage: `on_store_error`)."""
        tenant = self.tenants.resolve(headers)
        intent = self._classify(payload)
        estimate = self.estimator.estimate(payload, model, intent, requested_max_tokens(payload))
        ticket = QuotaTicket(tenant, intent, model, estimate)
        limit = pick_limit(self.quotas, tenant, intent, model)
        if limit is None:
            self._count(tenant, intent, "unlimited", estimate.total)
            return Admission(ticket)
        cost = estimate.total + limit.safety_buffer_tokens
        capacity = float(limit.capacity)
        rate = limit.tokens_per_minute / 60.0
        floor = (elastic_factor(self.quotas, estimate.prompt) - 1.0) * capacity
        key = bucket_key(self.key_prefix, tenant, limit)
        now = time.monotonic()
        try:
            if now < self.store_down_until:
                raise QuotaStoreError("Redis failed less than a second ago")
            taken, level = await self.buckets.take(key, rate, capacity, cost, floor)
        except QuotaStoreError as exc:
            if now >= self.store_down_until:
                log.warning("quota store unavailable (%s): %s", exc, self.quotas.on_store_error)
                self.store_down_until = now + STORE_RETRY_SECONDS
            action = self.quotas.on_store_error
            self.metrics.store_failures.labels(action).inc()
            if action == "fail_open":
                self._count(tenant, intent, "admitted", estimate.total)
                return Admission(ticket)
            self._count(tenant, intent, "throttled", estimate.total)
            message = "the quota store is unavailable and quotas fail closed; retry shortly"
            return Admission(None, refusal=Refusal(503, message, {"retry-after": "1"}))
        self._utilisation(tenant, intent, level, capacity)
        if taken:
            ticket.key, ticket.rate, ticket.capacity, ticket.reserved = key, rate, capacity, cost
            self._count(tenant, intent, "admitted", estimate.total)
            return Admission(ticket)
        if limit.overflow == "downgrade":
            assert limit.downgrade_to is not None
            self._count(tenant, intent, "downgraded", estimate.total)
            ticket.model = limit.downgrade_to
            return Admission(ticket, model=limit.downgrade_to)
        self._count(tenant, intent, "throttled", estimate.total)
        wait = retry_after(level, cost, floor, capacity, rate)
        message = (
            f"token quota of tenant {tenant!r} for {intent} requests exhausted: this request "
            f"needs about {cost} tokens ({estimate.prompt} prompt, {estimate.completion} "
            f"expected completion, {limit.safety_buffer_tokens} safety buffer), "
            f"{limit.tokens_per_minute} tokens/min refill; retry in {wait} s"
        )
        if cost > capacity + floor:
            message += f" (it exceeds the bucket's {capacity + floor:.0f} tokens: shorten it)"
        return Admission(None, refusal=Refusal(429, message, {"retry-after": str(wait)}))

    def settle(
        self,
        ticket: QuotaTicket,
        status: int,
        prompt_tokens: int | None,
        completion_tokens: int | None,
    ) -> None:
        """Observe the estimator's error and queue the reservation's true-up (never blocks)."""
        estimate = ticket.estimate
        if prompt_tokens is not None:
            ratio = error_ratio(estimate.prompt, prompt_tokens)
            if ratio is not None:
                self._estimate_error(ticket.intent, "prompt").observe(ratio)
            if completion_tokens is not None:
                ratio = error_ratio(estimate.total, prompt_tokens + completion_tokens)
                if ratio is not None:
                    self._estimate_error(ticket.intent, "total").observe(ratio)
        if status < 300:
            self.estimator.learn(
                estimate, ticket.model, ticket.intent, prompt_tokens, completion_tokens
            )
        if ticket.key is None or ticket.reserved <= 0:
            return
        if status >= 300:
            amount = ticket.reserved  # nothing was generated: all of it back
        elif prompt_tokens is None and completion_tokens is None:
            return  # no usage reported: the reservation stands
        else:
            amount = ticket.reserved - (prompt_tokens or 0) - (completion_tokens or 0)
        if amount == 0:
            return
        pending = self._pending.get(ticket.key)
        if pending is None:
            pending = self._pending[ticket.key] = _Settlement(ticket)
        pending.amount += amount
        if amount > 0:
            pending.refunded += amount
        if self._flusher is None:
            task = asyncio.get_running_loop().create_task(self._flush_later())
            self._flusher = task

    async def _flush_later(self) -> None:
        """Wait `SETTLE_INTERVAL_SECONDS`, send what is pending; again while more arrived."""
        try:
            while self._pending:
                await asyncio.sleep(SETTLE_INTERVAL_SECONDS)
                # Shielded: `aclose` cancels the wait, never a flush already sent.
                await asyncio.shield(self.flush())
        finally:
            self._flusher = None

    async def flush(self) -> None:
        """Send every pending true-up now: one pipelined round trip for all buckets."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        try:
            levels = await self.buckets.adjust_many(
                [(key, p.ticket.rate, p.ticket.capacity, p.amount) for key, p in pending.items()]
            )
        except QuotaStoreError as exc:
            log.info("quota settlement of %d buckets lost: %s", len(pending), exc)
            return
        for settlement, level in zip(pending.values(), levels, strict=True):
            ticket = settlement.ticket
            if settlement.refunded:
                label = self.tenants.label(ticket.tenant)
                self.metrics.refunded.labels(label, ticket.intent).inc(settlement.refunded)
            self._utilisation(ticket.tenant, ticket.intent, level, ticket.capacity)


@dataclass
class _Settlement:
    """The true-ups of one bucket waiting for the next flush, summed."""

    ticket: QuotaTicket
    amount: int = 0
    refunded: int = 0


def rewrite_model(body: bytes, model: str) -> bytes:
    """The request body with its `model` replaced."""
    payload = json.loads(body)
    payload["model"] = model
    return json.dumps(payload, separators=(",", ":")).encode()


def load_quotas_file(path: Path) -> Quotas:
    """The `quotas:` section of a YAML file, validated as the spec's; QuotaConfigError naming
    the file and field otherwise."""
    try:
        data = yaml.safe_load(path.read_text("utf-8"))
    except OSError as exc:
        raise QuotaConfigError(f"quotas_file: {path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise QuotaConfigError(f"quotas_file: {path}: malformed YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("quotas"), dict):
        raise QuotaConfigError(f"quotas_file: {path}: expected a mapping with a quotas: section")
    try:
        return Quotas.model_validate(data["quotas"])
    except ValidationError as exc:
        problems = "; ".join(
            f"quotas.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}".rstrip(".")
            for e in exc.errors()
        )
        raise QuotaConfigError(f"{path}: {problems}") from None


def build_quota_gate(
    settings: GatewaySettings, spec_quotas: Quotas, registry: CollectorRegistry
) -> QuotaGate | None:
    """The gate the settings and the spec ask for; None when quotas are off. Errors
    (QuotaConfigError, TokenizerConfigError, IntentConfigError) name the setting and file."""
    quotas = spec_quotas if settings.quotas_file is None else load_quotas_file(settings.quotas_file)
    enabled = quotas.enabled if settings.quotas is None else settings.quotas
    if not enabled:
        return None
    classifier = load_classifier(settings.intent_classifier)
    counter = load_tokenizer(settings.tokenizer, settings.tokenizer_file)
    estimator = TokenEstimator(
        counter, quotas.completion_quantile, quotas.default_completion_tokens
    )
    timeout = settings.redis_timeout_seconds
    client = open_async_redis(
        settings.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    # The per-request take over a lean pipelined connection when the URL is a plain one
    # (Sentinel, TLS: redis-py); the batched settlements always over redis-py.
    address = lean_url(settings.redis_url)
    return QuotaGate(
        quotas,
        classifier,
        estimator,
        client,
        registry,
        settings.quota_key_prefix,
        settings.max_tenant_labels,
        None if address is None else RespConnection(address, timeout),
    )
