"""redline on a real local Redis Cluster (three primaries, `redis-cli --cluster create`): the
start-up checks, the receiver, the job store and a worker, the delta log with its replicator
checkpoint and freeze flag, and the routing store.

Every multi-key script, transaction and MGET of those stores must find its keys in one slot:
the cluster refuses anything else (CROSSSLOT), which the control tests show for the key
layouts used before they were hash-tagged.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import redis.asyncio
from pydantic import SecretStr
from redis.crc import key_slot

from redline.core.redisconn import (
    ClusterUnavailableError,
    RedisConfigError,
    ReplicaAckError,
    async_wait_for_replicas,
    check_redis,
    durable_execute,
    is_cluster,
    open_async_redis,
    open_redis,
    wait_for_replicas,
)
from redline.devstack.processes import Service, free_port
from redline.gateway.quotas import TokenBuckets
from redline.platform.index import (
    DeltaLog,
    IndexConfig,
    IndexWriter,
    MilvusTarget,
    Replicator,
    TargetSpec,
)
from redline.platform.routing import AsyncRoutingReader, RoutingStore
from redline.platform.session_replica import ReplicaConsumer
from redline.platform.sessions import (
    SessionLayout,
    SessionStoreError,
    SessionWriter,
    measure_cdc_rpo,
)
from redline.remediation.app import build_receiver_app
from redline.remediation.audit import AuditLog
from redline.remediation.jobs import TERMINAL, JobStore
from redline.remediation.settings import RemediationSettings
from redline.remediation.worker import Worker
from tests.support.redis_cluster import (
    LocalCluster,
    add_replica,
    cluster_info,
    start_partial_cluster,
    start_redis_cluster,
)
from tests.support.remediation import AUTH, TOKEN, alert, make_settings, open_registry, payload

DIM = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three cluster-enabled redis-servers, every slot assigned, for this module."""
    running = start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
    yield running
    running.stop()


@pytest.fixture()
def cluster_url(cluster: LocalCluster) -> str:
    """The cluster's `redis+cluster://` URL, every node flushed."""
    cluster.flush()
    return cluster.url


@pytest.fixture()
def client(cluster_url: str) -> Iterator[redis.Redis]:
    """A Cluster client from the connection factory (replies decoded)."""
    opened = open_redis(cluster_url, decode_responses=True)
    assert is_cluster(opened)
    yield opened
    opened.close()


def _slots(keys: list[str]) -> set[int]:
    return {key_slot(key.encode()) for key in keys}


# --- start-up checks --------------------------------------------------------------------------


def test_check_redis_accepts_the_cluster_and_refuses_unreachable_nodes(
    cluster_url: str, redis_url: str
) -> None:
    check_redis(cluster_url, "remediation.redis_url")
    # The first start-up node is down: the next one answers for the cluster.
    dead = f"127.0.0.1:{free_port()}"
    check_redis(cluster_url.replace("redis+cluster://", f"redis+cluster://{dead},"))

    nowhere = f"redis+cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/"
    with pytest.raises(RedisConfigError) as info:
        check_redis(nowhere, "remediation.redis_url")
    message = str(info.value)
    assert message.startswith("remediation.redis_url: redis+cluster://")
    assert "no Cluster node reachable" in message and "ConnectionError" in message
    with pytest.raises(ClusterUnavailableError, match="gateway.redis_url: .*cannot be connected"):
        open_redis(nowhere, "gateway.redis_url", socket_connect_timeout=0.5)

    # A plain redis-server named as a Cluster node.
    single = redis_url.replace("redis://", "redis+cluster://").removesuffix("/0")
    with pytest.raises(RedisConfigError, match="is not a Cluster node .*use redis://"):
        check_redis(single, "gateway.redis_url")


