"""Context keep-alive: does a session's context survive at least `min_seconds`, on both sides?

Each run writes a new canary session through the real write path (`SessionWriter`: key with the
configured TTL plus its CDC entry, which the replica consumer applies) and checks the canaries
written at least `min_seconds` ago on the primary and on the replica; it never waits. It
publishes:

- `session_keepalive_probe_success`: 1 when every canary checked in the last run that had one
  due was alive on both sides, else 0 (absent until the first canary is old enough);
- `session_context_ttl_seconds`: the effective TTL of recently written session keys, min over
  the newest `ttl_sample_size` of them of (age + remaining PTTL) — a writer that sets a shorter
  TTL than configured shows here before any context is lost;
- `session_context_evicted_total`: session keys that expired or were evicted less than
  `min_seconds` after they were last written, from keyspace notifications
  (`__keyevent@<db>__:expired` and `:evicted`) that a background thread owned by the probe
  listens to, reconnecting when Redis goes away. The writer records each key's write time,
  which gives the age at loss.

Keyspace notifications must include E, x and e (`notify-keyspace-events Exe`, or a superset
such as `KEA`); Redis ships with them off. The probe adds the missing flags with CONFIG SET on
every (re)connect unless `configure_notifications` is off, and logs a warning naming the
redis.conf line when it may not (CONFIG disabled or not permitted by ACL); `notifications`
tells the outcome. Without them the counter stays at 0.

Call `close()` at shutdown: it stops the listener thread and closes the connections.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt
from redis.commands.core import Script

from redline.exporters.probe import MetricDef, Sample
from redline.platform.sessions import (
    DEFAULT_KEY_PREFIX,
    DEFAULT_STREAM,
    DEFAULT_WRITTEN_KEY,
    REDIS_CONNECTION_ERRORS,
    KeyspaceNotifications,
    SessionLayout,
    SessionWriter,
    ensure_keyspace_notifications,
    open_redis,
    server_time_ms,
    stream_id_ms,
)
from redline.slo import catalog
from redline.slo.spec import Spec

log = logging.getLogger(__name__)

TTL_METRIC = catalog.SESSION_CONTEXT_TTL_SECONDS.family
SUCCESS_METRIC = catalog.SESSION_KEEPALIVE_PROBE_SUCCESS.family
EVICTED_METRIC = catalog.SESSION_CONTEXT_EVICTED_TOTAL.family
DEFAULT_CANARIES_KEY = "session:keepalive:canaries"
CANARY_SESSION_PREFIX = "__keepalive_canary__:"

# KEYS: the lost key, the write-time ZSET. Returns the key's age in ms at loss, -1 when the key
# exists again (rewritten since: the record is the new write's), -2 when no record is known.
_LOSS_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
local score = redis.call('ZSCORE', KEYS[2], KEYS[1])
if not score then return -2 end
redis.call('ZREM', KEYS[2], KEYS[1])
local t = redis.call('TIME')
local age = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(score)
if age < 0 then age = 0 end
return age
"""


