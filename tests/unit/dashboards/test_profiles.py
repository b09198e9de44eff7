"""Dashboards and their sample series per source profile: panels read the catalog's recordings
(never a raw gateway or engine series where a profile maps them), panels a profile cannot fill
are left out with the reason in the description, and the samples publish each engine's own
series for the panel-query check."""

from __future__ import annotations

import re
from typing import Any

import pytest

from redline.dashboards.queries import all_panels, panel_queries, variable_queries
from redline.dashboards.render import build_dashboards, dashboard_json
from redline.devstack.samples.dashboards import build_sample_openmetrics, profile_spec
from redline.devstack.samples.prometheus import build_backfill_groups
from redline.rules.model import number
from redline.rules.records import rollback_window
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.sources import CANONICAL, PROFILES, SIGNAL_KINDS
from redline.slo.spec import Spec

GATEWAY = "redline-gateway"
ENGINES = [name for name in PROFILES if name != GATEWAY]


def _spec(profile: str) -> Spec:
    default = load_spec().spec
    if profile == GATEWAY:
        return default
    # TGI's series name no model: the spec names the one it serves.
    return profile_spec(default, profile, "chat" if profile == "tgi" else None)


def _boards(spec: Spec) -> dict[str, dict[str, Any]]:
    return {name: dashboard_json(board, "test") for name, board in build_dashboards(spec).items()}


def _exprs(board: dict[str, Any]) -> list[str]:
    exprs = [query.expr for query in panel_queries(board)]
    return exprs + [f"{v.match}" for v in variable_queries(board) if v.match]


def _reads(expr: str, name: str) -> bool:
    """True when `expr` reads the series `name` itself (or its histogram parts), not a
    recording named after it."""
    return (
        re.search(rf"(?<![\w:]){re.escape(name)}(_bucket|_count|_sum)?(?![\w:])", expr) is not None
    )


def _titles(board: dict[str, Any]) -> list[str]:
    return [panel["title"] for panel in all_panels(board)]


@pytest.mark.parametrize("profile", ENGINES)
def test_engine_profiles_read_no_raw_request_series(profile: str) -> None:
    """Every request, token and TTFT panel reads a recording: not the gateway's series (absent
    without it) and not the engine's (their labels are not the catalog's)."""
    spec = _spec(profile)
    raw = {metric.name for metric in CANONICAL.values()} | {catalog.LLM_REROUTES_TOTAL.name}
    raw |= {name for series in PROFILES[profile].series.values() for name in series.names}
    for board_name, board in _boards(spec).items():
        for expr in _exprs(board):
            read = sorted(name for name in raw if _reads(expr, name))
            assert not read, f"{profile} {board_name}: {expr} reads {read}"


def test_the_gateway_profile_reads_its_own_series_and_shows_reroutes() -> None:
    boards = _boards(_spec(GATEWAY))
    red = boards["red-lines.json"]
    assert "Reroute share" in _titles(red)
    assert any(_reads(e, catalog.LLM_REQUESTS_TOTAL.name) for e in _exprs(red))
    assert "incl. reroute" in " ".join(_titles(red))
    assert "Not shown" not in red["description"]


@pytest.mark.parametrize("profile", ENGINES)
def test_reroute_share_is_left_out_without_the_gateway(profile: str) -> None:
    red = _boards(_spec(profile))["red-lines.json"]
    titles = _titles(red)
    assert not [t for t in titles if "eroute" in t], titles
    assert f"sources.profile {profile}" in red["description"]
    assert "Not shown: reroute share, because" in red["description"]
    assert "P99 (red line 0.8 s) by region" in titles


def test_ttft_is_left_out_where_the_profile_has_none() -> None:
    tgi = _boards(_spec("tgi"))["model-drift.json"]
    assert not [t for t in _titles(tgi) if t.startswith("TTFT")]
    assert "Not shown: TTFT P99, because TGI publishes no time-to-first-token" in tgi["description"]
    (tokens,) = [p for p in all_panels(tgi) if p["title"].startswith("Tokens/s")]
    assert tokens["gridPos"]["w"] == 24
    vllm = _boards(_spec("vllm"))["model-drift.json"]
    window = _spec("vllm").red_lines.latency_p99.window
    ttft = catalog.quantile_record(catalog.LLM_TIME_TO_FIRST_TOKEN_SECONDS.name, "99", window)
    assert any(ttft in e for e in _exprs(vllm))
    assert f"TTFT P99 ({window})" in _titles(vllm)


