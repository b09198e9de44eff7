"""Old import paths kept for one release: a module whose public names moved elsewhere."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any


def moved_names(
    old: str, new: ModuleType, names: frozenset[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module-level `__getattr__` and `__dir__` for module `old`, whose `names` live in `new`.

    Importing the old module stays quiet; taking a name from it warns with the new path, so a
    user sees the warning where the name is used.
    """

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old}.{name} moved: import it from {new.__name__} ({old} goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(new, name)

    def dir_() -> list[str]:
        return sorted(names)

    return getattr_, dir_
