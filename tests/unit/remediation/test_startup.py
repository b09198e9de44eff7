"""`redline remediation` and `redline remediation worker` refuse to start while an enabled playbook
lacks a setting, naming it; `off` playbooks are not checked."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from redline.cli.remediation import remediation_app
from redline.remediation.catalog import open_registry
from redline.remediation.guards import build_startup_problems, load_policies
from redline.remediation.settings import RemediationSettings
from redline.slo.spec import PlaybookPolicy

ENV = {"REDLINE_WEBHOOK_TOKEN": "t0ken"}


def test_worker_refuses_to_start_naming_the_missing_fields() -> None:
    result = CliRunner().invoke(remediation_app, ["worker"], env=ENV)
    assert result.exit_code == 2
    assert "refusing to start:" in result.output
    assert "playbook reroute (mode act): serving.upstreams is not set" in result.output
    assert "playbook reroute (mode act): serving.gateway_url is not set" in result.output
    assert "playbook spot_drain (mode act): serving.gateway_url" in result.output
    assert "or set remediation.playbooks.reroute.mode: off" in result.output


def test_receiver_with_workers_refuses_too_and_names_bad_playbook_options(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "serving": {"gateway_url": "http://127.0.0.1:1",
                            "upstreams": {"a": "http://127.0.0.1:2", "b": "http://127.0.0.1:3"}},
                "playbook_options": {"spot_drain": {"time_scale": 5}},
            }
        )
    )  # fmt: skip
    result = CliRunner().invoke(remediation_app, ["--config", str(config)], env=ENV)
    assert result.exit_code == 2
    assert (
        "playbook spot_drain (mode act): playbook_options.spot_drain: time_scale" in result.output
    )
    assert "reroute" not in result.output


def test_playbooks_turned_off_are_not_checked(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "service": "chat",
                "regions": ["a", "b"],
                "remediation": {
                    "playbooks": {
                        "reroute": {"mode": "off"},
                        "semantic_rollback": {"mode": "off"},
                    }
                },
            }
        )
    )
    settings = RemediationSettings(
        spec=spec,
        policies={
            "spot_drain": PlaybookPolicy(mode="shadow"),
            "gpu_node_failure": PlaybookPolicy(mode="off"),
        },
    )
    policies = load_policies(settings.spec, settings.profile, settings.policies)
    problems = build_startup_problems(open_registry(settings), policies)
    assert problems == [
        "playbook spot_drain (mode shadow): serving.gateway_url (or "
        "playbook_options.spot_drain.gateway_urls) is not set (the gateways that close a "
        "draining node's admission) (or set remediation.playbooks.spot_drain.mode: off)"
    ]
