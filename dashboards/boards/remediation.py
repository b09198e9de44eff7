"""The *Remediation* dashboard: webhook deliveries, duplicates absorbed, playbook runs by outcome
and duration, what shadow mode would have done and what the guard rails skipped, each playbook's
mode, pause and breaker, jobs past their deadline, and the write-freeze state.

Webhook counters are per receiver process (sum them); run counters and durations are
cluster-wide in every replica (take the max), as `redline.remediation.metrics` documents.
There is no audit-chain metric in the catalog (`redline audit verify` checks the chain), so no
panel shows it.
"""

from __future__ import annotations

from typing import Any

from grafanalib.core import Dashboard

from redline.dashboards.panels import (
    ANY_EVENT,
    REMEDIATION_RUNBOOK,
    AnnotationDef,
    DashboardDef,
    PanelDef,
    Query,
    Section,
    Step,
    alert_and_remediation_annotations,
    alert_runbook,
    assemble,
    bad_above,
    two_state_mapping,
)
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import PLAYBOOK_NAMES, Spec

SLUG = "remediation"
FROZEN = two_state_mapping(("writable", "green"), ("frozen", "orange"))
INTACT = two_state_mapping(("BROKEN", "red"), ("intact", "green"))
PAUSED = two_state_mapping(("running", "green"), ("PAUSED", "orange"))
BREAKER = two_state_mapping(("closed", "green"), ("OPEN", "red"))
NEXT_ALERT: tuple[dict[str, Any], ...] = (
    {
        "type": "value",
        "options": {
            "0": {"text": "acts", "color": "green", "index": 0},
            "1": {"text": "shadow (plans only)", "color": "blue", "index": 1},
            "2": {"text": "off", "color": "text", "index": 2},
            "3": {"text": "PAUSED", "color": "orange", "index": 3},
            "4": {"text": "BREAKER OPEN", "color": "red", "index": 4},
        },
    },
)
"""What the worker does with a playbook's next alert (`next_alert_expr`)."""
SHADOW = catalog.OUTCOME_SHADOW
SKIPPED = "|".join(catalog.SKIP_OUTCOMES)
TARGET_LABELS = (
    catalog.LABEL_MODEL,
    catalog.LABEL_MODEL_VERSION,
    catalog.LABEL_REGION,
    catalog.LABEL_COLLECTION,
    catalog.LABEL_REPLICA,
    catalog.LABEL_NODE,
)
"""Labels of the alerts routed to playbooks that name what a run acts on."""
VERIFY_STALE_SECONDS = 600.0
"""Ten of the receiver's default verification intervals (`audit_verify_interval_seconds`, a
receiver setting, not the spec's): older than that, nobody is checking the trail."""


def next_alert_expr() -> str:
    """Per playbook, what the worker does with its next alert, in the worker's order: 2 mode
    off, 3 paused, 1 shadow (a shadow run ignores the breaker), 4 breaker open, 0 acts."""
    mode, paused = catalog.REDLINE_REMEDIATION_MODE, catalog.REDLINE_REMEDIATION_PAUSED
    breaker = catalog.REDLINE_REMEDIATION_BREAKER_OPEN
    by = f"max by ({catalog.LABEL_PLAYBOOK})"
    label = mode.labels[1]
    return (
        f'({by} ({mode}{{{label}="off"}}) == 1) * 2\n'
        f"or ({by} ({paused}) == 1) * 3\n"
        f'or ({by} ({mode}{{{label}="{SHADOW}"}}) == 1)\n'
        f"or ({by} ({breaker}) == 1) * 4\n"
        f"or {by} ({mode}) * 0"
    )


def only_runs(per_playbook: str, *labels: str) -> str:
    """The series of `per_playbook` above 0, or one 0 named `all playbooks` when none is.

    The receiver exposes every outcome of every known playbook from its start, so without the
    filter a stat shows a tile per zero; with it alone, a quiet range would read "no data"."""
    total = f'label_replace(sum({per_playbook}), "playbook", "all playbooks", "", "")'
    for label in labels:
        total = f'label_replace({total}, "{label}", "none", "", "")'
    return f"({per_playbook} > 0)\nor on () {total}"


