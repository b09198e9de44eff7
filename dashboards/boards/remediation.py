"""The *Remediation* dashboard: webhook deliveries, duplicates absorbed, playbook runs by outcome
and duration, and the write-freeze state.

Webhook counters are per receiver process (sum them); run counters and durations are
cluster-wide in every replica (take the max), as `redline.remediation.metrics` documents.
There is no audit-chain metric in the catalog (`redline audit verify` checks the chain), so no
panel shows it.
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from redline.dashboards.panels import (
    ANY_EVENT,
    REMEDIATION_RUNBOOK,
    DashboardDef,
    PanelDef,
    Query,
    Section,
    alert_and_remediation_annotations,
    alert_runbook,
    assemble,
    bad_above,
    two_state_mapping,
)
from redline.slo import catalog
from redline.slo.spec import Spec

SLUG = "remediation"
FROZEN = two_state_mapping(("writable", "green"), ("frozen", "orange"))
INTACT = two_state_mapping(("BROKEN", "red"), ("intact", "green"))
VERIFY_STALE_SECONDS = 600.0
"""Ten of the receiver's default verification intervals (`audit_verify_interval_seconds`, a
receiver setting, not the spec's): older than that, nobody is checking the trail."""


def build_remediation_definition(spec: Spec) -> DashboardDef:
    """The remediation dashboard as data."""
    book = alert_runbook(spec, REMEDIATION_RUNBOOK)
    freeze_book = alert_runbook(spec, "RedLineIndexStaleness")
    audit_book = alert_runbook(spec, "AuditChainBroken")
    alerts = catalog.REDLINE_WEBHOOK_ALERTS_TOTAL
    runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL
    duration = catalog.REDLINE_REMEDIATION_DURATION_SECONDS.bucket
    duplicates = catalog.REDLINE_WEBHOOK_DUPLICATES_TOTAL
    received = Query(f"sum by (status) (increase({alerts}[$__range]))", "{{status}}")
    received_rate = Query(f"sum by (status) (rate({alerts}[$__rate_interval]))", "{{status}}")
    dupes = Query(f"sum(increase({duplicates}[$__range]))", "duplicates")
    dupes_rate = Query(f"sum(rate({duplicates}[$__rate_interval]))", "duplicates")
    by_outcome = Query(
        f"max by (playbook, outcome) (increase({runs}[$__range]))", "{{playbook}}: {{outcome}}"
    )
    outcome_rate = Query(
        f"max by (playbook, outcome) (increase({runs}[$__rate_interval]))",
        "{{playbook}}: {{outcome}}",
    )
    # No failed run has no series: the stat reads 0, not "No data".
    failed = Query(
        f'sum(max by (playbook) (increase({runs}{{outcome="failed"}}[$__range]))) or vector(0)', ""
    )
    durations = tuple(
        Query(
            f"histogram_quantile({q}, max by (le, playbook) (rate({duration}[$__range])))",
            f"P{round(q * 100)} {{{{playbook}}}}",
        )
        for q in (0.5, 0.99)
    )
    duration_series = Query(
        f"histogram_quantile(0.99, max by (le, playbook) (rate({duration}[$__rate_interval])))",
        "P99 {{playbook}}",
    )
    frozen = Query(f"max by (collection) ({catalog.VECTORDB_WRITE_FROZEN})", "{{collection}}")
    chain = Query(f"min by (copy) ({catalog.REDLINE_AUDIT_CHAIN_INTACT})", "{{copy}}")
    records = Query(f"max by (copy) ({catalog.REDLINE_AUDIT_RECORDS})", "{{copy}}")
    verified = Query(f"time() - max({catalog.REDLINE_AUDIT_VERIFIED_TIMESTAMP_SECONDS})", "age")
    firing = Query(
        'count by (alertname, playbook) (ALERTS{alertstate="firing",playbook!=""})',
        "{{alertname}} → {{playbook}}",
    )
    sections = (
        Section(
            "Alertmanager webhook",
            (
                PanelDef("stat", "Alerts received (range)", (received,), book, "short", width=6),
                PanelDef("timeseries", "Alerts received", (received_rate,), book, "reqps", width=6),
                PanelDef("stat", "Duplicates absorbed (range)", (dupes,), book, "short", width=6),
                PanelDef(
                    "timeseries", "Duplicates absorbed", (dupes_rate,), book, "reqps", width=6
                ),  # fmt: skip
            ),
        ),
        Section(
            "Playbook runs",
            (
                PanelDef(
                    "stat",
                    "Runs by outcome (range)",
                    (by_outcome,),
                    book,
                    "short",
                    stat_text="value_and_name",
                    width=8,
                ),  # fmt: skip
                PanelDef(
                    "stat",
                    "Failed runs (range)",
                    (failed,),
                    book,
                    "short",
                    bad_above(ANY_EVENT),
                    width=4,
                ),  # fmt: skip
                PanelDef(
                    "timeseries",
                    "Runs by outcome",
                    (outcome_rate,),
                    book,
                    "short",
                    width=12,
                    bars=True,
                ),  # fmt: skip
                PanelDef(
                    "stat",
                    "Run duration (range)",
                    durations,
                    book,
                    "s",
                    stat_text="value_and_name",
                    width=12,
                ),  # fmt: skip
                PanelDef(
                    "timeseries", "Run duration P99", (duration_series,), book, "s", width=12
                ),  # fmt: skip
            ),
        ),
        Section(
            "State",
            (
                PanelDef(
                    "stat",
                    "Index writes",
                    (frozen,),
                    freeze_book,
                    mappings=FROZEN,
                    stat_text="value_and_name",
                    width=6,
                ),  # fmt: skip
                PanelDef(
                    "state", "Write freeze", (frozen,), freeze_book, mappings=FROZEN, width=9
                ),  # fmt: skip
                PanelDef(
                    "timeseries", "Firing alerts with a playbook", (firing,), book, "short", width=9
                ),  # fmt: skip
            ),
        ),
        Section(
            "Audit trail",
            (
                PanelDef(
                    "stat",
                    "Audit chain (hashes, order, head)",
                    (chain,),
                    audit_book,
                    mappings=INTACT,
                    stat_text="value_and_name",
                    width=8,
                ),  # fmt: skip
                PanelDef(
                    "timeseries", "Audit records", (records,), audit_book, "short", width=8
                ),  # fmt: skip
                PanelDef(
                    "stat",
                    "Audit chain last verified",
                    (verified,),
                    audit_book,
                    "s",
                    bad_above(VERIFY_STALE_SECONDS),
                    width=8,
                ),  # fmt: skip
            ),
        ),
    )
    return DashboardDef(
        slug=SLUG,
        title="Remediation",
        description=(
            "What the remediation receiver did: alerts received from Alertmanager, duplicates "
            "absorbed (HA peers, retries), playbook runs by outcome and duration, write freezes, "
            "and whether the hash-chained audit trail still verifies."
        ),
        sections=sections,
        annotations=alert_and_remediation_annotations(
            "Alerts with a playbook", 'playbook!=""', "red"
        ),
        variables=(),
    )


def build_remediation_dashboard(spec: Spec) -> Dashboard:
    """The remediation dashboard."""
    return assemble(spec, build_remediation_definition(spec))
