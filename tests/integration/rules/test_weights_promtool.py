"""The weights family's promtool cases against the real promtool: they pass for the default
spec, and each fails when its alert's line moves by one step (`>` becomes `>=`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from redline.generate.outputs import TEST_FILE
from redline.slo import catalog
from redline.slo.load import default_spec_text, load_spec, parse_spec
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


def test_the_cases_follow_the_specs_rotation_period(tmp_path: Path) -> None:
    # A 24 h period: the overdue DEK is 24 h and a minute old; a 72 h period would stay silent.
    spec = parse_spec(default_spec_text() + "\nweights: {dek_rotation_hours: 24}\n", "s").spec
    directory, kept = write_family_cases(spec, tmp_path, PREFIX)
    assert kept == 4, kept
    [case] = [c for c in yaml.safe_load((directory / TEST_FILE).read_text())["tests"]
              if c["name"].startswith(f"{PREFIX} DEK rotation")]  # fmt: skip
    periods = [s["values"] for s in case["input_series"]
               if s["series"].startswith(catalog.WEIGHTS_DEK_ROTATION_SECONDS.family)]  # fmt: skip
    assert periods and all(v.startswith("86400") for v in periods), periods
    result = run_family_cases(directory)
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
