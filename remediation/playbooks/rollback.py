"""`semantic_rollback`: put a model back on its newest verified snapshot and prove continuity.

Target: the alert's `model` label (the served model name in the snapshot registry). The plan
lists the verified snapshots older than the one that was active when the job started, newest
first, each with its weights and config hashes recomputed (a mismatch, an unverified or an
unreadable snapshot is skipped, and the reason recorded). Then, per candidate in turn
(`try_snapshot` steps, at most `rollback.max_candidates`):

1. switch the active pointer atomically (`SnapshotRegistry.activate`: temp file + `os.replace`);
2. tell the serving layer: on every configured upstream, vLLM's runtime LoRA API
   (`POST /v1/unload_lora_adapter {"lora_name"}` then `POST /v1/load_lora_adapter
   {"lora_name", "lora_path"}`), or one POST to the configured hook;
3. verify semantic continuity: the golden prompt set through the gateway must score an
   accuracy >= the snapshot's recorded baseline - `accuracy_tolerance`, a mean answer-embedding
   similarity to the snapshot's recorded reference answers >= `similarity_threshold`, and be
   served by the snapshot's version. That version is what the registry's active pointer names,
   confirmed on every upstream by the serving API (vLLM's `/v1/models` lists the loaded adapter
   with the snapshot's path as `root`; with a hook the pointer is trusted); an answer that carries
   an `x-redline-model-version` header (redline's simulator) is counted under that header instead.

A candidate that fails is recorded as rejected and the next older one is tried; when none is
left the original snapshot is put back (pointer and adapter) and the step fails, which fails the
job: it pages. Idempotent: the job's progress (the original snapshot, rejected candidates, the
chosen one) lives in Redis, so a re-run after a crash re-plans from the same original, finds the
pointer already switched and the adapter already loaded (its `/v1/models` card has the snapshot's
path as `root`), and only does what is missing. A resolved alert changes nothing: rolling forward
again is a human decision.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from redline.core.settings import SettingsError, read_secret
from redline.platform.golden import (
    GOLDEN_SET,
    MODEL_VERSION_HEADER,
    GoldenPrompt,
    build_golden_request,
    grade,
    similarity,
)
from redline.platform.serving import (
    ServingError,
    call,
    fetch_models,
    find_card,
    http_client,
    load_lora_adapter,
    unload_lora_adapter,
)
from redline.platform.snapshots import (
    UNKNOWN_VERSION,
    Snapshot,
    SnapshotError,
    SnapshotIntegrityError,
    SnapshotRegistry,
)
from redline.remediation.playbook import (
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookError,
    StepResult,
)
from redline.remediation.settings import RollbackSettings, ServingSettings

_EPSILON = 1e-9


@dataclass(frozen=True)
class Progress:
    """What this job has done so far (kept in Redis, so a re-run continues it)."""

    origin: str | None
    chosen: str | None
    rejected: dict[str, str]


@dataclass(frozen=True)
class Selection:
    """The candidates of a rollback, newest first, and the snapshots skipped with the reason."""

    candidates: tuple[Snapshot, ...]
    skipped: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ServedVersion:
    """The version registry and serving API say is served, or "unknown" and why not."""

    version: str
    problem: str | None = None


def build_served_version(
    snapshot: Snapshot, active: Snapshot | None, roots: Mapping[str, str | None] | None
) -> ServedVersion:
    """The version served while `snapshot` is being verified, from the active pointer (`active`)
    and, unless None (a hook serves), each upstream's `/v1/models` root of the adapter. Pure."""
    if active is None or active.snapshot_id != snapshot.snapshot_id:
        named = active.snapshot_id if active is not None else "nothing"
        return ServedVersion(
            UNKNOWN_VERSION, f"the active pointer names {named}, not {snapshot.snapshot_id}"
        )
    path = lora_path(snapshot)
    for region, root in sorted((roots or {}).items()):
        if root != path:
            return ServedVersion(
                UNKNOWN_VERSION,
                f"{region} serves {lora_name(snapshot)} from {root}, not {path}",
            )
    return ServedVersion(active.version)


