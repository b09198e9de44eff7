"""`reroute`: send the gateway's traffic to the next healthy region, and back after resolution.

Target: the alert's `region` label (the region in trouble). Regions and their upstreams come
from `serving.upstreams` (failover order); the gateway reads its routing override from the
routing store in Redis (`redline.platform.routing`), which is what this playbook writes.

Firing:
- plan (read only): dry-run probe (`POST /v1/chat/completions?dry-run=true`) each other region's
  upstream in order and pick the first healthy one; an override that already points at a healthy
  other region is kept. No healthy region is a transient failure (retried with backoff, then the
  job fails and pages).
- `set_override`: probe the chosen region again and point the override at it (idempotent).
- verify: a dry-run request through the gateway must be answered by the chosen region as the
  gateway's first choice (`x-redline-served-region` = the region, `x-redline-rerouted` = false),
  polled until `reroute.verify_timeout_seconds` since the gateway refreshes its routing state
  periodically.

Resolved (`plan_resolve`): if the override still points where the firing job put it,
- `hold_down` (read only) waits until `reroute.hold_down_seconds` after the alert's `endsAt`, as a
  deferred step: the job waits on the delayed queue, no worker is held;
- `restore` hands the traffic back only when the region is healthy *by the red line*: its
  measured latency stays under `restore.below_ratio` x `threshold_seconds` of the spec's
  `red_lines.latency_p99` without a break for `restore.for_seconds` (hysteresis: the alert fires
  above the threshold, the traffic returns only well under it, and only after a sustained
  period). Each check takes `reroute.healthy_checks` dry-run probes of the region (every one
  must answer 200 under the limit) and, with `reroute.prometheus_url`, reads the exporter's
  latest dry-run probe duration of the region and the region's recorded P99 (when it has one:
  none while the override takes all its traffic); Prometheus unreachable counts as not healthy.
  A region still slow keeps the override: the step defers again every
  `reroute.restore_check_seconds` (recording only when what it sees changes), the job stays
  `waiting`, never failed; `RemediationStuck` pages once it is past the playbook's deadline.
  The step remembers since when the region has been healthy across deferrals (any worker
  continues it; a worker killed meanwhile changes nothing).
An override that was cleared or changed by someone else is left alone. Each step checks the state
first, so re-running after a crash is harmless.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Self

import httpx
import redis

from redline.platform.prometheus import PrometheusClient, PrometheusError
from redline.platform.routing import (
    REROUTED_HEADER,
    SERVED_REGION_HEADER,
    RoutingError,
    RoutingOverride,
    RoutingStore,
)
from redline.platform.serving import (
    HealthCheck,
    ServingError,
    check_health,
    dry_run,
    http_client,
    probe_model,
)
from redline.remediation.playbook import (
    Deferred,
    NoOptions,
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookError,
    RegistryError,
    StepResult,
    TransientError,
)
from redline.remediation.settings import RemediationSettings, RerouteSettings, ServingSettings
from redline.rules.records import p99_record
from redline.slo import catalog
from redline.slo.load import SpecError, apply_profile, load_spec
from redline.slo.spec import Spec

_EPOCH_FLOOR = datetime(1970, 1, 2, tzinfo=UTC)


def build_candidates(upstreams: Sequence[str], region: str) -> list[str]:
    """The regions to reroute `region`'s traffic to, in failover order."""
    return [r for r in upstreams if r != region]


def build_health_queries(spec: Spec, region: str) -> dict[str, str]:
    """PromQL of the region's measured latency: the exporter's latest dry-run probe duration
    and the recorded P99 of the requests first routed to it."""
    selector = f'{catalog.LABEL_REGION}="{region}"'
    return {
        "exporter_probe": f"max({catalog.LLM_PROBE_DURATION_SECONDS}{{{selector}, "
        f'{catalog.LABEL_PROBE}="chat_dry_run"}})',
        "recorded_p99": f"max({p99_record(spec)}{{{selector}}})",
    }


