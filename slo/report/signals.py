"""The spec's thresholded signals the report follows: red lines, RPO targets, embedding drift."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.report.text import num
from redline.slo.spec import Spec

SignalKind = Literal["red_line", "rpo", "drift", "saturation"]


@dataclass(frozen=True)
class SignalDef:
    """A thresholded signal of the spec: a red line, an RPO target, embedding drift, or an
    engine's saturation (a leading indicator of the latency red line)."""

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


def saturation_defs(spec: Spec) -> list[SignalDef]:
    """The engine's saturation signals with a line of their own (the warning's), where the
    spec's source has them: the P99 wait in the queue and the fullest KV cache."""
    lat = spec.red_lines.latency_p99
    warn = lat.saturation
    have = spec.sources.resolve().profile.saturation
    wait = warn.queue_time_share * lat.threshold_seconds
    alert = Alert.ENGINE_SATURATION_RISING
    defs = []
    if "queue_time" in have:
        defs.append(
            SignalDef(
                "engine_queue_time",
                "saturation",
                f"Engine P99 wait in the queue ({lat.window})",
                catalog.engine_queue_time_record(lat.window),
                wait,
                "s",
                True,
                alert,
                f"P99 wait <= {num(wait)} s ({num(warn.queue_time_share * 100)} % of the red line)",
            )
        )
    if "kv_cache" in have:
        defs.append(
            SignalDef(
                "engine_kv_cache",
                "saturation",
                "Fullest engine KV cache",
                catalog.ENGINE_KV_CACHE_RECORD,
                warn.kv_cache_usage,
                "",
                True,
                alert,
                f"KV cache < {num(warn.kv_cache_usage * 100)} % full (warns while preempting)",
            )
        )
    return defs


def signal_defs(spec: Spec) -> list[SignalDef]:
    """The red lines, RPO targets, drift and engine saturation of the spec, in report order."""
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
        *saturation_defs(spec),
    ]
