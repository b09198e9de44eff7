"""Errors of the vector index write path (delta log, targets, appliers)."""

from __future__ import annotations

from redline.core.redisconn import ReplicaAckError


class DeltaLogError(Exception):
    """The delta log or its bookkeeping in Redis is unusable (bad entry, lost lease, bad input)."""


class LeaseLostError(DeltaLogError):
    """Another applier took over the target's lease; this applier must stop."""


class VectorIndexError(Exception):
    """Base of the index write path's errors."""


class IndexSchemaError(VectorIndexError):
    """A Milvus collection exists but lacks the fields the write path needs."""


class LeaseBusyError(VectorIndexError):
    """Another applier held the target's lease for longer than we were willing to wait."""


class AppendNotAcknowledgedError(ReplicaAckError):
    """Entries were appended to the delta log, but fewer replicas than `redis.min_replicas_ack`
    acknowledged them in time: the write is not acknowledged (it may be lost if the Redis primary
    fails now). `appended` holds each entry's (stream id, frozen), as `DeltaLog.append` returns
    them; a retry appends the same rows again, which replays to the same result."""

    def __init__(self, message: str, appended: list[tuple[str, bool]]) -> None:
        super().__init__(message)
        self.appended = appended
