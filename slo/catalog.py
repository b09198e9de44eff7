"""The metric catalog: every series, label and recording-rule name redline emits or reads, once.

This module is the contract between the exporters, the gateway, the rules, the dashboards, the
reports and the tests. Code elsewhere never spells a series name as a string: it imports the
`Metric` from here, whose `str()` is the exposed name, so PromQL reads naturally::

    f"sum(rate({catalog.LLM_REQUESTS_TOTAL}[5m]))"

Names follow Prometheus conventions: base units (`_seconds`, `_ratio`, `_bytes`), counters end in
`_total`, info series in `_info`, label names are lowercase. prometheus_client wants a counter's
name without `_total` when it is declared: that is `Metric.family`.

`docs/architecture.md` prints this catalog as a table (`render_catalog_markdown`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram", "info"]

# Label names shared by many series.
LABEL_REGION = "region"
LABEL_SERVED_REGION = "served_region"
LABEL_REROUTED = "rerouted"
LABEL_MODEL = "model"
LABEL_MODEL_VERSION = "model_version"
LABEL_STATUS = "status"
LABEL_PROBE = "probe"
LABEL_COLLECTION = "collection"
LABEL_REPLICA = "replica"
LABEL_TARGET = "target"
LABEL_LEVEL = "level"
LABEL_NODE = "node"
LABEL_PROVIDER = "provider"
LABEL_PLAYBOOK = "playbook"
LABEL_OUTCOME = "outcome"
LABEL_SLO = "slo"
LABEL_SLI = "sli"
LABEL_SEVERITY = "severity"

REQUEST_LABELS = (
    LABEL_REGION,
    LABEL_SERVED_REGION,
    LABEL_REROUTED,
    LABEL_MODEL,
    LABEL_MODEL_VERSION,
    LABEL_STATUS,
)
TOKEN_LABELS = (LABEL_SERVED_REGION, LABEL_MODEL, LABEL_MODEL_VERSION)
VERSION_LABELS = (LABEL_MODEL, LABEL_MODEL_VERSION)


@dataclass(frozen=True)
class Metric:
    """One series family: its exposed name, type, help text and label names."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    """Fixed histogram buckets; empty when the spec chooses them (the latency histogram)."""

    def __str__(self) -> str:
        return self.name

    @property
    def family(self) -> str:
        """The name prometheus_client takes when the metric is declared (no `_total`/`_info`)."""
        for suffix in ("_total", "_info") if self.kind in ("counter", "info") else ():
            if self.name.endswith(suffix):
                return self.name.removesuffix(suffix)
        return self.name

    @property
    def bucket(self) -> str:
        """The histogram's `_bucket` series."""
        return self._histogram_series("_bucket")

    @property
    def count(self) -> str:
        """The histogram's `_count` series."""
        return self._histogram_series("_count")

    @property
    def sum(self) -> str:
        """The histogram's `_sum` series."""
        return self._histogram_series("_sum")

    def _histogram_series(self, suffix: str) -> str:
        if self.kind != "histogram":
            raise TypeError(f"{self.name} is a {self.kind}, not a histogram")
        return self.name + suffix


# --- requests at the gateway (P99 including reroute) ---------------------------------------
LLM_REQUEST_DURATION_SECONDS = Metric(
    "llm_request_duration_seconds",
    "histogram",
    "End-to-end latency at the gateway, reroutes included.",
    REQUEST_LABELS,
)
LLM_REQUESTS_TOTAL = Metric(
    "llm_requests_total", "counter", "Requests answered by the gateway.", REQUEST_LABELS
)
LLM_REQUEST_ERRORS_TOTAL = Metric(
    "llm_request_errors_total",
    "counter",
    "Requests that ended in an error (status >= 500 or a cut stream).",
    REQUEST_LABELS,
)
LLM_REROUTES_TOTAL = Metric(
    "llm_reroutes_total",
    "counter",
    "Requests moved from one region to the next, by reason.",
    ("from_region", "to_region", "reason"),
)
LLM_GENERATED_TOKENS_TOTAL = Metric(
    "llm_generated_tokens_total",
    "counter",
    "Completion tokens served (from usage, or counted in the stream).",
    TOKEN_LABELS,
)
LLM_PROMPT_TOKENS_TOTAL = Metric(
    "llm_prompt_tokens_total", "counter", "Prompt tokens served (from usage).", TOKEN_LABELS
)
LLM_TIME_TO_FIRST_TOKEN_SECONDS = Metric(
    "llm_time_to_first_token_seconds",
    "histogram",
    "Time from a streamed request's arrival to its first content token.",
    TOKEN_LABELS,
    (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.8, 1.0, 2.0, 5.0, 10.0),
)
LLM_GATEWAY_UPSTREAM_HEALTHY = Metric(
    "llm_gateway_upstream_healthy",
    "gauge",
    "1 unless the region failed repeatedly and is being tried last.",
    (LABEL_REGION,),
)
LLM_GATEWAY_BREAKER_STATE = Metric(
    "llm_gateway_breaker_state",
    "gauge",
    "1 for the current state of the region's circuit breaker (closed, open, half_open), 0 for "
    "the others.",
    (LABEL_REGION, "state"),
)
LLM_GATEWAY_BREAKER_TRANSITIONS_TOTAL = Metric(
    "llm_gateway_breaker_transitions_total",
    "counter",
    "Changes of the region's circuit breaker state, from one state to another.",
    (LABEL_REGION, "from", "to"),
)
LLM_GATEWAY_ROUTING_STORE_UP = Metric(
    "llm_gateway_routing_store_up",
    "gauge",
    "1 if the last read of the routing state from Redis succeeded.",
)
LLM_GATEWAY_NODE_DRAINING = Metric(
    "llm_gateway_node_draining",
    "gauge",
    "1 while this gateway holds a node's admission closed for a spot drain.",
    (LABEL_NODE,),
)

