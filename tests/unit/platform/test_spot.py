"""The pure spot logic: budget, triage, state machine, ledger records, the retry contract."""

from __future__ import annotations

import json

import pytest
import yaml

from redline.platform.spot import (
    RESUME_HEADER,
    InflightView,
    LedgerEntry,
    NodeRecord,
    NodeState,
    Notice,
    SpotError,
    SpotStateError,
    aborted_ratio,
    build_drain_budget,
    build_prompt_fingerprint,
    build_resume_payload,
    build_spot_error,
    build_transition,
    build_triage,
    format_metadata_time,
    is_retry_safe,
    parse_instance_action,
    parse_metadata_time,
    parse_preempted,
    parse_rebalance,
    parse_spot_error,
    render_sse_error,
    requested_max_tokens,
    scale_spot,
)
from redline.slo.load import SpecError, default_spec_text, load_spec, parse_spec
from redline.slo.spec import Spot


def notice(provider: str = "aws", terminate_at: float | None = 1120.0) -> Notice:
    return Notice("spot-a", provider, "interruption", "terminate", 1000.0, 1001.0, terminate_at)


def test_default_spec_budgets_are_notice_minus_delays() -> None:
    spot = load_spec().spec.spot
    assert (spot.notice_seconds.aws, spot.notice_seconds.gcp) == (120, 30)
    assert spot.continue_factor == 0.85
    assert spot.drain_budget("aws") == 120 - 2 - 5 - 10
    assert spot.drain_budget("gcp") == 30 - 2 - 5 - 10
    with pytest.raises(ValueError, match="unknown spot provider 'azure'; allowed: aws, gcp"):
        spot.drain_budget("azure")


def test_spec_rejects_a_window_the_delays_eat_and_unknown_fields() -> None:
    data = yaml.safe_load(default_spec_text())
    data["spot"]["safety_margin_seconds"] = 25
    with pytest.raises(SpecError) as info:
        parse_spec(yaml.safe_dump(data), "spec.yaml")
    (problem,) = info.value.problems
    assert problem.startswith("spec.yaml: spot: ")
    assert "gcp drain budget is -2 s" in problem
    data["spot"] = {"notice_seconds": {"aws": 120, "azure": 30}}
    with pytest.raises(SpecError, match=r"spot.notice_seconds.azure: unknown field"):
        parse_spec(yaml.safe_dump(data), "spec.yaml")
    data["spot"] = {"continue_factor": 1.5}
    with pytest.raises(SpecError, match=r"spot.continue_factor"):
        parse_spec(yaml.safe_dump(data), "spec.yaml")


def test_every_spot_field_is_described() -> None:
    for model in (Spot, type(Spot().notice_seconds)):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"


def test_drain_budget_uses_the_notice_window_and_the_larger_detection_delay() -> None:
    spot = Spot()
    budget = build_drain_budget(spot, notice())
    assert budget.notice_seconds == 120
    assert budget.detection_delay_seconds == 2  # the spec's; 1 s was measured
    assert budget.seconds == 103
    late = Notice("n", "aws", "interruption", "terminate", 1000.0, 1030.0, 1120.0)
    assert build_drain_budget(spot, late).seconds == 120 - 30 - 5 - 10
    gcp = build_drain_budget(spot, notice("gcp", None))
    assert (gcp.notice_seconds, gcp.seconds) == (30, 13)
    hopeless = Notice("n", "aws", "interruption", "terminate", 1000.0, 1115.0, 1120.0)
    assert build_drain_budget(spot, hopeless).seconds == 0
    with pytest.raises(SpotError, match="must name its termination time"):
        build_drain_budget(spot, notice("manual", None))


