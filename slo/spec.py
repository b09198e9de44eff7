"""The redline spec (`version: v1`): one validated, frozen model of every target and threshold."""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from redline.slo import alerts
from redline.slo.sources import (
    ProfileName,
    ResolvedSources,
    SignalName,
    SourceProfileError,
    SourceSeries,
    resolve_sources,
)

PLAYBOOK_NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
"""What a playbook's name looks like (the registry enforces the same)."""

PLAYBOOK_NAMES: tuple[str, ...] = (
    "semantic_rollback",
    "freeze_writes",
    "delta_log_replay",
    "freeze_and_replay",
    "reroute",
    "spot_drain",
    "rollback_candidate",
    "gpu_node_failure",
    "weights_resync",
    "weights_rotate",
)
"""The built-in playbooks' names. The playbook classes (`redline.remediation.catalog`) are the
list; this copy exists for what must not import them: the pure layers (the remediation dashboard
takes the shortest deadline over these, its sample data has series for each) and `redline
validate` (the classes pull in pymilvus). `tests/unit/remediation/test_registry.py` proves it
names exactly the built-in classes."""

KNOWN_PLAYBOOKS_CONTEXT = "playbooks"
"""The validation-context key holding the playbooks a spec may name (`load_spec(playbooks=)`)."""


def _known_playbook(value: str, info: ValidationInfo) -> str:
    # The model layer cannot know the playbook classes (a deployment adds its own), so a name
    # is checked only when the caller passes the registry's names: `redline validate` and the
    # remediation start-up check do.
    known = (info.context or {}).get(KNOWN_PLAYBOOKS_CONTEXT)
    if known is not None and value not in known:
        raise ValueError(
            f"Input should be a known playbook, not {value!r}; known: "
            + ", ".join(repr(name) for name in sorted(known))
        )
    return value


PlaybookName = Annotated[
    str,
    Field(pattern=PLAYBOOK_NAME_PATTERN, description="A playbook's name (`Playbook.name`)."),
    AfterValidator(_known_playbook),
]
"""A playbook's name: any well-formed name here; checked against the registry where it is known."""

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w)$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus-style single-unit duration such as `30d` or `5m`."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 30s, 5m, 1h, 30d")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Duration = Annotated[str, Field(pattern=_DURATION.pattern, description="e.g. 5m, 1h, 30d")]
MetricName = Annotated[str, Field(pattern=_METRIC_NAME.pattern)]


class RestorePolicy(_Model):
    """When a rerouted region gets its traffic back: healthy by the red line, with hysteresis."""

    below_ratio: float = Field(
        0.8,
        gt=0,
        le=1,
        description="The region's measured latency must stay under this x threshold_seconds...",
    )
    for_seconds: float = Field(
        120, ge=0, description="...without a break for this long before the routing is restored."
    )


GroupLabel = Literal["model", "model_version", "region", "served_region"]
"""Labels an SLO can be grouped by: those every request series carries, whatever the source
(`status` and `rerouted` describe a request, not who it is for; request series carry no tenant:
a tenant per request series would multiply the latency histogram's buckets by the tenants)."""
GROUP_LABELS: tuple[str, ...] = get_args(GroupLabel)
RedLineGroupLabel = Literal["model", "model_version"]
"""Labels the latency red line can be grouped by besides its region."""


def distinct_labels(value: tuple[str, ...]) -> tuple[str, ...]:
    """`value` unchanged; ValueError when it names a label twice."""
    repeated = sorted({label for label in value if value.count(label) > 1})
    if repeated:
        raise ValueError(f"group_by names {', '.join(repeated)} more than once")
    return value


GroupBy = Annotated[tuple[GroupLabel, ...], AfterValidator(distinct_labels)]
RedLineGroupBy = Annotated[tuple[RedLineGroupLabel, ...], AfterValidator(distinct_labels)]


class SaturationWarning(_Model):
    """The engine's saturation as a leading indicator of a latency breach (engine profiles
    only: redline's gateway sees no engine queue)."""

    window: Duration = Field(
        "2m",
        description="The queue must hold requests at every sample of this window and still "
        "grow: arrivals outpace the engine, so waiting (and latency) grows without bound.",
    )
    queue_time_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Or the P99 time spent waiting exceeds this share of the latency red line.",
    )
    kv_cache_usage: float = Field(
        0.95,
        gt=0,
        le=1,
        description="Or the KV cache is this full while the engine preempts (recomputes) requests.",
    )


class LatencyRedLine(_Model):
    """End-to-end P99 latency measured at the gateway, including cross-region reroutes."""

    threshold_seconds: PositiveFloat = Field(0.8, description="P99 must stay at or under this.")
    quantile: float = Field(0.99, gt=0, lt=1, description="The quantile held to the threshold.")
    window: Duration = Field("5m", description="Rate window of the quantile.")
    includes_reroute: bool = Field(
        True, description="The histogram is recorded end to end at the gateway, reroutes included."
    )
    for_seconds: int = Field(60, ge=0, description="How long the breach must last before firing.")
    min_requests: int = Field(
        100,
        ge=0,
        description="The P99 red line acts only on a window holding at least this many requests "
        "(per region): over fewer than 100 the P99 is the slowest request itself, and one slow "
        "request must not reroute a region (0 turns the guard off).",
    )
    slow_requests_page: int = Field(
        5,
        ge=0,
        description="Under `min_requests`, page a human (no playbook) when at least this many "
        "requests of the window were slower than the threshold (0: never).",
    )
    group_by: RedLineGroupBy = Field(
        (),
        description="One red line per region and value of these labels, each with its own "
        "min_requests: a model over the line pages even when the region's other models keep "
        "the region's P99 under it. The reroute still moves the whole region (the gateway "
        "routes by region).",
    )
    playbook: PlaybookName | None = Field("reroute", description="Playbook run on a breach.")
    restore: RestorePolicy = Field(
        default_factory=RestorePolicy, description="When the reroute hands the traffic back."
    )
    saturation: SaturationWarning = Field(
        default_factory=SaturationWarning,
        description=f"{alerts.Alert.ENGINE_SATURATION_RISING.value} (ticket): the engine "
        "saturates before the P99 breaches.",
    )


