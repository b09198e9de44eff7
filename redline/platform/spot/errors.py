"""The errors of spot preemption handling."""

from __future__ import annotations


class SpotError(Exception):
    """Bad spot input (unknown provider, unreadable record)."""


class SpotStateError(SpotError):
    """A node state transition that the state machine does not allow."""


class SpotAgentError(SpotError):
    """The drain flow cannot do what it was asked (bad settings, a store or gateway it cannot
    reach)."""


__all__ = ["SpotAgentError", "SpotError", "SpotStateError"]
