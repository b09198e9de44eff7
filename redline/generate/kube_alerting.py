"""The spec's Alertmanager routes and receivers as a prometheus-operator `AlertmanagerConfig`
(monitoring.coreos.com/v1alpha1): the same tree `redline.rules.alertmanager` builds for a plain
alertmanager.yml, in the CRD's camelCase schema, with every secret a `secretKeyRef` to a Secret
of the namespace instead of a file.

The operator adds `namespace="<the config's namespace>"` to the top route's matchers (its default
`OnNamespace` strategy) and to the inhibit rules; the alerts of redline's `PrometheusRule` carry
that label (see `redline.generate.kubernetes`), so they reach these routes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from redline.rules.alertmanager import RECEIVER, build_alertmanager_config
from redline.rules.model import RuleGroup
from redline.slo.spec import HumanReceiver, Spec

ALERTMANAGER_CONFIG_API = "monitoring.coreos.com/v1alpha1"
_MATCHER = re.compile(r'^([a-zA-Z_][a-zA-Z0-9_]*)(=~|!~|!=|=)"(.*)"$')
_DNS_LABEL = re.compile(r"[^a-z0-9-]")


class AlertingBuildError(Exception):
    """The spec's routes or receivers cannot be written as an AlertmanagerConfig."""


@dataclass(frozen=True)
class SecretKey:
    """One key of a Secret the manifests reference: who reads it and what it holds."""

    secret: str
    key: str
    holds: str


def parse_matcher(text: str) -> dict[str, str]:
    """`name="value"` (or =~, !=, !~) as the CRD's matcher object; AlertingBuildError otherwise."""
    found = _MATCHER.match(text)
    if found is None:
        raise AlertingBuildError(f'matcher {text!r} is not name<op>"value"')
    name, operator, value = found.groups()
    return {"name": name, "matchType": operator, "value": value.replace('\\"', '"')}


def escalation_secret_name(receiver: str) -> str:
    """The Secret holding a human receiver's credential (names are DNS-1123 labels)."""
    return "redline-escalation-" + _DNS_LABEL.sub("-", receiver.lower())


def escalation_secret_keys(receiver: HumanReceiver) -> list[SecretKey]:
    """The Secret keys one human receiver of the spec needs (none for a token-less webhook)."""
    name = escalation_secret_name(receiver.name)
    who = f"Alertmanager, receiver {receiver.name}"
    if receiver.slack is not None:
        return [SecretKey(name, "api-url", f"{who}: the Slack incoming-webhook URL")]
    if receiver.pagerduty is not None:
        if receiver.pagerduty.routing_key_file is not None:
            return [SecretKey(name, "routing-key", f"{who}: the PagerDuty Events v2 routing key")]
        return [SecretKey(name, "service-key", f"{who}: the PagerDuty service key")]
    if receiver.email is not None:
        if receiver.email.auth_username is None:
            return []
        return [SecretKey(name, "password", f"{who}: the SMTP password")]
    assert receiver.webhook is not None, "the spec holds exactly one target per receiver"
    if receiver.webhook.bearer_token_file is None:
        return []
    return [SecretKey(name, "token", f"{who}: the webhook's bearer token")]


def _ref(key: SecretKey) -> dict[str, str]:
    return {"name": key.secret, "key": key.key}


