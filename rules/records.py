"""Names of the recorded series as this spec spells them: written by the rule families, read by
the other families, the dashboards, the report and the drills.

The catalog (`redline.slo.catalog`) owns the naming scheme (`level:metric:operations`); this
module fills in the spec's histogram, quantile and windows.
"""

from __future__ import annotations

from redline.rules.model import format_duration, number
from redline.slo import catalog
from redline.slo.spec import Spec


def source_name(spec: Spec, signal: str) -> str | None:
    """The series the rules read for `signal` (`ResolvedSources.read_name`)."""
    return spec.sources.resolve().read_name(signal)


def request_duration(spec: Spec) -> str:
    """The latency histogram's base name the rules read (every profile has one)."""
    return spec.sources.resolve().required_name("request_duration")


def requests_total(spec: Spec) -> str:
    """The request counter the rules read."""
    return spec.sources.resolve().required_name("requests")


def errors_total(spec: Spec) -> str:
    """The error counter the rules read."""
    return spec.sources.resolve().required_name("errors")


def record_base(spec: Spec) -> str:
    """The histogram name recorded series are named after (`ResolvedSources.record_base`)."""
    return spec.sources.resolve().record_base()


def p99_record(spec: Spec) -> str:
    """Name of the recorded per-region latency quantile (e.g. `...:p99_5m`)."""
    red = spec.red_lines.latency_p99
    quantile = number(red.quantile * 100).replace(".", "_")
    return catalog.quantile_record(record_base(spec), quantile, red.window)


def rollback_window(spec: Spec) -> str:
    """The rollback gate's window as a Prometheus duration."""
    return format_duration(spec.rollback.window_seconds)


def rollback_records(spec: Spec) -> dict[str, str]:
    """Names of the recorded series the two-signal gate compares."""
    window = rollback_window(spec)
    base = record_base(spec)
    return {
        "p99": catalog.p99_by_version_record(base, window),
        "accuracy": catalog.accuracy_record(window),
        "requests": catalog.requests_by_version_record(base, window),
    }


def spot_p95_record(spec: Spec) -> str:
    """Name of the recorded fleet-wide p95 of notice -> DRAINING."""
    return catalog.spot_notice_to_draining_record(spec.spot.alert_window)