def test_check_redis_refuses_a_cluster_without_the_right_slots(tmp_path: Path) -> None:
    # Three nodes met, the third never given its slots: 10923 of 16384 are served.
    partial = start_partial_cluster(tmp_path, [(0, 5460), (5461, 10922), None])
    try:
        url = partial.url
        with pytest.raises(RedisConfigError) as info:
            check_redis(url, "index.redis_url")
        message = str(info.value)
        assert message.startswith("index.redis_url: ")
        assert "a Cluster without the right slots" in message
        assert "10923 of 16384" in message and "cluster_state:fail" in message
        with pytest.raises(ClusterUnavailableError, match="index.redis_url: .*not covered"):
            open_redis(url, "index.redis_url")
        # Once the missing slots are assigned the same URL is accepted.
        last = partial.client(2)
        try:
            last.execute_command("CLUSTER ADDSLOTSRANGE", 10923, 16383)
        finally:
            last.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                check_redis(url, "index.redis_url")
                break
            except RedisConfigError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        partial.stop()


def test_check_redis_refuses_a_cluster_that_is_down(tmp_path: Path) -> None:
    # Every slot assigned, but one primary gone (no replica to promote): cluster_state:fail.
    broken = start_redis_cluster(tmp_path)
    try:
        broken.nodes[2].kill()
        survivor = broken.client(0)
        try:
            deadline = time.monotonic() + 30
            while cluster_info(survivor).get("cluster_state") != "fail":
                assert time.monotonic() < deadline, "the cluster never noticed the dead node"
                time.sleep(0.1)
        finally:
            survivor.close()
        with pytest.raises(RedisConfigError) as info:
            check_redis(broken.url, "gateway.redis_url")
        message = str(info.value)
        assert "the Cluster is down" in message and "cluster_state:fail" in message
        assert "slots_fail:5461" in message
    finally:
        broken.stop()


# --- the previous, untagged layouts: what the cluster refuses ---------------------------------


def test_the_cluster_refuses_keys_of_one_operation_in_several_slots(client: redis.Redis) -> None:
    # The layouts before hash tags: the delta log's append script (log + freeze flag) and the
    # routing store's MGET spread over slots, so a real cluster refuses them. The same
    # operations on today's keys are what the tests below run.
    old_log = ["redline:index:docs:log", "redline:index:docs:frozen"]
    old_routing = ["redline:routing:override", "redline:routing:admission:eu"]
    for keys in (old_log, old_routing):
        assert len(_slots(keys)) == 2
    script = client.register_script("return redis.call('EXISTS', KEYS[1], KEYS[2])")
    with pytest.raises(redis.RedisClusterException, match="same key slot"):
        script(keys=old_log)
    with pytest.raises(redis.RedisClusterException, match="same key slot"):
        client.mget(old_routing)
    # Sent by hand (no client-side check), the node itself answers CROSSSLOT.
    with pytest.raises(redis.exceptions.ClusterCrossSlotError, match="same slot"):
        client.execute_command(
            "EVAL", "return 1", 2, *old_log, target_nodes=client.get_random_node()
        )
    tagged = DeltaLog(client, "docs", DIM)
    assert len(_slots([tagged.stream_key, tagged.frozen_key, tagged.targets_key])) == 1


# --- the receiver, the job store and a worker -------------------------------------------------


def _post_alerts(
    settings: RemediationSettings, bodies: list[dict[str, Any]]
) -> list[httpx.Response]:
    """POST each body to /alerts through the ASGI app (its lifespan opens the Cluster client)."""
    app = build_receiver_app(settings, token=SecretStr(TOKEN))

    async def main() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as http:
                answers = [await http.post("/alerts", json=body, headers=AUTH) for body in bodies]
                answers.append(await http.get("/jobs", headers=AUTH))
                answers.append(await http.get("/readyz"))
                return answers

    return asyncio.run(main())


