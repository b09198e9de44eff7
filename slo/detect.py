"""What an engine's exposition says about it: which source profile reads it, the latency buckets
it really serves, its labels, hints of its version, and the `sources:` block to paste.

Pure: `build_detection` takes the exposition's text (`redline sources detect` fetches it). The
engine is recognised by its end-to-end latency histogram, the one series every profile reads and
no two profiles share; NIM 2.x, which passes its backend's series through, is recognised as that
backend (vLLM or SGLang), never as NIM 1.x.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from redline.slo import catalog
from redline.slo.sources import PROFILES, SIGNAL_KINDS, SourceProfile


class ExpositionError(ValueError):
    """A body that is not a Prometheus or OpenMetrics exposition (or holds no sample)."""


class DetectionError(ValueError):
    """An exposition no profile reads, or one that holds two engines."""


Exposition = Mapping[str, frozenset[str]]
"""Sample name (`_bucket`, `_total` ... included) -> every label name its samples carry."""


@dataclass(frozen=True)
class VersionHint:
    """A series whose presence or absence dates an engine's release."""

    profile: str
    present: str
    absent: str | None
    says: str


# From vLLM 0.11.0's vllm/v1/metrics/loggers.py: `vllm:gpu_cache_usage_perc` was "Deprecated in
# 0.9.2 - Renamed as vllm:kv_cache_usage_perc" (hidden in 0.11 unless
# --show-hidden-metrics-for-version=0.10), and `vllm:time_per_output_token_seconds` was
# "Deprecated in 0.11 - Renamed as vllm:inter_token_latency_seconds".
VERSION_HINTS = (
    # vllm:admission_rejections appeared in vLLM 0.32.0 (absent from 0.31.0's loggers.py).
    VersionHint("vllm", "vllm:admission_rejections_total", None, "vLLM 0.32 or later"),
    VersionHint("vllm", "vllm:inter_token_latency_seconds_bucket", None, "vLLM 0.11 or later"),
    VersionHint(
        "vllm",
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vLLM before 0.11 (vllm:time_per_output_token_seconds, not inter_token_latency)",
    ),
    VersionHint(
        "vllm",
        "vllm:gpu_cache_usage_perc",
        "vllm:kv_cache_usage_perc",
        "vLLM before 0.9.2 (vllm:gpu_cache_usage_perc, not kv_cache_usage_perc)",
    ),
)


@dataclass(frozen=True)
class SignalPresence:
    """One signal of the profile: its series, and those of them the exposition lacks."""

    signal: str
    names: tuple[str, ...]
    missing: tuple[str, ...]


@dataclass(frozen=True)
class Detection:
    """What one exposition says: the profile that reads it and what the spec must say."""

    profile: SourceProfile
    histogram: str
    buckets: tuple[float, ...]
    labels: tuple[str, ...]
    signals: tuple[SignalPresence, ...]
    hints: tuple[str, ...]

    @property
    def buckets_differ(self) -> bool:
        """True when the served buckets are not the profile's defaults (`sources.histogram_buckets`
        must say them: vLLM's --custom-histogram-buckets, SGLang's --bucket-e2e-request-latency)."""
        return bool(self.buckets) and not same_buckets(self.buckets, self.profile.buckets)

    @property
    def needs_model(self) -> bool:
        """True when no served label names the model (`sources.model` must)."""
        if self.profile.model is not None or not self.profile.mirrored:
            return False
        return self.profile.labels.get(catalog.LABEL_MODEL) not in self.labels

    def sources_block(self) -> dict[str, object]:
        """The spec's `sources:` mapping for this engine (only what differs from the profile)."""
        block: dict[str, object] = {"profile": self.profile.name}
        if self.buckets_differ:
            block["histogram_buckets"] = list(self.buckets)
        if self.needs_model:
            block["model"] = "<the model this engine serves>"
        return block


