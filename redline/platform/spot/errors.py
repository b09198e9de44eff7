"""The errors of spot preemption handling."""

from __future__ import annotations


class SpotError(Exception):
    """Bad spot input (unknown provider, unreadable record)."""


class SpotStateError(SpotError):
    """A node state transition that the state machine does not allow."""


class SpotAgentError(SpotError):
    """The drain flow cannot do what it was asked (bad settings, a store or gateway it cannot
    reach)."""


class KubernetesError(SpotAgentError):
    """A Kubernetes API call failed; the message names the object, and for 401/403 what to fix.
    `permanent`: the API server answered and retrying will not change its answer (401, 403,
    404, a bad request), unlike a timeout, a 429 or a 5xx. `status`: the API server's HTTP
    status (None: it did not answer)."""

    def __init__(self, message: str, permanent: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.status = status


class KubernetesConflictError(KubernetesError):
    """409: the object changed between the read and the write (`resourceVersion`)."""


__all__ = [
    "KubernetesConflictError",
    "KubernetesError",
    "SpotAgentError",
    "SpotError",
    "SpotStateError",
]
