"""The write path's entry point: IndexWriter appends every write to the delta log first (the
acknowledgement), then applies it to the primary unless writes are frozen; freezing and the
unfreeze catch-up of the primary.

A write is a whole row of the primary's collection: its key (any name; INT64 or VARCHAR), its
vector and its other fields (scalar and dynamic), checked and normalised against the schema the
primary describes before anything is appended, so a row the collection cannot hold is refused
with the field named instead of stopping the replicator later."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy.typing as npt
from pymilvus import MilvusException

from redline.platform.index.apply import DeltaApplier, wait_for_batch
from redline.platform.index.deltalog import DeltaLog, FreezeState
from redline.platform.index.entries import (
    Entry,
    Op,
    Vector,
    check_region,
    row_checksum,
    stream_id_before,
    to_vector,
)
from redline.platform.index.errors import DeltaLogError, VectorIndexError
from redline.platform.index.milvus import MilvusTarget
from redline.platform.index.schema import encode_payload

log = logging.getLogger(__name__)

RowId: TypeAlias = str | int
VectorLike: TypeAlias = Sequence[float] | npt.NDArray[Any]
WriteOp: TypeAlias = (
    tuple[Op, RowId, VectorLike | None]
    | tuple[Op, RowId, VectorLike | None, Mapping[str, Any] | None]
)
"""(op, id, vector[, other fields]): a delete's vector and fields are None."""


@dataclass(frozen=True)
class WriteAck:
    """An acknowledged write: its delta-log id and whether it reached the primary yet."""

    stream_id: str
    id: str
    op: Op
    applied: bool


class PrimaryApplyError(VectorIndexError):
    """The writes are in the delta log (acknowledged) but could not be applied to the primary."""

    def __init__(self, message: str, acks: list[WriteAck]) -> None:
        super().__init__(message)
        self.acks = acks


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

    def upsert(
        self, row_id: RowId, vector: VectorLike, fields: Mapping[str, Any] | None = None
    ) -> WriteAck:
        """Upsert one row (its other fields, scalar and dynamic, in `fields`)."""
        return self.write([("upsert", row_id, vector, fields)])[0]

    def delete(self, row_id: RowId) -> WriteAck:
        """Delete one row."""
        return self.write([("delete", row_id, None)])[0]

    def upsert_many(self, rows: Iterable[tuple[RowId, VectorLike]]) -> list[WriteAck]:
        """Upsert many rows with one round trip to Redis and one to the primary."""
        return self.write([("upsert", row_id, vector) for row_id, vector in rows])

    def upsert_rows(self, rows: Iterable[Mapping[str, Any]]) -> list[WriteAck]:
        """Upsert rows given as Milvus takes them (`{key: .., vector: .., field: ..}`)."""
        schema = self.primary.schema()
        ops: list[WriteOp] = []
        for row in rows:
            if schema.pk not in row or schema.vector not in row:
                raise DeltaLogError(
                    f"{schema.collection}: a row needs {schema.pk!r} and {schema.vector!r}"
                )
            rest = {k: v for k, v in row.items() if k not in (schema.pk, schema.vector)}
            ops.append(("upsert", row[schema.pk], row[schema.vector], rest))
        return self.write(ops)

    def write(self, ops: Sequence[WriteOp], ts_ms: int | None = None) -> list[WriteAck]:
        """Append the operations in order (one timestamp), then apply the unfrozen ones."""
        schema = self.primary.schema()
        checked: list[tuple[Op, str, Vector | None, bytes]] = []
        for item in ops:
            op = item[0]
            row_id = schema.check_id(item[1])
            vector = item[2]
            fields = item[3] if len(item) == 4 else None
            if op == "upsert":
                if vector is None:
                    raise DeltaLogError(f"upsert of {row_id!r} without a vector")
                payload = encode_payload(schema.normalize(fields, row_id))
                checked.append((op, row_id, to_vector(vector, self.log.dim), payload))
            elif op == "delete":
                checked.append((op, row_id, None, b""))
            else:
                raise DeltaLogError(f"unknown op {op!r} (expected upsert or delete)")
        stamp = ts_ms if ts_ms is not None else int(self.clock() * 1000)
        appended = self.log.append(checked, self.region, stamp)
        acks = [
            WriteAck(sid, row_id, op, False)
            for (op, row_id, _, _), (sid, _) in zip(checked, appended, strict=True)
        ]
        to_apply = [
            Entry(sid, op, row_id, self.region, stamp, _checksum(vector, payload), vector, payload)
            for (op, row_id, vector, payload), (sid, frozen) in zip(checked, appended, strict=True)
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
            result = wait_for_batch(applier, batch_size, None, lease_wait_seconds)
            total += result.entries
            if result.entries == 0:
                break
        if deltalog.clear_freeze_if_caught_up(primary.name):
            return total
    raise DeltaLogError(
        f"primary {primary.name} of {deltalog.collection} did not catch up in {max_rounds} rounds"
    )


def _checksum(vector: Vector | None, payload: bytes) -> str:
    return row_checksum(vector, payload) if vector is not None else ""
