"""Reading an engine's series where they are (`redline.rules.signals`) and the per-profile
promtool inputs: names that never shadow an engine's, no engine series copied, rates taken on
raw series, label mapping inside the sums, the version join after them, SLI selectors on the
engine's labels, and raw series that the profile's selectors read."""

from __future__ import annotations

import re

import pytest

from redline.rules.build import build_rule_groups, build_rule_tests
from redline.rules.families import sources
from redline.rules.families.rollback import wilson_upper
from redline.rules.families.slo import slo_error_ratio_expr
from redline.rules.model import RecordingRule
from redline.rules.promtool_cases import (
    CaseInputError,
    engine_labels,
    histogram,
    matches,
    request_counters,
    satisfying,
)
from redline.rules.signals import NOTHING, aggregate
from redline.slo import catalog
from redline.slo.load import load_spec
from redline.slo.sources import PROFILE_NAMES, PROFILES, SIGNAL_KINDS
from redline.slo.spec import SeriesOverride, Sources, Spec

ENGINE_PROFILES = [name for name in PROFILE_NAMES if name != "redline-gateway"]
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
RATE_ARGUMENT = re.compile(r"\b(rate|increase)\(")


def profile_spec(profile: str, **sources: object) -> Spec:
    """The default spec reading its SLIs from `profile` (TGI's series name no model)."""
    base = load_spec().spec
    if profile == "tgi":
        sources.setdefault("model", "chat")
    return base.model_copy(update={"sources": Sources(profile=profile, **sources)})  # type: ignore[arg-type]


def _records(spec: Spec) -> list[RecordingRule]:
    return [rule for group in build_rule_groups(spec) for rule in group.recordings]


def _engine_series_names(profile: str | None = None) -> set[str]:
    names = set()
    for name_of, found_profile in PROFILES.items():
        if profile is not None and name_of != profile:
            continue
        for signal, found in found_profile.series.items():
            for name in found.names:
                names.add(name)
                if SIGNAL_KINDS[signal] == "histogram":
                    names.update(f"{name}{suffix}" for suffix in HISTOGRAM_SUFFIXES)
    return names


def _reads(expr: str, name: str) -> bool:
    return re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr) is not None


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_no_record_shadows_a_series_of_any_profile(profile: str) -> None:
    engine = _engine_series_names()
    for rule in _records(profile_spec(profile)):
        assert rule.record.startswith(catalog.RECORD_PREFIX), rule.record
        assert rule.record not in engine, f"{rule.record} would shadow an engine's own series"
        assert rule.record not in catalog.series_names(), rule.record


def test_the_gateway_reads_every_signal_as_it_is() -> None:
    spec = load_spec().spec
    assert sources.build_rules(spec) == []
    text = " ".join(rule.expr for rule in _records(spec))
    assert "source_series" not in text and catalog.MODEL_ACTIVE_VERSION_RECORD not in text


@pytest.mark.parametrize("profile", ENGINE_PROFILES)
def test_an_engine_profile_copies_no_series_and_records_only_aggregates(profile: str) -> None:
    """Every recording that reads an engine series sums it (or is the active-version join
    key): none of them is one series per raw series, as a mirror of the engine's was."""
    spec = profile_spec(profile)
    (group,) = sources.build_rules(spec)
    assert [rule.record for rule in group.recordings] == [catalog.MODEL_ACTIVE_VERSION_RECORD]
    engine = _engine_series_names(profile)
    reading = [
        rule
        for rule in _records(spec)
        if any(_reads(rule.expr, name) for name in engine)
        and rule.record != catalog.MODEL_ACTIVE_VERSION_RECORD
    ]
    assert reading
    for rule in reading:
        assert re.search(r"\b(sum|histogram_quantile)\b", rule.expr), rule.record


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_rates_are_taken_on_raw_series_before_any_sum(profile: str) -> None:
    """A counter reset stays on its own series: every rate()/increase() of a rule reads a
    selector, never an aggregation or a label_replace."""
    for group in build_rule_groups(profile_spec(profile)):
        for rule in group.rules:
            for found in RATE_ARGUMENT.finditer(rule.expr):
                argument = rule.expr[found.end() :].split("[", 1)[0]
                assert "(" not in argument, (rule.expr, argument)


