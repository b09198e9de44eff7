"""Deprecated path of `redline.platform.index` (the index write path); goes in the next release.

Importing this module is quiet; each name taken from it warns with its new path.
"""

from __future__ import annotations

from redline.core.deprecation import moved_names
from redline.platform import index

_MOVED = frozenset(
    {
        "BatchResult",
        "DeltaApplier",
        "DeltaLog",
        "DeltaLogError",
        "Entry",
        "FreezeState",
        "IndexConfig",
        "IndexSchemaError",
        "IndexTargetsFields",
        "IndexWriter",
        "LeaseBusyError",
        "MilvusTarget",
        "Op",
        "PrimaryApplyError",
        "ROW_FIELDS",
        "ReplayReport",
        "Replicator",
        "Resolution",
        "RowState",
        "TargetSpec",
        "TargetState",
        "Vector",
        "VectorIndexError",
        "VerifyReport",
        "Version",
        "WriteAck",
        "ZERO_ID",
        "build_resolution",
        "check_id",
        "check_region",
        "freeze_writes",
        "new_token",
        "parse_stream_id",
        "replay_delta_log",
        "stream_id_before",
        "to_vector",
        "unfreeze_writes",
        "vector_checksum",
        "verify_range",
    }
)
"""Every public name the module had before it moved."""

__getattr__, __dir__ = moved_names(__name__, index, _MOVED)
