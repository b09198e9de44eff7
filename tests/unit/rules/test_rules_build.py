"""Rule building: names, labels, annotations and burn-rate maths from the spec."""

from __future__ import annotations

import re

import pytest
import yaml

from redline.rules.alertmanager import build_alertmanager_config, build_prometheus_rule
from redline.rules.build import build_rule_groups
from redline.rules.families.rollback import rollback_gate_expr
from redline.rules.families.slo import BURN_WINDOWS, burn_factor
from redline.rules.model import format_duration, le_matcher, number
from redline.rules.render import HEADER, render_rule_file
from redline.rules.templating import humanize, humanize_duration
from redline.slo import catalog
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import Spec

REQUIRED_ALERTS = {
    "RedLineLatencyP99",
    "RedLineContextKeepalive",
    "RedLineIndexStaleness",
    "SessionRPOBreach",
    "LoRACheckpointRPOBreach",
    "IndexDeltaLogRPOBreach",
    "LatencyErrorBudgetBurn",
    "AvailabilityErrorBudgetBurn",
    "EmbeddingDrift",
    "SemanticRollbackTwoSignal",
    "SLIAbsent",
}


@pytest.fixture()
def spec() -> Spec:
    return load_spec().spec


def test_every_required_alert_exists(spec: Spec) -> None:
    names = {a.alert for g in build_rule_groups(spec) for a in g.alerts}
    assert REQUIRED_ALERTS <= names


def test_every_alert_carries_severity_and_annotations(spec: Spec) -> None:
    for group in build_rule_groups(spec):
        for alert in group.alerts:
            assert alert.labels["severity"] in {"critical", "page", "ticket", "warning"}
            assert set(alert.annotations) == {"summary", "description", "runbook_url"}
            assert alert.annotations["runbook_url"].endswith("/" + alert.alert)


def test_playbooks_route_where_the_spec_says(spec: Spec) -> None:
    playbook = {
        a.alert: a.labels.get("playbook") for g in build_rule_groups(spec) for a in g.alerts
    }
    assert playbook["RedLineLatencyP99"] == "reroute"
    assert playbook["RedLineIndexStaleness"] == "freeze_and_replay"
    assert playbook["SemanticRollbackTwoSignal"] == "semantic_rollback"
    assert playbook["SessionRPOBreach"] is None
    by_cause = {
        (a.alert, a.labels.get("cause")): a.labels.get("playbook")
        for g in build_rule_groups(spec)
        for a in g.alerts
    }
    assert by_cause[("DEKRotationOverdue", "rotation")] == "weights_rotate"
    assert by_cause[("DEKRotationOverdue", "retention")] is None
    assert by_cause[("ShardVerificationFailed", None)] == "weights_resync"


def test_recording_rules_follow_level_metric_operations(spec: Spec) -> None:
    for group in build_rule_groups(spec):
        for rule in group.recordings:
            level, metric, operations = rule.record.split(":")
            assert level == "redline" and metric and operations


def test_burn_factors_are_the_classic_ones_for_30_days() -> None:
    assert [round(burn_factor(w, 30 * 86400), 6) for w in BURN_WINDOWS] == [14.4, 6, 3, 1]


def test_gate_reads_spec_values(spec: Spec) -> None:
    expr = rollback_gate_expr(spec)
    assert f"1.15 * max by (model, model_version) ({catalog.MODEL_BASELINE_P99_SECONDS})" in expr
    assert "> 0.008 + 1e-09" in expr
    assert ">= 2000" in expr
    # The accuracy leg reads the Wilson upper bound, with enough verdicts.
    assert f"- on (model, model_version) {catalog.accuracy_upper_bound_record('5m')}" in expr
    assert f"{catalog.eval_verdicts_record('5m')} >= 100" in expr
    changed = spec.model_copy(
        update={"rollback": spec.rollback.model_copy(update={"min_samples": 50})}
    )
    assert ">= 50" in rollback_gate_expr(changed)


