"""Rule cost, side by side: redline's rules for a vLLM fleet vs a plain Sloth-style SLO rule set.

Set-up, for each fleet size N (10, 100 and 1000 pods by default): N fake vLLM pods, each serving
M models (2) on one API server, as the devstack's simulator pages do: one
`redline.devstack.fakes.engines.EngineMetrics("vllm")` per served model, the pages merged (the
API server's `http_requests_total` and `http_request_duration_seconds`, which carry no model
label, added up). So every pod shows every series vLLM exports per model (e2e latency, TTFT,
inter-token latency and queue time histograms with vLLM's buckets, prompt/generation token
histograms and counters, `request_success_total` by `finished_reason`, preemptions, running and
waiting requests, KV-cache usage, `_created` series as prometheus-client writes them) and the API
server's. Each pod draws its own traffic (Poisson arrivals, `--rate` requests/s per model,
lognormal latencies, a few 5xx, 4xx and client aborts) and advances its counters when it is
scraped, at most once per half scrape interval. One HTTP server in this process serves every
pod's page on `/pods/<pod>/metrics` and the snapshot registry's `model_active_info` (what
redline's version join reads) on `/registry/metrics`. Prometheus gets N targets on that one
port, each with `region` and `pod` target labels as redline's local stack scrapes engines
(`build_engine_job`), and `relabel_configs` set `__metrics_path__` (and `instance`) from `pod`.

Two real Prometheus processes scrape the same targets at the same moments, side by side, each
with one rule set:
(a) redline: `build_rule_groups` for the default spec with `sources: {profile: vllm}`, rendered
    by `render_rule_file`;
(b) plain: the rules a user would hand-write or have Sloth generate over the raw vLLM series, for
    the spec's two SLOs (`plain_rule_groups`): per SLO `slo:sli_error:ratio_rate<w>` for 5m, 30m,
    1h, 2h, 6h, 1d and 3d straight from the raw counters, the 30d ratio as
    `sum_over_time(ratio_rate5m[30d]) / count_over_time(...)`, Sloth's metadata recordings and
    its page and ticket multiwindow alerts; plus the red line's P99 and request count per region
    (with its alert) and the rollback gate's P99 and request count per model.

Why side by side rather than one after the other: both sides then see exactly the same pages
(both Prometheus have the same external labels, so Prometheus gives each target the same scrape
offset in both, and a pod renders once for the two scrapes), the same moment's machine load
from other users of this shared 2-core machine, and the run takes half the time. The price: the
two Prometheus (and this process's fake fleet) compete for the same two cores, so evaluation
times are wall-clock times under that contention, on both sides alike.

Measured, per N and per side, over `--duration` seconds once both sides have computed their SLIs
(the warm-up: >= 2 scrapes, then the recordings that read recordings): series added by the rules
(`count by (__name__)` over exactly the names the side's rules record, ALERTS not included),
rule-group evaluation time (`prometheus_rule_group_last_duration_seconds` from each
Prometheus's own /metrics, polled every few seconds, each evaluation counted once by its
`prometheus_rule_group_last_evaluation_timestamp_seconds`, averaged per group and summed over the
side's groups), `prometheus_tsdb_head_series` and `process_resident_memory_bytes` at the end, and
for the analysis the CPU each Prometheus used, every rule's own `evaluationTime`
(/api/v1/rules) and the series per recorded name. Targets, at N = 1000: series added <= 1.5x
the plain set's, evaluation time <= 2x.

Cost and honesty: at N = 1000 x 2 models each Prometheus holds ~310k raw series; this process
spends ~5 ms of CPU per page (prometheus-client's collect and text writer), ~5 s per 15 s scrape
round, about a third of one core, beside the two Prometheus. The scrape interval stays the spec's
15 s at every N (what the rules are written for; a shorter one at N = 1000 would let the fake
fleet starve the Prometheus it feeds), the evaluation interval is the spec's 15 s (redline's
groups carry it), and `--duration 60` averages 4 evaluations of every group: with the warm-up,
about 2 minutes per N, 6-7 minutes in all. Windows longer than the run read what exists: rules
over `rate(...[1d])` or `[30d]` scan minutes of samples here, not days, on both sides alike, so
the evaluation times are those of a freshly started Prometheus and the long-window rules cost
more in a Prometheus that has run for days (both sides rate the raw series: the same number of
series).

Run: `.venv/bin/python -m bench.rules_cost [--pods 10,100,1000] [--models 2]
[--scrape-interval 15] [--duration 60] [--rate 0.5]`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.parser import text_string_to_metric_families

from bench.figures import (
    BenchmarkError,
    Figure,
    MissingDependencyError,
    at_most,
    check,
    exit_code,
    info,
)
from redline.devstack.fakes.engines import EngineMetrics, Request
from redline.devstack.fakes.simulator_metrics import render_engines
from redline.devstack.processes import Service, free_port, start_prometheus
from redline.platform.prometheus import PrometheusClient
from redline.rules.build import build_rule_groups
from redline.rules.model import RuleGroup, format_duration
from redline.rules.render import render_rule_file
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.spec import ErrorsSli, Slo, SlowRequestsSli, Sources, Spec

NAME = "rules_cost"
DEFAULT_PODS = (10, 100, 1000)
TARGET_PODS = 1000
"""The fleet size the targets apply to."""
TARGET_SERIES_RATIO = 1.5
TARGET_EVAL_RATIO = 2.0
REDLINE = "redline"
PLAIN = "plain"
SIDES = (REDLINE, PLAIN)
ENGINE_JOB = "vllm"
"""The engines' scrape job, named after the source as redline's local stack names it."""
REGISTRY_PATH = "/registry/metrics"
POLL_SECONDS = 3.0
"""How often each Prometheus's /metrics and /api/v1/rules are read while measuring."""

