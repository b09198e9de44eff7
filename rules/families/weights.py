"""Encrypted model weights on object storage (`redline.exporters.weights`): alerts, and the
promtool cases that prove them.

- `DEKRotationOverdue` (`cause`): a keyring's current DEK older than the rotation period, which
  the exporter publishes from the spec's `weights.dek_rotation_hours` (ticket, playbook
  `weights_rotate`: the DEK still works, a new one is made and wrapped by the KEK); shards
  still encrypted under a DEK past retention, revoked or missing (page: they no longer decrypt,
  so the version cannot load);
- `ShardVerificationFailed` (page, playbook `weights_resync`): the newest verification of a
  version found a missing, truncated or damaged shard (the activation that ran it fell back to
  the last verified version; the version stays flagged until it is re-synced and verified
  again, or deleted);
- `WeightShardSyncRPOBreach` (critical): a region has lacked a version for longer than the
  adapter RPO (`rpo.lora_adapter`): losing the source region now would lose weights older than
  the RPO.

The checkpoint RPO read from object versions needs no rule here: the exporter publishes the
newest version's time as `model_checkpoint_last_success_timestamp_seconds`, which
`LoRACheckpointRPOBreach` (`rules/families/rpo.py`) already judges.
"""

from __future__ import annotations

from redline.rules.common import alert_rule
from redline.rules.model import AlertRule, RuleGroup, number
from redline.rules.promtool_cases import (
    SERIES_INTERVAL,
    AlertIndex,
    Case,
    constant,
    expected,
    series,
)
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec

GROUP = "redline-weights"
KEYRING = (catalog.LABEL_KEYRING,)
VERSION = (catalog.LABEL_MODEL, catalog.LABEL_MODEL_VERSION)
SYNC = (catalog.LABEL_MODEL, catalog.LABEL_REGION)


def _by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def rotation_expr() -> str:
    """A keyring whose current DEK is older than its rotation period."""
    by = _by(KEYRING)
    return (
        f"max by ({by}) ({catalog.WEIGHTS_DEK_AGE_SECONDS})\n"
        f"> on ({by})\n"
        f"max by ({by}) ({catalog.WEIGHTS_DEK_ROTATION_SECONDS})"
    )


def retention_expr() -> str:
    """A keyring with shards under a DEK that no longer decrypts."""
    return f"max by ({_by(KEYRING)}) ({catalog.WEIGHTS_SHARDS_PAST_RETENTION}) > 0"


def verification_expr() -> str:
    """A version whose newest verification found problems."""
    return f"max by ({_by(VERSION)}) ({catalog.WEIGHTS_SHARDS_FAILED_VERIFICATION}) > 0"


def sync_expr(spec: Spec) -> str:
    """A region lacking a version for longer than the adapter RPO."""
    rpo = spec.rpo.lora_adapter.max_seconds
    return f"max by ({_by(SYNC)}) ({catalog.WEIGHTS_SYNC_LAG_SECONDS}) > {number(rpo)}"


def build_alerts(spec: Spec) -> tuple[AlertRule, ...]:
    """The weights alerts (see the module's docstring)."""
    rpo = spec.rpo.lora_adapter
    return (
        alert_rule(
            spec,
            Alert.DEK_ROTATION_OVERDUE,
            rotation_expr(),
            0,
            "ticket",
            "Keyring {{ $labels.keyring }} is overdue for DEK rotation",
            "Its current DEK is {{ $value | humanizeDuration }} old, past the rotation period "
            f"({number(spec.weights.dek_rotation_hours)} h, spec weights.dek_rotation_hours). "
            f"Playbook {Alert.DEK_ROTATION_OVERDUE.playbook} makes a new DEK wrapped by the KEK; "
            "the old one retires and still decrypts its shards for "
            f"{number(spec.weights.dek_retention_days)} days.",
            Alert.DEK_ROTATION_OVERDUE.playbook,
            cause="rotation",
        ),
        alert_rule(
            spec,
            Alert.DEK_ROTATION_OVERDUE,
            retention_expr(),
            0,
            "page",
            "Shards of keyring {{ $labels.keyring }} no longer decrypt",
            "{{ $value }} shard(s) are encrypted under a DEK past its retention, revoked or "
            "missing: a version holding them cannot be loaded. Re-encrypt them under the current "
            "DEK, or delete the versions that use them.",
            cause="retention",
        ),
        alert_rule(
            spec,
            Alert.SHARD_VERIFICATION_FAILED,
            verification_expr(),
            0,
            "page",
            "Weights {{ $labels.model }} {{ $labels.model_version }} failed verification",
            "The newest verification found {{ $value }} problem(s) (a shard missing, truncated "
            "or altered): the version is refused and the last verified one serves. Playbook "
            f"{Alert.SHARD_VERIFICATION_FAILED.playbook} re-syncs its shards from a healthy "
            "region and verifies it again.",
            Alert.SHARD_VERIFICATION_FAILED.playbook,
        ),
        alert_rule(
            spec,
            Alert.WEIGHT_SHARD_SYNC_RPO_BREACH,
            sync_expr(spec),
            rpo.for_seconds,
            "critical",
            "Region {{ $labels.region }} lacks weights of {{ $labels.model }} beyond the RPO",
            "The oldest version it does not hold is {{ $value | humanizeDuration }} old (RPO "
            f"{number(rpo.max_seconds)} s): losing the source region now loses it.",
            rpo="weights_sync",
        ),
    )


