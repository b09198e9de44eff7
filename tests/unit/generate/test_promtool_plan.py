"""The batches of promtool test groups: every group once, each with every rule it reads, the
rules in their original order (so each rule sees the values it sees in the whole file)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from redline.generate.promtool import plan_test_batches
from redline.rules.build import build_rule_groups, build_rule_tests
from redline.rules.render import render_rule_file
from redline.slo.load import apply_profile, load_spec
from redline.slo.sources import PROFILE_NAMES
from redline.slo.spec import Sources, Spec

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _spec(profile: str) -> Spec:
    spec = load_spec().spec
    if profile == "local":
        return apply_profile(spec, "local")
    sources = Sources(profile=profile, model="chat" if profile == "tgi" else None)  # type: ignore[arg-type]
    return spec.model_copy(update={"sources": sources})


def _files(spec: Spec) -> tuple[dict[str, Any], dict[str, Any]]:
    groups = build_rule_groups(spec)
    rules = yaml.safe_load(render_rule_file(groups, "spec.yaml"))
    return rules, build_rule_tests(spec, groups, ["rules.yml"])


def _rules(rule_file: dict[str, Any]) -> list[tuple[str, str]]:
    return [(g["name"], yaml.safe_dump(r)) for g in rule_file["groups"] for r in g["rules"]]


@pytest.mark.parametrize("profile", ["local", *PROFILE_NAMES])
def test_every_group_runs_once_with_every_rule_it_reads(profile: str) -> None:
    rules, tests = _files(_spec(profile))
    batches = plan_test_batches([rules], tests)
    names = [name for batch in batches for name in batch.names]
    assert sorted(names) == sorted(t["name"] for t in tests["tests"])
    produced = {r.get("record") or r.get("alert") for g in rules["groups"] for r in g["rules"]}
    everything = _rules(rules)
    for batch in batches:
        kept = _rules(dict(batch.rules))
        # an ordered subset of the original rules, in their own groups
        positions = [everything.index(rule) for rule in kept]
        assert positions == sorted(positions)
        kept_names = {
            r.get("record") or r.get("alert") for g in batch.rules["groups"] for r in g["rules"]
        }
        for test in batch.tests:
            for case in test.get("alert_rule_test") or ():
                # a case may prove that an alert the spec does not build stays silent
                assert case["alertname"] in kept_names or case["alertname"] not in produced
            for case in test.get("promql_expr_test") or ():
                read = set(NAME.findall(case["expr"])) & produced
                assert read <= kept_names, (test["name"], read - kept_names)
        for group in batch.rules["groups"]:
            for rule in group["rules"]:
                read = set(NAME.findall(rule["expr"])) & produced
                assert read <= kept_names, (rule, read - kept_names)


def test_the_default_file_needs_far_fewer_rule_evaluations_than_one_run() -> None:
    """What batching saves: each group's rules, summed, against every group over every rule."""
    rules, tests = _files(_spec("redline-gateway"))
    batches = plan_test_batches([rules], tests)
    total = len(_rules(rules))
    batched = sum(len(_rules(dict(b.rules))) * len(b.tests) for b in batches)
    assert len(batches) < len(tests["tests"])
    assert batched * 4 < total * len(tests["tests"])


def test_a_reader_of_every_series_gets_every_rule() -> None:
    rules = {
        "groups": [
            {"name": "a", "interval": "1m", "rules": [{"record": "x:y", "expr": "up"}]},
            {"name": "b", "interval": "1m", "rules": [{"alert": "Z", "expr": "vector(1)"}]},
        ]
    }
    tests = {
        "tests": [
            {"name": "names", "promql_expr_test": [{"expr": 'count({__name__=~"x:.*"})'}]},
            {"name": "alert", "alert_rule_test": [{"alertname": "Z"}]},
            {"name": "alerts", "promql_expr_test": [{"expr": "ALERTS"}]},
        ]
    }
    batches = {batch.names: batch for batch in plan_test_batches([rules], tests)}
    assert batches[("names", "alerts")].rules == rules
    assert batches[("alert",)].rules == {"groups": [rules["groups"][1]]}
