"""The gateway's routing store in Redis: a region-order override and per-region admission.

The reroute playbook writes here (`RoutingStore`, sync); the gateway reads here
(`AsyncRoutingReader`, one MGET per refresh) and caches the result, so Redis is never on a
request's path. Keys, under a prefix (default `redline:routing`) made a hash tag (`{<prefix>}`,
unless it holds one already) so the one MGET also runs on a Redis Cluster (one slot); earlier
releases used the untagged `<prefix>:...` (docs/redis.md):

- `{<prefix>}:override` — JSON `{"target_region", "reason", "set_at", "ttl_seconds"}`; an optional
  Redis expiry makes the override lapse by itself. While present, the gateway routes to
  `target_region` first and then the configured order.
- `{<prefix>}:admission:<region>` — JSON `{"reason", "closed_at"}`; present means the region's
  admission is closed (e.g. a spot node is draining): the gateway tries it only after every open
  region has failed.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis
import redis.asyncio

from redline.core.redisconn import hash_tagged, open_async_redis, open_redis

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "redline:routing"
# The gateway's response headers: the region that answered and whether the request was moved off
# its first choice. Here so the gateway (exporters) and the reroute playbook (remediation) share
# them without importing each other.
SERVED_REGION_HEADER = "x-redline-served-region"
REROUTED_HEADER = "x-redline-rerouted"
_REGION = re.compile(r"^[a-z][a-z0-9-]*$")


class RoutingError(Exception):
    """Bad routing input (unknown region, bad TTL) or an unreadable value in the store."""


@dataclass(frozen=True)
class RoutingOverride:
    """Route to `target_region` first; set for `reason`; lapses after `ttl_seconds` if set."""

    target_region: str
    reason: str
    set_at: float
    ttl_seconds: float | None = None

    @property
    def expires_at(self) -> float | None:
        """Unix time the override lapses, or None when it lasts until cleared."""
        return None if self.ttl_seconds is None else self.set_at + self.ttl_seconds


@dataclass(frozen=True)
class Admission:
    """Whether a region admits new requests, and why not if it does not."""

    region: str
    open: bool
    reason: str | None = None
    closed_at: float | None = None


@dataclass(frozen=True)
class RoutingState:
    """Everything the gateway needs to order regions: the override and the closed regions."""

    override: RoutingOverride | None = None
    closed: frozenset[str] = field(default_factory=frozenset)


def override_key(prefix: str) -> str:
    """Redis key of the override under `prefix` (hash-tagged, like every routing key)."""
    return f"{hash_tagged(prefix)}:override"


def admission_key(prefix: str, region: str) -> str:
    """Redis key of a region's admission flag under `prefix` (same slot as the override)."""
    return f"{hash_tagged(prefix)}:admission:{region}"


def _check_region(region: str, regions: Sequence[str] | None) -> None:
    if not _REGION.match(region):
        raise RoutingError(f"region {region!r} must be lowercase letters, digits and '-'")
    if regions is not None and region not in regions:
        raise RoutingError(f"unknown region {region!r}; allowed: {', '.join(regions)}")


def _check_ttl(ttl_seconds: float | None) -> None:
    if ttl_seconds is not None and not ttl_seconds > 0:
        raise RoutingError(f"ttl_seconds must be > 0 or None, got {ttl_seconds!r}")


