"""`weights_resync`: its options (validated, the problems named), the plan decision (pure) and
the refusal of an unconfigured playbook."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import redis

from redline.remediation.catalog import open_registry
from redline.remediation.guards import build_startup_problems, load_policies
from redline.remediation.models import Alert
from redline.remediation.playbook import MisconfiguredPlaybook, PlaybookContext, PlaybookError
from redline.remediation.playbooks.weights import WeightsResync, build_resync_plan
from redline.remediation.settings import RemediationSettings

STORE = {"bucket": "weights-eu", "endpoint_url": "http://127.0.0.1:1"}
SOURCE = {"bucket": "weights-us", "endpoint_url": "http://127.0.0.1:1"}


def _playbook(options: dict[str, Any] | None) -> WeightsResync | MisconfiguredPlaybook:
    settings = RemediationSettings(playbook_options={} if options is None else {
        "weights_resync": options})  # fmt: skip
    playbook = open_registry(settings).get("weights_resync")
    assert isinstance(playbook, WeightsResync | MisconfiguredPlaybook)
    return playbook


def _ctx(labels: dict[str, str]) -> PlaybookContext:
    body = {"status": "firing", "labels": {"alertname": "ShardVerificationFailed", **labels},
            "annotations": {}, "startsAt": "2024-05-01T12:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z", "fingerprint": "f00d0001"}  # fmt: skip
    the_alert = Alert.model_validate_json(json.dumps(body))
    return PlaybookContext(
        job_id="j", playbook="weights_resync", alert=the_alert, target="model=m", dry_run=False,
        attempt=1, redis=redis.Redis(), firing_job=None, log=logging.getLogger("t"),
        recorder=lambda *_: None, lease_check=lambda: None,
    )  # fmt: skip


def test_unconfigured_it_reports_nothing_and_a_job_fails_naming_the_store() -> None:
    playbook = _playbook(None)
    assert isinstance(playbook, WeightsResync)
    assert list(playbook.settings_problems()) == []
    # The receiver starts with it enabled (mode act by default).
    settings = RemediationSettings()
    policies = load_policies(settings.spec, settings.profile, settings.policies)
    assert not [p for p in build_startup_problems(open_registry(settings), policies)
                if "weights_resync" in p]  # fmt: skip
    with pytest.raises(PlaybookError, match=r"playbook_options\.weights_resync\.store"):
        playbook.plan(_ctx({"model": "m", "model_version": "v1"}))


def test_a_store_without_sources_or_key_names_each_missing_piece() -> None:
    playbook = _playbook({"store": STORE})
    assert list(playbook.settings_problems()) == [
        "playbook_options.weights_resync.sources is empty (the healthy regions to copy from)",
        "playbook_options.weights_resync.token_label is not set (the token holding the KEK)",
        "playbook_options.weights_resync.kek_label is not set (the KEK that unwraps the DEKs)",
        "playbook_options.weights_resync.pin_file is not set (the token's user PIN)",
    ]
    with pytest.raises(PlaybookError, match=r"sources is empty"):
        playbook.plan(_ctx({"model": "m", "model_version": "v1"}))


def test_fully_configured_it_reports_nothing_and_needs_the_version_label() -> None:
    playbook = _playbook({"store": STORE, "sources": {"us-east": SOURCE}, "token_label": "t",
                          "kek_label": "k", "pin_file": "/run/pin"})  # fmt: skip
    assert list(playbook.settings_problems()) == []
    with pytest.raises(PlaybookError, match="'model_version' label"):
        playbook.plan(_ctx({"model": "m"}))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"store": {"bucket": "Bad_Bucket"}}, "store.bucket"),
        ({"sources": {"primary": SOURCE}}, "'primary' is this copy's region"),
        ({"store": STORE, "sources": {"us-east": STORE}}, "us-east name the store's own bucket"),
        ({"regions": {}}, "regions: unknown option"),
        ({"region": ""}, "region"),
    ],
)
def test_bad_options_are_named(options: dict[str, Any], message: str) -> None:
    playbook = _playbook(options)
    assert isinstance(playbook, MisconfiguredPlaybook)
    assert any(message in problem for problem in playbook.settings_problems()), (
        playbook.settings_problems()
    )


def test_a_passed_verdict_plans_a_read_only_check_only() -> None:
    [step] = build_resync_plan(True, "m", "v1", "primary", ["us-east"])
    assert step.name == "check" and step.read_only
    assert step.params == {"model": "m", "version": "v1", "region": "primary"}


def test_a_failed_verdict_plans_resync_then_reverify() -> None:
    steps = build_resync_plan(False, "m", "v1", "primary", ["us-east", "ap"], ["shard 2: bad"])
    assert [(s.name, s.read_only) for s in steps] == [("resync", False), ("reverify", False)]
    assert steps[0].params["sources"] == ["us-east", "ap"]
    assert steps[0].params["problems"] == ["shard 2: bad"]
    assert "from the first healthy of us-east, ap" in steps[0].description