# The raw vLLM series the plain set reads, spelled by hand as its author would (a unit test
# checks them against redline's vllm profile: both sides read the same series).
VLLM_LATENCY = "vllm:e2e_request_latency_seconds"
VLLM_FINISHED = "vllm:request_success_total"
VLLM_REJECTED = "vllm:admission_rejections_total"
VLLM_MODEL_LABEL = "model_name"
VLLM_ERROR_REASON = 'finished_reason="error"'
SLOTH_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
"""Sloth's default windows (Google's SRE workbook): page 1h/5m and 6h/30m, ticket 1d/2h and
3d/6h."""
SLOTH_ALERTS = {
    # severity: ((short window, long window, burn rate factor), ...)
    "page": (("5m", "1h", 14.4), ("30m", "6h", 6.0)),
    "ticket": (("2h", "1d", 3.0), ("6h", "3d", 1.0)),
}
SLI_ERROR = "slo:sli_error:ratio_rate{window}"
P99_BY_REGION = "region:vllm_e2e_request_latency_seconds:p99_rate5m"
REQUESTS_BY_REGION = "region:vllm_e2e_request_latency_seconds_count:increase5m"
P99_BY_MODEL = "model_name:vllm_e2e_request_latency_seconds:p99_rate5m"
REQUESTS_BY_MODEL = "model_name:vllm_e2e_request_latency_seconds_count:increase5m"
# What each side must have computed before it is measured, and what it records for the SLIs
# and the P99s (checked after the run: the two sides computed the same things).
REDLINE_SLI_RATIO = "redline:slo_errors:ratio_rate5m"
REDLINE_P99_BY_REGION = "redline:llm_request_duration_seconds:p99_5m"
REDLINE_P99_BY_VERSION = "redline:llm_request_duration_seconds:p99_by_version_5m"


# ---- the fleet: pods' expositions and their traffic ---------------------------------------------


@dataclass(frozen=True)
class Traffic:
    """What one model of one pod serves: arrivals, latencies and failures."""

    rate: float = 0.5
    """Requests per second (Poisson arrivals)."""
    median_seconds: float = 0.35
    sigma: float = 0.45
    """Of the lognormal end-to-end latency."""
    server_errors: float = 0.003
    client_errors: float = 0.01
    aborts: float = 0.002


def draw_requests(rng: np.random.Generator, traffic: Traffic, seconds: float) -> list[Request]:
    """The requests one model of a pod answered over `seconds` (none for a non-positive span)."""
    if seconds <= 0:
        return []
    n = int(rng.poisson(traffic.rate * seconds))
    if n == 0:
        return []
    latency = rng.lognormal(math.log(traffic.median_seconds), traffic.sigma, n)
    draw = rng.random(n)
    prompt = rng.integers(20, 2000, n)
    completion = rng.integers(5, 600, n)
    ttft = 0.015 + 0.1 * rng.random(n)
    server = traffic.server_errors
    client = server + traffic.client_errors
    aborted = client + traffic.aborts
    requests = []
    for i in range(n):
        u = float(draw[i])
        status = 500 if u < server else 400 if u < client else 499 if u < aborted else 200
        seconds_i = float(latency[i])
        requests.append(
            Request(seconds_i, status, int(prompt[i]), int(completion[i]), min(seconds_i, ttft[i]))
        )
    return requests


def pod_engines(models: Sequence[str]) -> list[EngineMetrics]:
    """One vLLM engine exposition per model a pod serves."""
    return [EngineMetrics("vllm", model=model) for model in models]


def render_pod(engines: Sequence[EngineMetrics]) -> bytes:
    """A pod's page: its models' vLLM series and the API server's, in one text exposition."""
    return render_engines(engines)


def model_names(models: int) -> tuple[str, ...]:
    """The served model names of every pod."""
    return tuple(f"model-{index}" for index in range(models))


@dataclass(frozen=True)
class PodTarget:
    """One pod: its `pod` and `region` target labels."""

    name: str
    region: str
    index: int
    region_index: int = 0


def fleet_targets(pods: int, regions: Sequence[str]) -> list[PodTarget]:
    """`pods` pods spread round robin over `regions`, named as the local stack names them."""
    targets = []
    for index in range(pods):
        region = regions[index % len(regions)]
        name = f"{region}-{index // len(regions)}"
        targets.append(PodTarget(name, region, index, index % len(regions)))
    return targets