class KeepaliveSettings(BaseModel):
    """Settings of the keep-alive probe (embed in the exporter's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Run the probe.")
    interval_seconds: PositiveFloat = Field(15.0, description="How often a canary is written.")
    redis_url: str | None = Field(None, description="Primary session store; default: service.")
    replica_url: str | None = Field(None, description="Replica session store; unset: none.")
    ttl_seconds: PositiveFloat = Field(1800.0, description="TTL the canary is written with.")
    min_seconds: PositiveFloat | None = Field(
        None, description="Required context lifetime; default: red_lines.context_keepalive."
    )
    key_prefix: str = Field(DEFAULT_KEY_PREFIX, min_length=1, description="Session key prefix.")
    stream: str = Field(DEFAULT_STREAM, min_length=1, description="CDC stream of the writer.")
    written_key: str = Field(DEFAULT_WRITTEN_KEY, min_length=1, description="Write-time ZSET.")
    canaries_key: str = Field(DEFAULT_CANARIES_KEY, min_length=1, description="Canary ZSET.")
    ttl_sample_size: PositiveInt = Field(20, description="Recent keys the TTL is read from.")
    configure_notifications: bool = Field(
        True, description="May CONFIG SET notify-keyspace-events to add E, x and e."
    )
    timeout_seconds: PositiveFloat = Field(1.0, description="Redis connect and read timeout.")


class _LossWatcher:
    """Counts session keys expired or evicted too young; a thread with its own reconnect loop."""

    def __init__(
        self,
        redis_url: str,
        layout: SessionLayout,
        min_seconds: float,
        timeout_seconds: float,
        configure: bool,
    ) -> None:
        self.redis_url = redis_url
        self.layout = layout
        self.min_ms = min_seconds * 1000.0
        self.timeout_seconds = timeout_seconds
        self.configure = configure
        self.subscribed = threading.Event()
        self._lock = threading.Lock()
        self._lost = 0
        self._notifications: KeyspaceNotifications | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lost(self) -> int:
        """Keys lost before `min_seconds` so far."""
        with self._lock:
            return self._lost

    @property
    def notifications(self) -> KeyspaceNotifications | None:
        """The notification settings found at the last (re)connect."""
        with self._lock:
            return self._notifications

    def start(self) -> None:
        """Start the listener thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="session-loss-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it; it closes its connections on the way out."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                self._listen()
                backoff = 0.1
            except (*REDIS_CONNECTION_ERRORS, redis.ResponseError) as exc:
                self.subscribed.clear()
                log.warning(
                    "session loss watcher: %s: %s; reconnecting in %.1f s",
                    type(exc).__name__,
                    exc,
                    backoff,
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _listen(self) -> None:
        client = open_redis(self.redis_url, self.timeout_seconds)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            status = ensure_keyspace_notifications(client, configure=self.configure)
            with self._lock:
                self._notifications = status
            if not status.enabled:
                log.warning("session keep-alive: losses will not be counted: %s", status.message)
            elif status.changed:
                log.info("session keep-alive: %s", status.message)
            loss = client.register_script(_LOSS_SCRIPT)
            db = int(client.connection_pool.connection_kwargs.get("db", 0))
            pubsub.subscribe(f"__keyevent@{db}__:expired", f"__keyevent@{db}__:evicted")
            self.subscribed.set()
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=0.2)
                if message is None or message.get("type") != "message":
                    continue
                key = str(message["data"])
                if key.startswith(self.layout.key_prefix):
                    event = str(message["channel"]).rsplit(":", 1)[-1]
                    self._judge(loss, key, event)
        finally:
            self.subscribed.clear()
            pubsub.close()
            client.close()

    def _judge(self, loss: Script, key: str, event: str) -> None:
        age_ms = int(loss(keys=[key, self.layout.written_key]))
        if age_ms < 0:
            return  # rewritten since, or written by something that keeps no record
        if age_ms < self.min_ms:
            with self._lock:
                self._lost += 1
            log.warning(
                "session key %s %s %.1f s after its last write (keep-alive needs %.0f s)",
                key,
                event,
                age_ms / 1000.0,
                self.min_ms / 1000.0,
            )


