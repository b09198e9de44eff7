"""Multi-region Prometheus on one machine: one Prometheus per region and a global one.

Each regional Prometheus scrapes its region's targets and stamps `external_labels: {region}`;
the global Prometheus federates them (`/federate` with `match[]`, `honor_labels: true`, so a
series keeps the `region` it already carries, such as the gateway's origin region, and gets the
regional Prometheus' region otherwise), evaluates the generated rule file (every rule
aggregates across regions: the per-region P99, the SLO burn rates, the rollback gate) and sends
alerts to Alertmanager. Regional Prometheus servers evaluate nothing, so no alert fires twice.

Pure builders over the single-Prometheus config of the local stack
(`redline.devstack.config.build_prometheus_config`); in compose, Thanos sidecars and Thanos Query
take the global role.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from redline.rules.model import format_duration
from redline.slo.spec import Spec

GLOBAL_PART = "prometheus"
"""The global Prometheus keeps the single-region part's name: drills and URLs query it."""
SELF_JOB = "prometheus"
FEDERATED_PREFIXES = ("llm", "vectordb", "session", "model", "embedding", "redline")
"""Name prefixes of the catalog's series (DESIGN.md): what the global rules and dashboards read."""
FEDERATED_NAMES = ("up",)


class MultiRegionError(Exception):
    """The multi-region topology cannot be built as asked."""


@dataclass(frozen=True)
class MultiRegionConfigs:
    """prometheus.yml of each regional Prometheus (by region) and of the global one."""

    regional: dict[str, dict[str, Any]]
    global_: dict[str, Any]

    def parts(self) -> dict[str, dict[str, Any]]:
        """Config by stack part name: `prometheus-<region>` and `prometheus` (global)."""
        return {
            **{regional_part(r): c for r, c in self.regional.items()},
            GLOBAL_PART: self.global_,
        }


def regional_part(region: str) -> str:
    """The stack part name of a region's Prometheus."""
    return f"prometheus-{region}"


def select_regions(spec: Spec, count: int | None) -> tuple[str, ...]:
    """The first `count` regions of the spec in failover order (`redline up --regions N`)."""
    if count is None:
        return spec.regions
    if not 1 <= count <= len(spec.regions):
        raise MultiRegionError(
            f"--regions {count}: the spec has {len(spec.regions)} region(s) "
            f"({', '.join(spec.regions)}); allowed: 1 to {len(spec.regions)}"
        )
    return spec.regions[:count]


def federate_match(extra: Sequence[str] = ()) -> list[str]:
    """The `match[]` selectors the global Prometheus federates (plus `extra` ones: an engine's
    own series, which its mirror recordings read, carry none of the catalog's prefixes)."""
    names = "|".join(FEDERATED_NAMES)
    prefixes = "|".join(FEDERATED_PREFIXES)
    return [f'{{__name__=~"({prefixes})_.+"}}', f'{{__name__=~"{names}"}}', *extra]


def _jobs(base: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    jobs: dict[str, dict[str, Any]] = {}
    for job in base.get("scrape_configs", []):
        jobs[str(job["job_name"])] = dict(job)
    return jobs


def _self_job(address: str) -> dict[str, Any]:
    return {"job_name": SELF_JOB, "static_configs": [{"targets": [address]}]}


def build_regional_config(
    spec: Spec, base: Mapping[str, Any], region: str, address: str, jobs: Sequence[str]
) -> dict[str, Any]:
    """A region's Prometheus: `jobs` of `base` plus itself, `external_labels.region`, no rules."""
    available = _jobs(base)
    unknown = sorted(set(jobs) - set(available))
    if unknown:
        raise MultiRegionError(
            f"scrape jobs {', '.join(unknown)} are not in the base config "
            f"(jobs: {', '.join(sorted(available))})"
        )
    glob = dict(base.get("global", {}))
    glob["external_labels"] = {**glob.get("external_labels", {}), "region": region}
    scrape = [available[name] for name in jobs if name != SELF_JOB]
    return {"global": glob, "scrape_configs": [*scrape, _self_job(address)]}


def build_global_config(
    spec: Spec,
    base: Mapping[str, Any],
    regional_addresses: Mapping[str, str],
    address: str,
    extra_match: Sequence[str] = (),
) -> dict[str, Any]:
    """The global Prometheus: federates every region, keeps the base rules and alerting."""
    glob = dict(base.get("global", {}))
    interval = format_duration(spec.timing.scrape_interval_seconds)
    federate = [
        {
            "job_name": f"federate-{region}",
            "honor_labels": True,
            # /federate stamps each sample with its own time, and Prometheus writes no staleness
            # marker when a timestamped series disappears: an exporter gone from its region
            # would look alive globally for the 5 min lookback (no SLIAbsent). Stamping samples
            # at federation time restores staleness, at the cost of one scrape of delay.
            "honor_timestamps": False,
            "metrics_path": "/federate",
            "params": {"match[]": federate_match(extra_match)},
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "static_configs": [{"targets": [target]}],
        }
        for region, target in regional_addresses.items()
    ]
    config: dict[str, Any] = {"global": glob}
    for key in ("rule_files", "alerting"):
        if key in base:
            config[key] = base[key]
    config["scrape_configs"] = [*federate, _self_job(address)]
    return config


def build_multiregion_configs(
    spec: Spec,
    base: Mapping[str, Any],
    addresses: Mapping[str, str],
    job_regions: Mapping[str, str] | None = None,
    extra_match: Sequence[str] = (),
) -> MultiRegionConfigs:
    """Every Prometheus config of the topology.

    `addresses` maps each stack part (`prometheus-<region>` and `prometheus`) to host:port.
    `job_regions` maps a scrape job of `base` to the region whose Prometheus scrapes it; jobs
    not named go to the first region (the stack's services run there). `extra_match` adds
    `match[]` selectors to the federation (an engine's own series).
    """
    regions = [part.removeprefix("prometheus-") for part in addresses if part != GLOBAL_PART]
    missing = [r for r in regions if r not in spec.regions]
    if missing or GLOBAL_PART not in addresses or not regions:
        raise MultiRegionError(
            f"addresses need {GLOBAL_PART!r} and prometheus-<region> for regions of the spec "
            f"({', '.join(spec.regions)}); got {', '.join(addresses)}"
        )
    job_regions = dict(job_regions or {})
    stray = sorted(r for r in job_regions.values() if r not in regions)
    if stray:
        raise MultiRegionError(f"jobs assigned to regions without a Prometheus: {stray}")
    by_region: dict[str, list[str]] = {region: [] for region in regions}
    for job in _jobs(base):
        if job != SELF_JOB:
            by_region[job_regions.get(job, regions[0])].append(job)
    regional = {
        region: build_regional_config(
            spec, base, region, addresses[regional_part(region)], by_region[region]
        )
        for region in regions
    }
    regional_addresses = {region: addresses[regional_part(region)] for region in regions}
    return MultiRegionConfigs(
        regional,
        build_global_config(spec, base, regional_addresses, addresses[GLOBAL_PART], extra_match),
    )


def render_prometheus_config(config: Mapping[str, Any]) -> str:
    """prometheus.yml text (stable key order as built)."""
    return yaml.safe_dump(dict(config), sort_keys=False)


def write_multiregion_configs(directory: Path, configs: MultiRegionConfigs) -> dict[str, Path]:
    """Write `<part>.yml` for every Prometheus of the topology; return the paths by part."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for part, config in configs.parts().items():
        path = directory / f"{part}.yml"
        path.write_text(render_prometheus_config(config), "utf-8")
        paths[part] = path
    return paths
