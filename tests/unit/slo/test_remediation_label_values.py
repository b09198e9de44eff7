"""The remediation series' label values are defined once, in the catalog: the spec's playbook
modes, the guard rails' skip outcomes and the receiver's metrics agree with it."""

from __future__ import annotations

import typing

from redline.remediation import guards, metrics
from redline.slo import catalog
from redline.slo.report.remediation import kind_of
from redline.slo.spec import PlaybookMode


def test_the_spec_modes_are_the_catalog_modes() -> None:
    assert typing.get_args(PlaybookMode) == catalog.REMEDIATION_MODES


def test_the_guard_rails_skip_outcomes_are_the_catalog_ones() -> None:
    assert typing.get_args(guards.SkipOutcome) == catalog.SKIP_OUTCOMES


def test_the_receiver_exposes_every_final_outcome_and_the_report_knows_each() -> None:
    assert metrics.ALERTED_OUTCOMES == catalog.RUN_OUTCOMES
    assert len(set(catalog.RUN_OUTCOMES)) == len(catalog.RUN_OUTCOMES)
    assert catalog.OUTCOME_RETRY not in catalog.RUN_OUTCOMES
    assert all(kind_of(outcome) != "other" for outcome in catalog.RUN_OUTCOMES)
    assert kind_of(catalog.OUTCOME_RETRY) == "other"
