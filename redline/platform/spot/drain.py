"""The drain budget of a notice and the triage of a draining node's in-flight requests.

    budget = notice - detection delay - ingress removal - safety margin

A request continues when remaining tokens x time per output token <= continue_factor x budget,
and is aborted otherwise (its stream then ends with the spot error event, see `resume`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from redline.platform.spot.errors import SpotError
from redline.platform.spot.state import Notice
from redline.slo.spec import Spot


@dataclass(frozen=True)
class DrainBudget:
    """The drain budget and its parts (seconds)."""

    notice_seconds: float
    detection_delay_seconds: float
    ingress_removal_seconds: float
    safety_margin_seconds: float

    @property
    def seconds(self) -> float:
        """notice - detection delay - ingress removal - safety margin (never below 0)."""
        return max(
            0.0,
            self.notice_seconds
            - self.detection_delay_seconds
            - self.ingress_removal_seconds
            - self.safety_margin_seconds,
        )

    def as_dict(self) -> dict[str, float]:
        """JSON form."""
        return {
            "notice_seconds": self.notice_seconds,
            "detection_delay_seconds": self.detection_delay_seconds,
            "ingress_removal_seconds": self.ingress_removal_seconds,
            "safety_margin_seconds": self.safety_margin_seconds,
            "budget_seconds": self.seconds,
        }


def build_drain_budget(spot: Spot, notice: Notice) -> DrainBudget:
    """The budget of `notice`: its own window when it names a termination time (AWS), the spec's
    window of its provider otherwise; the detection delay is the spec's or the measured one,
    whichever is larger."""
    if notice.terminate_at is not None:
        window = max(0.0, notice.terminate_at - notice.noticed_at)
    elif notice.provider in ("aws", "gcp"):
        window = spot.notice_for(notice.provider)
    else:
        raise SpotError(f"a {notice.provider} notice must name its termination time")
    return DrainBudget(
        notice_seconds=window,
        detection_delay_seconds=max(spot.detection_delay_seconds, notice.detection_delay),
        ingress_removal_seconds=spot.ingress_removal_seconds,
        safety_margin_seconds=spot.safety_margin_seconds,
    )


def scale_spot(spot: Spot, factor: float) -> Spot:
    """`spot` with every duration multiplied by `factor` (drills compress 120 s into seconds)."""
    if not 0 < factor <= 1:
        raise SpotError(f"time scale must be in (0, 1], got {factor!r}")
    windows = spot.notice_seconds.model_copy(
        update={
            "aws": spot.notice_seconds.aws * factor,
            "gcp": spot.notice_seconds.gcp * factor,
        }
    )
    return spot.model_copy(
        update={
            "notice_seconds": windows,
            "detection_delay_seconds": spot.detection_delay_seconds * factor,
            "ingress_removal_seconds": spot.ingress_removal_seconds * factor,
            "safety_margin_seconds": spot.safety_margin_seconds * factor,
            "notice_to_draining_p95_seconds": spot.notice_to_draining_p95_seconds * factor,
            "readiness_timeout_seconds": spot.readiness_timeout_seconds * factor,
        }
    )


@dataclass(frozen=True)
class InflightView:
    """What triage knows of one in-flight request."""

    request_id: str
    generated_tokens: int
    max_tokens: int | None
    tpot_seconds: float | None
    streaming: bool = True
    retry_safe: bool = True


@dataclass(frozen=True)
class TriageDecision:
    """Continue or abort one request, with the numbers behind it."""

    request_id: str
    action: Literal["continue", "abort"]
    remaining_tokens: int
    tpot_seconds: float
    estimated_seconds: float
    limit_seconds: float

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "request_id": self.request_id,
            "action": self.action,
            "remaining_tokens": self.remaining_tokens,
            "tpot_seconds": round(self.tpot_seconds, 6),
            "estimated_seconds": round(self.estimated_seconds, 6),
            "limit_seconds": round(self.limit_seconds, 6),
        }


def build_triage(
    requests: Sequence[InflightView],
    budget_seconds: float,
    continue_factor: float,
    default_tpot_seconds: float,
    unknown_remaining_tokens: int,
) -> list[TriageDecision]:
    """Continue a request when remaining tokens x TPOT <= continue_factor x budget, else abort.

    A request without `max_tokens` is assumed to have `unknown_remaining_tokens` left; one whose
    TPOT is not measured yet uses `default_tpot_seconds`."""
    limit = continue_factor * max(0.0, budget_seconds)
    out = []
    for request in requests:
        tpot = request.tpot_seconds if request.tpot_seconds else default_tpot_seconds
        if request.max_tokens is None:
            remaining = unknown_remaining_tokens
        else:
            remaining = max(0, request.max_tokens - request.generated_tokens)
        estimated = remaining * tpot
        action: Literal["continue", "abort"] = "continue" if estimated <= limit else "abort"
        out.append(TriageDecision(request.request_id, action, remaining, tpot, estimated, limit))
    return out


def aborted_ratio(decisions: Sequence[TriageDecision]) -> float:
    """Share of the triaged requests that were aborted (0 when nothing was in flight)."""
    if not decisions:
        return 0.0
    return sum(1 for d in decisions if d.action == "abort") / len(decisions)


__all__ = [
    "DrainBudget",
    "InflightView",
    "TriageDecision",
    "aborted_ratio",
    "build_drain_budget",
    "build_triage",
    "scale_spot",
]
