"""bench.drift's summary figures, from rows like its table's (Evidently is not needed)."""

from __future__ import annotations

from bench.drift import Row, drift_figures


def test_drift_figures_compare_the_defaults_and_the_fastest() -> None:
    rows = [
        Row("redline mmd (default)", seconds=0.002, partial_hits=4, false_alarms=1, splits=25),
        Row("redline energy", seconds=0.004),
        Row("evidently model (default)", seconds=0.5),
        Row("evidently distance euclidean", seconds=0.01),
        Row("evidently Report([EmbeddingsDrift])", seconds=0.001),
    ]
    shown = {figure.label: figure for figure in drift_figures(rows)}
    assert shown["redline mmd (default), per evaluation"].value == 2.0
    assert shown["Evidently default / redline default, time"].value == 250.0
    fastest = shown["fastest Evidently (evidently distance euclidean) / redline default, time"]
    assert fastest.value == 5.0
    assert shown["redline default: 10% shift detected, draws"].shown() == (
        "redline default: 10% shift detected, draws: 4 of 5"
    )
    assert shown["redline default: false positives, 25 splits"].value == 4.0
    assert all(figure.met is None for figure in shown.values())
