"""The vector index write path: writer, replicator, delta-log replay and verification on Milvus.

Every write is appended to the delta log first (the acknowledgement), then applied to the primary
unless writes are frozen. Appliers (the replicator, a replay, the primary's catch-up on unfreeze)
read the log from a target's checkpoint, resolve each id to its last writer by (ts_ms, region),
apply idempotent upserts and deletes in batches and only then advance the checkpoint, so a crash
at any point is finished by running again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import redis
from pydantic import BaseModel, Field
from pymilvus import DataType, MilvusClient, MilvusException

from redline.platform.index.deltalog import (
    ZERO_ID,
    DeltaLog,
    DeltaLogError,
    Entry,
    FreezeState,
    Op,
    TargetState,
    Vector,
    Version,
    check_id,
    check_region,
    new_token,
    parse_stream_id,
    stream_id_before,
    to_vector,
    vector_checksum,
)

log = logging.getLogger(__name__)

ROW_FIELDS = ("id", "vector", "ts_ms", "region", "checksum")
_FETCH_CHUNK = 1000


class VectorIndexError(Exception):
    """Base of the index write path's errors."""


class IndexSchemaError(VectorIndexError):
    """A Milvus collection exists but lacks the fields the write path needs."""


class PrimaryApplyError(VectorIndexError):
    """The writes are in the delta log (acknowledged) but could not be applied to the primary."""

    def __init__(self, message: str, acks: list[WriteAck]) -> None:
        super().__init__(message)
        self.acks = acks


class LeaseBusyError(VectorIndexError):
    """Another applier held the target's lease for longer than we were willing to wait."""


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class TargetSpec:
    """Where a copy of the index lives: a Milvus URI, a collection and a name for keys/labels."""

    uri: str
    collection: str
    name: str
    token: str = field(default="", repr=False)


@dataclass(frozen=True)
class IndexConfig:
    """One logical collection: its delta log, dimension, primary and replica."""

    collection: str
    dim: int
    primary: TargetSpec
    replica: TargetSpec
    region: str = "primary"
    metric_type: str = "COSINE"

    def __post_init__(self) -> None:
        check_id(self.collection)
        check_region(self.region)
        if self.dim <= 0:
            raise DeltaLogError(f"dim must be positive, got {self.dim}")
        if self.primary.name == self.replica.name:
            raise DeltaLogError(f"primary and replica need different names ({self.primary.name})")
        if (self.primary.uri, self.primary.collection) == (
            self.replica.uri,
            self.replica.collection,
        ):
            raise DeltaLogError("primary and replica are the same collection on the same Milvus")


class IndexTargetsFields(BaseModel):
    """The settings fields naming an index's two copies, shared by every settings class that
    points at one (the exporter's staleness probe, `redline index`, the index playbooks)."""

    primary_uri: str = Field("http://127.0.0.1:19530", description="Milvus URI of the primary.")
    primary_collection: str | None = Field(None, description="Primary collection (= collection).")
    primary_name: str = Field("primary", description="Name of the primary (keys, labels).")
    replica_uri: str = Field("http://127.0.0.1:19531", description="Milvus URI of the replica.")
    replica_collection: str | None = Field(None, description="Replica collection (= collection).")
    replica_name: str = Field("replica", description="Name of the replica (keys, labels).")
    metric_type: str = Field("COSINE", description="Metric type of the vector index.")

    def index_config(
        self, collection: str, dim: int, token: str = "", region: str = "primary"
    ) -> IndexConfig:
        """The IndexConfig of logical collection `collection`; DeltaLogError when invalid."""
        return IndexConfig(
            collection=collection,
            dim=dim,
            primary=TargetSpec(
                self.primary_uri,
                self.primary_collection or collection,
                self.primary_name,
                token,
            ),
            replica=TargetSpec(
                self.replica_uri,
                self.replica_collection or collection,
                self.replica_name,
                token,
            ),
            region=region,
            metric_type=self.metric_type,
        )


# ---------------------------------------------------------------------------------------------
# Milvus


@dataclass(frozen=True)
class RowState:
    """What a target holds for one id: its version and checksum (and vector when fetched)."""

    version: Version
    checksum: str
    vector: Vector | None = None


