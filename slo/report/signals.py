"""The spec's thresholded signals the report follows: red lines, RPO targets, embedding drift."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from redline.slo import catalog
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


def signal_defs(spec: Spec) -> list[SignalDef]:
    """The red lines, RPO targets and drift of the spec, in report order."""
    red, rpo = spec.red_lines, spec.rpo
    lat = red.latency_p99
    quantile = f"P{num(lat.quantile * 100)}"
    reroute = " incl. reroute" if lat.includes_reroute else ""
    return [
        SignalDef(
            "latency_p99",
            "red_line",
            f"{quantile} latency{reroute} ({lat.window})",
            f"{spec.sources.resolve().required_name('request_duration')}_bucket",
            lat.threshold_seconds,
            "s",
            True,
            "RedLineLatencyP99",
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
            "RedLineContextKeepalive",
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
            "RedLineIndexStaleness",
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
            "LoRACheckpointRPOBreach",
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
            "SessionRPOBreach",
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
            "IndexDeltaLogRPOBreach",
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
            "EmbeddingDrift",
            f"{spec.drift.method} score <= calibrated threshold",
        ),
    ]
