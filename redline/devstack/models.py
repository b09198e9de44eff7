"""The demo adapter's versions: their files, their snapshots and their measured baselines.

`redline up` writes three versions of the `chat-lora` adapter (weights, config and a `version`
file, as a LoRA directory holds), records them in the snapshot registry (v1 active), and, once
the gateway runs, measures each version through it: P99 latency (estimated from the spec's
histogram buckets exactly as Prometheus's `histogram_quantile` would, so the rollback gate
compares like with like), golden-set accuracy and the reference answers the rollback's
continuity check compares against. Each is then marked verified with those baselines: v2 and v3
are releases that passed their checks before they were rolled out and regress in production
when a drill injects the fault (v2 on latency and accuracy, v3 on latency only).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from redline.devstack.layout import ADAPTER, ADAPTER_VERSIONS, BASE_MODEL, StackLayout
from redline.platform.golden import GOLDEN_SET, accuracy, fetch_golden_answers
from redline.platform.prometheus import PrometheusClient, PrometheusError
from redline.platform.snapshots import Baselines, Snapshot, SnapshotRegistry
from redline.slo import catalog

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


class BaselineError(Exception):
    """A version could not be measured (the gateway or a simulator did not answer)."""


def build_adapter_files(version: str) -> dict[str, bytes]:
    """The files of one adapter version: deterministic pseudo-weights, a config, its version."""
    seed = hashlib.sha256(f"{ADAPTER}:{version}".encode()).digest()
    weights = b"".join(
        hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(2048)
    )  # 64 KiB
    config = {
        "base_model_name_or_path": BASE_MODEL,
        "peft_type": "LORA",
        "r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.05,
        "target_modules": ["q_proj", "v_proj"],
        "revision": version,
    }
    return {
        WEIGHTS_FILE: weights,
        CONFIG_FILE: (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
        "version": f"{version}\n".encode(),
    }


def write_adapters(layout: StackLayout) -> None:
    """Write every version's files under the run directory."""
    for version in ADAPTER_VERSIONS:
        directory = layout.adapter_dir(version)
        directory.mkdir(parents=True, exist_ok=True)
        for name, content in build_adapter_files(version).items():
            (directory / name).write_bytes(content)


def create_snapshots(layout: StackLayout) -> list[Snapshot]:
    """Record every version in the registry (oldest first) and make the first one active."""
    registry = SnapshotRegistry(layout.snapshots_dir)
    snapshots = [
        registry.create(
            ADAPTER,
            version,
            layout.adapter_dir(version) / WEIGHTS_FILE,
            layout.adapter_dir(version) / CONFIG_FILE,
            adapter=ADAPTER,
        )
        for version in ADAPTER_VERSIONS
    ]
    registry.activate(ADAPTER, snapshots[0].snapshot_id)
    return snapshots


def build_histogram_quantile(
    values: Sequence[float], buckets: Sequence[float], quantile: float
) -> float:
    """The quantile Prometheus's `histogram_quantile` reports for `values` in these buckets."""
    if not values:
        raise ValueError("no values")
    bounds = sorted(buckets)
    counts = [sum(1 for v in values if v <= bound) for bound in bounds]
    total = len(values)
    rank = quantile * total
    lower, below = 0.0, 0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            inside = cumulative - below
            if inside == 0:
                return bound
            return lower + (bound - lower) * (rank - below) / inside
        lower, below = bound, cumulative
    return bounds[-1]  # the +Inf bucket: Prometheus answers the highest finite bound


@dataclass(frozen=True)
class Measurement:
    """What one version measured through the gateway."""

    version: str
    p99_seconds: float
    accuracy: float
    samples: int
    reference_answers: dict[str, str]
    served_versions: dict[str, int]

    def baselines(self) -> Baselines:
        """The snapshot baselines recorded from this measurement."""
        return Baselines(
            p99_seconds=self.p99_seconds,
            accuracy_ratio=self.accuracy,
            samples=self.samples,
            reference_answers=self.reference_answers,
        )


def load_adapter(client: httpx.Client, simulator_urls: Sequence[str], path: str) -> None:
    """Serve the adapter at `path` on every simulator (vLLM's runtime LoRA API, in place)."""
    for url in simulator_urls:
        body = {"lora_name": ADAPTER, "lora_path": path, "load_inplace": True}
        response = client.post(f"{url}/v1/load_lora_adapter", json=body)
        if response.status_code != 200:
            raise BaselineError(
                f"{url}: loading {ADAPTER} from {path}: HTTP {response.status_code}: "
                f"{response.text[:200]}"
            )


