"""The SLO report, pure: series read from Prometheus in, the report's numbers out.

`build_report(spec, ReportInput, ...)` (`build`) turns the hourly series of `inputs` into the
`Report` of `model` that every renderer prints, scoring the spec's `signals` and the
disaster-recovery `maturity` on the way. The names other packages use are re-exported here.
"""

from redline.slo.report.build import build_incidents, build_report, build_slo_report
from redline.slo.report.inputs import (
    AlertSamples,
    CrossRegionFigures,
    GuardState,
    LiveSignals,
    RemediationCounts,
    ReportError,
    ReportInput,
    RunEvent,
    SignalSeries,
    SloSeries,
    Window,
)
from redline.slo.report.maturity import build_maturity
from redline.slo.report.model import Report, SignalReport, SloReport
from redline.slo.report.signals import SignalDef, signal_defs

__all__ = [
    "AlertSamples",
    "CrossRegionFigures",
    "GuardState",
    "LiveSignals",
    "RemediationCounts",
    "Report",
    "ReportError",
    "ReportInput",
    "RunEvent",
    "SignalDef",
    "SignalReport",
    "SignalSeries",
    "SloReport",
    "SloSeries",
    "Window",
    "build_incidents",
    "build_maturity",
    "build_report",
    "build_slo_report",
    "signal_defs",
]
