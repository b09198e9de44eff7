"""Switching a model's serving version on every pod with no failed request, and putting the
original back.

One candidate, on the pods (the LoRA API):

1. load it beside the served adapter under a version-qualified name (`<adapter>@<version>`) on
   every pod: a pod that refuses fails the job, and no pod has changed what it serves;
2. ask every pod the golden set under that name: a pod whose answers fail the gates rejects the
   candidate before any client sees it;
3. point the registry's active pointer at it (hashes checked once more);
4. reload the served name in place with it on every pod (vLLM's `load_inplace`): the name never
   goes missing, so no request gets a 404. A pod that refuses puts every pod and the pointer
   back on the original, and fails the job;
5. ask the golden set through the gateway (what clients get) and check every pod serves it;
6. unload the staged copies.

Every sub-step is recorded per pod (`stage_adapter`, `precheck`, `switch_adapter`,
`unload_staged`, `restore_adapter`) and is idempotent: a re-run after a crash at any point reads
each pod's `/v1/models` and does only what is missing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from redline.platform.endpoints import Pod
from redline.platform.golden import GoldenPrompt
from redline.platform.serving import http_client
from redline.platform.snapshots import (
    UNKNOWN_VERSION,
    Snapshot,
    SnapshotError,
    SnapshotIntegrityError,
    SnapshotRegistry,
)
from redline.remediation.playbook import PlaybookContext
from redline.remediation.playbooks.rollback.hook import call_hook
from redline.remediation.playbooks.rollback.plan import lora_name, lora_path, staged_name
from redline.remediation.playbooks.rollback.pods import (
    Fleet,
    FleetReport,
    PodError,
    discover_fleet,
    served_adapters,
    stage,
    switch_in_place,
    unload,
)
from redline.remediation.playbooks.rollback.verify import (
    Continuity,
    Gates,
    ServedVersion,
    build_served_version,
    check_continuity,
)
from redline.remediation.settings import RollbackSettings, ServingSettings

_POD_CONCURRENCY = 8
"""Pods asked the golden set at once."""


VERSION_SETTLE_SECONDS = 5.0
"""Longest wait for a gateway's cached active version to follow a moved pointer (its
`version_ttl_seconds` is 1 s by default)."""
VERSION_SETTLE_POLL_SECONDS = 0.5


def _only_the_version_lags(verdict: Continuity, version: str) -> bool:
    """True when the golden answers passed and only the version they were stamped with is off
    (read from the verdict's figures, not its wording)."""
    data = verdict.data
    if "accuracy" not in data or "served_versions" not in data:
        return False
    stamped = set(data["served_versions"]) - {version, UNKNOWN_VERSION}
    return (
        bool(stamped)
        and data["accuracy"] >= data["accuracy_floor"]
        and data["mean_similarity"] >= data["similarity_threshold"]
    )


@dataclass(frozen=True)
class Outcome:
    """How trying one candidate ended: chosen, rejected (try the next) or failed (a pod refused:
    the job fails), why, and the per-pod report."""

    kind: Literal["chosen", "rejected", "failed"]
    reason: str
    pods: dict[str, dict[str, Any]]


class Switcher:
    """One job's serving changes: try a candidate everywhere, or put the original back."""

    def __init__(
        self,
        ctx: PlaybookContext,
        registry: SnapshotRegistry,
        options: RollbackSettings,
        serving: ServingSettings,
        golden_set: Sequence[GoldenPrompt],
    ) -> None:
        self.ctx = ctx
        self.registry = registry
        self.options = options
        self.serving = serving
        self.golden_set = tuple(golden_set)
        self.gates = Gates(
            options.accuracy_tolerance,
            options.similarity_threshold,
            options.golden_max_tokens,
            options.golden_concurrency,
        )

    @staticmethod
    def client_for(serving: ServingSettings) -> httpx.Client:
        """An HTTP client for the pods and the gateway."""
        return http_client(serving.timeout_seconds)

    def client(self) -> httpx.Client:
        """An HTTP client for the pods and the gateway."""
        return self.client_for(self.serving)

    # ---- records ---------------------------------------------------------------------------------

    def _pod_record(self, name: str, pod: Pod, detail: str, **data: Any) -> None:
        fields = {"pod": pod.key, "region": pod.region, "url": pod.url, **data}
        self.ctx.record(name, f"{pod.key}: {detail}", **fields)

    # ---- the pointer -----------------------------------------------------------------------------

    def point(self, snapshot: Snapshot) -> str | None:
        """Point the model at `snapshot` (hashes checked); the problem, or None."""
        model, sid = snapshot.model, snapshot.snapshot_id
        try:
            current = self.registry.active_pointer(model)
            if current is not None and current.snapshot_id == sid:
                self.ctx.record(
                    "switch_pointer", f"{model} already points at {sid}", snapshot_id=sid
                )
                return None
            pointer = self.registry.activate(model, sid, verify=True)
        except SnapshotIntegrityError as exc:
            return f"files changed since it was verified: {exc}"
        except SnapshotError as exc:
            return f"cannot activate: {exc}"
        self.ctx.record(
            "switch_pointer",
            f"{model}: {pointer.previous_snapshot_id} -> {sid}",
            snapshot_id=sid,
            previous=pointer.previous_snapshot_id,
        )
        return None

    # ---- one candidate on every pod --------------------------------------------------------------

    def try_on_pods(self, snapshot: Snapshot, origin: Snapshot) -> Outcome:
        """Load, check, point, switch in place, verify, unload: see the module docstring."""
        fleet = discover_fleet(self.serving)
        report = FleetReport(fleet)
        name, path = lora_name(snapshot), lora_path(snapshot)
        staged = staged_name(name, snapshot.version)
        with self.client() as client:
            for pod in fleet.pods:
                self.ctx.ensure_lease()
                try:
                    action = stage(client, pod, staged, path)
                except PodError as exc:
                    report.fail(pod, "loaded", str(exc))
                    self._pod_record(
                        "stage_adapter",
                        pod,
                        f"FAILED: {exc}",
                        lora_name=staged,
                        lora_path=path,
                        error=str(exc),
                    )
                    continue
                report.note(pod, "loaded", f"{staged} {action}")
                self._pod_record(
                    "stage_adapter",
                    pod,
                    f"{staged} from {path}: {action}",
                    lora_name=staged,
                    lora_path=path,
                    action=action,
                )
            if report.failures():
                # Nothing was switched for this candidate; a candidate rejected earlier in this
                # job may have been, so the original goes back where it is not served.
                return self._fail_back(
                    client, fleet, report, origin, staged,
                    f"{staged} could not be loaded on every pod; back on {origin.version}",
                )  # fmt: skip
            problems = self._precheck(client, fleet, report, snapshot, staged)
            if problems:
                self.unload_staged(client, fleet, report, [staged])
                reason = "golden set on the staged adapter: " + "; ".join(problems)
                return Outcome("rejected", reason, report.as_dict())
            problem = self.point(snapshot)
            if problem is not None:
                self.unload_staged(client, fleet, report, [staged])
                return Outcome("rejected", problem, report.as_dict())
            self.ctx.ensure_lease()
            for pod in fleet.pods:
                if not self._switch(client, pod, report, name, path, "switched", "switch_adapter"):
                    break
            if report.failures():
                return self._fail_back(
                    client, fleet, report, origin, staged,
                    f"{name} could not be switched to {snapshot.version} on every pod; the pods "
                    f"and the pointer back on {origin.version}",
                )  # fmt: skip
            self.ctx.ensure_lease()
            verdict = self._through_gateway(client, fleet, report, snapshot)
            self.unload_staged(client, fleet, report, [staged])
        if not verdict.ok:
            return Outcome("rejected", verdict.reason, report.as_dict())
        return Outcome("chosen", verdict.reason, report.as_dict())

    def _fail_back(
        self,
        client: httpx.Client,
        fleet: Fleet,
        report: FleetReport,
        origin: Snapshot,
        staged: str,
        why: str,
    ) -> Outcome:
        """The candidate failed: the original back where it is not served, the staged adapter
        unloaded everywhere."""
        restored = self.restore(client, fleet, report, origin)
        self.unload_staged(client, fleet, report, [staged])
        return Outcome("failed", f"{why}: {restored}", report.as_dict())

    def _precheck(
        self,
        client: httpx.Client,
        fleet: Fleet,
        report: FleetReport,
        snapshot: Snapshot,
        staged: str,
    ) -> list[str]:
        """The golden set of each pod under the staged name; the pods' problems."""
        # The pod loaded the staged name from the snapshot's files a moment ago.
        served = ServedVersion(snapshot.version)

        def check(pod: Pod) -> Continuity:
            return check_continuity(
                client, pod.url, staged, snapshot, self.golden_set, self.gates, served
            )

        self.ctx.ensure_lease()
        # The pods are asked at once (each a few prompts at a time); recorded in pod order.
        with ThreadPoolExecutor(max_workers=max(1, min(_POD_CONCURRENCY, len(fleet.pods)))) as pool:
            verdicts = list(pool.map(check, fleet.pods))
        problems = []
        for pod, verdict in zip(fleet.pods, verdicts, strict=True):
            self._pod_record("precheck", pod, verdict.reason, **verdict.data)
            report.note(pod, "checked", "golden set passed" if verdict.ok else verdict.reason)
            if not verdict.ok:
                problems.append(f"{pod.key}: {verdict.reason}")
        return problems

    def _switch(
        self,
        client: httpx.Client,
        pod: Pod,
        report: FleetReport,
        name: str,
        path: str,
        phase: str,
        record: str,
    ) -> bool:
        self.ctx.ensure_lease()
        try:
            action = switch_in_place(client, pod, name, path)
        except PodError as exc:
            report.fail(pod, phase, str(exc))
            self._pod_record(
                record, pod, f"FAILED: {exc}", lora_name=name, lora_path=path, error=str(exc)
            )
            return False
        report.note(pod, phase, action)
        self._pod_record(
            record,
            pod,
            f"{name} from {path}: {action}",
            lora_name=name,
            lora_path=path,
            action=action,
        )
        return True

    def _through_gateway(
        self, client: httpx.Client, fleet: Fleet, report: FleetReport, snapshot: Snapshot
    ) -> Continuity:
        """Every pod serves the snapshot's files, and the golden set through the gateway passes."""
        name, path = lora_name(snapshot), lora_path(snapshot)
        roots: dict[str, str | None] = {}
        for pod in fleet.pods:
            try:
                roots[pod.key] = served_adapters(client, pod).get(name)
            except PodError as exc:
                roots[pod.key] = None
                report.note(pod, "verified", f"cannot tell: {exc}")
                continue
            ok = roots[pod.key] == path
            report.note(
                pod,
                "verified",
                f"serves {snapshot.version}" if ok else f"serves {name} from {roots[pod.key]}",
            )
        served = self.served_version(snapshot, roots)
        gateway = self.serving.gateway_url
        assert gateway is not None  # settings checked before planning
        # A gateway stamps versions from the registry through a short cache: right after the
        # pointer moved it may still name the old version for a moment. Only that is waited out.
        deadline = time.monotonic() + VERSION_SETTLE_SECONDS
        while True:
            verdict = check_continuity(
                client, gateway, name, snapshot, self.golden_set, self.gates, served
            )
            lagging = _only_the_version_lags(verdict, snapshot.version)
            if verdict.ok or not lagging or time.monotonic() > deadline:
                break
            time.sleep(VERSION_SETTLE_POLL_SECONDS)
        self.ctx.record("continuity", verdict.reason, **verdict.data)
        return verdict

    def check_served(self, snapshot: Snapshot) -> Continuity:
        """The golden set through the gateway as it is served now, graded against `snapshot`'s
        baselines; reads only."""
        gateway = self.serving.gateway_url
        assert gateway is not None  # settings checked before planning
        with self.client() as client:
            return check_continuity(
                client, gateway, lora_name(snapshot), snapshot, self.golden_set, self.gates
            )

    def served_version(
        self, snapshot: Snapshot, roots: dict[str, str | None] | None
    ) -> ServedVersion:
        """The version the platform serves per the active pointer and the pods' roots."""
        try:
            active = self.registry.active(snapshot.model)
        except SnapshotError as exc:
            return ServedVersion(UNKNOWN_VERSION, f"active pointer unreadable: {exc}")
        return build_served_version(snapshot, active, roots)

    # ---- cleaning up and putting back ------------------------------------------------------------

    def unload_staged(
        self, client: httpx.Client, fleet: Fleet, report: FleetReport, names: Sequence[str]
    ) -> None:
        """Unload the staged copies from every pod; one left behind is noted, not fatal (no
        client asks for a staged name)."""
        for pod in fleet.pods:
            try:
                done = unload(client, pod, names)
            except PodError as exc:
                report.note(pod, "unloaded", f"left loaded: {exc}")
                self._pod_record("unload_staged", pod, f"left loaded: {exc}", error=str(exc))
                continue
            if done:
                report.note(pod, "unloaded", ", ".join(done))
                self._pod_record("unload_staged", pod, "unloaded " + ", ".join(done), unloaded=done)

    def restore(
        self, client: httpx.Client, fleet: Fleet, report: FleetReport, origin: Snapshot
    ) -> str:
        """Put the pointer and every pod back on `origin` (in place: never a missing name); how
        it went. A pod that refuses keeps what it serves, which works."""
        model, sid = origin.model, origin.snapshot_id
        problems = []
        try:
            current = self.registry.active_pointer(model)
            if current is None or current.snapshot_id != sid:
                # The original is what served before this job: put it back as it was.
                self.registry.activate(model, sid, verify=False)
        except SnapshotError as exc:
            problems.append(f"could not restore the pointer: {exc}")
        name, path = lora_name(origin), lora_path(origin)
        for pod in fleet.pods:
            if not self._switch(client, pod, report, name, path, "restored", "restore_adapter"):
                problems.append(f"{pod.key} still serves what it did")
        return "restored" if not problems else "; ".join(problems)

    def restore_everywhere(self, origin: Snapshot, staged: Sequence[str]) -> tuple[str, Outcome]:
        """Give up: the original back on the pointer and every pod, staged copies unloaded."""
        fleet = discover_fleet(self.serving)
        report = FleetReport(fleet)
        with self.client() as client:
            restored = self.restore(client, fleet, report, origin)
            self.unload_staged(client, fleet, report, staged)
        self.ctx.record(
            "restore_origin",
            f"{origin.model} -> {origin.snapshot_id}: {restored}",
            snapshot_id=origin.snapshot_id,
            pods=report.as_dict(),
        )
        return restored, Outcome("failed", restored, report.as_dict())

    # ---- one candidate through a hook ------------------------------------------------------------

    def try_with_hook(self, snapshot: Snapshot) -> Outcome:
        """Point, tell the hook, check the golden set through the gateway (the pointer is trusted
        for the version: no pod is asked)."""
        problem = self.point(snapshot)
        if problem is None:
            self.ctx.ensure_lease()
            problem = call_hook(self.ctx, self.options, self.serving.timeout_seconds, snapshot)
        if problem is not None:
            return Outcome("rejected", problem, {})
        self.ctx.ensure_lease()
        gateway = self.serving.gateway_url
        assert gateway is not None
        with self.client() as client:
            verdict = check_continuity(
                client,
                gateway,
                lora_name(snapshot),
                snapshot,
                self.golden_set,
                self.gates,
                self.served_version(snapshot, None),
            )
        self.ctx.record("continuity", verdict.reason, **verdict.data)
        return Outcome("chosen" if verdict.ok else "rejected", verdict.reason, {})

    def restore_with_hook(self, origin: Snapshot) -> str:
        """Give up through the hook: the pointer back, the hook told the original."""
        try:
            current = self.registry.active_pointer(origin.model)
            if current is None or current.snapshot_id != origin.snapshot_id:
                self.registry.activate(origin.model, origin.snapshot_id, verify=False)
        except SnapshotError as exc:
            return f"could not restore the pointer: {exc}"
        problem = call_hook(self.ctx, self.options, self.serving.timeout_seconds, origin)
        restored = "restored"
        if problem is not None:
            restored = f"pointer restored, serving layer not: {problem}"
        self.ctx.record(
            "restore_origin",
            f"{origin.model} -> {origin.snapshot_id}: {restored}",
            snapshot_id=origin.snapshot_id,
        )
        return restored


__all__ = ["Outcome", "Switcher"]
