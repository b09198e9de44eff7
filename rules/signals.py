"""Reading a signal: `sum by (...) (rate(...))` over the source's own series, mapped inside the sum.

Every rule that reads a request signal (latency, requests, errors, tokens, time to first token)
aggregates it: a quantile by region, an error ratio by SLO group, a count by model version. This
module writes that aggregation for the spec's source:

- redline's gateway writes the catalog's series with the catalog's labels: they are read as they
  are (`sum by (le, region) (rate(llm_request_duration_seconds_bucket[5m]))`);
- an engine profile's series are read where they are, never copied: the rate is taken on each
  raw series (a counter reset stays on its own series), the engine's labels are mapped onto the
  catalog's inside the aggregation (`label_replace` under the `sum`, only for the labels the sum
  keeps), and `model_version` is joined from the snapshot registry's active version after it,
  on the few aggregated series. The rules add only aggregated series, as a plain SLO rule set
  over the raw series does (`bench/rules_cost.py` measures both).

An SLI selector names catalog labels; on an engine's series it is translated to the engine's
label names, a constant model is checked statically, and a `model_version` matcher selects the
registry's active version it names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from redline.slo import catalog
from redline.slo.sources import (
    SATURATION_KINDS,
    ResolvedSources,
    SourceProfileError,
    SourceSeries,
)
from redline.slo.spec import Spec

Fn = Literal["rate", "increase"]
SOURCE_SERIES_LABEL = "source_series"
"""Tags each engine series of a signal read from several names, so that they stay distinct."""
UNKNOWN_VERSION = "unknown"
"""`model_version` of a model the snapshot registry has no active version for."""
NOTHING = "vector(0) unless vector(0)"
"""An empty instant vector: what a selector no series can match reads."""


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def indent(expr: str) -> str:
    """`expr` indented by two spaces, line by line."""
    return "\n".join(f"  {line}" for line in expr.splitlines())


def label_replace(expr: str, dst: str, replacement: str, src: str, regex: str) -> str:
    """`label_replace(expr, dst, replacement, src, regex)`, the inner expression indented."""
    args = ", ".join(quote(arg) for arg in (dst, replacement, src, regex))
    return f"label_replace(\n{indent(expr)},\n  {args}\n)"


def constant_label(expr: str, label: str, value: str) -> str:
    """`expr` with `label` set to `value` on every series."""
    return label_replace(expr, label, value, "", "")


def copy_label(expr: str, dst: str, src: str) -> str:
    """`expr` with `dst` set to the value of `src`."""
    return label_replace(expr, dst, "$1", src, "(.*)")


def _by(labels: Sequence[str]) -> str:
    return f" by ({', '.join(labels)})" if labels else ""


def _selector(matchers: Sequence[str]) -> str:
    return "{" + ",".join(matchers) + "}" if matchers else ""


def _found(resolved: ResolvedSources, signal: str) -> SourceSeries:
    found = resolved.series(signal)
    if found is None:
        raise SourceProfileError(f"sources.series.{signal}: the {resolved.name} profile has none")
    return found


def _engine_matchers(
    resolved: ResolvedSources, selector: Mapping[str, str]
) -> tuple[list[str], str | None] | None:
    """The selector as matchers on the engine's labels and the `model_version` it asks for;
    None when it can match nothing (another constant model than the profile's)."""
    profile = resolved.profile
    matchers: list[str] = []
    version: str | None = None
    for label, value in sorted(selector.items()):
        if label == catalog.LABEL_MODEL_VERSION and resolved.version_from_registry():
            version = value
        elif label == catalog.LABEL_MODEL and profile.model is not None:
            if value != profile.model:
                return None
        elif label == catalog.LABEL_REROUTED:
            if value != "false":  # no gateway, no reroute
                return None
        elif label == catalog.LABEL_SERVED_REGION:
            matchers.append(f"{profile.labels.get(catalog.LABEL_REGION, label)}={quote(value)}")
        else:
            matchers.append(f"{profile.labels.get(label, label)}={quote(value)}")
    return matchers, version


def _mapped(resolved: ResolvedSources, expr: str, keep: Sequence[str]) -> str:
    """`expr` (engine series) with the catalog labels in `keep` set from the engine's."""
    profile = resolved.profile
    for label in keep:
        if label in ("le", SOURCE_SERIES_LABEL):
            continue
        if label == catalog.LABEL_MODEL_VERSION and resolved.version_from_registry():
            continue  # joined after the sum
        if label == catalog.LABEL_MODEL and profile.model is not None:
            expr = constant_label(expr, label, profile.model)
        elif label == catalog.LABEL_SERVED_REGION:
            source = profile.labels.get(catalog.LABEL_REGION, catalog.LABEL_REGION)
            expr = copy_label(expr, label, source)
        elif label == catalog.LABEL_REROUTED:
            expr = constant_label(expr, label, "false")
        else:
            engine = profile.labels.get(label, label)
            if engine != label:
                expr = copy_label(expr, label, engine)
    return expr


def _terms(
    found: SourceSeries, suffix: str, fn: Fn, window: str, extra: Sequence[str], tagged: bool
) -> str:
    """`fn(name{matchers}[window])` of every name of the signal, tagged and `or`-ed when many."""
    parts = []
    for name in found.names:
        term = f"{fn}({name}{suffix}{_selector([*found.matchers_of(name), *extra])}[{window}])"
        parts.append(constant_label(term, SOURCE_SERIES_LABEL, name) if tagged else term)
    return "\nor\n".join(parts)


def _version_joined(expr: str, version: str | None) -> str:
    """`expr` (with `model`) stamped with the registry's active version of its model (`unknown`
    without one: see `active_version_expr`); with `version`, only the models whose active
    version it is."""
    active = catalog.MODEL_ACTIVE_VERSION_RECORD
    if version is not None:
        active = f"{active}{{{catalog.LABEL_MODEL_VERSION}={quote(version)}}}"
    on = f"on ({catalog.LABEL_MODEL})"
    return f"(\n{indent(expr)}\n)\n* {on} group_left ({catalog.LABEL_MODEL_VERSION}) {active}"


def active_version_expr(spec: Spec) -> str:
    """The active version of every model: `model_active_info` (the snapshot registry's) reduced
    to one series per model, and `unknown` for a model the engine serves without one.

    `topk by (model) (1, ...)` keeps the join one-to-one when two exporter replicas disagree for
    a scrape during a switch; without it `group_left` would fail every version-joined rule for
    that evaluation. The `unknown` models are those the engine's latency histogram counts
    requests of, so a version join never drops a model's traffic.
    """
    resolved = spec.sources.resolve()
    info = copy_label(catalog.MODEL_ACTIVE_INFO.name, catalog.LABEL_MODEL_VERSION, "version")
    by = f"{catalog.LABEL_MODEL}, {catalog.LABEL_MODEL_VERSION}"
    deduplicated = f"max by ({by}) (\n{indent(info)}\n)"
    registry = f"topk by ({catalog.LABEL_MODEL}) (\n  1,\n{indent(deduplicated)}\n)"
    found = _found(resolved, "request_duration")
    served = "\nor\n".join(found.selector(name, "_count") for name in found.names)
    mapped = _mapped(resolved, served, [catalog.LABEL_MODEL])
    models = f"group by ({catalog.LABEL_MODEL}) (\n{indent(mapped)}\n)"
    unknown = constant_label(models, catalog.LABEL_MODEL_VERSION, UNKNOWN_VERSION)
    return f"{registry}\nor on ({catalog.LABEL_MODEL})\n{unknown}"


def aggregate(
    spec: Spec,
    signal: str,
    window: str,
    by: Sequence[str] = (),
    *,
    suffix: str = "",
    fn: Fn = "rate",
    selector: Mapping[str, str] | None = None,
    matchers: Sequence[str] = (),
) -> str:
    """PromQL for `sum by (by) (fn(<signal><suffix>{selector, matchers}[window]))` over the
    spec's source, with the catalog's labels whatever the engine (see the module docstring).

    `selector` holds catalog labels (an SLI's), `matchers` raw PromQL matchers on labels the
    source shares with the catalog (`le`)."""
    resolved = spec.sources.resolve()
    found = _found(resolved, signal)
    selected = dict(selector or {})
    if not resolved.mirrored:
        extra = [*(f"{k}={quote(v)}" for k, v in sorted(selected.items())), *matchers]
        inner = _terms(found, suffix, fn, window, extra, tagged=len(found.names) > 1)
        if len(found.names) > 1:
            return f"sum{_by(by)} (\n{indent(inner)}\n)"
        return f"sum{_by(by)} ({inner})" if by else f"sum({inner})"
    translated = _engine_matchers(resolved, selected)
    if translated is None:
        return NOTHING
    engine, version = translated
    extra = [*engine, *matchers]
    joined = resolved.version_from_registry() and (
        catalog.LABEL_MODEL_VERSION in by or version is not None
    )
    keep = list(by)
    if joined:
        keep = [label for label in by if label != catalog.LABEL_MODEL_VERSION]
        if catalog.LABEL_MODEL not in keep:
            keep.append(catalog.LABEL_MODEL)
    inner = _terms(found, suffix, fn, window, extra, tagged=len(found.names) > 1)
    if len(found.names) > 1:
        inner = f"(\n{indent(inner)}\n)"
    expr = f"sum{_by(keep)} (\n{indent(_mapped(resolved, inner, keep))}\n)"
    if not joined:
        return expr
    expr = _version_joined(expr, version)
    if catalog.LABEL_MODEL in by and catalog.LABEL_MODEL_VERSION in by:
        return expr
    return f"sum{_by(by)} (\n{indent(expr)}\n)"


def saturation(
    spec: Spec, signal: str, by: Sequence[str], window: str, op: Literal["sum", "max"] = "sum"
) -> str | None:
    """PromQL reading the engine's saturation `signal` (`SATURATION_KINDS`) by catalog labels
    `by`, mapped from the engine's inside the aggregation: a gauge's `op`, a counter's summed
    rate, a histogram's bucket rates by `le` as well. None where the profile has no such series."""
    resolved = spec.sources.resolve()
    found = resolved.profile.saturation.get(signal)
    if found is None:
        return None
    kind = SATURATION_KINDS[signal]
    keep = [*by, "le"] if kind == "histogram" else list(by)
    if kind == "gauge":
        terms = "\nor\n".join(found.selector(name) for name in found.names)
    else:
        suffix = "_bucket" if kind == "histogram" else ""
        terms = _terms(found, suffix, "rate", window, (), tagged=len(found.names) > 1)
        op = "sum"
    return f"{op}{_by(keep)} (\n{indent(_mapped(resolved, terms, keep))}\n)"


def raw_series(spec: Spec, signal: str, suffix: str = "") -> str:
    """A selector of the signal's first raw series (for `absent()` and `label_values()`)."""
    found = _found(spec.sources.resolve(), signal)
    return found.selector(found.names[0], suffix)


__all__ = [
    "NOTHING",
    "SOURCE_SERIES_LABEL",
    "UNKNOWN_VERSION",
    "active_version_expr",
    "aggregate",
    "constant_label",
    "copy_label",
    "indent",
    "label_replace",
    "quote",
    "raw_series",
    "saturation",
]
