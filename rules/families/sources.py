"""The source mirror: an engine's own series recorded as the catalog's canonical ones.

For an engine profile (vLLM, SGLang, TGI, NIM, OpenTelemetry GenAI) every signal the rules read
is recorded under `redline:source:<canonical series>` (`catalog.source_record`) with the
catalog's labels: the engine's labels renamed, a constant model where the engine names none,
`served_region` = `region`, `rerouted="false"` (no gateway, no reroute), and `model_version`
joined from the snapshot registry's active version (`model_active_info`). Every other family
reads these names through `rules/records.py`, so alert names and labels are the same whatever
the source.

Raw counters are never aggregated here: a reset must stay on its own series for `rate()` to
see it, so the mirror only selects, relabels and joins. For redline's gateway every signal is
read as it is and the family emits no group.

No alert of its own, hence no promtool case: the families that read the mirror prove it end to
end from the engine's raw series (`promtool_cases` writes them per profile).
"""

from __future__ import annotations

from redline.rules.model import RecordingRule, RuleGroup
from redline.rules.promtool_cases import AlertIndex, Case
from redline.slo import catalog
from redline.slo.sources import (
    CANONICAL,
    MAPPABLE_LABELS,
    SIGNAL_KINDS,
    SIGNAL_NAMES,
    ResolvedSources,
    SourceSeries,
)
from redline.slo.spec import Spec

GROUP = "redline-sources"
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
SOURCE_SERIES_LABEL = "source_series"
"""Tags each engine series of a signal read from several names, so that they stay distinct."""
UNKNOWN_VERSION = "unknown"
"""`model_version` of a model the snapshot registry has no active version for."""


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _indent(expr: str) -> str:
    return "\n".join(f"  {line}" for line in expr.splitlines())


def label_replace(expr: str, dst: str, replacement: str, src: str, regex: str) -> str:
    """`label_replace(expr, dst, replacement, src, regex)`, the inner expression indented."""
    args = ", ".join(quote(arg) for arg in (dst, replacement, src, regex))
    return f"label_replace(\n{_indent(expr)},\n  {args}\n)"


def _constant(expr: str, label: str, value: str) -> str:
    return label_replace(expr, label, value, "", "")


def _copy(expr: str, dst: str, src: str) -> str:
    return label_replace(expr, dst, "$1", src, "(.*)")


def _selected(found: SourceSeries, suffix: str) -> str:
    """The engine series of one signal; several names are tagged and kept apart with `or`."""
    if len(found.names) == 1:
        return found.selector(found.names[0], suffix)
    tagged = [
        _constant(found.selector(name, suffix), SOURCE_SERIES_LABEL, name) for name in found.names
    ]
    return "\nor\n".join(tagged)


def _mapped(resolved: ResolvedSources, signal: str, expr: str) -> str:
    """`expr` with the engine's labels mapped onto the catalog's (engine profiles only)."""
    profile = resolved.profile
    for label in MAPPABLE_LABELS:
        engine = profile.labels.get(label)
        if engine is not None and engine != label:
            expr = _copy(expr, label, engine)
    if profile.model is not None:
        expr = _constant(expr, catalog.LABEL_MODEL, profile.model)
    canonical = CANONICAL[signal].labels
    if catalog.LABEL_SERVED_REGION in canonical:
        expr = _copy(expr, catalog.LABEL_SERVED_REGION, catalog.LABEL_REGION)
    if catalog.LABEL_REROUTED in canonical:
        expr = _constant(expr, catalog.LABEL_REROUTED, "false")
    return expr


def _version_joined(expr: str) -> str:
    """`expr` stamped with the registry's active version of its model, `unknown` without one."""
    on = f"on ({catalog.LABEL_MODEL})"
    active = catalog.MODEL_ACTIVE_VERSION_RECORD
    joined = f"(\n{_indent(expr)}\n)\n* {on} group_left ({catalog.LABEL_MODEL_VERSION}) {active}"
    orphans = f"(\n{_indent(expr)}\n)\nunless {on} {active}"
    return f"{joined}\nor\n{_constant(orphans, catalog.LABEL_MODEL_VERSION, UNKNOWN_VERSION)}"


def mirror_expr(resolved: ResolvedSources, signal: str, suffix: str = "") -> str:
    """PromQL for the mirror of `signal` (`suffix`: a histogram's `_bucket`/`_count`/`_sum`)."""
    found = resolved.series(signal)
    if found is None:
        raise KeyError(f"the {resolved.name} profile has no {signal} series")
    expr = _selected(found, suffix)
    if not resolved.mirrored:
        return expr
    if len(found.names) > 1:
        expr = f"(\n{_indent(expr)}\n)"
    expr = _mapped(resolved, signal, expr)
    if resolved.version_from_registry():
        expr = _version_joined(expr)
    return expr


def mirrored_signals(resolved: ResolvedSources) -> tuple[str, ...]:
    """The signals recorded under `redline:source:` names (present and not read as they are)."""
    return tuple(
        signal
        for signal in SIGNAL_NAMES
        if resolved.series(signal) is not None and not resolved.direct(signal)
    )


def active_version_rule() -> RecordingRule:
    """`model_active_info` reduced to one series per model (its active version): the join key.

    `topk by (model) (1, ...)` keeps the join one-to-one when two exporter replicas disagree for
    a scrape during a switch; without it `group_left` would fail the whole mirror for that
    evaluation and leave a gap in every request SLI.
    """
    info = _copy(catalog.MODEL_ACTIVE_INFO.name, catalog.LABEL_MODEL_VERSION, "version")
    by = f"{catalog.LABEL_MODEL}, {catalog.LABEL_MODEL_VERSION}"
    deduplicated = f"max by ({by}) (\n{_indent(info)}\n)"
    expr = f"topk by ({catalog.LABEL_MODEL}) (\n  1,\n{_indent(deduplicated)}\n)"
    return RecordingRule(catalog.MODEL_ACTIVE_VERSION_RECORD, expr)


def build_source_rules(resolved: ResolvedSources) -> list[RecordingRule]:
    """The mirror's recording rules, the active-version record first when versions are joined
    (rules of a group run in order: the mirrors see this evaluation's versions)."""
    signals = mirrored_signals(resolved)
    rules: list[RecordingRule] = []
    if signals and resolved.version_from_registry():
        rules.append(active_version_rule())
    for signal in signals:
        base = catalog.source_record(CANONICAL[signal].name)
        suffixes = HISTOGRAM_SUFFIXES if SIGNAL_KINDS[signal] == "histogram" else ("",)
        for suffix in suffixes:
            rules.append(RecordingRule(base + suffix, mirror_expr(resolved, signal, suffix)))
    return rules


def build_rules(spec: Spec) -> list[RuleGroup]:
    """The `redline-sources` group; none when every signal is read as it is (the gateway)."""
    rules = build_source_rules(spec.sources.resolve())
    if not rules:
        return []
    return [RuleGroup(GROUP, spec.timing.evaluation_interval_seconds, tuple(rules))]


def build_tests(spec: Spec, alerts: AlertIndex) -> list[Case]:
    """None: the mirror is proven by the cases of the alerts that read it, from raw series."""
    return []
