"""Names of the recorded series as this spec spells them: written by the rule families, read by
the other families, the dashboards, the report and the drills.

The catalog (`redline.slo.catalog`) owns the naming scheme (`level:metric:operations`); this
module fills in the spec's histogram, quantile and windows.
"""

from __future__ import annotations

from typing import Literal

from redline.rules.model import format_duration, number
from redline.slo import catalog
from redline.slo.spec import Spec


def source_name(spec: Spec, signal: str) -> str | None:
    """The source's own series for `signal`, None where it has none (`read_name`)."""
    return spec.sources.resolve().read_name(signal)


def request_duration(spec: Spec) -> str:
    """The source's raw latency histogram (its base name; every profile has one): for reads
    that need no label of the catalog's but `region` (`absent()`, `label_values()`, a sample
    count). Aggregations go through `redline.rules.signals.aggregate`."""
    return spec.sources.resolve().required_name("request_duration")


def slow_bound(spec: Spec, threshold: float) -> float:
    """The bucket bound requests count as fast up to at `threshold` (`slow_bucket`; the
    threshold itself where no bound is at or below it, which `check_spec` rejects)."""
    bound = spec.sources.resolve().slow_bucket(threshold)
    return threshold if bound is None else bound


def record_base(spec: Spec) -> str:
    """The histogram name recorded series are named after (`ResolvedSources.record_base`)."""
    return spec.sources.resolve().record_base()


def red_line_by(spec: Spec) -> tuple[str, ...]:
    """The labels the latency red line is recorded and alerted by: region, then its group_by."""
    return (catalog.LABEL_REGION, *spec.red_lines.latency_p99.group_by)


def p99_record(spec: Spec) -> str:
    """Name of the recorded per-region latency quantile (e.g. `...:p99_5m`)."""
    red = spec.red_lines.latency_p99
    quantile = number(red.quantile * 100).replace(".", "_")
    return catalog.quantile_record(record_base(spec), quantile, red.window)


def window_requests_record(spec: Spec) -> str:
    """Name of the recorded requests per region over the latency red line's window."""
    return catalog.window_requests_record(record_base(spec), spec.red_lines.latency_p99.window)


def window_slow_requests_record(spec: Spec) -> str:
    """Name of the recorded slow requests per region over the latency red line's window."""
    red = spec.red_lines.latency_p99
    return catalog.window_slow_requests_record(record_base(spec), red.window)


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
        "verdicts": catalog.eval_verdicts_record(window),
        "accuracy_upper": catalog.accuracy_upper_bound_record(window),
    }


def tokens_rate_records(spec: Spec) -> dict[str, str]:
    """Tokens/s records by kind (`generated`, `prompt`), only where the source has the signal."""
    window = spec.red_lines.latency_p99.window
    kinds: tuple[Literal["generated", "prompt"], ...] = ("generated", "prompt")
    return {
        kind: catalog.tokens_rate_record(kind, window)
        for kind in kinds
        if source_name(spec, f"{kind}_tokens") is not None
    }


def ttft_p99_record(spec: Spec) -> str | None:
    """The recorded time-to-first-token P99 by served region and model; None without TTFT."""
    if source_name(spec, "time_to_first_token") is None:
        return None
    name = catalog.LLM_TIME_TO_FIRST_TOKEN_SECONDS.name
    return catalog.quantile_record(name, "99", spec.red_lines.latency_p99.window)


def display_records(spec: Spec) -> tuple[str, ...]:
    """Recorded series no alert reads, kept for the dashboards and reports (tokens/s, TTFT)."""
    ttft = ttft_p99_record(spec)
    return (*tokens_rate_records(spec).values(), *((ttft,) if ttft else ()))


def spot_p95_record(spec: Spec) -> str:
    """Name of the recorded fleet-wide p95 of notice -> DRAINING."""
    return catalog.spot_notice_to_draining_record(spec.spot.alert_window)
