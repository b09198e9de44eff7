"""bench.slo_detection's pure parts: promtool's failure report parsed into firing times, the two
sides' series carrying the same requests and errors, the test file's expectations."""

from __future__ import annotations

import pytest
import yaml

from bench import slo_detection as sd
from redline.slo import catalog
from redline.slo.load import load_spec

# What promtool 2.42 prints for two evaluations at which alerts fired against `exp_alerts: []`.
REPORT = """Unit Testing:  tests.yml
  FAILED:
    alertname: MyServiceAvailabilitySLO, time: 1h2m15s, 
        exp:[], 
        got:[
            0:
              Labels:{alertname="MyServiceAvailabilitySLO", sloth_severity="ticket", tier="2"}
              Annotations:{summary="High error rate"}
            ]
    alertname: AvailabilityErrorBudgetBurn, time: 45s, 
        exp:[], 
        got:[
            0:
              Labels:{alertname="AvailabilityErrorBudgetBurn", severity="page", slo="availability"}
              Annotations:{}
            1:
              Labels:{alertname="AvailabilityErrorBudgetBurn", severity="ticket", slo="x"}
              Annotations:{}
            ]
    alertname: AvailabilityErrorBudgetBurn, time: 30s, 
        exp:[], 
        got:[
            0:
              Labels:{alertname="AvailabilityErrorBudgetBurn", severity="page", slo="availability"}
              Annotations:{}
            ]
"""  # noqa: W291 - promtool's own trailing blanks


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0s", 0), ("45s", 45), ("1h2m15s", 3735), ("3d", 259200), ("1w2d", 777600), ("500ms", 0.5)],
)
def test_promtool_durations(text: str, seconds: float) -> None:
    assert sd.parse_promtool_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1x", "1h 2m", "h", "1h2"])
def test_a_malformed_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a promtool duration"):
        sd.parse_promtool_duration(text)


def test_the_report_gives_each_side_and_severity_its_first_firing() -> None:
    fired = sd.parse_fired(REPORT)
    assert len(fired) == 4
    alerts = {"MyServiceAvailabilitySLO": "sloth", "AvailabilityErrorBudgetBurn": "redline"}
    assert sd.first_firing(fired, alerts) == {
        ("sloth", "ticket"): 3735,
        ("redline", "page"): 30,
        ("redline", "ticket"): 45,
    }
    assert sd.first_firing(fired, {"Other": "redline"}) == {}


def _totals(values: str) -> float:
    """The last value of a promtool series written as `start+step x count` phases."""
    last = 0.0
    for part in values.split():
        if part.startswith("_x"):
            continue
        start, rest = part.split("+", 1)
        step, count = rest.split("x")
        last = float(start) + float(step) * int(count)
    return last


@pytest.mark.parametrize("scenario", sd.SCENARIOS, ids=lambda s: s.name)
def test_both_sides_see_the_same_requests_and_errors(scenario: sd.Scenario) -> None:
    spec = load_spec().spec
    sloth = {k: _totals(v) for k, v in sd.sloth_series(scenario).items()}
    ours = {k: _totals(v) for k, v in sd.redline_series(spec, scenario).items()}
    sloth_errors = sum(v for k, v in sloth.items() if 'code="500"' in k)
    sloth_requests = sum(sloth.values())
    errors, requests = str(catalog.LLM_REQUEST_ERRORS_TOTAL), str(catalog.LLM_REQUESTS_TOTAL)
    our_errors = sum(v for k, v in ours.items() if k.startswith(errors + "{"))
    our_requests = sum(v for k, v in ours.items() if k.startswith(requests + "{"))
    assert sloth_requests == pytest.approx(our_requests)
    assert sloth_errors == pytest.approx(our_errors)
    expected = scenario.per_minute * scenario.bad_share * scenario.bad_minutes
    assert our_errors == pytest.approx(expected)


def test_the_test_file_expects_silence_at_every_evaluation_from_the_fault() -> None:
    spec = load_spec().spec
    slo = sd.availability_slo(spec)
    scenario = sd.SCENARIOS[0]
    document = yaml.safe_load(sd.build_test_file(spec, slo, scenario, ["a.yml", "b.yml"]))
    tests = document["tests"][0]["alert_rule_test"]
    assert {t["alertname"] for t in tests} == {sd.SLOTH_ALERT, slo.burn_alert_name}
    assert all(t["exp_alerts"] == [] for t in tests)
    times = sorted({int(t["eval_time"].removesuffix("s")) for t in tests})
    assert times[0] == scenario.fault_at
    assert times[-1] == scenario.fault_at + scenario.bad_minutes * 60
    assert len(times) == scenario.bad_steps + 1
