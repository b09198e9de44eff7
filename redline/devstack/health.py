"""`redline status`: each part's process and health, checked the way it is used.

HTTP parts answer their health endpoint; the index replicator must keep the replica's backlog
fresh, the session replica its CDC RPO, each CRDT session sync its lag within the RPO with no
divergent sessions, the writers their streams moving, and the load generator its counters;
Prometheus reports how many of its scrape targets are up.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import redis

from redline.core.redisconn import open_redis as connect_redis
from redline.devstack.fakes.service import HEALTH_PATH as SERVICE_HEALTH_PATH
from redline.devstack.layout import (
    COLLECTION,
    INDEX_DIM,
    REDIS_REPLICA_PART,
    REPLICA_INDEX,
    SENTINEL_MASTER,
    SENTINEL_PARTS,
    SESSION_SYNC_PREFIX,
    StackLayout,
    replica_base,
)
from redline.devstack.loadgen import summarize_stats
from redline.devstack.parts import part_alive
from redline.devstack.state import PartState, StackState
from redline.platform.index import DeltaLog, parse_stream_id
from redline.platform.prometheus import PrometheusClient, PrometheusError
from redline.platform.session_sync import CrdtSessionStore, divergent_sessions, measure_sync_lag
from redline.platform.sessions import (
    DEFAULT_GROUP,
    DEFAULT_STREAM,
    CdcTargetError,
    measure_cdc_rpo,
    open_redis,
    stream_id_ms,
)

FRESH_SECONDS = 5.0
CRDT_WINDOW_SECONDS = 600.0
CRDT_SETTLE_SECONDS = 1.0
"""Sessions changed in the last 10 minutes are compared, except those changed within the last
second (the sync's normal delay), as the stack's session_crdt probe does."""
CHECK_ERRORS = (httpx.HTTPError, PrometheusError, redis.RedisError, OSError, KeyError, ValueError)
"""A part whose check fails with one of these is unhealthy (and the error is what was seen)."""


@dataclass(frozen=True)
class PartHealth:
    """One part: running or not, healthy or not, and what was seen."""

    name: str
    pid: int
    alive: bool
    healthy: bool
    detail: str


class _Checker:
    def __init__(self, state: StackState, http: httpx.Client, db: redis.Redis) -> None:
        self.state = state
        self.http = http
        self.db = db
        self.layout: StackLayout = state.layout()

    def get(self, url: str) -> httpx.Response:
        """GET with the checker's client."""
        return self.http.get(url)

    def check(self, part: PartState) -> tuple[bool, str]:
        """Whether a running part is healthy, and what was seen."""
        name = part.name
        url = part.url or ""
        if name == "redis" and not self.state.endpoints().sentinel:
            return bool(self.db.ping()), "PONG"
        if name in ("redis", REDIS_REPLICA_PART):
            # The part itself, not the URL's primary: after a failover either may be primary.
            with redis.Redis(self.state.host, part.port or 0, socket_timeout=2.0) as node:
                info = node.info("replication")
            link = f", link {info.get('master_link_status')}" if info["role"] == "slave" else ""
            return info["role"] == "master" or link == ", link up", f"{info['role']}{link}"
        if name in SENTINEL_PARTS:
            with redis.Redis(self.state.host, part.port or 0, socket_timeout=2.0) as sentinel:
                addr = sentinel.sentinel_get_master_addr_by_name(SENTINEL_MASTER)
            return addr is not None, f"primary {addr[0]}:{addr[1]}" if addr else "no primary"
        if name.startswith("milvus-"):
            with socket.create_connection((self.state.host, part.port or 0), timeout=1.0):
                return True, f"gRPC port {part.port} open"
        if name.startswith("prometheus"):
            with PrometheusClient(url, timeout=2.0, retries=0, trust_env=False) as prometheus:
                active = prometheus.get("/api/v1/targets", {"state": "active"})["activeTargets"]
            up = sum(1 for t in active if t.get("health") == "up")
            return up == len(active), f"{up}/{len(active)} scrape targets up"
        if name == "alertmanager":
            return self.get(f"{url}/-/ready").status_code == 200, "ready"
        if name.startswith("simulator-"):
            ok = self.get(f"{url}/healthz").status_code == 200
            faults = self.get(f"{url}/admin/faults").json()
            return ok, f"latency base {faults['latency']['base_seconds']:g} s, " + (
                f"outage {faults['outage']}" if faults["outage"] != "none" else "no outage"
            )
        if name.startswith("service-"):
            answer = self.get(f"{url}{SERVICE_HEALTH_PATH}")
            body = answer.json()
            pods = body["pods"]
            return answer.status_code == 200 and body["serving"] == len(pods), (
                f"{body['serving']}/{len(pods)} pods in turn"
            )
        if name == "trace-store":
            answer = self.get(f"{url}/healthz")
            body = answer.json()
            return answer.status_code == 200, (
                f"{body['traces']} traces, {body['spans']} spans (keeps {body['max_traces']})"
            )
        base = replica_base(name)
        if base == "gateway":
            return self.get(f"{url}/healthz").status_code == 200, "healthz 200"
        if base == "exporters":
            body = self.get(f"{url}/healthz").json()
            # Canary probes another replica runs (it holds the canary lease) are skipped here.
            skipped = body.get("probes_skipped", 0)
            ok = body["probes_ok"] + skipped == body["probes_total"]
            lease = body.get("canary_lease") or {}
            runner = ", canary runner" if lease.get("held") else ""
            extra = f", {skipped} skipped (canary lease elsewhere)" if skipped else runner
            return ok, f"{body['probes_ok']}/{body['probes_total']} probes ok{extra}"
        if base == "remediation":
            return self.get(f"{url}/readyz").status_code == 200, "ready (Redis reachable)"
        if name == "replicator":
            log = DeltaLog(self.db, COLLECTION, INDEX_DIM)
            pending, oldest = log.pending(REPLICA_INDEX)
            paused = log.is_paused(REPLICA_INDEX)
            age = oldest or 0.0
            ok = not paused and age < FRESH_SECONDS
            return ok, f"{pending} pending (oldest {age:.1f} s)" + (", PAUSED" if paused else "")
        if name == "session-replica":
            client = open_redis(self.state.endpoints().redis_url, timeout_seconds=2.0)
            try:
                lag = measure_cdc_rpo(client, DEFAULT_STREAM, DEFAULT_GROUP)
            except CdcTargetError as exc:
                return False, str(exc)
            finally:
                client.close()
            limit = self.state.load_spec().rpo.session_state.max_seconds
            return lag.rpo_seconds <= limit, f"CDC RPO {lag.rpo_seconds:.2f} s (max {limit:g})"
        if name.startswith(SESSION_SYNC_PREFIX):
            return self._crdt_sync(name.removeprefix(SESSION_SYNC_PREFIX))
        if name == "session-writer":
            return self._stream_fresh(DEFAULT_STREAM, lambda i: stream_id_ms(i) / 1000)
        if name == "index-writer":
            key = DeltaLog(self.db, COLLECTION, INDEX_DIM).stream_key
            return self._stream_fresh(key, lambda i: parse_stream_id(i)[0] / 1000)
        if name == "loadgen":
            stats = summarize_stats(self.layout.loadgen_stats)
            if stats is None:
                return False, "no counters written yet"
            age = time.time() - float(stats["updated_at"])
            p99 = stats["recent_seconds"]["p99"]
            return age < FRESH_SECONDS, (
                f"{stats['recent_rate']:.1f} req/s, p99 {p99 or 0:.3f} s, "
                f"{stats['completed']} done, {stats['failed']} failed"
            )
        return True, "running"

    def _crdt_sync(self, region: str) -> tuple[bool, str]:
        """The sync into `region`: the lag of the other region's deltas against the RPO, and
        the recent sessions whose states differ between the two regions."""
        urls = self.state.endpoints().crdt_session_urls
        source = next(other for other in urls if other != region)
        clients = {r: open_redis(urls[r], timeout_seconds=2.0) for r in (source, region)}
        try:
            stores = {r: CrdtSessionStore(client, r) for r, client in clients.items()}
            lag = measure_sync_lag(stores[source], stores[region])
            divergent, compared = divergent_sessions(
                list(stores.values()), CRDT_WINDOW_SECONDS, CRDT_SETTLE_SECONDS
            )
        finally:
            for client in clients.values():
                client.close()
        limit = self.state.load_spec().rpo.session_crdt.max_seconds
        ok = lag.lag_seconds <= limit and not divergent
        return ok, (
            f"lag {source}→{region} {lag.lag_seconds:.2f} s (max {limit:g}), "
            f"{len(divergent)}/{compared} recent sessions divergent"
        )

    def _stream_fresh(self, key: str, seconds: Callable[[str], float]) -> tuple[bool, str]:
        entries = self.db.xrevrange(key, count=1)
        if not entries:
            return False, f"{key}: no entries yet"
        raw = entries[0][0]
        entry_id = raw.decode() if isinstance(raw, bytes) else str(raw)
        age = time.time() - seconds(entry_id)
        return age < FRESH_SECONDS, f"last write {age:.1f} s ago"


def check_stack(state: StackState) -> list[PartHealth]:
    """Every part's health, in start order."""
    endpoints = state.endpoints()
    results = []
    with httpx.Client(timeout=2.0, trust_env=False) as http:
        db = connect_redis(endpoints.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
        try:
            checker = _Checker(state, http, db)
            for part in state.parts:
                if not part_alive(part):
                    results.append(PartHealth(part.name, part.pid, False, False, "not running"))
                    continue
                try:
                    healthy, detail = checker.check(part)
                except CHECK_ERRORS as exc:
                    healthy, detail = False, f"{type(exc).__name__}: {exc}"
                results.append(PartHealth(part.name, part.pid, True, healthy, detail))
        finally:
            db.close()
    return results
