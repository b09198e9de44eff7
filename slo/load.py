"""Load a spec file, validate it, and run the cross-field consistency checks."""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import ValidationError

from redline.slo.sources import SIGNAL_NAMES
from redline.slo.spec import KNOWN_PLAYBOOKS_CONTEXT, Severity, Spec, Timing, parse_duration

DEFAULT_SPEC_NAME = "default.yaml"


class SpecError(Exception):
    """A spec that cannot be used; `problems` holds one `file: field.path: message` line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Finding:
    """One consistency problem found in a valid spec."""

    level: str  # "error" or "warning"
    field: str
    message: str

    def render(self, source: str) -> str:
        """The `file: field: level: message` line the CLI prints."""
        return f"{source}: {self.field}: {self.level}: {self.message}"


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec, where it came from, and its warnings."""

    spec: Spec
    source: str
    warnings: tuple[Finding, ...]


def default_spec_text() -> str:
    """The YAML of the embedded default spec."""
    return (resources.files("redline.slo") / "specs" / DEFAULT_SPEC_NAME).read_text("utf-8")


def _location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("slow_requests", "errors") and parts and parts[-1].endswith("sli"):
            continue  # the discriminator tag pydantic adds is not a field the user wrote
        elif item == "[key]":
            continue  # pydantic's marker for a bad mapping key: the key itself is named
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def _describe(error: Any) -> str:
    message = str(error["msg"])
    if error["type"] == "extra_forbidden":
        return "unknown field (not part of spec v1)"
    if error["type"] == "missing":
        return "required field is missing"
    return message.removeprefix("Value error, ")


_FIELD_FIRST = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+): (.+)$", re.DOTALL)


def _problem(source: str, error: Any) -> str:
    """`file: field: message`; a validator's message naming a field under the error's location
    (`sources.labels.colour: ...`) names that field instead."""
    where, message = _location(tuple(error["loc"])), _describe(error)
    named = _FIELD_FIRST.match(message)
    if named and named.group(1).startswith(f"{where}."):
        where, message = named.groups()
    return f"{source}: {where}: {message}"


