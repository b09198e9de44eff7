"""`weights_rotate`: its options (validated, the problems named), the plan decision against the
spec's rotation period (pure) and the refusal of an unconfigured playbook."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import redis

from redline.platform.weights.keyring import DekRecord
from redline.remediation.catalog import open_registry
from redline.remediation.guards import build_startup_problems, load_policies
from redline.remediation.models import Alert
from redline.remediation.playbook import MisconfiguredPlaybook, PlaybookContext, PlaybookError
from redline.remediation.playbooks.weights_rotate import (
    WeightsRotate,
    build_rotate_plan,
    pending_rewrap,
)
from redline.remediation.settings import RemediationSettings
from redline.slo.spec import Weights

STORE = {"bucket": "weights-eu", "endpoint_url": "http://127.0.0.1:1"}
OLD = "pkcs11:token=t;object=old"
NEW = "pkcs11:token=t;object=new"
HOUR = 3600.0
DAY = 86400.0


def _playbook(options: dict[str, Any] | None) -> WeightsRotate | MisconfiguredPlaybook:
    settings = RemediationSettings(playbook_options={} if options is None else {
        "weights_rotate": options})  # fmt: skip
    playbook = open_registry(settings).get("weights_rotate")
    assert isinstance(playbook, WeightsRotate | MisconfiguredPlaybook)
    return playbook


def _ctx(labels: dict[str, str]) -> PlaybookContext:
    body = {"status": "firing", "labels": {"alertname": "DEKRotationOverdue", **labels},
            "annotations": {}, "startsAt": "2024-05-01T12:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z", "fingerprint": "f00d0002"}  # fmt: skip
    the_alert = Alert.model_validate_json(json.dumps(body))
    return PlaybookContext(
        job_id="j", playbook="weights_rotate", alert=the_alert, target="keyring=k", dry_run=False,
        attempt=1, redis=redis.Redis(), firing_job=None, log=logging.getLogger("t"),
        recorder=lambda *_: None, lease_check=lambda: None,
    )  # fmt: skip


def test_unconfigured_it_reports_nothing_and_a_job_fails_naming_the_store() -> None:
    playbook = _playbook(None)
    assert isinstance(playbook, WeightsRotate)
    assert list(playbook.settings_problems()) == []
    # The receiver starts with it enabled (mode act by default), and takes the spec's periods.
    settings = RemediationSettings()
    policies = load_policies(settings.spec, settings.profile, settings.policies)
    assert not [p for p in build_startup_problems(open_registry(settings), policies)
                if "weights_rotate" in p]  # fmt: skip
    assert playbook.policy == Weights()
    with pytest.raises(PlaybookError, match=r"playbook_options\.weights_rotate\.store"):
        playbook.plan(_ctx({"keyring": "k"}))


def test_a_store_without_the_kek_names_each_missing_piece() -> None:
    playbook = _playbook({"store": STORE})
    assert list(playbook.settings_problems()) == [
        "playbook_options.weights_rotate.token_label is not set (the token holding the KEK)",
        "playbook_options.weights_rotate.kek_label is not set (the KEK that wraps the DEKs)",
        "playbook_options.weights_rotate.pin_file is not set (the token's user PIN)",
    ]
    with pytest.raises(PlaybookError, match=r"token_label is not set"):
        playbook.plan(_ctx({"keyring": "k"}))


def test_a_keyring_label_that_is_no_keyring_name_is_refused() -> None:
    playbook = _playbook({"store": STORE, "token_label": "t", "kek_label": "k",
                          "pin_file": "/run/pin"})  # fmt: skip
    assert list(playbook.settings_problems()) == []
    with pytest.raises(PlaybookError, match=r"keyring label '\.\./x' is not a keyring name"):
        playbook.plan(_ctx({"keyring": "../x"}))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kek_label": "k", "new_kek_label": "k"}, "new_kek_label 'k' is kek_label"),
        ({"store": {"bucket": "Bad_Bucket"}}, "store.bucket"),
        ({"keyring": {"name": "k"}}, "keyring: unknown option"),
    ],
)
def test_bad_options_are_named(options: dict[str, Any], message: str) -> None:
    playbook = _playbook(options)
    assert isinstance(playbook, MisconfiguredPlaybook)
    assert any(message in problem for problem in playbook.settings_problems()), (
        playbook.settings_problems()
    )


def _dek(version: int, created: float, kek: str = OLD, retired: float | None = None) -> DekRecord:
    return DekRecord(keyring="k", version=version, kek_id=kek, wrapped="AA==",
                     created_at=created, retired_at=retired)  # fmt: skip


def test_a_dek_younger_than_the_specs_period_plans_a_read_only_check() -> None:
    policy = Weights(dek_rotation_hours=24)
    [step] = build_rotate_plan("k", [_dek(1, 0)], policy, 23 * HOUR, OLD, rewrapping=False)
    assert step.name == "check" and step.read_only
    assert step.params["rotation_seconds"] == 24 * HOUR


def test_an_overdue_or_missing_dek_plans_a_rotation() -> None:
    policy = Weights(dek_rotation_hours=24)
    [step] = build_rotate_plan("k", [_dek(1, 0)], policy, 24 * HOUR, OLD, rewrapping=False)
    assert step.name == "rotate" and not step.read_only
    assert "current DEK 24.0 h old, rotation every 24 h" in step.description
    # The default 72 h keeps the same DEK.
    [kept] = build_rotate_plan("k", [_dek(1, 0)], Weights(), 24 * HOUR, OLD, rewrapping=False)
    assert kept.name == "check"
    [first] = build_rotate_plan("k", [], policy, 0.0, OLD, rewrapping=False)
    assert first.name == "rotate" and "no current DEK" in first.description


def test_a_new_kek_plans_a_rewrap_of_the_deks_that_still_decrypt() -> None:
    policy = Weights(dek_rotation_hours=24, dek_retention_days=2)
    records = [_dek(1, 0, retired=HOUR), _dek(2, HOUR, retired=2 * HOUR), _dek(3, 2 * HOUR)]
    now = HOUR + 2 * DAY + 1  # v1 expired (retired 2 days and a second ago); v2 retired
    assert pending_rewrap(records, policy, now, NEW) == [2, 3]
    steps = build_rotate_plan("k", records, policy, now, NEW, rewrapping=True)
    assert [s.name for s in steps] == ["rotate", "rewrap"]
    assert steps[1].params["versions"] == [2, 3]
    rewrapped = [_dek(2, HOUR, NEW, retired=2 * HOUR), _dek(3, now - HOUR, NEW)]
    [check] = build_rotate_plan("k", rewrapped, policy, now, NEW, rewrapping=True)
    assert check.name == "check"
