"""The compose stack's Prometheus and Alertmanager configs, built from the spec.

`redline generate` writes them to `compose/generated/`; `compose/docker-compose.yml` mounts them
with the generated rule file and dashboards. Service names and ports are the compose file's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from redline.rules.alertmanager import build_alertmanager_config
from redline.rules.build import build_rule_groups
from redline.rules.model import format_duration
from redline.rules.render import render_yaml
from redline.slo.spec import Receiver, Spec

COMPOSE_DIR = Path("compose/generated")
PROMETHEUS_FILE = "prometheus.yml"
ALERTMANAGER_FILE = "alertmanager.yml"
RULE_PATH = "/etc/prometheus/rules/redline.rules.yml"
TOKEN_PATH = "/run/secrets/webhook-token"
RECEIVER_URL = "http://remediation:9095/alerts"
ALERTMANAGERS = ("alertmanager-1:9093", "alertmanager-2:9093")
SCRAPE_TARGETS = {
    "gateway": "gateway:8080",
    "exporters": "exporters:9109",
    "remediation": "remediation:9095",
    "prometheus": "localhost:9090",
    "alertmanager": ALERTMANAGERS,
    "thanos-sidecar": "thanos-sidecar:10902",
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


def build_compose_outputs(spec: Spec, source: str) -> dict[Path, str]:
    """The compose stack's generated files (path relative to the repo root) and their text."""
    return {
        COMPOSE_DIR / PROMETHEUS_FILE: render_yaml(build_compose_prometheus_config(spec), source),
        COMPOSE_DIR / ALERTMANAGER_FILE: render_yaml(
            build_compose_alertmanager_config(spec), source
        ),
    }
