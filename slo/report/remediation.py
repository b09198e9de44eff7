"""The report's remediation story: what each playbook did in the period, what shadow mode would
have done, what the guard rails skipped, and which playbooks were not plainly acting.

Runs come from the increases of `redline_remediation_runs_total` by playbook, outcome and time;
what a run was about comes from the alert routed to its playbook (`ALERTS{playbook=...}`) that
was firing when the run ended. Pure: the events and incidents in, model rows out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from redline.slo import catalog
from redline.slo.report.inputs import GuardState, RunEvent, Window
from redline.slo.report.model import ActionKind, Incident, RemediationAction, RemediationGuard
from redline.slo.report.text import num, utc
from redline.slo.spec import Spec

_SKIP_WORDS = {
    outcome: "skipped, mode off"
    if outcome == catalog.MODE_OFF
    else f"skipped, {outcome.replace('_', ' ')}"
    for outcome in catalog.SKIP_OUTCOMES
}


@dataclass(frozen=True)
class Verb:
    """How a playbook's action reads: infinitive, past tense and past participle, each a format
    string over the alert's labels (`{model}`, `{region}`, ...; missing ones read generically)."""

    infinitive: str
    past: str
    participle: str


VERBS: Mapping[str, Verb] = {
    "semantic_rollback": Verb(
        "roll back {model} {model_version}",
        "rolled back {model} {model_version}",
        "rolled back {model} {model_version}",
    ),
    "reroute": Verb(
        "reroute traffic away from {region}",
        "rerouted traffic away from {region}",
        "rerouted traffic away from {region}",
    ),
    "freeze_and_replay": Verb(
        "freeze writes to {collection} and replay the delta log onto {replica}",
        "froze writes to {collection} and replayed the delta log onto {replica}",
        "frozen writes to {collection} and replayed the delta log onto {replica}",
    ),
    "freeze_writes": Verb(
        "freeze writes to {collection}",
        "froze writes to {collection}",
        "frozen writes to {collection}",
    ),
    "delta_log_replay": Verb(
        "replay the delta log of {collection} onto {replica}",
        "replayed the delta log of {collection} onto {replica}",
        "replayed the delta log of {collection} onto {replica}",
    ),
    "spot_drain": Verb(
        "drain spot node {node}", "drained spot node {node}", "drained spot node {node}"
    ),
}

_GENERIC = {
    catalog.LABEL_MODEL: "the model",
    catalog.LABEL_REGION: "the region",
    catalog.LABEL_COLLECTION: "the collection",
    catalog.LABEL_REPLICA: "the replica",
    catalog.LABEL_NODE: "",  # "drain spot node", not a made-up name
}


class _Labels(dict[str, str]):
    """Format arguments: an alert's labels, generic words for the ones it lacks."""

    def __missing__(self, key: str) -> str:
        return _GENERIC.get(key, key)


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def kind_of(outcome: str) -> ActionKind:
    """Which kind of action an outcome is."""
    if outcome in catalog.ACTED_OUTCOMES:
        return "acted"
    if outcome == catalog.OUTCOME_SHADOW:
        return "shadow"
    if outcome in catalog.SKIP_OUTCOMES:
        return "skipped"
    if outcome == catalog.OUTCOME_DRY_RUN:
        return "dry_run"
    return "other"


def describe(playbook: str, outcome: str, labels: Mapping[str, str], alert: str | None) -> str:
    """What a run did or would have done, e.g. `would have rolled back chat v2`."""
    verb = VERBS.get(playbook)
    args = _Labels(labels)
    if verb is None:
        about = f" for {alert}" if alert else ""
        verb = Verb(f"run {playbook}{about}", f"ran {playbook}{about}", f"run {playbook}{about}")
    if catalog.LABEL_MODEL_VERSION not in labels:
        args[catalog.LABEL_MODEL_VERSION] = ""  # "rolled back chat", not a made-up version
    infinitive = verb.infinitive.format_map(args).strip()
    match outcome:
        case catalog.OUTCOME_SUCCEEDED:
            return verb.past.format_map(args).strip()
        case catalog.OUTCOME_FAILED:
            return f"tried to {infinitive}"
        case catalog.OUTCOME_SHADOW:
            return f"would have {verb.participle.format_map(args).strip()}"
        case catalog.OUTCOME_DRY_RUN:
            return f"planned to {infinitive} (dry run)"
        case _ if outcome in catalog.SKIP_OUTCOMES:
            return f"did not {infinitive}"
        case _:
            return f"{playbook} ended {outcome}"


