"""Helpers of the vector index tests: a fresh collection pair on a real Milvus, its delta log in
a real Redis, and the writer."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from redline.platform.index import DeltaLog, IndexConfig, IndexWriter, MilvusTarget, TargetSpec


@dataclass
class OpenIndex:
    """One logical collection wired to a fresh primary and replica collection."""

    config: IndexConfig
    redis: redis.Redis
    log: DeltaLog
    primary: MilvusTarget
    replica: MilvusTarget
    writer: IndexWriter


def open_index(redis_url: str, uri: str, name: str, dim: int, region: str) -> OpenIndex:
    """Collections `<name>_p` and `<name>_r` on `uri`, created; the writer writes as `region`."""
    config = IndexConfig(
        collection=name,
        dim=dim,
        primary=TargetSpec(uri, f"{name}_p", "primary"),
        replica=TargetSpec(uri, f"{name}_r", "replica"),
        region=region,
    )
    client = redis.Redis.from_url(redis_url)
    log = DeltaLog(client, config.collection, dim)
    primary = MilvusTarget(config.primary, dim)
    replica = MilvusTarget(config.replica, dim)
    primary.ensure_collection()
    replica.ensure_collection()
    return OpenIndex(config, client, log, primary, replica, IndexWriter(log, primary, region))


def close_index(index: OpenIndex) -> None:
    """Drop both collections and close every client."""
    for target in (index.primary, index.replica):
        target.client().drop_collection(target.collection)
        target.close()
    index.redis.close()
