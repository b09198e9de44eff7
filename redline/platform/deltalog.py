"""Deprecated path of the delta log, now in `redline.platform.index`; goes in the next release.

Importing this module is quiet; each name taken from it warns with its new path.
"""

from __future__ import annotations

from redline.core.deprecation import moved_names
from redline.platform import index

_MOVED = frozenset(
    {
        "DeltaLog",
        "DeltaLogError",
        "Entry",
        "FreezeState",
        "ID_PATTERN",
        "LeaseLostError",
        "LogInfo",
        "Op",
        "REGION_PATTERN",
        "TargetState",
        "Vector",
        "Version",
        "ZERO_ID",
        "build_fields",
        "check_id",
        "check_region",
        "format_stream_id",
        "new_token",
        "parse_entry",
        "parse_packed",
        "parse_packed_at",
        "parse_stream_id",
        "stream_id_before",
        "to_vector",
        "vector_checksum",
    }
)
"""Every public name the module had before it moved."""

__getattr__, __dir__ = moved_names(__name__, index, _MOVED)
