"""The consistency level of the vector index's collections (§1's consistency check), and the
promtool cases that prove it:

- `IndexConsistencyWeak` (ticket): a copy's collection reads at a level whose staleness bound
  (`vectordb_index_consistency_staleness_bound_seconds`, `redline.exporters.index_consistency`)
  is over the index red line (`red_lines.index_consistency.max_staleness_seconds`): Eventually,
  Session (+Inf: a searcher does not see other clients' writes within any bound) or Bounded with
  a graceful time over the red line. Strong, and Bounded within it, are quiet.

A ticket, not a page: the replica is not late (`RedLineIndexStaleness` pages when it is); the
collection is configured so that its searches may read older data than the red line allows,
which a change fixes (Strong, or a shorter `common.gracefulTime`). The alert names the level
(joined from `vectordb_index_consistency_level`); `for` lets a collection re-created by a deploy
settle.
"""

from __future__ import annotations

import math
from typing import Any

from redline.rules.common import alert_rule
from redline.rules.model import RuleGroup, format_duration, number
from redline.rules.promtool_cases import AlertIndex, Case, constant, expected, series
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import Spec

KEYS = (catalog.LABEL_COLLECTION, catalog.LABEL_TARGET)
"""One copy of one logical collection."""
WEAK_FOR_SECONDS = 300.0
"""How long a weak level must last before the ticket (a re-created collection settles)."""


def _by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def weak_expr(spec: Spec) -> str:
    """Each copy whose staleness bound is over the red line, with its level's label (`topk`
    keeps one level while a change shows two, or two exporter replicas disagree)."""
    limit = number(spec.red_lines.index_consistency.max_staleness_seconds)
    bound = catalog.VECTORDB_INDEX_CONSISTENCY_STALENESS_BOUND_SECONDS
    level = catalog.VECTORDB_INDEX_CONSISTENCY_LEVEL
    levels = f"max by ({_by((*KEYS, catalog.LABEL_LEVEL))}) ({level})"
    return (
        f"(max by ({_by(KEYS)}) ({bound}) > {limit})\n"
        f"* on ({_by(KEYS)}) group_left ({catalog.LABEL_LEVEL})\n"
        f"topk by ({_by(KEYS)}) (1, {levels})"
    )


def build_rules(spec: Spec) -> list[RuleGroup]:
    """The one alert on the collections' consistency levels."""
    limit = number(spec.red_lines.index_consistency.max_staleness_seconds)
    rule = alert_rule(
        spec,
        Alert.INDEX_CONSISTENCY_WEAK,
        weak_expr(spec),
        WEAK_FOR_SECONDS,
        "ticket",
        "Collection {{ $labels.collection }} ({{ $labels.target }}) reads at consistency level "
        "{{ $labels.level }}, staler than the index red line allows",
        f"The {{{{ $labels.target }}}} copy of {{{{ $labels.collection }}}} has the default "
        f"consistency level {{{{ $labels.level }}}}: its searches may read data up to "
        f"{{{{ $value | humanize }}}} s old (+Inf: no bound), over the {limit} s red line, "
        "however fresh the replica is. Make the collection Strong, or keep it Bounded with "
        f"Milvus' common.gracefulTime at most {limit} s (and the exporter's "
        "index_staleness.bounded_staleness_seconds set to it).",
    )
    return [
        RuleGroup("redline-index-consistency", spec.timing.evaluation_interval_seconds, (rule,))
    ]


# --- promtool cases ---------------------------------------------------------------------------

MINUTE = 60
STEPS = 20


def _copy(collection: str, target: str, level: str, bound: float) -> dict[str, str]:
    """The probe's two series of one copy, constant for the case."""
    keys = {catalog.LABEL_COLLECTION: collection, catalog.LABEL_TARGET: target}
    value = "Inf+0x" + str(STEPS) if math.isinf(bound) else constant(bound, STEPS)
    return {
        series(catalog.VECTORDB_INDEX_CONSISTENCY_LEVEL, {**keys, catalog.LABEL_LEVEL: level}): (
            constant(1, STEPS)
        ),
        series(catalog.VECTORDB_INDEX_CONSISTENCY_STALENESS_BOUND_SECONDS, keys): value,
    }


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """Strong, Bounded within and at the red line are quiet; Bounded over it, Session and
    Eventually fire, once weak for `for`."""
    limit = spec.red_lines.index_consistency.max_staleness_seconds
    rule = alerts.get(Alert.INDEX_CONSISTENCY_WEAK)
    name = Alert.INDEX_CONSISTENCY_WEAK
    wait = int(WEAK_FOR_SECONDS // MINUTE)
    over = limit + 18

    def firing(collection: str, target: str, level: str, value: float) -> dict[str, Any]:
        labels = {
            catalog.LABEL_COLLECTION: collection,
            catalog.LABEL_TARGET: target,
            catalog.LABEL_LEVEL: level,
        }
        return expected(rule, labels, value)

    quiet = {
        **_copy("documents", "primary", "Strong", 0.0),
        **_copy("documents", "replica", "Bounded", min(5.0, limit)),
        **_copy("faq", "primary", "Bounded", limit),  # at the red line: within it
    }
    weak = {
        **_copy("faq", "replica", "Bounded", over),
        **_copy("chats", "primary", "Eventually", math.inf),
        **_copy("chats", "replica", "Session", math.inf),
    }
    late = MINUTE * (wait + 3)
    return [
        Case(
            f"index consistency: Strong, Bounded within and at the {number(limit)} s red line "
            "are quiet",
            quiet,
            late,
            [(name, [])],
        ),
        Case(
            f"index consistency: Bounded over the red line, Eventually and Session fire after "
            f"{format_duration(WEAK_FOR_SECONDS)}; Strong and Bounded within stay quiet",
            {**quiet, **weak},
            late,
            [
                (
                    name,
                    [
                        firing("chats", "primary", "Eventually", math.inf),
                        firing("chats", "replica", "Session", math.inf),
                        firing("faq", "replica", "Bounded", over),
                    ],
                )
            ],
            earlier=[(MINUTE * (wait - 1), name, [])],
        ),
    ]
