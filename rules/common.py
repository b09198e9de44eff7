"""What every alert shares: severity and playbook labels, summary, description and runbook URL."""

from __future__ import annotations

from redline.rules.model import AlertRule
from redline.slo.alerts import Alert
from redline.slo.spec import Spec


def runbook(spec: Spec, alert: Alert | str) -> str:
    """The runbook URL of an alert."""
    return f"{spec.runbook_base_url.rstrip('/')}/{alert}"


def alert_rule(
    spec: Spec,
    name: Alert | str,
    expr: str,
    for_seconds: float,
    severity: str,
    summary: str,
    description: str,
    playbook: str | None = None,
    **labels: str,
) -> AlertRule:
    """An alert with the house labels (sorted) and annotations; `playbook` routes it to a fix.

    `name` is a catalog alert (its severity must be one the catalog names) or, for the alerts
    named per SLO, the name `alerts.ERROR_BUDGET_BURN` spells.
    """
    if isinstance(name, Alert) and severity not in name.severities:
        raise ValueError(f"{name} fires as {', '.join(name.severities)}, not {severity}")
    name = str(name)
    all_labels = {"severity": severity, **labels}
    if playbook:
        all_labels["playbook"] = playbook
    annotations = {
        "summary": summary,
        "description": description,
        "runbook_url": runbook(spec, name),
    }
    return AlertRule(name, expr, for_seconds, dict(sorted(all_labels.items())), annotations)