# --- quotas: semantic rate limiting by tokens and intent (design notes 4.2) -----------------
LABEL_TENANT = "tenant"
LABEL_INTENT = "intent"
QUOTA_LABELS = (LABEL_TENANT, LABEL_INTENT, LABEL_OUTCOME)
QUOTA_OUTCOMES = ("admitted", "throttled", "downgraded", "unlimited")
"""`outcome` of the quota series: drawn from a bucket, rejected (429), sent to the lighter
model, or matched by no limit."""
LLM_QUOTA_REQUESTS_TOTAL = Metric(
    "llm_quota_requests_total",
    "counter",
    "Requests checked against the token quotas, by tenant, intent and outcome.",
    QUOTA_LABELS,
)
LLM_QUOTA_TOKENS_TOTAL = Metric(
    "llm_quota_tokens_total",
    "counter",
    "Estimated tokens of the requests checked against the quotas, by outcome.",
    QUOTA_LABELS,
)
LLM_QUOTA_REFUNDED_TOKENS_TOTAL = Metric(
    "llm_quota_refunded_tokens_total",
    "counter",
    "Reserved tokens given back to the buckets when the real usage was below the estimate.",
    (LABEL_TENANT, LABEL_INTENT),
)
LLM_QUOTA_UTILISATION_RATIO = Metric(
    "llm_quota_utilisation_ratio",
    "gauge",
    "Share of the bucket's capacity in use after the last request (above 1: overdrawn by a "
    "long prompt's elastic factor).",
    (LABEL_TENANT, LABEL_INTENT),
)
LLM_QUOTA_STORE_FAILURES_TOTAL = Metric(
    "llm_quota_store_failures_total",
    "counter",
    "Quota checks Redis could not answer, by what the gateway did (fail_open, fail_closed).",
    ("action",),
)
LLM_TOKEN_ESTIMATE_ERROR_RATIO = Metric(
    "llm_token_estimate_error_ratio",
    "histogram",
    "(estimate - actual) / actual of a request's tokens, estimated before it ran, against the "
    "usage the upstream reported; `kind` prompt or total (prompt + completion).",
    (LABEL_INTENT, "kind"),
    (-0.75, -0.5, -0.25, -0.15, -0.08, -0.04, 0.0, 0.04, 0.08, 0.15, 0.25, 0.5, 1.0, 2.0),
)

# --- endpoint probes and accuracy ----------------------------------------------------------
LLM_PROBE_SUCCESS = Metric(
    "llm_probe_success",
    "gauge",
    "1 if the region's endpoint check (healthz, chat_dry_run) succeeded.",
    (LABEL_REGION, LABEL_PROBE),
)
LLM_PROBE_DURATION_SECONDS = Metric(
    "llm_probe_duration_seconds",
    "gauge",
    "Duration of the region's last endpoint check.",
    (LABEL_REGION, LABEL_PROBE),
)
LLM_EVAL_REQUESTS_TOTAL = Metric(
    "llm_eval_requests_total",
    "counter",
    "Golden prompts answered, by model and serving version.",
    VERSION_LABELS,
)
LLM_EVAL_CORRECT_TOTAL = Metric(
    "llm_eval_correct_total",
    "counter",
    "Golden prompts answered correctly, by model and serving version.",
    VERSION_LABELS,
)
LLM_CROSS_REGION_OUTPUT_AGREEMENT_RATIO = Metric(
    "llm_cross_region_output_agreement_ratio",
    "gauge",
    "Share of canary prompts whose normalised answer hash is the same on the primary and the "
    "region (temperature 0).",
    (LABEL_MODEL, LABEL_REGION),
)
LLM_CROSS_REGION_EMBEDDING_SIMILARITY = Metric(
    "llm_cross_region_embedding_similarity",
    "gauge",
    "Mean cosine similarity of the embeddings of the primary's and the region's answers to the "
    "canary prompts.",
    (LABEL_MODEL, LABEL_REGION),
)
LLM_CROSS_REGION_EMBEDDING_SIMILARITY_MIN = Metric(
    "llm_cross_region_embedding_similarity_min",
    "gauge",
    "Lowest cosine similarity of the primary's and the region's answers to one canary prompt.",
    (LABEL_MODEL, LABEL_REGION),
)

# --- output consistency over time (canary answers against the accepted ones) ---------------
MUTATION_LABELS = (LABEL_MODEL, LABEL_MODEL_VERSION, LABEL_REGION, "prompt")
LLM_OUTPUT_CONSISTENCY_CHANGES = Metric(
    "llm_output_consistency_changes",
    "gauge",
    "Tokens inserted or deleted (Myers diff, after normalisation) between a canary's last answer "
    "and its accepted answer; 0 when they agree.",
    MUTATION_LABELS,
)
LLM_OUTPUT_MUTATION_SCORE = Metric(
    "llm_output_mutation_score",
    "gauge",
    "Changed-token ratio of a canary's last answer against its accepted one, weighted towards "
    "short answers (0: same, 1: all changed).",
    MUTATION_LABELS,
)
LLM_OUTPUT_CONSISTENCY_DIFF_INFO = Metric(
    "llm_output_consistency_diff_info",
    "gauge",
    "1 while a canary's last answer differs from its accepted one; `diff` holds the normalised "
    "diff, truncated.",
    (*MUTATION_LABELS, "diff"),
)