def parse_families(text: str) -> list[Metric]:
    """The exposition's metric families (text format 0.0.4, or OpenMetrics when it ends in
    `# EOF`); ExpositionError when `text` is neither or holds no sample."""
    try:
        if text.rstrip().endswith("# EOF"):
            families = list(openmetrics_families(text))  # type: ignore[no-untyped-call]
        else:
            families = list(text_families(text))
    except ValueError as exc:
        raise ExpositionError(f"not a Prometheus exposition: {exc}") from None
    if not any(family.samples for family in families):
        raise ExpositionError("not a Prometheus exposition: it holds no sample")
    return families


def exposed_names(text: str) -> frozenset[str]:
    """The sample names as the text spells them: prometheus-client's parser appends `_total`
    to a counter's samples, but Prometheus stores TGI's `tgi_request_count` as it is."""
    names = set()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(None, 1)[0])
    return frozenset(names)


def sample_labels(families: Sequence[Metric], exposed: frozenset[str]) -> Exposition:
    """Each exposed sample name and the label names its samples carry."""
    found: dict[str, set[str]] = {}
    for family in families:
        for sample in family.samples:
            name = sample.name
            if name not in exposed and name.removesuffix("_total") in exposed:
                name = name.removesuffix("_total")
            found.setdefault(name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in found.items()}


def _histogram(profile: SourceProfile) -> str:
    return profile.series["request_duration"].names[0]


def same_buckets(served: tuple[float, ...], known: tuple[float, ...]) -> bool:
    """Whether two bucket lists hold the same bounds (as floats printed and parsed back)."""
    return len(served) == len(known) and all(
        math.isclose(a, b, rel_tol=1e-9) for a, b in zip(served, known, strict=True)
    )


def served_buckets(families: Sequence[Metric], histogram: str) -> tuple[float, ...]:
    """The finite `le` bounds of `histogram` in the exposition, ascending."""
    bounds = {
        float(sample.labels["le"])
        for family in families
        for sample in family.samples
        if sample.name == f"{histogram}_bucket" and sample.labels.get("le") not in (None, "+Inf")
    }
    return tuple(sorted(bounds))


def _signals(profile: SourceProfile, exposition: Exposition) -> tuple[SignalPresence, ...]:
    out = []
    for signal, found in profile.series.items():
        suffix = "_bucket" if SIGNAL_KINDS.get(signal) == "histogram" else ""
        missing = tuple(name for name in found.names if f"{name}{suffix}" not in exposition)
        out.append(SignalPresence(signal, found.names, missing))
    return tuple(out)


def build_detection(text: str) -> Detection:
    """The profile reading this exposition and what it serves; ExpositionError when the text is
    no exposition, DetectionError when no profile or two engines' histograms are in it."""
    families = parse_families(text)
    exposition = sample_labels(families, exposed_names(text))
    matched = [p for p in PROFILES.values() if f"{_histogram(p)}_bucket" in exposition]
    if not matched:
        known = ", ".join(f"{p.name} ({_histogram(p)})" for p in PROFILES.values())
        raise DetectionError(
            f"no known engine: the exposition has none of the latency histograms {known}"
        )
    if len(matched) > 1:
        both = ", ".join(f"{p.name} ({_histogram(p)})" for p in matched)
        raise DetectionError(
            f"two engines in one exposition: {both}; point at one engine's /metrics at a time"
        )
    profile = matched[0]
    histogram = _histogram(profile)
    hints = tuple(
        hint.says
        for hint in VERSION_HINTS
        if hint.profile == profile.name
        and hint.present in exposition
        and (hint.absent is None or hint.absent not in exposition)
    )
    labels = sorted(exposition[f"{histogram}_bucket"] - {"le"})
    return Detection(
        profile=profile,
        histogram=histogram,
        buckets=served_buckets(families, histogram),
        labels=tuple(labels),
        signals=_signals(profile, exposition),
        hints=hints,
    )
