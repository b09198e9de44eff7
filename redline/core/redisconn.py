"""The one way redline opens Redis: plain, TLS, Sentinel and Cluster URLs, a start-up check, WAIT.

URL forms (docs/redis.md):

- `redis://[user:password@]host:port/db?options` and `rediss://...` (TLS): handed to redis-py's
  `from_url` unchanged, so plain URLs behave exactly as before.
- `redis+sentinel://[user:password@]host:26379,host2:26379/<master>/<db>?options` and
  `rediss+sentinel://...` (TLS to the sentinels and the primary): redis-py's
  `Sentinel(...).master_for(master)`, whose pool asks the sentinels for the primary on every new
  connection, so clients follow a failover. `user:password` authenticate against the data
  nodes; `sentinel_username` / `sentinel_password` against the sentinels.
- `redis+cluster://[user:password@]host:6379,host2:6379/?options` and `rediss+cluster://...`
  (TLS to every node): redis-py's `RedisCluster` with those start-up nodes; it learns the
  slot map from them and follows MOVED/ASK redirections. A Cluster has one database, 0.

Every URL problem raises `RedisConfigError` naming the setting and the URL with its passwords
masked; `check_redis` adds what only a running deployment can tell (no sentinel reachable, an
unknown master name, no Cluster node reachable, a Cluster that is down or has slots no node
serves), so services refuse to start instead of failing at their first write.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.client
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.backoff
import redis.client
import redis.cluster
import redis.commands.core
import redis.connection
import redis.exceptions
import redis.retry
import redis.sentinel

from redline.core.settings import SettingsError

PLAIN_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_CLUSTER_PORT = 6379
CLUSTER_SLOTS = 16384
SENTINEL_TIMEOUT_SECONDS = 2.0
"""Socket timeouts towards the sentinels when the caller gives none: discovery must not hang."""
CHECK_TIMEOUT_SECONDS = 2.0
"""Socket timeouts of the start-up check towards Cluster nodes when the URL gives none."""

FAILOVER_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.sentinel.MasterNotFoundError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    OSError,
)
"""Errors meaning "Redis is unreachable, or its primary is changing": answer 503, retry later.

