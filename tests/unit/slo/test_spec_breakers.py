"""The spec's `breakers` section: the design notes' values, validation, the local profile."""

from __future__ import annotations

import pytest
import yaml

from redline.slo.load import SpecError, apply_profile, default_spec_text, parse_spec


def _spec_with(**breakers: object) -> str:
    data = yaml.safe_load(default_spec_text())
    data["breakers"] = {**data["breakers"], **breakers}
    return yaml.safe_dump(data)


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "spec.yaml")
    return info.value.problems


def test_the_default_spec_carries_the_design_notes_values() -> None:
    breakers = parse_spec(default_spec_text(), "default").spec.breakers
    assert breakers.enabled is True
    assert breakers.error_rate == 0.15
    assert breakers.window == "60s"
    assert breakers.p99_seconds == 3
    assert breakers.min_requests == 20
    assert breakers.open_for == "30s"
    assert breakers.half_open_probes == 3
    assert breakers.alert_after == "5m"


def test_the_local_profile_shortens_the_window_and_the_open_time() -> None:
    spec = parse_spec(default_spec_text(), "default").spec
    local = apply_profile(spec, "local").breakers
    assert (local.window, local.open_for) == ("10s", "5s")
    assert local.error_rate == spec.breakers.error_rate
    assert apply_profile(spec, None).breakers.window == "60s"


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"error_rate": 1.5}, "breakers.error_rate", "less than 1"),
        ({"error_rate": 0}, "breakers.error_rate", "greater than 0"),
        ({"window": "sixty"}, "breakers.window", "pattern"),
        ({"window": "500ms"}, "breakers.window", "at least 1s"),
        ({"window": "2h"}, "breakers.window", "at most 1h"),
        ({"open_for": "0s"}, "breakers.open_for", "at least 1s"),
        ({"p99_seconds": -3}, "breakers.p99_seconds", "greater than 0"),
        ({"min_requests": 0}, "breakers.min_requests", "greater than 0"),
        ({"half_open_probes": 0}, "breakers.half_open_probes", "greater than or equal to 1"),
        ({"colour": "red"}, "breakers.colour", "unknown field"),
    ],
)
def test_bad_breakers_name_the_field(changes: dict[str, object], field: str, message: str) -> None:
    problems = _problems(_spec_with(**changes))
    matching = [p for p in problems if p.startswith(f"spec.yaml: {field}")]
    assert matching, problems
    assert any(message in p for p in matching), problems


def test_a_bad_profile_window_is_a_spec_error() -> None:
    data = yaml.safe_load(default_spec_text())
    data["profiles"]["local"]["breaker_window"] = "2h"
    spec = parse_spec(yaml.safe_dump(data), "spec.yaml").spec
    with pytest.raises(SpecError, match="at most 1h"):
        apply_profile(spec, "local")
