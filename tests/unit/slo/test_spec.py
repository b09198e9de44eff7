"""The spec model and loader: defaults, errors that name file and field, cross-field checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redline.slo.load import SpecError, apply_profile, default_spec_text, load_spec, parse_spec
from redline.slo.spec import PLAYBOOK_NAMES, parse_duration


def _spec_with(**changes: object) -> str:
    data = yaml.safe_load(default_spec_text())
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    return yaml.safe_dump(data)


def _problems(text: str, source: str = "spec.yaml") -> list[str]:
    # As `redline validate` checks it: the playbooks it may name are the built-in ones.
    with pytest.raises(SpecError) as info:
        parse_spec(text, source, PLAYBOOK_NAMES)
    return info.value.problems


def test_default_spec_carries_the_seed_numbers() -> None:
    loaded = load_spec()
    spec = loaded.spec
    assert spec.version == "v1"
    assert spec.red_lines.latency_p99.threshold_seconds == 0.8
    assert spec.red_lines.latency_p99.includes_reroute is True
    assert spec.red_lines.context_keepalive.min_seconds == 300
    assert spec.red_lines.index_consistency.max_staleness_seconds == 12
    assert (
        spec.rpo.lora_adapter.max_seconds,
        spec.rpo.lora_adapter.checkpoint_interval_seconds,
    ) == (
        90,
        120,
    )
    assert spec.rpo.session_state.max_seconds == 3
    assert spec.rpo.embedding_index.max_seconds == 12
    gate = spec.rollback
    assert (gate.p99_increase_ratio, gate.accuracy_drop, gate.window_seconds, gate.min_samples) == (
        0.15,
        0.008,
        300,
        2000,
    )
    assert gate.playbook == "semantic_rollback"
    assert [(s.name, s.objective) for s in spec.slos] == [
        ("latency", 0.99),
        ("availability", 0.999),
    ]


def test_default_spec_warns_that_a_120s_checkpoint_cannot_hold_a_90s_rpo() -> None:
    warnings = load_spec().warnings
    assert [w.field for w in warnings] == [
        "rpo.lora_adapter.checkpoint_interval_seconds",
        "escalation",
    ]
    assert "120 s cannot guarantee an RPO of 90 s" in warnings[0].message


def test_spec_is_frozen() -> None:
    spec = load_spec().spec
    with pytest.raises(ValueError):
        spec.red_lines.latency_p99.threshold_seconds = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("version: v1\nservice: [unclosed", "line 2", "malformed YAML"),
        (_spec_with(colour="red"), "colour", "unknown field"),
        (
            _spec_with(red_lines__latency_p99__threshold_seconds="fast"),
            "red_lines.latency_p99.threshold_seconds",
            "valid number",
        ),
        (
            _spec_with(red_lines__latency_p99__threshold_seconds=-1),
            "red_lines.latency_p99.threshold_seconds",
            "greater than 0",
        ),
        (
            _spec_with(rollback__playbook="reboot_everything"),
            "rollback.playbook",
            "'semantic_rollback'",
        ),
        (_spec_with(version="v2"), "version", "'v1'"),
        (
            _spec_with(slos=[{"name": "x", "objective": 1.5, "sli": {"kind": "errors"}}]),
            "slos[0].objective",
            "less than 1",
        ),
        (
            _spec_with(slos=[{"name": "x", "objective": 0.9, "sli": {"kind": "bogus"}}]),
            "slos[0].sli",
            "kind",
        ),
        (_spec_with(regions=["a", "a"]), "regions", "unique"),
        ("- just\n- a list\n", "(top level)", "expected a mapping"),
        ("", "(top level)", "empty document"),
    ],
)
def test_bad_input_names_file_and_field(text: str, field: str, message: str) -> None:
    problems = _problems(text)
    matching = [p for p in problems if p.startswith(f"spec.yaml: {field}")]
    assert matching, problems
    assert any(message in p for p in matching), problems


def test_unknown_playbook_lists_the_allowed_ones() -> None:
    (line,) = _problems(_spec_with(red_lines__latency_p99__playbook="restart"))
    for name in PLAYBOOK_NAMES:
        assert name in line


def test_missing_file_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "nope.yaml")
    assert info.value.problems == [f"{tmp_path / 'nope.yaml'}: (file): no such file"]


def test_latency_threshold_without_a_bucket_is_an_error() -> None:
    problems = _problems(_spec_with(red_lines__latency_p99__threshold_seconds=0.75))
    assert any(
        p.startswith(
            "spec.yaml: red_lines.latency_p99.threshold_seconds: error: 0.75 s is not a bucket"
        )
        for p in problems
    ), problems


def test_slo_threshold_without_a_bucket_is_an_error() -> None:
    slos = [
        {
            "name": "fast",
            "objective": 0.9,
            "sli": {"kind": "slow_requests", "threshold_seconds": 0.25},
        }
    ]
    problems = _problems(_spec_with(slos=slos))
    assert any("slos[0].sli.threshold_seconds: error" in p for p in problems), problems


def test_window_shorter_than_scrape_interval_is_an_error() -> None:
    problems = _problems(_spec_with(timing__scrape_interval_seconds=600))
    assert any("rollback.window_seconds: error" in p and "shorter than" in p for p in problems)


def test_window_shorter_than_four_scrapes_warns() -> None:
    loaded = parse_spec(_spec_with(timing__scrape_interval_seconds=100), "spec.yaml")
    assert any(w.field == "rollback.window_seconds" for w in loaded.warnings)


def test_profile_overrides_timing_and_for_durations() -> None:
    spec = apply_profile(load_spec().spec, "local")
    assert spec.timing.scrape_interval_seconds == 1
    assert spec.red_lines.latency_p99.for_seconds == 2
    assert spec.rollback.for_seconds == 2
    with pytest.raises(SpecError, match="unknown profile 'nope'; allowed: local"):
        apply_profile(load_spec().spec, "nope")


def test_parse_duration() -> None:
    assert parse_duration("30d") == 30 * 86400
    assert parse_duration("5m") == 300
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("5 minutes")


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=8),
)
_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
_keys = st.sampled_from(
    ["version", "service", "regions", "red_lines", "rpo", "rollback", "slos", "drift", "sources",
     "timing", "profiles", "receiver", "runbook_base_url", "junk"]
)  # fmt: skip


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(_keys, _values, max_size=8))
def test_generated_specs_never_crash_the_loader(data: dict[str, object]) -> None:
    text = yaml.safe_dump(data)
    try:
        parse_spec(text, "fuzz.yaml")
    except SpecError as exc:
        assert exc.problems
        assert all(line.startswith("fuzz.yaml: ") for line in exc.problems)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_crashes_the_loader(text: str) -> None:
    try:
        parse_spec(text, "fuzz.yaml")
    except SpecError as exc:
        assert all(line.startswith("fuzz.yaml: ") for line in exc.problems)


@settings(max_examples=100, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "red_lines__latency_p99__for_seconds": st.integers(0, 10**6),
            "rollback__min_samples": st.integers(1, 10**7),
            "rollback__p99_increase_ratio": st.floats(0.001, 10),
            "rpo__session_state__max_seconds": st.floats(0.1, 10**5),
        }
    )
)
def test_valid_variations_load(changes: dict[str, object]) -> None:
    loaded = parse_spec(_spec_with(**changes), "ok.yaml")
    assert loaded.spec.rollback.min_samples == changes["rollback__min_samples"]


# --- source profiles -----------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[3] / "slo" / "specs" / "examples"


def _with_sources(sources: dict[str, object], **changes: object) -> str:
    data = yaml.safe_load(_spec_with(**changes))
    data["sources"] = sources
    return yaml.safe_dump(data)


@pytest.mark.parametrize(
    ("sources", "field", "message"),
    [
        (
            {"profile": "triton"},
            "sources.profile",
            "'redline-gateway', 'vllm', 'sglang', 'tgi', 'nim' or 'otel-genai'",
        ),
        (
            {"profile": "vllm", "labels": {"colour": "hue"}},
            "sources.labels.colour",
            "cannot map a catalog label 'colour'; allowed: region, model, model_version, status",
        ),
        (
            {"profile": "redline-gateway", "labels": {"model": "model_name"}},
            "sources.labels.model",
            "label overrides apply to engine profiles (vllm, sglang, tgi, nim, otel-genai)",
        ),
        (
            {"profile": "vllm", "series": {"errors": {"names": ["x_total"], "matchers": ["a=b"]}}},
            "sources.series.errors.matchers",
            'not a PromQL label matcher like status="5xx" (operators =, !=, =~, !~',
        ),
        (
            {"profile": "vllm", "series": {"latency": {"names": ["x"]}}},
            "sources.series.latency",
            "'request_duration', 'requests', 'errors'",
        ),
        ({"profile": "tgi"}, "sources.model", "set sources.model to the model it serves"),
    ],
)
def test_bad_sources_name_the_field_and_the_allowed(
    sources: dict[str, object], field: str, message: str
) -> None:
    problems = _problems(_with_sources(sources))
    assert any(p.startswith(f"spec.yaml: {field}: ") and message in p for p in problems), problems
    assert not any("Value error" in p for p in problems), problems


def test_an_engine_threshold_off_the_buckets_warns_with_the_bucket_used() -> None:
    loaded = parse_spec(_with_sources({"profile": "otel-genai"}), "spec.yaml")
    by_field = {w.field: w for w in loaded.warnings}
    slow = by_field["slos[0].sli.threshold_seconds"]
    assert slow.level == "warning"
    assert "0.8 s is not a bucket of the otel-genai profile's latency histogram" in slow.message
    assert "requests over 0.64 s count as slow" in slow.message
    red = by_field["red_lines.latency_p99.threshold_seconds"]
    assert "interpolated between the buckets 0.64 s and 1.28 s" in red.message


def test_an_engine_threshold_under_every_bucket_is_an_error() -> None:
    text = _with_sources({"profile": "vllm"}, red_lines__latency_p99__threshold_seconds=0.1)
    problems = _problems(text)
    assert any(
        "red_lines.latency_p99.threshold_seconds: error: 0.1 s is below every bucket of the "
        "vllm profile's latency histogram" in p
        for p in problems
    ), problems


def test_what_a_profile_cannot_provide_is_a_warning() -> None:
    loaded = parse_spec(_with_sources({"profile": "tgi", "model": "chat"}), "spec.yaml")
    lines = [w.render("spec.yaml") for w in loaded.warnings]
    assert any(
        line.startswith(
            "spec.yaml: sources.series.time_to_first_token: warning: not available "
            "from tgi: TGI publishes no time-to-first-token histogram"
        )
        for line in lines
    ), lines
    assert any(
        line.startswith(
            "spec.yaml: red_lines.latency_p99.includes_reroute: warning: P99 "
            "including reroute needs redline's gateway"
        )
        for line in lines
    ), lines
    assert any(line.startswith("spec.yaml: sources.profile: warning: tgi: ") for line in lines)
    # Said false, the reroute warning goes away: the user knows.
    quiet = parse_spec(
        _with_sources(
            {"profile": "tgi", "model": "chat"}, red_lines__latency_p99__includes_reroute=False
        ),
        "spec.yaml",
    )
    assert "red_lines.latency_p99.includes_reroute" not in {w.field for w in quiet.warnings}


def test_the_gateway_profile_adds_no_warning() -> None:
    assert [w.field for w in load_spec().warnings] == [
        "rpo.lora_adapter.checkpoint_interval_seconds",
        "escalation",
    ]


@pytest.mark.parametrize("profile", ["vllm", "sglang", "tgi", "nim", "otel-genai"])
def test_every_engine_profile_has_a_minimal_example_that_loads(profile: str) -> None:
    loaded = load_spec(EXAMPLES / f"{profile}.yaml")
    assert loaded.spec.sources.profile == profile
    assert set(yaml.safe_load((EXAMPLES / f"{profile}.yaml").read_text())) == {
        "version", "service", "regions", "sources",
    }  # fmt: skip
    fields = {w.field for w in loaded.warnings}
    assert "red_lines.latency_p99.includes_reroute" in fields
    assert all(w.level == "warning" for w in loaded.warnings)