def parse_override(raw: bytes | str) -> RoutingOverride:
    """Decode the stored override; RoutingError when it is not the JSON this module writes."""
    try:
        data = json.loads(raw)
        ttl = data.get("ttl_seconds")
        override = RoutingOverride(
            target_region=str(data["target_region"]),
            reason=str(data["reason"]),
            set_at=float(data["set_at"]),
            ttl_seconds=None if ttl is None else float(ttl),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RoutingError(f"unreadable routing override {raw!r}: {exc!r}") from None
    return override


def parse_admission(region: str, raw: bytes | str | None) -> Admission:
    """Decode a region's stored admission (absent means open)."""
    if raw is None:
        return Admission(region=region, open=True)
    try:
        data = json.loads(raw)
        return Admission(
            region=region,
            open=False,
            reason=str(data["reason"]),
            closed_at=float(data["closed_at"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        # A closed flag we cannot read is still a closed flag: admission stays closed.
        return Admission(region=region, open=False, reason="unreadable admission value")


def build_region_order(
    configured: Sequence[str], state: RoutingState, unhealthy: frozenset[str] = frozenset()
) -> list[str]:
    """Regions in the order to try: override target first, then configured order; regions that
    are closed or unhealthy go last (still tried, so routing state alone never fails a request).
    An override naming a region that is not configured is ignored."""
    order = list(configured)
    target = state.override.target_region if state.override else None
    if target in order:
        order.remove(target)
        order.insert(0, target)
    preferred = [r for r in order if r not in state.closed and r not in unhealthy]
    return preferred + [r for r in order if r not in preferred]


class RoutingStore:
    """Read and write the routing override and admission flags (sync; for playbooks and the CLI)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = DEFAULT_PREFIX,
        regions: Sequence[str] | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.regions = tuple(regions) if regions is not None else None

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        regions: Sequence[str] | None = None,
        timeout_seconds: float = 2.0,
    ) -> RoutingStore:
        """A store on a new Redis connection pool; call `close()` when done."""
        client = open_redis(
            url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds
        )
        return cls(client, prefix, regions)

    @property
    def override_key(self) -> str:
        """Redis key of the override."""
        return override_key(self.prefix)

    def admission_key(self, region: str) -> str:
        """Redis key of a region's admission flag."""
        return admission_key(self.prefix, region)

    def set_override(
        self, target_region: str, reason: str, ttl_seconds: float | None = None
    ) -> RoutingOverride:
        """Route to `target_region` first, until cleared or for `ttl_seconds`."""
        _check_region(target_region, self.regions)
        _check_ttl(ttl_seconds)
        override = RoutingOverride(target_region, reason, time.time(), ttl_seconds)
        value = json.dumps(
            {
                "target_region": target_region,
                "reason": reason,
                "set_at": override.set_at,
                "ttl_seconds": ttl_seconds,
            }
        )
        px = None if ttl_seconds is None else max(1, round(ttl_seconds * 1000))
        self.client.set(self.override_key, value, px=px)
        return override

    def clear_override(self) -> bool:
        """Remove the override; True if there was one."""
        return bool(self.client.delete(self.override_key))

    def get_override(self) -> RoutingOverride | None:
        """The current override, or None."""
        raw = self.client.get(self.override_key)
        return None if raw is None else parse_override(raw)

    def close_admission(
        self, region: str, reason: str, ttl_seconds: float | None = None
    ) -> Admission:
        """Stop sending new requests to `region` first (until opened, or for `ttl_seconds`)."""
        _check_region(region, self.regions)
        _check_ttl(ttl_seconds)
        now = time.time()
        px = None if ttl_seconds is None else max(1, round(ttl_seconds * 1000))
        value = json.dumps({"reason": reason, "closed_at": now})
        self.client.set(self.admission_key(region), value, px=px)
        return Admission(region=region, open=False, reason=reason, closed_at=now)

    def open_admission(self, region: str) -> bool:
        """Admit requests to `region` again; True if it was closed."""
        _check_region(region, self.regions)
        return bool(self.client.delete(self.admission_key(region)))

    def get_admission(self, region: str) -> Admission:
        """Whether `region` admits requests."""
        _check_region(region, self.regions)
        return parse_admission(region, self.client.get(self.admission_key(region)))

    def state(self, regions: Sequence[str]) -> RoutingState:
        """Override and closed regions among `regions`, in one round trip."""
        raws = self.client.mget([self.override_key, *(self.admission_key(r) for r in regions)])
        return _state(regions, raws)

    def close(self) -> None:
        """Close the Redis connection pool."""
        self.client.close()


class AsyncRoutingReader:
    """The gateway's read side: the routing state in one MGET, on an asyncio Redis client."""

    def __init__(self, client: redis.asyncio.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.prefix = prefix

    @classmethod
    def from_url(
        cls, url: str, prefix: str = DEFAULT_PREFIX, timeout_seconds: float = 0.25
    ) -> AsyncRoutingReader:
        """A reader with short timeouts, so a dead Redis is noticed quickly."""
        client = open_async_redis(
            url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds
        )
        return cls(client, prefix)

    async def fetch_state(self, regions: Sequence[str]) -> RoutingState:
        """Override and closed regions among `regions`; raises redis errors when Redis is down."""
        keys = [override_key(self.prefix), *(admission_key(self.prefix, r) for r in regions)]
        raws = await self.client.mget(keys)
        return _state(regions, raws)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()


def _state(regions: Sequence[str], raws: Sequence[bytes | str | None]) -> RoutingState:
    override_raw, *admissions = raws
    override = None
    if override_raw is not None:
        try:
            override = parse_override(override_raw)
        except RoutingError as exc:
            # Garbage in the store must not stop routing: the configured order applies.
            log.warning("ignoring routing override: %s", exc)
    closed = frozenset(
        region
        for region, raw in zip(regions, admissions, strict=True)
        if not parse_admission(region, raw).open
    )
    return RoutingState(override=override, closed=closed)