def test_receiver_job_store_and_worker_on_the_cluster(
    cluster_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    settings = make_settings(cluster_url, audit_file=tmp_path / "audit.jsonl")
    first = payload(alert("00000000000000c1"), alert("00000000000000c2", playbook=None))
    again = payload(alert("00000000000000c1"))
    second = payload(alert("00000000000000c3", region="secondary"))
    accepted, duplicate, other, jobs, ready = _post_alerts(settings, [first, again, second])
    assert accepted.status_code == 202, accepted.text
    assert duplicate.status_code == 200, duplicate.text
    assert other.status_code == 202, other.text
    assert ready.status_code == 200, ready.text
    listed = jobs.json()["jobs"]
    assert jobs.status_code == 200 and len(listed) == 2

    store = JobStore(client, settings.key_prefix, settings.retention_seconds)
    # Every key of the store (jobs, stream, index, idempotency, audit) is in one slot, on one node.
    keys = sorted(client.scan_iter(match=f"{{{settings.key_prefix}}}:*"))
    assert len(keys) >= 8 and len(_slots(keys)) == 1
    assert client.xlen(store.keys.stream) == 2
    ids = {job["alert"]["fingerprint"]: job["id"] for job in listed}
    assert set(ids) == {"00000000000000c1", "00000000000000c3"}

    # A worker on a Cluster client claims each job from the stream, runs it, settles it.
    worker = Worker(settings, open_registry(settings), client, name="cluster-worker")
    deadline = time.monotonic() + 30
    while not all(
        (job := store.get(job_id)) is not None and job.status in TERMINAL for job_id in ids.values()
    ):
        assert time.monotonic() < deadline, [store.get(job_id) for job_id in ids.values()]
        worker.run_once(block_ms=100)
    for job_id in ids.values():
        job = store.get(job_id)
        assert job is not None and job.status == "succeeded", job
        assert client.get(f"rt:runs:{job_id}") == "1"  # ran exactly once
    assert client.xlen(store.keys.stream) == 0  # settled entries left the stream

    # Idempotency survives: the same alert posted again is a duplicate, no new job.
    (repeat, *_) = _post_alerts(settings, [again])
    assert repeat.status_code == 200 and repeat.json()["duplicates"] == 1, repeat.text
    assert client.zcard(store.keys.index) == 2

    # The audit trail (records + head, written by the ingest and the worker's scripts) verifies.
    audit = AuditLog(client, settings.key_prefix)
    result = audit.verify()
    assert result.ok, result.render("redis")
    kinds = [json.loads(line)["kind"] for line in audit.records()]
    assert kinds.count("job.accepted") == 2 and "alert.acknowledged" in kinds


def test_wait_for_replicas_asks_the_node_that_holds_the_fence(tmp_path: Path) -> None:
    # Three primaries, one of them (the one serving the receiver's `{redline}` slot) with a
    # replica: WAIT counts it only when sent to that node, on the fence write's connection.
    own = start_redis_cluster(tmp_path / "cluster")
    try:
        fence = "{redline}:ack:fence"
        probe = open_redis(own.url)
        node = probe.get_node_from_key(fence)
        probe.close()
        index = next(i for i, n in enumerate(own.nodes) if n.port == node.port)
        add_replica(own, tmp_path / "replica", index)
        client = open_redis(own.url, decode_responses=True)
        try:
            other = next(
                f"{{{tag}}}:fence"
                for tag in ("a", "b", "c", "d", "e", "f", "g", "h")
                if client.get_node_from_key(f"{{{tag}}}:fence").port != node.port
            )
            client.set("{redline}:job", "1")
            assert wait_for_replicas(client, 1, 5000, fence) == 1
            assert client.get(fence) == "1"
            with pytest.raises(ReplicaAckError, match="only 0 of 1 replica"):
                wait_for_replicas(client, 1, 200, other)

            async def acked() -> int:
                aclient = open_async_redis(own.url)
                try:
                    return await async_wait_for_replicas(aclient, 1, 5000, fence)
                finally:
                    await aclient.aclose()

            assert asyncio.run(acked()) == 1
            with pytest.raises(ValueError, match="cannot tell which Cluster node"):
                durable_execute(client.pipeline(transaction=False).set("{redline}:x", "1"), 1, 100)
        finally:
            client.close()
    finally:
        own.stop()


# --- the delta log, the replicator's checkpoint, the freeze flag ------------------------------


@pytest.fixture()
def index_targets(
    milvus_service: Service,
) -> Iterator[tuple[IndexConfig, MilvusTarget, MilvusTarget]]:
    """A fresh primary and replica collection on the session's Milvus Lite."""
    name = f"c{uuid.uuid4().hex[:12]}"
    uri = milvus_service.extra["uri"]
    config = IndexConfig(
        collection=name,
        dim=DIM,
        primary=TargetSpec(uri, f"{name}_p", "primary"),
        replica=TargetSpec(uri, f"{name}_r", "replica"),
        region="eu",
    )
    primary, replica = MilvusTarget(config.primary, DIM), MilvusTarget(config.replica, DIM)
    primary.ensure_collection()
    replica.ensure_collection()
    yield config, primary, replica
    for target in (primary, replica):
        target.client().drop_collection(target.collection)
        target.close()


def test_delta_log_replicator_checkpoint_and_freeze_on_the_cluster(
    cluster_url: str, index_targets: tuple[IndexConfig, MilvusTarget, MilvusTarget]
) -> None:
    config, primary, replica = index_targets
    client = open_redis(cluster_url)
    try:
        log = DeltaLog(client, config.collection, DIM)
        writer = IndexWriter(log, primary, "eu")
        vectors = np.random.default_rng(7).standard_normal((12, DIM)).astype(np.float32)

        acks = writer.upsert_many([(f"doc-{i}", vectors[i]) for i in range(6)])
        assert all(ack.applied for ack in acks)
        assert [e.id for e in log.read_after("0-0", 100)] == [f"doc-{i}" for i in range(6)]

        # The replicator registers its replica, applies the log and checkpoints (lease script).
        replicator = Replicator(log, replica, batch_size=100, retention_seconds=0.0)
        result = replicator.step()
        assert result is not None and result.entries == 6
        state = log.target_state(replica.name)
        assert state.checkpoint == acks[-1].stream_id and state.applied == 6
        assert log.pending(replica.name)[0] == 0
        assert replica.count() == 6

        # Frozen: appends report the flag (same script, same slot) and skip the primary.
        writer.freeze("cluster test")
        frozen = writer.upsert_many([(f"doc-{i}", vectors[i]) for i in range(6, 10)])
        assert not any(ack.applied for ack in frozen)
        assert primary.count() == 6
        freeze = log.freeze_state()
        assert freeze is not None and freeze.reason == "cluster test"
        assert not log.clear_freeze_if_caught_up(primary.name)
        # Unfreezing catches the primary up from the freeze point, then clears the flag.
        assert writer.unfreeze() == 4
        assert log.freeze_state() is None and primary.count() == 10

        # The replicator catches up from its checkpoint; the trim keeps what it has not applied.
        assert log.pending(replica.name)[0] == 4
        result = replicator.step()
        assert result is not None and result.entries == 4 and replica.count() == 10
        assert log.target_state(replica.name).checkpoint == frozen[-1].stream_id
        keys = [
            k.decode() for k in client.scan_iter(match=f"redline:index:{{{config.collection}}}*")
        ]
        assert len(keys) >= 4 and len(_slots(keys)) == 1
    finally:
        client.close()


def test_two_region_logs_share_the_collections_slot(client: redis.Redis) -> None:
    eu, us = DeltaLog(client, "shared", DIM, origin="eu"), DeltaLog(client, "shared", DIM, "us")
    vector = np.ones(DIM, dtype=np.float32)
    (eu_ack,) = eu.append([("u", "a", vector)], "eu", 1000)
    (us_ack,) = us.append([("u", "a", vector)], "us", 1001)
    assert not eu_ack[1] and not us_ack[1]
    recent = [eu.shared + ":recent:eu", us.shared + ":recent:us"]
    assert len(_slots([eu.stream_key, us.stream_key, *recent])) == 1
    assert client.hget(recent[0], "a") is not None


# --- the routing store ------------------------------------------------------------------------


def test_routing_store_override_and_admission_on_the_cluster(cluster_url: str) -> None:
    store = RoutingStore.from_url(cluster_url, regions=["primary", "secondary", "eu"])
    try:
        assert store.state(["primary", "secondary"]).override is None
        store.set_override("secondary", "cluster test", ttl_seconds=60)
        store.close_admission("primary", "spot drain")
        state = store.state(["primary", "secondary", "eu"])  # one MGET over every key
        assert state.override is not None and state.override.target_region == "secondary"
        assert state.closed == frozenset({"primary"})

        async def read() -> Any:
            reader = AsyncRoutingReader(open_async_redis(cluster_url))
            try:
                return await reader.fetch_state(["primary", "secondary", "eu"])
            finally:
                await reader.aclose()

        seen = asyncio.run(read())
        assert seen.override is not None and seen.override.reason == "cluster test"
        assert seen.closed == frozenset({"primary"})

        assert store.clear_override() and store.open_admission("primary")
        cleared = store.state(["primary", "secondary", "eu"])
        assert cleared.override is None and cleared.closed == frozenset()
        keys = [store.override_key, *(store.admission_key(r) for r in ("primary", "eu"))]
        assert len(_slots(keys)) == 1
    finally:
        store.close()


# --- session CDC ------------------------------------------------------------------------------


def test_session_cdc_needs_one_hash_tag_and_then_runs_on_the_cluster(
    client: redis.Redis, redis_url: str
) -> None:
    # The default layout spreads the writer's three keys over slots: refused up front.
    with pytest.raises(SessionStoreError, match="must share one hash tag"):
        SessionWriter(client)
    layout = SessionLayout("{session}:ctx:", "{session}:cdc", "{session}:written")
    writer = SessionWriter(client, layout, ttl_seconds=60)
    replica = redis.Redis.from_url(redis_url, decode_responses=True)
    consumer = ReplicaConsumer(client, replica, layout.stream, trim_interval_seconds=None)
    try:
        consumer.ensure_group()
        writer.write("alice", {"turn": 1})
        writer.write("bob", {"turn": 2})
        writer.delete("bob")
        assert measure_cdc_rpo(client, layout.stream, "session-replica").pending == 0
        assert consumer.step() == 3
        assert replica.get(layout.key_for("alice")) == '{"turn": 1}'
        assert replica.get(layout.key_for("bob")) is None
        lag = measure_cdc_rpo(client, layout.stream, "session-replica")
        assert lag.rpo_seconds == 0.0 and lag.pending == 0
    finally:
        replica.close()


# --- the gateway's token buckets --------------------------------------------------------------


def test_token_buckets_take_and_settle_on_the_cluster(cluster_url: str) -> None:
    # Nodes that know no script (flushed): the first EVALSHA of each node is NOSCRIPT, loaded
    # again; the settlements of several tenants (several slots) go out together.

    async def run() -> tuple[tuple[bool, float], list[float], tuple[bool, float]]:
        buckets = TokenBuckets(open_async_redis(cluster_url))
        try:
            taken = await buckets.take("{acme}:chat", 0.001, 10.0, 4.0, 0.0)
            keys = ["{acme}:chat", "{globex}:chat", "{initech}:summary"]
            assert len(_slots(keys)) == 3
            levels = await buckets.adjust_many([(key, 0.001, 10.0, -1.0) for key in keys])
            refused = await buckets.take("{acme}:chat", 0.001, 10.0, 8.0, 0.0)
            return taken, levels, refused
        finally:
            await buckets.client.aclose()

    taken, levels, refused = asyncio.run(run())
    assert taken[0] and taken[1] == pytest.approx(6.0, abs=0.01)
    assert levels == pytest.approx([5.0, 9.0, 9.0], abs=0.01)
    assert not refused[0]
