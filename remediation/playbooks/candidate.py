"""`rollback_candidate`: record a model version whose canary answers mutated as a rollback
candidate, with the evidence (design notes §4.4).

Target: the alert's `model` label. `OutputConsistencyMutation` (rules/families/mutation.py)
fires per model version, region and canary with the exporter's truncated diff as its `diff`
label; this playbook changes nothing on the platform. It keeps one record per (model,
model_version) in the Redis hash `{state_prefix}:rollback_candidates` (field
`["model","model_version"]`, JSON): `status` (`open`, or `resolved` once every piece of evidence
resolved), `first_seen`, `last_seen` and `evidence` by `region/prompt` (the diff, the alert's
description, when it started, the job that recorded it, `resolved_at`). The job's verify step
carries the record too, so `/jobs` and the audit trail show what was recorded.

Whether the version is also rolled back is the rules' decision, not this playbook's: the spec's
`rollback.on_mutation`, or a mutation while the two-signal gate's conditions hold, fires
`OutputConsistencyMutationRollback`, whose playbook is `semantic_rollback`; that keeps the
rollback under its own guard rails (mode, budget, breaker) and audit.

Both steps read and rewrite the record in one optimistic transaction (WATCH), so re-running
one after a crash, or a duplicate delivery, leaves the same record.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, Self

import redis

from redline.remediation.playbook import (
    NoOptions,
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookError,
    StepResult,
    TransientError,
)
from redline.remediation.settings import RemediationSettings

CANDIDATES_HASH = "rollback_candidates"
MAX_DIFF_CHARS = 512
_TRIES = 5


def candidate_field(model: str, version: str) -> str:
    """The hash field of a model version's record."""
    return json.dumps([model, version], separators=(",", ":"))


def build_evidence(
    labels: Mapping[str, str], annotations: Mapping[str, str], job_id: str, started: float
) -> tuple[str, dict[str, Any]]:
    """The evidence key (`region/prompt`) and entry of one mutation alert."""
    region, prompt = labels.get("region", ""), labels.get("prompt", "")
    entry = {
        "region": region,
        "prompt": prompt,
        "diff": labels.get("diff", annotations.get("diff", ""))[:MAX_DIFF_CHARS],
        "description": annotations.get("description", "")[: MAX_DIFF_CHARS * 2],
        "since": started,
        "job_id": job_id,
        "resolved_at": None,
    }
    return f"{region}/{prompt}", entry


def merge_candidate(
    record: Mapping[str, Any] | None,
    model: str,
    version: str,
    key: str,
    entry: Mapping[str, Any] | None,
    now: float,
) -> dict[str, Any]:
    """The record after one piece of evidence opened (`entry`) or resolved (None): pure."""
    merged: dict[str, Any] = {
        "model": model,
        "model_version": version,
        "status": "open",
        "first_seen": now,
        "last_seen": now,
        "evidence": {},
        **(dict(record) if record else {}),
    }
    evidence = dict(merged["evidence"])
    if entry is not None:
        previous = evidence.get(key) or {}
        # The same alert delivered again keeps when it was first seen.
        evidence[key] = {**entry, "since": previous.get("since", entry.get("since"))}
        merged["last_seen"] = now
    elif key in evidence and evidence[key].get("resolved_at") is None:
        evidence[key] = {**evidence[key], "resolved_at": now}
    merged["evidence"] = evidence
    unresolved = [e for e in evidence.values() if e.get("resolved_at") is None]
    merged["status"] = "open" if unresolved else "resolved"
    return merged


def read_candidates(client: redis.Redis, state_prefix: str) -> list[dict[str, Any]]:
    """Every recorded candidate, newest `last_seen` first."""
    raw = client.hgetall(f"{state_prefix}:{CANDIDATES_HASH}")
    records = []
    for value in raw.values():
        try:
            record = json.loads(value)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return sorted(records, key=lambda r: float(r.get("last_seen", 0.0)), reverse=True)