# --- model versions, baselines, checkpoints ------------------------------------------------
MODEL_ACTIVE_INFO = Metric(
    "model_active_info",
    "gauge",
    "1 for the snapshot each model serves, with its version and file hashes.",
    (LABEL_MODEL, "version", "weights_hash", "config_hash"),
)
MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS = Metric(
    "model_checkpoint_last_success_timestamp_seconds",
    "gauge",
    "Unix time of the last successful checkpoint of a LoRA adapter.",
    ("adapter",),
)
MODEL_BASELINE_P99_SECONDS = Metric(
    "model_baseline_p99_seconds",
    "gauge",
    "P99 latency recorded when the model version was verified.",
    VERSION_LABELS,
)
MODEL_BASELINE_ACCURACY_RATIO = Metric(
    "model_baseline_accuracy_ratio",
    "gauge",
    "Golden-set accuracy recorded when the model version was verified.",
    VERSION_LABELS,
)

# --- encrypted weights on object storage (redline.exporters.weights) ------------------------
LABEL_KEYRING = "keyring"
LABEL_DEK_STATE = "state"
WEIGHTS_DEK_AGE_SECONDS = Metric(
    "llm_weights_dek_age_seconds",
    "gauge",
    "Age of a keyring's current DEK (absent when it has none).",
    (LABEL_KEYRING,),
)
WEIGHTS_DEK_ROTATION_SECONDS = Metric(
    "llm_weights_dek_rotation_seconds",
    "gauge",
    "A keyring's rotation period: its current DEK is rotated at this age.",
    (LABEL_KEYRING,),
)
WEIGHTS_DEK_SECONDS_TO_ROTATION = Metric(
    "llm_weights_dek_seconds_to_rotation",
    "gauge",
    "Seconds until a keyring's current DEK is due for rotation (0 when overdue).",
    (LABEL_KEYRING,),
)
WEIGHTS_DEK_VERSIONS = Metric(
    "llm_weights_dek_versions",
    "gauge",
    "DEK versions of a keyring by lifecycle state (current, retired, expired, revoked).",
    (LABEL_KEYRING, LABEL_DEK_STATE),
)
WEIGHTS_SHARDS_PAST_RETENTION = Metric(
    "llm_weights_shards_past_retention",
    "gauge",
    "Shards still encrypted under a DEK that is expired, revoked or missing: they no longer "
    "decrypt until re-encrypted.",
    (LABEL_KEYRING,),
)
WEIGHTS_SHARDS_FAILED_VERIFICATION = Metric(
    "llm_weights_shards_failed_verification",
    "gauge",
    "Problems the newest verification of a weights version found (0: it passed).",
    (LABEL_MODEL, LABEL_MODEL_VERSION),
)
WEIGHTS_VERIFIED_TIMESTAMP_SECONDS = Metric(
    "llm_weights_verified_timestamp_seconds",
    "gauge",
    "Unix time of the newest verification of a weights version.",
    (LABEL_MODEL, LABEL_MODEL_VERSION),
)
WEIGHTS_SYNC_LAG_SECONDS = Metric(
    "llm_weights_sync_lag_seconds",
    "gauge",
    "Age of the oldest version of a model's weights a region does not hold (0: it holds all).",
    (LABEL_MODEL, LABEL_REGION),
)
WEIGHTS_SYNC_SHARDS_MISSING = Metric(
    "llm_weights_sync_shards_missing",
    "gauge",
    "Shards of a model a region lacks or holds with another hash, per its sync table.",
    (LABEL_MODEL, LABEL_REGION),
)
WEIGHTS_SYNC_SHARDS_EXPECTED = Metric(
    "llm_weights_sync_shards_expected",
    "gauge",
    "Distinct shards of every stored version of a model: what each region should hold.",
    (LABEL_MODEL, LABEL_REGION),
)
WEIGHTS_SYNC_VERSIONS_MISSING = Metric(
    "llm_weights_sync_versions_missing",
    "gauge",
    "Versions of a model whose manifest has not reached a region.",
    (LABEL_MODEL, LABEL_REGION),
)
WEIGHTS_SYNC_LAST_TIMESTAMP_SECONDS = Metric(
    "llm_weights_sync_last_timestamp_seconds",
    "gauge",
    "Unix time of a region's last sync of a model (absent before the first).",
    (LABEL_MODEL, LABEL_REGION),
)

# --- vector index ---------------------------------------------------------------------------
VECTORDB_INDEX_STALENESS_SECONDS = Metric(
    "vectordb_index_staleness_seconds",
    "gauge",
    "Seconds between a canary's write on the primary and its visibility on the replica "
    "(now - written while not yet visible).",
    (LABEL_COLLECTION, LABEL_REPLICA),
)
VECTORDB_DELTA_LOG_PENDING_ENTRIES = Metric(
    "vectordb_delta_log_pending_entries",
    "gauge",
    "Delta-log entries after the replica's checkpoint.",
    (LABEL_COLLECTION, LABEL_REPLICA),
)
VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS = Metric(
    "vectordb_delta_log_oldest_pending_age_seconds",
    "gauge",
    "Age of the oldest delta-log entry after the replica's checkpoint (0 when none).",
    (LABEL_COLLECTION, LABEL_REPLICA),
)
VECTORDB_WRITE_FROZEN = Metric(
    "vectordb_write_frozen",
    "gauge",
    "1 while writes to the primary are frozen (they still land in the delta log).",
    (LABEL_COLLECTION,),
)
VECTORDB_DELTA_LOG_REPLAYED_TOTAL = Metric(
    "vectordb_delta_log_replayed_total",
    "counter",
    "Delta-log entries applied to the replica by replays.",
    (LABEL_COLLECTION, LABEL_REPLICA),
)
VECTORDB_DELTA_LOG_ENTRIES = Metric(
    "vectordb_delta_log_entries",
    "gauge",
    "Entries the delta log holds (XLEN; trimming keeps it bounded).",
    (LABEL_COLLECTION,),
)
VECTORDB_DELTA_LOG_MEMORY_BYTES = Metric(
    "vectordb_delta_log_memory_bytes",
    "gauge",
    "Redis memory of the delta log stream (MEMORY USAGE, sampled estimate).",
    (LABEL_COLLECTION,),
)
VECTORDB_ID_CONFLICTS_TOTAL = Metric(
    "vectordb_id_conflicts_total",
    "counter",
    "Vector ids written by two regions with different content, per resolution (records of the "
    "conflict map).",
    (LABEL_COLLECTION, "resolution"),
)
VECTORDB_INDEX_CONSISTENCY_LEVEL = Metric(
    "vectordb_index_consistency_level",
    "gauge",
    "1 for the default consistency level of each copy's Milvus collection (Strong, Session, "
    "Bounded, Eventually, Customized).",
    (LABEL_COLLECTION, LABEL_TARGET, LABEL_LEVEL),
)
VECTORDB_INDEX_CONSISTENCY_STALENESS_BOUND_SECONDS = Metric(
    "vectordb_index_consistency_staleness_bound_seconds",
    "gauge",
    "How stale a read at the collection's default consistency level may be: 0 for Strong, the "
    "servers' graceful time for Bounded, +Inf for Session, Eventually and Customized.",
    (LABEL_COLLECTION, LABEL_TARGET),
)

