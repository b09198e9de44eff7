"""A lease in Redis: one holder among replicas, taken over when the holder stops renewing.

`RedisLease` is `SET key owner NX PX ttl` to acquire, and compare-and-set Lua scripts to renew
(`PEXPIRE` only while the value is still this owner) and release (`DEL` likewise), so only the
owner renews or releases and a contender takes the key only once it has expired in Redis.

The holder's own view is deliberately shorter than the key's life: `held` is true until
`valid_until`, counted on the local monotonic clock from *before* the command that set or renewed
the expiry was sent, less a safety margin. Redis starts the key's expiry later than that, so the
holder stops believing it holds the lease before any contender can acquire it: two contenders
never both hold it, whatever the network delays, as long as the key survives in Redis. A holder
that cannot renew (Redis unreachable, process paused) loses the lease when `valid_until` passes.

With an asynchronously replicated primary (Sentinel), a failover can lose the last renewal or the
key itself, and another replica may then acquire while the old holder still believes it holds.
With `min_replicas_ack` (the spec's `redis.min_replicas_ack`) an acquire or renewal counts only
once that many replicas acknowledged it (WAIT): the holder extends its belief only for a key the
promoted replica will have. Measured in the `redis-failover` drill: without it, 1 of 96 samples
of two exporter replicas showed both holding across the primary's SIGKILL. Without replicas to
wait for, the old limit stands (doubled canaries for at most `renew_every` seconds): use it for
work whose doubling is wasteful, not for mutual exclusion that must be absolute.

`LeaseKeeper` runs a lease in a daemon thread: it tries to acquire (or renew) every
`renew_every` seconds, and releases on `stop()` so a replica stopped cleanly hands over at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

import redis
import redis.exceptions

from redline.core.redisconn import wait_for_replicas

log = logging.getLogger(__name__)

DEFAULT_SAFETY = 0.1
"""Share of the TTL the holder gives up early (clock rate differences, scheduling delays)."""

# KEYS: the lease key. ARGV: owner, ttl (ms). 1 when the owner still held it and the expiry was
# pushed back, 0 when someone else holds it or it is gone.
_RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: the lease key. ARGV: owner. 1 when the owner held it and it is deleted, else 0.
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

LEASE_ERRORS: tuple[type[Exception], ...] = (redis.exceptions.RedisError, OSError)
"""What a lease operation may raise when Redis is unreachable or failing over."""


def default_owner(role: str = "lease") -> str:
    """A unique owner id naming the host and process (readable in `GET <key>`)."""
    return f"{role}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class RedisLease:
    """One lease key, held by at most one owner at a time (see the module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        owner: str,
        ttl_seconds: float,
        *,
        safety: float = DEFAULT_SAFETY,
        clock: Callable[[], float] = time.monotonic,
        min_replicas_ack: int = 0,
        ack_timeout_ms: int = 500,
    ) -> None:
        if ttl_seconds <= 0:
            raise ValueError("the lease TTL must be > 0 seconds")
        if not 0 <= safety < 1:
            raise ValueError("the safety margin must be in [0, 1)")
        self.client = client
        self.key = key
        self.owner = owner
        self.ttl_seconds = ttl_seconds
        self.safety = safety
        self._clock = clock
        self.min_replicas_ack = min_replicas_ack
        self.ack_timeout_ms = ack_timeout_ms
        self._ttl_ms = max(1, round(ttl_seconds * 1000))
        self._valid_until = 0.0
        self._renew = client.register_script(_RENEW_LUA)
        self._release = client.register_script(_RELEASE_LUA)

    @property
    def held(self) -> bool:
        """True while this owner holds the lease by its own, conservative, reckoning."""
        return self._clock() < self._valid_until

    @property
    def valid_until(self) -> float:
        """Monotonic time until which the lease is held (0 when never held)."""
        return self._valid_until

    def _granted(self, sent_at: float) -> None:
        # ReplicaAckError (a redis ConnectionError) leaves the belief as it was: a renewal the
        # replicas did not take does not extend it, an acquire they did not take grants none.
        wait_for_replicas(self.client, self.min_replicas_ack, self.ack_timeout_ms)
        self._valid_until = sent_at + self.ttl_seconds * (1.0 - self.safety)

    def acquire(self) -> bool:
        """Take the lease if nobody holds it (SET NX PX); True when this owner now holds it."""
        sent_at = self._clock()
        if self.client.set(self.key, self.owner, nx=True, px=self._ttl_ms):
            self._granted(sent_at)
            return True
        return False

    def renew(self) -> bool:
        """Push the expiry back if this owner still holds the key; False (and not held) if not."""
        sent_at = self._clock()
        if int(self._renew(keys=[self.key], args=[self.owner, self._ttl_ms])) == 1:
            self._granted(sent_at)
            return True
        self._valid_until = 0.0
        return False

    def acquire_or_renew(self) -> bool:
        """Renew when this owner holds the key, else try to acquire; True when held after."""
        return self.renew() or self.acquire()

    def release(self) -> bool:
        """Give the lease up if this owner holds it (a contender may take it at once)."""
        self._valid_until = 0.0
        return int(self._release(keys=[self.key], args=[self.owner])) == 1

    def holder(self) -> str | None:
        """The owner Redis names now (None when nobody holds the lease)."""
        value = self.client.get(self.key)
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)


class LeaseKeeper:
    """Keeps trying to hold a lease in a daemon thread; `held` says whether it does now."""

    def __init__(
        self,
        lease: RedisLease,
        renew_every: float | None = None,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.lease = lease
        self.renew_every = renew_every if renew_every is not None else lease.ttl_seconds / 3
        if not 0 < self.renew_every < lease.ttl_seconds * (1 - lease.safety):
            raise ValueError("renew_every must be > 0 and well inside the lease TTL")
        self.on_change = on_change
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._was_held = False
        self.last_error: str | None = None

    @property
    def held(self) -> bool:
        """True while the lease is held (by the lease's own conservative reckoning)."""
        return self.lease.held

    def tick(self) -> bool:
        """One attempt to acquire or renew; Redis errors are logged, never raised."""
        try:
            self.lease.acquire_or_renew()
        except LEASE_ERRORS as exc:
            # Not fatal: the lease stays held until its validity ends, then lapses by itself.
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("lease %s: cannot reach Redis: %s", self.lease.key, self.last_error)
        else:
            self.last_error = None
        held = self.lease.held
        if held != self._was_held:
            log.info("lease %s %s by %s", self.lease.key, "acquired" if held else "lost",
                     self.lease.owner)  # fmt: skip
            self._was_held = held
            if self.on_change is not None:
                self.on_change(held)
        return held

    def start(self) -> None:
        """Try once now (so a lone replica holds the lease before its first probe), then keep
        trying in a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self.tick()
        self._thread = threading.Thread(
            target=self._loop, name=f"lease-{self.lease.key}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.renew_every):
            self.tick()

    def stop(self, release: bool = True) -> None:
        """Stop trying and (by default) release the lease so another replica takes over now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.renew_every + 5.0)
            self._thread = None
        if release:
            try:
                self.lease.release()
            except LEASE_ERRORS as exc:
                log.warning("lease %s: release failed (it expires by itself): %s",
                            self.lease.key, exc)  # fmt: skip


__all__ = ["LEASE_ERRORS", "LeaseKeeper", "RedisLease", "default_owner"]
