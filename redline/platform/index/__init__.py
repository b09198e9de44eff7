"""The vector index's write path: delta log, Milvus targets, writer, replicator, replay, verify.

Modules, bottom up: `errors`, `entries` (the log's entry format, pure), `schema` (a collection's
rows as Milvus describes them, pure), `deltalog` (the Redis Stream, freeze flag, checkpoints and
the target registry), `settings` (where the copies live), `milvus` (one copy on Milvus, and the
connection), `apply` (conflict resolution and batches), `writer` (IndexWriter, freeze,
unfreeze), `retention` (trimming the log and pruning tombstones), `replicator`, `verify`,
`replay`. Import from this package; the modules are its layout.
"""

from __future__ import annotations

from redline.platform.index.apply import BatchResult, DeltaApplier, Resolution, build_resolution
from redline.platform.index.deltalog import (
    DeltaLog,
    FreezeState,
    LogInfo,
    TargetState,
    TrimNeeds,
    new_token,
    parse_tombstone,
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
    row_checksum,
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
from redline.platform.index.milvus import (
    ROW_FIELDS,
    MilvusTarget,
    RowState,
    connect_milvus,
    is_local_uri,
    keepalive_options,
)
from redline.platform.index.replay import ReplayReport, replay_delta_log
from redline.platform.index.replicator import Replicator
from redline.platform.index.retention import TrimReport, build_trim_point, trim_delta_log
from redline.platform.index.schema import (
    VERSION_COLUMNS,
    VERSION_KEYS,
    Bookkeeping,
    FieldSpec,
    RowSchema,
    build_row_schema,
    decode_payload,
    encode_payload,
    legacy_schema,
)
from redline.platform.index.settings import (
    IndexConfig,
    IndexSettings,
    IndexTargetsFields,
    Replication,
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
    "Bookkeeping",
    "DeltaApplier",
    "DeltaLog",
    "DeltaLogError",
    "Entry",
    "FieldSpec",
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
    "Replication",
    "Replicator",
    "Resolution",
    "RowSchema",
    "RowState",
    "TargetSpec",
    "TargetState",
    "TrimNeeds",
    "TrimReport",
    "VERSION_COLUMNS",
    "VERSION_KEYS",
    "Vector",
    "VectorIndexError",
    "VerifyReport",
    "Version",
    "WriteAck",
    "ZERO_ID",
    "build_fields",
    "build_resolution",
    "build_row_schema",
    "build_trim_point",
    "check_id",
    "check_region",
    "connect_milvus",
    "decode_payload",
    "encode_payload",
    "format_stream_id",
    "freeze_writes",
    "is_local_uri",
    "keepalive_options",
    "legacy_schema",
    "new_token",
    "parse_entry",
    "parse_packed",
    "parse_packed_at",
    "parse_stream_id",
    "parse_tombstone",
    "replay_delta_log",
    "row_checksum",
    "stream_id_before",
    "to_vector",
    "trim_delta_log",
    "unfreeze_writes",
    "vector_checksum",
    "verify_range",
]
