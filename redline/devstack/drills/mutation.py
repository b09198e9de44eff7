"""The mutation drill: the adapter's serving version answers a canary differently in one region
-> OutputConsistencyMutation with the diff -> rollback_candidate records it; a merely
reformatted accepted answer in the other region raises nothing.

The fault is the simulator's per-version wrong-answer knob (probability 1) on the last region's
pods: the golden prompts, which the built-in canaries are, get their known wrong answer there.
Before it, the accepted answer of one canary in the first region is replaced by a reformatted
one (case, punctuation, spacing and an equivalent spelling: `six` for `6`), which the
normalisation must see as the same answer. The spec's `rollback.on_mutation` decides whether a
rollback follows too (by default it does not: the drill checks no rollback job appeared)."""

from __future__ import annotations

import time

from redline.devstack.drills.base import DrillError, DrillResult
from redline.devstack.drills.context import DrillContext
from redline.devstack.drills.waits import (
    budget_for,
    job_matches,
    last_verify,
    require_quiet,
    run_playbook_loop,
    wait_firing,
    wait_recovered,
)
from redline.devstack.layout import ADAPTER
from redline.exporters.mutation import Accepted, AcceptedStore
from redline.platform.sessions import open_redis
from redline.rules.families.mutation import CANDIDATE_PLAYBOOK, MIN_CHANGES, MUTATION_FOR_SECONDS
from redline.slo import catalog
from redline.slo.alerts import Alert

CANARY = "capital-france"
"""The canary whose answer mutates (the simulator's wrong answer: "I believe it is Lyon.")."""
REFORMATTED = "hexagon"
REFORMATTED_TEXT = "  a HEXAGON has   six sides!!! "
"""The accepted answer planted for the reformatted control: the model says "A hexagon has 6
sides." (case, punctuation, spacing and the canary's `six` = `6` equivalence differ)."""
ROLLBACK_ALERT = Alert.OUTPUT_CONSISTENCY_MUTATION_ROLLBACK


def _set_wrong(ctx: DrillContext, region: str, version: str, on: bool) -> None:
    current = ctx.probe.faults(region)
    versions = dict(current.get("versions") or {})
    if on:
        versions[version] = {**(versions.get(version) or {}), "wrong_answer_probability": 1.0}
    else:
        versions.pop(version, None)
    ctx.probe.set_faults(region, {**current, "versions": versions})