def _timed_request(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, str]:
    started = time.perf_counter()
    response = client.post(url, json=body)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise BaselineError(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
    return elapsed, response.headers.get("x-redline-model-version", "unknown")


def measure_version(
    gateway_url: str,
    version: str,
    buckets: Sequence[float],
    requests: int,
    concurrency: int = 4,
    golden_rounds: int = 1,
    warmup: int = 20,
) -> Measurement:
    """Send `requests` chat requests and the golden set `golden_rounds` times via the gateway."""
    url = gateway_url.rstrip("/") + "/v1/chat/completions"
    body = {
        "model": ADAPTER,
        "messages": [{"role": "user", "content": "Summarize the benefits of error budgets."}],
        "max_tokens": 48,
    }
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        try:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                # Warm the connection pools and caches first: only the steady state counts.
                list(pool.map(lambda _: _timed_request(client, url, body), range(warmup)))
                results = list(
                    pool.map(lambda _: _timed_request(client, url, body), range(requests))
                )
            answers = [
                answer
                for _ in range(golden_rounds)
                for answer in fetch_golden_answers(client, gateway_url, ADAPTER, GOLDEN_SET)
            ]
        except httpx.HTTPError as exc:
            raise BaselineError(f"measuring {ADAPTER} {version}: {exc}") from exc
    served: dict[str, int] = {}
    for _, served_version in results:
        served[served_version] = served.get(served_version, 0) + 1
    if set(served) != {version}:
        raise BaselineError(f"asked {version} but the gateway served versions {served}")
    latencies = [seconds for seconds, _ in results]
    p99 = build_histogram_quantile(latencies, buckets, 0.99)
    references = {answer.item.id: answer.answer for answer in answers[: len(GOLDEN_SET)]}
    return Measurement(
        version=version,
        p99_seconds=round(max(p99, 1e-3), 6),
        accuracy=accuracy(answers),
        samples=len(latencies) + len(answers),
        reference_answers=references,
        served_versions=served,
    )


VERSION_CACHE_SECONDS = 1.2
"""A little over the gateway's default `version_ttl_seconds` (1 s): after a switch its cached
active version has expired before the measurement starts."""


def record_baselines(
    layout: StackLayout,
    gateway_url: str,
    simulator_urls: Sequence[str],
    buckets: Sequence[float],
    requests: int,
) -> list[Measurement]:
    """Measure every version through the gateway, mark each verified, serve the first again.

    Each version is made active in the registry before it is measured: the gateway (and the
    exporter) stamp `model_version` from the active pointer, not from the engine.
    """
    registry = SnapshotRegistry(layout.snapshots_dir)
    snapshots = {s.version: s for s in registry.list(ADAPTER)}
    measurements = []
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        try:
            for index, version in enumerate(ADAPTER_VERSIONS):
                registry.activate(ADAPTER, snapshots[version].snapshot_id)
                load_adapter(client, simulator_urls, str(layout.adapter_dir(version)))
                time.sleep(VERSION_CACHE_SECONDS)
                # The stack's parts are still settling when the first version is measured.
                warmup = 150 if index == 0 else 20
                measurement = measure_version(
                    gateway_url, version, buckets, requests, warmup=warmup
                )
                registry.mark_verified(
                    ADAPTER, snapshots[version].snapshot_id, measurement.baselines()
                )
                measurements.append(measurement)
        finally:
            registry.activate(ADAPTER, snapshots[ADAPTER_VERSIONS[0]].snapshot_id)
            load_adapter(client, simulator_urls, str(layout.adapter_dir(ADAPTER_VERSIONS[0])))
    return measurements


def wait_for_active_version(prometheus_url: str, timeout: float = 60.0) -> float:
    """Wait until Prometheus joins engine series to the first version again (a stack without
    a gateway); the seconds it took.

    Measuring the baselines leaves each version active in turn; until the exporter's next
    probe is scraped and the join rule evaluated, the newest version's label is still the one
    Prometheus stamps on requests. A stack is up only once it reports what it serves.
    """
    query = f'{catalog.MODEL_ACTIVE_VERSION_RECORD}{{{catalog.LABEL_MODEL}="{ADAPTER}"}}'
    wanted = {ADAPTER_VERSIONS[0]}
    started = time.monotonic()
    seen: set[str] = set()
    with PrometheusClient(prometheus_url, timeout=5.0, trust_env=False) as prometheus:
        while time.monotonic() - started < timeout:
            try:
                series = prometheus.instant(query)
            except PrometheusError:
                series = []
            seen = {labels.get(catalog.LABEL_MODEL_VERSION, "") for labels, _ in series}
            if seen == wanted:
                return time.monotonic() - started
            time.sleep(0.25)
    raise BaselineError(
        f"Prometheus still shows {ADAPTER} versions {sorted(seen)} after {timeout:g} s "
        f"({ADAPTER_VERSIONS[0]} is active in the registry): {query}"
    )


def describe(measurement: Measurement) -> str:
    """One line for `redline up`."""
    return (
        f"{ADAPTER} {measurement.version}: baseline p99 {measurement.p99_seconds:.3f} s, "
        f"accuracy {measurement.accuracy:.3f} on {measurement.samples} requests "
        f"(verified; {len(measurement.reference_answers)} reference answers)"
    )


__all__ = [
    "BaselineError",
    "Measurement",
    "build_adapter_files",
    "build_histogram_quantile",
    "create_snapshots",
    "describe",
    "measure_version",
    "record_baselines",
    "wait_for_active_version",
    "write_adapters",
]
