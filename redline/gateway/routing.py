"""The order a request tries the regions in: routing store, region health, balance.

The routing override and closed regions come from Redis (`redline.platform.routing`), refreshed
in the background every `routing_refresh_seconds` (<= 1 s), so Redis is never on a request's
path; while Redis is unreachable the configured order applies. Regions whose admission is closed
(in Redis, or by a spot drain in this process), or that failed `unhealthy_after_failures` times
in a row within `unhealthy_cooldown_seconds`, go last. Regions whose circuit breaker is open
(`redline.gateway.breakers`, thresholds from the spec's `breakers`) go after all of them; each
breaker transition is logged, counted, shown in the state gauge and added as a
`breaker.transition` event to the current span (a no-op when tracing is off).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis.exceptions
from opentelemetry import trace

from redline.gateway.breakers import BreakerBoard, BreakerConfig, Transition
from redline.gateway.metrics import GatewayMetrics
from redline.gateway.settings import GatewaySettings
from redline.platform.routing import (
    AsyncRoutingReader,
    RoutingError,
    RoutingState,
    build_region_order,
)
from redline.slo.spec import Breakers

log = logging.getLogger(__name__)


@dataclass
class RegionHealth:
    """Consecutive failures of one region, and until when it is tried last."""

    consecutive_failures: int = 0
    unhealthy_until: float = 0.0


class RegionRouter:
    """The routing state read from Redis, each region's health, and the order to try them in."""

    def __init__(
        self, settings: GatewaySettings, metrics: GatewayMetrics, breakers: Breakers | None = None
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.regions = list(settings.upstreams)
        self.breakers: BreakerBoard | None = None
        if breakers is not None and breakers.enabled:
            config = BreakerConfig.from_spec(breakers)
            self.breakers = BreakerBoard(self.regions, config, self._breaker_moved)
        self.routing = RoutingState()
        self.store_up = False
        self.health = {region: RegionHealth() for region in self.regions}
        self._turn = 0
        self._reader: AsyncRoutingReader | None = None

    def open(self) -> None:
        """Create the routing reader (it connects on first use)."""
        s = self.settings
        self._reader = AsyncRoutingReader.from_url(
            s.redis_url, s.routing_key_prefix, s.redis_timeout_seconds
        )

    async def close(self) -> None:
        """Close the routing reader."""
        if self._reader is not None:
            await self._reader.aclose()
            self._reader = None

    async def refresh(self) -> None:
        """Read the routing state; on any Redis failure use the configured order."""
        if self._reader is None:
            return
        try:
            state = await self._reader.fetch_state(self.regions)
        except (redis.exceptions.RedisError, OSError, RoutingError) as exc:
            if self.store_up:
                log.warning("routing store unreachable, using the configured order: %s", exc)
            self.routing = RoutingState()
            self.store_up = False
        else:
            if not self.store_up:
                log.info("routing store reachable")
            self.routing = state
            self.store_up = True
        self.metrics.routing_store_up.set(1 if self.store_up else 0)
        now = time.monotonic()
        for region in self.regions:
            healthy = 0 if self.unhealthy(region, now) else 1
            self.metrics.upstream_healthy.labels(region).set(healthy)

    def unhealthy(self, region: str, now: float) -> bool:
        """Whether `region` failed repeatedly and its cooldown has not passed at `now`."""
        return now < self.health[region].unhealthy_until

    def order(self, now: float, draining: frozenset[str]) -> list[str]:
        """Regions in the order this request tries them; `draining` ones count as closed."""
        unhealthy = frozenset(r for r in self.regions if self.unhealthy(r, now))
        routing = self.routing
        if draining:
            routing = RoutingState(routing.override, routing.closed | draining)
        order = build_region_order(self.regions, routing, unhealthy)
        if self.settings.balance != "failover" or self.settings.spill_regions:
            order = self._balance(order, routing, routing.closed | unhealthy)
        if self.breakers is not None:
            order = self.breakers.order(order)
        return order

    def _breaker_moved(self, transition: Transition) -> None:
        """Log, count and trace one breaker transition."""
        level = logging.INFO if transition.after == "half_open" else logging.WARNING
        log.log(
            level,
            "breaker %s: %s -> %s (%s)",
            transition.region,
            transition.before,
            transition.after,
            transition.reason,
        )
        self.metrics.breaker_moved(transition.region, transition.before, transition.after)
        trace.get_current_span().add_event("breaker.transition", transition.attributes())

    def admit(self, region: str) -> bool:
        """Whether an attempt may go to `region` now (its breaker is not open, or it probes)."""
        return self.breakers is None or self.breakers.admit(region)

    def released(self, region: str) -> None:
        """A spot agent released `region` (its replacement is ready): close its breaker."""
        if self.breakers is not None:
            self.breakers.close(region, "released after a spot replacement's readiness gate")

    def attempted(self, region: str, ok: bool, seconds: float) -> None:
        """Record one attempt's outcome and latency in the region's breaker."""
        if self.breakers is not None:
            self.breakers.record(region, ok, seconds)

    def _balance(
        self, order: list[str], routing: RoutingState, blocked: frozenset[str]
    ) -> list[str]:
        """Round robin over the open non-spill upstreams, then open spill ones, then the rest."""
        target = routing.override.target_region if routing.override else None
        head = [target] if target in order and target not in blocked else []
        rest = [r for r in order if r not in head]
        spill = self.settings.spill_regions
        primary = [r for r in rest if r not in blocked and r not in spill]
        if self.settings.balance == "round_robin" and len(primary) > 1:
            self._turn += 1
            turn = self._turn % len(primary)
            primary = primary[turn:] + primary[:turn]
        spare = [r for r in rest if r not in blocked and r in spill]
        return head + primary + spare + [r for r in rest if r in blocked]

    def failed(self, region: str) -> None:
        """Count a failed attempt; past the threshold the region is tried last for a while."""
        health = self.health[region]
        health.consecutive_failures += 1
        threshold = self.settings.unhealthy_after_failures
        if threshold and health.consecutive_failures >= threshold:
            health.unhealthy_until = time.monotonic() + self.settings.unhealthy_cooldown_seconds

    def succeeded(self, region: str) -> None:
        """A region answered: it is healthy again."""
        health = self.health[region]
        health.consecutive_failures = 0
        health.unhealthy_until = 0.0