class MilvusTarget:
    """One collection on one Milvus (standalone, distributed or a Milvus Lite server)."""

    def __init__(
        self,
        spec: TargetSpec,
        dim: int,
        timeout_seconds: float = 10.0,
        metric_type: str = "COSINE",
    ) -> None:
        self.spec = spec
        self.dim = dim
        self.timeout_seconds = timeout_seconds
        self.metric_type = metric_type
        self._client: MilvusClient | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """The target's name (checkpoint keys, metric labels)."""
        return self.spec.name

    @property
    def collection(self) -> str:
        """The Milvus collection name."""
        return self.spec.collection

    def client(self) -> MilvusClient:
        """The (lazily connected) pymilvus client; connecting fails fast when Milvus is down."""
        with self._lock:
            if self._client is None:
                self._client = MilvusClient(
                    uri=self.spec.uri, token=self.spec.token, timeout=self.timeout_seconds
                )
            return self._client

    def close(self) -> None:
        """Release the connection."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _call(self, fn: Callable[[MilvusClient], Any]) -> Any:
        client = self.client()
        try:
            return fn(client)
        except MilvusException as exc:
            # A restarted Milvus keeps collections released until someone loads them again.
            if "load" not in str(exc).lower() or "released" not in str(exc).lower():
                raise
            log.info("loading released collection %s on %s", self.collection, self.name)
            client.load_collection(self.collection, timeout=self.timeout_seconds)
            return fn(client)

    def ensure_collection(self) -> None:
        """Create the collection (id, vector, ts_ms, region, checksum) or check an existing one."""
        client = self.client()
        t = self.timeout_seconds
        if client.has_collection(self.collection, timeout=t):
            described = client.describe_collection(self.collection, timeout=t)
            fields = {f["name"]: f for f in described["fields"]}
            missing = [name for name in ROW_FIELDS if name not in fields]
            if missing:
                raise IndexSchemaError(
                    f"collection {self.collection} on {self.name} lacks fields {missing}; "
                    f"the index write path needs {list(ROW_FIELDS)}"
                )
            dim = int(fields["vector"].get("params", {}).get("dim", -1))
            if dim != self.dim:
                raise IndexSchemaError(
                    f"collection {self.collection} on {self.name} has dim {dim}, "
                    f"expected {self.dim}"
                )
            self._call(lambda c: c.load_collection(self.collection, timeout=t))
            return
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=256)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=self.dim)
        schema.add_field("ts_ms", DataType.INT64)
        schema.add_field("region", DataType.VARCHAR, max_length=64)
        schema.add_field("checksum", DataType.VARCHAR, max_length=64)
        index = client.prepare_index_params()
        index.add_index("vector", index_type="AUTOINDEX", metric_type=self.metric_type)
        client.create_collection(
            self.collection,
            schema=schema,
            index_params=index,
            consistency_level="Strong",
            timeout=t,
        )

    def fetch(self, ids: Sequence[str], with_vectors: bool = False) -> dict[str, RowState]:
        """The rows present among `ids` (strongly consistent read by primary key)."""
        fields = ["id", "ts_ms", "region", "checksum"] + (["vector"] if with_vectors else [])
        found: dict[str, RowState] = {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), _FETCH_CHUNK):
            chunk = unique[start : start + _FETCH_CHUNK]
            rows = self._call(partial(self._get, chunk, fields))
            for row in rows:
                vector = np.asarray(row["vector"], dtype=np.float32) if with_vectors else None
                found[str(row["id"])] = RowState(
                    Version(int(row["ts_ms"]), str(row["region"])), str(row["checksum"]), vector
                )
        return found

    def _get(self, ids: list[str], fields: list[str], client: MilvusClient) -> list[Any]:
        return list(
            client.get(
                self.collection,
                ids=ids,
                output_fields=fields,
                timeout=self.timeout_seconds,
                consistency_level="Strong",
                strict_float32=True,  # vectors as float32 arrays: exact, and decoded in bulk
            )
        )

    def upsert(self, entries: Sequence[Entry]) -> None:
        """Upsert the entries' rows (idempotent)."""
        if not entries:
            return
        rows = [
            {
                "id": e.id,
                "vector": e.vector,
                "ts_ms": e.ts_ms,
                "region": e.region,
                "checksum": e.checksum,
            }
            for e in entries
        ]
        self._call(lambda c: c.upsert(self.collection, rows, timeout=self.timeout_seconds))

    def delete(self, ids: Sequence[str]) -> None:
        """Delete rows by id (deleting an absent id is a no-op)."""
        if not ids:
            return
        self._call(lambda c: c.delete(self.collection, ids=list(ids), timeout=self.timeout_seconds))

    def flush(self) -> None:
        """Seal the growing segments."""
        self._call(lambda c: c.flush(self.collection, timeout=self.timeout_seconds))

    def compact(self, wait_seconds: float = 30.0) -> bool:
        """Compact and wait for it; False when the server does not support it or it times out."""
        client = self.client()
        try:
            job = client.compact(self.collection, timeout=self.timeout_seconds)
            deadline = time.monotonic() + wait_seconds
            while time.monotonic() < deadline:
                state = client.get_compaction_state(job, timeout=self.timeout_seconds)
                if state == "Completed":
                    return True
                time.sleep(0.1)
        except MilvusException as exc:
            log.info("compaction of %s on %s not done: %s", self.collection, self.name, exc)
        return False

    def count(self) -> int:
        """Number of rows (strongly consistent)."""
        rows = self._call(
            lambda c: c.query(
                self.collection,
                filter="",
                output_fields=["count(*)"],
                timeout=self.timeout_seconds,
                consistency_level="Strong",
            )
        )
        return int(rows[0]["count(*)"])