# --- sessions -------------------------------------------------------------------------------
SESSION_CDC_RPO_SECONDS = Metric(
    "session_cdc_rpo_seconds",
    "gauge",
    "Age of the oldest CDC entry the group has not ACKed (pending or undelivered).",
    ("stream", "group"),
)
SESSION_CONTEXT_TTL_SECONDS = Metric(
    "session_context_ttl_seconds",
    "gauge",
    "Effective TTL of recently written session keys (min of age + remaining TTL).",
)
SESSION_KEEPALIVE_PROBE_SUCCESS = Metric(
    "session_keepalive_probe_success",
    "gauge",
    "1 if the canary sessions checked last were alive on primary and replica after "
    "the keep-alive minimum.",
)
SESSION_CONTEXT_EVICTED_TOTAL = Metric(
    "session_context_evicted_total",
    "counter",
    "Session keys expired or evicted before the keep-alive minimum.",
)
SESSION_CRDT_DIVERGENT_SESSIONS = Metric(
    "session_crdt_divergent_sessions",
    "gauge",
    "CRDT sessions whose state digests differ between regions (changed within the probe's "
    "window, none in the last settle seconds).",
)
SESSION_CRDT_SYNC_LAG_SECONDS = Metric(
    "session_crdt_sync_lag_seconds",
    "gauge",
    "Age of the oldest CRDT session delta of the source region not yet merged into the target "
    "(the RPO of session sync; 0 when none).",
    ("source_region", "target_region"),
)
SESSION_CRDT_CONVERGENCE_SECONDS = Metric(
    "session_crdt_convergence_seconds",
    "gauge",
    "Duration of the last divergence between regions, from the first sample with divergent "
    "CRDT sessions to the first without (0 before any).",
)

# --- embedding drift ------------------------------------------------------------------------
EMBEDDING_DRIFT_SCORE = Metric(
    "embedding_drift_score",
    "gauge",
    "Drift score of the latest window of embeddings against the reference.",
    (LABEL_COLLECTION, "method"),
)
EMBEDDING_DRIFT_THRESHOLD = Metric(
    "embedding_drift_threshold",
    "gauge",
    "Threshold of the drift score, calibrated on the reference (bounded false-positive rate).",
    (LABEL_COLLECTION, "method"),
)
EMBEDDING_DRIFT_WINDOW_SAMPLES = Metric(
    "embedding_drift_window_samples",
    "gauge",
    "Valid vectors scored in the latest window (valid vectors seen when too few to score).",
    (LABEL_COLLECTION,),
)
EMBEDDING_DRIFT_INVALID_VECTORS_TOTAL = Metric(
    "embedding_drift_invalid_vectors_total",
    "counter",
    "Window vectors skipped at each evaluation: wrong dimension, NaN/inf, undecodable.",
    (LABEL_COLLECTION, "reason"),
)

# --- spot preemption ------------------------------------------------------------------------
LLM_SPOT_NOTICE_TO_DRAINING_SECONDS = Metric(
    "llm_spot_notice_to_draining_seconds",
    "histogram",
    "Seconds from a spot interruption notice to DRAINING (admission closed, triage done).",
    (LABEL_NODE, LABEL_PROVIDER),
    (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0),
)
LLM_SPOT_NOTICES_TOTAL = Metric(
    "llm_spot_notices_total",
    "counter",
    "Spot notices seen, by kind (interruption, rebalance).",
    (LABEL_NODE, LABEL_PROVIDER, "kind"),
)
LLM_SPOT_AGENT_ERRORS_TOTAL = Metric(
    "llm_spot_agent_errors_total",
    "counter",
    "Failures of the agent's sources or flow steps.",
    (LABEL_NODE,),
)
LLM_NODE_STATE = Metric(
    "llm_node_state", "gauge", "1 for the spot node's current state.", (LABEL_NODE, "state")
)
LLM_SPOT_REPLACEMENT_READY_LATENCY_SECONDS = Metric(
    "llm_spot_replacement_ready_latency_seconds",
    "gauge",
    "Node gone (TERMINATING, or its termination time if later) -> RECOVERED of the last "
    "replacement; while it is not ready yet, the seconds waited so far.",
    (LABEL_NODE, LABEL_PROVIDER),
)
LLM_SPOT_DRAIN_BUDGET_SECONDS = Metric(
    "llm_spot_drain_budget_seconds",
    "gauge",
    "Drain budget of the node's last preemption.",
    (LABEL_NODE,),
)
LLM_SPOT_NOTICE_PENDING = Metric(
    "llm_spot_notice_pending",
    "gauge",
    "1 while the node has an interruption notice that no drain has handled yet.",
    (LABEL_NODE, LABEL_PROVIDER),
)
LLM_SPOT_REPLACEMENT_REQUESTS_TOTAL = Metric(
    "llm_spot_replacement_requests_total",
    "counter",
    "Replacement requests the agent made at notice time, by how (via: kubernetes, webhook) and "
    "outcome (requested, unchanged, duplicate, failed).",
    (LABEL_NODE, "via", LABEL_OUTCOME),
)
LLM_SPOT_INFLIGHT_ABORTED_RATIO = Metric(
    "llm_spot_inflight_aborted_ratio",
    "gauge",
    "Share of the requests in flight on a node that its last drain aborted.",
    (LABEL_NODE,),
)
LLM_SPOT_WASTED_DECODE_TOKENS_TOTAL = Metric(
    "llm_spot_wasted_decode_tokens_total",
    "counter",
    "Decoded tokens thrown away by spot preemptions (never served, or served and then "
    "regenerated), by reason.",
    (LABEL_NODE, "reason"),
)
LLM_SPOT_TRIAGED_REQUESTS_TOTAL = Metric(
    "llm_spot_triaged_requests_total",
    "counter",
    "In-flight requests triaged by a drain, by decision (continue, abort).",
    (LABEL_NODE, "decision"),
)
LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL = Metric(
    "llm_spot_interrupted_requests_total",
    "counter",
    "Requests a preemption interrupted, by whether the client can recover them.",
    (LABEL_NODE, "recoverable"),
)
LLM_SPOT_RETRIES_TOTAL = Metric(
    "llm_spot_retries_total",
    "counter",
    "Retries of interrupted requests: resumed after the prefix, regenerated, refused.",
    (LABEL_OUTCOME,),
)

