"""A few hours of the catalog's series, as OpenMetrics text for `promtool tsdb
create-blocks-from openmetrics`: what the exporters, gateway and receiver would have published
through a day with incidents (a primary latency breach with reroutes, a stale index replica
frozen and replayed, a CDC lag spike, a stuck LoRA checkpoint, a model version switch that
regresses while the rollback playbook is in shadow mode, drift creeping up, a paused playbook
and a run over budget) and the `ALERTS` those incidents fire.

The dashboard checks query every panel against these series, and the README's picture is drawn
from them. Deterministic: the same spec and time range give the same text.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from redline.devstack.samples.openmetrics import Family, Series, render_openmetrics
from redline.rules.build import build_rule_groups
from redline.rules.model import number
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.spec import PLAYBOOK_NAMES, Spec, parse_duration

MODEL = "chat"
ADAPTERS = ("support-lora", "summarize-lora")
COLLECTION = "documents"
STREAM, GROUP = "sessions:cdc", "replica"
DRIFT_REPLICA = "secondary"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.8, 1.0, 2.0, 5.0, 10.0)
RUN_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
SPOT_NOTICE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120)
SPOT_NODE_STATES = ("ready", "draining", "terminating", "recovered")
PROBES = ("llm_endpoints", "index_staleness", "session_rpo", "keepalive", "drift", "models")
RUN_PLAYBOOKS = ("reroute", "freeze_and_replay", "semantic_rollback")
"""Playbooks that run in the sample (the others only publish their zeros and gauges)."""
RUN_OUTCOMES = tuple(o for o in catalog.RUN_OUTCOMES if o != catalog.OUTCOME_DRY_RUN)
"""Outcomes the sample's runs end with (no dry runs)."""
WRITES_PER_SECOND = 3.0
RETENTION_SECONDS = 600.0
STREAM_BASE_BYTES = 65_536.0
BYTES_PER_ENTRY = 212.0
"""Delta-log writes and what the stream costs in Redis (roughly, per XADD of a 384-d row id)."""


def profile_spec(spec: Spec, profile: str, model: str | None = None) -> Spec:
    """`spec` read from another source profile: its `sources` replaced by the profile alone (its
    own series, labels and buckets), and no claim of latency including reroute where the
    profile cannot see one. `model` is the constant model of engines whose series name none."""
    data = spec.model_dump()
    data["sources"] = {"profile": profile, **({"model": model} if model is not None else {})}
    checked = Spec.model_validate(data)
    if not checked.sources.resolve().profile.includes_reroute:
        data["red_lines"]["latency_p99"]["includes_reroute"] = False
    return Spec.model_validate(data)


@dataclass(frozen=True)
class Window:
    """A share [start, end) of the sample's time range."""

    start: float
    end: float

    def holds(self, share: float) -> bool:
        """True while `share` (0 at the start of the range, 1 at its end) is in the window."""
        return self.start <= share < self.end


@dataclass(frozen=True)
class Preemption:
    """One spot node's preemption: when the notice comes (a share) and how each phase goes."""

    node: str
    provider: str
    at: float
    to_draining_seconds: float
    drain_seconds: float
    replacement_seconds: float
    inflight: int
    aborted: int
    wasted_tokens: float

    def elapsed(self, now: float, start: float, end: float) -> float:
        """Seconds since the notice at `now` (negative before it)."""
        return now - (start + self.at * (end - start))

    def state(self, elapsed: float) -> str:
        """The node's `llm_node_state` state `elapsed` seconds after the notice."""
        if elapsed < 0:
            return "ready"
        if elapsed < self.drain_seconds:
            return "draining"
        if elapsed < self.drain_seconds + self.replacement_seconds:
            return "terminating"
        return "recovered"


GPU_RECOVERIES = {catalog.RECOVERY_COLD: (0.4, 42.0), catalog.RECOVERY_WARM: (0.65, 0.18)}
"""A GPU node failure recovered each way (share of the range, seconds): the design notes' pod
rebuild (42 s) and hot rescheduling (180 ms)."""

PREEMPTIONS = (
    Preemption("spot-a", "aws", 0.25, 0.8, 60.0, 90.0, 40, 10, 5200.0),
    Preemption("spot-b", "gcp", 0.75, 6.0, 30.0, 300.0, 30, 18, 9100.0),
)
"""A quick AWS preemption, then a GCP one that drains slowly and whose replacement takes longer
than the 30 s notice window."""


@dataclass(frozen=True)
class Scenario:
    """When each incident happens, as shares of the range."""

    latency_breach: Window = Window(0.55, 0.70)
    version_switch: float = 0.40
    accuracy_regression: Window = Window(0.80, 1.01)
    stale_index: Window = Window(0.60, 0.66)
    write_freeze: Window = Window(0.62, 0.68)
    cdc_lag: Window = Window(0.20, 0.23)
    crdt_partition: Window = Window(0.45, 0.48)
    """The CRDT session sync between the regions is cut: lag grows, sessions diverge; after the
    heal they converge (the convergence gauge then holds the partition's length)."""
    stuck_checkpoint: Window = Window(0.30, 0.38)
    drift_rising_from: float = 0.70
    eviction_at: float = 0.50
    preemptions: tuple[Preemption, ...] = PREEMPTIONS
    rollback_mode: str = "shadow"
    """The rollback playbook's mode: in shadow, the regression gets a shadow run."""
    freeze_paused: Window = Window(0.57, 0.61)
    """A human paused freeze_and_replay: the staleness alert is skipped (paused); the freeze
    that follows the resume runs."""
    reroute_refire: Window = Window(0.60, 0.61)
    """The latency alert fires again within the hour: the reroute is skipped, over budget."""
    restore_after: float = 0.02
    """The reroute job waits (deferred) this long after the breach before it restores."""

    def regression_alerting(self, share: float) -> bool:
        """True while the two-signal rollback gate fires (a while into the regression)."""
        return (
            self.accuracy_regression.holds(share) and share > self.accuracy_regression.start + 0.03
        )