class KeepaliveProbe:
    """Canary sessions on primary and replica, effective TTL, and keys lost before min_seconds."""

    writes_canaries = True
    """Writes canary sessions: with exporter replicas, the canary lease holder's only."""

    metrics = (
        MetricDef.of(catalog.SESSION_CONTEXT_TTL_SECONDS),
        MetricDef.of(catalog.SESSION_KEEPALIVE_PROBE_SUCCESS),
        MetricDef.of(catalog.SESSION_CONTEXT_EVICTED_TOTAL),
    )

    def __init__(
        self,
        redis_url: str,
        replica_url: str | None = None,
        *,
        ttl_seconds: float,
        min_seconds: float,
        interval_seconds: float = 15.0,
        layout: SessionLayout | None = None,
        canaries_key: str = DEFAULT_CANARIES_KEY,
        ttl_sample_size: int = 20,
        configure_notifications: bool = True,
        watch_losses: bool = True,
        timeout_seconds: float = 1.0,
        name: str = "session_keepalive",
    ) -> None:
        if ttl_seconds <= 0 or min_seconds <= 0:
            raise ValueError("ttl_seconds and min_seconds must be > 0")
        if ttl_sample_size < 1:
            raise ValueError("ttl_sample_size must be >= 1")
        self.name = name
        self.interval_seconds = interval_seconds
        self.redis_url = redis_url
        self.replica_url = replica_url
        self.ttl_seconds = ttl_seconds
        self.min_seconds = min_seconds
        self.layout = layout or SessionLayout()
        self.canaries_key = canaries_key
        self.ttl_sample_size = ttl_sample_size
        self.timeout_seconds = timeout_seconds
        self._lock = threading.Lock()
        self._primary: redis.Redis | None = None
        self._replica: redis.Redis | None = None
        self._writer: SessionWriter | None = None
        self._last_success: bool | None = None
        self._watcher = (
            _LossWatcher(
                redis_url, self.layout, min_seconds, timeout_seconds, configure_notifications
            )
            if watch_losses
            else None
        )

    @classmethod
    def from_settings(
        cls, settings: KeepaliveSettings, redis_url: str, spec: Spec
    ) -> KeepaliveProbe:
        """Build from settings; the service's `redis_url` and the spec's minimum are defaults."""
        return cls(
            settings.redis_url or redis_url,
            settings.replica_url,
            ttl_seconds=settings.ttl_seconds,
            min_seconds=settings.min_seconds or spec.red_lines.context_keepalive.min_seconds,
            interval_seconds=settings.interval_seconds,
            layout=SessionLayout(settings.key_prefix, settings.stream, settings.written_key),
            canaries_key=settings.canaries_key,
            ttl_sample_size=settings.ttl_sample_size,
            configure_notifications=settings.configure_notifications,
            timeout_seconds=settings.timeout_seconds,
        )

    @property
    def evicted_total(self) -> int:
        """Session keys lost before `min_seconds` since the probe started."""
        return self._watcher.lost if self._watcher is not None else 0

    @property
    def notifications(self) -> KeyspaceNotifications | None:
        """Whether keyspace notifications are on (None before the listener first connected)."""
        return self._watcher.notifications if self._watcher is not None else None

    def wait_listening(self, timeout: float) -> bool:
        """Block until the loss listener is subscribed (for start-up and tests)."""
        return self._watcher.subscribed.wait(timeout) if self._watcher is not None else True

    def start(self) -> None:
        """Start the loss listener (the first `run` does it too)."""
        if self._watcher is not None:
            self._watcher.start()

    def close(self) -> None:
        """Stop the listener and close every connection."""
        if self._watcher is not None:
            self._watcher.stop()
        with self._lock:
            for client in (self._primary, self._replica):
                if client is not None:
                    client.close()
            self._primary = self._replica = None
            self._writer = None

    def _clients(self) -> tuple[redis.Redis, redis.Redis | None, SessionWriter]:
        with self._lock:
            if self._primary is None:
                self._primary = open_redis(self.redis_url, self.timeout_seconds)
                if self.replica_url is not None:
                    self._replica = open_redis(self.replica_url, self.timeout_seconds)
                self._writer = SessionWriter(
                    self._primary,
                    self.layout,
                    ttl_seconds=self.ttl_seconds,
                    # Pruning write records younger than min_seconds would hide early losses.
                    record_retention_seconds=max(3600.0, 2 * self.min_seconds),
                )
            assert self._writer is not None
            return self._primary, self._replica, self._writer

    def run(self) -> list[Sample]:
        """Check the canaries that are old enough, write a new one, read the effective TTL."""
        self.start()
        primary, replica, writer = self._clients()
        verdicts = self._check_due(primary, replica, writer)
        if verdicts:
            self._last_success = all(verdicts)
        session_id = f"{CANARY_SESSION_PREFIX}{uuid.uuid4().hex}"
        entry_id = writer.write(session_id, {"canary": True}, self.ttl_seconds)
        primary.zadd(self.canaries_key, {self.layout.key_for(session_id): stream_id_ms(entry_id)})
        samples = [Sample(EVICTED_METRIC, float(self.evicted_total))]
        ttl = self._effective_ttl(primary)
        if ttl is not None:
            samples.append(Sample(TTL_METRIC, ttl))
        if self._last_success is not None:
            samples.append(Sample(SUCCESS_METRIC, float(self._last_success)))
        return samples

    def _check_due(
        self, primary: redis.Redis, replica: redis.Redis | None, writer: SessionWriter
    ) -> list[bool]:
        now_ms = server_time_ms(primary)
        cutoff = now_ms - round(self.min_seconds * 1000)
        raw: Any = primary.zrangebyscore(self.canaries_key, "-inf", cutoff, withscores=True)
        due = [(str(key), float(score)) for key, score in raw]
        if not due:
            return []
        keys = [key for key, _ in due]
        on_primary = _exists_each(primary, keys)
        on_replica = _exists_each(replica, keys) if replica is not None else [True] * len(keys)
        verdicts: list[bool] = []
        for (key, written_ms), here, there in zip(due, on_primary, on_replica, strict=True):
            age = (now_ms - written_ms) / 1000.0
            if here and there:
                verdicts.append(True)
                continue
            if self.min_seconds <= self.ttl_seconds <= age:
                # Checked late (the probe was down): its TTL ran out after the minimum, as it
                # should; nothing to judge.
                continue
            verdicts.append(False)
            sides = [name for name, ok in (("primary", here), ("replica", there)) if not ok]
            log.warning(
                "keep-alive canary %s gone on %s at %.1f s (needs %.0f s, TTL %.0f s)",
                key,
                " and ".join(sides),
                age,
                self.min_seconds,
                self.ttl_seconds,
            )
        for key in keys:
            writer.delete(key.removeprefix(self.layout.key_prefix))
        primary.zrem(self.canaries_key, *keys)
        return verdicts

    def _effective_ttl(self, primary: redis.Redis) -> float | None:
        raw: Any = primary.zrevrange(
            self.layout.written_key, 0, self.ttl_sample_size - 1, withscores=True
        )
        recent = [(str(key), float(score)) for key, score in raw]
        if not recent:
            return None
        with primary.pipeline(transaction=True) as pipe:
            pipe.time()
            for key, _ in recent:
                pipe.pttl(key)
            now_raw, *pttls = pipe.execute()
        now_ms = int(now_raw[0]) * 1000 + int(now_raw[1]) // 1000
        effective = [
            (now_ms - written_ms + int(pttl)) / 1000.0
            for (_, written_ms), pttl in zip(recent, pttls, strict=True)
            if int(pttl) > 0  # -2: gone, -1: no expiry
        ]
        return min(effective) if effective else None


def _exists_each(client: redis.Redis, keys: list[str]) -> list[bool]:
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.exists(key)
        return [bool(n) for n in pipe.execute()]