class RollbackCandidate(Playbook):
    """Record a mutated model version as a rollback candidate (see the module docstring)."""

    name = "rollback_candidate"
    target_label = "model"

    def __init__(self, state_prefix: str, retention_seconds: int) -> None:
        self.state_prefix = state_prefix
        self.retention_seconds = retention_seconds

    @classmethod
    def from_settings(cls, settings: RemediationSettings, options: NoOptions) -> Self:
        """The record kept beside the other playbooks' state, as long as the jobs."""
        return cls(settings.playbook_state_prefix, settings.retention_seconds)

    @property
    def hash_key(self) -> str:
        """The Redis hash holding every candidate."""
        return f"{self.state_prefix}:{CANDIDATES_HASH}"

    def _version(self, ctx: PlaybookContext) -> str:
        version = ctx.labels.get("model_version", "").strip()
        if not version:
            raise PlaybookError(f"{self.name}: the alert has no 'model_version' label")
        return version

    def _step(self, ctx: PlaybookContext, name: str, description: str) -> PlannedStep:
        model = ctx.labels[self.target_label].strip()
        key, _ = build_evidence(ctx.labels, ctx.annotations, ctx.job_id, 0.0)
        params = {"model": model, "model_version": self._version(ctx), "evidence": key}
        return PlannedStep(name, description, params)

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """One step: record the candidate and its evidence."""
        diff = ctx.labels.get("diff", "")
        return (
            self._step(
                ctx,
                "record_candidate",
                f"record {ctx.labels.get('model')} {ctx.labels.get('model_version')} as a "
                f"rollback candidate: canary {ctx.labels.get('prompt')} in "
                f"{ctx.labels.get('region')} changed ({diff or 'no diff given'})",
            ),
        )

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Add the alert's evidence to the version's record (idempotent)."""
        if step.name != "record_candidate":
            return StepResult.failure(f"{self.name}: unknown step {step.name}")
        started = ctx.alert.starts_at.timestamp()
        key, entry = build_evidence(ctx.labels, ctx.annotations, ctx.job_id, started)
        record = self._update(ctx, str(step.params["model"]), str(step.params["model_version"]),
                              key, entry)  # fmt: skip
        return StepResult.success(
            f"{record['model']} {record['model_version']} is a rollback candidate "
            f"({len(record['evidence'])} canary answer(s) changed)",
            candidate=record,
        )

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """The record holds this alert's evidence."""
        model, version = ctx.labels[self.target_label].strip(), self._version(ctx)
        record = self._read(ctx.redis, model, version)
        key, _ = build_evidence(ctx.labels, ctx.annotations, ctx.job_id, 0.0)
        if record is None or key not in record.get("evidence", {}):
            return StepResult.failure(f"no candidate record of {model} {version} holds {key}")
        return StepResult.success(
            f"candidate {model} {version} recorded ({record['status']}): {key} "
            f"{record['evidence'][key].get('diff', '')}",
            candidate=record,
        )

    def plan_resolve(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """One step: mark the evidence resolved (the answer is the accepted one again)."""
        return (self._step(ctx, "close_evidence", "mark the canary's evidence resolved"),)

    def resolve(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Mark the evidence resolved; the record resolves once all of it has."""
        model, version = str(step.params["model"]), str(step.params["model_version"])
        record = self._update(ctx, model, version, str(step.params["evidence"]), None)
        return StepResult.success(
            f"{model} {version}: {step.params['evidence']} resolved; candidate {record['status']}",
            candidate=record,
        )

    def _read(self, client: redis.Redis, model: str, version: str) -> dict[str, Any] | None:
        raw = client.hget(self.hash_key, candidate_field(model, version))
        if raw is None:
            return None
        try:
            record = json.loads(raw)
        except ValueError:
            return None
        return record if isinstance(record, dict) else None

    def _update(
        self,
        ctx: PlaybookContext,
        model: str,
        version: str,
        key: str,
        entry: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        field = candidate_field(model, version)
        for _ in range(_TRIES):
            with ctx.redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.hash_key)  # type: ignore[no-untyped-call]  # redis-py: untyped
                    raw = pipe.hget(self.hash_key, field)
                    record = json.loads(raw) if raw else None
                    if record is None and entry is None:
                        pipe.reset()
                        return merge_candidate(None, model, version, key, None, time.time())
                    merged = merge_candidate(record, model, version, key, entry, time.time())
                    pipe.multi()
                    pipe.hset(self.hash_key, field, json.dumps(merged, sort_keys=True))
                    pipe.expire(self.hash_key, self.retention_seconds)
                    pipe.execute()
                    return merged
                except redis.WatchError:
                    continue
                except ValueError:
                    raise PlaybookError(f"candidate record {field} is not JSON") from None
        raise TransientError(f"candidate record {field} kept changing under us")
