"""What a drill is given: the stack, its spec, its probe, where to report, and how to wait."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import redis

from redline.devstack.drills.base import DrillError, DrillResult, Progress, T, poll_until
from redline.devstack.drills.probe import StackProbe
from redline.devstack.layout import Endpoints
from redline.devstack.state import StackState
from redline.platform.prometheus import PrometheusError
from redline.slo.spec import Spec

TRANSIENT_ERRORS = (httpx.HTTPError, redis.RedisError, PrometheusError)
"""Errors a poll reports and retries: a part restarting or briefly overloaded."""


@dataclass
class DeferredRecovery:
    """An alert whose resolution is awaited in the background while other drills run."""

    result: DrillResult
    labels: dict[str, str]
    deadline: float


@dataclass
class DrillContext:
    """What a drill is given: the stack, its probe, a Redis client, and where to report."""

    state: StackState
    spec: Spec
    probe: StackProbe
    progress: Progress
    poll_seconds: float = 0.1
    defer_recovery: bool = False
    deferred: list[DeferredRecovery] = field(default_factory=list)

    @property
    def endpoints(self) -> Endpoints:
        """The stack's URLs."""
        return self.probe.endpoints

    def say(self, drill: str, message: str) -> None:
        """Report progress."""
        self.progress(drill, message)

    def wait_for(
        self,
        drill: str,
        what: str,
        check: Callable[[], T | None],
        timeout: float,
        interval: float | None = None,
    ) -> T:
        """Poll `check` until it returns a value; DrillError after `timeout` seconds."""
        return poll_until(
            check,
            timeout,
            interval or self.poll_seconds,
            what,
            DrillError,
            on_error=lambda exc: self.say(drill, f"{what}: {type(exc).__name__}: {exc}"),
            retry_on=TRANSIENT_ERRORS,
            on_wait=lambda waited: self.say(drill, f"waiting for {what} ({waited:.0f} s)"),
        )


__all__ = ["DeferredRecovery", "DrillContext", "TRANSIENT_ERRORS"]