class Pod:
    """One pod's engines and traffic; its page re-rendered at most once per `refresh` seconds,
    with the traffic since the last render."""

    def __init__(
        self, target: PodTarget, models: Sequence[str], traffic: Traffic, refresh: float
    ) -> None:
        self.target = target
        self.engines = pod_engines(models)
        region_index = target.region_index
        # A slower second region and model, so the per-region and per-model P99s differ.
        self.traffic = [
            Traffic(
                traffic.rate,
                traffic.median_seconds * (1 + 0.25 * region_index + 0.1 * model_index),
                traffic.sigma,
                traffic.server_errors,
                traffic.client_errors,
                traffic.aborts,
            )
            for model_index in range(len(models))
        ]
        self.rng = np.random.default_rng(target.index)
        self.refresh = refresh
        self._lock = threading.Lock()
        self._advanced = time.monotonic()
        self._rendered = -math.inf
        self._page = b""

    def advance(self, seconds: float) -> int:
        """Serve `seconds` of traffic on every model; the requests served."""
        served = 0
        for engine, traffic in zip(self.engines, self.traffic, strict=True):
            for request in draw_requests(self.rng, traffic, seconds):
                engine.observe(
                    request.latency,
                    status=request.status,
                    prompt_tokens=request.prompt_tokens,
                    completion_tokens=request.completion_tokens,
                    ttft_seconds=request.ttft,
                )
                served += 1
        return served

    def page(self) -> bytes:
        """The page now: re-rendered with the traffic since the last one when it is stale."""
        with self._lock:
            now = time.monotonic()
            if now - self._rendered >= self.refresh:
                self.advance(now - self._advanced)
                self._advanced = now
                self._page = render_pod(self.engines)
                self._rendered = now
            return self._page


def registry_page(models: Sequence[str]) -> bytes:
    """The snapshot registry's `model_active_info` for every model (the exporter's series)."""
    registry = CollectorRegistry()
    active = catalog.MODEL_ACTIVE_INFO
    gauge = Gauge(active.name, active.help, list(active.labels), registry=registry)
    for model in models:
        gauge.labels(model, "v1", f"sha256:{model}-weights", f"sha256:{model}-config").set(1)
    return generate_latest(registry)


class _FleetServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], pages: Mapping[str, Pod], registry: bytes):
        super().__init__(address, _FleetHandler)
        self.pages = dict(pages)
        self.registry = registry
        self.undelivered = 0
        """Pages whose scraper hung up before they were written (its scrape timed out)."""


class _FleetHandler(BaseHTTPRequestHandler):
    server: _FleetServer

    def do_GET(self) -> None:  # noqa: N802 -- http.server's naming
        path = self.path.split("?", 1)[0]
        if path == REGISTRY_PATH:
            body = self.server.registry
        else:
            pod = self.server.pages.get(path)
            if pod is None:
                self.send_error(404)
                return
            body = pod.page()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.server.undelivered += 1

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Quiet: thousands of scrapes a minute."""


def pod_path(pod: str) -> str:
    """Where a pod's page is served."""
    return f"/pods/{pod}/metrics"


class Fleet:
    """Every pod's page and the registry's on one port, served from a thread."""

    def __init__(
        self,
        targets: Sequence[PodTarget],
        models: Sequence[str],
        traffic: Traffic,
        refresh: float,
        host: str = "127.0.0.1",
    ) -> None:
        self.targets = list(targets)
        self.pods = {pod_path(t.name): Pod(t, models, traffic, refresh) for t in targets}
        self._server = _FleetServer((host, free_port(host)), self.pods, registry_page(models))
        self.address = f"{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )
        self._thread.start()

    @property
    def undelivered(self) -> int:
        """Pages a scraper gave up on (scrape timeouts) so far."""
        return self._server.undelivered

    def raw_series(self) -> int:
        """The engine series every scrape round carries (pages as they are now)."""
        return sum(_sample_lines(pod.page()) for pod in self.pods.values())

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _sample_lines(page: bytes) -> int:
    return sum(1 for line in page.splitlines() if line and not line.startswith(b"#"))


def prometheus_config(
    address: str,
    targets: Sequence[PodTarget],
    scrape_interval: float,
    evaluation_interval: float,
    rule_file: Path,
) -> dict[str, Any]:
    """prometheus.yml of one side: the fleet's pods (`region` and `pod` target labels, the
    metrics path and instance from `pod`), the registry, one rule file."""
    pods = [{"targets": [address], "labels": {"region": t.region, "pod": t.name}} for t in targets]
    return {
        "global": {
            "scrape_interval": format_duration(scrape_interval),
            "scrape_timeout": format_duration(min(scrape_interval, 10.0)),
            "evaluation_interval": format_duration(evaluation_interval),
            # The same on both sides: Prometheus derives each target's scrape offset from them,
            # so both scrape a pod at the same moment and see the same page.
            "external_labels": {"bench": NAME},
        },
        "rule_files": [str(rule_file)],
        "scrape_configs": [
            {
                "job_name": ENGINE_JOB,
                "static_configs": pods,
                "relabel_configs": [
                    {
                        "source_labels": ["pod"],
                        "target_label": "__metrics_path__",
                        "replacement": pod_path("$1"),
                    },
                    {
                        "source_labels": ["pod"],
                        "target_label": "instance",
                        "replacement": "$1:8000",
                    },
                ],
            },
            {
                "job_name": "exporters",
                "metrics_path": REGISTRY_PATH,
                "static_configs": [{"targets": [address]}],
            },
        ],
    }


# ---- the two rule sets --------------------------------------------------------------------------


