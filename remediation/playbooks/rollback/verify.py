"""Semantic continuity: the golden set asked of a version, graded against its recorded baselines.

Asked through the gateway after a switch (what clients get), or of one pod under the staged
name before it (what the version answers, before any client sees it). A version is what the
answers' `x-redline-model-version` header says (redline's simulator) or, without one, what the
registry's active pointer and every pod's `/v1/models` root say together.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from redline.platform.golden import (
    MODEL_VERSION_HEADER,
    GoldenPrompt,
    build_golden_request,
    grade_item,
    similarity,
)
from redline.platform.serving import CHAT_PATH, HttpAnswer, ServingError, call
from redline.platform.snapshots import UNKNOWN_VERSION, Snapshot
from redline.remediation.playbooks.rollback.plan import lora_name, lora_path

_EPSILON = 1e-9


@dataclass(frozen=True)
class ServedVersion:
    """The version registry and serving API say is served, or "unknown" and why not."""

    version: str
    problem: str | None = None


def build_served_version(
    snapshot: Snapshot, active: Snapshot | None, roots: Mapping[str, str | None] | None
) -> ServedVersion:
    """The version served while `snapshot` is being verified, from the active pointer (`active`)
    and, unless None (a hook serves), each pod's `/v1/models` root of the adapter. Pure."""
    if active is None or active.snapshot_id != snapshot.snapshot_id:
        named = active.snapshot_id if active is not None else "nothing"
        return ServedVersion(
            UNKNOWN_VERSION, f"the active pointer names {named}, not {snapshot.snapshot_id}"
        )
    path = lora_path(snapshot)
    for where, root in sorted((roots or {}).items()):
        if root != path:
            return ServedVersion(
                UNKNOWN_VERSION,
                f"{where} serves {lora_name(snapshot)} from {root}, not {path}",
            )
    return ServedVersion(active.version)


@dataclass(frozen=True)
class Gates:
    """The continuity gates: accuracy tolerance under the baseline, least mean similarity."""

    accuracy_tolerance: float
    similarity_threshold: float
    max_tokens: int
    concurrency: int = 4
    """Golden prompts asked at once."""


@dataclass(frozen=True)
class Continuity:
    """The golden set's verdict on the snapshot being served."""

    ok: bool
    reason: str
    data: Mapping[str, Any]


def check_continuity(
    client: httpx.Client,
    base_url: str,
    model: str,
    snapshot: Snapshot,
    golden_set: Sequence[GoldenPrompt],
    gates: Gates,
    served: ServedVersion | None = None,
) -> Continuity:
    """Ask every golden prompt of `base_url` for `model` and grade the answers against the
    snapshot's baselines (accuracy, similarity to its reference answers, the serving version).
    TransientError when the server cannot be reached or answers 5xx."""
    baselines = snapshot.baselines
    if baselines is None:
        return Continuity(False, "no baselines recorded", {})
    url = base_url + CHAT_PATH
    correct = 0
    similarities: dict[str, float] = {}
    versions: Counter[str] = Counter()
    recorded = 0
    fallback = served.version if served is not None else UNKNOWN_VERSION

    def ask(item: GoldenPrompt) -> HttpAnswer:
        return call(client, "POST", url, body=build_golden_request(item, model, gates.max_tokens))

    # A few at a time: a golden set on a real engine is seconds per prompt.
    with ThreadPoolExecutor(max_workers=max(1, min(gates.concurrency, len(golden_set)))) as pool:
        answers = list(pool.map(ask, golden_set))
    for item, answer in zip(golden_set, answers, strict=True):
        if answer.status != 200:
            return Continuity(
                False,
                f"golden prompt {item.id}: HTTP {answer.status}: {answer.error_message()}",
                {"prompt": item.id, "status": answer.status},
            )
        try:
            text = answer.json_object()["choices"][0]["message"]["content"]
        except (ServingError, KeyError, IndexError, TypeError) as exc:
            return Continuity(
                False, f"golden prompt {item.id}: malformed answer: {exc}", {"prompt": item.id}
            )
        text = text if isinstance(text, str) else ""
        reference = baselines.reference_answers.get(item.id)
        recorded += reference is not None
        correct += grade_item(text, item)
        similarities[item.id] = round(similarity(text, reference or item.reference), 6)
        # The header when the server sends one; else what registry and serving API say.
        versions[answer.headers.get(MODEL_VERSION_HEADER) or fallback] += 1
    count = len(golden_set)
    accuracy = correct / count if count else 0.0
    mean = sum(similarities.values()) / count if count else 0.0
    floor = baselines.accuracy_ratio - gates.accuracy_tolerance
    threshold = gates.similarity_threshold
    wrong_versions = sorted(v for v in versions if v not in (snapshot.version, UNKNOWN_VERSION))
    problems = []
    if accuracy + _EPSILON < floor:
        problems.append(
            f"accuracy {accuracy:.4f} < {floor:.4f} (baseline "
            f"{baselines.accuracy_ratio:.4f} - {gates.accuracy_tolerance})"
        )
    if mean + _EPSILON < threshold:
        problems.append(f"mean similarity {mean:.4f} < {threshold}")
    if wrong_versions:
        problems.append(f"served by version(s) {', '.join(wrong_versions)}, not {snapshot.version}")
    if served is not None and served.problem is not None and versions[UNKNOWN_VERSION]:
        # No header vouched for these answers, and the registry and serving API could not.
        problems.append(f"cannot tell the serving version: {served.problem}")
    data = {
        "snapshot_id": snapshot.snapshot_id,
        "model": model,
        "url": base_url,
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


__all__ = ["Continuity", "Gates", "ServedVersion", "build_served_version", "check_continuity"]
