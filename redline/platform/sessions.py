"""Session state on Redis with change-data capture to a replica.

The writer keeps each session's context under a key with a TTL and, in the same Lua script,
appends the change to a CDC stream and records when the key was written. A replica consumer
(`redline.platform.session_replica`) reads the stream through a consumer group, applies each
change to the replica (another Redis or db) and only then XACKs it, so "not ACKed" means "not
yet safe on the replica". The CDC RPO is
the age of the oldest entry the group has not ACKed, pending or not yet delivered; stream ids
carry the server's millisecond clock, so the age needs no scan and no payload.

Redis Cluster: the writer's script touches the session key, the stream and the write record, so
give them one hash tag (e.g. prefix `{sess}:ctx:`, stream `{sess}:cdc`, written `{sess}:written`)
there; the writer refuses a layout whose keys would not share a slot on a Cluster client.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import redis
import redis.cluster
from pydantic import Field, PositiveFloat
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from redline.core.redisconn import has_hash_tag, is_cluster
from redline.core.redisconn import open_redis as _open_redis
from redline.core.settings import ServiceSettings

log = logging.getLogger(__name__)

DEFAULT_KEY_PREFIX = "session:ctx:"
DEFAULT_STREAM = "session:cdc"
DEFAULT_GROUP = "session-replica"
DEFAULT_WRITTEN_KEY = "session:written"
DEFAULT_CONSUMER = "replica"

REDIS_CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)
"""Errors that mean "Redis is unreachable or too slow", as opposed to a bad command."""


class SessionStoreError(Exception):
    """The session store cannot do what was asked (bad input, bad stream entry)."""


class CdcTargetError(SessionStoreError):
    """A configured CDC stream or consumer group does not exist."""


def open_redis(url: str, timeout_seconds: float = 1.0) -> redis.Redis:
    """A client that decodes replies, times out after `timeout_seconds` and never retries.

    Probes must fail fast: redis-py's default retries three times with backoff, which would turn
    a dead Redis into a slow probe instead of a failed one.
    """
    return _open_redis(
        url,
        decode_responses=True,
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        retry=Retry(NoBackoff(), 0),
    )


def parse_stream_id(entry_id: str) -> tuple[int, int]:
    """`(milliseconds, sequence)` of a stream id such as `1700000000000-3`."""
    ms, sep, seq = entry_id.partition("-")
    if not ms.isdigit() or (sep and not seq.isdigit()):
        raise SessionStoreError(f"{entry_id!r} is not a stream id like 1700000000000-0")
    return int(ms), int(seq or 0)


def stream_id_ms(entry_id: str) -> int:
    """The millisecond timestamp a stream id carries."""
    return parse_stream_id(entry_id)[0]


def server_time_ms(client: redis.Redis) -> int:
    """Redis's own clock in milliseconds (the clock its stream ids are made from)."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@dataclass(frozen=True)
class SessionLayout:
    """Where session state lives: key prefix, CDC stream, and the write-time record (a ZSET)."""

    key_prefix: str = DEFAULT_KEY_PREFIX
    stream: str = DEFAULT_STREAM
    written_key: str = DEFAULT_WRITTEN_KEY

    def key_for(self, session_id: str) -> str:
        """The Redis key holding a session's context."""
        if not session_id:
            raise SessionStoreError("session id must not be empty")
        return f"{self.key_prefix}{session_id}"


# KEYS: session key, stream, written zset. ARGV: value, ttl ms, record retention ms, session id.
# The entry id's milliseconds are the write time: the key expires at id_ms + ttl_ms on the primary
# and, since the entry carries ttl_ms, at that same instant on the replica, however late it lands.
_WRITE_SCRIPT = """
local id = redis.call('XADD', KEYS[2], '*', 'op', 'set', 'key', KEYS[1], 'session', ARGV[4],
  'ttl_ms', ARGV[2], 'value', ARGV[1])
local ms = tonumber(string.match(id, '^(%d+)-'))
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', string.format('%d', ms + tonumber(ARGV[2])))
redis.call('ZADD', KEYS[3], string.format('%d', ms), KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('(%d', ms - tonumber(ARGV[3])))
return id
"""


# KEYS: session key, stream, written zset. ARGV: session id.
_DELETE_SCRIPT = """
local id = redis.call('XADD', KEYS[2], '*', 'op', 'del', 'key', KEYS[1], 'session', ARGV[1])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], KEYS[1])
return id
"""


def check_cluster_layout(layout: SessionLayout) -> None:
    """SessionStoreError unless every session key, the stream and the write record share one
    Redis Cluster slot (the writer's script touches the three together)."""
    keys = [layout.stream, layout.written_key]
    slots = {key_slot(key.encode()) for key in keys}
    if (
        not has_hash_tag(layout.key_prefix)
        or len(slots | {key_slot(layout.key_for("s").encode())}) > 1
    ):
        raise SessionStoreError(
            "on a Redis Cluster the session key prefix, CDC stream and written key must share "
            f"one hash tag (got {layout.key_prefix!r}, {layout.stream!r}, "
            f"{layout.written_key!r}): e.g. {{session}}:ctx:, {{session}}:cdc, {{session}}:written"
        )


