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
`hold_down` waits until `reroute.hold_down_seconds` after the alert's `endsAt` (renewing the job's
lease), then `restore` probes the region `reroute.healthy_checks` times in a row and only then
clears the override; a region still unhealthy keeps the override and raises a transient error, so
the job retries and finally fails loudly. An override that was cleared or changed by someone else
is left alone. Each step checks the state first, so re-running after a crash is harmless. The
hold-down occupies a worker thread while it waits: run more than one worker.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import redis

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
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookError,
    StepResult,
    TransientError,
)
from redline.remediation.settings import RerouteSettings, ServingSettings

_EPOCH_FLOOR = datetime(1970, 1, 2, tzinfo=UTC)


def build_candidates(upstreams: Sequence[str], region: str) -> list[str]:
    """The regions to reroute `region`'s traffic to, in failover order."""
    return [r for r in upstreams if r != region]


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

    def __init__(self, options: RerouteSettings, serving: ServingSettings, redis_url: str) -> None:
        self.options = options
        self.serving = serving
        self.redis_url = options.redis_url or redis_url

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

    # ---- firing ------------------------------------------------------------------------------

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """Probe the other regions (dry run) and pick the first healthy one."""
        region = self._region(ctx)
        current = self._override()
        probes: dict[str, dict[str, Any]] = {}
        chosen: str | None = None
        if current is not None and current.target_region != region:
            check = self._probe(current.target_region)
            probes[current.target_region] = check.as_dict()
            if check.healthy:
                chosen = current.target_region
        if chosen is None:
            for candidate in build_candidates(list(self.serving.upstreams), region):
                if candidate in probes:
                    continue
                check = self._probe(candidate)
                probes[candidate] = check.as_dict()
                if check.healthy:
                    chosen = candidate
                    break
        if chosen is None:
            detail = "; ".join(f"{r}: {p['detail']}" for r, p in probes.items()) or "none"
            raise TransientError(f"no healthy region to take {region}'s traffic ({detail})")
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
        if not check.healthy:
            raise TransientError(f"{target} became unhealthy before the switch: {check.detail}")
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
        """Hold down, then restore, if the override is still the one the firing job set."""
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
        return (
            PlannedStep(
                "hold_down",
                f"wait until {deadline:.3f} ({self.options.hold_down_seconds:g} s after the "
                f"alert ended) before restoring {region}",
                {"region": region, "until": deadline},
            ),
            PlannedStep(
                "restore",
                f"when {region} passes {self.options.healthy_checks} dry-run probes in a row, "
                f"clear the override to {firing_to}",
                {"region": region, "expect": firing_to},
            ),
        )

    def resolve(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Wait out the hold-down, or restore the routing once the region is healthy."""
        if step.name == "hold_down":
            until = float(step.params["until"])
            while (remaining := until - time.time()) > 0:
                ctx.ensure_lease()
                time.sleep(min(remaining, 0.5))
            return StepResult.success(f"held down until {until:.3f}", until=until)
        if step.name != "restore":
            return StepResult.failure(f"{self.name}: unknown resolve step {step.name!r}")
        region, expect = str(step.params["region"]), step.params.get("expect")
        override = self._override()
        if expect is None or override is None or override.target_region != expect:
            now = override.target_region if override else None
            return StepResult.success(
                f"nothing restored: the override routes to {now}", override=now, restored=False
            )
        checks = []
        for index in range(self.options.healthy_checks):
            if index:
                time.sleep(self.options.poll_seconds)
            ctx.ensure_lease()
            check = self._probe(region)
            checks.append(check.as_dict())
            if not check.healthy:
                raise TransientError(
                    f"{region} is still unhealthy ({check.detail}); the override to {expect} stays"
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
        ctx.record("probes", f"{region} healthy {len(checks)} times in a row", checks=checks)
        return StepResult.success(
            f"override to {expect} cleared: the gateway routes in its configured order again "
            f"({region} healthy)",
            restored=True,
            region=region,
        )


__all__ = ["Reroute", "build_candidates", "hold_down_deadline"]