@dataclass
class _Family:
    name: str
    kind: str
    series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = field(
        default_factory=dict
    )

    def add(self, labels: dict[str, str], when: float, value: float) -> None:
        key = tuple(sorted(labels.items()))
        self.series.setdefault(key, []).append((when, value))


def _weibull_cdf(bound: float, scale: float, shape: float = 2.0) -> float:
    return 1.0 - math.exp(-((bound / scale) ** shape))


def _weibull_mean(scale: float, shape: float = 2.0) -> float:
    return scale * math.gamma(1 + 1 / shape)


class _Histogram:
    """Cumulative bucket counts of one label set, fed with request counts of a Weibull latency."""

    def __init__(
        self,
        fam: Callable[[str, str], _Family],
        name: str,
        labels: dict[str, str],
        buckets: Iterable[float],
    ) -> None:
        self.buckets = fam(name, "histogram")
        self.count, self.sum_ = fam(f"{name}_count", "part"), fam(f"{name}_sum", "part")
        self.labels = labels
        self.bounds = sorted(buckets)
        self.counts = [0.0] * len(self.bounds)
        self.total = 0.0
        self.seconds = 0.0

    def observe(self, when: float, requests: float, scale: float) -> None:
        """Add `requests` observations whose latency follows a Weibull of `scale` seconds."""
        for index, bound in enumerate(self.bounds):
            self.counts[index] += requests * _weibull_cdf(bound, scale)
        self.total += requests
        self.seconds += requests * _weibull_mean(scale)
        for bound, count in zip(self.bounds, self.counts, strict=True):
            self.buckets.add({**self.labels, "le": number(bound)}, when, count)
        self.buckets.add({**self.labels, "le": "+Inf"}, when, self.total)
        self.count.add(self.labels, when, self.total)
        self.sum_.add(self.labels, when, self.seconds)


class _Counters:
    """Cumulative counters, each written into its family at every step it is added to."""

    def __init__(self, fam: Callable[[str, str], _Family]) -> None:
        self.fam = fam
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def add(
        self, name: str, labels: dict[str, str], when: float, amount: float, kind: str = "counter"
    ) -> None:
        """Add `amount` to the counter `name` (a counter's family name, without `_total`)."""
        key = (name, tuple(sorted(labels.items())))
        self.values[key] = self.values.get(key, 0.0) + amount
        self.fam(name, kind).add(labels, when, self.values[key])

    def add_exposed(self, name: str, labels: dict[str, str], when: float, amount: float) -> None:
        """Add to a counter by the name an engine exposes: `x_total` is a counter's sample, any
        other name (TGI's `tgi_request_count`, a histogram's `_sum`) an untyped series."""
        if name.endswith("_total"):
            self.add(name.removesuffix("_total"), labels, when, amount)
        else:
            self.add(name, labels, when, amount, "untyped")


class _GatewayTraffic:
    """redline's gateway in the path: the catalog's request series with every route (reroutes
    included) and version, and its token and TTFT series."""

    def __init__(self, spec: Spec, fam: Callable[[str, str], _Family], counters: _Counters) -> None:
        src = spec.sources.resolve()
        self.spec, self.counters, self.model = spec, counters, MODEL
        self.fam = fam
        self.breaker_open = False  # the primary's breaker opens for the latency breach
        self.requests = src.required_name("requests").removesuffix("_total")
        self.errors = src.required_name("errors").removesuffix("_total")
        primary, *others = spec.regions
        fallback = others[0] if others else primary
        routes = [(primary, primary, "false"), (primary, fallback, "true")]
        routes += [(region, region, "false") for region in others]
        routes += [(region, primary, "true") for region in others]
        self.histograms = {
            (route, version): _Histogram(
                fam,
                src.required_name("request_duration"),
                {
                    "region": route[0],
                    "served_region": route[1],
                    "rerouted": route[2],
                    "model": MODEL,
                    "model_version": version,
                    "status": "200",
                },  # fmt: skip
                src.buckets,
            )
            for route in routes
            for version in ("v1", "v2")
        }
        self.ttft = {
            (region, version): _Histogram(
                fam,
                catalog.LLM_TIME_TO_FIRST_TOKEN_SECONDS.name,
                {"served_region": region, "model": MODEL, "model_version": version},
                TTFT_BUCKETS,
            )
            for region in spec.regions
            for version in ("v1", "v2")
        }

    def step(self, now: float, step: float, active: str, breach: bool, regressed: bool) -> None:
        """Every label set is published at every step (zero once idle)."""
        primary = self.spec.regions[0]
        count = self.counters.add
        for (route, version), hist in self.histograms.items():
            origin, _, rerouted = route
            rps = 40.0 if origin == primary else 25.0
            reroute_share = 0.20 if breach and origin == primary else 0.02
            share_of_route = reroute_share if rerouted == "true" else 1 - reroute_share
            requests = rps * step * share_of_route if version == active else 0.0
            scale = 0.25 if rerouted == "false" else 0.34
            if breach and origin == primary and rerouted == "false":
                scale = 0.45
            if regressed:
                scale *= 1.25
            hist.observe(now, requests, scale)
            labels = dict(hist.labels)
            count(self.requests, labels, now, requests)
            error_rate = 0.004 if breach and origin == primary else 0.0004
            count(self.errors, labels, now, requests * error_rate)
        for source_region in self.spec.regions:
            for target in self.spec.regions:
                if source_region != target:
                    moved = 40.0 * step * 0.18 if breach and source_region == primary else 0.3
                    reroute = {"from_region": source_region, "to_region": target,
                               "reason": "first_byte_budget"}  # fmt: skip
                    count(catalog.LLM_REROUTES_TOTAL.family, reroute, now, moved)
        self._breakers(now, breach)
        for (region, version), hist in self.ttft.items():
            requests = (30.0 if region == primary else 20.0) * step if version == active else 0.0
            hist.observe(now, requests, 0.12 if not breach else 0.2)
            tokens = {"served_region": region, "model": MODEL, "model_version": version}
            count(catalog.LLM_GENERATED_TOKENS_TOTAL.family, tokens, now, requests * 42)
            count(catalog.LLM_PROMPT_TOKENS_TOTAL.family, tokens, now, requests * 230)

    def _breakers(self, now: float, breach: bool) -> None:
        """Each region's breaker state and transitions: the primary's is open while it breaches."""
        primary = self.spec.regions[0]
        moves = (("closed", "open"), ("open", "half_open"), ("half_open", "closed"))
        moved = breach != self.breaker_open
        self.breaker_open = breach
        for region in self.spec.regions:
            current = "open" if breach and region == primary else "closed"
            for state in ("closed", "open", "half_open"):
                labels = {"region": region, "state": state}
                value = 1.0 if state == current else 0.0
                self.fam(catalog.LLM_GATEWAY_BREAKER_STATE.name, "gauge").add(labels, now, value)
            for before, after in moves:
                labels = {"region": region, "from": before, "to": after}
                # Opening counts closed -> open; closing counts open -> half_open -> closed.
                hit = moved and region == primary and (after == "open") == breach
                self.counters.add(
                    catalog.LLM_GATEWAY_BREAKER_TRANSITIONS_TOTAL.family,
                    labels,
                    now,
                    1.0 if hit else 0.0,
                )


