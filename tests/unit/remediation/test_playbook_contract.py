"""The playbook contract: recorded plans come back as steps, deferrals are well-formed."""

from __future__ import annotations

import pytest

from redline.remediation.playbook import Deferred, PlannedStep, PlaybookError


def test_a_recorded_plan_step_comes_back_equal() -> None:
    step = PlannedStep("hold_down", "wait", {"until": 1.5, "region": "a"}, read_only=True)
    assert PlannedStep.from_dict(step.as_dict()) == step
    # Plans recorded before `read_only` existed read as steps that change something.
    old = PlannedStep.from_dict({"name": "set_override", "description": "x", "params": {}})
    assert old.read_only is False


@pytest.mark.parametrize(
    "bad", [{"description": "no name"}, {"name": "x", "params": ["not", "a", "mapping"]}]
)
def test_a_malformed_recorded_step_is_a_playbook_error(bad: dict[str, object]) -> None:
    with pytest.raises(PlaybookError, match="recorded plan step"):
        PlannedStep.from_dict(bad)


def test_a_deferral_cannot_be_negative_or_nan() -> None:
    assert Deferred(0, "due now").seconds == 0
    for seconds in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="Deferred.seconds"):
            Deferred(seconds, "bad")
