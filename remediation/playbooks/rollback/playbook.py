"""The `semantic_rollback` playbook: plan, execute each step, verify (see the package docstring)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Self

from redline.platform.golden import GOLDEN_SET, GoldenPrompt
from redline.platform.snapshots import Snapshot, SnapshotError, SnapshotRegistry
from redline.remediation.playbook import (
    NoOptions,
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookError,
    StepResult,
)
from redline.remediation.playbooks.rollback.hook import describe_hook
from redline.remediation.playbooks.rollback.plan import (
    PlanInputs,
    build_steps,
    is_staged,
    lora_name,
    lora_path,
    select_candidates,
    staged_name,
)
from redline.remediation.playbooks.rollback.pods import (
    FleetReport,
    PodError,
    describe_sources,
    discover_fleet,
    pod_sources,
    served_adapters,
    serving_summary,
    summarize_pods,
)
from redline.remediation.playbooks.rollback.state import Progress, ProgressStore
from redline.remediation.playbooks.rollback.switch import Switcher
from redline.remediation.settings import (
    RemediationSettings,
    RollbackSettings,
    ServingSettings,
)

PodJudge = Callable[[dict[str, str | None]], tuple[str, str | None]]
"""A pod's served adapters (name -> root) judged: the note for its report, and the problem
(None: fine)."""


class SemanticRollback(Playbook):
    """Roll a model back to its newest verified snapshot on every pod; verify it on the golden
    set."""

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

    @classmethod
    def from_settings(cls, settings: RemediationSettings, options: NoOptions) -> Self:
        """The rollback on `settings.rollback` and `settings.serving`, the built-in golden set."""
        return cls(
            settings.rollback,
            settings.serving,
            settings.playbook_state_prefix,
            settings.retention_seconds,
        )

    # ---- configuration and state -------------------------------------------------------------

    def settings_problems(self) -> Sequence[str]:
        """rollback.snapshot_root, a serving layer to switch (upstreams, pods or a hook) and
        serving.gateway_url are required; a Kubernetes pod source needs a cluster to ask."""
        problems = []
        if self.options.snapshot_root is None:
            problems.append("rollback.snapshot_root is not set (the snapshot registry)")
        if not self.options.hook_url and not self.serving.upstreams and not self.serving.pods:
            problems.append(
                "serving.upstreams (or serving.pods, or rollback.hook_url) is not set (the "
                "serving layer to switch)"
            )
        if not self.serving.gateway_url:
            problems.append(
                "serving.gateway_url is not set (the golden set checks a version through it)"
            )
        if not self.options.hook_url:
            for region, source in self.serving.pods.items():
                if source.kubernetes is not None:
                    problems += [
                        f"serving.pods.{region}.{problem}"
                        for problem in source.kubernetes.problems()
                    ]
        return problems

    def _registry(self) -> SnapshotRegistry:
        if self.options.snapshot_root is None:
            raise PlaybookError(f"{self.name}: not configured: set rollback.snapshot_root")
        if not self.options.hook_url and not pod_sources(self.serving):
            raise PlaybookError(
                f"{self.name}: not configured: set serving.upstreams or serving.pods (vLLM "
                "LoRA API) or rollback.hook_url"
            )
        if not self.serving.gateway_url:
            raise PlaybookError(
                f"{self.name}: not configured: set serving.gateway_url (golden set)"
            )
        return SnapshotRegistry(self.options.snapshot_root)

    @property
    def _on_pods(self) -> bool:
        return not self.options.hook_url

    def _store(self, ctx: PlaybookContext) -> ProgressStore:
        key = f"{self.state_prefix}:rollback:{ctx.job_id}"
        return ProgressStore(ctx.redis, key, self.retention_seconds)

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

    def _switcher(self, ctx: PlaybookContext, registry: SnapshotRegistry) -> Switcher:
        return Switcher(ctx, registry, self.options, self.serving, self.golden_set)

    # ---- plan --------------------------------------------------------------------------------

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """Select the candidates (hashes recomputed): the read-only checks, then one try each."""
        registry = self._registry()
        model = self._model(ctx)
        progress = self._store(ctx).load()
        origin = self._origin(registry, model, progress)
        if progress.origin is None and self._stale(ctx, origin):
            return (
                PlannedStep(
                    "nothing_to_do",
                    f"the alert names {model} version {ctx.labels['model_version']}, but "
                    f"{origin.snapshot_id} (version {origin.version}) is active: a late or "
                    "repeated alert about a version already rolled back; nothing to roll back",
                    {"model": model, "active": origin.snapshot_id},
                    read_only=True,
                ),
            )
        selection = select_candidates(
            registry, model, origin, progress.rejected, self.options.max_candidates
        )
        if not selection.candidates:
            if progress.origin is None:
                raise PlaybookError(
                    f"{self.name} {model}: no verified snapshot older than "
                    f"{origin.snapshot_id} with intact files"
                    + "".join(f"; skipped {sid}: {why}" for sid, why in selection.skipped)
                )
            return (
                PlannedStep(
                    "give_up",
                    f"every candidate was rejected; put {model} back on {origin.snapshot_id} "
                    "and fail (page)",
                    {"model": model, "origin": origin.snapshot_id, "rejected": progress.rejected},
                ),
            )
        gateway = self.serving.gateway_url
        assert gateway is not None  # _registry checked it
        serving = describe_sources(self.serving) if self._on_pods else describe_hook(self.options)
        return build_steps(
            PlanInputs(
                model=model,
                origin=origin,
                selection=selection,
                gateway_url=gateway,
                accuracy_tolerance=self.options.accuracy_tolerance,
                similarity_threshold=self.options.similarity_threshold,
                serving=serving,
                pods=self._on_pods,
            )
        )

    # ---- execute -----------------------------------------------------------------------------

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Run one step: a check, the selection, a candidate's try, or giving up."""
        registry = self._registry()
        model = self._model(ctx)
        if step.name == "nothing_to_do":
            return StepResult.success(step.description, **step.params)
        if step.name == "discover_pods":
            return self._discover()
        if step.name == "check_pods":
            return self._check_pods(str(step.params["lora_name"]))
        if step.name == "check_golden":
            return self._check_golden(ctx, registry, model, str(step.params["snapshot_id"]))
        if step.name == "select_snapshot":
            return self._record_selection(ctx, step)
        if step.name == "try_snapshot":
            return self._try(ctx, registry, model, step)
        if step.name == "give_up":
            progress = self._store(ctx).load()
            return self._give_up(ctx, registry, self._origin(registry, model, progress), progress)
        return StepResult.failure(f"{self.name}: unknown step {step.name!r}")

    def _discover(self) -> StepResult:
        fleet = discover_fleet(self.serving)
        regions = fleet.by_region()
        return StepResult.success(
            f"{len(fleet.pods)} pod(s): "
            + "; ".join(f"{region}: {', '.join(names)}" for region, names in regions.items())
            + (
                "; left alone: " + ", ".join(f"{p.key} ({p.skipped})" for p in fleet.skipped)
                if fleet.skipped
                else ""
            ),
            pods={pod.key: pod.url for pod in fleet.pods},
            skipped={pod.key: pod.skipped for pod in fleet.skipped},
        )

    def _ask_pods(self, phase: str, judge: PodJudge) -> tuple[list[str], FleetReport]:
        """Ask every pod which adapters it serves and `judge` the answer: the problems (one
        line a pod, a pod that cannot be asked included) and the per-pod report under `phase`."""
        fleet = discover_fleet(self.serving)
        report = FleetReport(fleet)
        problems = []
        with Switcher.client_for(self.serving) as client:
            for pod in fleet.pods:
                try:
                    roots = served_adapters(client, pod)
                except PodError as exc:
                    report.fail(pod, phase, str(exc))
                    problems.append(f"{pod.key}: {exc}")
                    continue
                note, problem = judge(roots)
                if problem is None:
                    report.note(pod, phase, note)
                else:
                    report.fail(pod, phase, note)
                    problems.append(f"{pod.key}: {problem}")
        return problems, report

    def _check_pods(self, name: str) -> StepResult:
        def judge(roots: dict[str, str | None]) -> tuple[str, str | None]:
            staged = sorted(a for a in roots if is_staged(a, name))
            return serving_summary(roots, name, staged), None

        problems, report = self._ask_pods("serving", judge)
        if problems:
            return StepResult.failure(
                "pods that cannot be asked: " + "; ".join(problems), pods=report.as_dict()
            )
        return StepResult.success(report.summary(), pods=report.as_dict())

    def _check_golden(
        self, ctx: PlaybookContext, registry: SnapshotRegistry, model: str, sid: str
    ) -> StepResult:
        try:
            origin = registry.get(model, sid)
        except SnapshotError as exc:
            return StepResult.failure(f"{model}: {exc}")
        switcher = self._switcher(ctx, registry)
        verdict = switcher.check_served(origin)
        return StepResult.success(
            f"{lora_name(origin)} as served now, against {origin.version}'s baselines: "
            + ("passes: " if verdict.ok else "fails: ")
            + verdict.reason.split(": ", 1)[-1],
            regressed=not verdict.ok,
            **verdict.data,
        )

    def _record_selection(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        origin = str(step.params["origin"])
        if not ctx.shadow:
            # The first execution fixes the origin; a re-run after a crash keeps it.
            self._store(ctx).fix_origin(origin)
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
        store = self._store(ctx)
        progress = store.load()
        if progress.chosen is not None:
            if progress.chosen == sid and self._on_pods:
                self._unload_leftover(ctx, registry, model, sid)
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
            pods: dict[str, Any] = {}
        else:
            switcher = self._switcher(ctx, registry)
            origin = self._origin(registry, model, progress)
            if self._on_pods:
                outcome = switcher.try_on_pods(snapshot, origin)
            else:
                outcome = switcher.try_with_hook(snapshot)
            pods = outcome.pods
            if outcome.kind == "chosen":
                store.choose(sid)
                return StepResult.success(
                    f"{model} rolled back to {sid} (version {snapshot.version}); "
                    f"continuity verified",
                    snapshot_id=sid,
                    version=snapshot.version,
                    chosen=True,
                    pods=pods,
                )
            if outcome.kind == "failed":
                return StepResult.failure(
                    f"{self.name} {model}: {outcome.reason}; per pod: " + summarize_pods(pods),
                    snapshot_id=sid,
                    pods=pods,
                )
            reason = outcome.reason
        store.reject(sid, reason)
        ctx.record("reject_snapshot", f"{sid}: {reason}", snapshot_id=sid, reason=reason)
        if not step.params.get("last"):
            return StepResult.success(
                f"rejected {sid}: {reason}; trying the next older verified snapshot",
                snapshot_id=sid,
                rejected=True,
                reason=reason,
                pods=pods,
            )
        progress = store.load()
        return self._give_up(ctx, registry, self._origin(registry, model, progress), progress)

    def _unload_leftover(
        self, ctx: PlaybookContext, registry: SnapshotRegistry, model: str, sid: str
    ) -> None:
        """A re-run after the choice was recorded: the staged copy may still be loaded."""
        try:
            snapshot = registry.get(model, sid)
        except SnapshotError:
            return  # verify names what is wrong with the chosen snapshot
        switcher = self._switcher(ctx, registry)
        fleet = discover_fleet(self.serving)
        with switcher.client() as client:
            switcher.unload_staged(
                client,
                fleet,
                FleetReport(fleet),
                [staged_name(lora_name(snapshot), snapshot.version)],
            )

    # ---- giving up ---------------------------------------------------------------------------

    def _give_up(
        self,
        ctx: PlaybookContext,
        registry: SnapshotRegistry,
        origin: Snapshot,
        progress: Progress,
    ) -> StepResult:
        """Put the original snapshot back (pointer and every pod) and fail the job loudly."""
        switcher = self._switcher(ctx, registry)
        pods: dict[str, Any] = {}
        if self._on_pods:
            staged = []
            for sid in progress.rejected:
                try:
                    tried = registry.get(origin.model, sid)
                except SnapshotError:
                    continue
                staged.append(staged_name(lora_name(tried), tried.version))
            restored, outcome = switcher.restore_everywhere(origin, staged)
            pods = outcome.pods
        else:
            restored = switcher.restore_with_hook(origin)
        rejections = "; ".join(f"{k}: {v}" for k, v in progress.rejected.items()) or "none"
        return StepResult.failure(
            f"{self.name} {origin.model}: no older verified snapshot passed continuity "
            f"(rejected: {rejections}); {origin.snapshot_id} {restored}; needs a human",
            origin=origin.snapshot_id,
            rejected=dict(progress.rejected),
            restored=restored,
            pods=pods,
        )

    # ---- verify ------------------------------------------------------------------------------

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """The chosen snapshot is active and every pod serves its adapter."""
        registry = self._registry()
        model = self._model(ctx)
        progress = self._store(ctx).load()
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
        pods: dict[str, Any] = {}
        if self._on_pods:
            problem, pods = self._verify_pods(snapshot)
            if problem is not None:
                return StepResult.failure(f"{model}: {problem}", pods=pods)
        return StepResult.success(
            f"{model} serves {progress.chosen} (version {snapshot.version}) on "
            + (f"{len(pods)} pod(s)" if self._on_pods else "the hook's word")
            + f", rolled back from {progress.origin}",
            snapshot_id=progress.chosen,
            version=snapshot.version,
            origin=progress.origin,
            pods=pods,
            verified_at=time.time(),
        )

    def _verify_pods(self, snapshot: Snapshot) -> tuple[str | None, dict[str, Any]]:
        name, path = lora_name(snapshot), lora_path(snapshot)

        def judge(roots: dict[str, str | None]) -> tuple[str, str | None]:
            if roots.get(name) == path:
                return f"serves {snapshot.version}", None
            served = f"{name} is served from {roots.get(name)}"
            return served, f"{served}, expected {path}"

        wrong, report = self._ask_pods("verified", judge)
        return ("; ".join(wrong) if wrong else None), report.as_dict()


__all__ = ["SemanticRollback"]
