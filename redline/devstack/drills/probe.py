"""The drills' view of the running stack over its APIs: Prometheus, the remediation receiver, the
simulators' fault knobs and LoRA API, and the files of the run directory.

A region is several simulator pods behind its service front: what the drills set per region
(faults, the served adapter) is set on every pod directly, never through the front (which would
reach one pod per call)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from redline.devstack.drills.base import DrillError, exposition_total, matching_alerts
from redline.devstack.fakes.lora import adapter_version
from redline.devstack.layout import ADAPTER, Endpoints, StackLayout
from redline.devstack.loadgen import summarize_stats
from redline.devstack.state import StackState
from redline.platform.prometheus import PrometheusClient


def open_prometheus(endpoints: Endpoints, timeout: float = 10.0) -> PrometheusClient:
    """A client of the stack's (global) Prometheus; no retries: the drills poll anyway."""
    return PrometheusClient(endpoints.prometheus_url, timeout=timeout, retries=0, trust_env=False)


class StackProbe:
    """The drills' view of the stack over its APIs (Prometheus, receiver, simulators, files)."""

    def __init__(self, state: StackState, http: httpx.Client, prometheus: PrometheusClient) -> None:
        self.state = state
        self.endpoints: Endpoints = state.endpoints()
        self.layout: StackLayout = state.layout()
        self.http = http
        self.prometheus = prometheus
        self.token = self.layout.token_file.read_text("utf-8").strip()

    def alerts(self, name: str, labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Prometheus's active alerts called `name` with these labels (pending or firing)."""
        return matching_alerts(self.prometheus.alerts(), name, labels)

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query's series and values."""
        return self.prometheus.instant(promql)

    def query_range(
        self, promql: str, start: float, end: float, step: float
    ) -> list[tuple[float, float]]:
        """A range query's samples of its first series (time, value)."""
        series = self.prometheus.range(promql, start, end, step)
        return series[0][1] if series else []

    def value(self, promql: str) -> float | None:
        """The single value of an instant query, None when it has no series."""
        series = self.query(promql)
        return series[0][1] if series else None

    def jobs(self, playbook: str) -> list[dict[str, Any]]:
        """The receiver's recent jobs of a playbook, newest first."""
        response = self.http.get(
            f"{self.endpoints.receiver_url}/jobs",
            params={"playbook": playbook, "limit": 200},
            headers={"Authorization": f"Bearer {self.token}"},
        )
        response.raise_for_status()
        jobs: list[dict[str, Any]] = response.json()["jobs"]
        return jobs

    def job(self, job_id: str) -> dict[str, Any]:
        """One job with its recorded steps (the list endpoint leaves steps out)."""
        response = self.http.get(
            f"{self.endpoints.receiver_url}/jobs/{job_id}",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        response.raise_for_status()
        job: dict[str, Any] = response.json()
        return job

    def audit(self) -> list[dict[str, Any]]:
        """The receiver's audit trail mirror (JSONL)."""
        try:
            lines = self.layout.audit_file.read_text("utf-8").splitlines()
        except FileNotFoundError:
            return []
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue  # a line being written right now
        return records

    def faults(self, region: str) -> dict[str, Any]:
        """A region's fault knobs (its first pod's: `set_faults` sets every pod alike)."""
        response = self.http.get(f"{self.endpoints.pod_urls(region)[0]}/admin/faults")
        response.raise_for_status()
        faults: dict[str, Any] = response.json()
        return faults

    def set_faults(self, region: str, faults: Mapping[str, Any]) -> None:
        """Replace the fault knobs of every pod of a region."""
        for index, url in enumerate(self.endpoints.pod_urls(region)):
            response = self.http.post(f"{url}/admin/faults", json=dict(faults))
            if response.status_code != 200:
                raise DrillError(f"{region} pod {index}: faults rejected: HTTP "
                                 f"{response.status_code}: {response.text[:300]}")  # fmt: skip

    def load_adapter(self, version_dir: str) -> None:
        """Serve the adapter at `version_dir` on every pod of every region (vLLM's runtime LoRA
        API, in place)."""
        body = {"lora_name": ADAPTER, "lora_path": version_dir, "load_inplace": True}
        for pod, url in self.pod_urls().items():
            response = self.http.post(f"{url}/v1/load_lora_adapter", json=body)
            if response.status_code != 200:
                raise DrillError(f"{pod}: load {version_dir}: HTTP {response.status_code}")

    def pod_urls(self) -> dict[str, str]:
        """`<region>-<n>` -> base URL of every simulator pod."""
        return {
            f"{region}-{index}": url
            for region in self.endpoints.regions
            for index, url in enumerate(self.endpoints.pod_urls(region))
        }

    def pod_versions(self) -> dict[str, str]:
        """`<region>-<n>` -> version of the adapter each pod serves, read from the pod's own
        `/v1/models` (the adapter's `root`, as the rollback reads it) and `/admin/stats`;
        `A|B` when the two disagree, `none` when the pod serves no such adapter."""
        versions = {}
        for pod, url in self.pod_urls().items():
            models = self.http.get(f"{url}/v1/models").json()["data"]
            root = next((m.get("root") for m in models if m.get("id") == ADAPTER), None)
            stats = self.http.get(f"{url}/admin/stats").json()
            served = stats["adapters"].get(ADAPTER, {}).get("version", "none")
            listed = "none" if root is None else adapter_version(str(root))
            versions[pod] = served if listed == served else f"{listed}|{served}"
        return versions

    def served_versions(self) -> dict[str, str]:
        """Region -> version of the adapter its pods serve (`mixed: ...` when they differ)."""
        by_region: dict[str, set[str]] = {region: set() for region in self.endpoints.regions}
        for pod, version in self.pod_versions().items():
            by_region[pod.rsplit("-", 1)[0]].add(version)
        return {
            region: next(iter(seen)) if len(seen) == 1 else "mixed: " + ", ".join(sorted(seen))
            for region, seen in by_region.items()
        }

    def gateway_total(self, name: str, **labels: str) -> float:
        """Sum of the gateway's /metrics samples called `name` whose labels include `labels`."""
        response = self.http.get(f"{self.endpoints.gateway_url}/metrics")
        response.raise_for_status()
        return exposition_total(response.text, name, labels)

    def loadgen_failures(self) -> dict[str, int]:
        """Requests the load generator saw fail so far, by HTTP status (or `error`)."""
        stats = summarize_stats(self.layout.loadgen_stats) or {}
        statuses: dict[str, int] = stats.get("statuses", {})
        return {status: int(n) for status, n in statuses.items() if status != "200"}


__all__ = ["StackProbe", "open_prometheus"]
