"""The vector index's write path: delta log, Milvus targets, writer, replicator, replay, verify.

Modules, bottom up: `errors`, `entries` (the log's entry format, pure), `deltalog` (the Redis
Stream, freeze flag and checkpoints), `settings` (where the copies live), `milvus` (one copy on
Milvus), `apply` (conflict resolution and batches), `writer` (IndexWriter, freeze, unfreeze),
`replicator`, `verify`, `replay`. Import from this package; the modules are its layout.
"""

from __future__ import annotations

from redline.platform.index.apply import BatchResult, DeltaApplier, Resolution, build_resolution
from redline.platform.index.deltalog import (
    DeltaLog,
    FreezeState,
    LogInfo,
    TargetState,
    new_token,
)
from redline.platform.index.entries import (
    ID_PATTERN,
    REGION_PATTERN,
    ZERO_ID,
    Entry,
    Op,
    Vector,
    Version,
    build_fields,
    check_id,
    check_region,
    format_stream_id,
    parse_entry,
    parse_packed,
    parse_packed_at,
    parse_stream_id,
    stream_id_before,
    to_vector,
    vector_checksum,
)
from redline.platform.index.errors import (
    DeltaLogError,
    IndexSchemaError,
    LeaseBusyError,
    LeaseLostError,
    VectorIndexError,
)
from redline.platform.index.milvus import ROW_FIELDS, MilvusTarget, RowState, connect_milvus
from redline.platform.index.replay import ReplayReport, replay_delta_log
from redline.platform.index.replicator import Replicator
from redline.platform.index.settings import (
    IndexConfig,
    IndexSettings,
    IndexTargetsFields,
    TargetSpec,
)
from redline.platform.index.verify import VerifyReport, verify_range
from redline.platform.index.writer import (
    IndexWriter,
    PrimaryApplyError,
    WriteAck,
    freeze_writes,
    unfreeze_writes,
)

__all__ = [
    "BatchResult",
    "DeltaApplier",
    "DeltaLog",
    "DeltaLogError",
    "Entry",
    "FreezeState",
    "ID_PATTERN",
    "IndexConfig",
    "IndexSchemaError",
    "IndexSettings",
    "IndexTargetsFields",
    "IndexWriter",
    "LeaseBusyError",
    "LeaseLostError",
    "LogInfo",
    "MilvusTarget",
    "Op",
    "PrimaryApplyError",
    "REGION_PATTERN",
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
    "build_fields",
    "build_resolution",
    "check_id",
    "check_region",
    "connect_milvus",
    "format_stream_id",
    "freeze_writes",
    "new_token",
    "parse_entry",
    "parse_packed",
    "parse_packed_at",
    "parse_stream_id",
    "replay_delta_log",
    "stream_id_before",
    "to_vector",
    "unfreeze_writes",
    "vector_checksum",
    "verify_range",
]
