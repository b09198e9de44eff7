"""`redline explain`: figures from the rules' own numbers, and the docs print the same table."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.rules.build import build_rule_groups
from redline.rules.explain import build_explanations, render_explanations_markdown
from redline.rules.families.slo import BURN_WINDOWS, burn_factor
from redline.slo.alerts import Alert
from redline.slo.load import load_spec
from redline.slo.spec import parse_duration

ROOT = Path(__file__).resolve().parents[3]


def test_every_alert_rule_is_explained_once_in_rule_file_order() -> None:
    spec = load_spec().spec
    rules = [(r.alert, r.labels["severity"]) for g in build_rule_groups(spec) for r in g.alerts]
    assert [(e.alert, e.severity) for e in build_explanations(spec)] == rules


def test_a_total_outage_pages_when_the_fastest_window_pair_burns_its_budget_share() -> None:
    spec = load_spec().spec
    pipeline = spec.timing.scrape_interval_seconds + spec.timing.evaluation_interval_seconds
    explained = {(e.alert, e.severity): e for e in build_explanations(spec)}
    for slo in spec.slos:
        budget, period = 1 - slo.objective, parse_duration(slo.period)
        for severity in ("page", "ticket"):
            windows = [w for w in BURN_WINDOWS if w.severity == severity]
            fastest = min(burn_factor(w, period) * budget * w.long_seconds for w in windows)
            item = explained[(slo.burn_alert_name, severity)]
            assert item.outage_seconds == pytest.approx(fastest + pipeline)
    availability = explained[("AvailabilityErrorBudgetBurn", "page")]
    assert availability.outage_seconds == pytest.approx(0.0144 * 3600 + pipeline)  # 14.4x, 1h
    assert "1x the budget's rate" in explained[("AvailabilityErrorBudgetBurn", "ticket")].slowest


def test_the_p99_red_line_fires_once_one_percent_of_its_window_is_slow() -> None:
    spec = load_spec().spec
    lat = spec.red_lines.latency_p99
    (item,) = [e for e in build_explanations(spec) if e.alert == Alert.RED_LINE_LATENCY_P99]
    pipeline = spec.timing.scrape_interval_seconds + spec.timing.evaluation_interval_seconds
    expected = (1 - lat.quantile) * parse_duration(lat.window) + pipeline + lat.for_seconds
    assert item.outage_seconds == pytest.approx(expected)
    assert f">= {lat.min_requests} requests" in item.condition


def test_docs_print_the_default_specs_table() -> None:
    doc = (ROOT / "docs" / "spec-and-rules.md").read_text()
    table = doc.split("<!-- explain:start -->\n", 1)[1].split("<!-- explain:end -->", 1)[0]
    assert table == render_explanations_markdown(build_explanations(load_spec().spec)), (
        "docs/spec-and-rules.md's explain table is stale: replace it with "
        "`redline explain --markdown`"
    )
