"""Telling a deployment controller instead of the pods: one POST of the snapshot to a hook."""

from __future__ import annotations

from redline.core.settings import SettingsError, read_secret
from redline.platform.serving import call, http_client
from redline.platform.snapshots import Snapshot
from redline.remediation.playbook import PlaybookContext, PlaybookError
from redline.remediation.playbooks.rollback.plan import lora_name, lora_path
from redline.remediation.settings import RollbackSettings


def describe_hook(options: RollbackSettings) -> str:
    """The hook in words, for the plan."""
    return f"POST it to the hook {options.hook_url}"


def call_hook(
    ctx: PlaybookContext, options: RollbackSettings, timeout_seconds: float, snapshot: Snapshot
) -> str | None:
    """POST the snapshot to `rollback.hook_url` (idempotency key: job and snapshot); the problem,
    or None when the hook accepted it (2xx)."""
    assert options.hook_url is not None
    headers = {"Idempotency-Key": f"{ctx.job_id}:{snapshot.snapshot_id}"}
    try:
        token = read_secret(options.hook_token_file, None, "rollback.hook_token_file")
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
    with http_client(timeout_seconds) as client:
        answer = call(client, "POST", options.hook_url, body=body, headers=headers)
    if not 200 <= answer.status < 300:
        return f"hook answered HTTP {answer.status}: {answer.text[:200]}"
    ctx.record("hook", f"hook accepted {snapshot.snapshot_id}", status=answer.status)
    return None


__all__ = ["call_hook", "describe_hook"]
