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
from redline.slo import catalog
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
    cdc_lag = catalog.SESSION_CDC_RPO_SECONDS
    oldest = catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS
    entries = catalog.VECTORDB_DELTA_LOG_PENDING_ENTRIES
    age = f"time() - max by (adapter) ({catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS})"
    pending = Query(
        f"sum by (collection, replica) ({entries})",
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
                Query(f"max({cdc_lag})", "worst stream"),
                Query(f"max by (stream, group) ({cdc_lag})", "{{stream}} / {{group}}"),
            ),
        ),
        Section(
            "Vector index delta log",
            (
                *_pair(
                    delta,
                    "Oldest pending entry",
                    rpo.embedding_index,
                    Query(f"max({oldest})", "oldest"),
                    Query(
                        f"max by (collection, replica) ({oldest})", "{{collection}} on {{replica}}"
                    ),
                ),
                PanelDef(
                    "stat",
                    "Pending entries",
                    (Query(f"sum({entries})", "pending"),),
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