class SessionWriter:
    """Writes session context with a TTL and appends each change to the CDC stream, atomically.

    It also records each key's write time (ZSET `layout.written_key`, score = ms) so that a key
    lost to expiry or eviction can be judged by its age; records older than
    `record_retention_seconds` are pruned on each write, so keep it above the keep-alive
    red line's `min_seconds`.
    """

    def __init__(
        self,
        client: redis.Redis,
        layout: SessionLayout | None = None,
        ttl_seconds: float = 1800.0,
        record_retention_seconds: float = 3600.0,
    ) -> None:
        if ttl_seconds <= 0:
            raise SessionStoreError(f"ttl_seconds must be > 0, got {ttl_seconds}")
        if record_retention_seconds <= 0:
            raise SessionStoreError(
                f"record_retention_seconds must be > 0, got {record_retention_seconds}"
            )
        self.client = client
        self.layout = layout or SessionLayout()
        if is_cluster(client):
            check_cluster_layout(self.layout)
        self.ttl_seconds = ttl_seconds
        self.record_retention_seconds = record_retention_seconds
        self._write = client.register_script(_WRITE_SCRIPT)
        self._delete = client.register_script(_DELETE_SCRIPT)

    def write(
        self,
        session_id: str,
        context: Mapping[str, Any] | str,
        ttl_seconds: float | None = None,
    ) -> str:
        """Set a session's context (a mapping is stored as JSON); return the CDC entry id."""
        ttl = self.ttl_seconds if ttl_seconds is None else ttl_seconds
        if ttl <= 0:
            raise SessionStoreError(f"ttl_seconds must be > 0, got {ttl}")
        value = context if isinstance(context, str) else json.dumps(context, sort_keys=True)
        layout = self.layout
        entry_id = self._write(
            keys=[layout.key_for(session_id), layout.stream, layout.written_key],
            args=[
                value,
                max(1, round(ttl * 1000)),
                round(self.record_retention_seconds * 1000),
                session_id,
            ],
        )
        return str(entry_id)

    def delete(self, session_id: str) -> str:
        """Delete a session (ended by the application); return the CDC entry id."""
        layout = self.layout
        entry_id = self._delete(
            keys=[layout.key_for(session_id), layout.stream, layout.written_key],
            args=[session_id],
        )
        return str(entry_id)

    def read(self, session_id: str) -> str | None:
        """The stored context of a session, or None when it is gone."""
        value = self.client.get(self.layout.key_for(session_id))
        return None if value is None else str(value)


@dataclass(frozen=True)
class CdcLag:
    """How far a consumer group is behind its stream, measured without a scan."""

    stream: str
    group: str
    rpo_seconds: float
    pending: int
    oldest_pending_id: str | None
    first_undelivered_id: str | None
    lag: int | None
    last_delivered_id: str


def _group_info(groups: Any, stream: str, group: str) -> dict[str, Any]:
    if isinstance(groups, redis.ResponseError):
        if "no such key" in str(groups).lower():
            raise CdcTargetError(f"CDC stream {stream!r} does not exist") from None
        raise groups
    for info in groups:
        if info.get("name") == group:
            return dict(info)
    names = ", ".join(sorted(str(info.get("name")) for info in groups)) or "none"
    raise CdcTargetError(
        f"consumer group {group!r} does not exist on CDC stream {stream!r} (groups: {names})"
    )


def _replies(*calls: Callable[[], Any]) -> list[Any]:
    """Each call's reply, or the ResponseError it raised (as a pipeline's raise_on_error=False)."""
    replies: list[Any] = []
    for call in calls:
        try:
            replies.append(call())
        except redis.ResponseError as exc:
            replies.append(exc)
    return replies


def measure_cdc_rpo(client: redis.Redis, stream: str, group: str) -> CdcLag:
    """Age of the oldest entry `group` has not ACKed on `stream` (0 when all are ACKed).

    Pending entries (delivered, unacked) come from the XPENDING summary's smallest id; entries
    not yet delivered start right after the group's last-delivered-id (XINFO GROUPS), of which
    XRANGE with COUNT 1 reads only the first. Ages use Redis's clock, the one the ids carry.
    """
    if is_cluster(client):
        # A Cluster pipeline refuses TIME (and skips the reply parsers inside MULTI): the
        # clock of the stream's own node, then the reads; an entry added in between is younger
        # than that clock, so the age can only come out low by that gap, never negative.
        cluster = cast(redis.cluster.RedisCluster, client)
        node = cluster.get_node_from_key(stream)  # type: ignore[no-untyped-call]
        now_raw = cluster.time(target_nodes=node)
        groups, pending_raw = _replies(
            lambda: client.xinfo_groups(stream), lambda: client.xpending(stream, group)
        )
    else:
        with client.pipeline(transaction=True) as pipe:
            pipe.time()
            pipe.xinfo_groups(stream)
            pipe.xpending(stream, group)
            now_raw, groups, pending_raw = pipe.execute(raise_on_error=False)
    if isinstance(now_raw, Exception):
        raise now_raw
    now_ms = int(now_raw[0]) * 1000 + int(now_raw[1]) // 1000
    info = _group_info(groups, stream, group)
    if isinstance(pending_raw, Exception):
        raise pending_raw
    last_delivered = str(info.get("last-delivered-id") or "0-0")
    after = client.xrange(stream, min=f"({last_delivered}", max="+", count=1)
    first_undelivered = str(after[0][0]) if after else None
    oldest_pending = pending_raw.get("min")
    oldest_pending = None if oldest_pending is None else str(oldest_pending)
    candidates = [stream_id_ms(i) for i in (oldest_pending, first_undelivered) if i is not None]
    rpo = max(0.0, (now_ms - min(candidates)) / 1000.0) if candidates else 0.0
    lag = info.get("lag")
    return CdcLag(
        stream=stream,
        group=group,
        rpo_seconds=rpo,
        pending=int(pending_raw.get("pending") or 0),
        oldest_pending_id=oldest_pending,
        first_undelivered_id=first_undelivered,
        lag=None if lag is None else int(lag),
        last_delivered_id=last_delivered,
    )


