"""Produce a report: pick the period, read Prometheus, build the model (CLI and scheduler)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from redline.platform.prometheus import PrometheusClient
from redline.reporting.fetch import fetch_report_input
from redline.reporting.queries import check_step
from redline.slo.maths import HOUR
from redline.slo.report import Report, ReportError, Window, build_report
from redline.slo.spec import Spec, parse_duration


class PeriodError(ValueError):
    """The requested period is malformed, empty or in the future."""


def parse_time(text: str, option: str) -> int:
    """Epoch seconds of an ISO date or date-time (UTC unless it names a zone)."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise PeriodError(
            f"{option} {text!r} is not a date or time like 2025-03-01 or 2025-03-01T06:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp())


def floor_hour(ts: float) -> int:
    """The start of the UTC hour holding `ts`."""
    return int(ts // HOUR * HOUR)


def choose_window(period: str | None, start: str | None, end: str | None, now: float) -> Window:
    """The report period from `--period` and/or `--from`/`--to` (whole UTC hours, not future)."""
    length: int | None = None
    if period is not None:
        try:
            length = int(parse_duration(period))
        except ValueError as exc:
            raise PeriodError(f"--period: {exc}") from None
        if length <= 0 or length % HOUR:
            raise PeriodError(f"--period {period} must be a whole number of hours, e.g. 7d or 30d")
    if start is not None and end is not None and length is not None:
        raise PeriodError("give --period or both --from and --to, not all three")
    lo = parse_time(start, "--from") if start is not None else None
    hi = parse_time(end, "--to") if end is not None else None
    if lo is None and hi is None:
        hi = floor_hour(now)
    if lo is not None and hi is None:
        if length is None:
            raise PeriodError("--from needs --to or --period")
        hi = lo + length
    if hi is not None and lo is None:
        lo = hi - (length if length is not None else 7 * 86400)
    assert lo is not None and hi is not None
    if hi <= lo:
        raise PeriodError(f"empty period: --to {_iso(hi)} is not after --from {_iso(lo)}")
    if lo % HOUR or hi % HOUR:
        raise PeriodError(
            f"the period must start and end on whole UTC hours ({_iso(lo)} .. {_iso(hi)})"
        )
    if hi > now:
        raise PeriodError(
            f"the period ends in the future ({_iso(hi)}); the latest complete hour ends at "
            f"{_iso(floor_hour(now))}"
        )
    return Window(lo, hi)


def _iso(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%MZ")


@dataclass(frozen=True)
class Generated:
    """A built report and what it cost."""

    report: Report
    queries: int
    seconds: float


def generate_report(
    prometheus: str,
    spec: Spec,
    spec_source: str,
    window: Window,
    step: int | None = None,
    timeout: float = 60.0,
    now: datetime | None = None,
) -> Generated:
    """Read Prometheus and build the report; PrometheusError / ReportError explain failures."""
    began = time.perf_counter()
    if step is not None:
        try:
            check_step(step)
        except ValueError as exc:
            raise ReportError(str(exc)) from None
    with PrometheusClient(prometheus, timeout=timeout) as client:
        data = fetch_report_input(client, spec, window, step)
        queries = client.sent
    report = build_report(
        spec,
        data,
        spec_source=spec_source,
        prometheus=prometheus,
        generated_at=now or datetime.now(UTC),
    )
    return Generated(report, queries, time.perf_counter() - began)
