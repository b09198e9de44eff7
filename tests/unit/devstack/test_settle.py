"""A drill's daytime-window precondition: enough requests for a P99 that means something, and
that P99 under the red line, in every region."""

from __future__ import annotations

from redline.devstack.drills.settle import build_window_problems

REGIONS = ("primary", "secondary")


def test_a_full_window_under_the_line_is_settled() -> None:
    requests = {"primary": 300.0, "secondary": 280.0}
    p99 = {"primary": 0.21, "secondary": 0.8}  # at the line is not over it
    assert build_window_problems(REGIONS, requests, p99, 100, 0.8) == []


def test_a_night_window_is_not_settled_whatever_its_p99() -> None:
    # A window of 12 requests after the load generator's pause: its P99 is its slowest request,
    # 0.854 s over one of them or 0.1 s, neither is evidence.
    for p99 in (0.854, 0.1):
        problems = build_window_problems(
            REGIONS, {"primary": 12.0, "secondary": 300.0}, {"primary": p99}, 100, 0.8
        )
        assert problems == ["primary: 12 requests in the window < 100"]


def test_a_region_without_traffic_has_nothing_to_judge() -> None:
    # The secondary before a reroute: no series, or an increase of 0.
    for secondary in ({}, {"secondary": 0.0}):
        requests = {"primary": 300.0, **secondary}
        assert build_window_problems(REGIONS, requests, {"primary": 0.2}, 100, 0.8) == []


def test_a_trickle_is_not_a_daytime_window() -> None:
    problems = build_window_problems(
        REGIONS, {"primary": 300.0, "secondary": 3.0}, {"primary": 0.2}, 100, 0.8
    )
    assert problems == ["secondary: 3 requests in the window < 100"]


def test_a_full_window_over_the_line_names_its_p99() -> None:
    problems = build_window_problems(
        REGIONS, {"primary": 300.0, "secondary": 300.0}, {"primary": 0.9}, 100, 0.8
    )
    assert problems == ["primary: P99 0.900 s > 0.8 s"]


def test_no_guard_needs_no_requests() -> None:
    assert build_window_problems(REGIONS, {}, {}, 0, 0.8) == []