def shadow_annotation() -> AnnotationDef:
    """A mark wherever a shadow run ended, naming the alert it answered when one was firing."""
    runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL
    playbook = catalog.LABEL_PLAYBOOK
    shadow = (
        f"max by ({playbook}) "
        f'(increase({runs}{{{catalog.LABEL_OUTCOME}="{SHADOW}"}}[$__rate_interval])) > 0'
    )
    labels = ", ".join(("alertname", playbook, *TARGET_LABELS))
    alerts = f'max by ({labels}) (ALERTS{{alertstate="firing",{playbook}!=""}})'
    # One mark per alert the run may have answered; the bare run where none was firing.
    expr = f"({shadow}) * on ({playbook}) group_right () ({alerts})\nor on ({playbook}) {shadow}"
    return AnnotationDef(
        name="Shadow runs",
        expr=expr,
        title="shadow: {{playbook}}",
        text=(
            "would have run {{playbook}} ({{alertname}} {{model}} {{model_version}} {{region}} "
            "{{collection}} {{node}}); shadow mode planned and checked, nothing changed"
        ),
        tags="playbook,alertname",
        color="blue",
    )


def oldest_deadline_seconds(spec: Spec) -> float:
    """The shortest job deadline of any playbook: past it, some job is overdue."""
    return min(spec.remediation.policy(name).deadline_seconds for name in PLAYBOOK_NAMES)