@dataclass(frozen=True)
class Continuity:
    """The golden set's verdict on the snapshot being served."""

    ok: bool
    reason: str
    data: Mapping[str, Any]


def lora_path(snapshot: Snapshot) -> str:
    """The adapter directory to load: the weights path if a directory, else its parent."""
    weights = Path(snapshot.weights_path)
    return str(weights if weights.is_dir() else weights.parent)


def lora_name(snapshot: Snapshot) -> str:
    """The name the adapter is served under (and requested by): its adapter name, else the model."""
    return snapshot.adapter or snapshot.model


def build_selection(
    snapshots: Sequence[Snapshot],
    origin: Snapshot,
    problems: Mapping[str, Sequence[str]],
    rejected: Mapping[str, str],
    unreadable: Sequence[str],
    limit: int,
) -> Selection:
    """Verified, intact snapshots older than `origin`, newest first, minus those this job
    rejected; at most `limit` tries in all (rejected ones count). Pure: `problems` holds the
    recomputed hash mismatches by snapshot id."""
    candidates: list[Snapshot] = []
    skipped: list[tuple[str, str]] = [("(unreadable)", text) for text in unreadable]
    budget = max(0, limit - len(rejected))
    for snapshot in sorted(snapshots, key=lambda s: s.sequence, reverse=True):
        sid = snapshot.snapshot_id
        if snapshot.sequence >= origin.sequence:
            continue
        if sid in rejected:
            skipped.append((sid, f"rejected earlier in this job: {rejected[sid]}"))
        elif not snapshot.verified:
            skipped.append((sid, "never verified (no baselines recorded)"))
        elif problems.get(sid):
            skipped.append((sid, "hash mismatch: " + "; ".join(problems[sid])))
        elif len(candidates) < budget:
            candidates.append(snapshot)
        else:
            skipped.append((sid, f"beyond max_candidates={limit}"))
    return Selection(tuple(candidates), tuple(skipped))


