"""The alert catalog: every alert redline's rules raise, once, with its severity, default playbook
and what it means.

Like the metric catalog (`redline.slo.catalog`), this is a contract: the rules build the alerts
named here, the dashboards annotate them, the reports and the drills look for them, and no
product code spells an alert name as a string (a unit test checks). `Alert` is a `StrEnum`: a
member *is* its name, so it compares with, formats as and serialises to the plain name
(`f'ALERTS{{alertname="{Alert.RED_LINE_LATENCY_P99}"}}'`).

`playbook` is the built-in playbook the alert routes to by default; where the spec chooses the
playbook (`red_lines.latency_p99.playbook`, `rollback.playbook`, ...) the rules use the spec's.
The error-budget burn alerts are one per SLO: `ERROR_BUDGET_BURN.for_slo(name)` spells them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

Severity = Literal["critical", "page", "ticket", "warning"]
"""Alert severities the rules use: a red line's breach, a page, a ticket, a warning."""


class Alert(StrEnum):
    """Every alert with a fixed name: its severities, what it means, its default playbook."""

    severities: tuple[Severity, ...]
    about: str
    playbook: str | None

    def __new__(
        cls,
        name: str,
        severities: tuple[Severity, ...],
        about: str,
        playbook: str | None = None,
    ) -> Alert:
        member = str.__new__(cls, name)
        member._value_ = name
        member.severities = severities
        member.about = about
        member.playbook = playbook
        return member

    @property
    def severity(self) -> Severity:
        """The alert's one severity (TypeError for an alert with several)."""
        if len(self.severities) != 1:
            raise TypeError(f"{self.value} fires as {', '.join(self.severities)}: name one")
        return self.severities[0]

    @property
    def runbook(self) -> str:
        """The alert's runbook slug (appended to the spec's `runbook_base_url`)."""
        return str(self.value)

    # --- the red lines -----------------------------------------------------------------------
    RED_LINE_LATENCY_P99 = (
        "RedLineLatencyP99",
        ("critical",),
        "end-to-end P99 (reroutes included) over the latency red line",
        "reroute",
    )
    RED_LINE_LATENCY_SLOW_REQUESTS = (
        "RedLineLatencySlowRequests",
        ("page",),
        "too few requests for a P99, but enough of them slower than the latency red line",
    )
    ENGINE_SATURATION_RISING = (
        "EngineSaturationRising",
        ("ticket",),
        "the engine saturates (queue growing, waits eating the latency budget, a full KV cache "
        "preempting) before the P99 breaches",
    )
    RED_LINE_CONTEXT_KEEPALIVE = (
        "RedLineContextKeepalive",
        ("critical",),
        "conversation context not kept alive for the red line's minimum seconds",
    )
    RED_LINE_INDEX_STALENESS = (
        "RedLineIndexStaleness",
        ("critical",),
        "a vector-index replica staler than the eventual-consistency window",
        "freeze_and_replay",
    )
    # --- recovery points ---------------------------------------------------------------------
    LORA_CHECKPOINT_RPO_BREACH = (
        "LoRACheckpointRPOBreach",
        ("critical",),
        "a LoRA adapter's last checkpoint older than its RPO",
    )
    WEIGHT_SHARD_SYNC_RPO_BREACH = (
        "WeightShardSyncRPOBreach",
        ("critical",),
        "a region lacks a version of a model's weight shards for longer than the adapter RPO",
    )
    # --- encrypted weights -------------------------------------------------------------------
    DEK_ROTATION_OVERDUE = (
        "DEKRotationOverdue",
        ("ticket", "page"),
        "a keyring's DEK past its rotation period (ticket; the playbook rotates it), or shards "
        "under a DEK past retention, which no longer decrypt (page; humans only)",
        "weights_rotate",
    )
    SHARD_VERIFICATION_FAILED = (
        "ShardVerificationFailed",
        ("page",),
        "the newest verification of a weights version found a missing or damaged shard",
        "weights_resync",
    )
    SESSION_RPO_BREACH = (
        "SessionRPOBreach",
        ("critical",),
        "session state not replicated (CDC) within its RPO",
    )
    INDEX_DELTA_LOG_RPO_BREACH = (
        "IndexDeltaLogRPOBreach",
        ("critical",),
        "index delta-log entries pending past their RPO",
    )
    INDEX_ID_CONFLICT_RATE = (
        "IndexIDConflictRate",
        ("warning",),
        "vector-id conflicts between writing regions",
    )
    INDEX_CONSISTENCY_WEAK = (
        "IndexConsistencyWeak",
        ("ticket",),
        "a vector-index collection whose consistency level lets reads be staler than the "
        "eventual-consistency window (Eventually, Session, or Bounded over it)",
    )
    SESSION_CRDT_RPO_BREACH = (
        "SessionCrdtRPOBreach",
        ("critical",),
        "cross-region CRDT session sync lagging past its RPO",
    )
    SESSION_CRDT_DIVERGENCE = (
        "SessionCrdtDivergence",
        ("warning",),
        "sessions whose regions' states differ",
    )
    # --- the rollback gate and output consistency --------------------------------------------
    SEMANTIC_ROLLBACK_TWO_SIGNAL = (
        "SemanticRollbackTwoSignal",
        ("critical",),
        "a version's P99 up and its accuracy down at once, over enough requests",
        "semantic_rollback",
    )
    OUTPUT_CONSISTENCY_MUTATION = (
        "OutputConsistencyMutation",
        ("warning",),
        "a canary's answer changed from the accepted one",
        "rollback_candidate",
    )
    OUTPUT_CONSISTENCY_MUTATION_ROLLBACK = (
        "OutputConsistencyMutationRollback",
        ("critical",),
        "a mutated canary while the gate's conditions hold (`rollback.on_mutation`)",
        "semantic_rollback",
    )
    # --- models, spot, gateway, quotas -------------------------------------------------------
    EMBEDDING_DRIFT = (
        "EmbeddingDrift",
        ("warning",),
        "embeddings drifted from their reference window",
    )
    SPOT_PREEMPTION_NOTICE = (
        "SpotPreemptionNotice",
        ("warning",),
        "a spot node got its preemption notice",
        "spot_drain",
    )
    SPOT_NOTICE_TO_DRAINING_SLOW = (
        "SpotNoticeToDrainingSlow",
        ("ticket",),
        "notice to draining slower than its target",
    )
    SPOT_REPLACEMENT_SLOW = (
        "SpotReplacementSlow",
        ("page",),
        "a preempted node's replacement not ready in time",
    )
    GATEWAY_BREAKER_OPEN = (
        "GatewayBreakerOpen",
        ("page",),
        "the gateway's circuit breaker skips a region",
    )
    QUOTA_THROTTLING_SUSTAINED = (
        "QuotaThrottlingSustained",
        ("ticket",),
        "a tenant throttled for a sustained share",
    )
    # --- GPU nodes ---------------------------------------------------------------------------
    GPU_XID_CRITICAL = (
        "GPUXidCritical",
        ("critical",),
        "a GPU's last XID is one NVIDIA resolves by resetting the GPU or the node: drain it now",
        "gpu_node_failure",
    )
    GPU_XID_WATCH = (
        "GPUXidWatch",
        ("ticket",),
        "a GPU reported another XID (mostly application faults): watch it",
    )
    GPU_NODE_UNHEALTHY = (
        "GPUNodeUnhealthy",
        ("page", "ticket"),
        "a GPU node NotReady, or a GPU's memory, temperature or NVLink failing",
    )
    GPU_PODS_UNHEALTHY = (
        "GPUPodsUnhealthy",
        ("ticket",),
        "pods on a GPU node restarting again and again, or stuck pending",
    )
    # --- remediation -------------------------------------------------------------------------
    REMEDIATION_FAILED = ("RemediationFailed", ("page",), "a playbook run failed")
    REMEDIATION_STUCK = ("RemediationStuck", ("page",), "a playbook job overdue")
    REMEDIATION_DISABLED = (
        "RemediationDisabled",
        ("page",),
        "a playbook's breaker opened after repeated failures",
    )
    REMEDIATION_OVER_BUDGET = (
        "RemediationOverBudget",
        ("page",),
        "a playbook refused: its target's budget is spent",
    )
    RECEIVER_DOWN = ("ReceiverDown", ("page",), "the remediation receiver is down or not scraped")
    # --- guards ------------------------------------------------------------------------------
    SLI_ABSENT = ("SLIAbsent", ("page",), "an SLI's series is absent: its exporter is down")
    SLI_STALE = ("SLIStale", ("page",), "a probe has not succeeded for too long")
    SESSION_CRDT_SIGNALS_ABSENT = (
        "SessionCrdtSignalsAbsent",
        ("page",),
        "the CRDT session sync publishes no series",
    )
    SLO_GROUPS_OVER_LIMIT = (
        "SLOGroupsOverLimit",
        ("ticket",),
        "a grouped SLO counts more groups than its max_groups (every group is still alerted)",
    )
    AUDIT_CHAIN_BROKEN = (
        "AuditChainBroken",
        ("page",),
        "the remediation audit trail's hash chain is broken",
    )


