"""The compose stack's service addresses and its Prometheus and Alertmanager configs.

`redline compose init` (`redline.generate.compose_config`) writes them to `compose/config/`
with the rule file and every service's settings; `compose/docker-compose.yml` mounts them.
Service names and ports are the compose file's: a test reads the compose file and checks them.
"""

from __future__ import annotations

from typing import Any

from redline.rules.alertmanager import build_alertmanager_config
from redline.rules.build import build_rule_groups
from redline.rules.model import format_duration
from redline.slo.spec import Receiver, Spec

RULE_FILE = "redline.rules.yml"
RULE_PATH = f"/etc/prometheus/rules/{RULE_FILE}"
TOKEN_PATH = "/run/secrets/webhook-token"
SERVICE_PORTS = {
    "redis": 6379,
    "prometheus": 9090,
    "alertmanager-1": 9093,
    "alertmanager-2": 9093,
    "thanos-sidecar": 10902,
    "gateway": 8080,
    "exporters": 9109,
    "remediation": 9095,
    "simulator-primary": 8000,
    "simulator-secondary": 8000,
    "milvus-primary": 19530,
    "milvus-replica": 19530,
}
"""Each compose service redline talks to -> the port it listens on inside its container."""


def compose_address(service: str) -> str:
    """`host:port` of a compose service on the compose network."""
    return f"{service}:{SERVICE_PORTS[service]}"


def compose_url(service: str, scheme: str = "http", database: int | None = None) -> str:
    """The URL of a compose service (`database`: a Redis db number)."""
    suffix = f"/{database if database is not None else 0}" if scheme == "redis" else ""
    return f"{scheme}://{compose_address(service)}{suffix}"


RECEIVER_URL = f"{compose_url('remediation')}/alerts"
ALERTMANAGERS = (compose_address("alertmanager-1"), compose_address("alertmanager-2"))
SCRAPE_TARGETS: dict[str, str | tuple[str, ...]] = {
    "gateway": compose_address("gateway"),
    "exporters": compose_address("exporters"),
    "remediation": compose_address("remediation"),
    "prometheus": f"localhost:{SERVICE_PORTS['prometheus']}",
    "alertmanager": ALERTMANAGERS,
    "thanos-sidecar": compose_address("thanos-sidecar"),
}


def build_compose_prometheus_config(spec: Spec) -> dict[str, Any]:
    """prometheus.yml of the compose stack: the first region's Prometheus, Thanos-ready."""
    timing = spec.timing
    jobs = []
    for job, targets in SCRAPE_TARGETS.items():
        listed = [targets] if isinstance(targets, str) else list(targets)
        jobs.append({"job_name": job, "static_configs": [{"targets": listed}]})
    return {
        "global": {
            "scrape_interval": format_duration(timing.scrape_interval_seconds),
            "evaluation_interval": format_duration(timing.evaluation_interval_seconds),
            # Thanos Query deduplicates on `replica` and tells regions apart by `region`.
            "external_labels": {
                "service": spec.service,
                "region": spec.regions[0],
                "replica": "prometheus-0",
            },
        },
        "rule_files": [RULE_PATH],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": list(ALERTMANAGERS)}]}]},
        "scrape_configs": jobs,
    }


def build_compose_alertmanager_config(spec: Spec) -> dict[str, Any]:
    """alertmanager.yml of the compose stack: the generated routes, to the compose receiver."""
    receiver = Receiver(url=RECEIVER_URL, bearer_token_file=TOKEN_PATH)
    compose_spec = spec.model_copy(update={"receiver": receiver})
    return build_alertmanager_config(compose_spec, build_rule_groups(compose_spec))