def build_rules(spec: Spec) -> list[RuleGroup]:
    """The `redline-weights` group."""
    return [RuleGroup(GROUP, spec.timing.evaluation_interval_seconds, build_alerts(spec))]


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """Each alert over its line fires and at its line stays silent; a DEK rotated in time, a
    verified version and a region holding every version stay silent."""
    day = 86400.0
    rotation = spec.weights.rotation_seconds
    rpo = spec.rpo.lora_adapter
    steps = 20
    at = 600
    # The `for` of the sync alert is inside the case: the lag holds for the whole 10 minutes.
    lagging = {catalog.LABEL_MODEL: "base", catalog.LABEL_REGION: "us"}
    synced = {catalog.LABEL_MODEL: "base", catalog.LABEL_REGION: "ap"}
    at_line = {catalog.LABEL_MODEL: "chat-lora", catalog.LABEL_REGION: "us"}
    overdue, fresh, edge = {"keyring": "a"}, {"keyring": "b"}, {"keyring": "c"}
    failed = {catalog.LABEL_MODEL: "base", catalog.LABEL_MODEL_VERSION: "v2"}
    passed = {catalog.LABEL_MODEL: "base", catalog.LABEL_MODEL_VERSION: "v1"}
    rotation_rule = alerts.get(Alert.DEK_ROTATION_OVERDUE, cause="rotation")
    retention_rule = alerts.get(Alert.DEK_ROTATION_OVERDUE, cause="retention")
    age = catalog.WEIGHTS_DEK_AGE_SECONDS
    period = catalog.WEIGHTS_DEK_ROTATION_SECONDS
    # The overdue DEK's age grows a minute a minute from one minute past the period.
    overdue_age = rotation + SERIES_INTERVAL
    return [
        Case(
            "weights: DEK rotation: past the period tickets; at the period and fresh stay silent",
            {
                series(age, overdue): f"{number(overdue_age - at)}+{SERIES_INTERVAL}x{steps}",
                series(period, overdue): constant(rotation, steps),
                series(age, fresh): constant(day, steps),
                series(period, fresh): constant(rotation, steps),
                series(age, edge): constant(rotation, steps),
                series(period, edge): constant(rotation, steps),
            },
            at,
            [(Alert.DEK_ROTATION_OVERDUE, [expected(rotation_rule, overdue, overdue_age)])],
            earlier=[
                # One minute before, the same DEK was exactly at its period: not yet overdue.
                (at - SERIES_INTERVAL, str(Alert.DEK_ROTATION_OVERDUE), []),
            ],
        ),
        Case(
            "weights: DEK retention: shards under an expired DEK page; none stays silent",
            {
                series(catalog.WEIGHTS_SHARDS_PAST_RETENTION, overdue): constant(3, steps),
                series(catalog.WEIGHTS_SHARDS_PAST_RETENTION, fresh): constant(0, steps),
            },
            at,
            [(Alert.DEK_ROTATION_OVERDUE, [expected(retention_rule, overdue, 3)])],
        ),
        Case(
            "weights: shard verification: a damaged shard pages, a passed version is silent",
            {
                series(catalog.WEIGHTS_SHARDS_FAILED_VERIFICATION, failed): constant(1, steps),
                series(catalog.WEIGHTS_SHARDS_FAILED_VERIFICATION, passed): constant(0, steps),
            },
            at,
            [
                (
                    Alert.SHARD_VERIFICATION_FAILED,
                    [expected(alerts.get(Alert.SHARD_VERIFICATION_FAILED), failed, 1)],
                )
            ],
        ),
        Case(
            "weights: sync RPO: a region lagging past the RPO fires; at the RPO and synced do not",
            {
                series(catalog.WEIGHTS_SYNC_LAG_SECONDS, lagging): constant(
                    rpo.max_seconds + 1, steps
                ),
                series(catalog.WEIGHTS_SYNC_LAG_SECONDS, at_line): constant(rpo.max_seconds, steps),
                series(catalog.WEIGHTS_SYNC_LAG_SECONDS, synced): constant(0, steps),
            },
            at,
            [
                (
                    Alert.WEIGHT_SHARD_SYNC_RPO_BREACH,
                    [
                        expected(
                            alerts.get(Alert.WEIGHT_SHARD_SYNC_RPO_BREACH),
                            lagging,
                            rpo.max_seconds + 1,
                        )
                    ],
                )
            ],
        ),
    ]