def parse_spec(text: str, source: str, playbooks: Collection[str] | None = None) -> LoadedSpec:
    """Validate spec YAML text; raise SpecError naming the file and each bad field. With
    `playbooks` (the registry's names), every playbook the spec names must be one of them."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(top level)"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError([f"{source}: {where}: malformed YAML: {problem}"]) from None
    if not isinstance(data, dict):
        kind = type(data).__name__ if data is not None else "an empty document"
        raise SpecError([f"{source}: (top level): expected a mapping of spec fields, got {kind}"])
    try:
        context = None if playbooks is None else {KNOWN_PLAYBOOKS_CONTEXT: frozenset(playbooks)}
        spec = Spec.model_validate(data, context=context)
    except ValidationError as exc:
        problems = [_problem(source, err) for err in exc.errors()]
        raise SpecError(problems) from None
    findings = check_spec(spec)
    errors = [f.render(source) for f in findings if f.level == "error"]
    if errors:
        raise SpecError(errors)
    return LoadedSpec(spec=spec, source=source, warnings=tuple(findings))


def load_spec(
    path: str | Path | None = None, playbooks: Collection[str] | None = None
) -> LoadedSpec:
    """Read and validate a spec file; None loads the embedded default. `playbooks`: see
    `parse_spec`."""
    if path is None:
        return parse_spec(default_spec_text(), f"<embedded>/{DEFAULT_SPEC_NAME}", playbooks)
    file = Path(path)
    try:
        text = file.read_text("utf-8")
    except FileNotFoundError:
        raise SpecError([f"{file}: (file): no such file"]) from None
    except IsADirectoryError:
        raise SpecError([f"{file}: (file): is a directory, expected a YAML file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([f"{file}: (file): cannot read: {exc}"]) from None
    return parse_spec(text, str(file), playbooks)


def check_spec(spec: Spec) -> list[Finding]:
    """Cross-field consistency checks that a field-by-field schema cannot express."""
    findings: list[Finding] = []
    findings.extend(threshold_findings(spec))
    findings.extend(_source_findings(spec))
    findings.extend(_group_findings(spec))
    for name in ("lora_adapter", "session_state", "embedding_index"):
        target = getattr(spec.rpo, name)
        interval = target.checkpoint_interval_seconds
        if interval is not None and interval > target.max_seconds:
            findings.append(
                Finding(
                    "warning",
                    f"rpo.{name}.checkpoint_interval_seconds",
                    f"a checkpoint every {interval:g} s cannot guarantee an RPO of "
                    f"{target.max_seconds:g} s: data up to {interval:g} s old may be lost; "
                    f"checkpoint at least every {target.max_seconds:g} s",
                )
            )
    findings.extend(_window_findings(spec.timing, spec))
    findings.extend(_escalation_findings(spec))
    for profile, override in spec.profiles.items():
        timing = apply_timing(spec.timing, override.model_dump(exclude_none=True))
        window = override.latency_window or spec.red_lines.latency_p99.window
        findings.extend(_window_findings(timing, spec, f"profiles.{profile}", window))
    return findings


def threshold_findings(spec: Spec) -> list[Finding]:
    """Latency thresholds that are not buckets: an error where the user chooses the buckets
    (redline's gateway), a warning naming the bucket used where the engine fixed them."""
    resolved = spec.sources.resolve()
    buckets = set(resolved.buckets)
    red_line = "red_lines.latency_p99.threshold_seconds"
    thresholds = [(red_line, spec.red_lines.latency_p99.threshold_seconds)]
    for index, slo in enumerate(spec.slos):
        if slo.sli.kind == "slow_requests":
            thresholds.append((f"slos[{index}].sli.threshold_seconds", slo.sli.threshold_seconds))
    findings = []
    for field, threshold in thresholds:
        if threshold in buckets:
            continue
        bound = resolved.slow_bucket(threshold)
        if bound is None:
            findings.append(_no_bucket(field, threshold, buckets, resolved.name, resolved.mirrored))
            continue
        above = min((b for b in buckets if b > threshold), default=math.inf)
        where = (
            f"{threshold:g} s is not a bucket of the {resolved.name} profile's latency histogram"
        )
        if field != red_line:
            consequence = f"requests over {bound:g} s count as slow"
        else:
            consequence = (
                f"the P{_percent(spec.red_lines.latency_p99.quantile)} is interpolated between "
                f"the buckets {bound:g} s and {above:g} s, approximate near the red line"
            )
        findings.append(Finding("warning", field, f"{where}; {consequence}"))
    return findings


def _percent(quantile: float) -> str:
    return f"{quantile * 100:g}"


_LOST = {
    "request_duration": "no latency red line, latency SLO or rollback gate",
    "requests": "no availability SLO",
    "errors": "no availability SLO",
    "prompt_tokens": "no prompt tokens/s is recorded",
    "generated_tokens": "no generated tokens/s is recorded",
    "time_to_first_token": "no time-to-first-token P99 is recorded",
}


_REROUTE = "p99_including_reroute"


def _source_findings(spec: Spec) -> list[Finding]:
    """What the source profile cannot provide, said once each (never silently dropped)."""
    resolved = spec.sources.resolve()
    profile = resolved.profile
    findings = []
    for signal in SIGNAL_NAMES:
        if resolved.series(signal) is None:
            reason = profile.missing.get(signal, f"the {profile.name} profile has no such series")
            findings.append(
                Finding(
                    "warning",
                    f"sources.series.{signal}",
                    f"not available from {profile.name}: {reason}; {_LOST[signal]}",
                )
            )
    if spec.red_lines.latency_p99.includes_reroute and not profile.includes_reroute:
        # The profiles' reasons end by saying the gateway is needed: said once, first.
        reason = re.sub(r"\s*\([^()]*gateway[^()]*\)$", "", profile.missing.get(_REROUTE, ""))
        findings.append(
            Finding(
                "warning",
                "red_lines.latency_p99.includes_reroute",
                f"P99 including reroute needs redline's gateway in the path; {profile.name}: "
                f"{reason or 'no reroute is measured'} (set includes_reroute: false to say so)",
            )
        )
    for capability, reason in profile.missing.items():
        if capability in SIGNAL_NAMES or capability == _REROUTE:
            continue
        findings.append(
            Finding(
                "warning",
                "sources.profile",
                f"{profile.name}: {capability.replace('_', ' ')}: {reason}",
            )
        )
    return findings


def _group_findings(spec: Spec) -> list[Finding]:
    """Grouped SLOs that can hold one group only: grouped by model alone (and its version, one
    active at a time) where the source names one constant model."""
    model = spec.sources.resolve().profile.model
    if model is None:
        return []
    return [
        Finding(
            "warning",
            f"slos[{index}].group_by",
            f"the {spec.sources.profile} source serves the one model {model!r} "
            "(sources.model): grouping by model or model_version yields a single group",
        )
        for index, slo in enumerate(spec.slos)
        if slo.group_by and set(slo.group_by) <= {"model", "model_version"}
    ]


def _escalation_findings(spec: Spec) -> list[Finding]:
    """Alerts that reach no human: every page without `escalation`, and the severities it
    neither lists nor covers with `default` (a severity listed as [] is a choice: not warned)."""
    escalation = spec.escalation
    if escalation is None:
        return [
            Finding(
                "warning",
                "escalation",
                "not set: critical and page alerts reach no human (Alertmanager sends every "
                "alert to the remediation receiver only, which runs playbooks and audits the "
                "rest); add escalation.receivers and escalation.routes",
            )
        ]
    listed = {str(severity) for severity in escalation.routes}
    silent = [str(s) for s in get_args(Severity) if str(s) not in listed]
    if escalation.default or not silent:
        return []
    return [
        Finding(
            "warning",
            "escalation.routes",
            f"{', '.join(silent)} alerts reach no human (not listed, no escalation.default): "
            "those without a playbook only reach the remediation receiver's audit trail",
        )
    ]


def _no_bucket(
    field: str, threshold: float, buckets: set[float], profile: str, mirrored: bool
) -> Finding:
    listed = ", ".join(f"{b:g}" for b in sorted(buckets))
    if mirrored:
        return Finding(
            "error",
            field,
            f"{threshold:g} s is below every bucket of the {profile} profile's latency histogram "
            f"({listed}): no request can be counted as faster; raise the threshold or set "
            "sources.histogram_buckets to the le values your engine exposes",
        )
    return Finding(
        "error",
        field,
        f"{threshold:g} s is not a bucket of sources.histogram_buckets ({listed}); "
        "add it so the share of slower requests can be counted exactly",
    )


def _window_findings(
    timing: Timing, spec: Spec, prefix: str = "timing", latency_window: str | None = None
) -> list[Finding]:
    findings: list[Finding] = []
    scrape = timing.scrape_interval_seconds
    latency = latency_window or spec.red_lines.latency_p99.window
    windows = {
        "rollback.window_seconds": float(spec.rollback.window_seconds),
        "red_lines.latency_p99.window": parse_duration(latency),
    }
    for field, seconds in windows.items():
        if seconds < scrape:
            findings.append(
                Finding(
                    "error",
                    field,
                    f"window of {seconds:g} s is shorter than {prefix}.scrape_interval_seconds "
                    f"({scrape:g} s): it would hold no sample",
                )
            )
        elif seconds < 4 * scrape:
            findings.append(
                Finding(
                    "warning",
                    field,
                    f"window of {seconds:g} s holds fewer than 4 scrapes at {prefix}."
                    f"scrape_interval_seconds={scrape:g} s; rates will be noisy",
                )
            )
    if timing.evaluation_interval_seconds < scrape / 4:
        findings.append(
            Finding(
                "warning",
                f"{prefix}.evaluation_interval_seconds",
                "evaluating much faster than scraping recomputes the same samples",
            )
        )
    for index, slo in enumerate(spec.slos):
        if parse_duration(slo.period) < 3 * 86400:
            findings.append(
                Finding(
                    "error",
                    f"slos[{index}].period",
                    f"{slo.period} is shorter than the 3d window of the slowest burn-rate alert",
                )
            )
    return findings


def apply_timing(timing: Timing, changes: dict[str, Any]) -> Timing:
    """`timing` with a profile's fields replaced (red_line_for_seconds is applied elsewhere)."""
    fields = {k: v for k, v in changes.items() if k in Timing.model_fields}
    return timing.model_copy(update=fields)


def apply_profile(spec: Spec, profile: str | None) -> Spec:
    """The spec as a named profile sees it (`None` is the spec itself)."""
    if profile is None:
        return spec
    if profile not in spec.profiles:
        allowed = ", ".join(sorted(spec.profiles)) or "(none defined)"
        raise SpecError([f"profiles: unknown profile {profile!r}; allowed: {allowed}"])
    changes = spec.profiles[profile].model_dump(exclude_none=True)
    update: dict[str, Any] = {"timing": apply_timing(spec.timing, changes)}
    red = spec.red_lines
    window = changes.get("latency_window")
    if window is not None:
        red = red.model_copy(
            update={"latency_p99": red.latency_p99.model_copy(update={"window": window})}
        )
        update["red_lines"] = red
    saturation_window = changes.get("saturation_window")
    if saturation_window is not None:
        latency = red.latency_p99
        warning = latency.saturation.model_copy(update={"window": saturation_window})
        red = red.model_copy(
            update={"latency_p99": latency.model_copy(update={"saturation": warning})}
        )
        update["red_lines"] = red
    for_seconds = changes.get("red_line_for_seconds")
    if for_seconds is not None:
        update["red_lines"] = red.model_copy(
            update={
                name: getattr(red, name).model_copy(update={"for_seconds": for_seconds})
                for name in ("latency_p99", "context_keepalive", "index_consistency")
            }
        )
        update["rpo"] = spec.rpo.model_copy(
            update={
                name: getattr(spec.rpo, name).model_copy(update={"for_seconds": for_seconds})
                for name in ("lora_adapter", "session_state", "embedding_index")
            }
        )
        update["rollback"] = spec.rollback.model_copy(update={"for_seconds": for_seconds})
    guards = {
        field: changes[f"rollback_{field}"]
        for field in ("min_samples", "min_eval_samples")
        if changes.get(f"rollback_{field}") is not None
    }
    if guards:
        rollback = update.get("rollback", spec.rollback)
        update["rollback"] = rollback.model_copy(update=guards)
    breakers = {
        field: changes[f"breaker_{field}"]
        for field in ("window", "open_for")
        if changes.get(f"breaker_{field}") is not None
    }
    if breakers:
        # Validated again: the profile's window must pass the same checks as the spec's.
        try:
            update["breakers"] = type(spec.breakers).model_validate(
                {**spec.breakers.model_dump(), **breakers}
            )
        except ValidationError as exc:
            problems = [f"profiles.{profile}: {e['msg']}" for e in exc.errors()]
            raise SpecError(problems) from None
    return spec.model_copy(update=update)
