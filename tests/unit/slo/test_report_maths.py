"""SLO maths, the pure report builder, period parsing and cron translation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from redline.reporting.run import PeriodError, choose_window
from redline.reporting.schedule import ScheduleError, latest_tick, parse_cron
from redline.slo.load import load_spec
from redline.slo.maths import (
    attainment,
    burn_rate,
    error_budget,
    red_line_status,
    runs,
    slo_status,
    typical_spacing,
)
from redline.slo.report import (
    AlertSamples,
    LiveSignals,
    ReportError,
    SloSeries,
    Window,
    build_incidents,
    build_maturity,
    build_slo_report,
)

H = 3600
T0 = int(datetime(2025, 3, 1, tzinfo=UTC).timestamp())


def test_attainment_and_budget() -> None:
    assert attainment(5, 1000) == pytest.approx(0.995)
    assert attainment(0, 0) is None  # no traffic is unknown, never 100 %
    budget = error_budget(0.99, bad=5, total=1000)
    assert budget is not None
    assert budget.allowed_bad == pytest.approx(10)
    assert budget.consumed == pytest.approx(0.5) and budget.remaining == pytest.approx(0.5)
    assert error_budget(0.99, 0, 0) is None
    assert burn_rate(0.144, 0.99) == pytest.approx(14.4)


def test_statuses() -> None:
    assert slo_status(0.995, 0.99, 0.5) == "pass"
    assert slo_status(0.9975, 0.99, 0.8) == "warn"
    assert slo_status(0.98, 0.99, 2.0) == "fail"
    assert slo_status(None, 0.99, None) == "no_data"
    assert red_line_status(0, 0, False) == "no_data"
    assert red_line_status(100, 0, False) == "pass"
    assert red_line_status(100, 30, False) == "warn"
    assert red_line_status(100, 30, True) == "fail"


def test_runs_split_on_gaps() -> None:
    stamps = [0, 15, 30, 45, 200, 215]
    assert [(r.first, r.last, r.samples) for r in runs(stamps, 30)] == [(0, 45, 4), (200, 215, 2)]
    assert typical_spacing(stamps, 99) == 15
    assert typical_spacing([5], 99) == 99


def test_incidents_from_alert_samples() -> None:
    window = Window(T0, T0 + 24 * H)
    labels = {"alertname": "RedLineIndexStaleness", "severity": "critical", "red_line": "x"}
    series = [
        AlertSamples(labels, [T0 + 600 + 60 * i for i in range(10)]),  # 10 min
        AlertSamples(labels, [T0 + 24 * H - 120, T0 + 24 * H - 60]),  # still firing at the end
        AlertSamples({**labels, "alertname": "Old"}, [T0 - 600, T0 - 540]),  # before the period
    ]
    found = build_incidents(series, window, 15.0)
    assert [(i.alert, i.duration_seconds, i.ongoing) for i in found] == [
        ("RedLineIndexStaleness", 600.0, False),
        ("RedLineIndexStaleness", 120.0, True),
    ]
    assert found[0].labels == {"red_line": "x"} and found[1].end is None


def test_slo_without_traffic_is_not_a_fake_hundred_percent() -> None:
    spec = load_spec(None).spec
    window = Window(T0, T0 + 2 * H)
    hours = {T0 + H: 0.0, T0 + 2 * H: 0.0}
    report = build_slo_report(spec, spec.slos[0], SloSeries(hours, {}), window)
    assert report.attainment is None and report.status == "no_data"
    assert report.message is not None and "undefined" in report.message
    empty = build_slo_report(spec, spec.slos[0], SloSeries({}, {}), window)
    assert empty.status == "no_data" and "no samples" in (empty.message or "")


def test_each_group_of_a_grouped_slo_has_its_own_budget_worst_first() -> None:
    spec = load_spec(None).spec
    slo = spec.slos[0].model_copy(update={"group_by": ("model",)})
    window = Window(T0, T0 + 2 * H)
    hours = (T0 + H, T0 + 2 * H)
    # The fleet's 0.4 % bad share hides an adapter failing 20 % of its 2 % of the traffic.
    groups = {
        (("model", "base"),): SloSeries(dict.fromkeys(hours, 980.0), dict.fromkeys(hours, 0.0)),
        (("model", "adapter"),): SloSeries(dict.fromkeys(hours, 20.0), dict.fromkeys(hours, 0.2)),
        (("model", "idle"),): SloSeries(dict.fromkeys(hours, 0.0), {}),
    }
    fleet = SloSeries(dict.fromkeys(hours, 1000.0), dict.fromkeys(hours, 0.004), groups=groups)
    report = build_slo_report(spec, slo, fleet, window)
    assert report.group_by == ["model"] and report.bad_events == pytest.approx(8.0)
    assert [g.labels["model"] for g in report.groups] == ["adapter", "base", "idle"]
    adapter, base, idle = report.groups
    assert (adapter.events, adapter.bad_events) == (40.0, 8.0)
    assert adapter.budget_consumed == pytest.approx(8.0 / ((1 - slo.objective) * 40.0))
    assert adapter.status == "fail" and base.status == "pass" and base.bad_events == 0.0
    assert idle.budget_consumed is None and idle.status == "no_data"
    ungrouped = build_slo_report(spec, spec.slos[0], SloSeries({}, {}), window)
    assert ungrouped.group_by == [] and ungrouped.groups == []


def test_windows() -> None:
    now = T0 + 10 * 86400 + 1234
    assert choose_window("7d", None, None, now) == Window(T0 + 3 * 86400, T0 + 10 * 86400)
    assert choose_window(None, "2025-03-02", "2025-03-04", now).seconds == 2 * 86400
    for args in (("7d", "2025-03-02", "2025-03-04"), (None, "2025-03-04", "2025-03-02")):
        with pytest.raises(PeriodError):
            choose_window(*args, now)
    with pytest.raises(ReportError, match="whole UTC hours"):
        Window(T0 + 1, T0 + H)


def test_cron_uses_crontab_weekdays_and_seconds() -> None:
    monday = parse_cron("0 6 * * 1")  # crontab: 1 = Monday (APScheduler 3 would read Tuesday)
    now = datetime(2025, 3, 5, 12, 0, tzinfo=UTC)  # a Wednesday
    assert latest_tick(monday, now) == datetime(2025, 3, 3, 6, 0, tzinfo=UTC)
    sunday = parse_cron("30 1 * * 0")
    assert latest_tick(sunday, now) == datetime(2025, 3, 2, 1, 30, tzinfo=UTC)
    every2 = parse_cron("*/2 * * * * *")
    assert latest_tick(every2, datetime(2025, 3, 5, 12, 0, 3, tzinfo=UTC)).second == 2
    for bad in ("* * *", "61 * * * *", "0 6 * * 9"):
        with pytest.raises(ScheduleError):
            parse_cron(bad)


@pytest.mark.parametrize(
    ("unrecoverable", "status"), [(None, "no_data"), (0.0, "met"), (0.4, "met"), (2.0, "not_met")]
)
def test_spot_drain_check_counts_only_unrecoverable_interruptions(
    unrecoverable: float | None, status: str
) -> None:
    """Aborted streams that resumed elsewhere are recoverable; only a request the client could
    not complete fails the check (increase() extrapolates, so 0.4 is still none)."""
    live = LiveSignals(spot_unrecoverable=unrecoverable)
    maturity = build_maturity(load_spec().spec, [], [], None, live)
    (check,) = [c for c in maturity.checks if c.id == "spot_drain"]
    assert check.status == status
