"""Spot GPU preemption: the node state machine, the drain budget and triage, the streaming retry
contract and its request ledger, the notice sources, and the drain flow the agent and the
`spot_drain` playbook share.

The flow, for one node (a serving replica the gateway calls an upstream):

1. A notice arrives (AWS instance metadata, GCP metadata, or a manual trigger) - `sources`.
2. READY (or RECOVERED) -> DRAINING: admission to the node closes at once, the drain budget is

       budget = notice - detection delay - ingress removal - safety margin

   and every in-flight request is triaged: it continues when
   remaining tokens x time per output token <= continue_factor (0.85) x budget, and is aborted
   otherwise - `drain`. An aborted stream ends with an SSE error event (`SPOT_PREEMPTION`,
   recoverable when the request is retry-safe) instead of a cut connection - `resume`.
3. DRAINING -> TERMINATING once nothing is in flight on the node or its budget is spent.
4. TERMINATING -> RECOVERED when a replacement passes the readiness gate (health, model loaded,
   a dummy inference; `readiness`); admission opens again.

Modules: `errors`; `state` (node states, transitions, the node record, the notice); `drain`
(budget, triage); `resume` (headers, retry safety, resume payload, the SSE spot error); `ledger`
(the gateway's request ledger in Redis); `sources` (notice sources, metadata formats); `store`
(node records in Redis); `admin` (the gateways' `/admin/spot` API, and `AdminAuth`, the bearer-token
check of the gateway's and the agent's admin endpoints); `readiness` (the replacement's readiness
gate); `flow` (`SpotDrainFlow`: drain, wait drained, recover); `kubernetes_settings` (the
agent's `kubernetes:` block); `kubernetes` (taint the node, serving pods not ready through a
readiness gate); `replacement` (ask for a replacement at notice time: scale a Deployment, or a
cloud hook); `cluster` (`ClusterActions`: both, off the drain's path).
"""

from __future__ import annotations

from redline.platform.spot.admin import AdminAuth, AdminMode, AdminRefusal, GatewayAdmin
from redline.platform.spot.cluster import ClusterActions
from redline.platform.spot.drain import (
    DrainBudget,
    InflightView,
    TriageDecision,
    aborted_ratio,
    build_drain_budget,
    build_triage,
    scale_spot,
)
from redline.platform.spot.errors import (
    KubernetesConflictError,
    KubernetesError,
    SpotAgentError,
    SpotError,
    SpotStateError,
)
from redline.platform.spot.flow import SpotDrainFlow
from redline.platform.spot.kubernetes import (
    RBAC_RULES,
    SCALE_RBAC_RULES,
    KubernetesClient,
    NodeActions,
)
from redline.platform.spot.kubernetes_settings import (
    DEFAULT_CONDITION_TYPE,
    DEFAULT_TAINT_KEY,
    KubernetesSettings,
)
from redline.platform.spot.ledger import (
    CLAIM_NOT_FOUND,
    CLAIM_NOT_INTERRUPTED,
    CLAIM_NOT_RETRY_SAFE,
    DEFAULT_LEDGER_PREFIX,
    AsyncRequestLedger,
    LedgerEntry,
    LedgerError,
    LedgerStatus,
    RequestLedger,
)
from redline.platform.spot.readiness import INSTANCE_HEADER, ReadinessCheck, ReadinessGate
from redline.platform.spot.replacement import (
    KubernetesScaleUp,
    ReplacementError,
    ReplacementLog,
    ReplacementProvider,
    ReplacementRequest,
    ReplacementResult,
    ReplacementRunner,
    ReplacementSettings,
    WebhookReplacement,
    build_replacement_provider,
    build_replacement_request,
)
from redline.platform.spot.resume import (
    ATTEMPT_HEADER,
    REQUEST_ID_HEADER,
    RESUME_HEADER,
    RESUMED_HEADER,
    RETRY_SAFE_HEADER,
    SPOT_ERROR_TYPE,
    SpotErrorInfo,
    build_prompt_fingerprint,
    build_resume_payload,
    build_spot_error,
    is_retry_safe,
    parse_spot_error,
    render_sse_error,
    requested_max_tokens,
)
from redline.platform.spot.sources import (
    FLAVOR_HEADER,
    TOKEN_HEADER,
    TOKEN_TTL_HEADER,
    AwsImdsSource,
    GcpMetadataSource,
    ManualSource,
    NoticeSource,
    NoticeSourceError,
    NoticeWatcher,
    format_metadata_time,
    parse_instance_action,
    parse_metadata_time,
    parse_preempted,
    parse_rebalance,
)
from redline.platform.spot.state import (
    PROVIDERS,
    TRANSITIONS,
    Clock,
    NodeRecord,
    NodeState,
    Notice,
    build_transition,
)
from redline.platform.spot.store import DEFAULT_STATE_PREFIX, SpotStateStore

__all__ = [
    "ATTEMPT_HEADER",
    "AdminAuth",
    "AdminMode",
    "AdminRefusal",
    "AsyncRequestLedger",
    "AwsImdsSource",
    "CLAIM_NOT_FOUND",
    "CLAIM_NOT_INTERRUPTED",
    "CLAIM_NOT_RETRY_SAFE",
    "Clock",
    "ClusterActions",
    "DEFAULT_CONDITION_TYPE",
    "DEFAULT_LEDGER_PREFIX",
    "DEFAULT_STATE_PREFIX",
    "DEFAULT_TAINT_KEY",
    "DrainBudget",
    "FLAVOR_HEADER",
    "GatewayAdmin",
    "GcpMetadataSource",
    "INSTANCE_HEADER",
    "InflightView",
    "KubernetesClient",
    "KubernetesConflictError",
    "KubernetesError",
    "KubernetesScaleUp",
    "KubernetesSettings",
    "LedgerEntry",
    "LedgerError",
    "LedgerStatus",
    "ManualSource",
    "NodeActions",
    "NodeRecord",
    "NodeState",
    "Notice",
    "NoticeSource",
    "NoticeSourceError",
    "NoticeWatcher",
    "PROVIDERS",
    "RBAC_RULES",
    "REQUEST_ID_HEADER",
    "RESUMED_HEADER",
    "RESUME_HEADER",
    "RETRY_SAFE_HEADER",
    "ReadinessCheck",
    "ReadinessGate",
    "ReplacementError",
    "ReplacementLog",
    "ReplacementProvider",
    "ReplacementRequest",
    "ReplacementResult",
    "ReplacementRunner",
    "ReplacementSettings",
    "RequestLedger",
    "SCALE_RBAC_RULES",
    "SPOT_ERROR_TYPE",
    "SpotAgentError",
    "SpotDrainFlow",
    "SpotError",
    "SpotErrorInfo",
    "SpotStateError",
    "SpotStateStore",
    "TOKEN_HEADER",
    "TOKEN_TTL_HEADER",
    "TRANSITIONS",
    "TriageDecision",
    "WebhookReplacement",
    "aborted_ratio",
    "build_drain_budget",
    "build_prompt_fingerprint",
    "build_replacement_provider",
    "build_replacement_request",
    "build_resume_payload",
    "build_spot_error",
    "build_transition",
    "build_triage",
    "format_metadata_time",
    "is_retry_safe",
    "parse_instance_action",
    "parse_metadata_time",
    "parse_preempted",
    "parse_rebalance",
    "parse_spot_error",
    "render_sse_error",
    "requested_max_tokens",
    "scale_spot",
]