# --- GPU node failure ----------------------------------------------------------------------
LABEL_RECOVERY_MODE = "mode"
RECOVERY_WARM = "warm"
"""The replacement passed the readiness gate at its first check: it was already loaded."""
RECOVERY_COLD = "cold"
"""The gate passed only after waiting: the replacement was (re)built and loaded meanwhile."""
RECOVERY_MODES = (RECOVERY_COLD, RECOVERY_WARM)
LLM_NODE_FAILURE_RECOVERY_SECONDS = Metric(
    "llm_node_failure_recovery_seconds",
    "histogram",
    "Seconds from a failed GPU node's drain (its synthetic notice) to its replacement passing "
    "the readiness gate, by mode (warm: already loaded; cold: rebuilt while the gate waited).",
    (LABEL_RECOVERY_MODE,),
    # A warm replacement answers the gate's first check, so its recovery is the drain itself:
    # sub-second (the design notes measured hot rescheduling at 180 ms), hence 0.1 and 0.25. A
    # cold one is a pod rebuild: scheduling, image pull and loading weights, tens of seconds
    # (42 s in the notes) to minutes for a large model; past 10 min the readiness gate has long
    # escalated, so +Inf is enough there.
    (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0),
)

# --- redline's own probes, receiver, audit and reports --------------------------------------
REDLINE_PROBE_SUCCESS = Metric(
    "redline_probe_success", "gauge", "1 if the probe's last run succeeded.", (LABEL_PROBE,)
)
REDLINE_PROBE_DURATION_SECONDS = Metric(
    "redline_probe_duration_seconds", "gauge", "Duration of the probe's last run.", (LABEL_PROBE,)
)
REDLINE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS = Metric(
    "redline_probe_last_success_timestamp_seconds",
    "gauge",
    "Unix time of the probe's last successful run.",
    (LABEL_PROBE,),
)
PROBE_SESSION_CRDT = "session_crdt"
"""The `probe` label of the CRDT session probe (its guard tells a failing probe from none)."""
REDLINE_EXPORTER_CANARY_LEASE_HELD = Metric(
    "redline_exporter_canary_lease_held",
    "gauge",
    "1 while this exporter replica holds the canary lease and runs the probes that write "
    "canaries, 0 while another replica does.",
)
REDLINE_WEBHOOK_ALERTS_TOTAL = Metric(
    "redline_webhook_alerts_total",
    "counter",
    "Alerts received in valid webhook deliveries, by alert status.",
    (LABEL_STATUS,),
)
REDLINE_WEBHOOK_DUPLICATES_TOTAL = Metric(
    "redline_webhook_duplicates_total",
    "counter",
    "Alerts already recorded (HA peers, retries, repeats): acknowledged, nothing run.",
)
REDLINE_REMEDIATION_RUNS_TOTAL = Metric(
    "redline_remediation_runs_total",
    "counter",
    "Playbook runs by final outcome (succeeded, failed, dry_run, shadow), retry, or skip "
    "(off, paused, over_budget, breaker_open).",
    (LABEL_PLAYBOOK, LABEL_OUTCOME),
)
REDLINE_REMEDIATION_DURATION_SECONDS = Metric(
    "redline_remediation_duration_seconds",
    "histogram",
    "Duration of playbook runs (one attempt each).",
    (LABEL_PLAYBOOK,),
)
REDLINE_REMEDIATION_BREAKER_OPEN = Metric(
    "redline_remediation_breaker_open",
    "gauge",
    "1 while the playbook's breaker is open (it stopped acting after consecutive failures).",
    (LABEL_PLAYBOOK,),
)
REDLINE_REMEDIATION_PAUSED = Metric(
    "redline_remediation_paused",
    "gauge",
    "1 while a human has paused the playbook (redline remediation pause).",
    (LABEL_PLAYBOOK,),
)
REDLINE_REMEDIATION_MODE = Metric(
    "redline_remediation_mode",
    "gauge",
    "1 for the playbook's configured mode (act, shadow, off).",
    (LABEL_PLAYBOOK, "mode"),
)