`ReadOnlyError` is what a demoted primary answers to a write; `MasterNotFoundError` what the
sentinels say while no primary is elected (it is a ConnectionError, listed for clarity);
`ClusterDownError` (CLUSTERDOWN, MASTERDOWN) and `TryAgainError` (TRYAGAIN, a slot being moved)
what a Cluster node says while a failover or resharding is under way.
"""

_BOOL = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False}
_BOOL |= {"no": False, "off": False}
_CERT_REQS = ("none", "optional", "required")


class RedisConfigError(SettingsError):
    """A Redis URL that cannot be used: malformed, no sentinel reachable, unknown master, no
    Cluster node reachable, a Cluster down or without every slot served."""


class ClusterUnavailableError(redis.exceptions.ConnectionError):
    """No start-up node of a Cluster answered, or the slots they know do not cover the 16384:
    the client could not be built. A ConnectionError, so callers that wait out an unreachable
    Redis do the same here."""


class ReplicaAckError(redis.exceptions.ConnectionError):
    """Fewer replicas than required acknowledged a write (WAIT): it may be lost on failover.

    A ConnectionError, so callers that already answer 503 on an unreachable Redis do the same
    here: the client retries, and the write is idempotent where it matters.
    """


def mask_url(url: str) -> str:
    """`url` with its password and `sentinel_password` replaced by `***`, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    user, at, hosts = netloc.rpartition("@")
    if at and ":" in user:
        user = user.split(":", 1)[0] + ":***"
    elif at and user and parts.scheme in SENTINEL_SCHEMES + CLUSTER_SCHEMES + PLAIN_SCHEMES:
        # redis://secret@host: a lone userinfo is the password (redis-py reads it so)
        user = "***"
    netloc = f"{user}{at}{hosts}"
    query = "&".join(
        f"{k}={'***' if 'password' in k else quote(v, safe='/:,')}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    rebuilt = f"{parts.scheme}://{netloc}{parts.path}"
    return f"{rebuilt}?{query}" if query else rebuilt


@dataclass(frozen=True)
class SentinelTarget:
    """A parsed Sentinel URL: where the sentinels are, which master, how to authenticate."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    ssl: bool = False
    min_other_sentinels: int = 0
    tls: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def master_kwargs(self, caller: Mapping[str, Any]) -> dict[str, Any]:
        """Connection options of the primary: the caller's, then the URL's (the URL wins)."""
        base = {**caller, **self.options, "db": self.db}
        return _with_auth(base, self.username, self.password, self.ssl, self.tls)

    def sentinel_kwargs(self, caller: Mapping[str, Any]) -> dict[str, Any]:
        """Connection options of the sentinels: timeouts and TLS, their own credentials."""
        merged = {**caller, **self.options}
        kwargs: dict[str, Any] = {
            "socket_timeout": merged.get("socket_timeout") or SENTINEL_TIMEOUT_SECONDS,
            "socket_connect_timeout": merged.get("socket_connect_timeout")
            or SENTINEL_TIMEOUT_SECONDS,
        }
        return _with_auth(
            kwargs, self.sentinel_username, self.sentinel_password, self.ssl, self.tls
        )


@dataclass(frozen=True)
class ClusterTarget:
    """A parsed Cluster URL: the start-up nodes and how to connect to every node."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    tls: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def node_kwargs(self, caller: Mapping[str, Any]) -> dict[str, Any]:
        """Connection options of every node: the caller's, then the URL's (the URL wins)."""
        base = {**caller, **self.options}
        return _with_auth(base, self.username, self.password, self.ssl, self.tls)

    def check_kwargs(self) -> dict[str, Any]:
        """Options of the start-up check's plain connection to one node: short timeouts."""
        kwargs = self.node_kwargs({})
        for name in ("socket_timeout", "socket_connect_timeout"):
            kwargs[name] = kwargs.get(name) or CHECK_TIMEOUT_SECONDS
        kwargs.pop("max_connections", None)
        return kwargs


def _with_auth(
    kwargs: Mapping[str, Any],
    username: str | None,
    password: str | None,
    ssl: bool,
    tls: Mapping[str, Any],
) -> dict[str, Any]:
    """`kwargs` plus the credentials and TLS options that are set."""
    merged = dict(kwargs)
    if username is not None:
        merged["username"] = username
    if password is not None:
        merged["password"] = password
    if ssl:
        merged.update(ssl=True, **tls)
    return merged


def _error(url: str, setting: str, what: str) -> RedisConfigError:
    return RedisConfigError(f"{setting}: {mask_url(url)}: {what}")


def _float(value: str, name: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"option {name}={value!r} is not a number") from None
    if number <= 0:
        raise ValueError(f"option {name}={value!r} must be positive")
    return number


def _bool(value: str, name: str) -> bool:
    if value.lower() not in _BOOL:
        raise ValueError(f"option {name}={value!r} is not a boolean (true/false)")
    return _BOOL[value.lower()]


def _int(value: str, name: str) -> int:
    if not value.isdigit():
        raise ValueError(f"option {name}={value!r} is not a non-negative integer")
    return int(value)


def _cert_reqs(value: str, name: str) -> str:
    if value.lower() not in _CERT_REQS:
        raise ValueError(f"option {name}={value!r} is not one of {', '.join(_CERT_REQS)}")
    return value.lower()


_STR_OPTS = {"sentinel_username", "sentinel_password", "ssl_ca_certs", "ssl_certfile"}
_STR_OPTS |= {"ssl_keyfile", "ssl_password", "client_name"}
_CONNECTION_OPTS: dict[str, Any] = {
    "socket_timeout": _float,
    "socket_connect_timeout": _float,
    "health_check_interval": _int,
    "retry_on_timeout": _bool,
    "socket_keepalive": _bool,
    "max_connections": _int,
}
_TLS_OPTS: dict[str, Any] = {"ssl_cert_reqs": _cert_reqs, "ssl_check_hostname": _bool}
_TLS_STR = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_password")


def _hosts(
    text: str, default_port: int = DEFAULT_SENTINEL_PORT, what: str = "sentinel"
) -> tuple[tuple[str, int], ...]:
    hosts: list[tuple[str, int]] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty {what} address (stray comma?)")
        if item.startswith("["):  # [::1]:26379
            host, _, rest = item[1:].partition("]")
            port_text = rest.removeprefix(":")
        else:
            host, _, port_text = item.partition(":")
        if not host:
            raise ValueError(f"{what} address {item!r} has no host")
        port = default_port
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(f"{what} address {item!r} has a bad port")
            port = int(port_text)
        hosts.append((host, port))
    return tuple(hosts)


def _parse_sentinel(url: str) -> SentinelTarget:
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if not hostlist:
        raise ValueError("no sentinel address (expected host:26379[,host2:26379])")
    username: str | None = None
    password: str | None = None
    if at:
        user, colon, secret = userinfo.partition(":")
        if colon:
            username, password = (unquote(user) or None), unquote(secret)
        else:
            password = unquote(user)
    segments = [unquote(s) for s in parts.path.split("/") if s]
    if not segments:
        raise ValueError("no master name (expected /<master>/<db> after the sentinels)")
    if len(segments) > 2:
        raise ValueError(f"path {parts.path!r} is not /<master>/<db>")
    db = 0
    if len(segments) == 2:
        if not segments[1].isdigit():
            raise ValueError(f"database {segments[1]!r} is not a number")
        db = int(segments[1])
    ssl = parts.scheme == "rediss+sentinel"
    strings: dict[str, str] = {}
    options: dict[str, Any] = {}
    tls: dict[str, Any] = {}
    min_other = 0
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if name == "ssl":
            ssl = _bool(value, name)
        elif name == "min_other_sentinels":
            min_other = _int(value, name)
        elif name == "db":
            db = _int(value, name)
        elif name in _CONNECTION_OPTS:
            options[name] = _CONNECTION_OPTS[name](value, name)
        elif name in _TLS_OPTS:
            tls[name] = _TLS_OPTS[name](value, name)
        elif name in _STR_OPTS:
            strings[name] = value
        else:
            known = sorted({"ssl", "min_other_sentinels", "db", *_CONNECTION_OPTS, *_TLS_OPTS,
                            *_STR_OPTS})  # fmt: skip
            raise ValueError(f"unknown option {name!r} (known: {', '.join(known)})")
    if "client_name" in strings:
        options["client_name"] = strings["client_name"]
    tls.update({k: strings[k] for k in _TLS_STR if k in strings})
    if tls and not ssl:
        raise ValueError("TLS options given without TLS (use rediss+sentinel:// or ssl=true)")
    return SentinelTarget(
        sentinels=_hosts(hostlist),
        master=segments[0],
        db=db,
        username=username,
        password=password,
        sentinel_username=strings.get("sentinel_username"),
        sentinel_password=strings.get("sentinel_password"),
        ssl=ssl,
        min_other_sentinels=min_other,
        tls=tls,
        options=options,
    )


def _userinfo(userinfo: str, at: str) -> tuple[str | None, str | None]:
    """(username, password) of a URL's userinfo; a lone value is the password."""
    if not at:
        return None, None
    user, colon, secret = userinfo.partition(":")
    if colon:
        return (unquote(user) or None), unquote(secret)
    return None, unquote(user)


_CLUSTER_STR = ("client_name", *_TLS_STR)


def _parse_cluster(url: str) -> ClusterTarget:
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if not hostlist:
        raise ValueError("no node address (expected host:6379[,host2:6379])")
    username, password = _userinfo(userinfo, at)
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(
            f"path {parts.path!r}: a Redis Cluster has one database, 0 (leave the path empty)"
        )
    ssl = parts.scheme == "rediss+cluster"
    strings: dict[str, str] = {}
    options: dict[str, Any] = {}
    tls: dict[str, Any] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if name == "ssl":
            ssl = _bool(value, name)
        elif name in _CONNECTION_OPTS and name != "health_check_interval":
            options[name] = _CONNECTION_OPTS[name](value, name)
        elif name in _TLS_OPTS:
            tls[name] = _TLS_OPTS[name](value, name)
        elif name in _CLUSTER_STR:
            strings[name] = value
        else:
            known = sorted({"ssl", *_CONNECTION_OPTS, *_TLS_OPTS, *_CLUSTER_STR})
            known.remove("health_check_interval")  # RedisCluster drops it
            raise ValueError(f"unknown option {name!r} (known: {', '.join(known)})")
    if "client_name" in strings:
        options["client_name"] = strings["client_name"]
    tls.update({k: strings[k] for k in _TLS_STR if k in strings})
    if tls and not ssl:
        raise ValueError("TLS options given without TLS (use rediss+cluster:// or ssl=true)")
    return ClusterTarget(
        nodes=_hosts(hostlist, DEFAULT_CLUSTER_PORT, "node"),
        username=username,
        password=password,
        ssl=ssl,
        tls=tls,
        options=options,
    )


def parse_redis_url(url: str, setting: str = "redis_url") -> SentinelTarget | ClusterTarget | None:
    """A Sentinel or Cluster URL's target, None for a plain URL; RedisConfigError if malformed."""
    if not isinstance(url, str) or not url.strip():
        raise _error(str(url), setting, "empty Redis URL")
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError as exc:
        raise _error(url, setting, f"malformed URL: {exc}") from None
    if scheme in SENTINEL_SCHEMES:
        try:
            return _parse_sentinel(url)
        except ValueError as exc:
            raise _error(url, setting, f"malformed Sentinel URL: {exc}") from None
    if scheme in CLUSTER_SCHEMES:
        try:
            return _parse_cluster(url)
        except ValueError as exc:
            raise _error(url, setting, f"malformed Cluster URL: {exc}") from None
    if scheme not in PLAIN_SCHEMES:
        allowed = ", ".join(f"{s}://" for s in PLAIN_SCHEMES + SENTINEL_SCHEMES + CLUSTER_SCHEMES)
        raise _error(url, setting, f"unknown scheme {scheme or '(none)'!r} (expected {allowed})")
    try:
        redis.connection.parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise _error(url, setting, f"malformed URL: {exc}") from None
    return None


def is_sentinel_url(url: str) -> bool:
    """True for `redis+sentinel://` and `rediss+sentinel://` URLs."""
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def is_cluster_url(url: str) -> bool:
    """True for `redis+cluster://` and `rediss+cluster://` URLs."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def has_hash_tag(key: str) -> bool:
    """True when Redis Cluster hashes only part of `key`: a `{...}` with something inside."""
    start = key.find("{")
    if start < 0:
        return False
    # Redis hashes what lies between the first "{" and the first "}" after it, if anything.
    return key.find("}", start + 1) > start + 1


def hash_tagged(prefix: str) -> str:
    """`prefix` for keys that must share one Cluster slot: as it is when it holds a hash tag
    already, else wrapped in one (`redline:routing` -> `{redline:routing}`)."""
    return prefix if has_hash_tag(prefix) else f"{{{prefix}}}"


def is_cluster(client: object) -> bool:
    """True for a Cluster client or pipeline (sync or asyncio) as `open_redis` builds them."""
    return isinstance(
        client, redis.cluster.RedisCluster | redis.asyncio.cluster.RedisCluster
    ) or isinstance(client, redis.asyncio.cluster.ClusterPipeline)


class _SentinelRedis(redis.Redis):
    """A client of a Sentinel-managed primary that also closes its connections to the
    sentinels when it is closed (redis-py leaves them open)."""

    sentinel_manager: redis.sentinel.Sentinel | None = None

    def close(self) -> None:
        """Close the primary's connections and the sentinels'."""
        super().close()
        if self.sentinel_manager is not None:
            for sentinel in self.sentinel_manager.sentinels:
                sentinel.close()


class _AsyncSentinelRedis(redis.asyncio.Redis):
    """The asyncio `_SentinelRedis`."""

    sentinel_manager: redis.asyncio.sentinel.Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close the primary's connections and the sentinels'."""
        await super().aclose(close_connection_pool)
        if self.sentinel_manager is not None:
            for sentinel in self.sentinel_manager.sentinels:
                await sentinel.aclose()


def _accepted(factory: Callable[..., Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`kwargs` the asyncio RedisCluster takes (it has no **kwargs, unlike the sync one, which
    drops unknown connection options itself): e.g. `retry_on_timeout` has no meaning there."""
    known = inspect.signature(factory).parameters
    return {name: value for name, value in kwargs.items() if name in known}


def _open_cluster(
    url: str, setting: str, target: ClusterTarget, options: Mapping[str, Any]
) -> redis.Redis:
    nodes = [
        redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
        for host, port in target.nodes
    ]
    try:
        client = redis.cluster.RedisCluster(startup_nodes=nodes, **target.node_kwargs(options))
    except redis.exceptions.RedisClusterException as exc:
        # The sync client reads the slot map at once; not a URL problem (check_redis says
        # what exactly), but Redis being unreachable: a ConnectionError, as callers expect.
        raise ClusterUnavailableError(f"{setting}: {mask_url(url)}: {exc}") from None
    # RedisCluster is no redis.Redis subclass but offers the same commands (keys of one
    # command, script or transaction must share a slot): callers type against redis.Redis.
    return cast(redis.Redis, client)


def open_redis(url: str, setting: str = "redis_url", **options: Any) -> redis.Redis:
    """A synchronous client for `url` (plain, TLS, Sentinel or Cluster); `options` go to the
    connections. A Cluster client reads the slot map at once: ClusterUnavailableError (a
    ConnectionError) when no start-up node answers."""
    target = parse_redis_url(url, setting)
    if target is None:
        return redis.Redis.from_url(url, **options)
    if isinstance(target, ClusterTarget):
        return _open_cluster(url, setting, target, options)
    sentinel = redis.sentinel.Sentinel(
        list(target.sentinels),
        min_other_sentinels=target.min_other_sentinels,
        sentinel_kwargs=target.sentinel_kwargs(options),
    )
    client: _SentinelRedis = sentinel.master_for(
        target.master, redis_class=_SentinelRedis, **target.master_kwargs(options)
    )
    client.sentinel_manager = sentinel
    return client


def open_async_redis(url: str, setting: str = "redis_url", **options: Any) -> redis.asyncio.Redis:
    """An asyncio client for `url` (plain, TLS, Sentinel or Cluster); `options` go to the
    connections. A Cluster client reads the slot map at its first command."""
    target = parse_redis_url(url, setting)
    if target is None:
        return redis.asyncio.Redis.from_url(url, **options)
    if isinstance(target, ClusterTarget):
        factory = redis.asyncio.cluster.RedisCluster
        nodes = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in target.nodes]
        kwargs = _accepted(factory, target.node_kwargs(options))
        # Same commands as redis.asyncio.Redis (see _open_cluster): callers type against it.
        return cast(redis.asyncio.Redis, factory(startup_nodes=nodes, **kwargs))
    sentinel = redis.asyncio.sentinel.Sentinel(
        list(target.sentinels),
        min_other_sentinels=target.min_other_sentinels,
        sentinel_kwargs=target.sentinel_kwargs(options),
    )
    client: _AsyncSentinelRedis = sentinel.master_for(
        target.master, redis_class=_AsyncSentinelRedis, **target.master_kwargs(options)
    )
    client.sentinel_manager = sentinel
    return client


def _ask_sentinels(target: SentinelTarget) -> tuple[list[str], list[str], set[str]]:
    """Per sentinel: the reachable ones, the unreachable ones (why), the master names known."""
    reachable: list[str] = []
    failed: list[str] = []
    masters: set[str] = set()
    for host, port in target.sentinels:
        client = redis.Redis(host=host, port=port, **target.sentinel_kwargs({}))
        try:
            known = client.sentinel_masters()
        except (redis.exceptions.RedisError, OSError) as exc:
            failed.append(f"{host}:{port} ({type(exc).__name__}: {exc})")
            continue
        finally:
            client.close()
        reachable.append(f"{host}:{port}")
        masters.update(str(name) for name in known)
    return reachable, failed, masters


def _cluster_info(client: redis.Redis) -> dict[str, str]:
    """CLUSTER INFO as strings (redis-py parses the reply into a dict, or leaves it text)."""
    raw = client.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
    if isinstance(raw, dict):
        return {str(k): _text(v) for k, v in raw.items()}
    pairs = (line.split(":", 1) for line in _text(raw).splitlines() if ":" in line)
    return {name.strip(): value.strip() for name, value in pairs}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ask_cluster(
    url: str, setting: str, target: ClusterTarget
) -> tuple[str, dict[str, str], list[str]]:
    """CLUSTER INFO of the first start-up node that answers: (its address, the info, the
    nodes that did not answer and why); RedisConfigError when none answers or one is no
    Cluster node."""
    failed: list[str] = []
    for host, port in target.nodes:
        # No retries: a refused connection is an answer; redis-py's default retries with
        # backoff would take seconds per node.
        retry = redis.retry.Retry(redis.backoff.NoBackoff(), 0)
        client = redis.Redis(host=host, port=port, retry=retry, **target.check_kwargs())
        try:
            info = _cluster_info(client)
        except redis.exceptions.ResponseError as exc:
            if "cluster support disabled" in str(exc).lower():
                raise _error(
                    url,
                    setting,
                    f"{host}:{port} is not a Cluster node (cluster support disabled): use "
                    "redis:// for a single server",
                ) from None
            failed.append(f"{host}:{port} (ResponseError: {exc})")
            continue
        except (redis.RedisError, OSError) as exc:
            failed.append(f"{host}:{port} ({type(exc).__name__}: {exc})")
            continue
        finally:
            client.close()
        return f"{host}:{port}", info, failed
    raise _error(url, setting, "no Cluster node reachable: " + "; ".join(failed))


def _check_cluster(url: str, setting: str, target: ClusterTarget) -> None:
    """A Cluster URL: a node answers, every slot is assigned, `cluster_state` is ok."""
    address, info, _ = _ask_cluster(url, setting, target)
    state = info.get("cluster_state", "?")
    assigned = int(info.get("cluster_slots_assigned", "0") or 0)
    if assigned < CLUSTER_SLOTS:
        raise _error(
            url,
            setting,
            f"a Cluster without the right slots: {address} sees {assigned} of {CLUSTER_SLOTS} "
            f"hash slots assigned (cluster_state:{state}); assign the missing ones "
            "(redis-cli --cluster fix)",
        )
    if state != "ok":
        counts = ", ".join(
            f"{name.removeprefix('cluster_')}:{info.get(name, '?')}"
            for name in ("cluster_slots_ok", "cluster_slots_pfail", "cluster_slots_fail")
        )
        raise _error(
            url, setting, f"the Cluster is down: {address} reports cluster_state:{state} ({counts})"
        )


def check_redis(url: str, setting: str = "redis_url") -> None:
    """Refuse a Redis URL a service cannot start on; RedisConfigError naming `setting`.

    Every URL is parsed; a Sentinel URL is also checked against its sentinels: at least one
    must answer, and one must know the master name. A Cluster URL is checked against its
    start-up nodes: one must answer, see all 16384 slots assigned and `cluster_state:ok`. A
    plain Redis that is down is not an error here: services that can run without it (the
    gateway) keep their own fallbacks.
    """
    target = parse_redis_url(url, setting)
    if target is None:
        return
    if isinstance(target, ClusterTarget):
        _check_cluster(url, setting, target)
        return
    reachable, failed, masters = _ask_sentinels(target)
    if not reachable:
        raise _error(url, setting, "no sentinel reachable: " + "; ".join(failed))
    if target.master not in masters:
        known = ", ".join(sorted(masters)) or "none"
        raise _error(
            url,
            setting,
            f"unknown master name {target.master!r}: the sentinels at {', '.join(reachable)} "
            f"monitor {known}",
        )


def _acked(acked: int, wanted: int, timeout_ms: int) -> int:
    if acked < wanted:
        raise ReplicaAckError(
            f"only {acked} of {wanted} replica(s) acknowledged the write within "
            f"{timeout_ms} ms; it may be lost if the primary fails now"
        )
    return acked


ACK_FENCE_KEY = "redline:{ack}:fence"
"""The key a fence write bumps before WAIT (hash-tagged: one slot, Cluster-safe). On a Cluster,
WAIT speaks for the one node that serves the fence's slot: give the fence the hash tag of the
writes it must cover."""


def wait_for_replicas(
    client: redis.Redis, replicas: int, timeout_ms: int, fence_key: str = ACK_FENCE_KEY
) -> int:
    """Wait until `replicas` replicas hold every write completed before the call; ReplicaAckError
    if fewer acknowledge within `timeout_ms`. 0 replicas: nothing is sent.

    WAIT counts the writes of its own connection, and a pooled client may have written on
    another one; so a fence (INCR `fence_key`) and WAIT go out together on one connection: the
    replication stream is ordered, so a replica holding the fence holds every earlier write.
    """
    if replicas <= 0:
        return 0
    pipe = client.pipeline(transaction=False)
    pipe.incr(fence_key)
    if is_cluster(client):
        # A Cluster pipeline sends each node's commands on one connection, in order; WAIT has
        # no key, so it is pinned to the node of the fence (redis-py would ask every primary).
        cluster = cast(redis.cluster.RedisCluster, client)
        node = cluster.get_node_from_key(fence_key)  # type: ignore[no-untyped-call]
        pipe.execute_command(  # type: ignore[no-untyped-call]
            "WAIT", replicas, timeout_ms, target_nodes=node
        )
    else:
        pipe.wait(replicas, timeout_ms)
    return _acked(int(pipe.execute()[-1]), replicas, timeout_ms)


def durable_execute(pipe: redis.client.Pipeline, replicas: int, timeout_ms: int) -> list[Any]:
    """Execute `pipe` with WAIT appended (same connection); its results without WAIT's.

    `pipe` must be `pipeline(transaction=False)`: inside MULTI, WAIT does not block. Scripts
    (EVALSHA) keep a write atomic without a transaction.
    """
    if replicas <= 0:
        return list(pipe.execute())
    if is_cluster(pipe):
        raise ValueError(
            "durable_execute cannot tell which Cluster node to WAIT on: write, then call "
            "wait_for_replicas with a fence key in the slot of the writes"
        )
    # `transaction` is an instance flag here, shadowing Redis.transaction() (mypy sees that)
    if vars(pipe).get("transaction") is True or pipe.explicit_transaction:
        raise ValueError(
            "durable_execute needs pipeline(transaction=False): WAIT in MULTI is a no-op"
        )
    pipe.wait(replicas, timeout_ms)
    results = list(pipe.execute())
    _acked(int(results[-1]), replicas, timeout_ms)
    return results[:-1]


async def async_durable_execute(
    pipe: redis.asyncio.client.Pipeline, replicas: int, timeout_ms: int
) -> list[Any]:
    """The asyncio `durable_execute`: run `pipe` and WAIT on its one connection."""
    if replicas <= 0:
        return list(await pipe.execute())
    if is_cluster(pipe):
        raise ValueError(
            "durable_execute cannot tell which Cluster node to WAIT on: write, then call "
            "async_wait_for_replicas with a fence key in the slot of the writes"
        )
    if pipe.is_transaction or pipe.explicit_transaction:
        raise ValueError(
            "durable_execute needs pipeline(transaction=False): WAIT in MULTI is a no-op"
        )
    pipe.wait(replicas, timeout_ms)
    results = list(await pipe.execute())
    _acked(int(results[-1]), replicas, timeout_ms)
    return results[:-1]


async def async_wait_for_replicas(
    client: redis.asyncio.Redis, replicas: int, timeout_ms: int, fence_key: str = ACK_FENCE_KEY
) -> int:
    """The asyncio `wait_for_replicas`: fence and WAIT on one connection of the pool."""
    if replicas <= 0:
        return 0
    pipe = client.pipeline(transaction=False)
    pipe.incr(fence_key)
    if is_cluster(client):
        cluster = cast(redis.asyncio.cluster.RedisCluster, client)
        await cluster.initialize()  # the slot map (a no-op once read)
        node = cluster.get_node_from_key(fence_key)
        pipe.execute_command("WAIT", replicas, timeout_ms, target_nodes=node)
    else:
        pipe.wait(replicas, timeout_ms)
    return _acked(int((await pipe.execute())[-1]), replicas, timeout_ms)


def queue_wait(pipe: Any, key: str, replicas: int, timeout_ms: int) -> None:
    """Queue WAIT on a synchronous pipeline (transaction=False) after writes to `key`'s slot.

    WAIT counts the writes of its own connection: a plain pipeline has one; a Cluster pipeline
    has one per node, so WAIT (which has no key) is pinned to the node serving `key`.
    """
    if is_cluster(pipe):
        node = pipe.get_node_from_key(key)
        pipe.execute_command("WAIT", replicas, timeout_ms, target_nodes=node)
    else:
        pipe.wait(replicas, timeout_ms)


def queue_script(
    pipe: Any, script: redis.commands.core.Script, keys: Sequence[Any], args: Sequence[Any]
) -> None:
    """Queue `script` on a synchronous pipeline, plain or Cluster.

    A plain pipeline loads its scripts before it runs; a Cluster pipeline refuses `evalsha` by
    name, so it gets the raw EVALSHA (routed by its keys) and `execute_scripted` loads the
    scripts when a node does not know them yet.
    """
    if is_cluster(pipe):
        pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    else:
        script(keys=keys, args=args, client=pipe)


def execute_scripted(
    client: redis.Redis,
    fill: Callable[[Any], None],
    scripts: Sequence[redis.commands.core.Script],
) -> list[Any]:
    """Run a pipeline (transaction=False) that `fill` queues, with `queue_script` for scripts.

    On a Cluster, a node that does not know a script (new, restarted or promoted) answers
    NOSCRIPT to every EVALSHA of it: `scripts` are then loaded on every primary and the
    pipeline built and run again, once. So `fill` must queue what may run twice: reads, or the
    calls of one script on one node (its keys share a slot), where NOSCRIPT means none ran.
    """
    pipe = client.pipeline(transaction=False)
    fill(pipe)
    if not is_cluster(client):
        return list(pipe.execute())
    try:
        return list(pipe.execute())
    except redis.exceptions.NoScriptError:
        for script in scripts:
            client.script_load(script.script)
    pipe = client.pipeline(transaction=False)
    fill(pipe)
    return list(pipe.execute())