def build_remediation_definition(spec: Spec) -> DashboardDef:
    """The remediation dashboard as data."""
    book = alert_runbook(spec, REMEDIATION_RUNBOOK)
    freeze_book = alert_runbook(spec, Alert.RED_LINE_INDEX_STALENESS)
    audit_book = alert_runbook(spec, Alert.AUDIT_CHAIN_BROKEN)
    alerts = catalog.REDLINE_WEBHOOK_ALERTS_TOTAL
    runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL
    duration = catalog.REDLINE_REMEDIATION_DURATION_SECONDS.bucket
    duplicates = catalog.REDLINE_WEBHOOK_DUPLICATES_TOTAL
    received = Query(f"sum by (status) (increase({alerts}[$__range]))", "{{status}}")
    received_rate = Query(f"sum by (status) (rate({alerts}[$__rate_interval]))", "{{status}}")
    dupes = Query(f"sum(increase({duplicates}[$__range]))", "duplicates")
    dupes_rate = Query(f"sum(rate({duplicates}[$__rate_interval]))", "duplicates")
    by_outcome = Query(
        only_runs(f"max by (playbook, outcome) (increase({runs}[$__range]))", "outcome"),
        "{{playbook}}: {{outcome}}",
        instant=True,  # the range's end only: earlier points would add the "none" fallback
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
    shadow_runs = Query(
        only_runs(f'max by (playbook) (increase({runs}{{outcome="{SHADOW}"}}[$__range]))'),
        "{{playbook}}",
        instant=True,
    )
    skipped = Query(
        f"sum by (outcome) (max by (playbook, outcome) "
        f'(increase({runs}{{outcome=~"{SKIPPED}"}}[$__range])))',
        "{{outcome}}",
    )
    shadow_skip_rate = Query(
        f"max by (playbook, outcome) "
        f'(increase({runs}{{outcome=~"{SHADOW}|{SKIPPED}"}}[$__rate_interval]))',
        "{{playbook}}: {{outcome}}",
    )
    next_alert = Query(next_alert_expr(), "{{playbook}}")
    breaker = Query(
        f"max by (playbook) ({catalog.REDLINE_REMEDIATION_BREAKER_OPEN})", "{{playbook}}"
    )
    paused = Query(f"max by (playbook) ({catalog.REDLINE_REMEDIATION_PAUSED})", "{{playbook}}")
    mode = catalog.REDLINE_REMEDIATION_MODE
    modes = Query(f"max by (playbook, {mode.labels[1]}) ({mode}) == 1", "{{playbook}}: {{mode}}")
    overdue = catalog.REDLINE_REMEDIATION_JOBS_OVERDUE
    oldest = catalog.REDLINE_REMEDIATION_OLDEST_JOB_AGE_SECONDS
    overdue_total = Query(f"sum(max by (playbook) ({overdue}))", "overdue")
    overdue_by = Query(f"max by (playbook) ({overdue})", "{{playbook}}")
    oldest_now = Query(f"max(max by (playbook) ({oldest}))", "oldest")
    oldest_by = Query(f"max by (playbook) ({oldest})", "{{playbook}}")
    stuck_book = alert_runbook(spec, Alert.REMEDIATION_STUCK)
    disabled_book = alert_runbook(spec, Alert.REMEDIATION_DISABLED)
    budget_book = alert_runbook(spec, Alert.REMEDIATION_OVER_BUDGET)
    deadline = oldest_deadline_seconds(spec)
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
            "Shadow mode and skips",
            (
                PanelDef(
                    "stat",
                    "Shadow runs (range)",
                    (shadow_runs,),
                    book,
                    "short",
                    stat_text="value_and_name",
                    width=8,
                    description=(
                        "Runs of playbooks in shadow mode (remediation.playbooks.<name>.mode: "
                        "shadow): planned and checked, nothing changed. The receiver's /jobs and "
                        "the audit trail hold each one's plan: what it would have done."
                    ),
                ),  # fmt: skip
                PanelDef(
                    "stat",
                    "Skipped runs by reason (range)",
                    (skipped,),
                    budget_book,
                    "short",
                    (Step("green", None), Step("orange", ANY_EVENT)),
                    stat_text="value_and_name",
                    width=8,
                    description=(
                        "Alerts a playbook did not act on: mode off, paused by a human, over its "
                        "budget (runs per target per window), or its breaker open."
                    ),
                ),  # fmt: skip
                PanelDef(
                    "timeseries",
                    "Shadow runs and skips",
                    (shadow_skip_rate,),
                    book,
                    "short",
                    width=8,
                    bars=True,
                ),  # fmt: skip
            ),
        ),
        Section(
            "Guard rails",
            (
                PanelDef(
                    "stat",
                    "Next alert: what each playbook does",
                    (next_alert,),
                    book,
                    mappings=NEXT_ALERT,
                    stat_text="value_and_name",
                    width=12,
                    description=(
                        "In the worker's order: mode off skips; paused (redline remediation "
                        "pause) skips; shadow plans and checks only; an open breaker skips; "
                        "otherwise the playbook acts."
                    ),
                ),  # fmt: skip
                PanelDef(
                    "state",
                    "Guard rails over time",
                    (next_alert,),
                    book,
                    mappings=NEXT_ALERT,
                    width=12,
                ),  # fmt: skip
                PanelDef(
                    "stat",
                    "Mode",
                    (modes,),
                    book,
                    stat_text="name",
                    width=8,
                ),  # fmt: skip
                PanelDef(
                    "stat",
                    "Paused",
                    (paused,),
                    book,
                    mappings=PAUSED,
                    stat_text="value_and_name",
                    width=8,
                ),  # fmt: skip
                PanelDef(
                    "stat",
                    "Breaker",
                    (breaker,),
                    disabled_book,
                    mappings=BREAKER,
                    stat_text="value_and_name",
                    width=8,
                    description=(
                        "Open after remediation.playbooks.<name>.breaker.failures failed runs in "
                        "a row; it stays open until a human runs redline remediation resume."
                    ),
                ),  # fmt: skip
            ),
        ),
        Section(
            "Jobs past their deadline",
            (
                PanelDef(
                    "stat",
                    "Overdue jobs",
                    (overdue_total,),
                    stuck_book,
                    "short",
                    bad_above(ANY_EVENT),
                    width=6,
                ),  # fmt: skip
                PanelDef(
                    "timeseries", "Overdue jobs", (overdue_by,), stuck_book, "short", width=6
                ),  # fmt: skip
                PanelDef(
                    "stat",
                    f"Oldest unfinished job (deadline {deadline:g} s)",
                    (oldest_now,),
                    stuck_book,
                    "s",
                    bad_above(deadline),
                    width=6,
                    description=(
                        "Age of the oldest queued, running, waiting or retrying job; each "
                        "playbook's own deadline (remediation.playbooks.<name>.deadline) decides "
                        "when it is overdue. A reroute waiting to restore is unfinished by design."
                    ),
                ),  # fmt: skip
                PanelDef(
                    "timeseries",
                    "Oldest unfinished job",
                    (oldest_by,),
                    stuck_book,
                    "s",
                    bad_above(deadline),
                    width=6,
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
            "absorbed (HA peers, retries), playbook runs by outcome and duration, what shadow "
            "mode would have done and what the guard rails skipped, each playbook's mode, pause "
            "and breaker, jobs past their deadline, write freezes, and whether the hash-chained "
            "audit trail still verifies."
        ),
        sections=sections,
        annotations=(
            *alert_and_remediation_annotations("Alerts with a playbook", 'playbook!=""', "red"),
            shadow_annotation(),
        ),
        variables=(),
    )


def build_remediation_dashboard(spec: Spec) -> Dashboard:
    """The remediation dashboard."""
    return assemble(spec, build_remediation_definition(spec))
