"""LoRA checkpoint RPO from object versions: the newest version's LastModified per adapter."""

from __future__ import annotations

import time

from redline.platform.weights.checkpoints import (
    build_rpo_figures,
    checkpoint_key,
    fetch_checkpoint_ages,
    write_checkpoint,
)
from redline.platform.weights.s3store import S3RecordStore


def test_checkpoint_age_from_the_newest_version(locked_store: S3RecordStore) -> None:
    before = time.time()
    for round_ in range(3):
        write_checkpoint(locked_store, "support/lora", f"state {round_}".encode())
    write_checkpoint(locked_store, "billing", b"state")
    locked_store.put("adapters/not-a-checkpoint", b"x")  # other objects are left out

    now = time.time() + 100.0
    ages = fetch_checkpoint_ages(locked_store, now=now)
    assert set(ages) == {"support/lora", "billing"}
    newest = ages["support/lora"]
    head = locked_store.client.head_object(
        Bucket=locked_store.bucket, Key=locked_store.object_key(checkpoint_key("support/lora"))
    )
    assert newest.version_id == head["VersionId"] and not newest.deleted
    # S3 stamps LastModified in whole seconds.
    assert before - 1 <= newest.last_modified <= time.time()
    assert 99.0 <= newest.age_seconds <= 100.0 + (time.time() - before) + 1
    assert newest.last_modified == head["LastModified"].timestamp()

    only = fetch_checkpoint_ages(locked_store, adapters=["billing", "never"], now=now)
    assert set(only) == {"billing"}
    figures = build_rpo_figures(only, ["billing", "never"], rpo_seconds=90)
    assert figures.breaches == ["billing", "never"]  # 100 s old, and missing
    fresh = fetch_checkpoint_ages(locked_store, now=time.time())
    assert build_rpo_figures(fresh, ["billing", "support/lora"]).breaches == []

    locked_store.client.delete_object(
        Bucket=locked_store.bucket, Key=locked_store.object_key(checkpoint_key("billing"))
    )
    deleted = fetch_checkpoint_ages(locked_store, now=time.time())["billing"]
    assert deleted.deleted
    assert build_rpo_figures({"billing": deleted}, ["billing"]).breaches == ["billing"]
