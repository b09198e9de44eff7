"""The settings of a two-region `redline index` process: origin, the region replicated from and
the conflict window, with the problems named before anything connects."""

from __future__ import annotations

import pytest

from redline.core.settings import SettingsError
from redline.platform.index import IndexSettings


def _settings(**values: object) -> IndexSettings:
    return IndexSettings.model_validate(values)


def test_one_log_pair_when_no_origin_is_given() -> None:
    assert _settings().two_regions(needs_source=True) is None
    assert _settings().two_regions(needs_source=False) is None


def test_a_writer_and_a_replicator_of_two_regions() -> None:
    assert _settings(origin="eu").two_regions(needs_source=False) == ("eu", None)
    both = _settings(origin="eu", replicate_from="us", regions=("eu", "us"))
    assert both.two_regions(needs_source=True) == ("eu", "us")


@pytest.mark.parametrize(
    ("values", "needs_source", "message"),
    [
        ({"replicate_from": "us"}, True, "--from us needs --origin"),
        ({"origin": "eu"}, True, "replication into eu's copy needs --from REGION"),
        ({"origin": "eu", "replicate_from": "eu"}, True, "--origin and --from are both eu"),
        ({"origin": "EU", "replicate_from": "us"}, True, "--origin: invalid region 'EU'"),
        ({"origin": "eu", "replicate_from": "u s"}, True, "--from: invalid region 'u s'"),
        (
            {"origin": "eu", "replicate_from": "ap", "regions": ("eu", "us")},
            True,
            r"--from ap is not one of the collection's regions \(eu, us\)",
        ),
        ({"origin": "ap", "regions": ("eu", "us")}, False, "--origin ap is not one of"),
        ({"origin": "eu", "replicate_from": "us"}, False, "--from us only applies to"),
    ],
)
def test_problems_are_named(values: dict[str, object], needs_source: bool, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        _settings(**values).two_regions(needs_source)


def test_the_conflict_window_does_not_follow_the_log_retention() -> None:
    # a trim run with --retention-seconds 0 must not shrink the window the writers resolve with
    assert _settings(retention_seconds=0).conflict_window_seconds() == 3600
    assert _settings(heads_retention_seconds=30).conflict_window_seconds() == 30