def test_rendering_is_deterministic_and_headed(spec: Spec) -> None:
    first = render_rule_file(build_rule_groups(spec), "x.yaml")
    second = render_rule_file(build_rule_groups(load_spec().spec), "x.yaml")
    assert first == second
    assert first.startswith(HEADER)
    assert yaml.safe_load(first)["groups"]


def test_local_profile_shortens_intervals(spec: Spec) -> None:
    local = apply_profile(spec, "local")
    groups = build_rule_groups(local)
    assert {g.interval_seconds for g in groups} == {1}
    latency = next(a for g in groups for a in g.alerts if a.alert == "RedLineLatencyP99")
    assert latency.for_seconds == 2


def test_alertmanager_routes_each_playbook_to_the_webhook(spec: Spec) -> None:
    config = build_alertmanager_config(spec, build_rule_groups(spec))
    matchers = [r["matchers"][0] for r in config["route"]["routes"]]
    assert matchers == [
        'playbook="freeze_and_replay"',
        'playbook="gpu_node_failure"',
        'playbook="reroute"',
        'playbook="rollback_candidate"',
        'playbook="semantic_rollback"',
        'playbook="spot_drain"',
        'playbook="weights_resync"',
        'playbook="weights_rotate"',
    ]
    (receiver,) = config["receivers"]
    (webhook,) = receiver["webhook_configs"]
    assert webhook["send_resolved"] is True
    assert (
        webhook["http_config"]["authorization"]["credentials_file"] == "/etc/redline/webhook-token"
    )
    inhibit = config["inhibit_rules"][0]
    assert inhibit["source_matchers"][0] == 'severity="page"'
    assert inhibit["target_matchers"] == ['severity="ticket"']
    assert "slo" in inhibit["equal"]


def test_prometheus_rule_manifest(spec: Spec) -> None:
    manifest = build_prometheus_rule(spec, build_rule_groups(spec))
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert len(manifest["spec"]["groups"]) == len(build_rule_groups(spec))


@pytest.mark.parametrize(
    ("seconds", "text"), [(300, "5m"), (90, "90s"), (3600, "1h"), (259200, "3d"), (0.5, "500ms")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_number_and_le_matcher() -> None:
    assert number(14.4 * 0.01) == "0.144"
    assert number(2.0) == "2"
    assert le_matcher(0.8) == 'le="0.8"'
    assert le_matcher(1.0) == 'le=~"1(\\\\.0)?"'
    # A computed bound (TGI's 0.0001 x 1.5^i) by its first eight significant digits, whatever
    # trailing digits the engine prints.
    matcher = le_matcher(0.7481827643)
    assert matcher == 'le=~"0\\\\.74818276[0-9]*"'
    regex = matcher.removeprefix('le=~"').removesuffix('"').replace("\\\\", "\\")
    assert re.fullmatch(regex, "0.7481827642679213")
    assert re.fullmatch(regex, "0.7481827643")
    assert not re.fullmatch(regex, "1.122274146401882")


@pytest.mark.parametrize(
    ("value", "text"), [(0.998, "998m"), (13, "13"), (1234, "1.234k"), (0, "0")]
)
def test_humanize_matches_prometheus(value: float, text: str) -> None:
    assert humanize(value) == text


def test_humanize_duration_matches_prometheus() -> None:
    assert humanize_duration(600) == "10m 0s"
    assert humanize_duration(90061) == "1d 1h 1m 1s"
    assert humanize_duration(0.25) == "250ms"


def test_pure_python_and_libyaml_emitters_write_the_same_text(spec: Spec) -> None:
    from redline.rules import render

    fast = render.render_rule_file(build_rule_groups(spec), "x.yaml")

    class Slow(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:
            return True

    Slow.add_representer(str, render._str)
    body = yaml.dump(
        {"groups": [g.to_dict() for g in build_rule_groups(spec)]},
        Dumper=Slow,
        sort_keys=False,
        width=100,
        allow_unicode=True,
    )
    assert fast == f"{render.HEADER}# Source: x.yaml\n{body}"