# ---------------------------------------------------------------------------------------------
# Conflict resolution (pure)


@dataclass(frozen=True)
class Resolution:
    """The writes a batch needs after resolving every id to its last writer."""

    upserts: tuple[Entry, ...]
    deletes: tuple[Entry, ...]
    conflicts: int
    superseded: int


def build_resolution(
    entries: Sequence[Entry],
    rows: Mapping[str, RowState],
    tombstones: Mapping[str, Version],
) -> Resolution:
    """Resolve a batch against what the target holds: per id, the highest (ts_ms, region) wins
    and equal versions go to the later arrival, so the outcome is the same in any arrival order.

    A conflict is an entry that meets a different write of the same id from another region;
    superseded entries lose to a newer version and change nothing.
    """
    # per id: ((ts_ms, region), op, checksum) of what the target or an earlier entry holds;
    # plain tuples, because this loop runs once per entry on the replay's hot path
    state: dict[str, tuple[tuple[int, str], str, str]] = {}
    for row_id, row in rows.items():
        state[row_id] = ((row.version.ts_ms, row.version.region), "upsert", row.checksum)
    for row_id, version in tombstones.items():
        held = state.get(row_id)
        key = (version.ts_ms, version.region)
        if held is None or key > held[0]:
            state[row_id] = (key, "delete", "")
    winners: dict[str, Entry] = {}
    conflicts = superseded = 0
    for entry in entries:
        key = (entry.ts_ms, entry.region)
        held = state.get(entry.id)
        if held is not None:
            if held[0][1] != entry.region and (held[1] != entry.op or held[2] != entry.checksum):
                conflicts += 1
            if key < held[0]:
                superseded += 1
                continue
        state[entry.id] = (key, entry.op, entry.checksum)
        winners[entry.id] = entry
    upserts = tuple(e for e in winners.values() if e.op == "upsert")
    deletes = tuple(e for e in winners.values() if e.op == "delete")
    return Resolution(upserts, deletes, conflicts, superseded)


# ---------------------------------------------------------------------------------------------
# Applying the log to a target


@dataclass(frozen=True)
class BatchResult:
    """What one batch did; `entries == 0` means nothing was pending (or the lease was busy)."""

    entries: int
    upserts: int
    deletes: int
    conflicts: int
    superseded: int
    checkpoint: str
    busy: bool = False
    start: str = ZERO_ID
    batch: tuple[Entry, ...] = ()