class ContextKeepaliveRedLine(_Model):
    """Conversation context must survive at least `min_seconds` in the session store."""

    min_seconds: PositiveFloat = Field(300, description="Minimum lifetime of a session's context.")
    for_seconds: int = Field(60, ge=0, description="How long the breach must last before firing.")
    playbook: PlaybookName | None = Field(None, description="Playbook run on a breach.")


class IndexConsistencyRedLine(_Model):
    """The replica of the vector index may lag the primary by at most `max_staleness_seconds`."""

    max_staleness_seconds: PositiveFloat = Field(12, description="Eventual-consistency window.")
    for_seconds: int = Field(15, ge=0, description="How long the breach must last before firing.")
    playbook: PlaybookName | None = Field(
        "freeze_and_replay", description="Playbook run on a breach."
    )


class RedLines(_Model):
    """The three SLA red lines; any breach is a critical alert."""

    latency_p99: LatencyRedLine = Field(default_factory=LatencyRedLine)
    context_keepalive: ContextKeepaliveRedLine = Field(default_factory=ContextKeepaliveRedLine)
    index_consistency: IndexConsistencyRedLine = Field(default_factory=IndexConsistencyRedLine)


class RpoTarget(_Model):
    """A recovery-point objective: data older than `max_seconds` may never be at risk."""

    max_seconds: PositiveFloat = Field(description="The recovery-point objective.")
    checkpoint_interval_seconds: PositiveFloat | None = Field(
        None, description="How often a checkpoint is taken; it must not exceed the RPO."
    )
    for_seconds: int = Field(0, ge=0, description="How long the breach must last before firing.")
    playbook: PlaybookName | None = Field(None, description="Playbook run on a breach.")


class Rpo(_Model):
    """Recovery-point targets for adapters, session state (CDC and CRDT sync) and the index
    delta log."""

    lora_adapter: RpoTarget = Field(
        default_factory=lambda: RpoTarget(max_seconds=90, checkpoint_interval_seconds=120)
    )
    session_state: RpoTarget = Field(default_factory=lambda: RpoTarget(max_seconds=3))
    embedding_index: RpoTarget = Field(default_factory=lambda: RpoTarget(max_seconds=12))
    session_crdt: RpoTarget = Field(
        default_factory=lambda: RpoTarget(max_seconds=5),
        description="CRDT session sync between regions: age of the oldest delta not yet merged.",
    )


class Rollback(_Model):
    """The two-signal gate: latency up AND accuracy down, with enough traffic to trust both."""

    p99_increase_ratio: float = Field(
        0.15, gt=0, description="Fire when p99 >= (1 + ratio) x the version's baseline p99."
    )
    accuracy_drop: float = Field(
        0.008,
        gt=0,
        lt=1,
        description="...and baseline accuracy - accuracy > this (0.008 = 0.8 pp).",
    )
    window_seconds: PositiveInt = Field(300, description="Window both signals are measured over.")
    min_samples: PositiveInt = Field(2000, description="...and at least this many requests in it.")
    min_eval_samples: PositiveInt = Field(
        100, description="...and at least this many accuracy verdicts (golden or online) in it."
    )
    confidence: float = Field(
        0.95,
        ge=0.5,
        lt=1,
        description="The accuracy leg fires only when the drop exceeds accuracy_drop at this "
        "one-sided confidence (Wilson score bound on the verdicts).",
    )
    for_seconds: int = Field(0, ge=0, description="How long the gate must hold before firing.")
    playbook: PlaybookName = Field("semantic_rollback", description="Playbook run when it fires.")
    on_mutation: bool = Field(
        False,
        description="Also run the playbook when a canary's answer mutates "
        f"({alerts.Alert.OUTPUT_CONSISTENCY_MUTATION}) without the two signals; false: a "
        "mutation only records a rollback candidate, and rolls back early only while the gate's "
        "conditions hold.",
    )


