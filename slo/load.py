"""Load a spec file, validate it, and run the cross-field consistency checks."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from redline.slo.spec import Spec, Timing, parse_duration

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
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def _describe(error: Any) -> str:
    message = str(error["msg"])
    if error["type"] == "extra_forbidden":
        return "unknown field (not part of spec v1)"
    if error["type"] == "missing":
        return "required field is missing"
    return message


def parse_spec(text: str, source: str) -> LoadedSpec:
    """Validate spec YAML text; raise SpecError naming the file and each bad field."""
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
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{source}: {_location(tuple(err['loc']))}: {_describe(err)}" for err in exc.errors()
        ]
        raise SpecError(problems) from None
    findings = check_spec(spec)
    errors = [f.render(source) for f in findings if f.level == "error"]
    if errors:
        raise SpecError(errors)
    return LoadedSpec(spec=spec, source=source, warnings=tuple(findings))


def load_spec(path: str | Path | None = None) -> LoadedSpec:
    """Read and validate a spec file; None loads the embedded default."""
    if path is None:
        return parse_spec(default_spec_text(), f"<embedded>/{DEFAULT_SPEC_NAME}")
    file = Path(path)
    try:
        text = file.read_text("utf-8")
    except FileNotFoundError:
        raise SpecError([f"{file}: (file): no such file"]) from None
    except IsADirectoryError:
        raise SpecError([f"{file}: (file): is a directory, expected a YAML file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([f"{file}: (file): cannot read: {exc}"]) from None
    return parse_spec(text, str(file))


def check_spec(spec: Spec) -> list[Finding]:
    """Cross-field consistency checks that a field-by-field schema cannot express."""
    findings: list[Finding] = []
    buckets = set(spec.sources.buckets)
    thresholds = [("red_lines.latency_p99.threshold_seconds", spec.red_lines.latency_p99)]
    for field, red_line in thresholds:
        if red_line.threshold_seconds not in buckets:
            findings.append(_no_bucket(field, red_line.threshold_seconds, buckets))
    for index, slo in enumerate(spec.slos):
        if slo.sli.kind == "slow_requests" and slo.sli.threshold_seconds not in buckets:
            field = f"slos[{index}].sli.threshold_seconds"
            findings.append(_no_bucket(field, slo.sli.threshold_seconds, buckets))
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
    for profile, override in spec.profiles.items():
        timing = apply_timing(spec.timing, override.model_dump(exclude_none=True))
        window = override.latency_window or spec.red_lines.latency_p99.window
        findings.extend(_window_findings(timing, spec, f"profiles.{profile}", window))
    return findings


def _no_bucket(field: str, threshold: float, buckets: set[float]) -> Finding:
    listed = ", ".join(f"{b:g}" for b in sorted(buckets))
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
    return spec.model_copy(update=update)
