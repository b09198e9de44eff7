"""Scrape cost: the exporter's `/metrics` against a bare prometheus-client registry, same series.

Starts real redis-server and Milvus Lite, two simulated regions and the gateway (in threads), a
snapshot registry and a drift reference, then the exporter with every probe enabled (each running
on its own short interval in the background throughout) plus a gateway-like
`llm_request_duration_seconds` histogram and `llm_requests_total` counter with >= 200 label
combinations. The bare registry holds the very same histogram and counter objects and plain
Gauge/Counter copies of every probe series, so both expositions carry the same samples (checked).

Scrapes alternate exporter / bare from one keep-alive client (so both see the same machine
state): over HTTP (uvicorn for both; identity and gzip) and in-process (`generate_latest`).
`_created` off is the exporter's default; both sides turn them off the library's way
(`disable_created_metrics`, process-wide, as the exporter does when built). Then the cost of
`_created` on vs off.

Target: exporter <= 1.1x the bare registry per scrape.
Run: `.venv/bin/python -m bench.scrape [--scrapes N] [--combos N]`.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import itertools
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis
import yaml
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    enable_created_metrics,
    generate_latest,
    make_asgi_app,
)
from prometheus_client.parser import text_string_to_metric_families

from bench.figures import BenchmarkError, Figure, at_most, check, exit_code, info
from redline.core.servers import serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.devstack.processes import start_milvus_lite, start_redis
from redline.exporters.app import Exporter, build_exporter_app
from redline.exporters.drift import encode_vector
from redline.exporters.settings import ExporterSettings
from redline.gateway import GatewaySettings, build_gateway_app
from redline.platform.index import MilvusTarget, TargetSpec
from redline.platform.sessions import DEFAULT_GROUP, DEFAULT_STREAM
from redline.platform.snapshots import Baselines, SnapshotRegistry
from redline.slo import catalog
from redline.slo.load import default_spec_text, parse_spec
from redline.slo.spec import Spec

TARGET_RATIO = 1.1


def gateway_like(spec: Spec, combos: int, seed: int = 1) -> tuple[Histogram, Counter]:
    """The gateway's latency histogram and request counter with `combos` label combinations."""
    duration, requests_total = catalog.LLM_REQUEST_DURATION_SECONDS, catalog.LLM_REQUESTS_TOTAL
    histogram = Histogram(
        duration.family,
        duration.help,
        duration.labels,
        buckets=spec.sources.buckets,
        registry=None,
    )
    requests = Counter(
        requests_total.family, requests_total.help, requests_total.labels, registry=None
    )
    rng = np.random.default_rng(seed)
    regions = spec.regions
    models = [f"model-{i}" for i in range(max(1, combos // 36 + 1))]
    space = itertools.product(
        regions, regions, models, ("v1", "v2", "v3"), ("200", "429", "500", "503")
    )
    made = 0
    for region, served, model, version, status in space:
        if made >= combos:
            break
        labels = (region, served, str(region != served).lower(), model, version, status)
        for value in rng.gamma(2.0, 0.15, size=20):
            histogram.labels(*labels).observe(float(value))
        requests.labels(*labels).inc(20)
        made += 1
    if made < combos:
        raise BenchmarkError(f"label space too small for {combos} combinations")
    return histogram, requests


def mirror_registry(exporter: Exporter, extra: list[Any]) -> CollectorRegistry:
    """A bare registry with the same extra collectors and plain copies of every other series.

    Every family the exporter's registry publishes is copied, not only the probe cache's: the
    exporter also publishes the evaluations tally (`llm_eval_*`) and, with the canary lease,
    `redline_exporter_canary_lease_held`, and a bare side without them would render fewer
    series than the side it is compared with.
    """
    registry = CollectorRegistry()
    for collector in extra:
        registry.register(collector)
    shared = {family.name for collector in extra for family in collector.collect()}
    for family in exporter.registry.collect():
        if family.name in shared or not family.samples:
            continue
        labelnames = sorted({k for s in family.samples for k in s.labels})
        metric: Any
        if family.type == "counter":
            metric = Counter(family.name, family.documentation, labelnames, registry=registry)
            for sample in family.samples:
                child = metric.labels(**sample.labels) if labelnames else metric
                child.inc(sample.value)
        elif family.type in ("gauge", "unknown"):
            metric = Gauge(family.name, family.documentation, labelnames, registry=registry)
            for sample in family.samples:
                child = metric.labels(**sample.labels) if labelnames else metric
                child.set(sample.value)
        else:
            raise ValueError(f"{family.name}: no plain copy of a {family.type} family")
    return registry


def series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every (sample name, labels) of an exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def alternate(
    runs: int, first: Callable[[], object], second: Callable[[], object]
) -> tuple[list[float], list[float]]:
    """Time `first` and `second` alternately (order flipped every round)."""
    a: list[float] = []
    b: list[float] = []
    for i in range(runs):
        order = ((first, a), (second, b)) if i % 2 == 0 else ((second, b), (first, a))
        for fn, out in order:
            started = time.perf_counter()
            fn()
            out.append(time.perf_counter() - started)
    return a, b


def quantile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def created(on: bool) -> Iterator[None]:
    """prometheus-client's process-wide `_created` switch, back off (the exporter's) afterwards."""
    (enable_created_metrics if on else disable_created_metrics)()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        disable_created_metrics()  # type: ignore[no-untyped-call]


def stack_up(root: Path, stack: contextlib.ExitStack) -> tuple[ExporterSettings, Spec]:
    """Real services and every probe's configuration."""
    redis_service = start_redis(root / "redis")
    stack.callback(redis_service.stop)
    milvus = start_milvus_lite(root / "milvus")
    stack.callback(milvus.stop)
    redis_url = redis_service.extra["url"]
    uri = milvus.extra["uri"]

    sims = {
        region: serve_in_thread(build_simulator_app(SimulatorSettings(region=region, seed=i)))
        for i, region in enumerate(("primary", "secondary"))
    }
    for server in sims.values():
        stack.callback(server.stop)
    upstreams = {region: server.url for region, server in sims.items()}
    spec_data = yaml.safe_load(default_spec_text())
    rng = np.random.default_rng(7)
    reference = root / "reference.npy"
    np.save(reference, rng.standard_normal((500, 16)).astype(np.float32))
    spec_data["drift"] = {**spec_data["drift"], "window": 100, "reference": str(reference)}
    spec = parse_spec(yaml.safe_dump(spec_data), "bench-spec.yaml").spec
    gateway = serve_in_thread(
        build_gateway_app(
            GatewaySettings(upstreams=upstreams, redis_url=redis_url), spec, CollectorRegistry()
        )
    )
    stack.callback(gateway.stop)

    client = redis.Redis.from_url(redis_url)
    for vector in rng.standard_normal((150, 16)):
        client.xadd("embeddings", {"vector": encode_vector(vector)})
    client.xgroup_create(DEFAULT_STREAM, DEFAULT_GROUP, id="$", mkstream=True)
    client.close()
    name = f"bench{uuid.uuid4().hex[:8]}"
    for suffix in ("p", "r"):
        target = MilvusTarget(TargetSpec(uri, f"{name}_{suffix}", suffix), 16)
        target.ensure_collection()
        target.close()

    snapshots = SnapshotRegistry(root / "snapshots")
    for i in range(3):
        weights = root / f"weights-{i}.bin"
        weights.write_bytes(bytes([i]) * 4096)
        config = root / f"config-{i}.json"
        config.write_text(json.dumps({"i": i}))
        snap = snapshots.create("chat", f"v{i}", weights, config, adapter="chat-lora")
        snapshots.mark_verified(
            "chat", snap.snapshot_id, Baselines(p99_seconds=0.5, accuracy_ratio=0.9)
        )
        snapshots.activate("chat", snap.snapshot_id)
    snapshots.record_checkpoint("chat-lora")

    settings = ExporterSettings.model_validate(
        {
            "redis_url": redis_url,
            "models": {"root": str(snapshots.root), "interval_seconds": 1},
            "endpoints": {"interval_seconds": 1, "upstreams": upstreams},
            "golden_set": {"interval_seconds": 2, "gateway_url": gateway.url},
            "index_staleness": {
                "interval_seconds": 1,
                "collection": name,
                "dim": 16,
                "primary_uri": uri,
                "primary_collection": f"{name}_p",
                "replica_uri": uri,
                "replica_collection": f"{name}_r",
            },
            "session_rpo": {"interval_seconds": 1},
            "keepalive": {"interval_seconds": 1, "ttl_seconds": 600},
            "drift": {"interval_seconds": 2, "source": "redis_stream", "stream": "embeddings"},
        }
    )
    return settings, spec


def wait_all_ok(exporter: Exporter, timeout: float = 90.0) -> None:
    """Until every probe has succeeded once (they keep running afterwards)."""
    deadline = time.monotonic() + timeout
    while True:
        status = exporter.cache.status()
        if all(s["last_success"] is not None for s in status.values()):
            return
        if time.monotonic() > deadline:
            failing = {k: v["error"] for k, v in status.items() if v["last_success"] is None}
            raise BenchmarkError(f"probes never succeeded: {failing}")
        time.sleep(0.2)


def row(label: str, a: list[float], b: list[float]) -> str:
    """One table row: medians and p90 in ms, ratio of medians."""
    ma, mb = statistics.median(a), statistics.median(b)
    return (
        f"{label:<34} {ma * 1e3:>9.3f} {quantile(a, 0.9) * 1e3:>9.3f} "
        f"{mb * 1e3:>9.3f} {quantile(b, 0.9) * 1e3:>9.3f} {ma / mb:>7.3f}x"
    )


def run(argv: list[str] | None = None) -> list[Figure]:
    """Run the benchmark, print the tables; the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes per side and mode")
    parser.add_argument("--combos", type=int, default=216, help="gateway label combinations")
    args = parser.parse_args(argv)
    if args.combos < 200:
        parser.error("--combos must be >= 200")

    with (
        tempfile.TemporaryDirectory(prefix="redline-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        settings, spec = stack_up(Path(tmp), stack)
        histogram, requests = gateway_like(spec, args.combos)
        extra = [histogram, requests]
        exporter = build_exporter_app(settings, spec, extra_collectors=extra)
        server = stack.enter_context(serve_in_thread(exporter.app, access_log=False))
        wait_all_ok(exporter)
        bare = mirror_registry(exporter, extra)
        bare_server = stack.enter_context(
            serve_in_thread(make_asgi_app(bare), lifespan="off", access_log=False)
        )
        client = stack.enter_context(httpx.Client(timeout=10))
        exporter_url, bare_url = f"{server.url}/metrics", f"{bare_server.url}/"

        def scrape(url: str, on: bool, encoding: str) -> Callable[[], object]:
            headers = {"Accept-Encoding": encoding}

            def go() -> object:
                with created(on):
                    response = client.get(url, headers=headers)
                response.raise_for_status()
                return response.content

            return go

        with created(False):
            exp_text = client.get(exporter_url, headers={"Accept-Encoding": "identity"}).text
            bare_text = client.get(bare_url, headers={"Accept-Encoding": "identity"}).text
        exp_series, bare_series = series(exp_text), series(bare_text)
        dynamic = {
            catalog.REDLINE_PROBE_DURATION_SECONDS.name,
            catalog.REDLINE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS.name,
        }
        if exp_series != bare_series:
            # Like with like, or the ratio means nothing: both sides render the same series.
            only_exporter = sorted({name for name, _ in exp_series - bare_series})
            only_bare = sorted({name for name, _ in bare_series - exp_series})
            raise BenchmarkError(
                f"expositions differ in series: only the exporter's has {only_exporter[:8]}, "
                f"only the bare registry's has {only_bare[:8]}"
            )
        gateway_series = sum(1 for name, _ in exp_series if name.startswith("llm_request"))
        names = ", ".join(sorted(exporter.cache.probes))
        print(f"probes enabled: {len(exporter.cache.probes)} ({names})")
        print(
            f"series per scrape: {len(exp_series)} ({gateway_series} gateway-like, "
            f"{args.combos} label combinations); exposition {len(exp_text)} bytes; "
            f"{len(dynamic)} probe-health families change between scrapes"
        )
        n = args.scrapes
        # Warm-up, so neither side pays first-request costs in the measurement.
        alternate(20, scrape(exporter_url, False, "identity"), scrape(bare_url, False, "identity"))

        print()
        print(f"per scrape, ms ({n} scrapes each, alternating)")
        print(f"{'':<34} {'exporter':>9} {'p90':>9} {'bare':>9} {'p90':>9} {'ratio':>8}")
        results: dict[str, tuple[list[float], list[float]]] = {}
        results["HTTP /metrics (identity)"] = alternate(
            n, scrape(exporter_url, False, "identity"), scrape(bare_url, False, "identity")
        )
        results["HTTP /metrics (gzip)"] = alternate(
            n, scrape(exporter_url, False, "gzip"), scrape(bare_url, False, "gzip")
        )

        def render_exporter() -> object:
            with created(False):
                return generate_latest(exporter.registry)

        def render_bare() -> object:
            with created(False):
                return generate_latest(bare)

        results["in-process generate_latest"] = alternate(n, render_exporter, render_bare)
        for label, (a, b) in results.items():
            print(row(label, a, b))

        print()
        print("cost of _created series (on / off)")
        print(f"{'':<34} {'on':>9} {'p90':>9} {'off':>9} {'p90':>9} {'ratio':>8}")

        def bare_render(on: bool) -> Callable[[], object]:
            def go() -> object:
                with created(on):
                    return generate_latest(bare)

            return go

        def exporter_render_on() -> object:
            with created(True):
                return generate_latest(exporter.registry)

        print(
            row(
                "bare registry, generate_latest",
                *alternate(n, bare_render(True), bare_render(False)),
            )
        )
        print(row("exporter, generate_latest", *alternate(n, exporter_render_on, render_exporter)))
        print(
            row(
                "bare registry, HTTP identity",
                *alternate(
                    n, scrape(bare_url, True, "identity"), scrape(bare_url, False, "identity")
                ),
            )
        )
        with created(True):
            on_bytes = len(generate_latest(bare))
        with created(False):
            off_bytes = len(generate_latest(bare))
        print(f"exposition bytes: {on_bytes} on, {off_bytes} off ({on_bytes / off_bytes:.2f}x)")

        print()
        body = generate_latest(exporter.registry)
        for level in (1, 6, 9):
            started = time.perf_counter()
            for _ in range(50):
                packed = gzip.compress(body, compresslevel=level)
            took = (time.perf_counter() - started) / 50
            print(f"gzip level {level}: {took * 1e3:.3f} ms, {len(packed)} bytes")

        a, b = results["HTTP /metrics (identity)"]
        ratio = statistics.median(a) / statistics.median(b)
        verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
        print()
        print(f"exporter / bare over HTTP: {ratio:.3f}x, {verdict} the <= {TARGET_RATIO}x target")
        probes_ok = sum(1 for s in exporter.cache.status().values() if s["success"])
        probes = len(exporter.cache.probes)
        print(f"probes succeeding at the end: {probes_ok}/{probes}")
    return [
        at_most("scrape", "exporter / bare per scrape, HTTP identity", ratio, "x", TARGET_RATIO),
        info("scrape", "series per scrape (both sides, checked equal)", len(exp_series)),
        check(
            "scrape",
            f"probes succeeding at the end ({probes_ok}/{probes})",
            probes_ok == probes,
            "all",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when a figure missed its target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
