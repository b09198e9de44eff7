"""The receiver's guard and run families, built from raw state."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redline.remediation.guards import ALL, Policies, build_snapshot
from redline.remediation.jobs import build_recovery_fields
from redline.remediation.metrics import (
    JobAges,
    build_families,
    build_guard_families,
    build_job_ages,
    render_metrics,
)
from redline.slo import catalog
from redline.slo.spec import PlaybookPolicy


def _samples(families: list) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # type: ignore[type-arg]
    text = render_metrics(families).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_job_ages_count_jobs_past_their_playbooks_deadline() -> None:
    policies = Policies({"reroute": PlaybookPolicy(deadline="10m")})
    now = 10_000.0
    active = [("reroute", now - 601), ("reroute", now - 30), ("spot_drain", now - 601)]
    ages = build_job_ages(active, policies, now)
    assert ages["reroute"] == JobAges(1, 601.0)
    # The default deadline is 15 min: 601 s is not late yet.
    assert ages["spot_drain"] == JobAges(0, 601.0)
    assert build_job_ages([("x", now + 5)], policies, now)["x"] == JobAges(0, 0.0)


def test_guard_families_show_every_known_playbook_and_any_the_state_names() -> None:
    policies = Policies({"reroute": PlaybookPolicy(mode="shadow")})
    snapshot = build_snapshot(
        {"custom": '{"by": "bob"}', ALL: "{}"}, {"open|semantic_rollback": "{}", "failures|x": "2"}
    )
    samples = _samples(
        build_guard_families(["reroute", "semantic_rollback"], policies, snapshot,
                             {"reroute": JobAges(2, 1200.5)})
    )  # fmt: skip
    breaker = catalog.REDLINE_REMEDIATION_BREAKER_OPEN.name
    paused = catalog.REDLINE_REMEDIATION_PAUSED.name
    mode = catalog.REDLINE_REMEDIATION_MODE.name
    overdue = catalog.REDLINE_REMEDIATION_JOBS_OVERDUE.name
    oldest = catalog.REDLINE_REMEDIATION_OLDEST_JOB_AGE_SECONDS.name
    assert samples[(breaker, (("playbook", "semantic_rollback"),))] == 1
    assert samples[(breaker, (("playbook", "reroute"),))] == 0
    # "*" pauses every playbook; it is no playbook of its own.
    assert samples[(paused, (("playbook", "reroute"),))] == 1
    assert (paused, (("playbook", ALL),)) not in samples
    assert samples[(paused, (("playbook", "custom"),))] == 1
    assert samples[(mode, (("mode", "shadow"), ("playbook", "reroute")))] == 1
    assert samples[(mode, (("mode", "act"), ("playbook", "reroute")))] == 0
    assert samples[(mode, (("mode", "act"), ("playbook", "x")))] == 1
    assert samples[(overdue, (("playbook", "reroute"),))] == 2
    assert samples[(oldest, (("playbook", "reroute"),))] == 1200.5
    assert samples[(overdue, (("playbook", "semantic_rollback"),))] == 0


def test_skips_count_as_runs_but_not_in_the_duration_histogram() -> None:
    raw = {
        "runs|reroute|over_budget": "2",
        "runs|reroute|shadow": "1",
        "bucket|reroute|0": "1",
        "sum|reroute": "0.05",
        "count|reroute": "1",
    }
    samples = _samples(build_families({}, 0, raw))
    runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL.name
    assert samples[(runs, (("outcome", "over_budget"), ("playbook", "reroute")))] == 2
    assert samples[(runs, (("outcome", "shadow"), ("playbook", "reroute")))] == 1
    duration = catalog.REDLINE_REMEDIATION_DURATION_SECONDS
    assert samples[(duration.count, (("playbook", "reroute"),))] == 1


def test_alerted_outcomes_exist_at_zero_before_the_first_run() -> None:
    samples = _samples(build_families({}, 0, {"runs|reroute|failed": "1"}, ["reroute", "custom"]))
    runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL.name
    assert samples[(runs, (("outcome", "failed"), ("playbook", "custom")))] == 0
    assert samples[(runs, (("outcome", "breaker_open"), ("playbook", "custom")))] == 0
    assert samples[(runs, (("outcome", "over_budget"), ("playbook", "reroute")))] == 0
    assert samples[(runs, (("outcome", "failed"), ("playbook", "reroute")))] == 1
    # Redis unreadable: no run series at all rather than zeros that would look like "fine".
    assert (runs, (("outcome", "failed"), ("playbook", "custom"))) not in _samples(
        build_families({}, 0, None, ["custom"])
    )


def test_recovery_histogram_reads_the_fields_a_recovery_adds_and_shows_both_modes() -> None:
    recovery = catalog.LLM_NODE_FAILURE_RECOVERY_SECONDS
    runs: dict[str, str] = {"runs|gpu_node_failure|succeeded": "2"}
    for mode, seconds in ((catalog.RECOVERY_WARM, 0.18), (catalog.RECOVERY_COLD, 42.0),
                          (catalog.RECOVERY_COLD, 900.0)):  # fmt: skip
        bucket, total, count = build_recovery_fields(mode, seconds)
        runs[bucket] = str(int(runs.get(bucket, "0")) + 1)
        runs[total] = str(float(runs.get(total, "0")) + seconds)
        runs[count] = str(int(runs.get(count, "0")) + 1)
    samples = _samples(build_families({}, 0, runs, ["gpu_node_failure"]))

    def value(suffix: str, mode: str, le: str | None = None) -> float:
        labels = (("le", le), ("mode", mode)) if le is not None else (("mode", mode),)
        return samples[(recovery.name + suffix, labels)]

    assert value("_bucket", "warm", "0.1") == 0 and value("_bucket", "warm", "0.25") == 1
    assert value("_count", "warm") == 1 and value("_sum", "warm") == pytest.approx(0.18)
    # 42 s lands in the 45 s bucket; 900 s only in +Inf (cumulative buckets).
    assert value("_bucket", "cold", "30.0") == 0 and value("_bucket", "cold", "45.0") == 1
    assert value("_bucket", "cold", "600.0") == 1 and value("_bucket", "cold", "+Inf") == 2
    assert value("_count", "cold") == 2 and value("_sum", "cold") == pytest.approx(942.0)
    # Before any recovery both modes exist at 0.
    empty = _samples(build_families({}, 0, {}, []))
    assert empty[(recovery.name + "_count", (("mode", "cold"),))] == 0
    assert empty[(recovery.name + "_count", (("mode", "warm"),))] == 0
    with pytest.raises(ValueError, match="recovery mode"):
        build_recovery_fields("lukewarm", 1.0)