class DeltaApplier:
    """Applies the delta log to one target from its durable checkpoint, one batch at a time."""

    def __init__(
        self,
        deltalog: DeltaLog,
        target: MilvusTarget,
        lease_ttl_seconds: float = 15.0,
        replay: bool = False,
        trust_high_water: bool = True,
    ) -> None:
        self.log = deltalog
        self.target = target
        self.lease_ttl_seconds = lease_ttl_seconds
        self.replay = replay
        # Only appliers write to a replica, so its recorded high-water mark and regions are
        # complete; the primary also takes direct writes, so its catch-up always reads versions.
        self.trust_high_water = trust_high_water
        self.token = new_token()

    def apply_batch(
        self,
        batch_size: int,
        until: str | None = None,
        prefetched: tuple[str, list[Entry]] | None = None,
    ) -> BatchResult:
        """Apply up to `batch_size` entries after the checkpoint (and ≤ `until`), then advance it.

        The checkpoint moves only after Milvus accepted the batch; deletes are recorded as
        tombstones before they are applied, so a crash anywhere is repaired by re-running.
        `prefetched` = (checkpoint they follow, entries) is used only if the checkpoint still is
        that one when the lease is held.
        """
        name = self.target.name
        if not self.log.acquire(name, self.token, self.lease_ttl_seconds):
            return BatchResult(0, 0, 0, 0, 0, self.log.target_state(name).checkpoint, busy=True)
        try:
            state = self.log.target_state(name)
            checkpoint = state.checkpoint
            if prefetched is not None and prefetched[0] == checkpoint:
                entries = prefetched[1][:batch_size]
            else:
                entries = self.log.read_after(checkpoint, batch_size, until)
            if not entries:
                return BatchResult(0, 0, 0, 0, 0, checkpoint, start=checkpoint)
            ids = list(dict.fromkeys(e.id for e in entries))
            regions = {e.region for e in entries}
            newest = max(e.ts_ms for e in entries)
            if self._newer_than_target(entries, regions, state):
                # Nothing the target holds can be newer or from another region: nothing to read.
                resolution = build_resolution(entries, {}, {})
                stale_tombstones = [e.id for e in resolution.upserts] if state.tombstones else []
            else:
                rows = self.target.fetch(ids)
                tombstones = self.log.tombstones(name, ids)
                resolution = build_resolution(entries, rows, tombstones)
                stale_tombstones = [e.id for e in resolution.upserts if e.id in tombstones]
            deletes = {e.id: e.version for e in resolution.deletes}
            self.log.set_tombstones(name, deletes)
            self.target.delete(list(deletes))
            self.target.upsert(resolution.upserts)
            self.log.clear_tombstones(name, stale_tombstones)
            last = entries[-1].stream_id
            self.log.advance(
                name, self.token, last, len(entries), resolution.conflicts, self.replay,
                newest, sorted(regions),
            )  # fmt: skip
            return BatchResult(
                len(entries),
                len(resolution.upserts),
                len(resolution.deletes),
                resolution.conflicts,
                resolution.superseded,
                last,
                start=checkpoint,
                batch=tuple(entries),
            )
        finally:
            self.log.release(name, self.token)

    def _newer_than_target(
        self, entries: Sequence[Entry], regions: set[str], state: TargetState
    ) -> bool:
        if not self.trust_high_water or len(regions) != 1 or not regions >= state.regions:
            return False
        # Equal versions go to the later arrival, and every held row arrived earlier.
        return min(e.ts_ms for e in entries) >= state.high_ts_ms


def _wait_batch(
    applier: DeltaApplier,
    batch_size: int,
    until: str | None,
    wait_seconds: float,
    prefetched: tuple[str, list[Entry]] | None = None,
) -> BatchResult:
    """A batch, waiting (bounded) while another applier holds the lease."""
    deadline = time.monotonic() + wait_seconds
    while True:
        result = applier.apply_batch(batch_size, until, prefetched)
        if not result.busy:
            return result
        if time.monotonic() > deadline:
            raise LeaseBusyError(
                f"target {applier.target.name} of {applier.log.collection} stayed leased by "
                f"another applier for {wait_seconds:g} s"
            )
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# Writer and freeze


