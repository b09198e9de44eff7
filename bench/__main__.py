"""`make bench`: run every benchmark in turn; each prints its own side-by-side table."""

from __future__ import annotations

import importlib
import sys
import time

BENCHMARKS = (
    ("generate", "rule generation + promtool check (issue: foundation)"),
    ("scrape", "exporter /metrics vs a bare prometheus-client registry"),
    ("gateway_overhead", "gateway-proxied request vs calling the simulator directly"),
    ("intent", "intent classifier accuracy (held out) and token estimator error"),
    ("replay", "delta-log replay vs raw pymilvus batched upsert"),
    ("ingest", "webhook ingestion vs a bare FastAPI endpoint"),
    ("report", "30-day SLO report vs naive raw reads"),
    ("drift", "drift detection vs Evidently (needs: pip install -e '.[bench]')"),
    ("promptlog", "prompt-log trace-back via the index vs a full scan; tamper detection"),
)


def main(names: list[str]) -> int:
    """Run the named benchmarks (all when none are named); return the number that failed."""
    failed = 0
    for name, what in BENCHMARKS:
        if names and name not in names:
            continue
        print(f"\n=== bench.{name}: {what}", flush=True)
        started = time.perf_counter()
        try:
            module = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError as exc:
            print(f"skipped: {exc.name} is not installed ({what})")
            continue
        try:
            module.main([])
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            failed += 1
            print(f"FAILED: {type(exc).__name__}: {exc}")
        print(f"--- {time.perf_counter() - started:.1f} s", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1:]) else 0)