_MATCHER = re.compile(r'^\s*(\w+)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')
_OPTIONAL_GROUP = re.compile(r"\((.*?)\)\?")


def _parse_matcher(matcher: str) -> tuple[str, str, str]:
    """`label`, operator and value of one PromQL label matcher."""
    found = _MATCHER.match(matcher)
    if found is None:
        raise ValueError(f"cannot read the label matcher {matcher!r}")
    return found.group(1), found.group(2), found.group(3)


def _matching_value(op: str, value: str) -> str | None:
    """A label value the matcher selects (None: the label absent)."""
    if op == "=":
        return value or None
    if op in ("!=", "!~"):
        return "other" if value == "error" else "error"
    # A regex: each alternative with its optional groups taken, then left out (enough for the
    # profiles' handler matchers, e.g. `/v1/(chat/)?completions` or `/v1/a|/v1/b`).
    for alternative in value.split("|"):
        for candidate in (
            _OPTIONAL_GROUP.sub(r"\1", alternative),
            _OPTIONAL_GROUP.sub("", alternative),
        ):
            if re.fullmatch(value, candidate):
                return candidate
    raise ValueError(f"no sample value for the regex matcher {value!r}")


def _other_value(op: str, value: str) -> str | None:
    """A label value the matcher does not select (None: the label absent)."""
    if op in ("!=", "!~"):
        return value or None
    if re.fullmatch(r"\dxx", value):
        return "2xx"  # status classes (prometheus-fastapi-instrumentator): a success
    return "200" if value.isdigit() else "ok"


def _labels_matching(matchers: Iterable[str], unmatched: Iterable[str] = ()) -> dict[str, str]:
    """Labels selected by every one of `matchers` and by none of `unmatched`."""
    labels: dict[str, str] = {}
    for matcher in unmatched:
        label, op, value = _parse_matcher(matcher)
        other = _other_value(op, value)
        if other is not None:
            labels[label] = other
    for matcher in matchers:
        label, op, value = _parse_matcher(matcher)
        chosen = _matching_value(op, value)
        if chosen is not None:
            labels[label] = chosen
    return labels


