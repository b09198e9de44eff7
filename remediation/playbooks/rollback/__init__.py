"""`semantic_rollback`: put a model back on its newest verified snapshot, on every pod, with no
failed request, and prove continuity.

Target: the alert's `model` label (the served model name in the snapshot registry). The plan
starts with read-only checks, which shadow mode runs too: `discover_pods` (every region's pods:
`serving.pods` — a static list, DNS or the Kubernetes EndpointSlice API — else the region's
upstream URL as its one pod), `check_pods` (what each pod serves), `check_golden` (the golden
set through the gateway as served now: the evidence) and `select_snapshot` (the verified
snapshots older than the one active when the job started, newest first, their hashes
recomputed; a mismatch, an unverified or an unreadable snapshot is skipped, the reason
recorded). Then one `try_snapshot` per candidate (at most `rollback.max_candidates`), each
switching every pod without a moment where the served adapter name is missing (`switch`):
load beside under `<adapter>@<version>`, golden set per pod, pointer, in-place reload, golden
set through the gateway, unload the staged copy. With `rollback.hook_url` one POST to the hook
replaces the pod steps.

A candidate whose answers fail the gates is rejected and the next older one is tried; when none
is left the original snapshot is put back (pointer and every pod, in place) and the job fails:
it pages. A pod that refuses a load fails the job at once with the per-pod report, every pod
still serving a working version. Idempotent: the job's progress (the original snapshot, the
rejected candidates, the chosen one) lives in Redis and every pod operation first reads the
pod's `/v1/models`, so a re-run after a crash at any point converges. A resolved alert changes
nothing: rolling forward again is a human decision.

Modules: `plan` (names, candidates, steps), `state` (progress in Redis), `pods` (discovery,
per-pod operations and report), `switch` (one candidate on every pod; putting the original
back), `verify` (the golden-set gates), `hook`, `playbook` (the `Playbook` itself).
"""

from redline.remediation.playbooks.rollback.plan import (
    Selection,
    build_selection,
    lora_name,
    lora_path,
    staged_name,
)
from redline.remediation.playbooks.rollback.playbook import SemanticRollback
from redline.remediation.playbooks.rollback.verify import ServedVersion, build_served_version

__all__ = [
    "SemanticRollback",
    "Selection",
    "ServedVersion",
    "build_selection",
    "build_served_version",
    "lora_name",
    "lora_path",
    "staged_name",
]
