"""The disaster-recovery maturity assessment: four levels scored from live signals and the spec."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from redline.slo import catalog
from redline.slo.report.inputs import CrossRegionFigures, LiveSignals
from redline.slo.report.model import (
    CheckStatus,
    Maturity,
    MaturityCheck,
    MaturityLevel,
    RemediationJob,
    RemediationRow,
    SignalReport,
)
from redline.slo.report.signals import latency_includes_reroute
from redline.slo.report.text import num
from redline.slo.spec import Spec

LEVEL_NAMES = {
    0: "none",
    1: "basic availability",
    2: "semantic consistency",
    3: "state resilience",
    4: "cross-region continuity",
}


def _check(
    level: int, cid: str, requirement: str, status: CheckStatus, evidence: str
) -> MaturityCheck:
    return MaturityCheck(
        level=level, id=cid, requirement=requirement, status=status, evidence=evidence
    )


def _verified(
    playbooks: Iterable[str],
    remediation: Sequence[RemediationRow],
    jobs: Sequence[RemediationJob] | None,
) -> tuple[CheckStatus, str]:
    wanted = set(playbooks)
    runs_ok = sum(r.runs for r in remediation if r.playbook in wanted and r.outcome == "succeeded")
    runs_ok += sum(1 for j in jobs or () if j.playbook in wanted and j.outcome == "succeeded")
    names = " or ".join(sorted(wanted))
    if runs_ok >= 1:
        return "met", f"{runs_ok:g} verified run(s) of {names}"
    if not remediation and not jobs:
        return "no_data", "no remediation runs recorded in the period"
    return "not_met", f"no succeeded run of {names} in the period"


def _signal_held(
    signals: Sequence[SignalReport], key: str, wording: str
) -> tuple[CheckStatus, str]:
    found = [s for s in signals if s.key == key]
    if not found or all(s.measured_seconds == 0 for s in found):
        return "no_data", f"{wording}: not measured in the period"
    worst = [s for s in found if s.seconds_over > 0 or s.status == "fail"]
    if worst:
        s = worst[0]
        return "not_met", (
            f"{wording}: {s.seconds_over:g} s past the line, worst {s.peak:g}{s.unit} "
            f"(limit {s.threshold:g}{s.unit})"
        )
    s = found[0]
    return "met", f"{wording}: held, worst {s.peak:g}{s.unit} (limit {s.threshold:g}{s.unit})"


def _pair(figures: CrossRegionFigures, primary: str) -> str:
    return f"{figures.model} {primary} vs {figures.region}"


def cross_region_checks(spec: Spec, live: LiveSignals) -> list[MaturityCheck]:
    """Level 2's cross-instance checks: output hashes compared, and the mean embedding
    similarity of every backup's answers to the primary's at or above the spec's bar over the
    period (the lowest model/backup pair decides, with its figures as the evidence)."""
    bar = spec.maturity.semantic_similarity_min
    primary, backups = spec.regions[0], spec.regions[1:]
    hash_req = "output hashes compared across instances (primary vs every backup, canary prompts)"
    sim_req = f"primary and backup answers' embedding similarity >= {num(bar)} over the period"
    if not backups:
        why = f"the spec names one region ({primary}): no backup to compare with"
        return [
            _check(2, "output_hash", hash_req, "not_met", why),
            _check(2, "embedding_similarity", sim_req, "not_met", why),
        ]
    hashed = [f for f in live.cross_region if f.agreement_ratio is not None]
    uncovered = sorted(set(backups) - {f.region for f in hashed})
    if not hashed:
        hash_status: CheckStatus = "no_data"
        hash_evidence = (
            f"{catalog.LLM_CROSS_REGION_OUTPUT_AGREEMENT_RATIO} absent "
            "(the exporter's consistency probe is off: consistency.enabled)"
        )
    elif uncovered:
        hash_status = "not_met"
        hash_evidence = f"no output-hash comparison for backup region(s) {', '.join(uncovered)}"
    else:
        worst = min(hashed, key=lambda f: f.agreement_ratio or 0.0)
        hash_status = "met"
        hash_evidence = (
            f"{catalog.LLM_CROSS_REGION_OUTPUT_AGREEMENT_RATIO}: lowest {_pair(worst, primary)} "
            f"{worst.agreement_ratio or 0.0:.1%} of answers identical"
        )
    scored = [f for f in live.cross_region if f.similarity_mean is not None]
    uncovered = sorted(set(backups) - {f.region for f in scored})
    if not scored:
        sim_status: CheckStatus = "no_data"
        sim_evidence = (
            f"{catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY} absent "
            "(the exporter's consistency probe is off: consistency.enabled)"
        )
    elif uncovered:
        sim_status = "not_met"
        sim_evidence = f"no similarity measured for backup region(s) {', '.join(uncovered)}"
    else:
        worst = min(scored, key=lambda f: f.similarity_mean or 0.0)
        mean = worst.similarity_mean or 0.0
        sim_status = "met" if mean >= bar else "not_met"
        lowest = (
            f"; lowest single answer {worst.similarity_min:.3f}"
            if worst.similarity_min is not None
            else ""
        )
        sim_evidence = (
            f"{catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY}: lowest {_pair(worst, primary)} "
            f"{mean:.3f} {'>=' if sim_status == 'met' else '<'} {num(bar)}{lowest}"
        )
    return [
        _check(2, "output_hash", hash_req, hash_status, hash_evidence),
        _check(2, "embedding_similarity", sim_req, sim_status, sim_evidence),
    ]


def build_maturity(
    spec: Spec,
    signals: Sequence[SignalReport],
    remediation: Sequence[RemediationRow],
    jobs: Sequence[RemediationJob] | None,
    live: LiveSignals,
) -> Maturity:
    """Score the four disaster-recovery levels from live signals and the spec."""
    checks: list[MaturityCheck] = []
    regions = set(spec.regions)
    for probe, label in (("healthz", "health"), ("chat_dry_run", "dry-run")):
        seen = set(live.probes.get(probe, frozenset()))
        missing = sorted(regions - seen)
        status: CheckStatus = "met" if not missing else ("no_data" if not seen else "not_met")
        evidence = (
            f'{catalog.LLM_PROBE_SUCCESS}{{probe="{probe}"}} on {", ".join(sorted(seen))}'
            if not missing
            else f"no {probe} probe series for region(s) {', '.join(missing)}"
        )
        checks.append(
            _check(1, f"{probe}_probes", f"{label} probes on every region", status, evidence)
        )
    measured_any = any(live.probes.values())
    failing = sorted(live.probes_failing_at_end)
    checks.append(
        _check(
            1,
            "self_recovery",
            "failed parts came back by themselves (every probe succeeding at the period's end)",
            "no_data" if not measured_any else ("not_met" if failing else "met"),
            f"still failing: {', '.join(failing)}" if failing else "all probes succeeding",
        )
    )
    evals = live.golden_evaluations
    checks.append(
        _check(
            2,
            "golden_set",
            "outputs compared on the golden set per model version",
            "no_data" if evals is None else ("met" if evals > 0 else "not_met"),
            f"{catalog.LLM_EVAL_REQUESTS_TOTAL} absent"
            if evals is None
            else f"{evals:.0f} golden-set evaluations in the period",
        )
    )
    checks.extend(cross_region_checks(spec, live))
    status_, evidence_ = _verified([spec.rollback.playbook], remediation, jobs)
    checks.append(
        _check(2, "rollback_verified", "rollbacks verified on the golden set", status_, evidence_)
    )
    for cid, key, wording in (
        (
            "session_rpo",
            "rpo_session_state",
            f"session CDC RPO <= {num(spec.rpo.session_state.max_seconds)} s",
        ),
        (
            "keepalive",
            "context_keepalive",
            f"context keep-alive >= {num(spec.red_lines.context_keepalive.min_seconds)} s",
        ),
        (
            "index_rpo",
            "rpo_embedding_index",
            f"index RPO <= {num(spec.rpo.embedding_index.max_seconds)} s",
        ),
        (
            "lora_rpo",
            "rpo_lora_adapter",
            f"LoRA checkpoints within {num(spec.rpo.lora_adapter.max_seconds)} s",
        ),
    ):
        st, ev = _signal_held(signals, key, wording)
        checks.append(_check(3, cid, wording, st, ev))
    lora = spec.rpo.lora_adapter
    interval = lora.checkpoint_interval_seconds
    spec_ok = interval is None or interval <= lora.max_seconds
    checks.append(
        _check(
            3,
            "lora_interval",
            "the spec checkpoints LoRA adapters at least as often as their RPO",
            "met" if spec_ok else "not_met",
            f"checkpoint interval {num(interval or 0)} s vs RPO {num(lora.max_seconds)} s"
            if interval is not None
            else "no checkpoint interval set",
        )
    )
    st, ev = _verified(["delta_log_replay", "freeze_and_replay"], remediation, jobs)
    checks.append(_check(3, "replay_verified", "index replays verified", st, ev))
    lat = spec.red_lines.latency_p99
    reroute = latency_includes_reroute(spec)
    multi = len(spec.regions) >= 2 and reroute
    profile = spec.sources.resolve().profile
    # An engine profile measures latency inside the engine: the spec's includes_reroute cannot
    # make it see a reroute, so the evidence names the source, not just the flag.
    measured = (
        f"includes_reroute={lat.includes_reroute}"
        if profile.includes_reroute
        else f"sources.profile {profile.name} measures latency without cross-region reroutes"
    )
    checks.append(
        _check(
            4,
            "regions",
            "two or more regions, latency measured end to end incl. reroute",
            "met" if multi else "not_met",
            f"regions {', '.join(spec.regions)}; {measured}",
        )
    )
    st, ev = _verified(["reroute"], remediation, jobs)
    checks.append(_check(4, "reroute_verified", "reroute verified", st, ev))
    st, ev = _signal_held(
        signals, "latency_p99", f"P99 incl. reroute <= {num(lat.threshold_seconds)} s"
    )
    if not profile.includes_reroute:
        st, ev = "no_data", f"not measurable with sources.profile {profile.name}"
    checks.append(
        _check(4, "latency", f"P99 incl. reroute <= {num(lat.threshold_seconds)} s", st, ev)
    )
    red = [s for s in signals if s.kind == "red_line"]
    failing_lines = [s.key for s in red if s.status in ("fail", "warn")]
    unmeasured = [s.key for s in red if s.status == "no_data"]
    red_status: CheckStatus = (
        "not_met" if failing_lines else ("no_data" if unmeasured or not red else "met")
    )
    red_evidence = (
        f"crossed: {', '.join(failing_lines)}"
        if failing_lines
        else (f"not measured: {', '.join(unmeasured)}" if unmeasured else "every red line held")
    )
    checks.append(_check(4, "red_lines", "every red line held", red_status, red_evidence))
    # An aborted stream that resumed elsewhere is recoverable; only a request the client could
    # not complete (`recoverable="false"`) breaks the promise.
    spot = live.spot_unrecoverable
    checks.append(
        _check(
            4,
            "spot_drain",
            "spot preemptions drained with no unrecoverable client error",
            "no_data" if spot is None else ("met" if round(spot) == 0 else "not_met"),
            f"{catalog.LLM_SPOT_INTERRUPTED_REQUESTS_TOTAL} absent"
            if spot is None
            else f"{spot:.0f} unrecoverable interruption(s)",
        )
    )
    holds = {lvl: all(c.status == "met" for c in checks if c.level == lvl) for lvl in range(1, 5)}
    level = 0
    for lvl in range(1, 5):
        if not holds[lvl]:
            break
        level = lvl
    next_level = level + 1 if level < 4 else None
    missing = [
        f"{c.requirement} ({'not measured' if c.status == 'no_data' else 'not met'}: {c.evidence})"
        for c in checks
        if next_level is not None and c.level == next_level and c.status != "met"
    ]
    return Maturity(
        level=level,
        level_name=LEVEL_NAMES[level],
        next_level=next_level,
        missing_for_next=missing,
        levels=[
            MaturityLevel(level=lvl, name=LEVEL_NAMES[lvl], holds=holds[lvl]) for lvl in range(1, 5)
        ],
        checks=checks,
    )
