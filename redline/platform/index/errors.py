"""Errors of the vector index write path (delta log, targets, appliers)."""

from __future__ import annotations


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