# Label values of the remediation series: the receiver's metrics write them, the SLO report
# and the dashboards read them.
MODE_ACT = "act"
MODE_SHADOW = "shadow"
MODE_OFF = "off"
REMEDIATION_MODES = (MODE_ACT, MODE_SHADOW, MODE_OFF)
"""`mode` of `redline_remediation_mode`: the spec's `PlaybookMode`."""
OUTCOME_SUCCEEDED = "succeeded"
OUTCOME_FAILED = "failed"
OUTCOME_SHADOW = MODE_SHADOW
OUTCOME_DRY_RUN = "dry_run"
OUTCOME_RETRY = "retry"
"""An attempt that will be retried, not the end of a run."""
ACTED_OUTCOMES = (OUTCOME_SUCCEEDED, OUTCOME_FAILED)
"""A run that acted (mode act) and ended."""
SKIP_OUTCOMES = (MODE_OFF, "paused", "over_budget", "breaker_open")
"""A run the guard rails skipped (`redline.remediation.guards.SkipOutcome`): its playbook off,
paused, over its budget, or its breaker open."""
RUN_OUTCOMES = (*ACTED_OUTCOMES, OUTCOME_SHADOW, *SKIP_OUTCOMES, OUTCOME_DRY_RUN)
"""Every final `outcome` of `redline_remediation_runs_total` (a retry is not final)."""
REDLINE_REMEDIATION_JOBS_OVERDUE = Metric(
    "redline_remediation_jobs_overdue",
    "gauge",
    "Unfinished jobs (queued, running, waiting, retrying) older than their playbook's deadline.",
    (LABEL_PLAYBOOK,),
)
REDLINE_REMEDIATION_OLDEST_JOB_AGE_SECONDS = Metric(
    "redline_remediation_oldest_job_age_seconds",
    "gauge",
    "Age of the playbook's oldest unfinished job (0 when none).",
    (LABEL_PLAYBOOK,),
)
REDLINE_AUDIT_CHAIN_INTACT = Metric(
    "redline_audit_chain_intact",
    "gauge",
    "1 when the copy of the audit trail verifies (hashes, order, head), 0 when it does not.",
    ("copy",),
)
REDLINE_AUDIT_RECORDS = Metric(
    "redline_audit_records", "gauge", "Records in the copy of the audit trail.", ("copy",)
)
REDLINE_AUDIT_VERIFIED_TIMESTAMP_SECONDS = Metric(
    "redline_audit_verified_timestamp_seconds",
    "gauge",
    "When the audit trail was last verified (Unix time).",
)
REDLINE_REPORT_RUNS_TOTAL = Metric(
    "redline_report_runs_total",
    "counter",
    "Scheduled report runs by outcome (success, failure, skipped: tick already taken).",
    ("schedule", LABEL_OUTCOME),
)
REDLINE_REPORT_LAST_SUCCESS_TIMESTAMP_SECONDS = Metric(
    "redline_report_last_success_timestamp_seconds",
    "gauge",
    "When the last scheduled report was published.",
    ("schedule",),
)

METRICS: tuple[Metric, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Metric)
)
"""Every series family redline emits, in the order above."""

_BY_NAME = {metric.name: metric for metric in METRICS}


def by_name(name: str) -> Metric:
    """The catalog entry of an exposed series name; KeyError naming the known ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in the metric catalog") from None


def series_names() -> frozenset[str]:
    """Every name a query may read: families, histogram parts and declared family names, and
    the other exporters' series the rules read (`EXTERNAL_METRICS`)."""
    names: set[str] = set()
    for metric in METRICS:
        names.update({metric.name, metric.family})
        if metric.kind == "histogram":
            names.update({metric.bucket, metric.count, metric.sum})
    names.update(metric.name for metric in EXTERNAL_METRICS)
    return frozenset(names)


# --- series of other exporters the rules read -------------------------------------------------
# redline emits none of these: they are the exporters' own names (dcgm-exporter's are DCGM
# field names, upper case), so they stay out of `METRICS` and its naming rules; the rules and
# tests still spell them only here.


@dataclass(frozen=True)
class ExternalMetric:
    """A series another exporter publishes and the rules read, as that exporter documents it."""

    name: str
    kind: Kind
    help: str
    """The exporter's own help text."""
    labels: tuple[str, ...]
    exporter: str
    source: str
    """Where the name, type and labels are documented (repository, path and commit)."""
    default: bool = True
    """False when the exporter publishes it only once configured to (a commented CSV row)."""

    def __str__(self) -> str:
        return self.name


DCGM_EXPORTER = "dcgm-exporter"
KUBE_STATE_METRICS = "kube-state-metrics"

# dcgm-exporter writes every GPU series with these labels (pkg/dcgmexporter/render_metrics.go,
# NVIDIA/dcgm-exporter@1b646e10ea4fa85e6a529915c1c466dd3a587a1e): `Hostname` is the node's name
# (NODE_NAME, which the Helm chart sets from spec.nodeName: deployment/templates/daemonset.yaml
# @9190a38a21ee390f187dae6f3e1418bd6c9da38e; else the host name: pkg/dcgmexporter/hostname.go
# @132c7b6d467228cfdd794c3a8f981c8e2c527b45), and, in Kubernetes, `pod`, `namespace` and
# `container` of the pod holding the GPU (pkg/dcgmexporter/kubernetes.go
# @049c5970f3127987a3ae8e6ef9c53a570a306eff).
DCGM_LABEL_GPU = "gpu"
DCGM_LABEL_UUID = "UUID"
DCGM_LABEL_DEVICE = "device"
DCGM_LABEL_MODEL = "modelName"
DCGM_LABEL_HOSTNAME = "Hostname"
DCGM_LABELS = (
    DCGM_LABEL_GPU,
    DCGM_LABEL_UUID,
    DCGM_LABEL_DEVICE,
    DCGM_LABEL_MODEL,
    DCGM_LABEL_HOSTNAME,
    "pod",
    "namespace",
    "container",
)
_DCGM_CSV = "NVIDIA/dcgm-exporter etc/default-counters.csv@b54068a9feef589e07fc36c22642ad4bb61f6420"
_DCGM_FIELDS = "NVIDIA/DCGM testing/python3/dcgm_fields.py@28bfbd4c97413d4aec249cdd9543a67d24f95b78"