def _human_receiver(receiver: HumanReceiver, config: dict[str, Any]) -> dict[str, Any]:
    """The CRD form of one human receiver; `config` is alertmanager.yml's for it (templates)."""
    keys = escalation_secret_keys(receiver)
    if receiver.slack is not None:
        slack = config["slack_configs"][0]
        return {
            "name": receiver.name,
            "slackConfigs": [
                {
                    "sendResolved": slack["send_resolved"],
                    "apiURL": _ref(keys[0]),
                    "channel": slack["channel"],
                    "text": slack["text"],
                }
            ],
        }
    if receiver.pagerduty is not None:
        pager = config["pagerduty_configs"][0]
        entry: dict[str, Any] = {"sendResolved": pager["send_resolved"]}
        field = "routingKey" if keys[0].key == "routing-key" else "serviceKey"
        entry[field] = _ref(keys[0])
        if "url" in pager:
            entry["url"] = pager["url"]
        entry["description"] = pager["description"]
        entry["severity"] = pager["severity"]
        entry["details"] = [{"key": k, "value": v} for k, v in pager["details"].items()]
        return {"name": receiver.name, "pagerdutyConfigs": [entry]}
    if receiver.email is not None:
        mail = config["email_configs"][0]
        email: dict[str, Any] = {
            "sendResolved": mail["send_resolved"],
            "to": mail["to"],
            "from": mail["from"],
            "smarthost": mail["smarthost"],
            "requireTLS": mail["require_tls"],
        }
        if keys:
            email["authUsername"] = mail["auth_username"]
            email["authPassword"] = _ref(keys[0])
        return {"name": receiver.name, "emailConfigs": [email]}
    hook = config["webhook_configs"][0]
    webhook: dict[str, Any] = {
        "url": hook["url"],
        "sendResolved": hook["send_resolved"],
        "maxAlerts": hook["max_alerts"],
    }
    if keys:
        webhook["httpConfig"] = _bearer(keys[0])
    return {"name": receiver.name, "webhookConfigs": [webhook]}


def _bearer(key: SecretKey) -> dict[str, Any]:
    return {"authorization": {"type": "Bearer", "credentials": _ref(key)}}


def _route(route: dict[str, Any]) -> dict[str, Any]:
    """One alertmanager.yml route in the CRD's schema (child routes likewise)."""
    out: dict[str, Any] = {"receiver": route["receiver"]}
    if route.get("group_by"):
        out["groupBy"] = list(route["group_by"])
    for source, target in (
        ("group_wait", "groupWait"),
        ("group_interval", "groupInterval"),
        ("repeat_interval", "repeatInterval"),
    ):
        if source in route:
            out[target] = route[source]
    if route.get("matchers"):
        out["matchers"] = [parse_matcher(m) for m in route["matchers"]]
    if "continue" in route:
        out["continue"] = route["continue"]
    if route.get("routes"):
        out["routes"] = [_route(child) for child in route["routes"]]
    return out


def build_alertmanager_config_resource(
    spec: Spec,
    groups: list[RuleGroup],
    name: str,
    namespace: str,
    labels: dict[str, str],
    webhook_token: SecretKey,
) -> dict[str, Any]:
    """The AlertmanagerConfig: redline's routes, its webhook receiver (`spec.receiver.url`,
    bearer token from `webhook_token`) and the spec's human receivers, secrets by reference."""
    plain = build_alertmanager_config(spec, groups)
    humans = {r.name: r for r in (spec.escalation.receivers if spec.escalation else ())}
    receivers: list[dict[str, Any]] = []
    for receiver in plain["receivers"]:
        if receiver["name"] == RECEIVER:
            hook = receiver["webhook_configs"][0]
            receivers.append(
                {
                    "name": RECEIVER,
                    "webhookConfigs": [
                        {
                            "url": hook["url"],
                            "sendResolved": hook["send_resolved"],
                            "maxAlerts": hook["max_alerts"],
                            "httpConfig": _bearer(webhook_token),
                        }
                    ],
                }
            )
        else:
            receivers.append(_human_receiver(humans[receiver["name"]], receiver))
    inhibit = [
        {
            "sourceMatch": [parse_matcher(m) for m in rule["source_matchers"]],
            "targetMatch": [parse_matcher(m) for m in rule["target_matchers"]],
            "equal": list(rule["equal"]),
        }
        for rule in plain["inhibit_rules"]
    ]
    return {
        "apiVersion": ALERTMANAGER_CONFIG_API,
        "kind": "AlertmanagerConfig",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"route": _route(plain["route"]), "receivers": receivers, "inhibitRules": inhibit},
    }


def escalation_secrets(spec: Spec) -> list[SecretKey]:
    """Every Secret key the spec's human receivers need, in the spec's order."""
    if spec.escalation is None:
        return []
    owners: dict[str, str] = {}
    for receiver in spec.escalation.receivers:
        secret = escalation_secret_name(receiver.name)
        if secret in owners:
            raise AlertingBuildError(
                f"receivers {owners[secret]} and {receiver.name} would share the Secret "
                f"{secret}: rename one"
            )
        owners[secret] = receiver.name
    return [key for r in spec.escalation.receivers for key in escalation_secret_keys(r)]