def test_triage_continues_what_fits_085_of_the_budget() -> None:
    budget = 10.0  # 8.5 s usable
    requests = [
        InflightView("fits", 10, 100, 0.1),  # 90 x 0.1 = 9.0 s > 8.5: abort
        InflightView("exactly", 15, 100, 0.1),  # 85 x 0.1 = 8.5 s: continue
        InflightView("short", 0, 20, None),  # default TPOT 0.05: 1 s
        InflightView("unbounded", 5, None, 0.01),  # 512 assumed x 0.01 = 5.12 s
        InflightView("done", 200, 100, 0.5),  # nothing left
    ]
    decisions = build_triage(requests, budget, 0.85, 0.05, 512)
    assert [d.action for d in decisions] == [
        "abort",
        "continue",
        "continue",
        "continue",
        "continue",
    ]
    assert decisions[0].remaining_tokens == 90 and decisions[0].limit_seconds == 8.5
    assert decisions[3].remaining_tokens == 512
    assert decisions[4].remaining_tokens == 0
    assert aborted_ratio(decisions) == 0.2
    assert aborted_ratio([]) == 0.0
    assert [d.action for d in build_triage(requests[:1], 0.0, 0.85, 0.05, 512)] == ["abort"]


def test_state_machine_allows_only_the_preemption_path() -> None:
    record = NodeRecord("spot-a")
    draining = build_transition(record, NodeState.DRAINING, 10.0, notice_at=9.5, provider="aws")
    assert (draining.state, draining.draining_at, draining.notice_to_draining) == (
        NodeState.DRAINING, 10.0, 0.5,
    )  # fmt: skip
    terminating = build_transition(draining, NodeState.TERMINATING, 20.0, terminate_at=25.0)
    assert terminating.gone_at == 25.0  # drained early, but the node lives until 25
    assert terminating.replacement_latency(24.0) == 0.0
    assert terminating.replacement_latency(31.0) == 6.0
    recovered = build_transition(terminating, NodeState.RECOVERED, 40.0)
    assert recovered.replacement_latency(100.0) == 15.0
    again = build_transition(recovered, NodeState.DRAINING, 50.0)
    assert again.terminating_at is None and again.recovered_at is None
    for start, bad in (
        (record, NodeState.TERMINATING),
        (record, NodeState.RECOVERED),
        (draining, NodeState.RECOVERED),
        (draining, NodeState.DRAINING),
        (terminating, NodeState.DRAINING),
    ):
        with pytest.raises(SpotStateError, match=f"-> {bad.value} is not allowed"):
            build_transition(start, bad, 1.0)


def test_node_record_round_trips_and_rejects_garbage() -> None:
    record = build_transition(
        NodeRecord("n"), NodeState.DRAINING, 5.0, budget_seconds=13.0, preempted_instance="i-1"
    )
    assert NodeRecord.from_fields("n", record.to_fields()) == record
    with pytest.raises(SpotError, match="node n: unreadable state record"):
        NodeRecord.from_fields("n", {"state": "exploded"})
    with pytest.raises(SpotError, match="unreadable"):
        NodeRecord.from_fields("n", {"draining_at": "soon"})


def test_ledger_entry_round_trips() -> None:
    entry = LedgerEntry("r1", 2, 17, "v1", "f" * 64, True, "SPOT", "interrupted", "spot-a",
                        'a "quoted"\nprefix', 100, 12.5)  # fmt: skip
    assert LedgerEntry.from_fields(entry.to_fields()) == entry
    with pytest.raises(SpotError, match="unreadable ledger entry"):
        LedgerEntry.from_fields({**entry.to_fields(), "status": "lost"})
    with pytest.raises(SpotError, match="unreadable ledger entry"):
        LedgerEntry.from_fields({"request_id": "r1"})


def test_fingerprint_ignores_stream_flags_but_not_the_prompt() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    assert build_prompt_fingerprint(body) == build_prompt_fingerprint(streamed)
    other = {**body, "messages": [{"role": "user", "content": "ho"}]}
    assert build_prompt_fingerprint(body) != build_prompt_fingerprint(other)
    assert build_prompt_fingerprint(body) != build_prompt_fingerprint({**body, "max_tokens": 6})