@dataclass(frozen=True)
class WriteAck:
    """An acknowledged write: its delta-log id and whether it reached the primary yet."""

    stream_id: str
    id: str
    op: Op
    applied: bool


class IndexWriter:
    """Writes through the delta log: append (the acknowledgement), then apply to the primary
    unless writes are frozen. On a primary failure it freezes writes (default), so the entries
    reach the primary on unfreeze, or raises PrimaryApplyError (`on_primary_error="raise"`)."""

    def __init__(
        self,
        deltalog: DeltaLog,
        primary: MilvusTarget,
        region: str,
        on_primary_error: Literal["freeze", "raise"] = "freeze",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.log = deltalog
        self.primary = primary
        self.region = check_region(region)
        self.on_primary_error = on_primary_error
        self.clock = clock

    def upsert(self, row_id: str, vector: Sequence[float] | npt.NDArray[Any]) -> WriteAck:
        """Upsert one row."""
        return self.write([("upsert", row_id, vector)])[0]

    def delete(self, row_id: str) -> WriteAck:
        """Delete one row."""
        return self.write([("delete", row_id, None)])[0]

    def upsert_many(
        self, rows: Iterable[tuple[str, Sequence[float] | npt.NDArray[Any]]]
    ) -> list[WriteAck]:
        """Upsert many rows with one round trip to Redis and one to the primary."""
        return self.write([("upsert", row_id, vector) for row_id, vector in rows])

    def write(
        self,
        ops: Sequence[tuple[Op, str, Sequence[float] | npt.NDArray[Any] | None]],
        ts_ms: int | None = None,
    ) -> list[WriteAck]:
        """Append the operations in order (one timestamp), then apply the unfrozen ones."""
        checked: list[tuple[Op, str, Vector | None]] = []
        for op, row_id, vector in ops:
            check_id(row_id)
            if op == "upsert":
                if vector is None:
                    raise DeltaLogError(f"upsert of {row_id!r} without a vector")
                checked.append((op, row_id, to_vector(vector, self.log.dim)))
            elif op == "delete":
                checked.append((op, row_id, None))
            else:
                raise DeltaLogError(f"unknown op {op!r} (expected upsert or delete)")
        stamp = ts_ms if ts_ms is not None else int(self.clock() * 1000)
        appended = self.log.append(checked, self.region, stamp)
        acks = [
            WriteAck(sid, row_id, op, False)
            for (op, row_id, _), (sid, _) in zip(checked, appended, strict=True)
        ]
        to_apply = [
            Entry(sid, op, row_id, self.region, stamp, _checksum(vector), vector)
            for (op, row_id, vector), (sid, frozen) in zip(checked, appended, strict=True)
            if not frozen
        ]
        if not to_apply:
            return acks
        last: dict[str, Entry] = {e.id: e for e in to_apply}
        try:
            self.primary.delete([i for i, e in last.items() if e.op == "delete"])
            self.primary.upsert([e for e in last.values() if e.op == "upsert"])
        except (MilvusException, OSError) as exc:
            message = f"primary {self.primary.name} apply failed: {type(exc).__name__}: {exc}"
            if self.on_primary_error == "raise":
                raise PrimaryApplyError(message, acks) from exc
            since = self.log.freeze(
                message, self.primary.name, stream_id_before(to_apply[0].stream_id)
            )
            log.warning("%s; writes frozen since %s (they stay in the delta log)", message, since)
            return acks
        applied = {e.stream_id for e in to_apply}
        return [WriteAck(a.stream_id, a.id, a.op, a.stream_id in applied) for a in acks]

    def freeze(self, reason: str) -> FreezeState:
        """Freeze writes (they keep landing in the delta log)."""
        return freeze_writes(self.log, self.primary.name, reason)

    def unfreeze(self, batch_size: int = 1000) -> int:
        """Catch the primary up on the frozen writes, then let writes flow; entries applied."""
        return unfreeze_writes(self.log, self.primary, batch_size=batch_size)

    def is_frozen(self) -> bool:
        """True while writes are frozen."""
        return self.log.freeze_state() is not None


def freeze_writes(deltalog: DeltaLog, primary_name: str, reason: str) -> FreezeState:
    """Set the write-freeze flag (idempotent: a second freeze keeps the first `since`)."""
    deltalog.freeze(reason, primary_name)
    state = deltalog.freeze_state()
    assert state is not None  # the script just set it
    return state


def unfreeze_writes(
    deltalog: DeltaLog,
    primary: MilvusTarget,
    batch_size: int = 1000,
    max_rounds: int = 100,
    lease_wait_seconds: float = 60.0,
) -> int:
    """Apply the entries written while frozen to the primary, then clear the flag atomically once
    the primary holds the last entry; returns the entries applied. Safe to re-run after a crash."""
    if deltalog.freeze_state() is None:
        return 0
    applier = DeltaApplier(deltalog, primary, trust_high_water=False)
    total = 0
    for _ in range(max_rounds):
        while True:
            result = _wait_batch(applier, batch_size, None, lease_wait_seconds)
            total += result.entries
            if result.entries == 0:
                break
        if deltalog.clear_freeze_if_caught_up(primary.name):
            return total
    raise DeltaLogError(
        f"primary {primary.name} of {deltalog.collection} did not catch up in {max_rounds} rounds"
    )


# ---------------------------------------------------------------------------------------------
# Replicator


class Replicator:
    """Applies the delta log to a replica continuously; pausable through a flag in Redis."""

    def __init__(
        self,
        deltalog: DeltaLog,
        replica: MilvusTarget,
        batch_size: int = 500,
        poll_interval_seconds: float = 0.1,
        lease_ttl_seconds: float = 15.0,
        max_backoff_seconds: float = 5.0,
    ) -> None:
        self.log = deltalog
        self.replica = replica
        self.batch_size = batch_size
        self.poll_interval_seconds = poll_interval_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.applier = DeltaApplier(deltalog, replica, lease_ttl_seconds)

    def step(self) -> BatchResult | None:
        """Apply one batch unless paused (None while paused)."""
        if self.log.is_paused(self.replica.name):
            return None
        return self.applier.apply_batch(self.batch_size)

    def run(self, stop: threading.Event) -> None:
        """Replicate until `stop` is set; failures are logged and retried with backoff."""
        backoff = self.poll_interval_seconds
        while not stop.is_set():
            try:
                result = self.step()
            except (redis.RedisError, MilvusException, OSError, DeltaLogError) as exc:
                log.warning(
                    "replicator %s/%s: %s: %s",
                    self.log.collection,
                    self.replica.name,
                    type(exc).__name__,
                    exc,
                )
                stop.wait(backoff)
                backoff = min(self.max_backoff_seconds, backoff * 2)
                continue
            backoff = self.poll_interval_seconds
            if result is None or result.entries == 0:
                stop.wait(self.poll_interval_seconds)


# ---------------------------------------------------------------------------------------------
# Replay and verification


@dataclass(frozen=True)
class VerifyReport:
    """Verification of every id written in a range of the log against a target."""

    after: str
    until: str
    entries: int
    ids: int
    verified: int
    superseded: int
    missing: int
    unexpected: int
    stale: int
    checksum_mismatches: int
    mismatched_ids: tuple[str, ...]

    @property
    def mismatches(self) -> int:
        """Ids whose target state does not match their last write."""
        return self.missing + self.unexpected + self.stale + self.checksum_mismatches

    @property
    def ok(self) -> bool:
        """True when every id matched."""
        return self.mismatches == 0


# The last write of an id in a range: ((ts_ms, region), op, checksum). A plain tuple, as it is
# built once per replayed entry.
_Expected = tuple[tuple[int, str], str, str]


def _note(expected: dict[str, _Expected], entries: Iterable[Entry]) -> int:
    """Fold entries into the last write per id (ties: the later arrival); returns the count."""
    count = 0
    for entry in entries:
        count += 1
        key = (entry.ts_ms, entry.region)
        held = expected.get(entry.id)
        if held is None or key >= held[0]:
            expected[entry.id] = (key, entry.op, entry.checksum)
    return count


def verify_range(
    deltalog: DeltaLog,
    target: MilvusTarget,
    after: str,
    until: str,
    sample_limit: int = 20,
    workers: int = 2,
) -> VerifyReport:
    """Check every id written in (after, until]: its last write by (ts_ms, region) is on the
    target (upsert: present with that version and a recomputed vector checksum that matches;
    delete: absent). Ids the target holds in a newer version count as superseded, not wrong."""
    expected: dict[str, _Expected] = {}
    entries = _note(expected, deltalog.iter_range(after, until))
    return _verify(deltalog, target, expected, after, until, entries, sample_limit, workers)


def _verify(
    deltalog: DeltaLog,
    target: MilvusTarget,
    expected: Mapping[str, _Expected],
    after: str,
    until: str,
    entries: int,
    sample_limit: int = 20,
    workers: int = 2,
) -> VerifyReport:
    ids = list(expected)
    chunks = [ids[i : i + _FETCH_CHUNK] for i in range(0, len(ids), _FETCH_CHUNK)]
    rows: dict[str, RowState] = {}
    # Reading vectors back is most of a verification; overlap the round trips with decoding.
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for found in pool.map(partial(target.fetch, with_vectors=True), chunks):
            rows.update(found)
    tombstones = deltalog.tombstones(target.name, ids)
    verified = superseded = missing = unexpected = stale = bad_sum = 0
    wrong: list[str] = []
    for row_id, (want_key, want_op, want_checksum) in expected.items():
        row = rows.get(row_id)
        newer = [v for v in (row.version if row else None, tombstones.get(row_id)) if v]
        if any(v.key() > want_key for v in newer):
            superseded += 1
            continue
        if want_op == "delete":
            if row is None:
                verified += 1
                continue
            unexpected += 1
        elif row is None:
            missing += 1
        elif row.version.key() != want_key:
            stale += 1
        elif row.vector is None or vector_checksum(row.vector) != want_checksum:
            bad_sum += 1
        else:
            verified += 1
            continue
        if len(wrong) < sample_limit:
            wrong.append(row_id)
    return VerifyReport(
        after, until, entries, len(ids), verified, superseded, missing, unexpected, stale,
        bad_sum, tuple(wrong),
    )  # fmt: skip


@dataclass(frozen=True)
class ReplayReport:
    """What a replay did: entries applied, conflicts, flush/compaction and the verification."""

    collection: str
    target: str
    after: str
    until: str
    resumed: bool
    entries: int
    upserts: int
    deletes: int
    conflicts: int
    superseded: int
    batches: int
    flushed: bool
    compacted: bool
    verify: VerifyReport
    apply_seconds: float
    duration_seconds: float

    @property
    def ok(self) -> bool:
        """True when verification found every id as its last write left it."""
        return self.verify.ok

    def summary(self) -> dict[str, object]:
        """A JSON-ready summary (for the audit trail and the CLI)."""
        v = self.verify
        return {
            "collection": self.collection,
            "target": self.target,
            "range": [self.after, self.until],
            "resumed": self.resumed,
            "applied": self.entries,
            "upserts": self.upserts,
            "deletes": self.deletes,
            "conflicts": self.conflicts,
            "superseded": self.superseded,
            "batches": self.batches,
            "flushed": self.flushed,
            "compacted": self.compacted,
            "verified": v.verified,
            "verified_superseded": v.superseded,
            "mismatches": v.mismatches,
            "missing": v.missing,
            "unexpected": v.unexpected,
            "stale": v.stale,
            "checksum_mismatches": v.checksum_mismatches,
            "mismatched_ids": list(v.mismatched_ids),
            "apply_seconds": round(self.apply_seconds, 4),
            "duration_seconds": round(self.duration_seconds, 4),
            "ok": self.ok,
        }


def replay_delta_log(
    deltalog: DeltaLog,
    target: MilvusTarget,
    *,
    batch_size: int = 1000,
    until: str | None = None,
    lease_ttl_seconds: float = 15.0,
    lease_wait_seconds: float = 60.0,
    max_rows_per_second: float | None = None,
    compact: bool = True,
    on_batch: Callable[[BatchResult], None] | None = None,
) -> ReplayReport:
    """Apply the delta log to `target` from its checkpoint up to `until` (default: the last entry
    now), batch by batch with the checkpoint advanced after each, then flush, compact and verify
    every id in the replayed range. Re-running after a crash resumes and verifies the whole range
    of the interrupted replay; the range record is dropped once verification passes."""
    started = time.monotonic()
    name = target.name
    checkpoint = deltalog.target_state(name).checkpoint
    end = until or deltalog.last_id()
    record = deltalog.replay_range(name)
    resumed = record is not None
    after = checkpoint
    if record is not None:
        after = record[0]
        if parse_stream_id(record[1]) > parse_stream_id(end):
            end = record[1]
    if parse_stream_id(end) < parse_stream_id(after):
        end = after
    deltalog.set_replay_range(name, after, end)
    applier = DeltaApplier(deltalog, target, lease_ttl_seconds, replay=True)
    entries = upserts = deletes = conflicts = superseded = batches = 0
    expected: dict[str, _Expected] = {}
    covered = after  # (after, covered] is folded into `expected` or listed in `gaps`
    gaps: list[tuple[str, str]] = []
    pending: tuple[str, Future[list[Entry]]] | None = None
    with ThreadPoolExecutor(max_workers=1) as reader:
        while True:
            batch_started = time.monotonic()
            prefetched = (pending[0], pending[1].result()) if pending is not None else None
            pending = None
            if prefetched is not None and prefetched[1]:
                # read the next batch from Redis while this one is written to Milvus
                nxt = prefetched[1][-1].stream_id
                pending = (nxt, reader.submit(deltalog.read_after, nxt, batch_size, end))
            result = _wait_batch(applier, batch_size, end, lease_wait_seconds, prefetched)
            if result.entries == 0:
                break
            if pending is None or pending[0] != result.checkpoint:
                nxt = result.checkpoint
                pending = (nxt, reader.submit(deltalog.read_after, nxt, batch_size, end))
            if result.start != covered:
                gaps.append((covered, result.start))  # applied by an earlier or another applier
            covered = result.checkpoint
            _note(expected, result.batch)
            batches += 1
            entries += result.entries
            upserts += result.upserts
            deletes += result.deletes
            conflicts += result.conflicts
            superseded += result.superseded
            if on_batch is not None:
                on_batch(result)
            if max_rows_per_second:
                pause = result.entries / max_rows_per_second - (time.monotonic() - batch_started)
                if pause > 0:
                    time.sleep(pause)
        if pending is not None:
            pending[1].cancel()
    if parse_stream_id(covered) < parse_stream_id(end):
        gaps.append((covered, end))
    apply_seconds = time.monotonic() - started
    target.flush()
    compacted = target.compact() if compact else False
    # the range's last write per id: this run's batches plus whatever others applied in between
    in_range = entries
    for gap_after, gap_until in gaps:
        in_range += _note(expected, deltalog.iter_range(gap_after, gap_until))
    report = _verify(deltalog, target, expected, after, end, in_range)
    if report.ok:
        deltalog.clear_replay_range(name)
    return ReplayReport(
        deltalog.collection, name, after, end, resumed, entries, upserts, deletes, conflicts,
        superseded, batches, True, compacted, report, apply_seconds, time.monotonic() - started,
    )  # fmt: skip


def _checksum(vector: Vector | None) -> str:
    return vector_checksum(vector) if vector is not None else ""


__all__ = [
    "ZERO_ID",
    "BatchResult",
    "DeltaApplier",
    "DeltaLog",
    "DeltaLogError",
    "IndexConfig",
    "IndexSchemaError",
    "IndexWriter",
    "LeaseBusyError",
    "MilvusTarget",
    "PrimaryApplyError",
    "Replicator",
    "ReplayReport",
    "TargetSpec",
    "VectorIndexError",
    "VerifyReport",
    "WriteAck",
    "build_resolution",
    "freeze_writes",
    "replay_delta_log",
    "unfreeze_writes",
    "verify_range",
]
