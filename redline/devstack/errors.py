"""What `redline up`, `down`, `status` and `drill` raise when the local stack is not as asked."""

from __future__ import annotations


class StackError(Exception):
    """The stack cannot be started, stopped or read; the message says why and what to do."""


class StackRunningError(StackError):
    """The run directory already holds a running stack."""


class PortInUseError(StackError):
    """A port asked for on the command line is taken."""


class BinaryMissingError(StackError):
    """A service binary (Prometheus, Alertmanager, redis-server, milvus-lite) is not installed."""


class StartInterruptedError(StackError):
    """`redline up` was interrupted (SIGINT, SIGTERM, SIGHUP) while starting."""


__all__ = [
    "BinaryMissingError",
    "PortInUseError",
    "StackError",
    "StackRunningError",
    "StartInterruptedError",
]
