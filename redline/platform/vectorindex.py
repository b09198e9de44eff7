"""Deprecated path of `redline.platform.index` (the index write path); goes in the next release.

Importing this module is quiet; each name taken from it warns with its new path.
"""

from __future__ import annotations

import warnings
from typing import Any

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


def __getattr__(name: str) -> Any:
    """The moved object, with a DeprecationWarning naming its new path."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} moved: import it from redline.platform.index "
        f"({__name__} goes in the next release)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(index, name)


def __dir__() -> list[str]:
    """The moved names (for completion)."""
    return sorted(_MOVED)
