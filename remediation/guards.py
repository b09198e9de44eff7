"""Guard rails of the worker: per-playbook mode, budget, breaker and human pause, and the start-up
check of every enabled playbook's settings and options.

Policies come from the spec (`remediation.playbooks.<name>`: `mode`, `budget`, `breaker`,
`deadline`), overridden per playbook by the receiver's `policies` setting (for playbooks the spec
cannot name, such as a deployment's own, or to try a mode without editing the spec). A playbook
neither names gets `PlaybookPolicy()`: act, no budget, breaker after 3 failures, 15 min deadline.

The state lives in Redis beside the job store (keys in `jobs.StoreKeys`), so it survives restarts
and every worker sees the same: `paused` (hash: playbook or `*` -> who, why, when), `breaker`
(hash: consecutive failures and the open record per playbook; the settle script updates it
atomically with the job's final state) and one `budget:<playbook>:<target>` sorted set per target
(the job ids admitted to act, by time). The worker checks them when it picks a job up, never the
receiver: ingestion pays nothing for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import redis
import redis.asyncio as aredis

from redline.core.settings import SettingsError
from redline.remediation.catalog import builtin_playbook_names
from redline.remediation.jobs import StoreKeys, now_iso
from redline.remediation.playbook import PlaybookRegistry
from redline.slo.load import SpecError, apply_profile, load_spec
from redline.slo.spec import (
    PlaybookBudget,
    PlaybookPolicy,
    RedisDurability,
    Remediation,
)

ALL = "*"
"""The `paused` field that pauses every playbook."""

SkipOutcome = Literal["off", "paused", "over_budget", "breaker_open"]

# Admit a job to act on a target unless the window already holds `runs` other jobs; a job
# admitted before (a retry, a resumed wait) is admitted again without counting twice.
_ADMIT_LUA = """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZSCORE', KEYS[1], ARGV[4]) then
  return {1, redis.call('ZCARD', KEYS[1])}
end
local count = redis.call('ZCARD', KEYS[1])
if count >= tonumber(ARGV[3]) then return {0, count} end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('PEXPIRE', KEYS[1], window)
return {1, count + 1}
"""


@dataclass(frozen=True)
class Policies:
    """The effective policy of every playbook."""

    named: Mapping[str, PlaybookPolicy] = field(default_factory=dict)

    def get(self, playbook: str) -> PlaybookPolicy:
        """The policy of `playbook` (defaults when nothing names it)."""
        return self.named.get(playbook) or PlaybookPolicy()

    def names(self) -> tuple[str, ...]:
        """Playbooks with an explicit policy, sorted."""
        return tuple(sorted(self.named))


def build_policies(spec: Remediation, overrides: Mapping[str, PlaybookPolicy]) -> Policies:
    """The spec's per-playbook policies with the settings' `overrides` on top (whole policies)."""
    named: dict[str, PlaybookPolicy] = {str(k): v for k, v in spec.playbooks.items()}
    named.update(overrides)
    return Policies(named)


def load_policies(
    spec_path: Any, profile: str | None, overrides: Mapping[str, PlaybookPolicy]
) -> Policies:
    """Policies from the spec file (None: the embedded default) and `overrides`; SettingsError
    naming the spec's problems when it does not load."""
    try:
        spec = apply_profile(load_spec(spec_path).spec, profile)
    except SpecError as exc:
        raise SettingsError("\n".join(exc.problems)) from None
    return build_policies(spec.remediation, overrides)


def load_durability(spec_path: Any) -> RedisDurability:
    """The spec's `redis` section (replica acknowledgements of the writes that must not be
    lost) from the spec file (None: the embedded default); SettingsError if it won't load."""
    try:
        return load_spec(spec_path).spec.redis
    except SpecError as exc:
        raise SettingsError("\n".join(exc.problems)) from None


def build_startup_problems(registry: PlaybookRegistry, policies: Policies) -> list[str]:
    """Every settings problem of the registered playbooks that are not `off` (options that do not
    validate included), each naming the playbook and the field, and the registry's own."""
    problems: list[str] = list(registry.problems)
    for playbook in sorted(registry, key=lambda item: item.name):
        mode = policies.get(playbook.name).mode
        if mode == "off":
            continue
        for problem in playbook.settings_problems():
            problems.append(
                f"playbook {playbook.name} (mode {mode}): {problem} "
                f"(or set remediation.playbooks.{playbook.name}.mode: off)"
            )
    return problems


def check_startup(registry: PlaybookRegistry, policies: Policies) -> None:
    """SettingsError listing every problem `build_startup_problems` finds."""
    problems = build_startup_problems(registry, policies)
    if problems:
        raise SettingsError("refusing to start:\n" + "\n".join(problems))


