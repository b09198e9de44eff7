"""From the P99 panel to one slow request's trace, through a real Prometheus.

The real gateway (tracing on, its OTLP/HTTP exporter sending to the local stack's trace store)
in front of two simulated regions; a real Prometheus with exemplar storage scrapes it (OpenMetrics,
which Prometheus asks for first). Traced requests go through, some rerouted (the primary made to
fail through its /admin/faults); the red-lines dashboard's exemplar query, sent to
`/api/v1/query_exemplars`, must give back trace ids the test sent, and the trace store must hold
the rerouted one's span tree: the client's span -> the gateway's SERVER span -> a failed attempt
on the primary -> a good attempt on the secondary.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from prometheus_client import CollectorRegistry

from redline.core.servers import ServerThread, serve_in_thread
from redline.dashboards.boards.red_lines import build_red_lines_dashboard, exemplar_query
from redline.devstack.processes import start_prometheus
from redline.devstack.tracestore import TraceStoreSettings, build_trace_store_app
from redline.gateway import GatewaySettings, build_gateway_app
from redline.gateway.tracing import GatewayTracing, build_provider
from redline.slo.load import load_spec
from tests.support.gateway import simulators

pytestmark = pytest.mark.integration

SPEC = load_spec(None).spec
CLOSED_REDIS = "redis://127.0.0.1:9/0"  # no routing store: the configured order


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, ServerThread]]:
    with simulators(("primary", "secondary")) as servers:
        yield servers


@pytest.fixture(scope="module")
def store() -> Iterator[ServerThread]:
    with serve_in_thread(build_trace_store_app(TraceStoreSettings())) as server:
        yield server


def _panel_exemplar_expr() -> str:
    """The exemplar target of the red-lines dashboard's P99 graph, variables filled in."""
    board = build_red_lines_dashboard(SPEC).to_json_data()
    found = [
        target.to_json_data()["expr"]
        for panel in board["panels"]
        for target in getattr(panel, "targets", [])
        if target.to_json_data().get("exemplar") is True
    ]
    assert found == [exemplar_query(SPEC)]
    return str(found[0]).replace("$region", ".*").replace("$__rate_interval", "1m")


def _send(client: httpx.Client, rerouted: bool, fault: str) -> str:
    trace_id = secrets.token_hex(16)
    httpx.post(fault, json={"outage": "unavailable"} if rerouted else {}).raise_for_status()
    answer = client.post(
        "/v1/chat/completions",
        json={"model": "redline-base", "messages": [{"role": "user", "content": "hello"}]},
        headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-redline-rerouted"] == ("true" if rerouted else "false")
    return trace_id


def test_a_rerouted_requests_trace_is_found_from_the_p99_panels_exemplars(
    sims: dict[str, ServerThread], store: ServerThread, tmp_path: Path
) -> None:
    exporter = OTLPSpanExporter(endpoint=f"{store.url}/v1/traces")
    tracing = GatewayTracing(build_provider([exporter]))  # batched, as in production
    settings = GatewaySettings(
        upstreams={region: server.url for region, server in sims.items()},
        redis_url=CLOSED_REDIS,
        tracing=True,
        unhealthy_after_failures=0,  # every rerouted request tries the failing primary first
    )
    gateway = serve_in_thread(build_gateway_app(settings, SPEC, CollectorRegistry(), tracing))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "gateway", "static_configs": [
            {"targets": [gateway.url.removeprefix("http://")]}]}],
    }  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    prometheus = start_prometheus(
        tmp_path / "prom",
        tmp_path / "prometheus.yml",
        extra_args=("--enable-feature=exemplar-storage",),
    )
    fault = f"{sims['primary'].url}/admin/faults"
    try:
        with httpx.Client(base_url=gateway.url, timeout=10) as client:
            sent = {_send(client, rerouted, fault): rerouted for rerouted in (False, True) * 4}
        httpx.post(fault, json={}).raise_for_status()
        tracing.provider.force_flush()  # type: ignore[union-attr]
        expr = _panel_exemplar_expr()

        def exemplars() -> list[dict[str, Any]] | None:
            now = time.time()
            answer = httpx.get(
                f"{prometheus.url}/api/v1/query_exemplars",
                params={"query": expr, "start": now - 300, "end": now + 60},
            )
            answer.raise_for_status()
            found = [
                {**series["seriesLabels"], **e["labels"]}
                for series in answer.json()["data"]
                for e in series["exemplars"]
            ]
            ids = {e.get("trace_id") for e in found}
            rerouted = [t for t, r in sent.items() if r and t in ids]
            return found if rerouted and ids & {t for t, r in sent.items() if not r} else None

        deadline = time.monotonic() + 30
        found = exemplars()
        while found is None and time.monotonic() < deadline:
            time.sleep(0.5)
            found = exemplars()
        assert found is not None, "no exemplars of both kinds within 30 s"
        # Every exemplar is a trace this test sent, on the series its request was counted in.
        for exemplar in found:
            assert exemplar["trace_id"] in sent
            assert exemplar["rerouted"] == ("true" if sent[exemplar["trace_id"]] else "false")
        trace_id = next(e["trace_id"] for e in found if e["rerouted"] == "true")
        answer = httpx.get(f"{store.url}/api/traces/{trace_id}")
        answer.raise_for_status()
        spans = answer.json()["spans"]
        (server,) = [s for s in spans if s["kind"] == "SERVER"]
        attempts = sorted(
            (s for s in spans if s["kind"] == "CLIENT"),
            key=lambda s: s["attributes"]["redline.attempt"],
        )
        assert server["parent_span_id"] is not None  # the client's span: the trace continues
        assert server["attributes"]["redline.rerouted"] is True
        assert server["attributes"]["redline.served_region"] == "secondary"
        assert [a["parent_span_id"] for a in attempts] == [server["span_id"]] * 2
        failed, good = attempts
        assert failed["attributes"]["redline.region"] == "primary"
        assert failed["attributes"]["redline.reroute_reason"] == "server_error"
        assert failed["status"]["code"] == "ERROR"
        assert good["attributes"]["redline.region"] == "secondary"
        assert good["status"]["code"] != "ERROR"
        assert good["attributes"]["gen_ai.usage.output_tokens"] > 0
    finally:
        httpx.post(fault, json={})
        prometheus.stop()
        gateway.stop()
        tracing.shutdown()
