"""30-day SLO report against a backfilled Prometheus: redline's queries vs naive raw reads.

`python -m bench.report` backfills the sample month (promtool), starts Prometheus, then times
(a) `generate_report` for the default spec (hourly server-side aggregates, chunked, parallel;
time-over at the data's 60 s sampling, and again forced to the spec's 15 s scrape interval), plus
rendering Markdown/HTML/CSV/JSON, and (b) the naive approach: one unchunked raw read per series
over both periods, with attainment and time over computed in Python. Prints a table and ratios.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.figures import Figure, below, exit_code, info
from redline.devstack.samples.report import backfill, build_sample, ts, write_openmetrics
from redline.platform.prometheus import PrometheusClient
from redline.reporting.render.html import render_html
from redline.reporting.render.markdown import render_markdown
from redline.reporting.render.tables import render_csv_tables, render_json
from redline.reporting.run import generate_report
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.report import Window

RAW_SERIES = (
    catalog.LLM_REQUEST_DURATION_SECONDS.bucket,
    catalog.LLM_REQUEST_DURATION_SECONDS.count,
    *(
        metric.name
        for metric in (
            catalog.LLM_REQUESTS_TOTAL,
            catalog.LLM_REQUEST_ERRORS_TOTAL,
            catalog.VECTORDB_INDEX_STALENESS_SECONDS,
            catalog.SESSION_CDC_RPO_SECONDS,
            catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS,
            catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS,
            catalog.SESSION_CONTEXT_TTL_SECONDS,
            catalog.SESSION_KEEPALIVE_PROBE_SUCCESS,
            catalog.EMBEDDING_DRIFT_SCORE,
            catalog.EMBEDDING_DRIFT_THRESHOLD,
        )
    ),
    "ALERTS",
    catalog.REDLINE_REMEDIATION_RUNS_TOTAL.name,
    catalog.LLM_PROBE_SUCCESS.name,
)


def naive(url: str, window: Window) -> tuple[float, int, float]:
    """One unchunked raw read per series; attainment of the availability SLO computed locally."""
    began = time.perf_counter()
    client = PrometheusClient(url, timeout=300)
    samples = 0
    attained = float("nan")
    try:
        series: dict[str, list[tuple[dict[str, str], np.ndarray]]] = {}
        for name in RAW_SERIES:
            result = client.instant_raw(f"{name}[{2 * window.seconds}s]", window.end)["result"]
            series[name] = [
                (item["metric"], np.array([[float(t), float(v)] for t, v in item["values"]]))
                for item in result
            ]
            samples += sum(len(v) for _, v in series[name])

        def increase(name: str) -> float:
            total = 0.0
            for _, values in series[name]:
                inside = values[(values[:, 0] >= window.start) & (values[:, 0] <= window.end)]
                total += float(inside[-1, 1] - inside[0, 1]) if len(inside) else 0.0
            return total

        errors = increase(catalog.LLM_REQUEST_ERRORS_TOTAL.name)
        attained = 1 - errors / increase(catalog.LLM_REQUESTS_TOTAL.name)
        queries = client.sent
    finally:
        client.close()
    print(f"  naive: {samples:,} raw samples moved; availability attained {attained:.6f}")
    return time.perf_counter() - began, queries, attained


def run(argv: list[str] | None = None) -> list[Figure]:
    """Run the benchmark, print the side-by-side table; the figures."""
    from redline.devstack.processes import start_prometheus

    spec = load_spec(None).spec
    window = Window(ts("2025-03-01T00:00"), ts("2025-03-31T00:00"))
    with tempfile.TemporaryDirectory(prefix="redline-bench-report-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        backfill(write_openmetrics(build_sample(), root / "sample.om"), root / "prom" / "data")
        print(f"backfilled 30 days at 60 s in {time.perf_counter() - started:.1f} s")
        config = root / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 15s\n")
        service = start_prometheus(root / "prom", config)
        try:
            rows = []
            for label, step in (
                ("redline (step = data's 60 s)", None),
                ("redline (step = spec's 15 s)", 15),
            ):
                began = time.perf_counter()
                generated = generate_report(service.url, spec, "default", window, step=step)
                fetched = time.perf_counter() - began
                render_markdown(generated.report)
                render_html(generated.report)
                render_csv_tables(generated.report)
                render_json(generated.report)
                total = time.perf_counter() - began
                availability = next(s for s in generated.report.slos if s.name == "availability")
                print(f"  {label}: availability attained {availability.attainment:.6f}")
                rows.append((label, total, fetched, generated.queries))
            seconds, queries, _ = naive(service.url, window)
        finally:
            service.stop()
    print(f"\n{'approach':34} {'end to end s':>13} {'of it fetch s':>14} {'queries':>8}")
    for label, total, fetched, count in rows:
        print(f"{label:34} {total:13.2f} {fetched:14.2f} {count:8d}")
    print(f"{'naive: raw read per series (SLOs only)':34} {seconds:13.2f} {'':>14} {queries:8d}")
    best = rows[0][1]
    print(
        f"\nnaive / redline = {seconds / best:.1f}x slower (and covers far less); target < 10 s: "
        f"{'met' if best < 10 else 'MISSED'} ({best:.2f} s)"
    )
    return [
        below("report", "30-day report end to end (step 60 s)", best, "s", 10.0),
        info("report", "30-day report end to end (step 15 s)", rows[1][1], "s"),
        info("report", "naive raw reads / redline, time", seconds / best, "x"),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when a figure missed its target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
