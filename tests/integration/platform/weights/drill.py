"""What the two weights drills share (`test_drill_shard_tamper.py`,
`test_drill_region_bucket_loss.py`): the real exporter app serving the weights probe, a real
Prometheus loading the generated weights rules and a real Alertmanager on the generated config
sending to the real receiver, the drill's timeline read from them, and its result table.

The local stack (`redline up`) runs no S3 server and no HSM, so the drills run here, against
the SeaweedFS and SoftHSM2 of the weights tests, rather than as `redline drill NAME`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from redline.core.servers import serve_in_thread
from redline.devstack.processes import start_alertmanager, start_prometheus
from redline.exporters.app import build_exporter_app
from redline.exporters.settings import ExporterSettings
from redline.exporters.weights import WeightsProbe
from redline.platform.prometheus import PrometheusClient
from redline.remediation.audit import AuditLog
from redline.rules.alertmanager import build_alertmanager_config
from redline.rules.build import build_rule_groups
from redline.rules.families import weights
from redline.rules.render import render_rule_file
from redline.slo.alerts import Alert
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import Receiver, Spec
from tests.support.remediation import wait_for

PROBE_SECONDS = 0.5
"""The weights probe's interval in the drills (30 s by default)."""


def drill_spec(receiver_url: str, token_file: Path, **updates: Any) -> Spec:
    """The default spec with the local profile's timings (1 s scrape and evaluation, 1 s
    group_wait, 2 s `for`), alerts sent to `receiver_url`; `updates` replace top-level fields."""
    spec = apply_profile(load_spec().spec, "local")
    receiver = Receiver(url=f"{receiver_url}/alerts", bearer_token_file=str(token_file))
    return spec.model_copy(update={"receiver": receiver, **updates})


@contextmanager
def monitoring(tmp: Path, spec: Spec, probe: WeightsProbe) -> Iterator[PrometheusClient]:
    """The exporter app serving `probe`, Prometheus scraping it every second with the generated
    weights rules, Alertmanager on the generated config; a client of that Prometheus."""
    tmp.mkdir(parents=True, exist_ok=True)
    am_config = tmp / "alertmanager.yml"
    built = build_alertmanager_config(spec, build_rule_groups(spec))
    am_config.write_text(yaml.safe_dump(built, sort_keys=False))
    rules = tmp / "weights.rules.yml"
    rules.write_text(render_rule_file(weights.build_rules(spec), "drill"))
    exporter = build_exporter_app(ExporterSettings(), spec, probes=[probe])
    with ExitStack() as stack:
        server = stack.enter_context(serve_in_thread(exporter.app, access_log=False))
        am = start_alertmanager(tmp / "am", am_config)
        stack.callback(am.stop)
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "alerting": {"alertmanagers": [
                {"static_configs": [{"targets": [am.url.removeprefix("http://")]}]}]},
            "scrape_configs": [{"job_name": "redline-exporters", "static_configs": [
                {"targets": [server.url.removeprefix("http://")]}]}],
        }))  # fmt: skip
        prometheus = start_prometheus(tmp / "prom", config)
        stack.callback(prometheus.stop)
        client = PrometheusClient(prometheus.url, timeout=5, retries=0, trust_env=False)
        stack.callback(client.close)
        yield client


def fired_at(
    prometheus: PrometheusClient, alert: Alert, hold: float = 0.0, **labels: str
) -> float | None:
    """While `alert` (with `labels`) fires, when it began to: Prometheus' `activeAt` (when its
    condition first held) plus `hold`, the rule's `for`; else None."""
    for found in prometheus.alerts():
        got = found["labels"]
        if got.get("alertname") != alert or found["state"] != "firing":
            continue
        if all(got.get(k) == v for k, v in labels.items()):
            return parse_time(found["activeAt"]) + hold
    return None


def active(prometheus: PrometheusClient, alert: Alert) -> bool:
    """Whether `alert` is pending or firing in Prometheus (its `ALERTS` series)."""
    return bool(prometheus.instant(f'ALERTS{{alertname="{alert}"}}'))


def parse_time(text: str) -> float:
    """Epoch seconds of an RFC 3339 time as Prometheus writes it (nanoseconds cut)."""
    head, dot, rest = text.partition(".")
    if not dot:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    digits = len(rest) - len(rest.lstrip("0123456789"))
    zone = rest[digits:].replace("Z", "+00:00")
    return datetime.fromisoformat(f"{head}.{rest[: min(digits, 6)]:0<6}{zone}").timestamp()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """`wait_for` polling every 0.1 s (Prometheus' API and the audit chain, not a Redis key)."""
    return wait_for(predicate, timeout, 0.1, what)


def acknowledged(audit: AuditLog, alert: Alert, status: str) -> float | None:
    """When the receiver audited a notification of `alert` with `status` (firing, resolved)
    that named no playbook; None before."""
    for line in audit.records():
        record = json.loads(line)
        data = record["data"]
        if (
            record["kind"] == "alert.acknowledged"
            and data.get("alertname") == alert
            and data.get("status") == status
        ):
            return datetime.fromisoformat(record["ts"]).timestamp()
    return None


@dataclass
class Timeline:
    """A drill's steps, each in seconds after the fault (None: did not happen or not
    applicable), and its own checks."""

    drill: str
    fault_at: float
    steps: dict[str, float | None] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)

    def mark(self, step: str, at: float | None) -> None:
        """Record `step` at the epoch time `at`."""
        self.steps[step] = None if at is None else at - self.fault_at

    def render(self) -> str:
        """The result table (Markdown): one row per step, then the drill's checks."""
        fault = time.strftime("%H:%M:%S", time.gmtime(self.fault_at))
        lines = [f"drill {self.drill}: fault at {fault} UTC", "| step | after fault (s) |",
                 "|---|---|"]  # fmt: skip
        for step, seconds in self.steps.items():
            lines.append(f"| {step} | {'-' if seconds is None else f'{seconds:.2f}'} |")
        lines += ["", "| check | result |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in self.checks.items()]
        return "\n".join(lines)