def test_retry_safety_defaults_to_no_tools() -> None:
    plain = {"messages": []}
    tools = {"messages": [], "tools": [{"type": "function"}]}
    assert is_retry_safe(plain, None) is True
    assert is_retry_safe(tools, None) is False
    assert is_retry_safe(plain, "false") is False
    assert is_retry_safe(tools, "TRUE") is True
    assert is_retry_safe(plain, "maybe") is True
    assert requested_max_tokens({"max_tokens": 7}) == 7
    assert requested_max_tokens({"max_completion_tokens": 9, "max_tokens": 7}) == 9
    assert requested_max_tokens({"max_tokens": True}) is None


def test_resume_payload_continues_the_prefix_with_what_is_left() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 10}
    resumed = build_resume_payload(body, "one two three", 3)
    assert resumed is not None
    assert resumed["messages"][-1] == {"role": "assistant", "content": "one two three"}
    assert resumed["continue_final_message"] is True
    assert resumed["add_generation_prompt"] is False
    assert resumed["max_tokens"] == 7
    assert body["max_tokens"] == 10  # the client's request is not changed
    assert build_resume_payload(body, "", 0) is None
    assert build_resume_payload(body, "x " * 10, 10) is None  # nothing left to generate
    assert build_resume_payload({"prompt": "completion api"}, "x", 1) is None


def test_error_event_is_the_contract_clients_parse() -> None:
    error = build_spot_error("r1", "spot-a", 1, 12, True, True, 250, "triage")
    raw = render_sse_error(error)
    assert raw.endswith(b"\n\ndata: [DONE]\n\n") and raw.startswith(b"data: {")
    data = json.loads(raw.split(b"\n\n")[0][6:])
    info = parse_spot_error(data)
    assert info is not None
    assert (info.recoverable, info.retry_safe, info.request_id, info.served_prefix_tokens) == (
        True, True, "r1", 12,
    )  # fmt: skip
    assert (info.resume_header, info.retry_after_ms) == (RESUME_HEADER, 250)
    assert data["error"]["retry"]["resumes_after_prefix"] is True
    unsafe = parse_spot_error(build_spot_error("r2", "n", 1, 5, False, False, 0, "x"))
    assert unsafe is not None and not unsafe.recoverable and unsafe.resume_header is None
    assert parse_spot_error({"error": {"type": "other"}}) is None
    assert parse_spot_error({"choices": []}) is None
    assert parse_spot_error({"error": {"type": "SPOT_PREEMPTION"}}) is None  # no request id


def test_metadata_formats() -> None:
    assert format_metadata_time(1505722920.7) == "2017-09-18T08:22:00Z"
    assert parse_metadata_time("2017-09-18T08:22:00Z") == 1505722920
    assert parse_instance_action('{"action": "terminate", "time": "2017-09-18T08:22:00Z"}') == (
        "terminate", 1505722920,
    )  # fmt: skip
    assert parse_rebalance('{"noticeTime": "2020-10-27T08:22:00Z"}') == 1603786920
    assert parse_preempted("TRUE\n") is True and parse_preempted("FALSE") is False
    for bad in ('{"action": "explode", "time": "2017-09-18T08:22:00Z"}', "{}", "<html>",
                '{"action": "stop", "time": "yesterday"}'):  # fmt: skip
        with pytest.raises(SpotError):
            parse_instance_action(bad)
    with pytest.raises(SpotError):
        parse_rebalance('{"noticeTime": 5}')
    with pytest.raises(SpotError):
        parse_preempted("maybe")


def test_scale_spot_compresses_every_duration() -> None:
    spot = Spot()
    scaled = scale_spot(spot, 0.05)
    assert scaled.notice_seconds.aws == 6.0 and scaled.notice_seconds.gcp == 1.5
    assert scaled.drain_budget("gcp") == pytest.approx(spot.drain_budget("gcp") * 0.05)
    assert scaled.continue_factor == spot.continue_factor
    assert scaled.readiness_timeout_seconds == 30.0
    with pytest.raises(SpotError, match="time scale"):
        scale_spot(spot, 2)
