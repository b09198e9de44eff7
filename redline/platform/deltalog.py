"""Deprecated path of the delta log, now in `redline.platform.index`; goes in the next release.

Importing this module is quiet; each name taken from it warns with its new path.
"""

from __future__ import annotations

import warnings
from typing import Any

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
