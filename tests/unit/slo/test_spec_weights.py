"""The spec's `weights:` section: its defaults (a spec without it), its bounds named on bad
input, and the DEK lifecycle, the exporter's series and the rules judging by it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from redline.exporters.weights import WeightsFigures, build_weights_samples
from redline.platform.weights.keyring import DekRecord, build_dek_state, build_keyring_figures
from redline.platform.weights.settings import KeyringSettings
from redline.rules.families.weights import build_alerts
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.load import SpecError, load_spec, parse_spec
from redline.slo.spec import PLAYBOOK_NAMES, Weights

HEAD = "version: v1\nservice: s\nregions: [a]\n"
HOUR = 3600.0
DAY = 86400.0


def _spec(weights: str) -> str:
    return HEAD + f"weights: {weights}\n"


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "spec.yaml", PLAYBOOK_NAMES)
    return caught.value.problems


def test_without_the_section_the_issue_numbers_apply() -> None:
    for spec in (load_spec().spec, parse_spec(HEAD, "spec.yaml").spec):
        assert (spec.weights.dek_rotation_hours, spec.weights.dek_retention_days) == (72, 30)
        assert spec.weights.rotation_seconds == 72 * HOUR
        assert spec.weights.retention_seconds == 30 * DAY


def test_the_section_sets_both_numbers() -> None:
    text = _spec("{dek_rotation_hours: 24, dek_retention_days: 7.5}")
    weights = parse_spec(text, "spec.yaml").spec.weights
    assert (weights.dek_rotation_hours, weights.dek_retention_days) == (24, 7.5)
    with pytest.raises(ValidationError):
        weights.dek_rotation_hours = 1  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(
    ("weights", "field", "message"),
    [
        ("{dek_rotation_hours: 0.5}", "weights.dek_rotation_hours", "greater than or equal to 1"),
        ("{dek_rotation_hours: 9000}", "weights.dek_rotation_hours", "less than or equal to 8760"),
        ("{dek_retention_days: 0}", "weights.dek_retention_days", "greater than or equal to 1"),
        ("{dek_retention_days: 4000}", "weights.dek_retention_days", "less than or equal to 3650"),
        ("{dek_retention_days: soon}", "weights.dek_retention_days", "number"),
        ("{rotation_hours: 72}", "weights.rotation_hours", "unknown field"),
    ],
)
def test_bad_numbers_name_the_file_the_field_and_the_bound(
    weights: str, field: str, message: str
) -> None:
    [problem] = _problems(_spec(weights))
    assert problem.startswith(f"spec.yaml: {field}:"), problem
    assert message in problem, problem


def test_a_keyring_setting_of_rotation_or_retention_points_at_the_spec() -> None:
    with pytest.raises(ValidationError) as caught:
        KeyringSettings.model_validate({"name": "k", "rotation_hours": 24, "retention_days": 3})
    text = str(caught.value)
    assert "rotation_hours (now the spec's weights.dek_rotation_hours)" in text
    assert "retention_days (now the spec's weights.dek_retention_days)" in text


def _dek(version: int, created: float, retired: float | None = None) -> DekRecord:
    return DekRecord(keyring="k", version=version, kek_id="pkcs11:token=t;object=k",
                     wrapped="AA==", created_at=created, retired_at=retired)  # fmt: skip


def test_the_lifecycle_follows_the_specs_numbers() -> None:
    policy = parse_spec(_spec("{dek_rotation_hours: 24, dek_retention_days: 2}"), "s").spec.weights
    retired = _dek(1, 0, retired=DAY)
    assert build_dek_state(retired, policy, DAY + 2 * DAY) == "retired"
    assert build_dek_state(retired, policy, DAY + 2 * DAY + 1) == "expired"
    # Under the defaults the same DEK still decrypts for 28 more days.
    assert build_dek_state(retired, Weights(), DAY + 2 * DAY + 1) == "retired"
    figures = build_keyring_figures([retired, _dek(2, DAY)], policy, DAY + 10 * HOUR)
    assert figures.current_version == 2
    assert figures.seconds_to_rotation == pytest.approx(14 * HOUR)


def test_the_exporter_publishes_the_specs_rotation_period() -> None:
    policy = Weights(dek_rotation_hours=24)
    figures = WeightsFigures(0.0, policy, {"k": build_keyring_figures([_dek(1, 0)], policy, 0.0)})
    [period] = [
        s.value
        for s in build_weights_samples(figures)
        if s.name == catalog.WEIGHTS_DEK_ROTATION_SECONDS.family
    ]
    assert period == 24 * HOUR


def test_the_rotation_alert_routes_to_weights_rotate_and_states_the_specs_numbers() -> None:
    spec = parse_spec(_spec("{dek_rotation_hours: 24, dek_retention_days: 2}"), "s").spec
    rules = [r for r in build_alerts(spec) if r.alert == Alert.DEK_ROTATION_OVERDUE]
    by_cause = {r.labels["cause"]: r for r in rules}
    assert by_cause["rotation"].labels["playbook"] == "weights_rotate"
    assert "playbook" not in by_cause["retention"].labels  # re-encrypting is a human's call
    description = by_cause["rotation"].annotations["description"]
    assert "24 h, spec weights.dek_rotation_hours" in description and "2 days" in description
