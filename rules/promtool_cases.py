"""The shape of a promtool test case and the builders every family writes its cases with.

Values come from the spec's thresholds, so a changed spec keeps the proof honest; each case is
evaluated by the real `promtool test rules` against the generated rule files.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from redline.rules.model import AlertRule, RuleGroup, format_duration, number
from redline.rules.templating import expand
from redline.slo import catalog
from redline.slo.sources import SourceSeries
from redline.slo.spec import Spec

SERIES_INTERVAL = 60
"""Input series step (seconds): one sample a minute, as `0+100x30` reads."""


@dataclass
class Case:
    """One promtool test: input series, then alerts expected at one evaluation time."""

    name: str
    series: dict[str, str]
    eval_seconds: int
    checks: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    interval_seconds: int = SERIES_INTERVAL
    earlier: list[tuple[int, str, list[dict[str, Any]]]] = field(default_factory=list)
    """Checks at other evaluation times: (seconds, alert, expected), before `checks`' time."""

    def to_dict(self) -> dict[str, Any]:
        """The promtool test-group YAML shape."""
        at = [(self.eval_seconds, alert, exp) for alert, exp in self.checks]
        return {
            "name": self.name,
            "interval": format_duration(self.interval_seconds),
            "input_series": [{"series": s, "values": v} for s, v in self.series.items()],
            "alert_rule_test": [
                {"eval_time": format_duration(seconds), "alertname": a, "exp_alerts": e}
                for seconds, a, e in [*self.earlier, *at]
            ],
        }


class AlertIndex:
    """The alerting rules of some groups, looked up by name and rule labels."""

    def __init__(self, groups: list[RuleGroup]) -> None:
        self.alerts = [a for g in groups for a in g.alerts]

    def get(self, name: str, **labels: str) -> AlertRule:
        """The first alert called `name` whose labels include `labels`."""
        for rule in self.alerts:
            if rule.alert == name and all(rule.labels.get(k) == v for k, v in labels.items()):
                return rule
        raise KeyError(f"no alert {name} {labels}")


def expected(rule: AlertRule, expr_labels: dict[str, str], value: float) -> dict[str, Any]:
    """What promtool must see for `rule` firing with these series labels and value."""
    labels = {**expr_labels, **rule.labels}
    return {
        "exp_labels": dict(sorted(labels.items())),
        "exp_annotations": {k: expand(v, labels, value) for k, v in rule.annotations.items()},
    }


def series(name: str | catalog.Metric, labels: dict[str, str] | None = None) -> str:
    """A promtool input series name: `name{a="b",...}`, labels sorted."""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted((labels or {}).items()))
    return f"{name}{{{inner}}}" if inner else str(name)


def constant(value: float, steps: int) -> str:
    """A series holding `value` for `steps` samples."""
    return f"{number(value)}+0x{steps}"


def counter(per_step: float, steps: int) -> str:
    """A counter growing by `per_step` each sample, for `steps` samples."""
    return f"0+{number(per_step)}x{steps}"


_SERIES_VALUES = re.compile(r"^(-?[0-9.e+-]+)\+(-?[0-9.e+-]+)x([0-9]+)$")


def in_phases(*phases: tuple[dict[str, str], int]) -> dict[str, str]:
    """Series whose growth changes from one phase to the next: each phase's series (as
    `counter`/`constant` write them) for its steps, every series continuing where it stood. A
    series first seen in a later phase is missing before it (an engine creates its error
    series at the first error); one a later phase lacks holds its last value (no more growth).
    """
    values: dict[str, list[str]] = {}
    last: dict[str, float] = {}
    done = 0
    for index, (phase, steps) in enumerate(phases):
        for name in sorted(set(last) - set(phase)):
            values[name].append(f"{number(last[name])}+0x{steps - 1}" if steps > 1 else
                                number(last[name]))  # fmt: skip
        for name, text in phase.items():
            found = _SERIES_VALUES.match(text)
            if found is None:
                raise ValueError(f"{name}: {text!r} is not a start+step x count series")
            start, step = float(found.group(1)), float(found.group(2))
            if name not in last:
                missing = done
                values[name] = [f"_x{missing}"] if missing else []
                first = start if index == 0 else start + step
            else:
                first = last[name] + step
            count = steps + 1 if index == 0 else steps
            values[name].append(f"{number(first)}+{number(step)}x{count - 1}")
            last[name] = first + step * (count - 1)
        done += steps + 1 if index == 0 else steps
    return {name: " ".join(parts) for name, parts in values.items()}


def case_eval_step(spec: Spec) -> float:
    """The cases' evaluation step (the test file's `evaluation_interval`): the spec's, at least
    15 s (hour-long cases evaluated every second take minutes in promtool; 15 s steps prove
    the same logic)."""
    return max(spec.timing.evaluation_interval_seconds, 15)


