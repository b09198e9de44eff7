"""What a rollback will do: adapter names and paths, the candidate snapshots, the planned steps.

Everything here is pure but `select_candidates` (which reads the registry and hashes files).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from redline.platform.snapshots import Snapshot, SnapshotRegistry
from redline.remediation.playbook import PlannedStep

STAGE_SEPARATOR = "@"
"""Between the client-facing adapter name and the version in a staged adapter's name."""


def lora_path(snapshot: Snapshot) -> str:
    """The adapter directory to load: the weights path if a directory, else its parent."""
    weights = Path(snapshot.weights_path)
    return str(weights if weights.is_dir() else weights.parent)


def lora_name(snapshot: Snapshot) -> str:
    """The name the adapter is served under (and requested by): its adapter name, else the model."""
    return snapshot.adapter or snapshot.model


def staged_name(name: str, version: str) -> str:
    """The version-qualified name a version is loaded under beside the served one."""
    return f"{name}{STAGE_SEPARATOR}{version}"


def is_staged(adapter: str, name: str) -> bool:
    """True when `adapter` is a staged (version-qualified) copy of `name`."""
    return adapter.startswith(name + STAGE_SEPARATOR) and len(adapter) > len(name) + 1


@dataclass(frozen=True)
class Selection:
    """The candidates of a rollback, newest first, and the snapshots skipped with the reason."""

    candidates: tuple[Snapshot, ...]
    skipped: tuple[tuple[str, str], ...]


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


def select_candidates(
    registry: SnapshotRegistry,
    model: str,
    origin: Snapshot,
    rejected: Mapping[str, str],
    limit: int,
) -> Selection:
    """The candidates of `model` older than `origin`, their files hashed (newest first, only
    until enough intact ones are found)."""
    snapshots, errors = registry.scan(model)
    budget = max(0, limit - len(rejected))
    problems: dict[str, list[str]] = {}
    intact = 0
    for snapshot in snapshots:
        if intact >= budget:
            break
        eligible = snapshot.sequence < origin.sequence and snapshot.verified
        if eligible and snapshot.snapshot_id not in rejected:
            problems[snapshot.snapshot_id] = registry.check(snapshot)
            intact += not problems[snapshot.snapshot_id]
    return build_selection(snapshots, origin, problems, rejected, [str(e) for e in errors], limit)


@dataclass(frozen=True)
class PlanInputs:
    """What the steps are made from (all read before planning)."""

    model: str
    origin: Snapshot
    selection: Selection
    gateway_url: str
    accuracy_tolerance: float
    similarity_threshold: float
    serving: str
    """How the serving layer is told, in words (the pods' LoRA API, or the hook)."""
    pods: bool
    """True when the steps act on pods through the LoRA API (False: a hook is called)."""


def build_steps(inputs: PlanInputs) -> list[PlannedStep]:
    """The plan of a rollback with candidates: the read-only checks, then one try per candidate.
    Pure."""
    model, origin, selection = inputs.model, inputs.origin, inputs.selection
    skipped = [{"snapshot_id": sid, "reason": why} for sid, why in selection.skipped]
    ids = [s.snapshot_id for s in selection.candidates]
    steps: list[PlannedStep] = []
    if inputs.pods:
        steps += [
            PlannedStep(
                "discover_pods",
                f"find every pod serving {model}: {inputs.serving}",
                {"model": model},
                read_only=True,
            ),
            PlannedStep(
                "check_pods",
                f"ask every pod which version of {lora_name(origin)} it serves and which staged "
                "copies it holds",
                {"model": model, "lora_name": lora_name(origin)},
                read_only=True,
            ),
        ]
    steps.append(
        PlannedStep(
            "check_golden",
            f"ask the golden set of {lora_name(origin)} through {inputs.gateway_url} as it is "
            f"served now and grade it against {origin.version}'s baselines (the evidence; a "
            "regression does not stop the rollback)",
            {"model": model, "snapshot_id": origin.snapshot_id},
            read_only=True,
        )
    )
    steps.append(
        PlannedStep(
            "select_snapshot",
            f"roll {model} back from {origin.snapshot_id} (version {origin.version}); "
            f"candidates newest first: {', '.join(ids)}"
            + (f"; skipping {', '.join(s['snapshot_id'] for s in skipped)}" if skipped else ""),
            {"model": model, "origin": origin.snapshot_id, "candidates": ids, "skipped": skipped},
            read_only=True,
        )
    )
    for index, snapshot in enumerate(selection.candidates):
        last = index == len(selection.candidates) - 1
        baselines = snapshot.baselines
        assert baselines is not None  # candidates are verified
        name = lora_name(snapshot)
        if inputs.pods:
            how = (
                f"load {staged_name(name, snapshot.version)} from {lora_path(snapshot)} beside "
                f"{name} on every pod, check its golden answers there, point {model} at it, "
                f"reload {name} in place with it on every pod"
            )
        else:
            how = f"point {model} at it, {inputs.serving}"
        steps.append(
            PlannedStep(
                "try_snapshot",
                f"{snapshot.snapshot_id} (version {snapshot.version}): {how}, then run the golden "
                f"set through {inputs.gateway_url}: accuracy >= "
                f"{baselines.accuracy_ratio - inputs.accuracy_tolerance:.4f}, similarity >= "
                f"{inputs.similarity_threshold}"
                + ("; if it fails, put the original back and give up" if last else ""),
                {
                    "model": model,
                    "snapshot_id": snapshot.snapshot_id,
                    "version": snapshot.version,
                    "lora_name": name,
                    "lora_path": lora_path(snapshot),
                    "last": last,
                },
            )
        )
    return steps


__all__ = [
    "STAGE_SEPARATOR",
    "PlanInputs",
    "Selection",
    "build_selection",
    "build_steps",
    "is_staged",
    "lora_name",
    "lora_path",
    "select_candidates",
    "staged_name",
]
