"""What the report is built from: the period and the series read from Prometheus.

Plain numbers, timestamps in epoch seconds; `redline.reporting.fetch` fills them,
`redline.slo.report.build` reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from redline.slo.maths import HOUR, hour_starts
from redline.slo.report.text import utc


class ReportError(Exception):
    """The report cannot be built (e.g. the period holds no data at all)."""


@dataclass(frozen=True)
class Window:
    """A report period [start, end) in epoch seconds, whole UTC hours."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ReportError(
                f"empty period: end {utc(self.end)} is not after start {utc(self.start)}"
            )
        if self.start % HOUR or self.end % HOUR:
            raise ReportError(
                f"the period must start and end on whole UTC hours "
                f"(got {utc(self.start)} .. {utc(self.end)})"
            )

    @property
    def seconds(self) -> int:
        """Length of the period."""
        return self.end - self.start

    @property
    def previous(self) -> Window:
        """The period of the same length just before this one."""
        return Window(self.start - self.seconds, self.start)

    def hours(self) -> list[float]:
        """End timestamps of the period's hours."""
        return hour_starts(self.start, self.end)


@dataclass(frozen=True)
class SloSeries:
    """An SLO's hourly events and bad share, and its 1 h bad share at a finer step."""

    hourly_total: Mapping[float, float]  # hour end -> events in that hour
    hourly_ratio: Mapping[float, float]  # hour end -> share of bad events in that hour
    burn_ratio: Sequence[tuple[float, float]] = ()  # (ts, bad share over the hour before ts)
    # A grouped SLO's groups (`slos[].group_by`), each keyed by its (label, value) pairs in
    # group_by's order; the fields above are then the whole fleet's.
    groups: Mapping[tuple[tuple[str, str], ...], SloSeries] = field(default_factory=dict)


@dataclass(frozen=True)
class SignalSeries:
    """A thresholded signal's hourly peak, and how many evaluation steps were measured / over."""

    step_seconds: float
    hourly_peak: Mapping[float, float]  # hour end -> worst value in that hour
    hourly_over: Mapping[float, float]  # hour end -> steps past the line
    hourly_samples: Mapping[float, float]  # hour end -> steps with a value
    p99: Mapping[float, float] = field(default_factory=dict)  # period end -> p99 over period
    threshold: float | None = None  # a measured threshold (drift) instead of the spec's


@dataclass(frozen=True)
class AlertSamples:
    """Timestamps at which one `ALERTS{alertstate="firing"}` series had a sample."""

    labels: Mapping[str, str]
    timestamps: Sequence[float]


@dataclass(frozen=True)
class RemediationCounts:
    """Playbook runs and their durations over one period (from the receiver's metrics)."""

    runs: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (playbook, outcome)
    duration_sum: Mapping[str, float] = field(default_factory=dict)
    duration_count: Mapping[str, float] = field(default_factory=dict)
    measured: bool = False


@dataclass(frozen=True)
class RunEvent:
    """Runs of one playbook that ended with one outcome in the step up to `at` (the counter's
    increase over that step), read from `redline_remediation_runs_total`."""

    at: float
    playbook: str
    outcome: str
    runs: float


@dataclass(frozen=True)
class GuardState:
    """A playbook's guard rails over the period and at its end (the receiver's gauges)."""

    playbook: str
    modes_seen: frozenset[str] = frozenset()  # every mode (act, shadow, off) the period saw
    mode_at_end: str | None = None
    paused_during: bool = False
    paused_at_end: bool = False
    breaker_open_during: bool = False
    breaker_open_at_end: bool = False


@dataclass(frozen=True)
class JobRun:
    """One remediation job from the receiver's job store."""

    id: str
    playbook: str
    outcome: str
    started: float
    finished: float | None


@dataclass(frozen=True)
class CrossRegionFigures:
    """One model's answers on one backup region against the primary's over the period (the
    consistency probe's gauges); None where the probe did not publish that gauge."""

    model: str
    region: str
    similarity_mean: float | None = None  # time-average of the per-run mean similarity
    similarity_min: float | None = None  # lowest similarity of one answer in the period
    agreement_ratio: float | None = None  # time-average of the output-hash agreement


@dataclass(frozen=True)
class LiveSignals:
    """Live facts the maturity assessment reads besides the SLIs."""

    probes: Mapping[str, frozenset[str]] = field(default_factory=dict)  # probe -> regions
    probes_failing_at_end: frozenset[str] = frozenset()  # "region/probe"
    golden_evaluations: float | None = None  # golden-set evaluations in the period
    spot_unrecoverable: float | None = None  # requests a spot drain failed for good
    cross_region: Sequence[CrossRegionFigures] = ()  # per model and backup region


@dataclass(frozen=True)
class ReportInput:
    """Everything the builder needs; `signals` maps a signal key to its instances."""

    window: Window
    slos: Mapping[str, SloSeries]
    signals: Mapping[str, Sequence[tuple[str, SignalSeries]]]
    alerts: Sequence[AlertSamples] = ()
    remediation: RemediationCounts = field(default_factory=RemediationCounts)
    remediation_previous: RemediationCounts = field(default_factory=RemediationCounts)
    remediation_events: Sequence[RunEvent] = ()
    remediation_guards: Sequence[GuardState] = ()
    jobs: Sequence[JobRun] | None = None
    live: LiveSignals = field(default_factory=LiveSignals)
    evaluation_interval_seconds: float = 15.0
    notes: Sequence[str] = ()