DCGM_FI_DEV_XID_ERRORS = ExternalMetric(
    "DCGM_FI_DEV_XID_ERRORS",
    "gauge",
    "Value of the last XID error encountered.",
    DCGM_LABELS,
    DCGM_EXPORTER,
    _DCGM_CSV,
)
"""The LAST XID's number, not a count: it keeps that value until the GPU reports another one."""
DCGM_FI_DEV_GPU_TEMP = ExternalMetric(
    "DCGM_FI_DEV_GPU_TEMP",
    "gauge",
    "GPU temperature (in C).",
    DCGM_LABELS,
    DCGM_EXPORTER,
    _DCGM_CSV,
)
DCGM_FI_DEV_ROW_REMAP_FAILURE = ExternalMetric(
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "gauge",
    "Whether remapping of rows has failed",
    DCGM_LABELS,
    DCGM_EXPORTER,
    _DCGM_CSV,
)
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS = ExternalMetric(
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "counter",
    "Number of remapped rows for uncorrectable errors",
    DCGM_LABELS,
    DCGM_EXPORTER,
    _DCGM_CSV,
)
DCGM_FI_DEV_ROW_REMAP_PENDING = ExternalMetric(
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "gauge",
    "Whether remapping of rows is pending",
    DCGM_LABELS,
    DCGM_EXPORTER,
    f"DCGM field 396, {_DCGM_FIELDS}; not a row of {_DCGM_CSV}",
    default=False,
)
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL = ExternalMetric(
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "counter",
    "Total number of double-bit volatile ECC errors.",
    DCGM_LABELS,
    DCGM_EXPORTER,
    f"{_DCGM_CSV} (commented out)",
    default=False,
)
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = ExternalMetric(
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "counter",
    "Total number of NVLink flow-control CRC errors.",
    DCGM_LABELS,
    DCGM_EXPORTER,
    f"{_DCGM_CSV} (commented out)",
    default=False,
)
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = ExternalMetric(
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "counter",
    "Total number of NVLink data CRC errors.",
    DCGM_LABELS,
    DCGM_EXPORTER,
    f"{_DCGM_CSV} (commented out)",
    default=False,
)
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = ExternalMetric(
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "counter",
    "Total number of NVLink retries.",
    DCGM_LABELS,
    DCGM_EXPORTER,
    f"{_DCGM_CSV} (commented out)",
    default=False,
)
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = ExternalMetric(
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "counter",
    "Total number of NVLink recovery errors.",
    DCGM_LABELS,
    DCGM_EXPORTER,
    f"{_DCGM_CSV} (commented out)",
    default=False,
)

_KSM_NODE = (
    "kubernetes/kube-state-metrics docs/metrics/cluster/node-metrics.md"
    "@ca300481f1e10353a574b034fde4dc60115d56eb"
)
_KSM_POD = (
    "kubernetes/kube-state-metrics docs/metrics/workload/pod-metrics.md"
    "@96a6db87daf503d8a9492dbfc9746f45512e5099"
)
KUBE_NODE_STATUS_CONDITION = ExternalMetric(
    "kube_node_status_condition",
    "gauge",
    "The condition of a cluster node.",
    (LABEL_NODE, "condition", "status"),
    KUBE_STATE_METRICS,
    _KSM_NODE,
)
"""One series per condition and status (`true`, `false`, `unknown`), 1 for the current one."""
KUBE_NODE_STATUS_CAPACITY = ExternalMetric(
    "kube_node_status_capacity",
    "gauge",
    "The capacity for different resources of a node.",
    (LABEL_NODE, "resource", "unit"),
    KUBE_STATE_METRICS,
    _KSM_NODE,
)
"""`resource` is the resource name with every character outside [a-zA-Z0-9_] made `_`
(`nvidia.com/gpu` -> `nvidia_com_gpu`: internal/store/node.go, sanitizeLabelName,
kubernetes/kube-state-metrics@fad488c1ccc39e6a84d584eb45a0fc0d426b308e)."""
KUBE_POD_INFO = ExternalMetric(
    "kube_pod_info",
    "gauge",
    "Information about pod.",
    (
        "namespace",
        "pod",
        "uid",
        LABEL_NODE,
        "host_ip",
        "pod_ip",
        "created_by_kind",
        "created_by_name",
        "priority_class",
        "host_network",
    ),
    KUBE_STATE_METRICS,
    _KSM_POD,
)
"""`node` is the pod's spec.nodeName: empty until the scheduler binds it."""
KUBE_POD_STATUS_PHASE = ExternalMetric(
    "kube_pod_status_phase",
    "gauge",
    "The pods current phase.",
    ("namespace", "pod", "uid", "phase"),
    KUBE_STATE_METRICS,
    _KSM_POD,
)
KUBE_POD_CONTAINER_STATUS_RESTARTS_TOTAL = ExternalMetric(
    "kube_pod_container_status_restarts_total",
    "counter",
    "The number of container restarts per container",
    ("namespace", "pod", "uid", "container"),
    KUBE_STATE_METRICS,
    _KSM_POD,
)

EXTERNAL_METRICS: tuple[ExternalMetric, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, ExternalMetric)
)
"""Every other exporter's series the rules read, in the order above."""


