"""The spec's thresholded signals the report follows: red lines, RPO targets, embedding drift."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.report.text import num
from redline.slo.spec import Spec

SignalKind = Literal["red_line", "rpo", "drift"]


@dataclass(frozen=True)
class SignalDef:
    """A thresholded signal of the spec: a red line, an RPO target, or embedding drift."""

    key: str
    kind: SignalKind
    title: str
    series: str
    threshold: float
    unit: str
    above_is_bad: bool
    alert: str
    objective: str


def latency_includes_reroute(spec: Spec) -> bool:
    """True when the latency red line is measured end to end around cross-region reroutes: the
    spec says so and its source profile can (only redline's gateway sees a reroute)."""
    profile = spec.sources.resolve().profile
    return spec.red_lines.latency_p99.includes_reroute and profile.includes_reroute


def source_notes(spec: Spec) -> list[str]:
    """The report's notes on its source: the profile the request SLIs come from, the series that
    stand in where the engine has no exact equivalent, and what the profile cannot measure."""
    sources = spec.sources.resolve()
    profile = sources.profile
    quantile = f"P{num(spec.red_lines.latency_p99.quantile * 100)}"
    source = f"source: {profile.title}, sources.profile {profile.name}"
    if not sources.mirrored:
        where = "end to end at the gateway, cross-region reroutes included"
        if not latency_includes_reroute(spec):
            where = "at the gateway; the spec says its histogram leaves cross-region reroutes out"
        return [f"{source}; {quantile} measured {where}"]
    version = (
        f"; model_version is the snapshot registry's active version ({catalog.MODEL_ACTIVE_INFO})"
        if sources.version_from_registry()
        else ""
    )
    notes = [
        f"{source}, its own series read where they are, mapped onto the catalog's labels{version}"
    ]
    # What cannot be measured first: it changes how every latency number above is read.
    for capability, why in sorted(
        profile.missing.items(), key=lambda item: item[0] != "p99_including_reroute"
    ):
        what = (
            f"{quantile} including cross-region reroutes"
            if capability == "p99_including_reroute"
            else capability.replace("_", " ")
        )
        notes.append(f"not measured with {profile.name}: {what} — {why}")
    for signal in ("requests", "errors", "prompt_tokens", "generated_tokens"):
        found = sources.series(signal)
        if found is not None and found.note:
            notes.append(f"{signal.replace('_', ' ')} from {', '.join(found.names)}: {found.note}")
    return notes


def signal_defs(spec: Spec) -> list[SignalDef]:
    """The red lines, RPO targets and drift of the spec, in report order."""
    red, rpo = spec.red_lines, spec.rpo
    lat = red.latency_p99
    quantile = f"P{num(lat.quantile * 100)}"
    reroute = " incl. reroute" if latency_includes_reroute(spec) else ""
    return [
        SignalDef(
            "latency_p99",
            "red_line",
            f"{quantile} latency{reroute} ({lat.window})",
            f"{spec.sources.resolve().required_name('request_duration')}_bucket",
            lat.threshold_seconds,
            "s",
            True,
            Alert.RED_LINE_LATENCY_P99,
            f"{quantile} <= {num(lat.threshold_seconds)} s",
        ),
        SignalDef(
            "context_keepalive",
            "red_line",
            "Conversation context keep-alive",
            catalog.SESSION_CONTEXT_TTL_SECONDS.name,
            red.context_keepalive.min_seconds,
            "s",
            False,
            Alert.RED_LINE_CONTEXT_KEEPALIVE,
            f"context lives >= {num(red.context_keepalive.min_seconds)} s",
        ),
        SignalDef(
            "index_consistency",
            "red_line",
            "Vector index replica staleness",
            catalog.VECTORDB_INDEX_STALENESS_SECONDS.name,
            red.index_consistency.max_staleness_seconds,
            "s",
            True,
            Alert.RED_LINE_INDEX_STALENESS,
            f"staleness <= {num(red.index_consistency.max_staleness_seconds)} s",
        ),
        SignalDef(
            "rpo_lora_adapter",
            "rpo",
            "LoRA adapter checkpoints",
            catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS.name,
            rpo.lora_adapter.max_seconds,
            "s",
            True,
            Alert.LORA_CHECKPOINT_RPO_BREACH,
            f"RPO <= {num(rpo.lora_adapter.max_seconds)} s",
        ),
        SignalDef(
            "rpo_session_state",
            "rpo",
            "Session state (CDC)",
            catalog.SESSION_CDC_RPO_SECONDS.name,
            rpo.session_state.max_seconds,
            "s",
            True,
            Alert.SESSION_RPO_BREACH,
            f"RPO <= {num(rpo.session_state.max_seconds)} s",
        ),
        SignalDef(
            "rpo_embedding_index",
            "rpo",
            "Index delta log",
            catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS.name,
            rpo.embedding_index.max_seconds,
            "s",
            True,
            Alert.INDEX_DELTA_LOG_RPO_BREACH,
            f"RPO <= {num(rpo.embedding_index.max_seconds)} s",
        ),
        SignalDef(
            "drift",
            "drift",
            "Embedding drift",
            catalog.EMBEDDING_DRIFT_SCORE.name,
            spec.drift.threshold,
            "",
            True,
            Alert.EMBEDDING_DRIFT,
            f"{spec.drift.method} score <= calibrated threshold",
        ),
    ]