@dataclass(frozen=True)
class AlertFamily:
    """Alerts named after a spec entry (one per SLO): `<Name>` + the family's suffix."""

    suffix: str
    severities: tuple[Severity, ...]
    about: str

    def for_slo(self, slo: str) -> str:
        """The family's alert name for the SLO `slo` (`latency` -> LatencyErrorBudgetBurn)."""
        return "".join(part.capitalize() for part in slo.split("_")) + self.suffix


ERROR_BUDGET_BURN = AlertFamily(
    "ErrorBudgetBurn",
    ("page", "ticket"),
    "an SLO's error budget burning fast (page) or steadily (ticket), over two windows",
)
FAMILIES: tuple[AlertFamily, ...] = (ERROR_BUDGET_BURN,)
"""Alerts named per spec entry."""


def alert_names() -> frozenset[str]:
    """The name of every fixed-name alert."""
    return frozenset(str(alert.value) for alert in Alert)


def render_alerts_markdown() -> str:
    """The alert catalog as a Markdown table (alert, severities, default playbook, meaning)."""
    lines = ["| alert | severity | default playbook | meaning |", "|---|---|---|---|"]
    for alert in Alert:
        playbook = f"`{alert.playbook}`" if alert.playbook else "–"
        lines.append(
            f"| `{alert.value}` | {', '.join(alert.severities)} | {playbook} | {alert.about} |"
        )
    for family in FAMILIES:
        lines.append(
            f"| `<Slo>{family.suffix}` | {', '.join(family.severities)} | – | {family.about} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_alerts_markdown(), end="")


__all__ = [
    "ERROR_BUDGET_BURN",
    "FAMILIES",
    "Alert",
    "AlertFamily",
    "Severity",
    "alert_names",
    "render_alerts_markdown",
]
