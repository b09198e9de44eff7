"""The gateway's request ledger in Redis: one hash per request id, `<prefix>:<request_id>`.

Fields: `request_id`, `attempt`, `served_prefix_tokens`, `served_prefix` (the text the client
already has), `model_revision`, `prompt_fingerprint`, `retry_safe`, `interruption_reason`,
`status` (`running` / `interrupted` / `retrying` / `completed`), `node`, `max_tokens`,
`updated_at`; every entry expires after the ledger's TTL.

Redis stays off the path of ordinary requests: an entry is written when a request is interrupted
(so its retry can resume), when a retry claims it, when a retry finishes, and, for requests that
are not retry-safe and carry a request id, when they start (`claim_once`), so a second copy of
the same request id is refused instead of run twice. The state changes that must not race
(claiming a retry, claiming a first run) are Lua scripts, atomic in Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import redis
import redis.asyncio

from redline.core.redisconn import open_async_redis
from redline.platform.spot.errors import SpotError

DEFAULT_LEDGER_PREFIX = "redline:ledger"

LedgerStatus = Literal["running", "interrupted", "retrying", "completed"]


@dataclass(frozen=True)
class LedgerEntry:
    """One request in the gateway's ledger (a Redis hash per request id)."""

    request_id: str
    attempt: int
    served_prefix_tokens: int
    model_revision: str
    prompt_fingerprint: str
    retry_safe: bool
    interruption_reason: str
    status: LedgerStatus
    node: str = ""
    served_prefix: str = ""
    max_tokens: int | None = None
    updated_at: float = 0.0

    def to_fields(self) -> dict[str, str]:
        """A flat string mapping (a Redis hash)."""
        out = {
            "request_id": self.request_id,
            "attempt": str(self.attempt),
            "served_prefix_tokens": str(self.served_prefix_tokens),
            "model_revision": self.model_revision,
            "prompt_fingerprint": self.prompt_fingerprint,
            "retry_safe": "1" if self.retry_safe else "0",
            "interruption_reason": self.interruption_reason,
            "status": self.status,
            "node": self.node,
            "served_prefix": self.served_prefix,
            "updated_at": repr(self.updated_at),
        }
        if self.max_tokens is not None:
            out["max_tokens"] = str(self.max_tokens)
        return out

    @classmethod
    def from_fields(cls, raw: Mapping[str, str]) -> LedgerEntry:
        """Decode `to_fields` output; SpotError when a field is missing or malformed."""
        try:
            status = raw["status"]
            if status not in ("running", "interrupted", "retrying", "completed"):
                raise ValueError(f"status {status!r}")
            max_tokens = raw.get("max_tokens")
            return cls(
                request_id=raw["request_id"],
                attempt=int(raw["attempt"]),
                served_prefix_tokens=int(raw.get("served_prefix_tokens", "0")),
                model_revision=raw.get("model_revision", "unknown"),
                prompt_fingerprint=raw["prompt_fingerprint"],
                retry_safe=raw.get("retry_safe") == "1",
                interruption_reason=raw.get("interruption_reason", ""),
                status=status,  # type: ignore[arg-type]
                node=raw.get("node", ""),
                served_prefix=raw.get("served_prefix", ""),
                max_tokens=None if max_tokens in (None, "") else int(max_tokens),
                updated_at=float(raw.get("updated_at", "0")),
            )
        except (KeyError, ValueError) as exc:
            raise SpotError(f"unreadable ledger entry: {exc!r}") from None


