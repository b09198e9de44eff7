"""What every alert shares: severity and playbook labels, summary, description and runbook URL."""

from __future__ import annotations

from redline.rules.model import AlertRule
from redline.slo.spec import Spec


def runbook(spec: Spec, alert: str) -> str:
    """The runbook URL of an alert."""
    return f"{spec.runbook_base_url.rstrip('/')}/{alert}"


def alert_rule(
    spec: Spec,
    name: str,
    expr: str,
    for_seconds: float,
    severity: str,
    summary: str,
    description: str,
    playbook: str | None = None,
    **labels: str,
) -> AlertRule:
    """An alert with the house labels (sorted) and annotations; `playbook` routes it to a fix."""
    all_labels = {"severity": severity, **labels}
    if playbook:
        all_labels["playbook"] = playbook
    annotations = {
        "summary": summary,
        "description": description,
        "runbook_url": runbook(spec, name),
    }
    return AlertRule(name, expr, for_seconds, dict(sorted(all_labels.items())), annotations)
