"""The reroute playbook's restore as the drills see it: the running worker's settings and how
long a restore may take after the repair."""

from __future__ import annotations

import yaml
from pydantic import ValidationError

from redline.devstack.drills.base import DrillError
from redline.devstack.layout import StackLayout
from redline.remediation.settings import RerouteSettings
from redline.slo.spec import Spec

WORKER_PART = "remediation-worker"


def restore_bound(restore_for: float, check_seconds: float, spec: Spec, federated: bool) -> float:
    """The longest repair -> restore accepted: the restore period of healthy checks, the
    exporter's probe reaching Prometheus (scrapes and an evaluation), and five checks of slack
    (a check still in flight at the repair, the exporter's next probe, the probes of each
    check, a loaded machine)."""
    t = spec.timing
    scrapes = 2 if federated else 1
    return (
        restore_for
        + 5 * check_seconds
        + scrapes * t.scrape_interval_seconds
        + t.evaluation_interval_seconds
    )


def restore_for_seconds(settings: RerouteSettings, spec: Spec) -> float:
    """The restore period the worker holds to: its override, else the spec's."""
    if settings.restore_for_seconds is not None:
        return settings.restore_for_seconds
    return spec.red_lines.latency_p99.restore.for_seconds


def load_reroute_settings(layout: StackLayout) -> RerouteSettings:
    """The `reroute` section the running worker was started with (its settings file)."""
    path = layout.settings_file(WORKER_PART)
    try:
        data = yaml.safe_load(path.read_text("utf-8")) or {}
        return RerouteSettings.model_validate(data.get("reroute") or {})
    except (OSError, yaml.YAMLError, ValidationError, AttributeError) as exc:
        raise DrillError(f"cannot read the reroute settings in {path}: {exc}") from None


__all__ = ["WORKER_PART", "load_reroute_settings", "restore_bound", "restore_for_seconds"]
