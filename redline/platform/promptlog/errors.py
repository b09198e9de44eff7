"""The prompt log's error."""

from __future__ import annotations


class PromptLogError(Exception):
    """The prompt log cannot be appended to or read (its anchors are missing or contended)."""


__all__ = ["PromptLogError"]