class _EngineTraffic:
    """An engine profile's own series (`redline.slo.sources.PROFILES`): its names, labels and
    latency buckets, served where the request arrived (no gateway: no reroute) and with no
    version label (the rules join the snapshot registry's active version)."""

    def __init__(self, spec: Spec, fam: Callable[[str, str], _Family], counters: _Counters) -> None:
        src = spec.sources.resolve()
        profile = src.profile
        self.spec, self.src, self.counters = spec, src, counters
        self.model = profile.model or MODEL
        duration = src.series("request_duration")
        requests, errors = src.series("requests"), src.series("errors")
        if duration is None or requests is None or errors is None:
            raise ValueError(f"the {profile.name} profile lacks a latency, request or error series")
        self.requests, self.errors = requests, errors
        self.request_labels = _labels_matching(requests.matchers)
        # OpenTelemetry counts operations with the duration histogram's own `_count`: its
        # successes and errors are told apart on the histogram itself.
        self.counted = f"{duration.names[0]}_count"
        split = self.counted in (*requests.names, *errors.names)
        outcomes = {"ok": self._ok_labels(self.counted), "error": self._error_labels(self.counted)}
        self.histograms: dict[tuple[str, str], _Histogram] = {}
        self.ttft: dict[str, _Histogram] = {}
        self.fam = fam
        saturation = profile.saturation
        self.waits: dict[str, _Histogram] = {}
        ttft = src.series("time_to_first_token")
        for region in spec.regions:
            base = {**self.base(region), **_labels_matching(duration.matchers)}
            for outcome in ("ok", "error") if split else ("all",):
                extra = outcomes.get(outcome, {})
                self.histograms[region, outcome] = _Histogram(
                    fam, duration.names[0], {**base, **extra}, src.buckets
                )
            if ttft is not None:
                labels = {**self.base(region), **_labels_matching(ttft.matchers)}
                self.ttft[region] = _Histogram(fam, ttft.names[0], labels, TTFT_BUCKETS)
            if "queue_time" in saturation:
                name = saturation["queue_time"].names[0]
                self.waits[region] = _Histogram(fam, name, self.base(region), src.buckets)

    def _error_labels(self, name: str) -> dict[str, str]:
        """Labels an error carries on request counter `name`."""
        return _labels_matching([*self.requests.matchers_of(name), *self.errors.matchers_of(name)])

    def _ok_labels(self, name: str) -> dict[str, str]:
        """Labels a success carries on request counter `name` (no error matcher holds)."""
        own = self.requests.matchers_of(name)
        return _labels_matching(own, [m for m in self.errors.matchers_of(name) if m not in own])

    def base(self, region: str, model: bool = True) -> dict[str, str]:
        """The engine's region and model labels (`profile.labels`) for `region`."""
        mapping = self.src.profile.labels
        labels = {mapping.get("region", "region"): region}
        if model and "model" in mapping:
            labels[mapping["model"]] = self.model
        return labels

    def step(self, now: float, step: float, active: str, breach: bool, regressed: bool) -> None:
        """One step of every region's requests, errors, latency, tokens and TTFT."""
        del active  # engines publish no version: the rules join it
        primary = self.spec.regions[0]
        add = self.counters.add_exposed
        # A request counter without a model label says so in the profile (errors_by_model).
        counter_base = "errors_by_model" not in self.src.profile.missing
        for region in self.spec.regions:
            requests = (40.0 if region == primary else 25.0) * step
            errors = requests * (0.004 if breach and region == primary else 0.0004)
            scale = 0.45 if breach and region == primary else 0.25
            scale *= 1.25 if regressed else 1.0
            if (region, "all") in self.histograms:
                self.histograms[region, "all"].observe(now, requests, scale)
            else:
                self.histograms[region, "ok"].observe(now, requests - errors, scale)
                self.histograms[region, "error"].observe(now, errors, scale)
            base = self.base(region, counter_base)
            for index, name in enumerate(self.errors.names):
                if name != self.counted:
                    # Every error on the first error series (vLLM: finished with an error; its
                    # admission rejections stay at 0).
                    labels = {**base, **self._error_labels(name)}
                    add(name, labels, now, errors if index == 0 else 0.0)
            for name in self.requests.names:
                if name == self.counted:
                    continue  # the histogram's own count, observed above (OpenTelemetry)
                if name not in self.errors.names:
                    # One counter of every request (SGLang, TGI) holds the errors too; one
                    # beside the error counter (NIM's successes) holds the rest.
                    whole = len(self.requests.names) == 1
                    labels = {**base, **self.request_labels}
                    add(name, labels, now, requests if whole else requests - errors)
                elif self._ok_labels(name) != self._error_labels(name):
                    # One counter told apart by labels (vLLM's finished_reason): the successes.
                    add(name, {**base, **self._ok_labels(name)}, now, requests - errors)
                # Otherwise it is an error counter itself (NIM's failures), added above.
            streamed = (30.0 if region == primary else 20.0) * step
            if region in self.ttft:
                self.ttft[region].observe(now, streamed, 0.12 if not breach else 0.2)
            for signal, per_request in (("generated_tokens", 42), ("prompt_tokens", 230)):
                found = self.src.series(signal)
                if found is None:
                    continue
                labels = {**self.base(region), **_labels_matching(found.matchers)}
                for name in found.names:
                    add(name, labels, now, streamed * per_request / len(found.names))
            self._saturation(now, region, requests, breach and region == primary)

    def _saturation(self, now: float, region: str, requests: float, breach: bool) -> None:
        """The engine's saturation series (its profile's): during the breach its queue and
        waits grow and its KV cache fills, so the warning's panels move before the red line."""
        saturation = self.src.profile.saturation
        labels = self.base(region)
        gauges = {"queue": 6.0 if breach else 0.0, "running": 16.0 if breach else 6.0,
                  "kv_cache": 0.97 if breach else 0.4}  # fmt: skip
        for signal, value in gauges.items():
            if signal in saturation:
                self.fam(saturation[signal].names[0], "gauge").add(labels, now, value)
        if "preemptions" in saturation:
            name = saturation["preemptions"].names[0]
            self.counters.add_exposed(name, labels, now, 0.02 * requests if breach else 0.0)
        if region in self.waits:
            self.waits[region].observe(now, requests, 0.5 if breach else 0.01)


def _active_alerts(  # noqa: PLR0913 - the spot alerts need the time, not only the share
    spec: Spec,
    scenario: Scenario,
    share: float,
    now: float,
    start: float,
    end: float,
    step: float,
    model: str = MODEL,
) -> list[dict[str, str]]:
    """Label sets of the alerts firing at `share`, with each rule's own static labels."""
    static = {rule.alert: rule.labels for group in build_rule_groups(spec) for rule in group.alerts}
    firing: list[dict[str, str]] = []

    def fire(alert: str, **labels: str) -> None:
        firing.append({"alertname": alert, "alertstate": "firing", **static[alert], **labels})

    if scenario.latency_breach.holds(share):
        fire(Alert.RED_LINE_LATENCY_P99, region=spec.regions[0])
    if scenario.stale_index.holds(share):
        fire(Alert.RED_LINE_INDEX_STALENESS, collection=COLLECTION, replica=DRIFT_REPLICA)
    if scenario.cdc_lag.holds(share):
        fire(Alert.SESSION_RPO_BREACH, stream=STREAM, group=GROUP)
    if scenario.crdt_partition.holds(share):
        for source, target in itertools.permutations(spec.regions[:2], 2):
            fire(Alert.SESSION_CRDT_RPO_BREACH, source_region=source, target_region=target)
        fire(Alert.SESSION_CRDT_DIVERGENCE)
    if scenario.stuck_checkpoint.holds(share):
        fire(Alert.LORA_CHECKPOINT_RPO_BREACH, adapter=ADAPTERS[0])
    if scenario.regression_alerting(share):
        fire(Alert.SEMANTIC_ROLLBACK_TWO_SIGNAL, model=model, model_version="v2")
    if QUOTA_BURST.holds(share):
        fire(Alert.QUOTA_THROTTLING_SUSTAINED, tenant=QUOTA_TRAFFIC[0][0])
    if share > 0.92:
        fire(Alert.EMBEDDING_DRIFT, collection=COLLECTION, method="mmd")
    for spot in scenario.preemptions:
        elapsed = spot.elapsed(now, start, end)
        node = {"node": spot.node, "provider": spot.provider}
        if 0 <= elapsed < step:
            fire(Alert.SPOT_PREEMPTION_NOTICE, **node)
        slow = spot.to_draining_seconds > spec.spot.notice_to_draining_p95_seconds
        if slow and 0 <= elapsed < parse_duration(spec.spot.alert_window):
            fire(Alert.SPOT_NOTICE_TO_DRAINING_SLOW)
        waited = elapsed - spot.drain_seconds
        if spot.state(elapsed) == "terminating" and waited > spec.spot.notice_for(spot.provider):
            fire(Alert.SPOT_REPLACEMENT_SLOW, **node)
    for slo in spec.slos:
        if slo.sli.kind == "slow_requests" and scenario.latency_breach.holds(share):
            firing.append(
                {
                    "alertname": slo.burn_alert_name,
                    "alertstate": "firing",
                    "severity": "page",
                    "slo": slo.name,
                }
            )
    return firing