def action_text(event: RunEvent, labels: Mapping[str, str], alert: str | None) -> str:
    """One line of the report, e.g. `shadow: would have rolled back chat v2 at 2025-03-10 10:02
    UTC (semantic_rollback)`."""
    prefix = _SKIP_WORDS.get(event.outcome, event.outcome.replace("_", " "))
    what = describe(event.playbook, event.outcome, labels, alert)
    times = f", {num(round(event.runs, 3))} runs" if round(event.runs) != 1 else ""
    return f"{prefix}: {what} at {utc(event.at)} ({event.playbook}{times})"


def match_incident(
    spec: Spec, playbook: str, at: float, incidents: Sequence[Incident]
) -> Incident | None:
    """The alert routed to `playbook` that the run at `at` answered: the latest one that started
    by then and was still firing, or had stopped less than the playbook's deadline before."""
    linger = spec.remediation.policy(playbook).deadline_seconds
    moment = _dt(at)
    found: Incident | None = None
    for incident in incidents:
        if incident.labels.get(catalog.LABEL_PLAYBOOK) != playbook or incident.start > moment:
            continue
        if incident.end is not None and (moment - incident.end).total_seconds() > linger:
            continue
        if found is None or incident.start > found.start:
            found = incident
    return found


def build_actions(
    spec: Spec, events: Sequence[RunEvent], incidents: Sequence[Incident], window: Window
) -> list[RemediationAction]:
    """Every run that ended in the period (retries left out), oldest first, with its alert."""
    actions: list[RemediationAction] = []
    inside = [
        e
        for e in events
        if window.start < e.at <= window.end and e.outcome != catalog.OUTCOME_RETRY and e.runs > 0
    ]
    for event in sorted(inside, key=lambda e: (e.at, e.playbook, e.outcome)):
        incident = match_incident(spec, event.playbook, event.at, incidents)
        found = incident.labels if incident else {}
        labels = {k: v for k, v in found.items() if k != catalog.LABEL_PLAYBOOK}
        alert = incident.alert if incident else None
        actions.append(
            RemediationAction(
                at=_dt(event.at),
                playbook=event.playbook,
                outcome=event.outcome,
                kind=kind_of(event.outcome),
                runs=round(event.runs, 3),
                alert=alert,
                target=labels,
                text=action_text(event, labels, alert),
            )
        )
    return actions


def _guard_text(state: GuardState) -> str:
    parts: list[str] = []
    unusual = sorted(set(state.modes_seen) - {catalog.MODE_ACT})
    if unusual:
        end = f", {state.mode_at_end} at the end" if state.mode_at_end else ""
        parts.append(f"mode {' and '.join(unusual)} during the period{end}")
    if state.paused_during or state.paused_at_end:
        parts.append("paused by a human" + (", still paused at the end" if state.paused_at_end
                                             else ", resumed by the end"))  # fmt: skip
    if state.breaker_open_during or state.breaker_open_at_end:
        parts.append(
            "breaker open (stopped acting after failures in a row)"
            + (", still open at the end" if state.breaker_open_at_end else ", closed by the end")
        )
    return f"{state.playbook}: " + "; ".join(parts)


def build_guards(states: Sequence[GuardState]) -> list[RemediationGuard]:
    """The playbooks whose guard rails were not plain `act` at some point, by name."""
    rows: list[RemediationGuard] = []
    for state in sorted(states, key=lambda s: s.playbook):
        unusual = set(state.modes_seen) - {catalog.MODE_ACT} or (
            state.mode_at_end is not None and state.mode_at_end != catalog.MODE_ACT
        )
        flagged = state.paused_during or state.paused_at_end
        flagged = flagged or state.breaker_open_during or state.breaker_open_at_end
        if not unusual and not flagged:
            continue
        modes = set(state.modes_seen) | ({state.mode_at_end} if state.mode_at_end else set())
        shown = GuardState(
            state.playbook,
            frozenset(modes),
            state.mode_at_end,
            state.paused_during,
            state.paused_at_end,
            state.breaker_open_during,
            state.breaker_open_at_end,
        )
        rows.append(
            RemediationGuard(
                playbook=state.playbook,
                modes=[m for m in catalog.REMEDIATION_MODES if m in modes]
                + sorted(modes - set(catalog.REMEDIATION_MODES)),
                mode_at_end=state.mode_at_end,
                paused_during=state.paused_during,
                paused_at_end=state.paused_at_end,
                breaker_open_during=state.breaker_open_during,
                breaker_open_at_end=state.breaker_open_at_end,
                text=_guard_text(shown),
            )
        )
    return rows