CASE_MODEL = "chat"
"""The model the cases serve (a profile with a constant model serves that one instead)."""


class CaseInputError(ValueError):
    """A source whose raw series the cases cannot write (a matcher no example value satisfies)."""


_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*$')


def parse_matcher(matcher: str) -> tuple[str, str, str]:
    """(label, operator, value) of a PromQL label matcher such as `status="5xx"`."""
    found = _MATCHER.match(matcher)
    if found is None:
        raise CaseInputError(f"{matcher!r} is not a PromQL label matcher")
    label, op, raw = (str(group) for group in found.groups())
    return label, op, re.sub(r"\\(.)", r"\1", raw)


def matches(matcher: str, labels: dict[str, str]) -> bool:
    """True when a series with `labels` satisfies `matcher` (a missing label is "")."""
    label, op, value = parse_matcher(matcher)
    actual = labels.get(label, "")
    if op in ("=", "!="):
        return (actual == value) == (op == "=")
    try:
        found = re.fullmatch(value, actual) is not None
    except re.error as exc:  # RE2 syntax Python does not read
        raise CaseInputError(f"cannot evaluate the regex of {matcher!r}: {exc}") from None
    return found == (op == "=~")


def _regex_examples(regex: str) -> list[str]:
    """Strings that may match `regex`, simplest first (each is checked by the caller)."""
    out: list[str] = []
    for variant in (
        re.sub(r"\([^()]*\)[?*]", "", regex),  # optional groups left out
        re.sub(r"\(([^()]*)\)[?*]?", r"\1", regex),  # groups kept
    ):
        text = re.sub(r"\(([^()|]*)\|[^()]*\)", r"\1", variant).split("|")[0]
        text = re.sub(r"\[\^?([^\]])[^\]]*\]", r"\1", text)
        text = re.sub(r"\.\*|\\d\*", "", text)
        text = re.sub(r"\.\+?", "0", text).replace("\\d", "0")
        out.append(re.sub(r"\\(.)", r"\1", text).replace("(", "").replace(")", ""))
    return out


# Plausible values first: an error matcher is satisfied by an error, violated by a success.
_SATISFYING: tuple[str, ...] = ("error", "5xx", "500", "x")
_VIOLATING: tuple[str, ...] = ("2xx", "200", "ok", "x", "")
_VIOLATING_BY_LABEL: dict[str, tuple[str, ...]] = {"finished_reason": ("stop",)}
"""A label's own value for a request that is no error (vLLM's FinishReason.STOP)."""
_SATISFYING_BY_LABEL: dict[str, tuple[str, ...]] = {"error_type": ("InternalServerError",)}
"""A label's own value for a server error (the OpenAI SDK's exception for a 5xx)."""


def _value_for(matcher: str, satisfy: bool) -> str:
    label, op, value = parse_matcher(matcher)
    examples: list[str] = _regex_examples(value) if "~" in op else []
    fallback = _SATISFYING if satisfy else (*_VIOLATING_BY_LABEL.get(label, ()), *_VIOLATING)
    preferred = _SATISFYING_BY_LABEL.get(label, ()) if satisfy else ()
    candidates: list[str] = [*preferred, value, *examples, *fallback]
    for candidate in candidates:
        if matches(matcher, {label: candidate}) == satisfy:
            return candidate
    verb = "satisfies" if satisfy else "violates"
    raise CaseInputError(f"no example label value {verb} the matcher {matcher!r}")


def _with(labels: dict[str, str], label: str, value: str) -> dict[str, str]:
    out = {k: v for k, v in labels.items() if k != label}
    if value:  # an empty value is a missing label
        out[label] = value
    return out


def satisfying(matchers: tuple[str, ...], labels: dict[str, str]) -> dict[str, str]:
    """`labels` changed just enough to satisfy every matcher."""
    out = dict(labels)
    for matcher in matchers:
        if not matches(matcher, out):
            out = _with(out, parse_matcher(matcher)[0], _value_for(matcher, True))
    if not all(matches(m, out) for m in matchers):
        raise CaseInputError(f"no label values satisfy every matcher of {', '.join(matchers)}")
    return out


def case_model(spec: Spec) -> str:
    """The model the cases' requests are for."""
    return spec.sources.resolve().profile.model or CASE_MODEL


def engine_labels(spec: Spec, labels: dict[str, str]) -> dict[str, str]:
    """A request's catalog labels as the source's raw series carries them: renamed to the
    engine's labels; the ones the mirror sets (served_region, rerouted, a constant model, the
    registry's version) or the engine lacks (status) left out. The gateway's: unchanged."""
    resolved = spec.sources.resolve()
    if not resolved.mirrored:
        return dict(labels)
    out: dict[str, str] = {}
    for label, value in labels.items():
        engine = resolved.profile.labels.get(label)
        if engine is not None:
            out[engine] = value
        elif label not in catalog.REQUEST_LABELS:
            out[label] = value
    return out