def redline_spec() -> Spec:
    """The default spec reading vLLM's own series (`sources: {profile: vllm}`)."""
    return load_spec().spec.model_copy(update={"sources": Sources(profile="vllm")})


def redline_rule_file(spec: Spec) -> tuple[str, list[RuleGroup]]:
    """redline's rule file for `spec` and its groups."""
    groups = build_rule_groups(spec)
    return render_rule_file(groups, "spec.yaml"), groups


def _sloth_id(service: str, slo: Slo) -> dict[str, str]:
    return {
        "sloth_id": f"{service}-{slo.name}",
        "sloth_service": service,
        "sloth_slo": slo.name,
    }


def _filter(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _le(seconds: float) -> str:
    # prometheus-client writes bucket bounds with repr(float): 0.8 -> "0.8", 1 -> "1.0".
    return repr(float(seconds))


WINDOW = "$window"
"""Where a query template takes its window (Sloth's `{{.window}}`)."""


def sli_queries(slo: Slo) -> tuple[str, str]:
    """Sloth's `error_query` and `total_query` of one SLO over the raw vLLM series, `WINDOW`
    standing for the window."""
    sli = slo.sli
    if isinstance(sli, SlowRequestsSli):
        total = f"sum(rate({VLLM_LATENCY}_count[{WINDOW}]))"
        fast = f'sum(rate({VLLM_LATENCY}_bucket{{le="{_le(sli.threshold_seconds)}"}}[{WINDOW}]))'
        return f"{total} - {fast}", total
    if isinstance(sli, ErrorsSli):
        rejected = f"sum(rate({VLLM_REJECTED}[{WINDOW}]))"
        errors = f"sum(rate({VLLM_FINISHED}{{{VLLM_ERROR_REASON}}}[{WINDOW}])) + {rejected}"
        return errors, f"sum(rate({VLLM_FINISHED}[{WINDOW}])) + {rejected}"
    raise ValueError(f"no plain SLI for {type(sli).__name__}")


def sloth_groups(service: str, slo: Slo) -> list[dict[str, Any]]:
    """The three groups Sloth generates for one SLO: SLI recordings (every window from the raw
    series, the period's from the 5m one), metadata recordings, the page and ticket alerts."""
    ids = _sloth_id(service, slo)
    period = slo.period
    error_query, total_query = sli_queries(slo)
    sli_rules: list[dict[str, Any]] = []
    for window in SLOTH_WINDOWS:
        errors, total = error_query.replace(WINDOW, window), total_query.replace(WINDOW, window)
        sli_rules.append(
            {
                "record": SLI_ERROR.format(window=window),
                "expr": f"({errors})\n/\n({total})\n",
                "labels": {**ids, "sloth_window": window},
            }
        )
    short = SLI_ERROR.format(window=SLOTH_WINDOWS[0]) + _filter(ids)
    sli_rules.append(
        {
            "record": SLI_ERROR.format(window=period),
            "expr": (
                f"sum_over_time({short}[{period}])\n/ ignoring (sloth_window)\n"
                f"count_over_time({short}[{period}])\n"
            ),
            "labels": {"sloth_window": period},
        }
    )
    budget = 1 - slo.objective
    by_id = "on(sloth_id, sloth_slo, sloth_service) group_left"
    meta_rules = [
        {"record": "slo:objective:ratio", "expr": f"vector({slo.objective:g})", "labels": ids},
        {"record": "slo:error_budget:ratio", "expr": f"vector(1-{slo.objective:g})", "labels": ids},
        {
            "record": "slo:time_period:days",
            "expr": f"vector({_days(period):g})",
            "labels": ids,
        },
        {
            "record": "slo:current_burn_rate:ratio",
            "expr": f"{short}\n/ {by_id}\nslo:error_budget:ratio{_filter(ids)}\n",
            "labels": ids,
        },
        {
            "record": "slo:period_burn_rate:ratio",
            "expr": (
                f"{SLI_ERROR.format(window=period)}{_filter(ids)}\n/ {by_id}\n"
                f"slo:error_budget:ratio{_filter(ids)}\n"
            ),
            "labels": ids,
        },
        {
            "record": "slo:period_error_budget_remaining:ratio",
            "expr": f"1 - slo:period_burn_rate:ratio{_filter(ids)}",
            "labels": ids,
        },
        {
            "record": "sloth_slo_info",
            "expr": "vector(1)",
            "labels": {**ids, "sloth_objective": f"{slo.objective * 100:g}"},
        },
    ]
    alert_name = slo.alert_name or f"{slo.name.title().replace('_', '')}ErrorBudgetBurn"
    alert_rules = []

    def over(window: str, factor: float) -> str:
        return f"({SLI_ERROR.format(window=window)}{_filter(ids)} > ({factor:g} * {budget:g}))"

    for severity, (page, ticket) in SLOTH_ALERTS.items():
        (quick_short, quick_long, quick), (slow_short, slow_long, slow) = page, ticket
        expr = (
            f"(\n    {over(quick_short, quick)}\n    and ignoring (sloth_window)\n"
            f"    {over(quick_long, quick)}\n)\nor ignoring (sloth_window)\n"
            f"(\n    {over(slow_short, slow)}\n    and ignoring (sloth_window)\n"
            f"    {over(slow_long, slow)}\n)\n"
        )
        alert_rules.append(
            {
                "alert": alert_name,
                "expr": expr,
                "labels": {"sloth_severity": severity},
                "annotations": {
                    "summary": "{{$labels.sloth_service}} {{$labels.sloth_slo}} SLO error budget "
                    "burn rate is over expected."
                },
            }
        )
    name = f"{service}-{slo.name}"
    return [
        {"name": f"sloth-slo-sli-recordings-{name}", "rules": sli_rules},
        {"name": f"sloth-slo-meta-recordings-{name}", "rules": meta_rules},
        {"name": f"sloth-slo-alerts-{name}", "rules": alert_rules},
    ]


def _days(period: str) -> float:
    units = {"m": 1 / 1440, "h": 1 / 24, "d": 1.0, "w": 7.0}
    return float(period[:-1]) * units[period[-1]]


def latency_groups(spec: Spec) -> list[dict[str, Any]]:
    """The red line and rollback gate equivalents, hand-written: P99 and requests per region
    (with the red line's alert) and per model."""
    red = spec.red_lines.latency_p99
    window = red.window
    q = f"{red.quantile:g}"

    def p99(by: str) -> str:
        return f"histogram_quantile({q}, sum by (le, {by}) (rate({VLLM_LATENCY}_bucket[{window}])))"

    def requests(by: str) -> str:
        return f"sum by ({by}) (increase({VLLM_LATENCY}_count[{window}]))"

    return [
        {
            "name": "vllm-latency",
            "rules": [
                {"record": P99_BY_REGION, "expr": p99("region")},
                {"record": REQUESTS_BY_REGION, "expr": requests("region")},
                {"record": P99_BY_MODEL, "expr": p99(VLLM_MODEL_LABEL)},
                {"record": REQUESTS_BY_MODEL, "expr": requests(VLLM_MODEL_LABEL)},
                {
                    "alert": "LatencyP99OverRedLine",
                    "expr": (
                        f"{P99_BY_REGION} > {red.threshold_seconds:g}\nand on (region)\n"
                        f"{REQUESTS_BY_REGION} >= {red.min_requests}"
                    ),
                    "for": format_duration(red.for_seconds),
                    "labels": {"severity": "critical"},
                    "annotations": {"summary": "P99 of {{ $labels.region }} over the red line"},
                },
            ],
        }
    ]


def plain_rule_groups(spec: Spec) -> dict[str, Any]:
    """The plain rule file: Sloth's groups for each of the spec's SLOs over the raw vLLM series,
    then the red line's and the gate's P99s."""
    groups = [group for slo in spec.slos for group in sloth_groups(spec.service, slo)]
    return {"groups": [*groups, *latency_groups(spec)]}


class _RulesDumper(yaml.SafeDumper):
    """Multi-line expressions as YAML block literals, as rule files are written by hand."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_RulesDumper.add_representer(str, _string)


def dump_rules(rule_file: Mapping[str, Any]) -> str:
    """A rule file's YAML."""
    return yaml.dump(dict(rule_file), Dumper=_RulesDumper, sort_keys=False, width=120)


def recorded_names(rule_file: Mapping[str, Any]) -> list[str]:
    """Every name a rule file records, once each, in order."""
    names = [rule["record"] for g in rule_file["groups"] for rule in g["rules"] if "record" in rule]
    return list(dict.fromkeys(names))


def names_regex(names: Iterable[str]) -> str:
    """A `__name__=~` regex matching exactly `names`."""
    return "|".join(re.escape(name) for name in sorted(set(names)))


# ---- measuring one Prometheus -------------------------------------------------------------------


def _group_name(rule_group: str) -> str:
    return rule_group.split(";", 1)[-1]


@dataclass
class Samples:
    """What one Prometheus reported about itself while measured."""

    group_evals: dict[str, dict[float, float]] = field(default_factory=dict)
    """Group -> its evaluations in the window: evaluation timestamp -> seconds it took."""
    rule_evals: dict[tuple[str, int, str], dict[str, float]] = field(default_factory=dict)
    """(group, position, rule name) -> lastEvaluation -> seconds."""
    gauges: dict[str, float] = field(default_factory=dict)
    """The latest sums of the self-metrics below."""
    cpu_started: float | None = None


SELF_METRICS = (
    "prometheus_tsdb_head_series",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "prometheus_rule_evaluation_failures_total",
    "prometheus_rule_group_iterations_missed_total",
)


class Side:
    """One Prometheus with one rule set."""

    def __init__(self, name: str, service: Service, records: Sequence[str]) -> None:
        self.name = name
        self.service = service
        self.records = list(records)
        self.client = PrometheusClient(service.url, timeout=60)
        self.http = httpx.Client(base_url=service.url, timeout=30)
        self.samples = Samples()

    def close(self) -> None:
        """Close the HTTP clients."""
        self.client.close()
        self.http.close()

    def value(self, query: str) -> float:
        """A one-number query's value (NaN when empty)."""
        result = self.client.instant(query)
        return result[0][1] if result else math.nan

    def poll(self, since: float) -> None:
        """Read /metrics (group durations, gauges) and /api/v1/rules (every rule's time)."""
        text = self.http.get("/metrics").text
        durations: dict[str, float] = {}
        stamps: dict[str, float] = {}
        gauges: dict[str, float] = dict.fromkeys(SELF_METRICS, 0.0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "prometheus_rule_group_last_duration_seconds":
                    durations[_group_name(sample.labels["rule_group"])] = sample.value
                elif sample.name == "prometheus_rule_group_last_evaluation_timestamp_seconds":
                    stamps[_group_name(sample.labels["rule_group"])] = sample.value
                elif sample.name in gauges:
                    gauges[sample.name] += sample.value
        self.samples.gauges = gauges
        if self.samples.cpu_started is None:
            self.samples.cpu_started = gauges["process_cpu_seconds_total"]
        for group, stamp in stamps.items():
            if stamp >= since and group in durations:
                self.samples.group_evals.setdefault(group, {})[stamp] = durations[group]
        rules = self.http.get("/api/v1/rules").json()["data"]["groups"]
        for group in rules:
            for position, rule in enumerate(group["rules"]):
                stamp = rule.get("lastEvaluation", "")
                if not stamp or rfc3339_seconds(stamp) < since:
                    continue
                key = (group["name"], position, rule["name"])
                self.samples.rule_evals.setdefault(key, {})[stamp] = rule["evaluationTime"]


_RFC3339 = re.compile(r"^(?P<head>[^.Z+]{19})(?:\.(?P<fraction>\d+))?(?P<zone>.*)$")


def rfc3339_seconds(stamp: str) -> float:
    """Seconds since the epoch of a time as Prometheus's API writes it (RFC 3339, nanoseconds)."""
    found = _RFC3339.match(stamp)
    if found is None:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    zone = found["zone"]
    zone = "+00:00" if zone in ("Z", "") else zone
    whole = datetime.fromisoformat(found["head"] + zone).timestamp()
    return whole + float("0." + (found["fraction"] or "0"))


@dataclass(frozen=True)
class SideResult:
    """One side's figures at one fleet size."""

    series_added: int
    series_by_name: dict[str, int]
    eval_seconds: float
    """Mean evaluation time per group, summed over the side's groups."""
    eval_by_group: dict[str, float]
    evaluations: int
    """Evaluations of the least evaluated group in the window."""
    rule_seconds: dict[tuple[str, str], float]
    """(group, rule) -> mean seconds (rules of one name in one group summed)."""
    head_series: float
    rss_bytes: float
    cpu_cores: float
    failures: float
    missed: float


def side_result(side: Side, window_seconds: float) -> SideResult:
    """What `side` measured, with its series counted per recorded name now."""
    regex = names_regex(side.records)
    counted = side.client.instant(f'count by (__name__) ({{__name__=~"{regex}"}})')
    by_name = {labels["__name__"]: int(value) for labels, value in counted}
    evals = side.samples.group_evals
    by_group = {group: float(np.mean(list(s.values()))) for group, s in evals.items() if s}
    rules: dict[tuple[str, str], float] = {}
    for (group, _, rule), seen in side.samples.rule_evals.items():
        rules[(group, rule)] = rules.get((group, rule), 0.0) + float(np.mean(list(seen.values())))
    gauges = side.samples.gauges
    cpu = gauges["process_cpu_seconds_total"] - (side.samples.cpu_started or 0.0)
    return SideResult(
        series_added=sum(by_name.values()),
        series_by_name=by_name,
        eval_seconds=sum(by_group.values()),
        eval_by_group=by_group,
        evaluations=min((len(s) for s in evals.values()), default=0),
        rule_seconds=rules,
        head_series=gauges["prometheus_tsdb_head_series"],
        rss_bytes=gauges["process_resident_memory_bytes"],
        cpu_cores=cpu / window_seconds,
        failures=gauges["prometheus_rule_evaluation_failures_total"],
        missed=gauges["prometheus_rule_group_iterations_missed_total"],
    )


@dataclass(frozen=True)
class Coverage:
    """What a side must compute for the comparison to be like for like."""

    queries: Mapping[str, int]
    """PromQL `count(...)` -> the series it must find."""

    def missing(self, side: Side) -> list[str]:
        """The queries that find fewer series than they must."""
        return [q for q, n in self.queries.items() if not side.value(q) >= n]


def coverages(spec: Spec, regions: int, models: int) -> dict[str, Coverage]:
    """Both SLIs, the P99 per region and per model, on each side."""
    slos = len(spec.slos)
    return {
        REDLINE: Coverage(
            {
                f"count({REDLINE_SLI_RATIO})": slos,
                f"count({REDLINE_P99_BY_REGION})": regions,
                f"count({REDLINE_P99_BY_VERSION})": models,
            }
        ),
        PLAIN: Coverage(
            {
                f"count({SLI_ERROR.format(window='5m')})": slos,
                f"count({P99_BY_REGION})": regions,
                f"count({P99_BY_MODEL})": models,
            }
        ),
    }


# ---- one fleet size -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """The run's settings (the CLI's flags)."""

    pods: tuple[int, ...]
    models: int
    scrape_interval: float
    duration: float
    rate: float


@dataclass(frozen=True)
class Phase:
    """Both sides at one fleet size."""

    pods: int
    raw_series: int
    results: dict[str, SideResult]
    covered: bool
    up: dict[str, float]
    slis: dict[str, dict[str, float]]
    seconds: float
    undelivered: int
    """Pages scrapers gave up on while measured (scrape timeouts)."""
    slowest_scrape: dict[str, float]
    """Each side's longest pod scrape while measured, seconds."""


def _write_yaml(path: Path, data: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False, width=120))
    return path


def _wait_covered(
    sides: Mapping[str, Side], covers: Mapping[str, Coverage], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    missing: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        missing = {name: covers[name].missing(side) for name, side in sides.items()}
        if not any(missing.values()):
            return
        time.sleep(2.0)
    raise BenchmarkError(f"the rules computed nothing within {timeout:g} s: missing {missing}")


def run_phase(
    root: Path, options: Options, pods: int, spec: Spec, rule_files: Mapping[str, str]
) -> Phase:
    """Start the fleet and both Prometheus, warm up, measure; stop everything however it ends."""
    began = time.perf_counter()
    regions = spec.regions
    models = model_names(options.models)
    interval = options.scrape_interval
    evaluation = spec.timing.evaluation_interval_seconds
    targets = fleet_targets(pods, regions)
    print(f"\nN = {pods} pods x {options.models} models over {', '.join(regions)}", flush=True)
    with contextlib.ExitStack() as stack:
        fleet = Fleet(targets, models, Traffic(rate=options.rate), refresh=interval / 2)
        stack.callback(fleet.stop)
        sides: dict[str, Side] = {}
        for name in SIDES:
            workdir = root / f"n{pods}" / name
            rules = workdir / "rules.yml"
            rules.parent.mkdir(parents=True, exist_ok=True)
            rules.write_text(rule_files[name])
            config = prometheus_config(fleet.address, targets, interval, evaluation, rules)
            service = start_prometheus(workdir, _write_yaml(workdir / "prometheus.yml", config))
            stack.callback(service.stop)
            records = recorded_names(yaml.safe_load(rule_files[name]))
            sides[name] = side = Side(name, service, records)
            stack.callback(side.close)
        covers = coverages(spec, len(regions), len(models))
        _wait_covered(sides, covers, timeout=4 * interval + 4 * evaluation + 120)
        warm = time.perf_counter() - began
        print(f"  warm (both sides computed their SLIs) after {warm:.0f} s", flush=True)
        since = time.time()
        undelivered = fleet.undelivered
        end = time.monotonic() + options.duration
        while time.monotonic() < end:
            for side in sides.values():
                side.poll(since)
            time.sleep(POLL_SECONDS)
        for side in sides.values():
            side.poll(since)
        window = time.time() - since
        undelivered = fleet.undelivered - undelivered
        lookback = f"{max(int(window), 1)}s"
        slowest = {
            name: side.value(
                f'max(max_over_time(scrape_duration_seconds{{job="{ENGINE_JOB}"}}[{lookback}]))'
            )
            for name, side in sides.items()
        }
        up = {
            name: side.value(f'count(up{{job="{ENGINE_JOB}"}} == 1)')
            for name, side in sides.items()
        }
        if any(value < pods for value in up.values()):
            raise BenchmarkError(f"not every pod is up on both sides: {up} of {pods}")
        covered = not any(covers[name].missing(side) for name, side in sides.items())
        slis = {
            REDLINE: {
                slo.name: sides[REDLINE].value(f'{REDLINE_SLI_RATIO}{{slo="{slo.name}"}}')
                for slo in spec.slos
            },
            PLAIN: {
                slo.name: sides[PLAIN].value(
                    f'slo:sli_error:ratio_rate5m{{sloth_slo="{slo.name}"}}'
                )
                for slo in spec.slos
            },
        }
        results = {name: side_result(side, window) for name, side in sides.items()}
        raw = fleet.raw_series()
    seconds = time.perf_counter() - began
    return Phase(pods, raw, results, covered, up, slis, seconds, undelivered, slowest)


# ---- report -------------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


ROWS: tuple[tuple[str, str, Callable[[SideResult], float], str], ...] = (
    ("series added by the rules", "series", lambda r: float(r.series_added), ",.0f"),
    ("rule evaluation, ms", "ms", lambda r: r.eval_seconds * 1000, ",.1f"),
    ("TSDB head series", "series", lambda r: r.head_series, ",.0f"),
    ("resident memory, MB", "MB", lambda r: r.rss_bytes / 1e6, ",.0f"),
    ("CPU while measured, cores", "cores", lambda r: r.cpu_cores, ".3f"),
)
"""What the tables show of each side: label, unit, value, format (the first four are figures)."""


def print_phase(phase: Phase) -> None:
    """One fleet size's side-by-side table and where redline's cost comes from."""
    a, b = phase.results[REDLINE], phase.results[PLAIN]
    print(
        f"\nN = {phase.pods}: {phase.raw_series:,} raw engine series per scrape round; "
        f"{min(a.evaluations, b.evaluations)}+ evaluations of every group averaged"
    )
    print(f"  {'':28} {'redline':>12} {'plain':>12} {'redline/plain':>14}")
    for label, _, get, spec in ROWS:
        x, y = get(a), get(b)
        print(f"  {label:28} {x:12{spec}} {y:12{spec}} {_ratio(x, y):13.2f}x")
    for slo in phase.slis[REDLINE]:
        print(
            f"  {slo} error ratio (5m):       redline {phase.slis[REDLINE][slo]:.5f}  "
            f"plain {phase.slis[PLAIN][slo]:.5f}"
        )
    print(
        f"  {'checks':28} rule failures {a.failures:g}/{b.failures:g}, missed iterations "
        f"{a.missed:g}/{b.missed:g}, slowest pod scrape {phase.slowest_scrape[REDLINE]:.2f}/"
        f"{phase.slowest_scrape[PLAIN]:.2f} s, pages given up on {phase.undelivered}"
    )
    for name, result in phase.results.items():
        print(f"  {name}: evaluation ms per group (mean), series per recorded name")
        for group, seconds in sorted(result.eval_by_group.items(), key=lambda kv: -kv[1]):
            share = _ratio(seconds, result.eval_seconds) * 100
            print(f"    {group:52} {seconds * 1000:9.2f} ms {share:5.1f} %")
        top = sorted(result.rule_seconds.items(), key=lambda kv: -kv[1])[:8]
        for (group, rule), seconds in top:
            print(f"      rule {rule:58} {seconds * 1000:8.2f} ms ({group})")
        for record, count in sorted(result.series_by_name.items(), key=lambda kv: -kv[1]):
            print(f"    {record:64} {count:9,}")


def print_summary(phases: Sequence[Phase]) -> None:
    """Every fleet size in one table."""
    print(f"\n{'N':>6} {'':28} {'redline':>12} {'plain':>12} {'redline/plain':>14}")
    for phase in phases:
        a, b = phase.results[REDLINE], phase.results[PLAIN]
        for label, _, get, spec in ROWS:
            x, y = get(a), get(b)
            print(f"{phase.pods:6} {label:28} {x:12{spec}} {y:12{spec}} {_ratio(x, y):13.2f}x")


def phase_figures(phase: Phase) -> list[Figure]:
    """Each side's figures and their ratio; the targets at N = 1000."""
    a, b = phase.results[REDLINE], phase.results[PLAIN]
    n = f"N={phase.pods}"
    figures: list[Figure] = []
    for label, unit, get, _ in ROWS[:4]:
        x, y = get(a), get(b)
        figures += [info(NAME, f"{n}: {label}, redline", x, unit)]
        figures += [info(NAME, f"{n}: {label}, plain", y, unit)]
        ratio = _ratio(x, y)
        title = f"{n}: {label}, redline/plain"
        if phase.pods == TARGET_PODS and label.startswith("series added"):
            figures.append(at_most(NAME, title, ratio, "x", TARGET_SERIES_RATIO))
        elif phase.pods == TARGET_PODS and label.startswith("rule evaluation"):
            figures.append(at_most(NAME, title, ratio, "x", TARGET_EVAL_RATIO))
        else:
            figures.append(info(NAME, title, ratio, "x"))
    sound = (
        phase.covered
        and a.failures == b.failures == 0
        and a.missed == b.missed == 0
        and phase.undelivered == 0
    )
    label = f"{n}: both sides computed every SLI and P99; no rule failed, no scrape timed out"
    figures.append(check(NAME, label, sound, "yes"))
    return figures


def parse_args(argv: Sequence[str]) -> Options:
    """The CLI's options."""
    parser = argparse.ArgumentParser(prog="python -m bench.rules_cost", description=__doc__)
    parser.add_argument(
        "--pods",
        default=",".join(str(n) for n in DEFAULT_PODS),
        help="fleet sizes, comma-separated (default 10,100,1000)",
    )
    parser.add_argument("--models", type=int, default=2, help="models per pod (default 2)")
    parser.add_argument(
        "--scrape-interval", type=float, default=15.0, help="seconds (default 15, the spec's)"
    )
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds measured per N, after warm-up"
    )
    parser.add_argument(
        "--rate", type=float, default=0.5, help="requests/s per model per pod (default 0.5)"
    )
    args = parser.parse_args(list(argv))
    pods = tuple(int(n) for n in str(args.pods).split(",") if n.strip())
    if not pods or min(pods) < 1 or args.models < 1:
        parser.error("--pods and --models must be positive")
    return Options(pods, args.models, args.scrape_interval, args.duration, args.rate)


def run(argv: list[str] | None = None) -> list[Figure]:
    """Run every fleet size, print the tables; the figures."""
    options = parse_args(argv or [])
    if shutil.which("prometheus") is None:
        raise MissingDependencyError(
            "prometheus not installed (apt-get update && apt-get install -y prometheus)"
        )
    began = time.perf_counter()
    spec = redline_spec()
    redline_text, groups = redline_rule_file(spec)
    digest = hashlib.sha256(redline_text.encode()).hexdigest()[:12]
    rules = sum(len(group.rules) for group in groups)
    print(f"redline's rules: {len(groups)} groups, {rules} rules (rule file sha256 {digest}...)")
    rule_files = {
        REDLINE: redline_text,
        PLAIN: dump_rules(plain_rule_groups(spec)),
    }
    phases = []
    with tempfile.TemporaryDirectory(prefix="redline-bench-rules-cost-") as tmp:
        for pods in options.pods:
            phase = run_phase(Path(tmp), options, pods, spec, rule_files)
            print_phase(phase)
            phases.append(phase)
    print_summary(phases)
    wall = time.perf_counter() - began
    print(f"\nwall time {wall:.0f} s")
    figures = [figure for phase in phases for figure in phase_figures(phase)]
    return [*figures, info(NAME, "wall time", wall, "s")]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when a figure missed its target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
