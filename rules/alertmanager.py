"""Alertmanager routing (by `playbook`, to the remediation webhook) and inhibitions."""

from __future__ import annotations

from typing import Any

from redline.rules.model import RuleGroup, format_duration
from redline.slo.spec import Spec

RECEIVER = "redline-remediation"
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
]
"""Labels that name a remediation target: one notification (and one job) per target."""


def used_playbooks(groups: list[RuleGroup]) -> list[str]:
    """Playbooks some alert of `groups` routes to, sorted."""
    found = {
        rule.labels["playbook"]
        for group in groups
        for rule in group.alerts
        if "playbook" in rule.labels
    }
    return sorted(found)


def build_alertmanager_config(spec: Spec, groups: list[RuleGroup]) -> dict[str, Any]:
    """The Alertmanager config: every alert to the receiver, a child route per playbook."""
    timing = spec.timing
    webhook = {
        "url": spec.receiver.url,
        "send_resolved": True,
        "max_alerts": 0,
        "http_config": {
            "authorization": {
                "type": "Bearer",
                "credentials_file": spec.receiver.bearer_token_file,
            }
        },
    }
    routes = [
        {
            "matchers": [f'playbook="{playbook}"'],
            "receiver": RECEIVER,
            "group_by": GROUP_BY,
            "continue": False,
        }
        for playbook in used_playbooks(groups)
    ]
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
                "source_matchers": ['alertname="RedLineLatencyP99"'],
                "target_matchers": ['slo="latency"'],
                "equal": [],
            },
        ],
        "receivers": [{"name": RECEIVER, "webhook_configs": [webhook]}],
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