def active_versions(spec: Spec, labels: dict[str, str], steps: int) -> dict[str, str]:
    """The snapshot registry's `model_active_info` naming the labels' model version as active,
    where the rules join versions from it (engine profiles); nothing otherwise."""
    resolved = spec.sources.resolve()
    version = labels.get(catalog.LABEL_MODEL_VERSION)
    if not resolved.version_from_registry() or version is None:
        return {}
    model = resolved.profile.model or labels.get(catalog.LABEL_MODEL, CASE_MODEL)
    info = {catalog.LABEL_MODEL: model, "version": version}
    return {series(catalog.MODEL_ACTIVE_INFO, info): constant(1, steps)}


def histogram(
    spec: Spec, labels: dict[str, str], per_bucket: dict[float, float], steps: int
) -> dict[str, str]:
    """Bucket, count and sum series of the source's latency histogram over `steps` samples (the
    engine's own name and labels for an engine profile, with its active version); `per_bucket`
    maps a bucket's upper bound to the requests falling in it each step."""
    found = spec.sources.resolve().series("request_duration")
    assert found is not None, "every profile has a latency histogram"
    base = found.names[0]
    raw = satisfying(found.matchers, engine_labels(spec, labels))
    out: dict[str, str] = {}
    cumulative = 0.0
    for bound in spec.sources.buckets:
        cumulative += per_bucket.get(bound, 0)
        out[series(f"{base}_bucket", {**raw, "le": number(bound)})] = counter(cumulative, steps)
    cumulative += per_bucket.get(math.inf, 0)
    out[series(f"{base}_bucket", {**raw, "le": "+Inf"})] = counter(cumulative, steps)
    out[series(f"{base}_count", raw)] = counter(cumulative, steps)
    total = sum(bound * n for bound, n in per_bucket.items() if bound != math.inf)
    out[series(f"{base}_sum", raw)] = counter(total, steps)
    out.update(active_versions(spec, labels, steps))
    return out


def request_counters(
    spec: Spec, labels: dict[str, str], requests: float, errors: float | None, steps: int
) -> dict[str, str]:
    """Raw counters of the source adding up to `requests` requests and `errors` errors a step;
    `errors` None writes no error series at all (an engine creates it at the first error).

    Where the source's error series is one of its request series (vLLM's
    `http_requests_total{status="5xx"}`, NIM's failures), the errors are written once and the
    rest as requests the error selector does not match; otherwise both counters are written.
    """
    resolved = spec.sources.resolve()
    req, err = resolved.series("requests"), resolved.series("errors")
    assert req is not None and err is not None, "every profile has request and error counters"
    base = engine_labels(spec, labels)
    err_name = err.names[0]
    err_labels = satisfying(err.matchers_of(err_name), base)
    out: dict[str, str] = {}
    if errors is None:
        name, good = _not_an_error(req, err, base)
        out[series(name, good)] = counter(requests, steps)
    elif err_name in req.names and all(matches(m, err_labels) for m in req.matchers_of(err_name)):
        out[series(err_name, err_labels)] = counter(errors, steps)
        if requests > errors:
            name, good = _not_an_error(req, err, base)
            out[series(name, good)] = counter(requests - errors, steps)
    else:
        name, good = _not_an_error(req, err, base)
        out[series(name, good)] = counter(requests, steps)
        out[series(err_name, err_labels)] = counter(errors, steps)
    out.update(active_versions(spec, labels, steps))
    return out


def _not_an_error(
    req: SourceSeries, err: SourceSeries, base: dict[str, str]
) -> tuple[str, dict[str, str]]:
    """A request series (name, labels) the error selector does not count: a request name that
    is no error name, else one whose labels miss an error matcher (vLLM's
    `finished_reason="error"`, NIM's none: then this fails)."""
    for name in req.names:
        if name not in err.names:
            return name, satisfying(req.matchers_of(name), base)
    for name in req.names:
        labels = satisfying(req.matchers_of(name), base)
        constrained = {parse_matcher(m)[0] for m in req.matchers_of(name)}
        for matcher in err.matchers_of(name):
            label = parse_matcher(matcher)[0]
            if label not in constrained:
                return name, _with(labels, label, _value_for(matcher, False))
    raise CaseInputError(
        f"every request series {', '.join(req.names)} {', '.join(req.matchers)} is also an error"
    )


def bucket_around(spec: Spec, threshold: float) -> tuple[float, float]:
    """The bucket bound up to which requests count as fast at `threshold` (the threshold itself,
    or an engine's nearest bound below it: `ResolvedSources.slow_bucket`) and the next above."""
    buckets = sorted(spec.sources.buckets)
    at = spec.sources.resolve().slow_bucket(threshold)
    if at is None:
        at = threshold
    above = [b for b in buckets if b > at]
    return at, (above[0] if above else math.inf)