def _selector(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def drill_mutation(ctx: DrillContext) -> DrillResult:
    """One version's canary answer mutates in one region -> candidate recorded; a reformatted
    answer elsewhere -> nothing."""
    spec = ctx.spec
    regions = ctx.endpoints.regions
    faulty, steady = regions[-1], regions[0]
    result = DrillResult("mutation", Alert.OUTPUT_CONSISTENCY_MUTATION, CANDIDATE_PLAYBOOK,
                         budget_for(ctx, MUTATION_FOR_SECONDS))  # fmt: skip
    version = ctx.probe.served_versions().get(faulty, "")
    if not version or version.startswith("mixed"):
        raise DrillError(f"{faulty} serves no single {ADAPTER} version ({version or 'none'})")
    labels = {"model": ADAPTER, "model_version": version, "region": faulty, "prompt": CANARY}
    control = {**labels, "region": steady, "prompt": REFORMATTED}
    require_quiet(ctx, result, labels)
    changes = catalog.LLM_OUTPUT_CONSISTENCY_CHANGES

    def measured() -> bool | None:
        both = [ctx.probe.value(f"{changes}{_selector(x)}") for x in (labels, control)]
        return True if all(v == 0 for v in both) else None

    ctx.wait_for(result.drill, "both canaries measured and unchanged", measured, 60.0, 0.5)
    client = open_redis(ctx.endpoints.redis_url, 2.0)
    store = AcceptedStore(client)
    original: Accepted | None = store.accepted(ADAPTER, version, steady, REFORMATTED)
    rollback_jobs = {job["id"] for job in ctx.probe.jobs(str(spec.rollback.playbook))}
    try:
        planted_at = time.time()
        store.accept(ADAPTER, version, steady, REFORMATTED, REFORMATTED_TEXT, planted_at)
        ctx.say(result.drill, f"planted a reformatted accepted answer for {REFORMATTED} in "
                f"{steady}: {REFORMATTED_TEXT.strip()!r}")  # fmt: skip
        result.fault = f"{ADAPTER} {version} answers every golden canary wrongly in {faulty}"
        result.fault_at = time.time()
        _set_wrong(ctx, faulty, version, True)
        ctx.say(result.drill, f"fault injected: {result.fault}")
        result.condition_basis = (
            f"the exporter's next run of output_mutation_{faulty} asks the canary (every "
            "few seconds); first sample of the changes gauge over the threshold, less a scrape"
        )
        alert = wait_firing(ctx, result, labels, 60.0).get("labels") or {}
        job = run_playbook_loop(ctx, result, labels, 60.0)
        onset = ctx.probe.query_range(
            f"{changes}{_selector(labels)} >= {MIN_CHANGES}", result.fault_at, time.time(), 0.5
        )
        if onset:
            scrape = spec.timing.scrape_interval_seconds
            result.condition_delay = max(0.0, onset[0][0] - scrape - result.fault_at)
        diff = alert.get("diff", "")
        result.check("the alert carries the diff", "lyon" in diff and "paris" in diff, diff)
        verify = last_verify(job)
        candidate = ((verify.get("data") or {}).get("candidate") or {}) if verify else {}
        evidence = (candidate.get("evidence") or {}).get(f"{faulty}/{CANARY}") or {}
        result.check(
            "flagged as a rollback candidate",
            candidate.get("model_version") == version and bool(evidence.get("diff")),
            f"{candidate.get('model')} {candidate.get('model_version')} "
            f"{candidate.get('status')}: {evidence.get('diff')}",
        )

        def control_measured() -> float | None:
            last = ctx.probe.value(
                f"{catalog.REDLINE_PROBE_LAST_SUCCESS_TIMESTAMP_SECONDS}"
                f'{{probe="output_mutation_{steady}"}}'
            )
            if last is None or last <= planted_at:
                return None
            return ctx.probe.value(f"{changes}{_selector(control)}")

        seen = ctx.wait_for(result.drill, f"a run of {steady} after the plant", control_measured,
                            30.0, 0.5)  # fmt: skip
        still = store.accepted(ADAPTER, version, steady, REFORMATTED)
        result.check(
            "a reformatted answer is no mutation",
            seen == 0 and not ctx.probe.alerts(result.alert, {"region": steady}),
            f"{REFORMATTED} in {steady}: {seen:g} changed tokens against "
            f"{still.text.strip() if still else None!r}",
        )
        new_rollbacks = [
            j for j in ctx.probe.jobs(str(spec.rollback.playbook))
            if j["id"] not in rollback_jobs and job_matches(j, ROLLBACK_ALERT, {"model": ADAPTER})
        ]  # fmt: skip
        if spec.rollback.on_mutation:
            result.notes.append(f"rollback.on_mutation: {len(new_rollbacks)} rollback job(s)")
        else:
            result.check("no rollback without the gate (on_mutation off)", not new_rollbacks,
                         f"{len(new_rollbacks)} {spec.rollback.playbook} job(s)")  # fmt: skip
    finally:
        _set_wrong(ctx, faulty, version, False)
        if original is not None:
            store.accept(ADAPTER, version, steady, REFORMATTED, original.text, original.at)
        client.close()
    result.remediated_at = result.remediated_at or time.time()
    result.lost_detail = "n/a: a changed answer loses no data"
    result.notes.append("the fault is lifted by the drill: recording a candidate changes nothing")
    wait_recovered(ctx, result, labels, 60.0)
    return result


__all__ = ["drill_mutation"]