@dataclass(frozen=True)
class RegionHealth:
    """One check of a region against the restore limit: healthy or not, why, the figures."""

    healthy: bool
    detail: str
    latency_seconds: float | None
    data: Mapping[str, Any] = field(default_factory=dict)


def build_region_health(
    limit: float,
    probes: Sequence[HealthCheck],
    measured: Mapping[str, float | None],
    prometheus_error: str | None = None,
) -> RegionHealth:
    """Judge a region: every probe answered under `limit`, every Prometheus figure (when
    present) under it, and Prometheus readable when configured."""
    problems: list[str] = []
    figures: dict[str, float] = {}
    for index, probe in enumerate(probes):
        figures[f"probe_{index + 1}"] = round(probe.seconds, 4)
        if not probe.healthy:
            problems.append(f"probe {index + 1}: {probe.detail}")
        elif probe.seconds > limit:
            problems.append(f"probe {index + 1} took {probe.seconds:.3f} s > {limit:g} s")
    for name, value in measured.items():
        if value is None or not math.isfinite(value):
            continue
        figures[name] = round(value, 4)
        if value > limit:
            problems.append(f"{name.replace('_', ' ')} {value:.3f} s > {limit:g} s")
    if prometheus_error is not None:
        problems.append(f"Prometheus unreadable: {prometheus_error}")
    worst = max(figures.values(), default=None)
    data = {"limit_seconds": limit, "figures": figures, "probes": [p.as_dict() for p in probes]}
    if problems:
        return RegionHealth(False, "; ".join(problems), worst, data)
    shown = ", ".join(f"{k} {v:.3f} s" for k, v in figures.items())
    return RegionHealth(True, f"all under {limit:g} s ({shown})", worst, data)


def hold_down_deadline(ends_at: datetime, hold_down: float, now: float) -> float:
    """When the hold-down after a resolution ends (unix time): `endsAt` + hold-down, never
    later than now + hold-down (a clock ahead of ours) and counted from now without `endsAt`."""
    if ends_at <= _EPOCH_FLOOR:
        return now + hold_down
    return min(ends_at.timestamp() + hold_down, now + hold_down)


