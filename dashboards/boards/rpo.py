"""The *RPO* dashboard: LoRA checkpoint age, session CDC lag and the index delta log."""

from __future__ import annotations

from grafanalib.core import Dashboard

from redline.dashboards.panels import (
    DashboardDef,
    PanelDef,
    Query,
    Section,
    alert_and_remediation_annotations,
    alert_runbook,
    assemble,
    bad_above,
)
from redline.rules.model import number
from redline.slo.spec import RpoTarget, Spec

SLUG = "rpo"


def _pair(
    book: str, name: str, target: RpoTarget, worst: Query, detail: Query
) -> tuple[PanelDef, PanelDef]:
    title = f"{name} (RPO {number(target.max_seconds)} s)"
    steps = bad_above(target.max_seconds)
    return (
        PanelDef("stat", title, (worst,), book, "s", steps),
        PanelDef("timeseries", title, (detail,), book, "s", steps, width=18),
    )


def build_rpo_definition(spec: Spec) -> DashboardDef:
    """The RPO dashboard as data."""
    rpo = spec.rpo
    lora = alert_runbook(spec, "LoRACheckpointRPOBreach")
    session = alert_runbook(spec, "SessionRPOBreach")
    delta = alert_runbook(spec, "IndexDeltaLogRPOBreach")
    age = "time() - max by (adapter) (model_checkpoint_last_success_timestamp_seconds)"
    pending = Query(
        "sum by (collection, replica) (vectordb_delta_log_pending_entries)",
        "{{collection}} on {{replica}}",
    )
    sections = (
        Section(
            "LoRA adapters",
            _pair(
                lora,
                "Checkpoint age",
                rpo.lora_adapter,
                Query(f"max({age})", "oldest adapter"),
                Query(age, "{{adapter}}"),
            ),
        ),
        Section(
            "Session state (Redis Streams CDC)",
            _pair(
                session,
                "CDC lag: oldest entry not ACKed",
                rpo.session_state,
                Query("max(session_cdc_rpo_seconds)", "worst stream"),
                Query("max by (stream, group) (session_cdc_rpo_seconds)", "{{stream}} / {{group}}"),
            ),
        ),
        Section(
            "Vector index delta log",
            (
                *_pair(
                    delta,
                    "Oldest pending entry",
                    rpo.embedding_index,
                    Query("max(vectordb_delta_log_oldest_pending_age_seconds)", "oldest"),
                    Query(
                        "max by (collection, replica) "
                        "(vectordb_delta_log_oldest_pending_age_seconds)",
                        "{{collection}} on {{replica}}",
                    ),
                ),
                PanelDef(
                    "stat",
                    "Pending entries",
                    (Query("sum(vectordb_delta_log_pending_entries)", "pending"),),
                    delta,
                    "short",
                ),
                PanelDef("timeseries", "Pending entries", (pending,), delta, "short", width=18),
            ),
        ),
    )
    return DashboardDef(
        slug=SLUG,
        title="RPO",
        description=(
            "Recovery-point objectives of the spec: how much adapter training, session state and "
            "index writes a failure right now would lose."
        ),
        sections=sections,
        annotations=alert_and_remediation_annotations("RPO alerts", 'rpo!=""', "red"),
        variables=(),
    )


def build_rpo_dashboard(spec: Spec) -> Dashboard:
    """The RPO dashboard."""
    return assemble(spec, build_rpo_definition(spec))
