"""The weights family's promtool cases against the real promtool: they pass for the default
spec, and each fails when its alert's line moves by one step (`>` becomes `>=`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.slo import catalog
from redline.slo.load import load_spec
from tests.support.promtool import run_family_cases, run_with_broken_rule, write_family_cases

pytestmark = pytest.mark.integration

PREFIX = "weights:"


def _generate(root: Path) -> Path:
    directory, kept = write_family_cases(load_spec().spec, root, PREFIX)
    assert kept == 4, kept
    return directory


def test_the_weights_cases_pass(tmp_path: Path) -> None:
    result = run_family_cases(_generate(tmp_path))
    assert result.ok, result.output


@pytest.mark.parametrize(
    ("original", "broken", "failing_case"),
    [
        # a DEK exactly at its rotation period is overdue
        ("> on (keyring)", ">= on (keyring)", "DEK rotation"),
        # a keyring with no shard past retention pages
        (
            f"({catalog.WEIGHTS_SHARDS_PAST_RETENTION}) > 0",
            f"({catalog.WEIGHTS_SHARDS_PAST_RETENTION}) >= 0",
            "DEK retention",
        ),
        # a passed verification pages
        (
            f"({catalog.WEIGHTS_SHARDS_FAILED_VERIFICATION}) > 0",
            f"({catalog.WEIGHTS_SHARDS_FAILED_VERIFICATION}) >= 0",
            "shard verification",
        ),
        # a region exactly at the RPO fires
        (
            f"({catalog.WEIGHTS_SYNC_LAG_SECONDS}) > 90",
            f"({catalog.WEIGHTS_SYNC_LAG_SECONDS}) >= 90",
            "sync RPO",
        ),
    ],
)
def test_the_weights_cases_catch_a_broken_rule(
    tmp_path: Path, original: str, broken: str, failing_case: str
) -> None:
    directory = _generate(tmp_path)
    result = run_with_broken_rule(directory, original, broken)
    assert not result.ok
    assert failing_case in result.output
