"""Recovery-point objectives of LoRA adapters, session state (CDC and CRDT sync between
regions), and the index delta log: alerts, and the promtool cases that prove them."""

from __future__ import annotations

from redline.rules.common import alert_rule
from redline.rules.model import RuleGroup, number
from redline.rules.promtool_cases import (
    SERIES_INTERVAL,
    AlertIndex,
    Case,
    constant,
    counter,
    expected,
    series,
)
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec

ID_CONFLICTS_PER_MINUTE = 1.0
"""Conflicts a minute (10-minute rate) above which two writing regions page someone: generated
ids never conflict, so a steady stream means callers reuse ids across regions."""
ID_CONFLICTS_FOR_SECONDS = 600.0


def build_rules(spec: Spec) -> list[RuleGroup]:
    """Alerts on the recovery-point objectives of adapters, sessions and the index delta log."""
    rpo = spec.rpo
    checkpoint = catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS
    rules = (
        alert_rule(
            spec,
            Alert.LORA_CHECKPOINT_RPO_BREACH,
            f"time() - max by (adapter) ({checkpoint}) > {number(rpo.lora_adapter.max_seconds)}",
            rpo.lora_adapter.for_seconds,
            "critical",
            "LoRA adapter {{ $labels.adapter }} has no checkpoint within its RPO",
            f"The last successful checkpoint is {{{{ $value | humanizeDuration }}}} old "
            f"(RPO {number(rpo.lora_adapter.max_seconds)} s).",
            rpo.lora_adapter.playbook,
            rpo="lora_adapter",
        ),
        alert_rule(
            spec,
            Alert.SESSION_RPO_BREACH,
            f"max by (stream, group) ({catalog.SESSION_CDC_RPO_SECONDS}) "
            f"> {number(rpo.session_state.max_seconds)}",
            rpo.session_state.for_seconds,
            "critical",
            "Session CDC stream {{ $labels.stream }} lags its replica beyond the RPO",
            f"The oldest entry not ACKed by group {{{{ $labels.group }}}} is "
            f"{{{{ $value | humanize }}}}s old (RPO {number(rpo.session_state.max_seconds)} s).",
            rpo.session_state.playbook,
            rpo="session_state",
        ),
        alert_rule(
            spec,
            Alert.INDEX_DELTA_LOG_RPO_BREACH,
            f"max by (collection) ({catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS}) "
            f"> {number(rpo.embedding_index.max_seconds)}",
            rpo.embedding_index.for_seconds,
            "critical",
            "Index delta log has entries older than the RPO not yet on the replica",
            f"The oldest pending delta-log entry is {{{{ $value | humanize }}}}s old "
            f"(RPO {number(rpo.embedding_index.max_seconds)} s).",
            rpo.embedding_index.playbook,
            rpo="embedding_index",
        ),
        alert_rule(
            spec,
            Alert.INDEX_ID_CONFLICT_RATE,
            f"sum by (collection) (rate({catalog.VECTORDB_ID_CONFLICTS_TOTAL}[10m])) * 60 "
            f"> {number(ID_CONFLICTS_PER_MINUTE)}",
            ID_CONFLICTS_FOR_SECONDS,
            "warning",
            "Two regions keep writing the same vector ids of {{ $labels.collection }} with "
            "different content",
            f"{{{{ $value | humanize }}}} id conflicts a minute (over "
            f"{number(ID_CONFLICTS_PER_MINUTE)}): each is re-mapped and recorded in the "
            "conflict map; find the writers that supply their own ids.",
        ),
        alert_rule(
            spec,
            Alert.SESSION_CRDT_RPO_BREACH,
            f"max by (source_region, target_region) ({catalog.SESSION_CRDT_SYNC_LAG_SECONDS}) "
            f"> {number(rpo.session_crdt.max_seconds)}",
            rpo.session_crdt.for_seconds,
            "critical",
            "CRDT session deltas of {{ $labels.source_region }} are not merged into "
            "{{ $labels.target_region }} within the RPO",
            f"The oldest unsynced session delta is {{{{ $value | humanize }}}}s old "
            f"(RPO {number(rpo.session_crdt.max_seconds)} s): the sync between the regions is "
            f"cut or behind.",
            rpo.session_crdt.playbook,
            rpo="session_crdt",
        ),
        alert_rule(
            spec,
            Alert.SESSION_CRDT_DIVERGENCE,
            f"max({catalog.SESSION_CRDT_DIVERGENT_SESSIONS}) > 0",
            rpo.session_crdt.for_seconds,
            "warning",
            "CRDT sessions differ between regions after the sync delay",
            "{{ $value | humanize }} recently changed sessions hold different states in the "
            "regions: the sync between them is cut, behind or failing.",
            rpo.session_crdt.playbook,
            rpo="session_crdt",
        ),
    )
    return [RuleGroup("redline-rpo", spec.timing.evaluation_interval_seconds, rules)]


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """LoRA checkpoint age, session CDC lag and delta-log age, each over and at its RPO."""
    rpo = spec.rpo
    session = {"stream": "sessions:cdc", "group": "replica"}
    lagging = {**session, "stream": "sessions:cdc:eu"}
    cut = {"source_region": "eu", "target_region": "us"}
    healthy = {"source_region": "us", "target_region": "eu"}
    lora_age = 600.0  # the checkpoint stamped at t=0, evaluated at 10m
    checkpoint = catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS
    delta_age = catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS
    conflicts = catalog.VECTORDB_ID_CONFLICTS_TOTAL
    remapped = {"resolution": "remapped"}
    return [
        Case(
            "id conflicts: 3 a minute for 20 minutes fire, 0.5 a minute stays silent",
            {
                series(conflicts, {**remapped, "collection": "a"}): counter(3, 30),
                series(conflicts, {**remapped, "collection": "b"}): counter(0.5, 30),
            },
            1500,
            [
                (
                    Alert.INDEX_ID_CONFLICT_RATE,
                    [expected(alerts.get(Alert.INDEX_ID_CONFLICT_RATE), {"collection": "a"}, 3.0)],
                )
            ],
        ),
        Case(
            "LoRA checkpoint RPO: an old checkpoint fires, a fresh one does not",
            {
                series(checkpoint, {"adapter": "old"}): (constant(0, 20)),
                series(checkpoint, {"adapter": "fresh"}): (f"0+{SERIES_INTERVAL}x20"),
            },
            600,
            [
                (
                    Alert.LORA_CHECKPOINT_RPO_BREACH,
                    [
                        expected(
                            alerts.get(Alert.LORA_CHECKPOINT_RPO_BREACH),
                            {"adapter": "old"},
                            lora_age,
                        )
                    ],
                )
            ],
        ),
        Case(
            "session RPO: CDC lag over the RPO fires, at the RPO stays silent",
            {
                series(catalog.SESSION_CDC_RPO_SECONDS, lagging): constant(
                    rpo.session_state.max_seconds + 1, 20
                ),
                series(catalog.SESSION_CDC_RPO_SECONDS, session): constant(
                    rpo.session_state.max_seconds, 20
                ),
            },
            600,
            [
                (
                    Alert.SESSION_RPO_BREACH,
                    [
                        expected(
                            alerts.get(Alert.SESSION_RPO_BREACH),
                            lagging,
                            rpo.session_state.max_seconds + 1,
                        )
                    ],
                )
            ],
        ),
        Case(
            "CRDT session RPO: a direction over the RPO fires, one at the RPO stays silent",
            {
                series(catalog.SESSION_CRDT_SYNC_LAG_SECONDS, cut): constant(
                    rpo.session_crdt.max_seconds + 2, 20
                ),
                series(catalog.SESSION_CRDT_SYNC_LAG_SECONDS, healthy): constant(
                    rpo.session_crdt.max_seconds, 20
                ),
                series(catalog.SESSION_CRDT_DIVERGENT_SESSIONS): constant(3, 20),
            },
            600,
            [
                (
                    Alert.SESSION_CRDT_RPO_BREACH,
                    [
                        expected(
                            alerts.get(Alert.SESSION_CRDT_RPO_BREACH),
                            cut,
                            rpo.session_crdt.max_seconds + 2,
                        )
                    ],
                ),
                (
                    Alert.SESSION_CRDT_DIVERGENCE,
                    [expected(alerts.get(Alert.SESSION_CRDT_DIVERGENCE), {}, 3)],
                ),
            ],
        ),
        Case(
            "CRDT sessions: converged regions stay silent",
            {
                series(catalog.SESSION_CRDT_SYNC_LAG_SECONDS, healthy): constant(0, 20),
                series(catalog.SESSION_CRDT_DIVERGENT_SESSIONS): constant(0, 20),
            },
            600,
            [(Alert.SESSION_CRDT_RPO_BREACH, []), (Alert.SESSION_CRDT_DIVERGENCE, [])],
        ),
        Case(
            "delta-log RPO: pending entries older than the RPO fire",
            {
                series(delta_age, {"collection": "a"}): (
                    constant(rpo.embedding_index.max_seconds + 3, 20)
                ),
                series(delta_age, {"collection": "b"}): (
                    constant(rpo.embedding_index.max_seconds, 20)
                ),
            },
            600,
            [
                (
                    Alert.INDEX_DELTA_LOG_RPO_BREACH,
                    [
                        expected(
                            alerts.get(Alert.INDEX_DELTA_LOG_RPO_BREACH),
                            {"collection": "a"},
                            rpo.embedding_index.max_seconds + 3,
                        )
                    ],
                )
            ],
        ),
    ]