class Reroute(Playbook):
    """Point the gateway's routing override at the next healthy region; restore it later."""

    name = "reroute"
    target_label = "region"

    def __init__(
        self,
        options: RerouteSettings,
        serving: ServingSettings,
        redis_url: str,
        spec: Spec | None = None,
    ) -> None:
        self.options = options
        self.serving = serving
        self.redis_url = options.redis_url or redis_url
        self.spec = spec if spec is not None else load_spec(None).spec
        red = self.spec.red_lines.latency_p99
        self.limit_seconds = red.threshold_seconds * red.restore.below_ratio
        self.threshold_seconds = red.threshold_seconds
        self.restore_for_seconds = (
            options.restore_for_seconds
            if options.restore_for_seconds is not None
            else red.restore.for_seconds
        )

    @classmethod
    def from_settings(cls, settings: RemediationSettings, options: NoOptions) -> Self:
        """The reroute on `settings.reroute` and `settings.serving`, its restore limits from the
        spec (with the settings' profile); RegistryError naming the spec's problems."""
        try:
            spec = apply_profile(load_spec(settings.spec).spec, settings.profile)
        except SpecError as exc:
            raise RegistryError("playbooks: the spec: " + "; ".join(exc.problems)) from None
        return cls(settings.reroute, settings.serving, settings.redis_url, spec)

    def settings_problems(self) -> Sequence[str]:
        """serving.upstreams (two regions or more) and serving.gateway_url are required."""
        problems = []
        if not self.serving.upstreams:
            problems.append(
                "serving.upstreams is not set (the regions to move traffic between, in "
                "failover order)"
            )
        elif len(self.serving.upstreams) < 2:
            problems.append("serving.upstreams names one region; a reroute needs two or more")
        if not self.serving.gateway_url:
            problems.append("serving.gateway_url is not set (the gateway the reroute verifies)")
        return problems

    # ---- helpers -----------------------------------------------------------------------------

    def _region(self, ctx: PlaybookContext) -> str:
        region = ctx.labels[self.target_label].strip()
        if not self.serving.upstreams:
            raise PlaybookError(f"{self.name}: not configured: set serving.upstreams")
        if not self.serving.gateway_url:
            raise PlaybookError(f"{self.name}: not configured: set serving.gateway_url")
        if region not in self.serving.upstreams:
            raise PlaybookError(
                f"{self.name}: region {region!r} is not among serving.upstreams "
                f"({', '.join(self.serving.upstreams)})"
            )
        return region

    def _store(self) -> RoutingStore:
        return RoutingStore.from_url(
            self.redis_url,
            self.options.key_prefix,
            tuple(self.serving.upstreams),
            timeout_seconds=max(2.0, self.serving.timeout_seconds),
        )

    def _override(self) -> RoutingOverride | None:
        store = self._store()
        try:
            return store.get_override()
        except RoutingError as exc:
            raise PlaybookError(f"routing store: {exc}") from None
        except redis.RedisError as exc:
            raise TransientError(f"routing store: {type(exc).__name__}: {exc}") from exc
        finally:
            store.close()

    def _probe(self, region: str) -> HealthCheck:
        with http_client(self.serving.timeout_seconds) as client:
            return check_health(client, self.serving.upstreams[region], self.serving.probe_model)

    def _takes_traffic(self, check: HealthCheck) -> bool:
        """A region may take traffic only when it answers, and within the red line: an answer
        that is merely 200 but slow would send the traffic back to a slow region (a flap)."""
        return check.healthy and check.seconds <= self.threshold_seconds

    def _measure(self, ctx: PlaybookContext, region: str) -> RegionHealth:
        """Probe the region up to `healthy_checks` times (timing the dry run alone; the first
        bad probe ends the check) and read its figures from Prometheus when configured."""
        base = self.serving.upstreams[region]
        probes: list[HealthCheck] = []
        with http_client(self.serving.timeout_seconds) as client:
            try:
                model = probe_model(client, base, self.serving.probe_model)
            except (ServingError, TransientError, httpx.HTTPError) as exc:
                probes.append(HealthCheck(base, False, f"no model to probe: {exc}", 0.0, {}))
            else:
                for index in range(self.options.healthy_checks):
                    if index:
                        time.sleep(self.options.poll_seconds)
                    ctx.ensure_lease()
                    probe = check_health(client, base, model)
                    probes.append(probe)
                    if not probe.healthy or probe.seconds > self.limit_seconds:
                        break  # one bad probe settles this check
        measured: dict[str, float | None] = {}
        error: str | None = None
        if self.options.prometheus_url:
            try:
                with PrometheusClient(
                    self.options.prometheus_url, timeout=self.serving.timeout_seconds
                ) as prometheus:
                    for name, query in build_health_queries(self.spec, region).items():
                        rows = prometheus.instant(query)
                        measured[name] = rows[0][1] if rows else None
            except PrometheusError as exc:
                error = str(exc)
        return build_region_health(self.limit_seconds, probes, measured, error)

    # ---- firing ------------------------------------------------------------------------------

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """Probe the other regions (dry run) and pick the first that answers within the red
        line."""
        region = self._region(ctx)
        current = self._override()
        probes: dict[str, dict[str, Any]] = {}
        chosen: str | None = None
        if current is not None and current.target_region != region:
            check = self._probe(current.target_region)
            probes[current.target_region] = check.as_dict()
            if self._takes_traffic(check):
                chosen = current.target_region
        if chosen is None:
            for candidate in build_candidates(list(self.serving.upstreams), region):
                if candidate in probes:
                    continue
                check = self._probe(candidate)
                probes[candidate] = check.as_dict()
                if self._takes_traffic(check):
                    chosen = candidate
                    break
        if chosen is None:
            detail = "; ".join(f"{r}: {p['detail']}" for r, p in probes.items()) or "none"
            raise TransientError(
                f"no healthy region to take {region}'s traffic (none answered within the "
                f"{self.threshold_seconds:g} s red line: {detail})"
            )
        already = current is not None and current.target_region == chosen
        return (
            PlannedStep(
                "set_override",
                f"gateway override already routes to {chosen} first"
                if already
                else f"route the gateway's traffic to {chosen} first instead of {region}",
                {
                    "from": region,
                    "to": chosen,
                    "probes": probes,
                    "already": already,
                    "ttl_seconds": self.options.override_ttl_seconds,
                },
            ),  # fmt: skip
        )

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Probe the chosen region again and point the override at it (if not already)."""
        if step.name != "set_override":
            return StepResult.failure(f"{self.name}: unknown step {step.name!r}")
        region, target = str(step.params["from"]), str(step.params["to"])
        check = self._probe(target)
        ctx.record("probe", f"{target}: {check.detail}", region=target, check=check.as_dict())
        if not self._takes_traffic(check):
            raise TransientError(
                f"{target} became unhealthy or slow before the switch: {check.detail} "
                f"({check.seconds:.3f} s)"
            )
        store = self._store()
        try:
            current = store.get_override()
            if current is not None and current.target_region == target:
                return StepResult.success(
                    f"override already routes to {target}", to=target, already=True
                )
            alertname = ctx.labels.get("alertname", "alert")
            override = store.set_override(
                target,
                f"remediation job {ctx.job_id}: {alertname} in {region}",
                self.options.override_ttl_seconds,
            )
        except RoutingError as exc:
            raise PlaybookError(f"routing store: {exc}") from None
        except redis.RedisError as exc:
            raise TransientError(f"routing store: {type(exc).__name__}: {exc}") from exc
        finally:
            store.close()
        previous = current.target_region if current else None
        return StepResult.success(
            f"gateway override set: {target} first (was {previous or 'configured order'})",
            to=target,
            previous=previous,
            set_at=override.set_at,
            already=False,
        )

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """A dry run through the gateway is served by the override's region, first try."""
        region = self._region(ctx)
        override = self._override()
        if override is None or override.target_region == region:
            target = override.target_region if override else None
            return StepResult.failure(f"the override points at {target}, not away from {region}")
        target = override.target_region
        gateway = self.serving.gateway_url
        assert gateway is not None
        deadline = time.monotonic() + self.options.verify_timeout_seconds
        seen = "no answer"
        attempts = 0
        with http_client(self.serving.timeout_seconds) as client:
            try:
                model = probe_model(
                    client, self.serving.upstreams[target], self.serving.probe_model
                )
            except ServingError as exc:
                return StepResult.failure(f"{target}: {exc}")
            while True:
                attempts += 1
                try:
                    answer = dry_run(client, gateway, model)
                except TransientError as exc:
                    seen = str(exc)
                else:
                    served = answer.headers.get(SERVED_REGION_HEADER)
                    rerouted = answer.headers.get(REROUTED_HEADER)
                    seen = f"HTTP {answer.status}, served by {served}, rerouted={rerouted}"
                    if answer.status == 200 and served == target and rerouted == "false":
                        return StepResult.success(
                            f"the gateway serves from {target} first ({seen})",
                            to=target,
                            served_region=served,
                            attempts=attempts,
                        )
                if time.monotonic() >= deadline:
                    return StepResult.failure(
                        f"the gateway did not serve from {target} within "
                        f"{self.options.verify_timeout_seconds:g} s (last: {seen})",
                        to=target,
                        attempts=attempts,
                    )
                ctx.ensure_lease()
                time.sleep(self.options.poll_seconds)

    # ---- resolved ----------------------------------------------------------------------------

    def _firing_target(self, ctx: PlaybookContext) -> str | None:
        job = ctx.firing_job
        if job is None:
            return None
        for step in reversed(job.steps):
            data = step.get("data") or {}
            if step.get("phase") == "execute" and step.get("name") == "set_override":
                if step.get("ok") and isinstance(data.get("to"), str):
                    return str(data["to"])
        return None

    def plan_resolve(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """Hold down, then restore once healthy by the red line, if the override is still the
        one the firing job set."""
        region = self._region(ctx)
        override = self._override()
        firing_to = self._firing_target(ctx)
        if override is None:
            return (PlannedStep("restore", "no routing override is set: nothing to restore",
                                {"region": region, "expect": None}),)  # fmt: skip
        if firing_to is None or override.target_region != firing_to:
            why = (
                f"the override routes to {override.target_region} ({override.reason}), "
                f"not where the firing job put it ({firing_to or 'it set none'}): left alone"
            )
            return (PlannedStep("restore", why, {"region": region, "expect": None}),)
        deadline = hold_down_deadline(
            ctx.alert.ends_at, self.options.hold_down_seconds, time.time()
        )
        limit, sustain = self.limit_seconds, self.restore_for_seconds
        return (
            PlannedStep(
                "hold_down",
                f"wait until {_stamp(deadline)} ({self.options.hold_down_seconds:g} s after the "
                f"alert ended) before restoring {region}",
                {"region": region, "until": deadline},
                read_only=True,
            ),
            PlannedStep(
                "restore",
                f"once {region}'s latency stays under {limit:g} s for {sustain:g} s, clear the "
                f"override to {firing_to}",
                {
                    "region": region,
                    "expect": firing_to,
                    "limit_seconds": limit,
                    "for_seconds": sustain,
                },
            ),  # fmt: skip
        )

    def resolve(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult | Deferred:
        """Wait out the hold-down, or restore the routing once the region is healthy by the red
        line for long enough (deferring while it is not)."""
        if step.name == "hold_down":
            until = float(step.params["until"])
            remaining = until - time.time()
            if remaining > 0:
                return Deferred(remaining, f"hold-down until {_stamp(until)}", {"until": until})
            return StepResult.success(f"held down until {_stamp(until)}", until=until)
        if step.name != "restore":
            return StepResult.failure(f"{self.name}: unknown resolve step {step.name!r}")
        region, expect = str(step.params["region"]), step.params.get("expect")
        override = self._override()
        if expect is None or override is None or override.target_region != expect:
            routed = override.target_region if override else None
            return StepResult.success(
                f"nothing restored: the override routes to {routed}", override=routed,
                restored=False,
            )  # fmt: skip
        limit = float(step.params.get("limit_seconds", self.limit_seconds))
        sustain = float(step.params.get("for_seconds", self.restore_for_seconds))
        health = self._measure(ctx, region)
        now = time.time()
        seen = ctx.state.get("status")
        if not health.healthy:
            return Deferred(
                self.options.restore_check_seconds,
                f"{region} is not healthy by the red line ({health.detail}); the override to "
                f"{expect} stays",
                {"status": "slow", "healthy_since": None, "checked_at": now},
                record=seen != "slow",
            )
        raw_since = ctx.state.get("healthy_since")
        since = float(raw_since) if seen == "healthy" and raw_since is not None else now
        held = now - since
        if held < sustain:
            return Deferred(
                min(self.options.restore_check_seconds, sustain - held),
                f"{region} healthy by the red line for {held:.0f} of {sustain:g} s "
                f"({health.detail})",
                {"status": "healthy", "healthy_since": since, "checked_at": now},
                record=seen != "healthy",
            )
        store = self._store()
        try:
            current = store.get_override()
            if current is None or current.target_region != expect:
                return StepResult.success("the override changed meanwhile: left alone",
                                          restored=False)  # fmt: skip
            store.clear_override()
        except (RoutingError, redis.RedisError) as exc:
            raise TransientError(f"routing store: {type(exc).__name__}: {exc}") from exc
        finally:
            store.close()
        ctx.record("health", f"{region}: {health.detail}", **health.data)
        return StepResult.success(
            f"override to {expect} cleared after {region} stayed under {limit:g} s for "
            f"{held:.0f} s: the gateway routes in its configured order again",
            restored=True,
            region=region,
            healthy_for_seconds=round(held, 3),
            latency_seconds=health.latency_seconds,
        )


def _stamp(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds")


__all__ = [
    "RegionHealth",
    "Reroute",
    "build_candidates",
    "build_health_queries",
    "build_region_health",
    "hold_down_deadline",
]