@pytest.mark.parametrize("profile", [GATEWAY, "vllm"])
def test_model_board_shows_tokens_ttft_wilson_bound_and_verdicts(profile: str) -> None:
    spec = _spec(profile)
    board = _boards(spec)["model-drift.json"]
    window = rollback_window(spec)
    exprs = "\n".join(_exprs(board))
    red_window = spec.red_lines.latency_p99.window
    for kind in ("generated", "prompt"):
        assert catalog.tokens_rate_record(kind, red_window) in exprs
    assert catalog.accuracy_upper_bound_record(window) in exprs
    (accuracy,) = [p for p in all_panels(board) if p["title"].startswith("Accuracy over")]
    legends = [t["legendFormat"] for t in accuracy["targets"]]
    assert any(legend.startswith("Wilson upper bound (95 %)") for legend in legends)
    (verdicts,) = [p for p in all_panels(board) if p["title"].startswith("Accuracy verdicts")]
    assert catalog.eval_verdicts_record(window) in verdicts["targets"][0]["expr"]
    steps = [s["value"] for s in verdicts["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert spec.rollback.min_eval_samples in steps
    assert f"gate needs {spec.rollback.min_eval_samples}" in verdicts["title"]


def _sample_names(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def test_vllm_samples_publish_vllms_own_series_and_the_active_version() -> None:
    spec = _spec("vllm")
    text = build_sample_openmetrics(spec, 0, 600, 60)
    names = _sample_names(text)
    profile = PROFILES["vllm"]
    for signal, series in profile.series.items():
        for name in series.names:
            histogram = SIGNAL_KINDS[signal] == "histogram"
            parts = ("_bucket", "_count", "_sum") if histogram else ("",)
            assert {name + part for part in parts} <= names, (signal, name)
    gateway = {m.name for m in CANONICAL.values()} | {catalog.LLM_REROUTES_TOTAL.name}
    assert not {n for n in names if any(_reads(n, g) for g in gateway)}
    assert catalog.MODEL_ACTIVE_INFO.name in names
    latency = profile.series["request_duration"].names[0]
    bounds = set(re.findall(rf'^{re.escape(latency)}_bucket{{[^}}]*le="([^"]+)"', text, re.M))
    assert bounds == {number(b) for b in profile.buckets} | {"+Inf"}
    assert f'{profile.labels["model"]}="chat"' in text
    # vLLM 0.33 counts finished requests by finished_reason, failures as "error".
    finished = re.escape("vllm:request_success_total")
    assert re.search(rf'^{finished}\{{[^}}]*finished_reason="error"', text, re.M)
    assert re.search(rf'^{finished}\{{[^}}]*finished_reason="(?!error")', text, re.M)


@pytest.mark.parametrize("profile", ENGINES)
def test_every_profile_samples_its_request_and_error_series(profile: str) -> None:
    spec = _spec(profile)
    names = _sample_names(build_sample_openmetrics(spec, 0, 600, 60))
    sources = spec.sources.resolve()
    for signal in ("requests", "errors", "generated_tokens", "prompt_tokens"):
        series = sources.series(signal)
        assert series is not None
        assert set(series.names) <= names, (signal, series.names)
    ttft = sources.series("time_to_first_token")
    if ttft is not None:
        assert f"{ttft.names[0]}_bucket" in names


@pytest.mark.parametrize("profile", [GATEWAY, *ENGINES])
def test_backfill_passes_load_what_each_recording_reads_first(profile: str) -> None:
    passes = build_backfill_groups(_spec(profile), 30.0)
    assert passes and passes[0]
    done: set[str] = set()
    every = {r.record for batch in passes for g in batch for r in g.recordings}
    for batch in passes:
        names = {r.record for g in batch for r in g.recordings}
        for group in batch:
            for rule in group.recordings:
                reads = {n for n in every - {rule.record} if _reads(rule.expr, n)}
                assert reads <= done, (rule.record, reads - done)
        done |= names
    assert done == every
