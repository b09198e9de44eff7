"""Pure parts of the guard rails: policies, start-up problems, skips, the stored records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

from redline.core.settings import SettingsError
from redline.remediation.guards import (
    ALL,
    Policies,
    build_policies,
    build_snapshot,
    build_startup_problems,
    check_startup,
    known_playbooks,
    load_policies,
)
from redline.remediation.playbook import (
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookRegistry,
    StepResult,
)
from redline.remediation.worker import build_skip
from redline.slo.spec import (
    KNOWN_PLAYBOOKS_CONTEXT,
    PLAYBOOK_NAMES,
    PlaybookPolicy,
    Remediation,
    Spec,
)


class _Needs(Playbook):
    """A playbook that lacks `field`."""

    target_label = "region"

    def __init__(self, name: str, problems: Sequence[str]) -> None:
        self.name = name  # type: ignore[misc]
        self.problems = problems

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """Nothing."""
        return ()

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Nothing."""
        return StepResult.success()

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """Nothing."""
        return StepResult.success()

    def settings_problems(self) -> Sequence[str]:
        """As given."""
        return self.problems


def test_the_spec_section_validates_and_names_the_field() -> None:
    spec = Spec.model_validate(
        {
            "version": "v1",
            "service": "chat",
            "regions": ["a", "b"],
            "remediation": {
                "playbooks": {
                    "reroute": {"mode": "shadow", "budget": {"runs": 2, "per": "30m"}},
                    "semantic_rollback": {"breaker": {"failures": 1}, "deadline": "1h"},
                }
            },
        }
    )
    reroute = spec.remediation.policy("reroute")
    assert reroute.mode == "shadow" and reroute.budget is not None
    assert reroute.budget.per_seconds == 1800 and reroute.budget.runs == 2
    assert spec.remediation.policy("semantic_rollback").deadline_seconds == 3600
    assert spec.remediation.policy("spot_drain") == PlaybookPolicy()
    assert spec.red_lines.latency_p99.restore.below_ratio == 0.8
    with pytest.raises(ValidationError) as caught:
        Remediation.model_validate({"playbooks": {"reroute": {"mode": "sometimes"}}})
    assert caught.value.errors()[0]["loc"] == ("playbooks", "reroute", "mode")
    # A name is checked against the registry's names where they are known (validate, start-up).
    with pytest.raises(ValidationError) as unknown:
        Remediation.model_validate(
            {"playbooks": {"rerout": {"mode": "off"}}},
            context={KNOWN_PLAYBOOKS_CONTEXT: PLAYBOOK_NAMES},
        )
    assert unknown.value.errors()[0]["loc"][:2] == ("playbooks", "rerout")


def test_settings_policies_replace_the_spec_entry_of_the_same_name() -> None:
    spec = Remediation.model_validate(
        {"playbooks": {"reroute": {"mode": "shadow"}, "spot_drain": {"mode": "off"}}}
    )
    policies = build_policies(
        spec, {"reroute": PlaybookPolicy(), "custom": PlaybookPolicy(mode="off")}
    )
    assert policies.get("reroute").mode == "act"
    assert policies.get("spot_drain").mode == "off"
    assert policies.get("custom").mode == "off"
    assert policies.get("anything").mode == "act"
    assert policies.names() == ("custom", "reroute", "spot_drain")
    assert set(known_playbooks(policies, ["mine"])) == {*PLAYBOOK_NAMES, "custom", "mine"}


def test_load_policies_reads_the_embedded_spec_and_reports_a_broken_one(tmp_path: Path) -> None:
    assert load_policies(None, None, {}).get("reroute") == PlaybookPolicy()
    broken = tmp_path / "spec.yaml"
    broken.write_text(
        "version: v1\nservice: x\nregions: [a]\nremediation: {playbooks: {reroute: {mode: x}}}\n"
    )
    with pytest.raises(SettingsError, match=r"remediation\.playbooks\.reroute\.mode"):
        load_policies(broken, None, {})


def test_startup_names_every_missing_field_of_every_enabled_playbook() -> None:
    registry = PlaybookRegistry(
        [
            _Needs("alpha", ["serving.upstreams is not set", "serving.gateway_url is not set"]),
            _Needs("beta", ["rollback.snapshot_root is not set"]),
            _Needs("gamma", []),
        ]
    )
    policies = Policies(
        {"beta": PlaybookPolicy(mode="off"), "alpha": PlaybookPolicy(mode="shadow")}
    )
    assert build_startup_problems(registry, policies) == [
        "playbook alpha (mode shadow): serving.upstreams is not set "
        "(or set remediation.playbooks.alpha.mode: off)",
        "playbook alpha (mode shadow): serving.gateway_url is not set "
        "(or set remediation.playbooks.alpha.mode: off)",
    ]
    with pytest.raises(SettingsError, match="refusing to start:\nplaybook alpha"):
        check_startup(registry, policies)
    check_startup(registry, Policies({"alpha": PlaybookPolicy(mode="off"),
                                      "beta": PlaybookPolicy(mode="off")}))  # fmt: skip


def test_skips_off_before_paused_and_nothing_for_an_acting_playbook() -> None:
    pause = {"by": "bob", "reason": "db migration", "at": "2024-05-01T12:00:00+00:00"}
    off = build_skip(PlaybookPolicy(mode="off"), pause, "reroute")
    assert off == ("off", "playbook reroute is off (remediation.playbooks.reroute.mode)")
    paused = build_skip(PlaybookPolicy(mode="shadow"), pause, "reroute")
    assert paused is not None and paused[0] == "paused"
    assert "bob" in paused[1] and "db migration" in paused[1]
    assert "redline remediation resume reroute" in paused[1]
    assert build_skip(PlaybookPolicy(), None, "reroute") is None


def test_snapshot_reads_pauses_breakers_and_failure_counts() -> None:
    snapshot = build_snapshot(
        {ALL: json.dumps({"by": "a"}), "reroute": "not json"},
        {"open|reroute": json.dumps({"failures": 3}), "failures|reroute": "3",
         "failures|spot_drain": "x"},
    )  # fmt: skip
    assert snapshot.is_paused("anything") and snapshot.paused["reroute"] == {"raw": "not json"}
    assert snapshot.breakers_open == {"reroute": {"failures": 3}}
    assert snapshot.failures == {"reroute": 3, "spot_drain": 0}
    assert not build_snapshot({"reroute": "{}"}, {}).is_paused("spot_drain")
