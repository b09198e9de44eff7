"""`freeze_writes`, `delta_log_replay`, `freeze_and_replay`: keep the vector index consistent.

Target: the alert's `collection` label, a logical collection configured under
`vector_index.collections` (its delta log in Redis, its primary and replica on Milvus: any
collection whose schema the write path can use, described from Milvus). The work is done by
`redline.platform.index`; these playbooks sequence it, record it and decide. A pair replicated
by something else (`replication: external`) is refused: redline has no delta log to replay.

- `freeze`: set the freeze flag the index writer honours. Writes keep landing in the delta log
  (that append is their acknowledgement), so none is lost; they reach the primary on unfreeze.
- `replay`: `replay_delta_log` from the replica's durable checkpoint: batched idempotent upserts
  and deletes with the checkpoint advanced after each batch (never before the batch is applied),
  conflicts resolved by last writer (ts_ms, region), flush and compaction, then every id of the
  replayed range verified against its last write (presence and vector checksum). Between batches
  the job's lease is checked (a worker that lost its job stops at once) and each batch is recorded.
  A replay killed half-way leaves its range recorded, so the next run resumes and verifies all of
  it. A range that does not verify fails the job and leaves writes frozen.
- `unfreeze`: only after this job's replay verified: catch the primary up with the frozen writes,
  then clear the flag atomically once it holds the last entry.

`freeze_writes` = freeze; `delta_log_replay` = replay, unfreeze; `freeze_and_replay` = freeze,
replay, unfreeze. On the resolved alert each runs `unfreeze_if_verified`: unfreeze if writes are
still frozen *and* the firing job ended succeeded with a verified replay (and nobody froze them
again after it), else leave them frozen and say why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

import redis
from pymilvus import MilvusException

from redline.core.redisconn import open_redis
from redline.core.settings import SettingsError, read_secret
from redline.platform.index import (
    BatchResult,
    DeltaLog,
    DeltaLogError,
    FreezeState,
    IndexConfig,
    IndexSchemaError,
    LeaseBusyError,
    MilvusTarget,
    freeze_writes,
    parse_stream_id,
    replay_delta_log,
    unfreeze_writes,
)
from redline.platform.index import LeaseLostError as TargetLeaseLostError
from redline.remediation.playbook import (
    NoOptions,
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookError,
    StepResult,
    TransientError,
)
from redline.remediation.settings import RemediationSettings, VectorIndexSettings

if TYPE_CHECKING:
    from redline.remediation.jobs import Job

FREEZE = "freeze"
REPLAY = "replay"
UNFREEZE = "unfreeze"
RESOLVE = "unfreeze_if_verified"


@dataclass
class _Index:
    config: IndexConfig
    log: DeltaLog
    primary: MilvusTarget
    replica: MilvusTarget


def build_index_config(name: str, settings: VectorIndexSettings, token: str = "") -> IndexConfig:
    """The IndexConfig of logical collection `name`; PlaybookError naming the allowed ones."""
    section = settings.collections.get(name)
    if section is None:
        known = ", ".join(sorted(settings.collections)) or "none"
        raise PlaybookError(
            f"collection {name!r} is not configured under vector_index.collections "
            f"(configured: {known})"
        )
    try:
        config = section.index_config(name, section.dim, token)
    except (DeltaLogError, SettingsError) as exc:
        raise PlaybookError(f"vector_index.collections.{name}: {exc}") from None
    if config.replication == "external":
        raise PlaybookError(
            f"vector_index.collections.{name}: replicated by something else (replication: "
            "external); freeze and replay need redline's delta log"
        )
    return config


def firing_replay(job: Job | None) -> tuple[dict[str, Any] | None, str]:
    """The verified replay step of a firing job, or None and the reason there is none."""
    if job is None:
        return None, "no record of the firing job"
    if job.status != "succeeded":
        error = f": {job.error}" if job.error else ""
        return None, f"the firing job {job.id} ended {job.status}{error}"
    for step in reversed(job.steps):
        data = step.get("data") or {}
        if step.get("phase") == "execute" and step.get("name") == REPLAY and step.get("ok"):
            if data.get("replay_verified") is True:
                return step, ""
    return None, (
        f"the firing job {job.id} ({job.playbook}) did not verify a replay; run "
        "delta_log_replay, which unfreezes after its verification"
    )


class _IndexPlaybook(Playbook):
    """Shared machinery: resources per step, the freeze / replay / unfreeze steps, resolve."""

    target_label = "collection"
    steps: ClassVar[tuple[str, ...]]

    def __init__(
        self, settings: VectorIndexSettings, redis_url: str, state_prefix: str, retention: int
    ) -> None:
        self.settings = settings
        self.redis_url = settings.redis_url or redis_url
        self.state_prefix = state_prefix
        self.retention_seconds = retention

    @classmethod
    def from_settings(cls, settings: RemediationSettings, options: NoOptions) -> Self:
        """The playbook on `settings.vector_index` (its Redis: the receiver's by default)."""
        return cls(
            settings.vector_index,
            settings.redis_url,
            settings.playbook_state_prefix,
            settings.retention_seconds,
        )

    # ---- resources ---------------------------------------------------------------------------

    @contextmanager
    def _open(self, ctx: PlaybookContext) -> Iterator[_Index]:
        try:
            token = read_secret(
                self.settings.milvus_token_file, None, "vector_index.milvus_token_file"
            )
        except SettingsError as exc:
            raise PlaybookError(str(exc)) from None
        name = ctx.labels[self.target_label].strip()
        config = build_index_config(name, self.settings, token.get_secret_value() if token else "")
        timeout = self.settings.milvus_timeout_seconds
        # The delta log is binary (raw float32 vectors): its client must not decode responses.
        client = open_redis(
            self.redis_url, socket_timeout=max(10.0, timeout), socket_connect_timeout=5.0
        )
        primary = MilvusTarget(config.primary, config.dim, timeout, config.metric_type)
        replica = MilvusTarget(config.replica, config.dim, timeout, config.metric_type)
        try:
            yield _Index(config, DeltaLog(client, config.collection, config.dim), primary, replica)
        except IndexSchemaError as exc:
            raise PlaybookError(str(exc)) from None
        except (redis.ConnectionError, redis.TimeoutError, MilvusException, OSError) as exc:
            raise TransientError(f"{type(exc).__name__}: {exc}") from exc
        except (LeaseBusyError, TargetLeaseLostError) as exc:
            # Another applier holds the target, or took it over: try again later.
            raise TransientError(f"{type(exc).__name__}: {exc}") from exc
        except DeltaLogError as exc:
            raise PlaybookError(f"delta log of {config.collection}: {exc}") from None
        finally:
            primary.close()
            replica.close()
            client.close()

    def _progress_key(self, ctx: PlaybookContext) -> str:
        return f"{self.state_prefix}:replay:{ctx.job_id}"

    # ---- plan --------------------------------------------------------------------------------

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """The playbook's steps, described from the current state (read only)."""
        with self._open(ctx) as index:
            if REPLAY in self.steps and index.replica.client().has_collection(
                index.replica.collection
            ):
                # a collection the write path cannot use fails the plan, named, not the replay
                index.replica.schema()
            frozen = index.log.freeze_state()
            state = index.log.target_state(index.replica.name)
            pending, age = index.log.pending(index.replica.name, state)
            resume = index.log.replay_range(index.replica.name)
            last = index.log.last_id()
        name = index.config.collection
        planned: list[PlannedStep] = []
        for step in self.steps:
            if step == FREEZE:
                planned.append(
                    PlannedStep(
                        FREEZE,
                        f"writes to {name} already frozen since {frozen.since} ({frozen.reason})"
                        if frozen
                        else f"freeze writes to {name} (they keep landing in the delta log)",
                        {"collection": name, "frozen": frozen is not None},
                    )
                )
            elif step == REPLAY:
                start = resume[0] if resume else state.checkpoint
                resuming = ", resuming an interrupted replay" if resume else ""
                planned.append(
                    PlannedStep(
                        REPLAY,
                        f"replay the delta log of {name} onto {index.replica.name} from "
                        f"{start} ({pending} entries pending, oldest "
                        f"{age or 0.0:.1f} s old{resuming}"
                        f") in batches of {self.settings.batch_size}, then flush, compact and "
                        "verify every id and checksum",
                        {
                            "collection": name,
                            "replica": index.replica.name,
                            "from": start,
                            "until_now": last,
                            "pending": pending,
                            "resumed": resume is not None,
                        },
                    )  # fmt: skip
                )
            elif step == UNFREEZE:
                planned.append(
                    PlannedStep(
                        UNFREEZE,
                        f"after the verified replay, catch {index.primary.name} up and let "
                        f"writes to {name} flow",
                        {"collection": name},
                    )
                )
        return planned

    # ---- execute -----------------------------------------------------------------------------

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Run one of freeze / replay / unfreeze."""
        with self._open(ctx) as index:
            if step.name == FREEZE:
                return self._freeze(ctx, index)
            if step.name == REPLAY:
                return self._replay(ctx, index)
            if step.name == UNFREEZE:
                return self._unfreeze_after_replay(ctx, index)
        return StepResult.failure(f"{self.name}: unknown step {step.name!r}")

    def _freeze(self, ctx: PlaybookContext, index: _Index) -> StepResult:
        held = index.log.freeze_state()
        if held is not None:
            return StepResult.success(
                f"writes already frozen since {held.since}: {held.reason}",
                since=held.since,
                reason=held.reason,
                already=True,
            )
        alertname = ctx.labels.get("alertname", "alert")
        state = freeze_writes(
            index.log,
            index.primary.name,
            f"remediation job {ctx.job_id} ({self.name}): {alertname}",
        )
        return StepResult.success(
            f"writes to {index.config.collection} frozen; the primary misses entries after "
            f"{state.since}",
            since=state.since,
            reason=state.reason,
            already=False,
        )

    def _replay(self, ctx: PlaybookContext, index: _Index) -> StepResult:
        ctx.ensure_lease()
        # A missing replica is created like the primary (only then is the primary described).
        index.replica.ensure_collection(like=index.primary)

        def on_batch(batch: BatchResult) -> None:
            ctx.record(
                "batch",
                f"applied {batch.entries} entries up to {batch.checkpoint}",
                start=batch.start,
                checkpoint=batch.checkpoint,
                entries=batch.entries,
                upserts=batch.upserts,
                deletes=batch.deletes,
                conflicts=batch.conflicts,
                superseded=batch.superseded,
            )
            ctx.ensure_lease()  # between batches: stop at once if the job was taken over

        report = replay_delta_log(
            index.log,
            index.replica,
            batch_size=self.settings.batch_size,
            lease_ttl_seconds=self.settings.lease_ttl_seconds,
            lease_wait_seconds=self.settings.lease_wait_seconds,
            max_rows_per_second=self.settings.max_rows_per_second,
            compact=self.settings.compact,
            on_batch=on_batch,
        )
        summary = report.summary()
        if not report.ok:
            v = report.verify
            return StepResult.failure(
                f"replay of {report.after}..{report.until} onto {report.target} did not verify: "
                f"{v.missing} missing, {v.unexpected} unexpected, {v.stale} stale, "
                f"{v.checksum_mismatches} checksum mismatches (e.g. "
                f"{', '.join(v.mismatched_ids) or 'n/a'}); writes stay frozen",
                replay_verified=False,
                **summary,
            )
        key = self._progress_key(ctx)
        with ctx.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"after": report.after, "until": report.until,
                                    "verified_at": str(time.time())})  # fmt: skip
            pipe.expire(key, self.retention_seconds)
            pipe.execute()
        return StepResult.success(
            f"replayed {report.entries} entries in {report.batches} batch(es) onto "
            f"{report.target} ({report.conflicts} conflicts); verified "
            f"{report.verify.verified} ids ({report.verify.superseded} superseded) in "
            f"{report.after}..{report.until}",
            replay_verified=True,
            **summary,
        )

    def _unfreeze_after_replay(self, ctx: PlaybookContext, index: _Index) -> StepResult:
        if not ctx.redis.exists(self._progress_key(ctx)):
            return StepResult.failure(
                "no verified replay recorded for this job: writes stay frozen"
            )
        return self._unfreeze(index, "after this job's verified replay")

    def _unfreeze(self, index: _Index, why: str) -> StepResult:
        if index.log.freeze_state() is None:
            return StepResult.success("writes are not frozen", applied=0, already=True)
        applied = unfreeze_writes(
            index.log,
            index.primary,
            batch_size=self.settings.batch_size,
            lease_wait_seconds=self.settings.lease_wait_seconds,
        )
        return StepResult.success(
            f"{index.primary.name} caught up on {applied} frozen writes; writes to "
            f"{index.config.collection} flow again ({why})",
            applied=applied,
            already=False,
        )

    # ---- verify ------------------------------------------------------------------------------

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """Frozen (freeze only); else the replay verified, its range is done, writes flow."""
        with self._open(ctx) as index:
            frozen = index.log.freeze_state()
            if REPLAY not in self.steps:
                if frozen is None:
                    return StepResult.failure("writes are not frozen")
                return StepResult.success(f"writes frozen since {frozen.since}", since=frozen.since)
            raw = ctx.redis.hgetall(self._progress_key(ctx))
            progress = {_text(k): _text(v) for k, v in raw.items()}
            if "until" not in progress:
                return StepResult.failure("no verified replay recorded for this job")
            checkpoint = index.log.target_state(index.replica.name).checkpoint
            if parse_stream_id(checkpoint) < parse_stream_id(progress["until"]):
                return StepResult.failure(
                    f"{index.replica.name} checkpoint {checkpoint} is behind the replayed "
                    f"range's end {progress['until']}"
                )
            unfinished = index.log.replay_range(index.replica.name)
            if unfinished is not None:
                return StepResult.failure(f"a replay of {unfinished} is still unfinished")
            if frozen is not None:
                return StepResult.failure(f"writes are still frozen: {frozen.reason}")
            return StepResult.success(
                f"{index.replica.name} holds {progress['after']}..{progress['until']} verified "
                f"(checkpoint {checkpoint}); writes flow",
                checkpoint=checkpoint,
                **progress,
            )

    # ---- resolve -----------------------------------------------------------------------------

    def plan_resolve(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """One step: unfreeze if still frozen and the firing job's replay verified."""
        with self._open(ctx) as index:
            frozen = index.log.freeze_state()
        name = index.config.collection
        decision = _decide(frozen, ctx.firing_job)
        return (PlannedStep(RESOLVE, f"{name}: {decision[1]}", {"collection": name}),)

    def resolve(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Decide again on the current state, then unfreeze or leave frozen with the reason."""
        if step.name != RESOLVE:
            return StepResult.failure(f"{self.name}: unknown resolve step {step.name!r}")
        with self._open(ctx) as index:
            frozen = index.log.freeze_state()
            unfreeze, why = _decide(frozen, ctx.firing_job)
            if frozen is None:
                return StepResult.success(why, frozen=False)
            if not unfreeze:
                return StepResult.success(
                    f"left frozen: {why}", frozen=True, left_frozen=True, reason=frozen.reason
                )
            return self._unfreeze(index, why)


def _decide(frozen: FreezeState | None, firing: Job | None) -> tuple[bool, str]:
    """(unfreeze?, why) for a resolved alert."""
    if frozen is None:
        return False, "writes are not frozen: nothing to do"
    step, why = firing_replay(firing)
    if step is None:
        return False, f"writes stay frozen: {why}"
    replayed_at = float(step.get("at", 0.0))
    if frozen.at_ms / 1000.0 > replayed_at:
        return False, (
            f"writes stay frozen: frozen again at {frozen.at_ms / 1000.0:.3f} ({frozen.reason}), "
            f"after the firing job's verified replay"
        )
    return True, f"unfreeze: the firing job {firing.id if firing else ''} verified its replay"


class FreezeWrites(_IndexPlaybook):
    """Set the write-freeze flag of a collection; writes keep landing in the delta log."""

    name = "freeze_writes"
    steps = (FREEZE,)


class DeltaLogReplay(_IndexPlaybook):
    """Replay the delta log onto the replica, verify it, then unfreeze."""

    name = "delta_log_replay"
    steps = (REPLAY, UNFREEZE)


class FreezeAndReplay(_IndexPlaybook):
    """Freeze writes, replay the delta log onto the replica, verify it, then unfreeze."""

    name = "freeze_and_replay"
    steps = (FREEZE, REPLAY, UNFREEZE)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = [
    "DeltaLogReplay",
    "FreezeAndReplay",
    "FreezeWrites",
    "build_index_config",
    "firing_replay",
]
