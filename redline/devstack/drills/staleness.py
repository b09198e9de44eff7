"""The staleness drill: the index replicator stalls while acknowledged writes go on ->
RedLineIndexStaleness -> freeze_and_replay -> the replica caught up, no acknowledged write lost."""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np

from redline.core.redisconn import open_redis
from redline.devstack.drills.base import DrillError, DrillResult, parse_time
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.waits import (
    budget_for,
    firing_timeout,
    require_quiet,
    run_playbook_loop,
    wait_firing,
    wait_job,
    wait_job_done,
    wait_recovered,
)
from redline.devstack.layout import COLLECTION, INDEX_DIM, PRIMARY_INDEX, REPLICA_INDEX
from redline.platform.index import (
    DeltaLog,
    IndexWriter,
    MilvusTarget,
    TargetSpec,
    to_vector,
    vector_checksum,
)
from redline.slo.alerts import Alert


class _AckedWriter:
    """Writes rows through the index write path in a thread, remembering every acknowledgement."""

    def __init__(self, ctx: DrillContext, prefix: str, rate: float = 10.0) -> None:
        endpoints = ctx.endpoints
        self.client = open_redis(endpoints.redis_url, socket_timeout=10)
        self.log = DeltaLog(self.client, COLLECTION, INDEX_DIM)
        spec = TargetSpec(endpoints.milvus_primary_uri, COLLECTION, PRIMARY_INDEX)
        self.primary = MilvusTarget(spec, INDEX_DIM, 10.0)
        self.writer = IndexWriter(self.log, self.primary, endpoints.regions[0])
        self.prefix = prefix
        self.rate = rate
        self.acked: dict[str, str] = {}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="drill-writer", daemon=True)
        self.rng = np.random.default_rng(int(time.time()))

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            row_id = f"{self.prefix}{n}"
            vector = self.rng.standard_normal(INDEX_DIM).astype(np.float32)
            try:
                self.writer.upsert(row_id, vector)
            except Exception as exc:  # an unacknowledged write is not owed; count it apart
                self.errors.append(f"{row_id}: {type(exc).__name__}: {exc}")
            else:
                self.acked[row_id] = vector_checksum(to_vector(vector, INDEX_DIM))
            n += 1
            self.stop.wait(1.0 / self.rate)

    def start(self) -> None:
        """Start writing."""
        self.thread.start()

    def finish(self) -> None:
        """Stop writing and wait for the last write."""
        self.stop.set()
        self.thread.join(10)

    def missing(self, target: MilvusTarget) -> list[str]:
        """Acknowledged rows absent from `target` or with another vector."""
        rows = target.fetch(list(self.acked))
        return [i for i, checksum in self.acked.items() if rows.get(i) is None
                or rows[i].checksum != checksum]  # fmt: skip

    def close(self) -> None:
        """Release the Milvus and Redis connections."""
        self.primary.close()
        self.client.close()


def drill_staleness(ctx: DrillContext) -> DrillResult:
    """Replicator stalled -> RedLineIndexStaleness -> freeze_and_replay -> replica caught up."""
    spec = ctx.spec
    red = spec.red_lines.index_consistency
    result = DrillResult(
        "staleness", Alert.RED_LINE_INDEX_STALENESS, red.playbook, budget_for(ctx, red.for_seconds)
    )
    labels = {"collection": COLLECTION}
    require_quiet(ctx, result, labels)
    writer = _AckedWriter(ctx, f"drill-staleness-{uuid.uuid4().hex[:6]}-")
    log = writer.log
    replica = MilvusTarget(
        TargetSpec(ctx.endpoints.milvus_replica_uri, COLLECTION, REPLICA_INDEX), INDEX_DIM, 10.0
    )
    try:
        if log.freeze_state() is not None:
            raise DrillError("writes are frozen before the drill; unfreeze them first")
        writer.start()
        time.sleep(1.0)
        result.fault = f"replicator of {REPLICA_INDEX} paused (stalled)"
        result.fault_at = time.time()
        log.set_paused(REPLICA_INDEX, True)
        ctx.say(result.drill, f"fault injected: {result.fault}")
        wait_firing(ctx, result, labels, firing_timeout(result, red.max_staleness_seconds))
        canary = writer.client.hgetall(log.canary_key(REPLICA_INDEX))
        canary_ms = int(canary.get(b"ts_ms", b"0"))
        if canary_ms:
            onset = canary_ms / 1000.0 + red.max_staleness_seconds
            result.condition_delay = max(0.0, onset - result.fault_at)
        result.condition_basis = (
            f"the outstanding canary is {red.max_staleness_seconds:g} s old (the red line)"
        )
        run_playbook_loop(ctx, result, labels, 120.0)
        result.check(
            "writes unfrozen after the verified replay",
            log.freeze_state() is None,
            f"freeze flag: {log.freeze_state()}",
        )
        ctx.say(result.drill, "repairing the replicator (resumed)")
        log.set_paused(REPLICA_INDEX, False)
        wait_recovered(ctx, result, labels, 60.0)
        resolved = wait_job(ctx, result, str(red.playbook), labels, "resolved", 30.0)
        result.resolved_notified_at = parse_time(resolved["created_at"])
        wait_job_done(ctx, result.drill, str(red.playbook), resolved["id"], 60.0)
    finally:
        log.set_paused(REPLICA_INDEX, False)
        writer.finish()
    try:

        def caught_up() -> bool | None:
            pending, _ = log.pending(REPLICA_INDEX)
            return True if pending == 0 else None

        ctx.wait_for(result.drill, "the replica to catch up", caught_up, 60.0, 0.5)
        lost_replica = writer.missing(replica)
        lost_primary = writer.missing(writer.primary)
    finally:
        replica.close()
        writer.close()
    result.lost = len(set(lost_replica) | set(lost_primary))
    result.lost_detail = (
        f"{len(writer.acked)} acknowledged writes; missing or different on the replica: "
        f"{len(lost_replica)}, on the primary: {len(lost_primary)}"
        + (f"; {len(writer.errors)} writes not acknowledged" if writer.errors else "")
    )
    result.check("acknowledged writes on the replica", not lost_replica, result.lost_detail)
    return result


__all__ = ["drill_staleness"]