def known_playbooks(policies: Policies, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The playbooks the guard gauges show: the built-in ones, the policies' and `extra` (the
    registry's names, when the CLI starts the receiver)."""
    return tuple(sorted({*builtin_playbook_names(), *policies.names(), *extra}))


@dataclass(frozen=True)
class Gate:
    """What stops a playbook from acting right now: a pause and/or an open breaker."""

    paused: Mapping[str, Any] | None
    breaker: Mapping[str, Any] | None


def _loads(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return {"raw": raw}
    return value if isinstance(value, dict) else {"raw": raw}


def build_pause_record(by: str, reason: str, at: str) -> str:
    """The JSON stored for a pause."""
    return json.dumps({"by": by, "reason": reason, "at": at}, sort_keys=True)


def build_breaker_record(playbook: str, failures: int, error: str, at: str) -> str:
    """The JSON stored when a breaker opens."""
    return json.dumps(
        {"playbook": playbook, "failures": failures, "error": error, "at": at}, sort_keys=True
    )


@dataclass(frozen=True)
class GuardSnapshot:
    """Pauses and breakers as stored (raw hashes decoded)."""

    paused: Mapping[str, Mapping[str, Any]]
    breakers_open: Mapping[str, Mapping[str, Any]]
    failures: Mapping[str, int]

    def is_paused(self, playbook: str) -> bool:
        """True when the playbook, or every playbook, is paused."""
        return playbook in self.paused or ALL in self.paused


def build_snapshot(paused: Mapping[str, str], breaker: Mapping[str, str]) -> GuardSnapshot:
    """A snapshot from the raw `paused` and `breaker` hashes."""
    opened: dict[str, Mapping[str, Any]] = {}
    failures: dict[str, int] = {}
    for name, raw in breaker.items():
        kind, _, playbook = name.partition("|")
        if kind == "open":
            opened[playbook] = _loads(raw) or {}
        elif kind == "failures":
            try:
                failures[playbook] = int(raw)
            except ValueError:
                failures[playbook] = 0
    return GuardSnapshot(
        {name: _loads(raw) or {} for name, raw in paused.items()}, opened, failures
    )


class GuardStore:
    """Synchronous guard state: the worker's checks and the CLI's pause / resume."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.keys = StoreKeys(prefix)
        self._admit = client.register_script(_ADMIT_LUA)

    def gate(self, playbook: str) -> Gate:
        """The pause (of this playbook or of all) and the open breaker, if any."""
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hget(self.keys.paused, playbook)
            pipe.hget(self.keys.paused, ALL)
            pipe.hget(self.keys.breaker, f"open|{playbook}")
            mine, every, breaker = cast(list[str | None], pipe.execute())
        paused = mine if mine is not None else every
        return Gate(_loads(paused), _loads(breaker))

    def admit(
        self, playbook: str, target: str, job_id: str, budget: PlaybookBudget, now_ms: int
    ) -> tuple[bool, int]:
        """(admitted, runs in the window including this one when admitted)."""
        ok, count = self._admit(
            keys=[self.keys.budget(playbook, target)],
            args=[now_ms, int(budget.per_seconds * 1000), budget.runs, job_id],
        )
        return int(ok) == 1, int(count)

    def snapshot(self) -> GuardSnapshot:
        """Every pause and breaker."""
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.paused)
            pipe.hgetall(self.keys.breaker)
            paused, breaker = pipe.execute()
        return build_snapshot(paused, breaker)

    def pause(self, playbook: str | None, by: str, reason: str) -> bool:
        """Pause one playbook (None: all); False when it already was (the record is kept)."""
        record = build_pause_record(by, reason, now_iso())
        return bool(self.client.hsetnx(self.keys.paused, playbook or ALL, record))

    def resume(self, playbook: str | None) -> tuple[list[str], list[str]]:
        """Lift the pause of one playbook (None: every pause) and close its breaker (None:
        every breaker); returns (pauses lifted, breakers closed)."""
        before = self.snapshot()
        if playbook is None:
            lifted = sorted(before.paused)
            closed = sorted(before.breakers_open)
            with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(self.keys.paused)
                pipe.delete(self.keys.breaker)
                pipe.execute()
            return lifted, closed
        lifted = [playbook] if playbook in before.paused else []
        closed = [playbook] if playbook in before.breakers_open else []
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.paused, playbook)
            pipe.hdel(self.keys.breaker, f"open|{playbook}", f"failures|{playbook}")
            pipe.execute()
        return lifted, closed


async def read_guard_hashes(
    client: aredis.Redis, keys: StoreKeys
) -> tuple[dict[str, str], dict[str, str]]:
    """The raw `paused` and `breaker` hashes (the receiver's `/metrics`)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.paused)
        pipe.hgetall(keys.breaker)
        paused, breaker = await pipe.execute()
    return cast(dict[str, str], paused), cast(dict[str, str], breaker)


async def read_active_jobs(
    client: aredis.Redis, keys: StoreKeys, limit: int = 1000
) -> list[tuple[str, float]]:
    """(playbook, created at in Unix seconds) of the oldest `limit` unfinished jobs."""
    rows = cast(
        list[tuple[str, float]],
        await client.zrange(keys.active, 0, limit - 1, withscores=True),
    )
    if not rows:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for job_id, _ in rows:
            pipe.hget(keys.job(job_id), "playbook")
        playbooks = cast(list[str | None], await pipe.execute())
    return [
        (playbook, score / 1000)
        for (_, score), playbook in zip(rows, playbooks, strict=True)
        if playbook is not None
    ]