def test_vllm_labels_are_mapped_inside_the_sums_and_the_version_joined_after() -> None:
    spec = profile_spec("vllm")
    by_version = aggregate(
        spec, "request_duration", "5m", ("le", "model", "model_version"), suffix="_bucket"
    )
    assert "rate(vllm:e2e_request_latency_seconds_bucket[5m])" in by_version
    assert '"model", "$1", "model_name", "(.*)"' in by_version
    assert by_version.index("sum by (le, model) (") < by_version.index("group_left")
    assert f"* on (model) group_left (model_version) {catalog.MODEL_ACTIVE_VERSION_RECORD}" in (
        by_version
    )
    tokens = aggregate(spec, "generated_tokens", "5m", ("served_region", "model", "model_version"))
    assert '"served_region", "$1", "region", "(.*)"' in tokens
    assert "rerouted" not in tokens
    # Only the labels a sum keeps are mapped.
    by_region = aggregate(spec, "request_duration", "5m", ("le", "region"), suffix="_bucket")
    assert "label_replace" not in by_region and "group_left" not in by_region
    (group,) = sources.build_rules(spec)
    active = group.recordings[0].expr
    assert active.startswith("topk by (model) (")
    assert "max by (model, model_version) (" in active
    assert f'{catalog.MODEL_ACTIVE_INFO},\n      "model_version", "$1", "version", "(.*)"' in active
    assert "or on (model)\nlabel_replace(\n  group by (model) (" in active
    assert '"model_version", "unknown", "", ""' in active


def test_several_names_stay_distinct_series() -> None:
    expr = aggregate(profile_spec("nim"), "requests", "5m", ("region",))
    assert '"source_series", "request_success_total", "", ""' in expr
    assert '"source_series", "request_failure_total", "", ""' in expr
    assert re.search(r"\n *or\n *label_replace\(\n *rate\(request_failure_total\[5m\]\),", expr)


def test_a_constant_model_and_an_engine_version_label() -> None:
    tgi = aggregate(profile_spec("tgi"), "requests", "5m", ("model",))
    assert '"model", "chat", "", ""' in tgi
    own = profile_spec("vllm", labels={"model_version": "adapter", "region": "cluster"})
    expr = aggregate(own, "requests", "5m", ("region", "model_version"))
    assert '"model_version", "$1", "adapter", "(.*)"' in expr
    assert '"region", "$1", "cluster", "(.*)"' in expr
    assert "group_left" not in expr
    assert sources.build_rules(own) == []


def test_sli_selectors_read_the_engines_labels() -> None:
    vllm = profile_spec("vllm")
    expr = aggregate(vllm, "request_duration", "5m", suffix="_count", selector={"model": "m3"})
    assert 'vllm:e2e_request_latency_seconds_count{model_name="m3"}' in expr
    version = aggregate(vllm, "requests", "5m", selector={"model_version": "v2"})
    assert f'{catalog.MODEL_ACTIVE_VERSION_RECORD}{{model_version="v2"}}' in version
    tgi = profile_spec("tgi")
    assert aggregate(tgi, "requests", "5m", selector={"model": "other"}) == NOTHING
    assert "{}" not in aggregate(tgi, "requests", "5m", selector={"model": "chat"})


def test_a_gateway_override_with_matchers_is_read_without_mapping() -> None:
    spec = profile_spec(
        "redline-gateway",
        series={"errors": SeriesOverride(names=("llm_failures_total",), matchers=('code="5"',))},
    )
    assert aggregate(spec, "errors", "5m") == 'sum(rate(llm_failures_total{code="5"}[5m]))'
    assert sources.build_rules(spec) == []


@pytest.mark.parametrize(
    ("profile", "threshold", "le"),
    [("redline-gateway", 0.8, 'le="0.8"'), ("otel-genai", 0.8, 'le="0.64"'), ("vllm", 1.0, "le=~")],
)
def test_slow_requests_count_at_the_profile_bucket(profile: str, threshold: float, le: str) -> None:
    spec = profile_spec(profile)
    slo = spec.slos[0].model_copy(
        update={"sli": spec.slos[0].sli.model_copy(update={"threshold_seconds": threshold})}
    )
    assert le in slo_error_ratio_expr(spec, slo, "5m")


def test_matchers_are_satisfied_and_violated() -> None:
    assert matches('status="5xx"', {"status": "5xx"})
    assert not matches('status="5xx"', {})
    assert matches('error_type!=""', {"error_type": "x"})
    assert matches('handler=~"/v1/(chat/)?completions"', {"handler": "/v1/completions"})
    assert matches('code!~"2.."', {"code": "500"})
    got = satisfying(('handler=~"/v1/chat/completions|/v1/responses"', 'status=~"5.."'), {})
    assert re.fullmatch("/v1/chat/completions|/v1/responses", got["handler"])
    assert re.fullmatch("5..", got["status"])
    with pytest.raises(CaseInputError, match="no example label value"):
        satisfying(('x=~"[a-f]{40}"',), {})


