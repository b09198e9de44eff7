"""Alertmanager routing: playbook alerts to the remediation webhook, and (with `escalation:` in
the spec) every alert to the humans its severity names; inhibitions.

Without `escalation:` every alert goes to the webhook only (the receiver runs playbooks and
audits the rest) and `redline validate` warns that pages reach no human. With it:

- an alert with a `playbook` goes to the webhook, and on (`continue: true`) to its severity's
  humans, who see that a playbook is acting;
- an alert without one (a red line with no fix, the escalation alerts, SLIAbsent...) goes to
  its severity's humans only; the spec guarantees `critical` and `page` name at least one;
- an alert whose severity reaches nobody falls back to the webhook (audited, as before).
"""

from __future__ import annotations

from typing import Any

from redline.rules.families.remediation import SUBJECT
from redline.rules.model import RuleGroup, format_duration
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import (
    REMEDIATION_RECEIVER,
    EmailTarget,
    Escalation,
    HumanReceiver,
    PagerDutyTarget,
    SlackTarget,
    Spec,
    WebhookTarget,
)

RECEIVER = REMEDIATION_RECEIVER
GROUP_BY = [
    "alertname",
    "playbook",
    "region",
    "collection",
    "model",
    "model_version",
    "slo",
    "sli",
    "stream",
    "node",
    SUBJECT,
]
"""Labels that name a remediation target: one notification (and one job) per target; and the
playbook an escalation alert is about: one page per playbook."""

SEVERITY_ORDER = ("critical", "page", "ticket", "warning")

SLACK_TEXT = (
    "{{ range .Alerts }}*{{ .Labels.alertname }}* ({{ .Labels.severity }}): "
    "{{ .Annotations.summary }}\n{{ .Annotations.description }}\n"
    "Runbook: {{ .Annotations.runbook_url }}"
    "{{ if .Labels.playbook }}\nPlaybook {{ .Labels.playbook }} is acting on it "
    "(the remediation receiver's /jobs).{{ end }}\n{{ end }}"
)
"""Slack message body: each alert's summary, description, runbook and playbook, if any."""

PAGERDUTY_DESCRIPTION = (
    "[{{ .CommonLabels.severity }}] {{ .CommonLabels.alertname }}: {{ .CommonAnnotations.summary }}"
)
PAGERDUTY_SEVERITY = (
    '{{ if eq .CommonLabels.severity "critical" }}critical'
    '{{ else if eq .CommonLabels.severity "page" }}error{{ else }}warning{{ end }}'
)
"""PagerDuty's event severity (critical, error, warning, info) from the alert's."""


def used_playbooks(groups: list[RuleGroup]) -> list[str]:
    """Playbooks some alert of `groups` routes to, sorted."""
    found = {
        rule.labels["playbook"]
        for group in groups
        for rule in group.alerts
        if "playbook" in rule.labels
    }
    return sorted(found)


def _bearer(token_file: str) -> dict[str, Any]:
    return {"authorization": {"type": "Bearer", "credentials_file": token_file}}


def _slack(target: SlackTarget) -> dict[str, Any]:
    return {
        "send_resolved": True,
        "api_url_file": target.api_url_file,
        "channel": target.channel,
        "text": SLACK_TEXT,
    }


def _pagerduty(target: PagerDutyTarget) -> dict[str, Any]:
    config: dict[str, Any] = {"send_resolved": True}
    if target.routing_key_file is not None:
        config["routing_key_file"] = target.routing_key_file
    else:
        config["service_key_file"] = target.service_key_file
    if target.url is not None:
        config["url"] = target.url
    config["description"] = PAGERDUTY_DESCRIPTION
    config["severity"] = PAGERDUTY_SEVERITY
    config["details"] = {
        "description": "{{ .CommonAnnotations.description }}",
        "runbook_url": "{{ .CommonAnnotations.runbook_url }}",
        "playbook": "{{ .CommonLabels.playbook }}",
    }
    return config


def _email(target: EmailTarget) -> dict[str, Any]:
    config: dict[str, Any] = {
        "send_resolved": True,
        "to": target.to,
        "from": target.sender,
        "smarthost": target.smarthost,
        "require_tls": target.require_tls,
    }
    if target.auth_username is not None:
        config["auth_username"] = target.auth_username
        config["auth_password_file"] = target.auth_password_file
    return config


def _webhook(target: WebhookTarget) -> dict[str, Any]:
    config: dict[str, Any] = {"url": target.url, "send_resolved": True, "max_alerts": 0}
    if target.bearer_token_file is not None:
        config["http_config"] = _bearer(target.bearer_token_file)
    return config