def _next_id(entry_id: str) -> str:
    ms, seq = parse_stream_id(entry_id)
    return f"{ms}-{seq + 1}"


def trim_acknowledged(client: redis.Redis, stream: str) -> str | None:
    """Trim entries every group of `stream` has ACKed; return the MINID used, None if none.

    A stream without groups is left alone: nothing says who still needs its entries.
    """
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError as exc:
        if "no such key" in str(exc).lower():
            return None
        raise
    if not groups:
        return None
    bounds: list[tuple[int, int]] = []
    with client.pipeline(transaction=False) as pipe:
        for info in groups:
            pipe.xpending(stream, info["name"])
        summaries = pipe.execute()
    for info, summary in zip(groups, summaries, strict=True):
        if summary.get("min") is not None:
            bounds.append(parse_stream_id(str(summary["min"])))
        else:
            bounds.append(parse_stream_id(_next_id(str(info["last-delivered-id"] or "0-0"))))
    ms, seq = min(bounds)
    minid = f"{ms}-{seq}"
    client.xtrim(stream, minid=minid, approximate=False)
    return minid


@dataclass(frozen=True)
class KeyspaceNotifications:
    """Whether Redis publishes the expired and evicted key events, and what was done about it."""

    enabled: bool
    flags: str
    message: str
    changed: bool = field(default=False)


_NEEDED_FLAGS = ("E", "x", "e")


def ensure_keyspace_notifications(
    client: redis.Redis, configure: bool = True
) -> KeyspaceNotifications:
    """Check `notify-keyspace-events` has E, x and e (keyevent, expired, evicted); add them
    with CONFIG SET when `configure` and allowed, and say so when it is not."""
    try:
        flags = str(client.config_get("notify-keyspace-events").get("notify-keyspace-events", ""))
    except redis.ResponseError as exc:
        return KeyspaceNotifications(
            False, "", f"cannot read notify-keyspace-events (CONFIG GET refused: {exc})"
        )
    missing = [f for f in _NEEDED_FLAGS if f not in flags and not (f in "xe" and "A" in flags)]
    if not missing:
        return KeyspaceNotifications(True, flags, f"notify-keyspace-events is {flags!r}")
    wanted = flags + "".join(missing)
    advice = f"set `notify-keyspace-events {wanted}` in redis.conf (Exe at least)"
    if not configure:
        return KeyspaceNotifications(
            False, flags, f"notify-keyspace-events is {flags!r}, lacks {''.join(missing)}; {advice}"
        )
    try:
        client.config_set("notify-keyspace-events", wanted)
    except redis.ResponseError as exc:
        return KeyspaceNotifications(
            False, flags, f"CONFIG SET notify-keyspace-events refused ({exc}); {advice}"
        )
    return KeyspaceNotifications(
        True, wanted, f"notify-keyspace-events was {flags!r}, set to {wanted!r}", changed=True
    )


class SessionSettings(ServiceSettings):
    """Settings of the `redline sessions` processes (`REDLINE_*` env vars or `--config`)."""

    replica_url: str = Field("redis://127.0.0.1:6379/1", description="Replica session store.")
    session_stream: str = Field(DEFAULT_STREAM, min_length=1, description="CDC stream key.")
    session_group: str = Field(DEFAULT_GROUP, min_length=1, description="Replica's group.")
    session_consumer: str = Field(DEFAULT_CONSUMER, min_length=1, description="Consumer name.")
    session_key_prefix: str = Field(DEFAULT_KEY_PREFIX, min_length=1, description="Key prefix.")
    session_written_key: str = Field(DEFAULT_WRITTEN_KEY, min_length=1, description="Write ZSET.")
    session_ttl_seconds: PositiveFloat = Field(1800.0, description="TTL of session context.")

    @property
    def layout(self) -> SessionLayout:
        """Where the session state lives."""
        return SessionLayout(self.session_key_prefix, self.session_stream, self.session_written_key)