# --- recording rules (`level:metric:operations`) --------------------------------------------
RECORD_PREFIX = "redline:"
SLO_OBJECTIVE_RECORD = "redline:slo_objective:ratio"
SLO_ERROR_BUDGET_REMAINING_RECORD = "redline:slo_error_budget:remaining_ratio"


MODEL_ACTIVE_VERSION_RECORD = "redline:model_active_version:info"
"""`model_active_info` reduced to one series per model (its active version, `unknown` without
one): the join key that stamps an engine's aggregated series with the registry's version."""


def tokens_rate_record(kind: Literal["generated", "prompt"], window: str) -> str:
    """Tokens per second by (served_region, model, model_version), e.g.
    `redline:llm_generated_tokens:rate5m`."""
    return f"redline:llm_{kind}_tokens:rate{window}"


def eval_verdicts_record(window: str) -> str:
    """Accuracy verdicts (golden and online) per model version over `window`."""
    return f"redline:llm_eval_requests:increase{window}"


def accuracy_upper_bound_record(window: str) -> str:
    """The Wilson score upper bound of accuracy per model version over `window` (one-sided, at
    the spec's `rollback.confidence`): the accuracy leg fires only when even this is too low."""
    return f"redline:llm_eval_accuracy:wilson_upper_ratio_{window}"


def slo_events_record(window: str) -> str:
    """Events of every SLO (label `slo`) over `window`: the burn-rate alerts' traffic guard."""
    return f"redline:slo_events:increase{window}"


def quantile_record(base: str, quantile_label: str, window: str) -> str:
    """Per-region latency quantile of the histogram `base`, e.g. `redline:<base>:p99_5m`."""
    return f"redline:{base}:p{quantile_label}_{window}"


def window_requests_record(base: str, window: str) -> str:
    """Requests per region (the histogram's `_count` increase) over the red line's window."""
    return f"redline:{base}_count:increase_{window}"


def window_slow_requests_record(base: str, window: str) -> str:
    """Requests per region slower than the red line's threshold over its window."""
    return f"redline:{base}_count:slow_increase_{window}"


def p99_by_version_record(base: str, window: str) -> str:
    """P99 of the histogram `base` per model version over the rollback window."""
    return f"redline:{base}:p99_by_version_{window}"


def requests_by_version_record(base: str, window: str) -> str:
    """Requests per model version (the histogram's `_count` increase) over `window`."""
    return f"redline:{base}_count:increase_by_version_{window}"


def accuracy_record(window: str) -> str:
    """Golden-set accuracy per model version over `window`."""
    return f"redline:llm_eval_accuracy:ratio_{window}"


def slo_errors_record(window: str) -> str:
    """Share of bad events of every SLO (label `slo`) over `window`."""
    return f"redline:slo_errors:ratio_rate{window}"


def spot_notice_to_draining_record(window: str) -> str:
    """P95 of notice -> DRAINING over `window`."""
    return f"redline:{LLM_SPOT_NOTICE_TO_DRAINING_SECONDS}:p95_{window}"


ENGINE_QUEUE_RECORD = "redline:engine_queue:sum"
"""Requests waiting in the engines of each region (the profile's queue gauge, summed)."""
ENGINE_RUNNING_RECORD = "redline:engine_running:sum"
"""Requests running (in the batch) in the engines of each region."""
ENGINE_KV_CACHE_RECORD = "redline:engine_kv_cache_usage:max"
"""The fullest KV cache (0-1) of each region's engines."""


def engine_queue_time_record(window: str) -> str:
    """P99 of the time requests waited in the engine's queue, by region, over `window`."""
    return f"redline:engine_queue_time_seconds:p99_{window}"


def engine_preemptions_record(window: str) -> str:
    """Preemptions (vLLM) or retractions (SGLang) per second by region over `window`."""
    return f"redline:engine_preemptions:rate{window}"


GPU_XID_LAST_RECORD = "redline:gpu_xid:last"
"""dcgm-exporter's last XID per GPU (node, gpu, UUID, modelName), the node taken from the spec's
`gpu.dcgm_node_label`: one series per GPU whatever pod holds it."""
GPU_XID_DRAIN_RECORD = "redline:gpu_xid:drain"
"""`GPU_XID_LAST_RECORD` where it is a drain-now XID (`gpu.drain_xids`); absent otherwise."""
GPU_NODE_CAPACITY_RECORD = "redline:gpu_node:capacity"
"""GPUs each node offers (kube-state-metrics' capacity of `gpu.resource`), by `node`."""
GPU_NODE_POD_RECORD = "redline:gpu_node_pod:info"
"""1 per pod bound to a node with GPU capacity, by (namespace, pod, node)."""


def render_catalog_markdown() -> str:
    """The catalog as a Markdown table (series, type, labels, meaning) for docs/architecture.md."""
    lines = ["| series | type | labels | meaning |", "|---|---|---|---|"]
    for metric in METRICS:
        labels = ", ".join(f"`{label}`" for label in metric.labels) or "–"
        lines.append(f"| `{metric.name}` | {metric.kind} | {labels} | {metric.help} |")
    return "\n".join(lines) + "\n"


def render_external_markdown() -> str:
    """The other exporters' series the rules read, as a Markdown table for docs/architecture.md."""
    lines = [
        "| series | exporter | type | labels | meaning | published by default |",
        "|---|---|---|---|---|---|",
    ]
    for metric in EXTERNAL_METRICS:
        labels = ", ".join(f"`{label}`" for label in metric.labels)
        default = "yes" if metric.default else "no: enable it in the exporter"
        lines.append(
            f"| `{metric.name}` | {metric.exporter} | {metric.kind} | {labels} | {metric.help} | "
            f"{default} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    # `--external`: the other exporters' series (the second table of docs/architecture.md).
    external = "--external" in sys.argv[1:]
    print(render_external_markdown() if external else render_catalog_markdown(), end="")