def build_human_receiver(receiver: HumanReceiver) -> dict[str, Any]:
    """The Alertmanager receiver of one human receiver of the spec (secrets read from files)."""
    if receiver.slack is not None:
        return {"name": receiver.name, "slack_configs": [_slack(receiver.slack)]}
    if receiver.pagerduty is not None:
        return {"name": receiver.name, "pagerduty_configs": [_pagerduty(receiver.pagerduty)]}
    if receiver.email is not None:
        return {"name": receiver.name, "email_configs": [_email(receiver.email)]}
    assert receiver.webhook is not None, "the spec holds exactly one target per receiver"
    return {"name": receiver.name, "webhook_configs": [_webhook(receiver.webhook)]}


def _severity_matcher(severities: list[str], negate: bool = False) -> str:
    label = catalog.LABEL_SEVERITY
    if len(severities) == 1 and not negate:
        return f'{label}="{severities[0]}"'
    return f'{label}{"!~" if negate else "=~"}"{"|".join(severities)}"'


def build_human_routes(escalation: Escalation) -> list[dict[str, Any]]:
    """One route per human receiver for the severities that name it, then one per default
    receiver for the severities `routes` does not list; all `continue: true`."""
    listed = {str(severity): names for severity, names in escalation.routes.items()}
    ordered = [s for s in SEVERITY_ORDER if s in listed]
    ordered += sorted(s for s in listed if s not in SEVERITY_ORDER)
    routes: list[dict[str, Any]] = []
    for receiver in escalation.receivers:
        severities = [s for s in ordered if receiver.name in listed[s]]
        if severities:
            routes.append(_route(receiver.name, [_severity_matcher(severities)], True))
    for name in escalation.default:
        matchers = [_severity_matcher(ordered, negate=True)] if ordered else []
        routes.append(_route(name, matchers, True))
    return routes


def _route(receiver: str, matchers: list[str], keep_going: bool) -> dict[str, Any]:
    return {
        "matchers": matchers,
        "receiver": receiver,
        "group_by": GROUP_BY,
        "continue": keep_going,
    }


def build_alertmanager_config(spec: Spec, groups: list[RuleGroup]) -> dict[str, Any]:
    """The Alertmanager config: playbook alerts to the webhook (a child route per playbook) and,
    with `escalation:`, on to the humans of their severity; other alerts to those humans."""
    timing = spec.timing
    escalation = spec.escalation
    webhook = {
        "url": spec.receiver.url,
        "send_resolved": True,
        "max_alerts": 0,
        "http_config": _bearer(spec.receiver.bearer_token_file),
    }
    routes = [
        # With humans configured the playbook alert goes on to them: they see it is handled.
        _route(RECEIVER, [f'playbook="{playbook}"'], escalation is not None)
        for playbook in used_playbooks(groups)
    ]
    receivers: list[dict[str, Any]] = [{"name": RECEIVER, "webhook_configs": [webhook]}]
    if escalation is not None:
        routes += build_human_routes(escalation)
        receivers += [build_human_receiver(r) for r in escalation.receivers]
    return {
        "global": {"resolve_timeout": "5m"},
        "route": {
            "receiver": RECEIVER,
            "group_by": GROUP_BY,
            "group_wait": format_duration(timing.group_wait_seconds),
            "group_interval": format_duration(timing.group_interval_seconds),
            "repeat_interval": format_duration(timing.repeat_interval_seconds),
            "routes": routes,
        },
        "inhibit_rules": [
            {
                # a page already tells the on-call; the ticket for the same SLO is noise
                "source_matchers": ['severity="page"', 'slo=~".+"'],
                "target_matchers": ['severity="ticket"'],
                "equal": ["alertname", "slo"],
            },
            {
                # while the latency red line fires, its burn-rate page says nothing new
                "source_matchers": [f'alertname="{Alert.RED_LINE_LATENCY_P99}"'],
                "target_matchers": ['slo="latency"'],
                "equal": [],
            },
        ],
        "receivers": receivers,
    }


def build_prometheus_rule(spec: Spec, groups: list[RuleGroup]) -> dict[str, Any]:
    """A prometheus-operator `PrometheusRule` holding every rule group."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": f"redline-{spec.service}",
            "labels": {
                "app.kubernetes.io/name": "redline",
                "app.kubernetes.io/part-of": spec.service,
                "role": "alert-rules",
            },
        },
        "spec": {"groups": [group.to_dict() for group in groups]},
    }