def build_sample_openmetrics(  # noqa: C901 - one pass over time keeps every counter consistent
    spec: Spec,
    start: float,
    end: float,
    step: float = 30.0,
    scenario: Scenario | None = None,
) -> str:
    """OpenMetrics text of every catalog series from `start` to `end` (Unix seconds)."""
    if end <= start or step <= 0:
        raise ValueError(f"need start < end and step > 0, got {start}, {end}, {step}")
    scenario = scenario or Scenario()
    fams: dict[str, _Family] = {}

    def fam(name: str, kind: str) -> _Family:
        return fams.setdefault(name, _Family(name, kind))

    runs_hist = {
        playbook: _Histogram(
            fam,
            catalog.REDLINE_REMEDIATION_DURATION_SECONDS.name,
            {"playbook": playbook},
            RUN_BUCKETS,
        )
        for playbook in RUN_PLAYBOOKS
    }
    notice_hist = {
        spot.node: _Histogram(
            fam,
            catalog.LLM_SPOT_NOTICE_TO_DRAINING_SECONDS.name,
            {"node": spot.node, "provider": spot.provider},
            SPOT_NOTICE_BUCKETS,
        )
        for spot in scenario.preemptions
    }
    recovery_hist = {
        mode: _Histogram(
            fam,
            catalog.LLM_NODE_FAILURE_RECOVERY_SECONDS.name,
            {catalog.LABEL_RECOVERY_MODE: mode},
            catalog.LLM_NODE_FAILURE_RECOVERY_SECONDS.buckets,
        )
        for mode in catalog.RECOVERY_MODES
    }
    counters = _Counters(fam)
    traffic: _GatewayTraffic | _EngineTraffic = (
        _EngineTraffic(spec, fam, counters)
        if spec.sources.resolve().mirrored
        else _GatewayTraffic(spec, fam, counters)
    )
    model = traffic.model

    def count(name: str, labels: dict[str, str], when: float, amount: float) -> None:
        counters.add(name, labels, when, amount)

    def gauge(name: str, labels: dict[str, str], when: float, value: float) -> None:
        fam(name, "gauge").add(labels, when, value)

    last_checkpoint = dict.fromkeys(ADAPTERS, start)
    pending, oldest_pending_since = 0.0, None
    run_events: list[tuple[float, str, str, float]] = []
    restore = Window(scenario.latency_breach.end + scenario.restore_after, 2.0)
    # (when, playbook, outcome, seconds, delivered): `delivered` when an alert delivery starts
    # the run, not a deferred step of a job already running.
    incidents: list[tuple[Callable[[float], bool], str, str, float, bool]] = [
        # The reroute job waits for the restore (deferred) and succeeds then.
        (restore.holds, "reroute", "succeeded", 4.2, False),
        (scenario.latency_breach.holds, "reroute", "", 0.0, True),  # the job that waits
        (scenario.reroute_refire.holds, "reroute", "over_budget", 0.0, True),
        (scenario.stale_index.holds, "freeze_and_replay", "paused", 0.0, True),
        (scenario.write_freeze.holds, "freeze_and_replay", "succeeded", 38.0, True),
        (scenario.regression_alerting, "semantic_rollback", scenario.rollback_mode, 2.0, True),
    ]
    was_on = [False] * len(incidents)
    job_started: dict[str, float] = {}  # playbook -> creation time of its unfinished job
    held = 0.0  # delta-log entries kept for the retention window (level once trimming runs)
    diverged_since: float | None = None
    convergence = 0.0  # the last divergence's length, as the session_crdt probe reports it
    steps = int((end - start) // step) + 1
    quota_errors: dict[str, list[float]] = {}
    for index in range(steps):
        now = start + index * step
        share = (now - start) / (end - start)
        active = "v1" if share < scenario.version_switch else "v2"
        breach = scenario.latency_breach.holds(share)
        regressed = active == "v2" and scenario.accuracy_regression.holds(share)
        traffic.step(now, step, active, breach, regressed)
        for region in spec.regions:
            for probe in ("healthz", "chat_dry_run"):
                failing = breach and region == spec.regions[0] and probe == "chat_dry_run"
                probe_labels = {"region": region, "probe": probe}
                gauge(catalog.LLM_PROBE_SUCCESS.name, probe_labels, now, 0.0 if failing else 1.0)
                gauge(
                    catalog.LLM_PROBE_DURATION_SECONDS.name,
                    probe_labels,
                    now,
                    0.9 if failing else 0.08,
                )
        # Accuracy on the golden set and the versions' verified baselines.
        for version, (accuracy, p99) in {"v1": (0.90, 0.55), "v2": (0.905, 0.52)}.items():
            labels = {"model": model, "model_version": version}
            evals = 2.0 * step if version == active else 0.0
            measured = accuracy - 0.025 if regressed and version == "v2" else accuracy
            count(catalog.LLM_EVAL_REQUESTS_TOTAL.family, labels, now, evals)
            count(catalog.LLM_EVAL_CORRECT_TOTAL.family, labels, now, evals * measured)
            gauge(catalog.MODEL_BASELINE_P99_SECONDS.name, labels, now, p99)
            gauge(catalog.MODEL_BASELINE_ACCURACY_RATIO.name, labels, now, accuracy)
        info = {"model": model, "version": active, "weights_hash": f"sha256-{active}-w",
                "config_hash": f"sha256-{active}-c"}  # fmt: skip
        gauge(catalog.MODEL_ACTIVE_INFO.name, info, now, 1.0)
        for adapter in ADAPTERS:
            stuck = adapter == ADAPTERS[0] and scenario.stuck_checkpoint.holds(share)
            if not stuck and now - last_checkpoint[adapter] >= 60:
                last_checkpoint[adapter] = now
            checkpoint = catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS.name
            gauge(checkpoint, {"adapter": adapter}, now, last_checkpoint[adapter])
        # Vector index: a stale replica, then a freeze whose writes pile up in the delta log.
        replica = {"collection": COLLECTION, "replica": DRIFT_REPLICA}
        stale = scenario.stale_index.holds(share)
        staleness = 4.0 + 16.0 * (share - scenario.stale_index.start) / 0.06 if stale else 1.5
        gauge(
            catalog.VECTORDB_INDEX_STALENESS_SECONDS.name,
            replica,
            now,
            staleness + (index % 4) * 0.3,
        )
        frozen = scenario.write_freeze.holds(share)
        gauge(
            catalog.VECTORDB_WRITE_FROZEN.name,
            {"collection": COLLECTION},
            now,
            1.0 if frozen else 0.0,
        )
        replayed = 0.0
        if frozen or stale:
            pending += 3.0 * step
            oldest_pending_since = oldest_pending_since or now
        else:
            replayed, pending = pending, 0.0
            oldest_pending_since = None
        gauge(catalog.VECTORDB_DELTA_LOG_PENDING_ENTRIES.name, replica, now, pending)
        # What the log holds: the retention window's writes (filling up, then trimmed level)
        # plus the backlog no checkpoint has passed yet.
        held = min(held + WRITES_PER_SECOND * step, WRITES_PER_SECOND * RETENTION_SECONDS)
        entries = held + pending + (index % 7) * 3.0
        collection = {"collection": COLLECTION}
        gauge(catalog.VECTORDB_DELTA_LOG_ENTRIES.name, collection, now, entries)
        memory = STREAM_BASE_BYTES + entries * BYTES_PER_ENTRY
        gauge(catalog.VECTORDB_DELTA_LOG_MEMORY_BYTES.name, collection, now, memory)
        age = now - oldest_pending_since if oldest_pending_since is not None else 0.0
        gauge(catalog.VECTORDB_DELTA_LOG_OLDEST_PENDING_AGE_SECONDS.name, replica, now, age)
        count(catalog.VECTORDB_DELTA_LOG_REPLAYED_TOTAL.family, replica, now, replayed)
        # Sessions.
        lag = 5.5 if scenario.cdc_lag.holds(share) else 0.3 + (index % 5) * 0.1
        gauge(catalog.SESSION_CDC_RPO_SECONDS.name, {"stream": STREAM, "group": GROUP}, now, lag)
        gauge(catalog.SESSION_CONTEXT_TTL_SECONDS.name, {}, now, 1800.0)
        gauge(catalog.SESSION_KEEPALIVE_PROBE_SUCCESS.name, {}, now, 1.0)
        # CRDT sessions: a partition cuts the sync both ways; the regions converge at the heal.
        cut = scenario.crdt_partition.holds(share)
        if cut and diverged_since is None:
            diverged_since = now
        elif not cut and diverged_since is not None:
            convergence, diverged_since = now - diverged_since, None
        for source, target in itertools.permutations(spec.regions[:2], 2):
            crdt_lag = now - diverged_since if diverged_since is not None else 0.2
            directed = {"source_region": source, "target_region": target}
            gauge(catalog.SESSION_CRDT_SYNC_LAG_SECONDS.name, directed, now, crdt_lag)
        gauge(catalog.SESSION_CRDT_DIVERGENT_SESSIONS.name, {}, now, 6.0 if cut else 0.0)
        gauge(catalog.SESSION_CRDT_CONVERGENCE_SECONDS.name, {}, now, convergence)
        evicted = 1.0 if abs(share - scenario.eviction_at) < step / (end - start) / 2 else 0.0
        count(catalog.SESSION_CONTEXT_EVICTED_TOTAL.family, {}, now, evicted)
        # Drift creeping up past the calibrated threshold.
        drift = {"collection": COLLECTION, "method": spec.drift.method}
        rise = max(0.0, share - scenario.drift_rising_from) / (1 - scenario.drift_rising_from)
        gauge(
            catalog.EMBEDDING_DRIFT_SCORE.name,
            drift,
            now,
            spec.drift.threshold * (0.4 + 0.9 * rise),
        )
        gauge(catalog.EMBEDDING_DRIFT_THRESHOLD.name, drift, now, spec.drift.threshold)
        gauge(catalog.EMBEDDING_DRIFT_WINDOW_SAMPLES.name, {"collection": COLLECTION}, now,
              float(spec.drift.window))  # fmt: skip
        # The remediation receiver: one firing and one resolved delivery per incident, each
        # delivered twice by the Alertmanager HA pair; a finished run per incident.
        for slot, (holds, playbook, outcome, seconds, delivered) in enumerate(incidents):
            on = holds(share)
            if on != was_on[slot] and delivered:
                status = "firing" if on else "resolved"
                count(catalog.REDLINE_WEBHOOK_ALERTS_TOTAL.family, {"status": status}, now, 2.0)
                count(catalog.REDLINE_WEBHOOK_DUPLICATES_TOTAL.family, {}, now, 1.0)
            if on and not was_on[slot] and outcome:
                run_events.append((now + seconds, playbook, outcome, seconds))
            was_on[slot] = on
        for status in ("firing", "resolved"):
            count(catalog.REDLINE_WEBHOOK_ALERTS_TOTAL.family, {"status": status}, now, 0.0)
        count(catalog.REDLINE_WEBHOOK_DUPLICATES_TOTAL.family, {}, now, 0.0)
        if scenario.latency_breach.holds(share):
            job_started.setdefault("reroute", now)
        elif restore.holds(share):
            job_started.pop("reroute", None)
        # Every known playbook's outcomes from the start, as the receiver exposes them.
        for playbook in PLAYBOOK_NAMES:
            done = [e for e in run_events if e[1] == playbook and now - step < e[0] <= now]
            for outcome in RUN_OUTCOMES:
                finished = sum(1.0 for e in done if e[2] == outcome)
                run = {"playbook": playbook, "outcome": outcome}
                count(catalog.REDLINE_REMEDIATION_RUNS_TOTAL.family, run, now, finished)
            if playbook in runs_hist:
                timed = [e for e in done if e[2] not in catalog.SKIP_OUTCOMES]  # skips take no time
                runs_hist[playbook].observe(now, float(len(timed)), timed[0][3] if timed else 1.0)
            _guard_step(spec, scenario, playbook, share, now, job_started, gauge)
        # The audit trail, verified every minute: three records per delivered incident change.
        audited = 3.0 * sum(1 for e in run_events if e[0] - e[3] <= now)
        verified_at = now - now % 60
        for copy in ("redis", "file"):
            gauge(catalog.REDLINE_AUDIT_CHAIN_INTACT.name, {"copy": copy}, now, 1.0)
            gauge(catalog.REDLINE_AUDIT_RECORDS.name, {"copy": copy}, now, audited)
        gauge(catalog.REDLINE_AUDIT_VERIFIED_TIMESTAMP_SECONDS.name, {}, now, verified_at)
        for probe in PROBES:
            gauge(catalog.REDLINE_PROBE_SUCCESS.name, {"probe": probe}, now, 1.0)
            gauge(
                catalog.REDLINE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS.name,
                {"probe": probe},
                now,
                now,
            )
            gauge(catalog.REDLINE_PROBE_DURATION_SECONDS.name, {"probe": probe}, now, 0.02)
        for spot in scenario.preemptions:
            _spot_step(spot, spot.elapsed(now, start, end), now, step, gauge, count,
                       notice_hist[spot.node])  # fmt: skip
        for mode, (at, seconds) in GPU_RECOVERIES.items():
            happened = at <= share < at + step / (end - start)
            recovery_hist[mode].observe(now, 1.0 if happened else 0.0, seconds)
        quota_errors = _quota_step(share, now, step, count, gauge, fam, quota_errors)
        for alert in _active_alerts(spec, scenario, share, now, start, end, step, model):
            gauge("ALERTS", alert, now, 1.0)
    return "".join(render_openmetrics(_families(fams)))


def _guard_step(  # noqa: PLR0913 - one playbook's gauges at one step
    spec: Spec,
    scenario: Scenario,
    playbook: str,
    share: float,
    now: float,
    job_started: dict[str, float],
    gauge: Callable[[str, dict[str, str], float, float], None],
) -> None:
    """The receiver's guard-rail gauges of one playbook: mode, pause, breaker, unfinished jobs."""
    labels = {"playbook": playbook}
    current = scenario.rollback_mode if playbook == "semantic_rollback" else "act"
    mode = catalog.REDLINE_REMEDIATION_MODE
    for value in catalog.REMEDIATION_MODES:
        gauge(mode.name, {**labels, mode.labels[1]: value}, now, float(value == current))
    paused = playbook == "freeze_and_replay" and scenario.freeze_paused.holds(share)
    gauge(catalog.REDLINE_REMEDIATION_PAUSED.name, labels, now, float(paused))
    gauge(catalog.REDLINE_REMEDIATION_BREAKER_OPEN.name, labels, now, 0.0)
    age = now - job_started[playbook] if playbook in job_started else 0.0
    late = age > spec.remediation.policy(playbook).deadline_seconds
    gauge(catalog.REDLINE_REMEDIATION_JOBS_OVERDUE.name, labels, now, float(late))
    gauge(catalog.REDLINE_REMEDIATION_OLDEST_JOB_AGE_SECONDS.name, labels, now, age)


def _spot_step(  # noqa: PLR0913 - one node's series at one step
    spot: Preemption,
    elapsed: float,
    now: float,
    step: float,
    gauge: Callable[[str, dict[str, str], float, float], None],
    count: Callable[[str, dict[str, str], float, float], None],
    notice: _Histogram,
) -> None:
    """What the node's spot agent and the gateways publish `elapsed` s after its notice."""
    node = {"node": spot.node}
    state = spot.state(elapsed)
    for value in SPOT_NODE_STATES:
        gauge(
            catalog.LLM_NODE_STATE.name,
            {**node, "state": value},
            now,
            1.0 if value == state else 0.0,
        )
    noticed = 0 <= elapsed < step
    regenerated = 0 <= elapsed - step < step
    notice.observe(now, 1.0 if noticed else 0.0, spot.to_draining_seconds)
    gauge(
        catalog.LLM_SPOT_NOTICE_PENDING.name,
        {**node, "provider": spot.provider},
        now,
        float(noticed),
    )
    waited = elapsed - spot.drain_seconds
    if waited >= 0:
        latency = min(waited, spot.replacement_seconds)
        ready = catalog.LLM_SPOT_REPLACEMENT_READY_LATENCY_SECONDS.name
        gauge(ready, {**node, "provider": spot.provider}, now, latency)
    if elapsed >= 0:
        gauge(catalog.LLM_SPOT_INFLIGHT_ABORTED_RATIO.name, node, now, spot.aborted / spot.inflight)
    aborted = float(spot.aborted) if noticed else 0.0
    continued = float(spot.inflight - spot.aborted) if noticed else 0.0
    count(
        catalog.LLM_SPOT_TRIAGED_REQUESTS_TOTAL.family, {**node, "decision": "abort"}, now, aborted
    )
    count(
        catalog.LLM_SPOT_TRIAGED_REQUESTS_TOTAL.family,
        {**node, "decision": "continue"},
        now,
        continued,
    )
    count(
        catalog.LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL.family,
        {**node, "recoverable": "true"},
        now,
        aborted,
    )
    count(
        catalog.LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL.family,
        {**node, "recoverable": "false"},
        now,
        0.0,
    )
    wasted = {
        "aborted_unserved": 0.7 * spot.wasted_tokens if noticed else 0.0,
        "regenerated": 0.3 * spot.wasted_tokens if regenerated else 0.0,
        "not_recoverable": 0.0,
    }
    for reason, tokens in wasted.items():
        count(
            catalog.LLM_SPOT_WASTED_DECODE_TOKENS_TOTAL.family,
            {**node, "reason": reason},
            now,
            tokens,
        )


QUOTA_TRAFFIC = (
    # tenant, intent, requests per second, throttled share in the burst
    ("acme", "summarise", 2.0, 0.6),
    ("acme", "sql", 0.5, 0.0),
    ("globex", "chat", 4.0, 0.0),
)
QUOTA_BURST = Window(0.4, 0.6)
"""When the sample's tenant `acme` overruns its summarisation quota."""
ESTIMATE_SHIFT = 0.05
"""The sample's estimate errors: a Weibull of scale 0.1 shifted down by this much."""


def _quota_step(  # noqa: PLR0913 - the quota series at one step
    share: float,
    now: float,
    step: float,
    count: Callable[[str, dict[str, str], float, float], None],
    gauge: Callable[[str, dict[str, str], float, float], None],
    fam: Callable[[str, str], _Family],
    errors: dict[str, list[float]],
) -> dict[str, list[float]]:
    """What the gateways' quota gate publishes at one step (a summarisation burst of `acme`)."""
    burst = QUOTA_BURST.holds(share)
    for tenant, intent, rps, throttled_share in QUOTA_TRAFFIC:
        requests = rps * step
        throttled = requests * throttled_share if burst else 0.0
        downgraded = throttled / 2 if intent == "summarise" else 0.0
        outcomes = {
            "admitted": requests - throttled - downgraded if intent != "chat" else 0.0,
            "throttled": throttled,
            "downgraded": downgraded,
            "unlimited": requests if intent == "chat" else 0.0,
        }
        for outcome, amount in outcomes.items():
            labels = {"tenant": tenant, "intent": intent, "outcome": outcome}
            count(catalog.LLM_QUOTA_REQUESTS_TOTAL.family, labels, now, amount)
            count(catalog.LLM_QUOTA_TOKENS_TOTAL.family, labels, now, amount * 600)
        pair = {"tenant": tenant, "intent": intent}
        count(catalog.LLM_QUOTA_REFUNDED_TOKENS_TOTAL.family, pair, now, requests * 120)
        gauge(catalog.LLM_QUOTA_UTILISATION_RATIO.name, pair, now, 1.1 if burst else 0.4)
    for action in ("fail_open", "fail_closed"):
        count(catalog.LLM_QUOTA_STORE_FAILURES_TOTAL.family, {"action": action}, now, 0.0)
    metric = catalog.LLM_TOKEN_ESTIMATE_ERROR_RATIO
    bounds = metric.buckets
    for kind in ("prompt", "total"):
        cumulative = errors.setdefault(kind, [0.0] * (len(bounds) + 2))
        requests = 6.5 * step
        for index, bound in enumerate(bounds):
            shifted = bound + ESTIMATE_SHIFT
            cumulative[index] += requests * (_weibull_cdf(shifted, 0.1) if shifted > 0 else 0.0)
        cumulative[-2] += requests
        cumulative[-1] += requests * (_weibull_mean(0.1) - ESTIMATE_SHIFT)
        labels = {"intent": "chat", "kind": kind}
        buckets = fam(metric.name, "histogram")
        for bound, value in zip(bounds, cumulative, strict=False):
            buckets.add({**labels, "le": number(bound)}, now, value)
        buckets.add({**labels, "le": "+Inf"}, now, cumulative[-2])
        fam(metric.count, "part").add(labels, now, cumulative[-2])
        fam(metric.sum, "part").add(labels, now, cumulative[-1])
    return errors


def _families(fams: dict[str, _Family]) -> Iterator[Family]:
    """The collected families for the renderer; a histogram's `_count` and `_sum` parts are
    written under its own `# TYPE`, a counter's samples end in `_total`."""
    for name, family in fams.items():
        if family.kind == "part":
            continue
        parts: list[tuple[str, _Family]] = []
        if family.kind == "histogram":
            parts.append((f"{name}_bucket", family))
            parts.extend((f"{name}{suffix}", fams[name + suffix]) for suffix in ("_count", "_sum"))
        else:
            suffix = "_total" if family.kind == "counter" else ""
            parts.append((name + suffix, family))
        series = [
            Series(metric, labels, points)
            for metric, part in parts
            for labels, points in part.series.items()
        ]
        yield Family(name, None if family.kind == "untyped" else family.kind, series)