class SlowRequestsSli(_Model):
    """Bad events are requests slower than a threshold (read from the latency histogram)."""

    kind: Literal["slow_requests"] = "slow_requests"
    threshold_seconds: PositiveFloat = Field(description="A request slower than this is bad.")
    selector: dict[str, str] = Field(
        default_factory=dict, description="Extra label matchers (label: value) on the SLI series."
    )

    @field_validator("selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_selector(value)


class ErrorsSli(_Model):
    """Bad events are failed requests (the error counter over the request counter)."""

    kind: Literal["errors"] = "errors"
    selector: dict[str, str] = Field(
        default_factory=dict, description="Extra label matchers (label: value) on the SLI series."
    )

    @field_validator("selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_selector(value)


def _check_selector(value: dict[str, str]) -> dict[str, str]:
    for label in value:
        if not _LABEL_NAME.match(label):
            raise ValueError(f"{label!r} is not a Prometheus label name")
    return value


class Slo(_Model):
    """An error-budget SLO alerted with multiwindow multi-burn-rate rules."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Lowercase id; names the alert.")
    objective: float = Field(gt=0, lt=1, description="Target share of good events, e.g. 0.99.")
    period: Duration = Field("30d", description="Compliance period of the error budget.")
    sli: SlowRequestsSli | ErrorsSli = Field(discriminator="kind", description="What is bad.")
    alert_name: str | None = Field(
        None,
        pattern=r"^[A-Z][A-Za-z0-9]*$",
        description=f"Defaults to <Name>{alerts.ERROR_BUDGET_BURN.suffix}.",
    )
    playbook: PlaybookName | None = Field(None, description="Playbook run on a page.")
    min_events: int = Field(
        100,
        ge=0,
        description="A burn-rate alert needs at least this many events in its long window: a "
        "low-traffic service does not page on a handful of failed requests (0 turns it off).",
    )
    group_by: GroupBy = Field(
        (),
        description="One SLO per value of these labels, each with its own budget, min_events "
        "and burn alerts labelled with the group: an adapter failing 20 % of its requests at "
        "2 % of the traffic pages, where the fleet's average would hide it.",
    )
    max_groups: PositiveInt = Field(
        50,
        description=f"With group_by: more groups than this fire "
        f"{alerts.Alert.SLO_GROUPS_OVER_LIMIT.value} (ticket); every group is still evaluated, "
        "none dropped.",
    )

    @property
    def burn_alert_name(self) -> str:
        """The burn-rate alert's name."""
        if self.alert_name:
            return self.alert_name
        return alerts.ERROR_BUDGET_BURN.for_slo(self.name)


def _default_slos() -> tuple[Slo, ...]:
    return (
        Slo(name="latency", objective=0.99, sli=SlowRequestsSli(threshold_seconds=0.8)),
        Slo(name="availability", objective=0.999, sli=ErrorsSli()),
    )


class Drift(_Model):
    """Embedding drift of recent vectors against a reference set."""

    method: Literal["mmd", "mean_cosine", "classifier_auc"] = Field(
        "mmd", description="Default test: MMD^2 with an RBF kernel (median heuristic)."
    )
    threshold: PositiveFloat = Field(0.01, description="Score above which the window drifted.")
    window: PositiveInt = Field(1000, ge=10, description="Recent vectors per evaluation.")
    reference: str | None = Field(None, description="A .npy file of reference vectors.")
    collection: str = Field("documents", description="Collection whose inserts are watched.")
    for_seconds: int = Field(300, ge=0, description="How long drift must last before firing.")


_MATCHER = re.compile(r'^[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"$')


class SeriesOverride(_Model):
    """The engine series standing for one signal, replacing the profile's choice."""

    names: tuple[MetricName, ...] = Field(
        min_length=1, description="Series added together (histogram base names for histograms)."
    )
    matchers: tuple[str, ...] = Field(
        (), description='PromQL label matchers on every name, e.g. status="5xx".'
    )

    @field_validator("matchers")
    @classmethod
    def _matchers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for matcher in value:
            if not _MATCHER.match(matcher):
                raise ValueError(
                    f'{matcher!r} is not a PromQL label matcher like status="5xx" '
                    "(operators =, !=, =~, !~; the value in double quotes)"
                )
        return value


class Sources(_Model):
    """Which series carry each SLI: a profile of the serving stack, plus explicit overrides.

    `profile` names the stack (`redline.slo.sources.PROFILES`): redline's own gateway, or the
    documented metrics of vLLM, SGLang, TGI, NIM or the OpenTelemetry GenAI conventions.
    """

    profile: ProfileName = Field(
        "redline-gateway", description="The serving stack whose metrics feed the SLIs."
    )
    request_duration: MetricName | None = Field(
        None, description="Shorthand: the end-to-end latency histogram's base name."
    )
    requests_total: MetricName | None = Field(None, description="Shorthand: the request counter.")
    errors_total: MetricName | None = Field(None, description="Shorthand: the error counter.")
    histogram_buckets: tuple[PositiveFloat, ...] | None = Field(
        None,
        min_length=1,
        description="Buckets of the latency histogram (default: the profile's); thresholds "
        "should be buckets.",
    )
    series: dict[SignalName, SeriesOverride] = Field(
        default_factory=dict, description="Per signal: the series standing for it."
    )
    labels: dict[str, Annotated[str, Field(pattern=_LABEL_NAME.pattern)]] = Field(
        default_factory=dict,
        description="Catalog label -> the engine label carrying it (region, model, "
        "model_version, status).",
    )
    model: str | None = Field(
        None, min_length=1, description="A constant model name, for engines with no model label."
    )

    def resolve(self) -> ResolvedSources:
        """The profile with every override applied."""
        series: dict[str, SourceSeries] = {
            signal: SourceSeries(override.names, override.matchers)
            for signal, override in self.series.items()
        }
        shorthands = {
            "request_duration": self.request_duration,
            "requests": self.requests_total,
            "errors": self.errors_total,
        }
        for signal, name in shorthands.items():
            if name is not None and signal not in series:
                series[signal] = SourceSeries((name,))
        return resolve_sources(
            self.profile,
            series=series,
            labels=self.labels,
            model=self.model,
            buckets=self.histogram_buckets,
        )

    @property
    def buckets(self) -> tuple[float, ...]:
        """The latency histogram's bucket bounds (the spec's, or the profile's)."""
        return self.resolve().buckets

    @model_validator(mode="after")
    def _resolves(self) -> Sources:
        try:
            self.resolve()
        except SourceProfileError as exc:
            raise ValueError(str(exc)) from None
        return self


class Timing(_Model):
    """Scrape and evaluation cadence the rules are written for."""

    scrape_interval_seconds: PositiveFloat = Field(15, description="Prometheus scrape interval.")
    evaluation_interval_seconds: PositiveFloat = Field(15, description="Rule evaluation interval.")
    absent_for_seconds: int = Field(120, ge=0, description="How long an SLI may be absent.")
    probe_stale_after_seconds: PositiveFloat = Field(
        180, description="A probe whose last success is older than this is stale."
    )
    group_wait_seconds: PositiveFloat = Field(10, description="Alertmanager group_wait.")
    group_interval_seconds: PositiveFloat = Field(60, description="Alertmanager group_interval.")
    repeat_interval_seconds: PositiveFloat = Field(3600, description="Alertmanager repeat.")


class TimingOverride(_Model):
    """A named profile's changes to `timing` (e.g. `local`: 1 s scrape and evaluation)."""

    scrape_interval_seconds: PositiveFloat | None = None
    evaluation_interval_seconds: PositiveFloat | None = None
    absent_for_seconds: int | None = Field(None, ge=0)
    probe_stale_after_seconds: PositiveFloat | None = None
    group_wait_seconds: PositiveFloat | None = None
    group_interval_seconds: PositiveFloat | None = None
    repeat_interval_seconds: PositiveFloat | None = None
    red_line_for_seconds: int | None = Field(
        None, ge=0, description="Overrides `for_seconds` of every red line, RPO and the gate."
    )
    latency_window: Duration | None = Field(
        None,
        description="Overrides `red_lines.latency_p99.window` (a short window lets a drill's "
        "P99 alert resolve in seconds once the slow requests leave it).",
    )
    saturation_window: Duration | None = Field(
        None,
        description="Overrides `red_lines.latency_p99.saturation.window` (the saturation "
        "drill's queue grows for minutes, not hours).",
    )
    breaker_window: Duration | None = Field(
        None, description="Overrides `breakers.window` (the breaker drill opens in seconds)."
    )
    breaker_open_for: Duration | None = Field(None, description="Overrides `breakers.open_for`.")
    rollback_min_samples: int | None = Field(
        None,
        ge=0,
        description="Overrides `rollback.min_samples` (a laptop's load generator gathers 2000 "
        "requests of one version in minutes; the drills prove the guard at this count, the "
        "promtool cases at the spec's).",
    )
    rollback_min_eval_samples: int | None = Field(
        None,
        gt=0,
        description="Overrides `rollback.min_eval_samples` (the local golden probe's verdicts "
        "gather slower than a fleet's evaluators').",
    )


SpotProvider = Literal["aws", "gcp"]
"""Clouds whose spot/preemptible notice the spot agent reads."""


class SpotNoticeWindows(_Model):
    """How long before termination each cloud announces a spot/preemptible interruption."""

    aws: PositiveFloat = Field(
        120, description="AWS EC2 spot interruption notice (the two-minute warning)."
    )
    gcp: PositiveFloat = Field(30, description="GCP spot/preemptible VM preemption notice.")


class Spot(_Model):
    """Spot GPU preemption: the drain budget, in-flight triage, and their targets.

    drain budget = notice - detection delay - ingress removal - safety margin; an in-flight
    request continues when remaining tokens x time per output token <= continue_factor x budget
    and is aborted (with a recoverable error, then retried elsewhere) otherwise.
    """

    notice_seconds: SpotNoticeWindows = Field(
        default_factory=SpotNoticeWindows, description="Notice window per provider."
    )
    detection_delay_seconds: float = Field(
        2.0,
        ge=0,
        description="Worst case from the notice appearing to the agent seeing it (AWS is polled; "
        "the GCP long-poll answers at once).",
    )
    ingress_removal_seconds: float = Field(
        5.0,
        ge=0,
        description="Time until load balancers and gateways stop sending new requests to the node.",
    )
    safety_margin_seconds: float = Field(
        10.0, ge=0, description="Kept free before termination (late tokens, flushing, clock skew)."
    )
    continue_factor: float = Field(
        0.85,
        gt=0,
        le=1,
        description="Continue a request when remaining tokens x TPOT <= this x the drain budget.",
    )
    notice_to_draining_p95_seconds: PositiveFloat = Field(
        5.0, description="Target p95 of notice -> DRAINING (admission closed, triage done)."
    )
    readiness_timeout_seconds: PositiveFloat = Field(
        600.0,
        description="Longest wait for a replacement to pass the readiness gate (health, model "
        "loaded, dummy inference) before the agent gives up and keeps admission closed.",
    )
    alert_window: Duration = Field(
        "1h", description="Window of the notice -> DRAINING p95 the alert compares to its target."
    )
    playbook: PlaybookName | None = Field(
        "spot_drain", description="Playbook run when a preemption notice alert fires."
    )

    def notice_for(self, provider: str) -> float:
        """The notice window of `provider` (ValueError for an unknown one)."""
        if provider not in SpotNoticeWindows.model_fields:
            allowed = ", ".join(SpotNoticeWindows.model_fields)
            raise ValueError(f"unknown spot provider {provider!r}; allowed: {allowed}")
        return float(getattr(self.notice_seconds, provider))

    def drain_budget(self, provider: str) -> float:
        """notice - detection delay - ingress removal - safety margin, for `provider`."""
        return (
            self.notice_for(provider)
            - self.detection_delay_seconds
            - self.ingress_removal_seconds
            - self.safety_margin_seconds
        )

    @model_validator(mode="after")
    def _positive_budgets(self) -> Spot:
        for provider in SpotNoticeWindows.model_fields:
            budget = self.drain_budget(provider)
            if budget <= 0:
                raise ValueError(
                    f"the {provider} drain budget is {budget:g} s: notice_seconds.{provider} "
                    f"({self.notice_for(provider):g}) must exceed detection_delay_seconds + "
                    "ingress_removal_seconds + safety_margin_seconds "
                    f"({self.notice_for(provider) - budget:g})"
                )
        return self


PlaybookMode = Literal["act", "shadow", "off"]
"""act: run the playbook; shadow: plan and run its read-only checks, change nothing; off: skip."""


class PlaybookBudget(_Model):
    """At most `runs` firing runs of a playbook per target within any `per` window."""

    runs: PositiveInt = Field(description="Runs allowed per target in the window.")
    per: Duration = Field("1h", description="The sliding window.")

    @property
    def per_seconds(self) -> float:
        """The window in seconds."""
        return parse_duration(self.per)


class PlaybookBreaker(_Model):
    """Stop acting after `failures` consecutive failed runs, until a human resumes the playbook."""

    failures: PositiveInt = Field(3, description="Consecutive failed runs that open the breaker.")


class PlaybookPolicy(_Model):
    """How the remediation worker treats one playbook's jobs."""

    mode: PlaybookMode = Field("act", description="act, shadow (plan and check only) or off.")
    budget: PlaybookBudget | None = Field(None, description="Runs per target per window.")
    breaker: PlaybookBreaker = Field(default_factory=PlaybookBreaker)
    deadline: Duration = Field(
        "15m", description="A job not finished this long after it was accepted is overdue."
    )

    @property
    def deadline_seconds(self) -> float:
        """The deadline in seconds."""
        return parse_duration(self.deadline)


class Remediation(_Model):
    """Guard rails of the remediation worker, per playbook (unlisted playbooks: defaults)."""

    playbooks: dict[PlaybookName, PlaybookPolicy] = Field(default_factory=dict)

    def policy(self, name: str) -> PlaybookPolicy:
        """The policy of playbook `name` (the defaults when the spec lists none)."""
        found = {str(key): policy for key, policy in self.playbooks.items()}
        return found.get(name) or PlaybookPolicy()


class RedisDurability(_Model):
    """How durable redline's writes to Redis must be before they are acknowledged."""

    min_replicas_ack: int = Field(
        0,
        ge=0,
        le=16,
        description="Replicas that must acknowledge (WAIT) a write that must not be lost (a job "
        "answered 202, an audit record) before it is acknowledged; 0: no WAIT (one Redis).",
    )
    ack_timeout_ms: int = Field(
        500, ge=1, le=60_000, description="How long WAIT waits for those replicas (ms)."
    )


class Receiver(_Model):
    """Where Alertmanager sends alerts for remediation."""

    url: str = Field("http://127.0.0.1:9095/alerts", description="The receiver's POST endpoint.")
    bearer_token_file: str = Field(
        "/etc/redline/webhook-token", description="File holding the webhook bearer token."
    )
    scrape_job: str = Field(
        "remediation",
        min_length=1,
        pattern=r'^[^"\\]+$',
        description="Regex (RE2, anchored) matching the Prometheus `job` label of the receiver's "
        f"scrape targets; {alerts.Alert.RECEIVER_DOWN} pages when one of them is down.",
    )

    @field_validator("scrape_job")
    @classmethod
    def _job_regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        return value


# -- escalation: the humans behind the alerts ---------------------------------------------------

REMEDIATION_RECEIVER = "redline-remediation"
"""The Alertmanager receiver name of the remediation webhook (no human receiver may take it)."""

Severity = alerts.Severity
"""Alert severities the rules use (the alert catalog's)."""

PAGING_SEVERITIES: tuple[str, ...] = ("critical", "page")
"""Severities that must reach a human whenever `escalation` is set."""

SecretFile = Annotated[
    str, Field(min_length=1, description="Path of a file holding the secret (never inline).")
]


class SlackTarget(_Model):
    """A Slack incoming webhook (its URL is the secret, read from a file)."""

    api_url_file: SecretFile = Field(description="File holding the incoming-webhook URL.")
    channel: str = Field(min_length=1, description="Channel to post to, e.g. #genai-oncall.")


class PagerDutyTarget(_Model):
    """A PagerDuty service: Events API v2 routing key, or the older service key, from a file."""

    routing_key_file: SecretFile | None = Field(None, description="Events API v2 routing key.")
    service_key_file: SecretFile | None = Field(None, description="Events API v1 service key.")
    url: str | None = Field(
        None, min_length=1, description="Events API endpoint (default: PagerDuty's own)."
    )

    @model_validator(mode="after")
    def _one_key(self) -> PagerDutyTarget:
        if (self.routing_key_file is None) == (self.service_key_file is None):
            raise ValueError("set exactly one of routing_key_file and service_key_file")
        return self


class EmailTarget(_Model):
    """E-mail through an SMTP smarthost; the password is read from a file."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    to: str = Field(min_length=3, description="Recipient address(es), comma-separated.")
    sender: str = Field(alias="from", min_length=3, description="From address.")
    smarthost: str = Field(
        pattern=r"^[^\s:]+:\d+$", description="SMTP server as host:port, e.g. smtp.example.com:587."
    )
    auth_username: str | None = Field(None, min_length=1, description="SMTP user.")
    auth_password_file: SecretFile | None = Field(None, description="File holding the password.")
    require_tls: bool = Field(True, description="Refuse to send without STARTTLS.")

    @model_validator(mode="after")
    def _auth_pair(self) -> EmailTarget:
        if (self.auth_username is None) != (self.auth_password_file is None):
            raise ValueError("auth_username and auth_password_file go together")
        return self


class WebhookTarget(_Model):
    """Any HTTP endpoint taking Alertmanager's webhook JSON (v4), optionally with a bearer token."""

    url: str = Field(pattern=r"^https?://", description="The endpoint alerts are POSTed to.")
    bearer_token_file: SecretFile | None = Field(None, description="File holding the token.")


class HumanReceiver(_Model):
    """A named human receiver: exactly one of slack, pagerduty, email, webhook."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]*$", description="Named by escalation.routes.")
    slack: SlackTarget | None = None
    pagerduty: PagerDutyTarget | None = None
    email: EmailTarget | None = None
    webhook: WebhookTarget | None = None

    @property
    def kind(self) -> str:
        """Which of slack, pagerduty, email, webhook this receiver is."""
        return next(k for k in ("slack", "pagerduty", "email", "webhook") if getattr(self, k))

    @model_validator(mode="after")
    def _exactly_one(self) -> HumanReceiver:
        given = [k for k in ("slack", "pagerduty", "email", "webhook") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                f"receiver {self.name!r} must set exactly one of slack, pagerduty, email, "
                f"webhook (got {', '.join(given) or 'none'})"
            )
        if self.name == REMEDIATION_RECEIVER:
            raise ValueError(f"{REMEDIATION_RECEIVER!r} is the remediation webhook's name")
        return self


class Escalation(_Model):
    """Human receivers and which alert severities reach each; secrets only by file."""

    receivers: tuple[HumanReceiver, ...] = Field(min_length=1, description="The humans' channels.")
    routes: dict[Severity, tuple[str, ...]] = Field(
        default_factory=dict,
        description="Severity -> receiver names (every one gets the alert; [] means nobody).",
    )
    default: tuple[str, ...] = Field(
        (), description="Receivers of alerts whose severity `routes` does not list."
    )

    def receivers_for(self, severity: str) -> tuple[str, ...]:
        """The receiver names an alert of `severity` reaches."""
        found = {str(key): names for key, names in self.routes.items()}
        return found.get(severity, self.default)

    def receiver(self, name: str) -> HumanReceiver:
        """The receiver called `name` (KeyError when none is)."""
        for receiver in self.receivers:
            if receiver.name == name:
                return receiver
        raise KeyError(name)

    @model_validator(mode="after")
    def _consistent(self) -> Escalation:
        names = [r.name for r in self.receivers]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"escalation.receivers: names repeated: {', '.join(repeated)}")
        named = [(f"routes.{sev}", n) for sev, listed in self.routes.items() for n in listed]
        named += [("default", n) for n in self.default]
        for where, name in named:
            if name not in names:
                raise ValueError(
                    f"escalation.{where}: no receiver named {name!r}; known: {', '.join(names)}"
                )
        for severity in PAGING_SEVERITIES:
            if not self.receivers_for(severity):
                raise ValueError(
                    f"escalation.routes.{severity}: {severity} alerts must reach a human: name "
                    "a receiver here or in escalation.default"
                )
        return self


class Breakers(_Model):
    """Per-region circuit breakers in redline's gateway (design notes 4.1).

    A region's breaker opens when, over the sliding `window`, with at least `min_requests`
    attempts, the share of failed attempts (connect errors, 5xx, timeouts, first-byte budget)
    exceeds `error_rate` or their P99 latency exceeds `p99_seconds`; while open the region is
    skipped (tried only when no other region is left); after `open_for` up to
    `half_open_probes` attempts probe it: all succeed -> closed, one fails -> open again.
    """

    enabled: bool = Field(True, description="Whether the gateway runs the breakers at all.")
    error_rate: float = Field(
        0.15, gt=0, lt=1, description="Open above this share of failed attempts in the window."
    )
    window: Duration = Field("60s", description="Sliding window of the error rate and the P99.")
    p99_seconds: PositiveFloat = Field(
        3.0, description="Open when the window's P99 attempt latency exceeds this."
    )
    min_requests: PositiveInt = Field(
        20, description="Attempts the window must hold before either condition can open it."
    )
    open_for: Duration = Field("30s", description="How long an open breaker skips its region.")
    half_open_probes: int = Field(
        3, ge=1, le=100, description="Probe attempts let through when half-open; all must pass."
    )
    alert_after: Duration = Field(
        "5m",
        description=f"{alerts.Alert.GATEWAY_BREAKER_OPEN} fires when a breaker has not closed "
        "for this long.",
    )

    @field_validator("window", "open_for", "alert_after")
    @classmethod
    def _at_least_a_second(cls, value: str, info: ValidationInfo) -> str:
        seconds = parse_duration(value)
        if seconds < 1:
            raise ValueError(f"{info.field_name} must be at least 1s (got {value})")
        if info.field_name == "window" and seconds > 3600:
            raise ValueError(f"window must be at most 1h (got {value}): the breaker reacts late")
        return value


class MaturityBars(_Model):
    """The bars of the report's disaster-recovery maturity assessment (design notes §5)."""

    semantic_similarity_min: float = Field(
        0.97,
        gt=0,
        le=1,
        description="Level 2 (semantic consistency): the mean embedding similarity of the "
        "primary's and each backup's answers to the canary prompts over the report period "
        "must be at least this.",
    )


# -- quotas: semantic rate limiting by tokens and intent (design notes 4.2) ---------------------

IntentName = Literal["summarise", "translate", "code", "sql", "chat", "extraction"]
"""Every request intent the gateway's classifiers answer."""

INTENT_NAMES: tuple[str, ...] = get_args(IntentName)
ANY = "*"
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class QuotaLimit(_Model):
    """One token bucket per tenant: `tokens_per_minute` refill, `burst` capacity."""

    tenant: str = Field(ANY, description="A tenant name, or * for a bucket per tenant.")
    intent: str = Field(ANY, description=f"One of {', '.join(INTENT_NAMES)}, or * for any.")
    model: str | None = Field(
        None, description="Only requests for this model (one of quotas.models); unset: any."
    )
    tokens_per_minute: PositiveInt = Field(description="Refill rate of the bucket.")
    burst: PositiveInt | None = Field(
        None, description="Capacity of the bucket (unset: tokens_per_minute)."
    )
    safety_buffer_tokens: int = Field(
        0, ge=0, description="Tokens reserved on top of each request's estimate (refunded)."
    )
    overflow: Literal["reject", "downgrade"] = Field(
        "reject", description="reject: 429 with Retry-After; downgrade: serve downgrade_to."
    )
    downgrade_to: str | None = Field(
        None, description="The lighter model an overflowing request is sent to (downgrade)."
    )

    @field_validator("tenant")
    @classmethod
    def _tenant_name(cls, value: str) -> str:
        if value != ANY and not _TENANT.match(value):
            raise ValueError(f"tenant {value!r} must be * or letters, digits, '_', '.', '-'")
        return value

    @field_validator("intent")
    @classmethod
    def _known_intent(cls, value: str) -> str:
        if value != ANY and value not in INTENT_NAMES:
            allowed = ", ".join((*INTENT_NAMES, ANY))
            raise ValueError(f"unknown intent {value!r}; allowed: {allowed}")
        return value

    @model_validator(mode="after")
    def _downgrade_target(self) -> QuotaLimit:
        if self.overflow == "downgrade" and self.downgrade_to is None:
            raise ValueError("overflow: downgrade needs downgrade_to (the lighter model)")
        if self.overflow == "reject" and self.downgrade_to is not None:
            raise ValueError("downgrade_to is only used with overflow: downgrade")
        return self

    @property
    def capacity(self) -> int:
        """The bucket's capacity in tokens."""
        return self.burst if self.burst is not None else self.tokens_per_minute


class QuotaTenants(_Model):
    """Who a request belongs to: its API key (a key -> tenant file) first, then a header."""

    api_keys_file: SecretFile | None = Field(
        None,
        description="YAML/JSON mapping of API key -> tenant (the bearer token or x-api-key); "
        "keys are read from this file only, never inline.",
    )
    header: str | None = Field(
        "x-redline-tenant", pattern=r"^[a-z0-9-]+$", description="Header naming the tenant."
    )
    default: str = Field(
        "anonymous", pattern=_TENANT.pattern, description="The tenant of any other request."
    )


class Elastic(_Model):
    """Long prompts may overdraw the bucket: factor 1 + slope x prompt / per_tokens, capped."""

    slope: float = Field(0.3, ge=0, description="Factor added per `per_tokens` prompt tokens.")
    per_tokens: PositiveInt = Field(500, description="Prompt tokens per `slope` of factor.")
    max_factor: float = Field(
        2.0, ge=1, le=2, description="Cap of the factor (the notes: at most 2x)."
    )


class Quotas(_Model):
    """Token quotas per tenant x intent in the gateway (design notes 4.2).

    Each request is classified (intent), its tokens estimated before it runs (prompt +
    expected completion + the limit's safety buffer) and drawn from the buckets of every limit
    that matches it (held in Redis, shared by all gateway replicas); the reservation is settled
    against the usage the upstream reports. A long prompt may overdraw a bucket by
    (factor - 1) x burst (`elastic`). An empty bucket rejects (429, Retry-After) or downgrades.
    """

    enabled: bool = Field(False, description="Whether the gateway enforces the quotas.")
    models: tuple[str, ...] = Field(
        (), description="The models the gateway serves: downgrade targets and `model` scopes."
    )
    tenants: QuotaTenants = Field(default_factory=QuotaTenants)
    limits: tuple[QuotaLimit, ...] = Field(())
    elastic: Elastic = Field(default_factory=Elastic)
    on_store_error: Literal["fail_open", "fail_closed"] = Field(
        "fail_open",
        description="Redis unreachable: admit (fail_open) or reject with 503 (fail_closed).",
    )
    completion_quantile: float = Field(
        0.9, gt=0, lt=1, description="Expected completion: this quantile of the intent's."
    )
    default_completion_tokens: PositiveInt = Field(
        256, description="Expected completion before an intent has samples (capped by max_tokens)."
    )
    throttle_alert_ratio: float = Field(
        0.2,
        gt=0,
        lt=1,
        description=f"{alerts.Alert.QUOTA_THROTTLING_SUSTAINED} above this throttled share.",
    )
    throttle_alert_for: Duration = Field("10m", description="... sustained this long.")

    @model_validator(mode="after")
    def _known_models(self) -> Quotas:
        allowed = ", ".join(self.models) or "none: list the served models in quotas.models"
        for index, limit in enumerate(self.limits):
            for name in ("model", "downgrade_to"):
                value = getattr(limit, name)
                if value is not None and value not in self.models:
                    raise ValueError(
                        f"quotas.limits.{index}.{name}: unknown model {value!r}; allowed: {allowed}"
                    )
        return self


DEFAULT_TRACE_URL = "http://localhost:16686/trace/${__value.raw}"


class Tracing(_Model):
    """Where a trace id leads: the exemplar links of the latency panels (Grafana)."""

    trace_url_template: str = Field(
        DEFAULT_TRACE_URL,
        pattern=r"^https?://",
        description="URL of one trace in the trace backend (Jaeger, Tempo); Grafana replaces "
        "${__value.raw} with the exemplar's trace_id.",
    )

    @field_validator("trace_url_template")
    @classmethod
    def _names_the_trace_id(cls, value: str) -> str:
        if "${__value.raw}" not in value:
            raise ValueError(
                "trace_url_template must contain ${__value.raw} (where the trace id goes), "
                f"e.g. {DEFAULT_TRACE_URL}"
            )
        return value


# -- GPU nodes: the exporters a GPU cluster already runs (rules/families/gpu.py) --------------

NVIDIA_DRAIN_XIDS: tuple[int, ...] = (
    # RESET_GPU
    46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158, 162,
    # RESTART_BM (reboot the machine) and RESTART_VM
    79, 160, 151,
    # hardware workflows: WORKFLOW_XID_48 (double-bit ECC), WORKFLOW_NVLINK_ERR (74) and
    # WORKFLOW_NVLINK5_ERR (144-150)
    48, 74, 144, 145, 146, 147, 148, 149, 150,
    # GPU_RECOVERY_ACTION_CHANGED: redline's addition, see below
    154,
)  # fmt: skip
"""XIDs whose GPU must be drained now: those NVIDIA's Xid catalog resolves by resetting the GPU
(RESET_GPU), rebooting the machine or VM (RESTART_BM, RESTART_VM), or through a hardware
workflow (48: double-bit ECC; 74, 144-150: NVLink), in its "Resolution Bucket (Immediate
Action)" column (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, Ampere
and newer), as NVIDIA's NVSentinel ships that column (NVIDIA/NVSentinel
distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv
@6f8b0fcfa8e502bdda78fabf96facef729a9285b). Every other XID (RESTART_APP: 13, 31, 94 ...;
IGNORE: 43, 63, 92 ...; WORKFLOW_XID_45; the unused ones) is one to watch.

154 is redline's addition: the catalog says to follow the guidance of the XID it accompanies,
but dcgm-exporter keeps only the last XID, and the driver logs 154 ("GPU recovery action
changed ... GPU Reset Required") after the XID that needs the reset (as in the driver logs
posted on NVIDIA's forums), hiding it."""


class Gpu(_Model):
    """GPU health from the exporters a GPU cluster already runs: NVIDIA's dcgm-exporter (per
    GPU: XIDs, memory errors, temperature, NVLink) and kube-state-metrics (nodes and pods)."""

    playbook: PlaybookName | None = Field(
        "gpu_node_failure",
        description=f"Playbook run when {alerts.Alert.GPU_XID_CRITICAL} fires (cordon and drain "
        "the node); null: the alert only reaches humans.",
    )
    drain_xids: tuple[PositiveInt, ...] = Field(
        NVIDIA_DRAIN_XIDS,
        min_length=1,
        description=f"XIDs that fire {alerts.Alert.GPU_XID_CRITICAL} (drain now); default: those "
        "NVIDIA's Xid catalog resolves by a GPU reset, a reboot or a hardware workflow. Any "
        f"other XID fires {alerts.Alert.GPU_XID_WATCH}.",
    )
    ignore_xids: tuple[PositiveInt, ...] = Field(
        (),
        description=f"XIDs that raise no {alerts.Alert.GPU_XID_WATCH} (a workload's known "
        "faults); never one of drain_xids.",
    )
    xid_window: Duration = Field(
        "10m",
        description=f"A new watch XID keeps {alerts.Alert.GPU_XID_WATCH} this long, and a "
        f"drain-now XID keeps {alerts.Alert.GPU_XID_CRITICAL} this long after a later XID "
        "replaced it (dcgm-exporter keeps only the last one).",
    )
    max_temperature_celsius: float = Field(
        85,
        gt=0,
        le=150,
        description=f"{alerts.Alert.GPU_NODE_UNHEALTHY} (ticket) when a GPU stays hotter than "
        "this (dcgm-exporter's GPU temperature); redline's default, below the slowdown "
        "temperature of "
        "common datacenter GPUs: `nvidia-smi -q -d TEMPERATURE` shows yours.",
    )
    temperature_for: Duration = Field("5m", description="... for this long.")
    error_window: Duration = Field(
        "10m",
        description="Window of the error counters: uncorrectable ECC errors and remapped rows "
        "(page), NVLink errors (ticket).",
    )
    nvlink_errors: int = Field(
        0,
        ge=0,
        description="NVLink errors (CRC, replay, recovery) of a GPU within error_window "
        f"above this fire {alerts.Alert.GPU_NODE_UNHEALTHY} (ticket).",
    )
    not_ready_for: Duration = Field(
        "2m",
        description=f"{alerts.Alert.GPU_NODE_UNHEALTHY} (page) when a node with GPU capacity "
        "has not been Ready (false or unknown) for this long.",
    )
    restarts: PositiveInt = Field(
        3,
        description=f"{alerts.Alert.GPU_PODS_UNHEALTHY} when a pod on a GPU node restarted its "
        "containers at least this many times...",
    )
    restart_window: Duration = Field("1h", description="... within this window.")
    pending_for: Duration = Field(
        "10m",
        description=f"{alerts.Alert.GPU_PODS_UNHEALTHY} when a pod bound to a GPU node stays "
        "Pending this long (an image pull, a device plugin failing to allocate).",
    )
    resource: str = Field(
        "nvidia.com/gpu",
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="The Kubernetes resource of a GPU: a node whose capacity has it is a GPU "
        "node (kube-state-metrics writes it with every character outside [a-zA-Z0-9_] as _).",
    )
    node_label: str = Field(
        "node",
        pattern=_LABEL_NAME.pattern,
        description="The label naming the node on kube-state-metrics' series (its own: node).",
    )
    dcgm_node_label: str = Field(
        "Hostname",
        pattern=_LABEL_NAME.pattern,
        description="The label naming the node on dcgm-exporter's series (its own: Hostname, "
        "the node's name where its Helm chart sets NODE_NAME); the rules copy it to `node`.",
    )

    @field_validator("drain_xids", "ignore_xids")
    @classmethod
    def _no_repeats(cls, value: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        repeated = sorted({xid for xid in value if value.count(xid) > 1})
        if repeated:
            raise ValueError(f"XIDs repeated: {', '.join(map(str, repeated))}")
        if info.field_name == "ignore_xids":
            both = sorted(set(value) & set(info.data.get("drain_xids", ())))
            if both:
                raise ValueError(
                    f"{', '.join(map(str, both))} also in drain_xids: a drain-now XID is never "
                    "ignored"
                )
        return value

    @field_validator("xid_window", "error_window", "restart_window")
    @classmethod
    def _a_window(cls, value: str, info: ValidationInfo) -> str:
        if parse_duration(value) < 60:
            raise ValueError(
                f"must be at least 1m (got {value}): an increase or a change needs two samples"
            )
        return value


class Weights(_Model):
    """Encrypted model weights on object storage: how long a data-encryption key (DEK) encrypts
    new shards, and how long a retired one still decrypts the shards written under it.

    The one source of both: the weights exporter publishes the rotation period the
    `DEKRotationOverdue` rules compare the DEK's age with, and every keyring the exporter and
    the weights playbooks build rotates and retires by these two numbers."""

    dek_rotation_hours: float = Field(
        72,
        ge=1,
        le=8760,
        description=f"A keyring's current DEK older than this is rotated (playbook "
        f"weights_rotate) and fires {alerts.Alert.DEK_ROTATION_OVERDUE} (ticket); 1 h to a "
        "year (8760 h).",
    )
    dek_retention_days: float = Field(
        30,
        ge=1,
        le=3650,
        description="A retired DEK still decrypts the shards written under it this long after "
        f"its retirement; after that those shards fire {alerts.Alert.DEK_ROTATION_OVERDUE} "
        "(page) until they are re-encrypted; 1 day to 10 years (3650 days).",
    )

    @property
    def rotation_seconds(self) -> float:
        """`dek_rotation_hours` in seconds."""
        return self.dek_rotation_hours * 3600.0

    @property
    def retention_seconds(self) -> float:
        """`dek_retention_days` in seconds."""
        return self.dek_retention_days * 86400.0


class Spec(_Model):
    """The whole spec file."""

    version: Literal["v1"] = Field(description="Spec format version.")
    service: str = Field(pattern=r"^[a-z][a-z0-9-]*$", description="Service name, label-safe.")
    regions: tuple[str, ...] = Field(
        min_length=1, description="Regions in failover order (first is primary)."
    )
    runbook_base_url: str = Field(
        "https://runbooks.example.com/redline", description="Runbook links are <base>/<alert>."
    )
    red_lines: RedLines = Field(default_factory=RedLines)
    rpo: Rpo = Field(default_factory=Rpo)
    rollback: Rollback = Field(default_factory=Rollback)
    slos: tuple[Slo, ...] = Field(default_factory=_default_slos)
    drift: Drift = Field(default_factory=Drift)
    sources: Sources = Field(default_factory=Sources)
    timing: Timing = Field(default_factory=Timing)
    profiles: dict[str, TimingOverride] = Field(
        default_factory=dict, description="Named timing profiles, applied with --profile."
    )
    receiver: Receiver = Field(default_factory=Receiver)
    redis: RedisDurability = Field(
        default_factory=RedisDurability,
        description="Replica acknowledgements (WAIT) for writes that must survive a failover.",
    )
    spot: Spot = Field(default_factory=Spot, description="Spot GPU preemption handling.")
    remediation: Remediation = Field(
        default_factory=Remediation, description="Per-playbook mode, budget, breaker, deadline."
    )
    breakers: Breakers = Field(
        default_factory=Breakers, description="Per-region circuit breakers in the gateway."
    )
    escalation: Escalation | None = Field(
        None,
        description="Human receivers (Slack, PagerDuty, e-mail, webhook) by severity; without it "
        "every alert goes to the remediation receiver only.",
    )
    tracing: Tracing = Field(
        default_factory=Tracing, description="The trace backend the exemplar links open."
    )
    quotas: Quotas = Field(
        default_factory=Quotas, description="Token quotas per tenant x intent in the gateway."
    )
    maturity: MaturityBars = Field(
        default_factory=MaturityBars, description="Bars of the report's maturity assessment."
    )
    gpu: Gpu = Field(
        default_factory=Gpu,
        description="GPU health from dcgm-exporter and kube-state-metrics: XIDs, memory, "
        "temperature, NVLink, GPU nodes and their pods.",
    )
    weights: Weights = Field(
        default_factory=Weights,
        description="Encrypted weights: DEK rotation period and how long a retired DEK decrypts.",
    )

    @field_validator("regions")
    @classmethod
    def _unique_regions(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for region in value:
            if not re.match(r"^[a-z][a-z0-9-]*$", region):
                raise ValueError(f"region {region!r} must be lowercase letters, digits and '-'")
        if len(set(value)) != len(value):
            raise ValueError("regions must be unique")
        return value

    @field_validator("slos")
    @classmethod
    def _unique_slos(cls, value: tuple[Slo, ...]) -> tuple[Slo, ...]:
        names = [slo.name for slo in value]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"SLO names must be unique; repeated: {', '.join(duplicates)}")
        return value

    @field_validator("profiles")
    @classmethod
    def _profile_names(cls, value: dict[str, TimingOverride]) -> dict[str, TimingOverride]:
        for name in value:
            if not re.match(r"^[a-z][a-z0-9_-]*$", name):
                raise ValueError(f"profile name {name!r} must be lowercase")
        return value
