"""The *RPO* dashboard: LoRA checkpoint age, session CDC lag, the CRDT session sync between
regions (lag per direction, divergent sessions, time to converge) and the index delta log (its
backlog per replica, and the entries and memory it holds per collection)."""

from __future__ import annotations

from grafanalib.core import Dashboard

from redline.dashboards.panels import (
    ANY_EVENT,
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
from redline.slo.alerts import Alert
from redline.slo.spec import RpoTarget, Spec

SLUG = "rpo"
HELD_DESCRIPTION = (
    "What the delta log (a Redis stream per collection) holds: entries (XLEN) and Redis memory "
    "(MEMORY USAGE, sampled). Trimming keeps it level at the oldest registered replica's "
    "checkpoint, freeze point or unfinished replay, minus the retention window. Steady growth "
    "means a stuck or unregistered replica: one whose checkpoint no longer moves, one gone for "
    "good but still registered (redline index forget-target), or none registered at all "
    "(nothing is trimmed). `redline index status` shows the registry and the trim point."
)
DIVERGENT_DESCRIPTION = (
    "CRDT sessions changed recently (but not within the probe's settle time, the normal sync "
    "delay) whose state digests differ between the regions. Above zero for long: the sync is "
    f"cut, behind or failing ({Alert.SESSION_CRDT_DIVERGENCE}); no data: the session_crdt probe "
    f"is off or failing ({Alert.SESSION_CRDT_SIGNALS_ABSENT})."
)
CONVERGENCE_DESCRIPTION = (
    "Length of the last divergence, from the first probe run that saw divergent CRDT sessions "
    "to the first that saw none again: how long the regions took to converge after a partition "
    "healed (0 before any divergence)."
)


def _crdt_section(spec: Spec) -> Section:
    """Session state kept as a CRDT in every region: sync lag per direction against the RPO,
    divergent sessions and the time the regions took to converge."""
    lag = catalog.SESSION_CRDT_SYNC_LAG_SECONDS
    divergent = catalog.SESSION_CRDT_DIVERGENT_SESSIONS
    convergence = catalog.SESSION_CRDT_CONVERGENCE_SECONDS
    divergence = alert_runbook(spec, Alert.SESSION_CRDT_DIVERGENCE)
    direction = "{{source_region}} → {{target_region}}"
    return Section(
        "Session state (CRDT sync between regions)",
        (
            *_pair(
                alert_runbook(spec, Alert.SESSION_CRDT_RPO_BREACH),
                "CRDT sync lag: oldest delta not merged",
                spec.rpo.session_crdt,
                Query(f"max({lag})", "worst direction"),
                Query(f"max by (source_region, target_region) ({lag})", direction),
            ),
            PanelDef(
                "stat",
                "Divergent sessions",
                (Query(f"max({divergent})", "divergent"),),
                divergence,
                "short",
                bad_above(ANY_EVENT),
                description=DIVERGENT_DESCRIPTION,
            ),
            PanelDef(
                "timeseries",
                "Divergent sessions",
                (Query(f"max({divergent})", "divergent"),),
                divergence,
                "short",
                bad_above(ANY_EVENT),
                description=DIVERGENT_DESCRIPTION,
            ),
            PanelDef(
                "stat",
                "Time to converge (last divergence)",
                (Query(f"max({convergence})", "last convergence"),),
                divergence,
                "s",
                description=CONVERGENCE_DESCRIPTION,
            ),
            PanelDef(
                "timeseries",
                "Time to converge (last divergence)",
                (Query(f"max({convergence})", "last convergence"),),
                divergence,
                "s",
                description=CONVERGENCE_DESCRIPTION,
            ),
        ),
    )


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
    lora = alert_runbook(spec, Alert.LORA_CHECKPOINT_RPO_BREACH)
    session = alert_runbook(spec, Alert.SESSION_RPO_BREACH)
    delta = alert_runbook(spec, Alert.INDEX_DELTA_LOG_RPO_BREACH)
    cdc_lag = catalog.SESSION_CDC_RPO_SECONDS
    oldest = catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS
    entries = catalog.VECTORDB_DELTA_LOG_PENDING_ENTRIES
    age = f"time() - max by (adapter) ({catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS})"
    pending = Query(
        f"sum by (collection, replica) ({entries})",
        "{{collection}} on {{replica}}",
    )
    held = Query(f"max by (collection) ({catalog.VECTORDB_DELTA_LOG_ENTRIES})", "{{collection}}")
    memory = Query(
        f"max by (collection) ({catalog.VECTORDB_DELTA_LOG_MEMORY_BYTES})", "{{collection}}"
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
        _crdt_section(spec),
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
        Section(
            "Vector index delta log: what it holds",
            (
                PanelDef(
                    "stat",
                    "Delta-log entries held",
                    (held,),
                    delta,
                    "short",
                    stat_text="value_and_name",
                    description=HELD_DESCRIPTION,
                ),  # fmt: skip
                PanelDef(
                    "timeseries",
                    "Delta-log entries held, per collection",
                    (held,),
                    delta,
                    "short",
                    width=18,
                    description=HELD_DESCRIPTION,
                ),  # fmt: skip
                PanelDef(
                    "stat",
                    "Delta-log memory",
                    (memory,),
                    delta,
                    "bytes",
                    stat_text="value_and_name",
                    description=HELD_DESCRIPTION,
                ),  # fmt: skip
                PanelDef(
                    "timeseries",
                    "Delta-log memory, per collection",
                    (memory,),
                    delta,
                    "bytes",
                    width=18,
                    description=HELD_DESCRIPTION,
                ),  # fmt: skip
            ),
        ),
    )
    return DashboardDef(
        slug=SLUG,
        title="RPO",
        description=(
            "Recovery-point objectives of the spec: how much adapter training, session state and "
            "index writes a failure right now would lose; whether the regions' CRDT sessions "
            "agree and how long they took to converge; and how much the index delta log holds "
            "(it stays bounded while every replica's checkpoint moves)."
        ),
        sections=sections,
        annotations=alert_and_remediation_annotations("RPO alerts", 'rpo!=""', "red"),
        variables=(),
    )


def build_rpo_dashboard(spec: Spec) -> Dashboard:
    """The RPO dashboard."""
    return assemble(spec, build_rpo_definition(spec))
