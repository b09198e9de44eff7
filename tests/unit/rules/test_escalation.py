"""Escalation to humans: the spec's `escalation:` section, the alerts on remediation itself, and
the Alertmanager routes (who receives which alert), checked by walking the generated route tree
with Alertmanager's matching rules."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from redline.rules.alertmanager import RECEIVER, build_alertmanager_config
from redline.rules.build import build_rule_groups
from redline.rules.families import remediation
from redline.rules.model import AlertRule
from redline.rules.promtool_cases import AlertIndex
from redline.slo import catalog
from redline.slo.load import SpecError, apply_profile, load_spec, parse_spec
from redline.slo.spec import Escalation, Receiver, Spec

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_YAML = ROOT / "slo" / "specs" / "default.yaml"

ESCALATION: dict[str, Any] = {
    "receivers": [
        {"name": "pager", "pagerduty": {"routing_key_file": "/run/secrets/pd"}},
        {"name": "chat", "slack": {"api_url_file": "/run/secrets/slack", "channel": "#oncall"}},
        {
            "name": "mail",
            "email": {
                "to": "oncall@example.com",
                "from": "redline@example.com",
                "smarthost": "smtp.example.com:587",
                "auth_username": "redline",
                "auth_password_file": "/run/secrets/smtp",
            },
        },
        {
            "name": "bot",
            "webhook": {"url": "https://bot.example.com/hook", "bearer_token_file": "/run/t"},
        },
    ],
    "routes": {"critical": ["pager", "bot"], "page": ["pager"], "ticket": ["chat", "mail"]},
    "default": ["chat"],
}


def _spec_text(**sections: Any) -> str:
    data = yaml.safe_load(DEFAULT_YAML.read_text())
    data.update(sections)
    return yaml.safe_dump(data)


def _spec(escalation: dict[str, Any] | None = ESCALATION) -> Spec:
    if escalation is None:
        return load_spec().spec
    return parse_spec(_spec_text(escalation=escalation), "spec.yaml").spec


def _problems(escalation: Any) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(_spec_text(escalation=escalation), "spec.yaml")
    return caught.value.problems


# -- Alertmanager's routing, as documented: first matching child wins unless `continue` --------


def _matches(matcher: str, labels: dict[str, str]) -> bool:
    found = re.fullmatch(r'(\w+)(=~|!~|!=|=)"(.*)"', matcher)
    assert found, matcher
    name, op, value = found.groups()
    actual = labels.get(name, "")
    if op in ("=", "!="):
        return (actual == value) == (op == "=")
    return (re.fullmatch(value, actual) is not None) == (op == "=~")


def _receivers(route: dict[str, Any], labels: dict[str, str]) -> list[str]:
    """The receivers an alert with `labels` is sent to by the route tree under `route`."""
    out: list[str] = []
    for child in route.get("routes", []):
        if all(_matches(m, labels) for m in child.get("matchers", [])):
            out.extend(_receivers(child, labels))
            if not child.get("continue", False):
                break
    return out or [route["receiver"]]


def _alerts(spec: Spec) -> list[AlertRule]:
    return [a for g in build_rule_groups(spec) for a in g.alerts]


# -- the spec -----------------------------------------------------------------------------------


def test_the_commented_example_of_the_default_spec_loads_and_pages_humans() -> None:
    text = DEFAULT_YAML.read_text()
    block = text.split("# escalation:\n", 1)[1]
    lines = ["escalation:"]
    for line in block.splitlines():
        if not line.startswith("#   "):
            break
        lines.append(line.removeprefix("#"))
    loaded = parse_spec(text + "\n".join(lines) + "\n", "spec.yaml")
    escalation = loaded.spec.escalation
    assert escalation is not None
    assert [r.kind for r in escalation.receivers] == ["pagerduty", "slack", "email", "webhook"]
    assert escalation.receivers_for("page") == ("oncall-pager", "team-slack")
    assert not [w for w in loaded.warnings if w.field.startswith("escalation")]


def test_without_escalation_validate_warns_that_pages_reach_no_human() -> None:
    (warning,) = [w for w in load_spec().warnings if w.field == "escalation"]
    assert warning.level == "warning"
    assert "critical and page alerts reach no human" in warning.message


def test_severities_that_reach_nobody_are_warned_unless_listed_empty() -> None:
    only_pages = {**ESCALATION, "routes": {"critical": ["pager"], "page": ["pager"]}}
    only_pages.pop("default")
    loaded = parse_spec(_spec_text(escalation=only_pages), "spec.yaml")
    (warning,) = [w for w in loaded.warnings if w.field.startswith("escalation")]
    assert warning.field == "escalation.routes"
    assert warning.message.startswith("ticket, warning alerts reach no human")
    chosen = {**only_pages, "routes": {**only_pages["routes"], "ticket": [], "warning": []}}
    loaded = parse_spec(_spec_text(escalation=chosen), "spec.yaml")
    assert not [w for w in loaded.warnings if w.field.startswith("escalation")]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"routes": {"critical": ["pager"], "page": []}, "default": []},
            "spec.yaml: escalation.routes.page: page alerts must reach a human",
        ),
        (
            {"routes": {"critical": ["nobody"], "page": ["pager"]}},
            "spec.yaml: escalation.routes.critical: no receiver named 'nobody'",
        ),
        ({"default": ["ghost"]}, "spec.yaml: escalation.default: no receiver named 'ghost'"),
        (
            {"receivers": [*ESCALATION["receivers"], {"name": "pager", "slack": {
                "api_url_file": "/f", "channel": "#x"}}]},
            "spec.yaml: escalation.receivers: names repeated: pager",
        ),
        (
            {"receivers": [{"name": "two", "slack": {"api_url_file": "/f", "channel": "#x"},
                            "webhook": {"url": "http://x/"}}]},
            "exactly one of slack, pagerduty, email, webhook (got slack, webhook)",
        ),
        (
            {"receivers": [{"name": "inline", "slack": {"api_url": "https://hooks/x",
                                                        "channel": "#x"}}]},
            "spec.yaml: escalation.receivers[0].slack.api_url: unknown field",
        ),
        (
            {"receivers": [{"name": "pd", "pagerduty": {"routing_key_file": "/a",
                                                        "service_key_file": "/b"}}]},
            "set exactly one of routing_key_file and service_key_file",
        ),
        (
            {"receivers": [{"name": "m", "email": {"to": "a@b.c", "from": "d@e.f",
                            "smarthost": "smtp:25", "auth_username": "u"}}]},
            "auth_username and auth_password_file go together",
        ),
        (
            {"receivers": [{"name": "redline-remediation", "webhook": {"url": "http://x/"}}]},
            "'redline-remediation' is the remediation webhook's name",
        ),
    ],
)  # fmt: skip
def test_bad_escalation_is_rejected_naming_the_field(change: dict[str, Any], problem: str) -> None:
    escalation = {**ESCALATION, **change}
    problems = _problems(escalation)
    assert any(problem in p for p in problems), problems


def test_the_scrape_job_must_be_a_regex_without_quotes() -> None:
    with pytest.raises(ValueError, match="not a regular expression"):
        Receiver(scrape_job="remediation(")
    with pytest.raises(ValueError, match="String should match pattern"):
        Receiver(scrape_job='a"b')


# -- the alerts ---------------------------------------------------------------------------------


def test_escalation_alerts_page_a_human_and_carry_no_playbook() -> None:
    alerts = [a for g in remediation.build_rules(_spec(None)) for a in g.alerts]
    assert [a.alert for a in alerts] == [
        "RemediationFailed",
        "RemediationStuck",
        "RemediationDisabled",
        "RemediationOverBudget",
        "ReceiverDown",
        "ReceiverDown",
    ]
    for alert in alerts:
        assert alert.labels.items() >= {"severity": "page"}.items(), alert.alert
        assert set(alert.labels) <= {"severity", "cause"}, alert.alert
        assert set(alert.annotations) == {"summary", "description", "runbook_url"}
    # Never a `playbook` label on the alert: Alertmanager would route it to that playbook.
    spec = _spec(None)
    cases = remediation.build_tests(spec, AlertIndex(remediation.build_rules(spec)))
    fired = [exp for case in cases for _, exps in case.checks for exp in exps]
    assert fired and not [exp for exp in fired if "playbook" in exp["exp_labels"]]
    assert [e["exp_labels"][remediation.SUBJECT] for e in fired if "instance" not in e["exp_labels"]
            and remediation.SUBJECT in e["exp_labels"]] == ["reroute"] * 4  # fmt: skip
    disabled = next(a for a in alerts if a.alert == "RemediationDisabled")
    assert (
        "redline remediation resume {{ $labels.remediation_playbook }}"
        in disabled.annotations["description"]
    )


def test_the_outcome_window_outlasts_alertmanager_and_reads_the_catalog() -> None:
    spec = _spec(None)
    assert remediation.event_window_seconds(spec) == 300
    slow = spec.model_copy(
        update={"timing": spec.timing.model_copy(update={"group_interval_seconds": 300})}
    )
    # 2 x (15 + 10 + 300) s = 650 s, whole minutes
    assert remediation.event_window_seconds(slow) == 660
    assert remediation.event_window_seconds(apply_profile(spec, "local")) == 300
    expr = remediation.outcome_increase(spec, remediation.FAILED)
    runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL
    assert expr == (
        f'max by (remediation_playbook) (label_replace(increase({runs}{{outcome="failed"}}[5m]), '
        '"remediation_playbook", "$1", "playbook", "(.*)")) > 0'
    )


def test_receiver_down_reads_the_configured_job() -> None:
    spec = _spec(None)
    custom = spec.model_copy(
        update={"receiver": spec.receiver.model_copy(update={"scrape_job": "redline-rx-.+"})}
    )
    assert remediation.receiver_target_down_expr(custom) == 'up{job=~"redline-rx-.+"} == 0'
    assert 'job=~"redline-rx-.+"' in remediation.receiver_unscraped_expr(custom)
    cases = remediation.build_tests(custom, AlertIndex(remediation.build_rules(custom)))
    jobs = {m for case in cases for name in case.series for m in re.findall(r'job="([^"]*)"', name)}
    assert len(jobs) == 2
    assert len([job for job in jobs if re.fullmatch("redline-rx-.+", job)]) == 1


# -- the routes ---------------------------------------------------------------------------------


def test_without_escalation_every_alert_goes_to_the_webhook_only() -> None:
    spec = _spec(None)
    config = build_alertmanager_config(spec, build_rule_groups(spec))
    assert [r["name"] for r in config["receivers"]] == [RECEIVER]
    assert all(route["continue"] is False for route in config["route"]["routes"])
    for alert in _alerts(spec):
        assert _receivers(config["route"], alert.labels | {"alertname": alert.alert}) == [RECEIVER]


def test_with_escalation_playbook_alerts_reach_the_webhook_and_a_human() -> None:
    spec = _spec()
    config = build_alertmanager_config(spec, build_rule_groups(spec))
    escalation = spec.escalation
    assert escalation is not None
    alerts = _alerts(spec)
    assert {a.labels["severity"] for a in alerts} == {"critical", "page", "ticket", "warning"}
    for alert in alerts:
        labels = alert.labels | {"alertname": alert.alert}
        got = _receivers(config["route"], labels)
        humans = list(escalation.receivers_for(alert.labels["severity"]))
        if "playbook" in alert.labels:
            assert got == [RECEIVER, *humans], alert.alert
        else:
            assert got == humans, alert.alert
        if alert.labels["severity"] in ("critical", "page"):
            assert set(got) & {"pager"}, alert.alert


def test_the_severity_routes_and_the_default_are_disjoint() -> None:
    config = build_alertmanager_config(_spec(), [])
    human = config["route"]["routes"]
    assert [(r["receiver"], r["matchers"], r["continue"]) for r in human] == [
        ("pager", ['severity=~"critical|page"'], True),
        ("chat", ['severity="ticket"'], True),
        ("mail", ['severity="ticket"'], True),
        ("bot", ['severity="critical"'], True),
        ("chat", ['severity!~"critical|page|ticket"'], True),
    ]
    route = config["route"]
    assert _receivers(route, {"severity": "warning"}) == ["chat"]
    assert _receivers(route, {"alertname": "NoSeverity"}) == ["chat"]
    assert _receivers(route, {"severity": "critical"}) == ["pager", "bot"]


def test_a_severity_nobody_takes_falls_back_to_the_webhook() -> None:
    escalation = {**ESCALATION, "default": [], "routes": {"critical": ["pager"], "page": ["pager"]}}
    route = build_alertmanager_config(_spec(escalation), [])["route"]
    assert _receivers(route, {"severity": "ticket"}) == [RECEIVER]


def test_human_receivers_read_every_secret_from_a_file() -> None:
    config = build_alertmanager_config(_spec(), [])
    by_name = {r["name"]: r for r in config["receivers"]}
    (pagerduty,) = by_name["pager"]["pagerduty_configs"]
    assert pagerduty["routing_key_file"] == "/run/secrets/pd" and "url" not in pagerduty
    (slack,) = by_name["chat"]["slack_configs"]
    assert (slack["api_url_file"], slack["channel"]) == ("/run/secrets/slack", "#oncall")
    assert "{{ .Annotations.runbook_url }}" in slack["text"]
    (email,) = by_name["mail"]["email_configs"]
    assert email["auth_password_file"] == "/run/secrets/smtp" and email["from"]
    (hook,) = by_name["bot"]["webhook_configs"]
    assert hook["http_config"]["authorization"]["credentials_file"] == "/run/t"
    text = yaml.safe_dump(config)
    for inline in ("api_url:", "routing_key:", "service_key:", "auth_password:", "credentials:"):
        assert inline not in text
    assert all(c["send_resolved"] for r in config["receivers"] for k, v in r.items()
               if k.endswith("_configs") for c in v)  # fmt: skip


def test_escalation_model_looks_receivers_up() -> None:
    escalation = Escalation.model_validate(ESCALATION)
    assert escalation.receiver("mail").kind == "email"
    assert escalation.receivers_for("warning") == ("chat",)
    with pytest.raises(KeyError):
        escalation.receiver("nobody")