def test_vllm_errors_are_written_once_and_successes_beside_them() -> None:
    spec = profile_spec("vllm")
    labels = {"region": "primary", "model": "chat", "model_version": "v1", "status": "200"}
    inputs = request_counters(spec, labels, 100, 10, 5)
    # vLLM 0.33's finished requests, the errors among them by finished_reason.
    assert inputs == {
        'vllm:request_success_total{finished_reason="error",model_name="chat",'
        'region="primary"}': "0+10x5",
        'vllm:request_success_total{finished_reason="stop",model_name="chat",'
        'region="primary"}': "0+90x5",
        f'{catalog.MODEL_ACTIVE_INFO}{{model="chat",version="v1"}}': "1+0x5",
    }


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_case_counters_add_up_under_the_profile_selectors(profile: str) -> None:
    """What the rules' selectors read from the written raw series is what the case meant."""
    spec = profile_spec(profile)
    resolved = spec.sources.resolve()
    labels = {"region": "primary", "model": "chat", "model_version": "v1", "status": "200"}
    inputs = request_counters(spec, labels, 100, 10, 5)
    totals = {}
    for signal in ("requests", "errors"):
        found = resolved.series(signal)
        assert found is not None
        total = 0.0
        for key, values in inputs.items():
            name, _, inner = key.partition("{")
            raw = dict(re.findall(r'(\w+)="([^"]*)"', inner))
            if name in found.names and all(matches(m, raw) for m in found.matchers_of(name)):
                total += float(values.split("+")[1].split("x")[0])
        totals[signal] = total
    assert totals == {"requests": 100, "errors": 10}


@pytest.mark.parametrize("profile", ENGINE_PROFILES)
def test_case_histograms_are_the_engines_own(profile: str) -> None:
    spec = profile_spec(profile)
    labels = {"region": "primary", "served_region": "secondary", "rerouted": "true",
              "model": "chat", "model_version": "v2", "status": "200"}  # fmt: skip
    raw = engine_labels(spec, labels)
    profile_labels = PROFILES[profile].labels
    assert raw == {engine: labels[label] for label, engine in profile_labels.items()}
    inputs = histogram(spec, labels, {spec.sources.buckets[0]: 1}, 3)
    found = PROFILES[profile].series["request_duration"]
    assert any(key.startswith(f"{found.names[0]}_bucket{{") for key in inputs)
    assert f'{catalog.MODEL_ACTIVE_INFO}{{model="chat",version="v2"}}' in inputs


def test_the_wilson_bound_matches_the_issue() -> None:
    # One wrong answer in 120 from a perfect baseline is no evidence of a 0.8-point drop...
    assert 1.0 - wilson_upper(119 / 120, 120, 0.95) < 0.008
    # ...a true 2-point drop over 2000 verdicts is.
    assert wilson_upper(0.88, 2000, 0.95) == pytest.approx(0.8915, abs=5e-4)
    assert 0.9 - wilson_upper(0.88, 2000, 0.95) > 0.008


def test_the_gate_cases_cover_the_statistics() -> None:
    spec = load_spec().spec
    tests = build_rule_tests(spec, build_rule_groups(spec), [])["tests"]
    names = [case["name"] for case in tests]
    assert "rollback gate: one wrong answer out of 120 stays silent" in names
    assert "rollback gate: a 2-point drop over 2000 verdicts fires" in names
    assert "rollback gate: both signals under min_eval_samples verdicts stay silent" in names
    assert "latency SLO: every request bad but fewer than min_events (100) is silent" in names


def test_min_events_guards_every_burn_condition_and_zero_turns_it_off() -> None:
    spec = load_spec().spec
    alerts = [a for g in build_rule_groups(spec) for a in g.alerts if a.labels.get("slo")]
    for alert in alerts:
        conditions = alert.expr.split("\nor\n")
        assert all(">= 100" in c and "redline:slo_events:increase" in c for c in conditions)
    off = spec.model_copy(
        update={"slos": tuple(s.model_copy(update={"min_events": 0}) for s in spec.slos)}
    )
    text = " ".join(rule.expr for g in build_rule_groups(off) for rule in g.rules)
    assert "redline:slo_events" not in text
    assert not any(
        "min_events" in c["name"]
        for c in build_rule_tests(off, build_rule_groups(off), [])["tests"]
    )
