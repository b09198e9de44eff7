"""The weights probe's pure parts: figures to series, and its settings section."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from redline.exporters.probe import Sample
from redline.exporters.settings import ExporterSettings, WeightsSection
from redline.exporters.weights import WeightsFigures, build_weights_samples
from redline.platform.weights.checkpoints import CheckpointAge
from redline.platform.weights.keyring import build_keyring_figures
from redline.platform.weights.sync import RegionLag
from redline.slo import catalog
from redline.slo.spec import Weights

NOW = 1_800_000_000.0


def _named(samples: list[Sample], metric: catalog.Metric) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for s in samples if s.name == metric.family]


def test_a_keyring_without_a_current_dek_publishes_the_specs_period_but_no_age() -> None:
    policy = Weights(dek_rotation_hours=1)
    figures = WeightsFigures(NOW, policy, keyrings={"k": build_keyring_figures([], policy, NOW)})
    samples = build_weights_samples(figures)
    assert _named(samples, catalog.WEIGHTS_DEK_ROTATION_SECONDS) == [({"keyring": "k"}, 3600.0)]
    assert _named(samples, catalog.WEIGHTS_DEK_AGE_SECONDS) == []
    assert _named(samples, catalog.WEIGHTS_DEK_SECONDS_TO_ROTATION) == []


def test_sync_lag_and_last_sync_time_per_model_and_region() -> None:
    lag = RegionLag("us", "b", shards_expected=4, shards_missing=1, versions_missing=["v2"],
                    last_sync_age_seconds=30.0, lag_seconds=120.0)  # fmt: skip
    never = RegionLag("ap", None, 4, 4, ["v1", "v2"], None, 600.0)
    samples = build_weights_samples(WeightsFigures(NOW, lags={"m": {"us": lag, "ap": never}}))
    labels = {"model": "m", "region": "us"}
    assert (labels, 120.0) in _named(samples, catalog.WEIGHTS_SYNC_LAG_SECONDS)
    assert _named(samples, catalog.WEIGHTS_SYNC_LAST_TIMESTAMP_SECONDS) == [(labels, NOW - 30)]
    assert ({"model": "m", "region": "ap"}, 2) in _named(
        samples, catalog.WEIGHTS_SYNC_VERSIONS_MISSING
    )


def test_a_deleted_or_missing_checkpoint_is_published_as_zero() -> None:
    ages = {
        "a": CheckpointAge("a", "v1", NOW - 10, 10.0, deleted=False),
        "b": CheckpointAge("b", "v2", NOW - 10, 10.0, deleted=True),
    }
    samples = build_weights_samples(WeightsFigures(NOW, checkpoints=ages), adapters=["c"])
    found = _named(samples, catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS)
    assert found == [({"adapter": "a"}, NOW - 10), ({"adapter": "b"}, 0.0), ({"adapter": "c"}, 0.0)]


def test_enabled_without_a_bucket_is_refused_with_the_field_named() -> None:
    with pytest.raises(ValidationError, match=r"weights\.store is required"):
        WeightsSection(enabled=True)
    with pytest.raises(ValidationError, match="bucket"):
        ExporterSettings.model_validate({"weights": {"enabled": True, "store": {"bucket": "A_"}}})
    assert not ExporterSettings().weights.enabled
