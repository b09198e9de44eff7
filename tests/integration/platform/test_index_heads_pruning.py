"""Pruning the conflict detector's per-id heads on a real redis-server (and Milvus Lite): the trim
of a region's log drops the settled heads of the copies it feeds — bounded by the first entry
every region's log still holds, the conflict window and the clock skew — keeps those a conflict
or a recent write still needs, prunes the region's old recent writes, never removes a head stored
since it was read, refuses a window other than the collection's, and a row whose heads were
pruned is still deleted by the next delete of its id."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
import redis

from redline.devstack.processes import Service
from redline.platform.index import (
    ConflictMap,
    DeltaLog,
    DeltaLogError,
    Head,
    IndexWriter,
    MilvusTarget,
    TargetSpec,
    trim_delta_log,
)
from redline.platform.index.conflicts import CLOCK_SKEW_MS

DIM = 4
HOUR_MS = 3_600_000
WINDOW_S = 600


def _head(region: str, ts: int, op: str = "upsert", checksum: str = "c1") -> Head:
    return Head(region, f"{ts}-0", ts, op, checksum if op == "upsert" else "")  # type: ignore[arg-type]


def test_the_trim_prunes_settled_heads_and_keeps_what_conflicts_need(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    collection = f"h{uuid.uuid4().hex[:10]}"
    now = int(time.time() * 1000)
    logs = {r: DeltaLog(client, collection, DIM, origin=r) for r in ("eu", "us")}
    vector = np.ones(DIM, dtype=np.float32)
    # eu's log still holds a write two hours old: nothing may settle less than that (less the
    # window and the skew) before now
    logs["eu"].append([("upsert", "first", vector)], "eu", now - 2 * HOUR_MS)
    logs["us"].append([("upsert", "fresh", vector)], "us", now)
    logs["us"].register_target("eu")  # eu's copy applies us's log
    conflicts = ConflictMap(client, collection, window_seconds=WINDOW_S)
    old = now - 5 * HOUR_MS
    heads = {
        "old-deleted": {"eu": _head("eu", old, "delete"), "us": _head("us", old + 1, "delete")},
        "old-upsert": {"us": _head("us", old)},
        "old-conflict": {"eu": _head("eu", old), "us": _head("us", old + 10, checksum="c2")},
        "before-bound": {"eu": _head("eu", now - 2 * HOUR_MS - 30 * 60_000)},
        "after-bound": {"eu": _head("eu", now - 2 * HOUR_MS - 5 * 60_000)},
        "mixed": {"eu": _head("eu", old, "delete"), "us": _head("us", now)},
    }
    conflicts.set_heads("eu", heads)
    stale_recent = f"{old}|u|c1|{old}-0"
    client.hset(conflicts.recent_key("us"), "gone", stale_recent)

    assert conflicts.settled_before_ms(now) == now - 2 * HOUR_MS - CLOCK_SKEW_MS - WINDOW_S * 1000
    report = trim_delta_log(logs["us"], 3600, conflicts=conflicts)
    assert report.heads_pruned == 4 and report.recent_pruned == 1, report.summary()
    assert report.settled_before_ms is not None
    assert abs(report.settled_before_ms - conflicts.settled_before_ms(now)) < 60_000
    assert conflicts.all_heads("eu") == {
        "old-conflict": heads["old-conflict"],  # its re-mapped row derives from both heads
        "after-bound": heads["after-bound"],  # within the window of eu's oldest entry
        "mixed": {"us": heads["mixed"]["us"]},  # the settled losing delete went
    }
    assert client.hkeys(conflicts.recent_key("us")) == [b"fresh"]
    # a second pass finds nothing more
    assert trim_delta_log(logs["us"], 3600, conflicts=conflicts).heads_pruned == 0

    # a head stored after the pruning read it stays (the script compares before it deletes)
    key = conflicts.heads_key("eu")
    read = client.hget(key, "after-bound")
    assert isinstance(read, bytes)
    conflicts.set_heads("eu", {"after-bound": {"eu": _head("eu", now)}})
    assert conflicts._prune(keys=[key], args=["after-bound", read, ""]) == 0
    assert conflicts.heads("eu", ["after-bound"])["after-bound"]["eu"].ts_ms == now

    # another window than the one recorded would resolve differently: refused
    other = ConflictMap(client, collection, window_seconds=60)
    with pytest.raises(DeltaLogError, match="conflict window is 600 s .* this process has 60 s"):
        trim_delta_log(logs["us"], 3600, conflicts=other)
    with pytest.raises(DeltaLogError, match="id_salt differs"):
        ConflictMap(client, collection, "pepper", WINDOW_S).agree()
    client.close()


def test_a_delete_after_the_heads_were_pruned_still_removes_the_row(
    redis_url: str, milvus_service: Service
) -> None:
    client = redis.Redis.from_url(redis_url)
    collection = f"h{uuid.uuid4().hex[:10]}"
    log = DeltaLog(client, collection, DIM, origin="eu")
    copy = MilvusTarget(TargetSpec(milvus_service.extra["uri"], collection, "eu"), DIM)
    copy.ensure_collection()
    writer = IndexWriter(log, copy, "eu", conflict_window_seconds=WINDOW_S)
    try:
        old = int(time.time() * 1000) - 5 * HOUR_MS
        writer.write([("upsert", "kept", np.ones(DIM)), ("upsert", "gone", np.ones(DIM))], old)
        assert set(copy.fetch(["kept", "gone"])) == {"kept", "gone"}
        # the old entries left the log (trimmed): the heads settle, and the trim of the log
        # applied to eu's copy (us's) prunes them
        client.delete(log.stream_key)
        other = DeltaLog(client, collection, DIM, origin="us")
        other.register_target("eu")
        report = trim_delta_log(other, 0, conflicts=writer.conflicts)
        assert report.heads_pruned == 2 and writer.conflicts is not None
        assert writer.conflicts.all_heads("eu") == {}
        writer.delete("gone")
        writer.upsert("kept", np.full(DIM, 2.0))
        rows = copy.fetch(["kept", "gone"], with_vectors=True)
        assert set(rows) == {"kept"}
        vector = rows["kept"].vector
        assert vector is not None and np.array_equal(vector, np.full(DIM, 2.0, dtype=np.float32))
    finally:
        copy.client().drop_collection(collection)
        copy.close()
        client.close()