# Interrupted and retry-safe -> retrying, attempt + 1 (returned); otherwise a negative reason.
_CLAIM_RETRY = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
if redis.call('HGET', KEYS[1], 'retry_safe') ~= '1' then return -2 end
if status ~= 'interrupted' then return -1 end
redis.call('HSET', KEYS[1], 'status', 'retrying', 'updated_at', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('HINCRBY', KEYS[1], 'attempt', 1)
"""

# Write the entry only if no entry of this request id exists: 1 written, 0 already there.
_CLAIM_ONCE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

CLAIM_NOT_FOUND = 0
CLAIM_NOT_INTERRUPTED = -1
CLAIM_NOT_RETRY_SAFE = -2


class LedgerError(SpotError):
    """The ledger could not be read or written (Redis down, an unreadable entry)."""


def _decode(raw: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in raw.items()
    }


class AsyncRequestLedger:
    """The gateway's side of the ledger (asyncio Redis)."""

    def __init__(
        self, client: redis.asyncio.Redis, prefix: str = DEFAULT_LEDGER_PREFIX, ttl: float = 3600
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_ms = max(1000, round(ttl * 1000))

    @classmethod
    def from_url(
        cls, url: str, prefix: str = DEFAULT_LEDGER_PREFIX, ttl: float = 3600, timeout: float = 0.5
    ) -> AsyncRequestLedger:
        """A ledger on its own connection pool; `aclose()` it."""
        client = open_async_redis(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        return cls(client, prefix, ttl)

    def key(self, request_id: str) -> str:
        """The entry's Redis key."""
        return f"{self.prefix}:{request_id}"

    async def get(self, request_id: str) -> LedgerEntry | None:
        """The entry of `request_id`, or None."""
        try:
            raw = await self.client.hgetall(self.key(request_id))
        except (redis.RedisError, OSError) as exc:
            raise LedgerError(f"ledger read: {type(exc).__name__}: {exc}") from exc
        if not raw:
            return None
        return LedgerEntry.from_fields(_decode(raw))

    async def put(self, entry: LedgerEntry) -> None:
        """Write (replace) an entry and renew its expiry."""
        key = self.key(entry.request_id)
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.hset(key, mapping=entry.to_fields())  # type: ignore[arg-type]
                pipe.pexpire(key, self.ttl_ms)
                await pipe.execute()
        except (redis.RedisError, OSError) as exc:
            raise LedgerError(f"ledger write: {type(exc).__name__}: {exc}") from exc

    async def set_status(self, request_id: str, status: str, now: float) -> None:
        """Change the status of an existing entry."""
        try:
            await self.client.hset(
                self.key(request_id), mapping={"status": status, "updated_at": repr(now)}
            )
        except (redis.RedisError, OSError) as exc:
            raise LedgerError(f"ledger write: {type(exc).__name__}: {exc}") from exc

    async def claim_retry(self, request_id: str, now: float) -> int:
        """Move an interrupted, retry-safe entry to `retrying`: its new attempt number, or
        CLAIM_NOT_FOUND / CLAIM_NOT_INTERRUPTED / CLAIM_NOT_RETRY_SAFE."""
        try:
            result = await self.client.eval(
                _CLAIM_RETRY, 1, self.key(request_id), repr(now), str(self.ttl_ms)
            )
        except (redis.RedisError, OSError) as exc:
            raise LedgerError(f"ledger claim: {type(exc).__name__}: {exc}") from exc
        return int(result)

    async def claim_once(self, entry: LedgerEntry) -> bool:
        """Record the first run of a request id; False when the id was seen before."""
        args: list[str] = []
        for name, value in entry.to_fields().items():
            args += [name, value]
        try:
            result = await self.client.eval(
                _CLAIM_ONCE, 1, self.key(entry.request_id), "", str(self.ttl_ms), *args
            )
        except (redis.RedisError, OSError) as exc:
            raise LedgerError(f"ledger claim: {type(exc).__name__}: {exc}") from exc
        return int(result) == 1

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()


class RequestLedger:
    """A synchronous reader of the ledger (drills, tests, the CLI)."""

    def __init__(self, client: redis.Redis, prefix: str = DEFAULT_LEDGER_PREFIX) -> None:
        self.client = client
        self.prefix = prefix

    def get(self, request_id: str) -> LedgerEntry | None:
        """The entry of `request_id`, or None."""
        raw = self.client.hgetall(f"{self.prefix}:{request_id}")
        if not raw:
            return None
        assert isinstance(raw, dict)
        return LedgerEntry.from_fields(_decode(raw))


__all__ = [
    "CLAIM_NOT_FOUND",
    "CLAIM_NOT_INTERRUPTED",
    "CLAIM_NOT_RETRY_SAFE",
    "DEFAULT_LEDGER_PREFIX",
    "AsyncRequestLedger",
    "LedgerEntry",
    "LedgerError",
    "LedgerStatus",
    "RequestLedger",
]
