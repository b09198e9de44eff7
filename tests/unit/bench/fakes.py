"""Fake benchmarks for the runner's tests: each an entry `tests.unit.bench.fakes:NAME`."""

from __future__ import annotations

import sys

from bench.figures import Figure, MissingDependencyError, at_least, at_most, info


def exits(argv: list[str]) -> list[Figure]:
    """Ends the process, as bench.scrape did when its expositions differed."""
    sys.exit("expositions differ in series")


def misses(argv: list[str]) -> list[Figure]:
    """One figure met, one missed."""
    return [
        at_most("misses", "added at p50", 2.5, "ms", 2.0),
        info("misses", "series per scrape", 4164),
    ]


def passes(argv: list[str]) -> list[Figure]:
    """Every figure met."""
    return [at_least("passes", "ratio", 42.5, "x", 42.0)]


def breaks(argv: list[str]) -> list[Figure]:
    """Raises an ordinary error."""
    raise RuntimeError("simulator never became ready")


def lacks(argv: list[str]) -> list[Figure]:
    """Needs an optional package that is not installed."""
    raise MissingDependencyError("evidently not installed (pip install -e '.[bench]')")


def interrupted(argv: list[str]) -> list[Figure]:
    """Ctrl-C while it runs."""
    raise KeyboardInterrupt
