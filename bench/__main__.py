"""`make bench`: run every benchmark to the end, each in a process of its own, then one summary
table (benchmark | figure | target | met); exit 1 when one failed or missed a target.

`python -m bench [NAME ...]` runs the named ones only. Each prints its own side-by-side table as
it goes; `bench.runner` says why a process each and how a failure or Ctrl-C is handled.
"""

from __future__ import annotations

import sys

from bench.runner import Benchmark, child_main, run

BENCHMARKS = (
    Benchmark("generate", "rule generation + promtool check (issue: foundation)", "bench.generate"),
    Benchmark("scrape", "exporter /metrics vs a bare prometheus-client registry", "bench.scrape"),
    Benchmark(
        "gateway_overhead",
        "gateway-proxied request vs calling the simulator directly",
        "bench.gateway_overhead",
    ),
    Benchmark(
        "gateway_vs_litellm",
        "redline's gateway vs the LiteLLM proxy on one upstream (needs: pip install "
        "'litellm[proxy]')",
        "bench.gateway_vs_litellm",
    ),
    Benchmark(
        "intent", "intent classifier accuracy (held out) and token estimator error", "bench.intent"
    ),
    Benchmark("replay", "delta-log replay vs raw pymilvus batched upsert", "bench.replay"),
    Benchmark("ingest", "webhook ingestion vs a bare FastAPI endpoint", "bench.ingest"),
    Benchmark("report", "30-day SLO report vs naive raw reads", "bench.report"),
    Benchmark(
        "drift", "drift detection vs Evidently (needs: pip install -e '.[bench]')", "bench.drift"
    ),
    Benchmark(
        "rules_cost",
        "redline's vLLM-profile rules vs plain Sloth-style rules, 10/100/1000 pods (~5 min)",
        "bench.rules_cost",
    ),
    Benchmark(
        "slo_detection",
        "SLO burn-rate detection time: redline's rules vs Sloth's golden output, one promtool run "
        "per scenario",
        "bench.slo_detection",
    ),
    Benchmark(
        "promptlog",
        "prompt-log trace-back via the index vs a full scan; tamper detection",
        "bench.promptlog",
    ),
    Benchmark(
        "weights",
        "encrypted shards: encrypt/verify vs sha256, incremental vs full verification, file "
        "and S3 stores (2 GiB, ~3 min)",
        "bench.weights",
    ),
)
"""Every benchmark of `make bench`, in order (bench.deltalog_soak is not one: it soaks 30 min)."""


def main(argv: list[str]) -> int:
    """Run the named benchmarks (all when none are named); the exit code."""
    if argv[:1] == ["--child"] and len(argv) == 4:
        return child_main(argv[1], argv[2], argv[3])
    known = {b.name for b in BENCHMARKS}
    unknown = [name for name in argv if name not in known]
    if unknown:
        print(f"unknown benchmarks: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return 2
    return run([b for b in BENCHMARKS if not argv or b.name in argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
