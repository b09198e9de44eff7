"""tests/run.py: the exit status of the two parts and the failures repeated at the end."""

from __future__ import annotations

from tests.run import NO_TESTS, combined_status, failure_lines


def test_the_first_failing_part_decides_and_no_tests_only_when_none_ran() -> None:
    assert combined_status([0, 0]) == 0
    assert combined_status([0, NO_TESTS]) == 0
    assert combined_status([NO_TESTS, NO_TESTS]) == NO_TESTS
    assert combined_status([1, 2]) == 1
    assert combined_status([NO_TESTS, 2]) == 2


def test_only_the_short_summary_failures_are_repeated() -> None:
    output = [
        "tests/e2e/test_drills.py::test_latency FAILED",
        "FAILED tests/e2e/test_drills.py::test_latency - AssertionError: P99 1.1 s",
        "ERROR tests/e2e/test_stack.py::test_up - TimeoutError",
        "PASSED tests/unit/test_x.py::test_y",
    ]
    assert failure_lines(output) == output[1:3]
