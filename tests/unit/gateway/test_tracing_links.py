"""Where a latency exemplar leads: the P99 panel's exemplar target, the spec's trace link and the
Grafana data sources that carry it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from redline.dashboards.boards.red_lines import exemplar_query
from redline.dashboards.render import build_dashboards, dashboard_json
from redline.devstack.samples.dashboards import profile_spec
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.spec import DEFAULT_TRACE_URL, Spec, Tracing

ROOT = Path(__file__).resolve().parents[3]
DATASOURCES = ROOT / "compose/grafana/provisioning/datasources/datasources.yml"
SPEC = load_spec(None).spec


def _exemplar_targets(spec: Spec) -> list[tuple[str, dict[str, Any]]]:
    board = dashboard_json(build_dashboards(spec)["red-lines.json"], "test")
    return [
        (panel["title"], target)
        for panel in board["panels"]
        for target in panel.get("targets", [])
        if target.get("exemplar")
    ]


def test_the_p99_graph_reads_exemplars_from_the_gateways_raw_buckets() -> None:
    ((title, target),) = _exemplar_targets(SPEC)
    assert title.startswith("P99") and title.endswith("by region")
    assert target["expr"] == exemplar_query(SPEC)
    # Raw buckets, not a recorded series: exemplars are stored on scraped series only.
    assert f"{catalog.LLM_REQUEST_DURATION_SECONDS.bucket}{{" in target["expr"]
    assert target["expr"].startswith("histogram_quantile(0.99, sum by (le, region) (rate(")
    assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_without_the_gateway_there_is_no_exemplar_target() -> None:
    assert _exemplar_targets(profile_spec(SPEC, "vllm")) == []


def test_the_spec_names_where_a_trace_opens() -> None:
    assert SPEC.tracing.trace_url_template == DEFAULT_TRACE_URL
    custom = "https://tempo.example.com/explore?trace=${__value.raw}"
    assert Tracing(trace_url_template=custom).trace_url_template == custom
    with pytest.raises(ValidationError, match=r"\$\{__value.raw\}"):
        Tracing(trace_url_template="http://localhost:16686/trace/")


def test_grafanas_prometheus_sources_link_exemplars_to_the_specs_trace_url() -> None:
    sources = yaml.safe_load(DATASOURCES.read_text("utf-8"))["datasources"]
    uids = {source["uid"] for source in sources}
    prometheus = [s for s in sources if s["type"] == "prometheus"]
    assert prometheus
    for source in prometheus:
        links = source["jsonData"]["exemplarTraceIdDestinations"]
        assert {link["name"] for link in links} == {"trace_id"}  # the gateway's exemplar label
        urls = [link["url"].replace("$$", "$") for link in links if "url" in link]
        assert urls == [SPEC.tracing.trace_url_template]
        assert all(link["datasourceUid"] in uids for link in links if "datasourceUid" in link)