class SemanticRollback(Playbook):
    """Roll a model back to its newest verified snapshot; verify it on the golden set."""

    name = "semantic_rollback"
    target_label = "model"

    def __init__(
        self,
        options: RollbackSettings,
        serving: ServingSettings,
        state_prefix: str,
        retention_seconds: int,
        golden_set: Sequence[GoldenPrompt] = GOLDEN_SET,
    ) -> None:
        self.options = options
        self.serving = serving
        self.state_prefix = state_prefix
        self.retention_seconds = retention_seconds
        self.golden_set = tuple(golden_set)

    # ---- configuration and state -------------------------------------------------------------

    def _registry(self) -> SnapshotRegistry:
        if self.options.snapshot_root is None:
            raise PlaybookError(f"{self.name}: not configured: set rollback.snapshot_root")
        if not self.options.hook_url and not self.serving.upstreams:
            raise PlaybookError(
                f"{self.name}: not configured: set serving.upstreams (vLLM LoRA API) "
                "or rollback.hook_url"
            )
        if not self.serving.gateway_url:
            raise PlaybookError(
                f"{self.name}: not configured: set serving.gateway_url (golden set)"
            )
        return SnapshotRegistry(self.options.snapshot_root)

    def _key(self, ctx: PlaybookContext) -> str:
        return f"{self.state_prefix}:rollback:{ctx.job_id}"

    def _progress(self, ctx: PlaybookContext) -> Progress:
        raw = {_text(k): _text(v) for k, v in ctx.redis.hgetall(self._key(ctx)).items()}
        rejected = {k[len("rejected:") :]: v for k, v in raw.items() if k.startswith("rejected:")}
        return Progress(raw.get("from"), raw.get("chosen"), rejected)

    def _save(self, ctx: PlaybookContext, fields: Mapping[str, str]) -> None:
        key = self._key(ctx)
        with ctx.redis.pipeline(transaction=True) as pipe:
            for name, value in fields.items():
                pipe.hset(key, name, value)
            pipe.expire(key, self.retention_seconds)
            pipe.execute()

    def _model(self, ctx: PlaybookContext) -> str:
        return ctx.labels[self.target_label].strip()

    @staticmethod
    def _stale(ctx: PlaybookContext, active: Snapshot) -> bool:
        """The alert names a regressed version that is no longer the active one."""
        regressed = ctx.labels.get("model_version", "").strip()
        return bool(regressed) and regressed != active.version

    def _origin(self, registry: SnapshotRegistry, model: str, progress: Progress) -> Snapshot:
        try:
            if progress.origin is not None:
                return registry.get(model, progress.origin)
            active = registry.active(model)
        except SnapshotError as exc:
            raise PlaybookError(f"{self.name} {model}: {exc}") from None
        if active is None:
            raise PlaybookError(
                f"{self.name} {model}: no active snapshot in {registry.root}: nothing to roll "
                f"back from (known models: {', '.join(registry.models()) or 'none'})"
            )
        return active

    def _select(
        self, registry: SnapshotRegistry, model: str, origin: Snapshot, progress: Progress
    ) -> Selection:
        snapshots, errors = registry.scan(model)
        budget = max(0, self.options.max_candidates - len(progress.rejected))
        problems: dict[str, list[str]] = {}
        intact = 0
        # Hash files newest first, only until enough intact candidates are found.
        for snapshot in snapshots:
            if intact >= budget:
                break
            eligible = snapshot.sequence < origin.sequence and snapshot.verified
            if eligible and snapshot.snapshot_id not in progress.rejected:
                problems[snapshot.snapshot_id] = registry.check(snapshot)
                intact += not problems[snapshot.snapshot_id]
        return build_selection(
            snapshots,
            origin,
            problems,
            progress.rejected,
            [str(e) for e in errors],
            self.options.max_candidates,
        )

    # ---- plan --------------------------------------------------------------------------------

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """Select the candidates (hashes recomputed) and lay out one try per candidate."""
        registry = self._registry()
        model = self._model(ctx)
        progress = self._progress(ctx)
        origin = self._origin(registry, model, progress)
        if progress.origin is None and self._stale(ctx, origin):
            return (
                PlannedStep(
                    "nothing_to_do",
                    f"the alert names {model} version {ctx.labels['model_version']}, but "
                    f"{origin.snapshot_id} (version {origin.version}) is active: a late or "
                    "repeated alert about a version already rolled back; nothing to roll back",
                    {"model": model, "active": origin.snapshot_id},
                ),
            )
        selection = self._select(registry, model, origin, progress)
        skipped = [{"snapshot_id": sid, "reason": why} for sid, why in selection.skipped]
        if not selection.candidates:
            if progress.origin is None:
                raise PlaybookError(
                    f"{self.name} {model}: no verified snapshot older than "
                    f"{origin.snapshot_id} with intact files"
                    + "".join(f"; skipped {s['snapshot_id']}: {s['reason']}" for s in skipped)
                )
            return (
                PlannedStep(
                    "give_up",
                    f"every candidate was rejected; put {model} back on {origin.snapshot_id} "
                    "and fail (page)",
                    {"model": model, "origin": origin.snapshot_id, "rejected": progress.rejected},
                ),
            )
        ids = [s.snapshot_id for s in selection.candidates]
        steps = [
            PlannedStep(
                "select_snapshot",
                f"roll {model} back from {origin.snapshot_id} (version {origin.version}); "
                f"candidates newest first: {', '.join(ids)}"
                + (f"; skipping {', '.join(s['snapshot_id'] for s in skipped)}" if skipped else ""),
                {
                    "model": model,
                    "origin": origin.snapshot_id,
                    "candidates": ids,
                    "skipped": skipped,
                },
            )  # fmt: skip
        ]
        for index, snapshot in enumerate(selection.candidates):
            last = index == len(selection.candidates) - 1
            baselines = snapshot.baselines
            assert baselines is not None  # candidates are verified
            steps.append(
                PlannedStep(
                    "try_snapshot",
                    f"point {model} at {snapshot.snapshot_id} (version {snapshot.version}), "
                    f"{self._serving_description(snapshot)}, then run the golden set through "
                    f"{self.serving.gateway_url}: accuracy >= "
                    f"{baselines.accuracy_ratio - self.options.accuracy_tolerance:.4f}, "
                    f"similarity >= {self.options.similarity_threshold}"
                    + ("; if it fails, put the original back and give up" if last else ""),
                    {
                        "model": model,
                        "snapshot_id": snapshot.snapshot_id,
                        "version": snapshot.version,
                        "lora_name": lora_name(snapshot),
                        "lora_path": lora_path(snapshot),
                        "last": last,
                    },
                )
            )
        return steps

    def _serving_description(self, snapshot: Snapshot) -> str:
        if self.options.hook_url:
            return f"POST it to the hook {self.options.hook_url}"
        return (
            f"unload and load LoRA adapter {lora_name(snapshot)} from {lora_path(snapshot)} on "
            + ", ".join(self.serving.upstreams)
        )

    # ---- execute -----------------------------------------------------------------------------

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Record the selection, try one candidate, or give up."""
        registry = self._registry()
        model = self._model(ctx)
        if step.name == "nothing_to_do":
            return StepResult.success(step.description, **step.params)
        if step.name == "select_snapshot":
            return self._record_selection(ctx, step)
        if step.name == "try_snapshot":
            return self._try(ctx, registry, model, step)
        if step.name == "give_up":
            progress = self._progress(ctx)
            return self._give_up(ctx, registry, self._origin(registry, model, progress), progress)
        return StepResult.failure(f"{self.name}: unknown step {step.name!r}")

    def _record_selection(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        origin = str(step.params["origin"])
        key = self._key(ctx)
        # The first execution fixes the origin; a re-run after a crash keeps it.
        ctx.redis.hsetnx(key, "from", origin)
        ctx.redis.expire(key, self.retention_seconds)
        for skipped in step.params["skipped"]:
            ctx.record(
                "skip_snapshot",
                f"{skipped['snapshot_id']}: {skipped['reason']}",
                snapshot_id=skipped["snapshot_id"],
                reason=skipped["reason"],
            )
        return StepResult.success(
            f"rolling {step.params['model']} back from {origin}; "
            f"{len(step.params['candidates'])} candidate(s)",
            origin=origin,
            candidates=list(step.params["candidates"]),
            skipped=list(step.params["skipped"]),
        )

    def _try(
        self, ctx: PlaybookContext, registry: SnapshotRegistry, model: str, step: PlannedStep
    ) -> StepResult:
        sid = str(step.params["snapshot_id"])
        progress = self._progress(ctx)
        if progress.chosen is not None:
            return StepResult.success(
                f"not needed: {model} already rolled back to {progress.chosen}",
                snapshot_id=sid,
                skipped=True,
            )
        if sid in progress.rejected:
            return StepResult.success(
                f"{sid} was rejected earlier: {progress.rejected[sid]}", snapshot_id=sid
            )
        try:
            snapshot = registry.get(model, sid)
        except SnapshotError as exc:
            reason = f"unreadable: {exc}"
        else:
            problem = self._attempt(ctx, registry, snapshot)
            if problem is None:
                self._save(ctx, {"chosen": sid})
                return StepResult.success(
                    f"{model} rolled back to {sid} (version {snapshot.version}); "
                    "continuity verified",
                    snapshot_id=sid,
                    version=snapshot.version,
                    chosen=True,
                )
            reason = problem
        self._save(ctx, {f"rejected:{sid}": reason})
        ctx.record("reject_snapshot", f"{sid}: {reason}", snapshot_id=sid, reason=reason)
        if not step.params.get("last"):
            return StepResult.success(
                f"rejected {sid}: {reason}; trying the next older verified snapshot",
                snapshot_id=sid,
                rejected=True,
                reason=reason,
            )
        progress = self._progress(ctx)
        return self._give_up(ctx, registry, self._origin(registry, model, progress), progress)

    def _attempt(
        self, ctx: PlaybookContext, registry: SnapshotRegistry, snapshot: Snapshot
    ) -> str | None:
        """Switch to `snapshot`, load it, check continuity: None when it passed, else why not."""
        model, sid = snapshot.model, snapshot.snapshot_id
        try:
            current = registry.active_pointer(model)
            if current is not None and current.snapshot_id == sid:
                ctx.record("switch_pointer", f"{model} already points at {sid}", snapshot_id=sid)
            else:
                pointer = registry.activate(model, sid, verify=True)
                ctx.record(
                    "switch_pointer",
                    f"{model}: {pointer.previous_snapshot_id} -> {sid}",
                    snapshot_id=sid,
                    previous=pointer.previous_snapshot_id,
                )
        except SnapshotIntegrityError as exc:
            return f"files changed since it was verified: {exc}"
        except SnapshotError as exc:
            return f"cannot activate: {exc}"
        ctx.ensure_lease()
        problem = self._notify_serving(ctx, snapshot)
        if problem is not None:
            return problem
        ctx.ensure_lease()
        verdict = self._continuity(snapshot, self._served_version(registry, snapshot))
        ctx.record("continuity", verdict.reason, **verdict.data)
        return None if verdict.ok else verdict.reason

    # ---- the serving layer -------------------------------------------------------------------

    def _notify_serving(self, ctx: PlaybookContext, snapshot: Snapshot) -> str | None:
        if self.options.hook_url:
            return self._call_hook(ctx, snapshot)
        name, path = lora_name(snapshot), lora_path(snapshot)
        with http_client(self.serving.timeout_seconds) as client:
            for region, url in self.serving.upstreams.items():
                try:
                    action, problem = self._load_on(client, url, name, path)
                except ServingError as exc:
                    action, problem = "failed", str(exc)
                if problem is not None:
                    return f"{region}: {problem}"
                ctx.record(
                    "load_adapter",
                    f"{region}: {name} served from {path} ({action})",
                    region=region,
                    lora_name=name,
                    lora_path=path,
                    action=action,
                )
                ctx.ensure_lease()
        return None

    def _load_on(
        self, client: httpx.Client, url: str, name: str, path: str
    ) -> tuple[str, str | None]:
        """(what was done, the problem or None) for one upstream's LoRA API."""
        card = find_card(fetch_models(client, url), name)
        if card is not None and card.get("root") == path:
            return "already served", None
        unloaded = unload_lora_adapter(client, url, name)
        if unloaded.status not in (200, 400, 404):
            return "unload failed", (
                f"unload answered HTTP {unloaded.status}: {unloaded.error_message()}"
            )
        action = "unloaded and loaded" if unloaded.status == 200 else "loaded"
        loaded = load_lora_adapter(client, url, name, path)
        if loaded.status == 200:
            return action, None
        # A concurrent loader may have won the race; what matters is what is served now.
        card = find_card(fetch_models(client, url), name)
        if card is not None and card.get("root") == path:
            return "loaded by another caller", None
        return "load failed", (
            f"load of {path} answered HTTP {loaded.status}: {loaded.error_message()}"
        )

    def _call_hook(self, ctx: PlaybookContext, snapshot: Snapshot) -> str | None:
        assert self.options.hook_url is not None
        headers = {"Idempotency-Key": f"{ctx.job_id}:{snapshot.snapshot_id}"}
        try:
            token = read_secret(self.options.hook_token_file, None, "rollback.hook_token_file")
        except SettingsError as exc:
            raise PlaybookError(str(exc)) from None
        if token is not None:
            headers["Authorization"] = f"Bearer {token.get_secret_value()}"
        body = {
            "model": snapshot.model,
            "snapshot_id": snapshot.snapshot_id,
            "version": snapshot.version,
            "lora_name": lora_name(snapshot),
            "lora_path": lora_path(snapshot),
            "weights_path": snapshot.weights_path,
            "weights_sha256": snapshot.weights_sha256,
            "config_path": snapshot.config_path,
            "config_sha256": snapshot.config_sha256,
            "job_id": ctx.job_id,
        }
        with http_client(self.serving.timeout_seconds) as client:
            answer = call(client, "POST", self.options.hook_url, body=body, headers=headers)
        if not 200 <= answer.status < 300:
            return f"hook answered HTTP {answer.status}: {answer.text[:200]}"
        ctx.record("hook", f"hook accepted {snapshot.snapshot_id}", status=answer.status)
        return None

    # ---- continuity --------------------------------------------------------------------------

    def _served_version(self, registry: SnapshotRegistry, snapshot: Snapshot) -> ServedVersion:
        """The version the platform serves per the active pointer and the serving API."""
        try:
            active = registry.active(snapshot.model)
        except SnapshotError as exc:
            return ServedVersion(UNKNOWN_VERSION, f"active pointer unreadable: {exc}")
        roots: dict[str, str | None] | None = None
        if not self.options.hook_url:
            roots = {}
            with http_client(self.serving.timeout_seconds) as client:
                for region, url in self.serving.upstreams.items():
                    try:
                        card = find_card(fetch_models(client, url), lora_name(snapshot))
                    except ServingError as exc:
                        return ServedVersion(UNKNOWN_VERSION, f"{region}: {exc}")
                    root = card.get("root") if card else None
                    roots[region] = root if isinstance(root, str) else None
        return build_served_version(snapshot, active, roots)

    def _continuity(self, snapshot: Snapshot, served: ServedVersion | None = None) -> Continuity:
        baselines = snapshot.baselines
        if baselines is None:
            return Continuity(False, "no baselines recorded", {})
        gateway = self.serving.gateway_url
        assert gateway is not None
        name = lora_name(snapshot)
        url = gateway + "/v1/chat/completions"
        correct = 0
        similarities: dict[str, float] = {}
        versions: Counter[str] = Counter()
        recorded = 0
        with http_client(self.serving.timeout_seconds) as client:
            for item in self.golden_set:
                request = build_golden_request(item, name, self.options.golden_max_tokens)
                answer = call(client, "POST", url, body=request)
                if answer.status != 200:
                    return Continuity(
                        False,
                        f"golden prompt {item.id}: HTTP {answer.status}: {answer.error_message()}",
                        {"prompt": item.id, "status": answer.status},
                    )
                try:
                    text = answer.json_object()["choices"][0]["message"]["content"]
                except (ServingError, KeyError, IndexError, TypeError) as exc:
                    return Continuity(False, f"golden prompt {item.id}: malformed answer: {exc}",
                                      {"prompt": item.id})  # fmt: skip
                text = text if isinstance(text, str) else ""
                reference = baselines.reference_answers.get(item.id)
                recorded += reference is not None
                correct += grade(text, item.expected)
                similarities[item.id] = round(similarity(text, reference or item.reference), 6)
                # The header when the server sends one; else what registry and serving API say.
                fallback = served.version if served is not None else UNKNOWN_VERSION
                versions[answer.headers.get(MODEL_VERSION_HEADER) or fallback] += 1
        count = len(self.golden_set)
        accuracy = correct / count if count else 0.0
        mean = sum(similarities.values()) / count if count else 0.0
        floor = baselines.accuracy_ratio - self.options.accuracy_tolerance
        threshold = self.options.similarity_threshold
        wrong_versions = sorted(v for v in versions if v not in (snapshot.version, "unknown"))
        problems = []
        if accuracy + _EPSILON < floor:
            problems.append(
                f"accuracy {accuracy:.4f} < {floor:.4f} (baseline "
                f"{baselines.accuracy_ratio:.4f} - {self.options.accuracy_tolerance})"
            )
        if mean + _EPSILON < threshold:
            problems.append(f"mean similarity {mean:.4f} < {threshold}")
        if wrong_versions:
            problems.append(
                f"served by version(s) {', '.join(wrong_versions)}, not {snapshot.version}"
            )
        if served is not None and served.problem is not None and versions[UNKNOWN_VERSION]:
            # No header vouched for these answers, and the registry and serving API could not.
            problems.append(f"cannot tell the serving version: {served.problem}")
        data = {
            "snapshot_id": snapshot.snapshot_id,
            "accuracy": round(accuracy, 6),
            "accuracy_floor": round(floor, 6),
            "mean_similarity": round(mean, 6),
            "min_similarity": min(similarities.values(), default=0.0),
            "similarity_threshold": threshold,
            "below_threshold": sorted(k for k, v in similarities.items() if v < threshold),
            "prompts": count,
            "recorded_references": recorded,
            "served_versions": dict(versions),
        }
        if problems:
            return Continuity(False, "continuity failed: " + "; ".join(problems), data)
        return Continuity(
            True,
            f"continuity verified: accuracy {accuracy:.4f} >= {floor:.4f}, "
            f"mean similarity {mean:.4f} >= {threshold}",
            data,
        )

    # ---- giving up ---------------------------------------------------------------------------

    def _give_up(
        self,
        ctx: PlaybookContext,
        registry: SnapshotRegistry,
        origin: Snapshot,
        progress: Progress,
    ) -> StepResult:
        """Put the original snapshot back (pointer and adapter) and fail the job loudly."""
        model, sid = origin.model, origin.snapshot_id
        restored = "restored"
        try:
            current = registry.active_pointer(model)
            if current is None or current.snapshot_id != sid:
                # The original is what served before this job: put it back as it was.
                registry.activate(model, sid, verify=False)
        except SnapshotError as exc:
            restored = f"could not restore the pointer: {exc}"
        if restored == "restored":
            problem = self._notify_serving(ctx, origin)
            if problem is not None:
                restored = f"pointer restored, serving layer not: {problem}"
        ctx.record("restore_origin", f"{model} -> {sid}: {restored}", snapshot_id=sid)
        rejections = "; ".join(f"{k}: {v}" for k, v in progress.rejected.items()) or "none"
        return StepResult.failure(
            f"{self.name} {model}: no older verified snapshot passed continuity "
            f"(rejected: {rejections}); {sid} {restored}; needs a human",
            origin=sid,
            rejected=dict(progress.rejected),
            restored=restored,
        )

    # ---- verify ------------------------------------------------------------------------------

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """The chosen snapshot is active and every upstream serves its adapter."""
        registry = self._registry()
        model = self._model(ctx)
        progress = self._progress(ctx)
        if progress.chosen is None:
            try:
                current = registry.active(model)
            except SnapshotError as exc:
                return StepResult.failure(f"{model}: {exc}")
            if current is not None and self._stale(ctx, current):
                return StepResult.success(
                    f"{model} still serves {current.snapshot_id} (version {current.version}); "
                    "the alert's version is not active",
                    snapshot_id=current.snapshot_id,
                    version=current.version,
                )
            return StepResult.failure(f"{model}: no snapshot was chosen")
        try:
            pointer = registry.active_pointer(model)
            snapshot = registry.get(model, progress.chosen)
        except SnapshotError as exc:
            return StepResult.failure(f"{model}: {exc}")
        if pointer is None or pointer.snapshot_id != progress.chosen:
            active = pointer.snapshot_id if pointer else None
            return StepResult.failure(
                f"{model}: active pointer is {active}, expected {progress.chosen}"
            )
        serving: dict[str, str] = {}
        if not self.options.hook_url:
            name, path = lora_name(snapshot), lora_path(snapshot)
            with http_client(self.serving.timeout_seconds) as client:
                for region, url in self.serving.upstreams.items():
                    try:
                        card = find_card(fetch_models(client, url), name)
                    except ServingError as exc:
                        return StepResult.failure(f"{region}: {exc}")
                    root = card.get("root") if card else None
                    if root != path:
                        return StepResult.failure(
                            f"{region}: {name} is served from {root}, expected {path}"
                        )
                    serving[region] = str(root)
        return StepResult.success(
            f"{model} serves {progress.chosen} (version {snapshot.version}), "
            f"rolled back from {progress.origin}",
            snapshot_id=progress.chosen,
            version=snapshot.version,
            origin=progress.origin,
            serving=serving,
            verified_at=time.time(),
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = [
    "SemanticRollback",
    "ServedVersion",
    "build_selection",
    "build_served_version",
    "lora_name",
    "lora_path",
]
