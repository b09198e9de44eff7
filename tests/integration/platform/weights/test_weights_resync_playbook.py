"""`weights_resync` end to end on real components: three buckets of a real SeaweedFS standing for
three regions, a real SoftHSM2 KEK, the real receiver over HTTP, a real worker and Redis. A
`ShardVerificationFailed` alert re-syncs the damaged shard from the first healthy region and
verifies the version again; shadow mode changes nothing; with every source damaged the job
fails naming each region."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from redline.platform.weights.errors import ManifestError
from redline.platform.weights.keyring import Keyring
from redline.platform.weights.keys import open_pkcs11_key_wrapper
from redline.platform.weights.s3store import S3RecordStore, open_s3_record_store
from redline.platform.weights.settings import ShardSettings
from redline.platform.weights.shards import (
    load_manifest,
    load_verdict,
    select_verified,
    shard_key,
    verify_full,
    write_shards,
)
from redline.platform.weights.sync import Region, load_sync_table, sync_weights
from redline.remediation.audit import AuditLog
from redline.remediation.settings import RemediationSettings
from redline.slo.spec import PlaybookPolicy
from tests.integration.platform.weights.conftest import hsm_settings, store_settings
from tests.support.playbook import playbook_settings, records, run_jobs
from tests.support.remediation import alert
from tests.support.seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedS3, make_bucket
from tests.support.softhsm import SoftHsmToken

pytestmark = pytest.mark.integration

NAME = "support-lora"
VERSION = "v1"
SMALL = ShardSettings(shard_size=4096)
SOURCES = ("us-east", "ap-south")


@dataclass
class World:
    seaweed: SeaweedS3
    token: SoftHsmToken
    buckets: dict[str, str]
    stores: dict[str, S3RecordStore]
    damaged: str
    """The record key of the shard damaged in the primary."""
    pin_file: Path

    def settings(self, redis_url: str, **overrides: Any) -> RemediationSettings:
        def where(region: str) -> dict[str, Any]:
            return store_settings(self.seaweed, self.buckets[region]).model_dump(mode="json")

        options = {
            "store": where("primary"),
            "sources": {region: where(region) for region in SOURCES},
            "pkcs11_module": str(self.token.module_path),
            "token_label": self.token.label,
            "kek_label": "redline-kek-a",
            "pin_file": str(self.pin_file),
        }
        return playbook_settings(
            redis_url, playbook_options={"weights_resync": options}, **overrides
        )

    def damage(self, region: str) -> None:
        store = self.stores[region]
        found = store.get(self.damaged)
        assert found is not None
        data = bytearray(found[0])
        data[len(data) // 2] ^= 0xFF
        store.put(self.damaged, bytes(data))

    def verifies(self, region: str = "primary") -> bool:
        store = self.stores[region]
        with open_pkcs11_key_wrapper(hsm_settings(self.token)) as wrapper:
            manifest = load_manifest(store, NAME, VERSION)
            return verify_full(store, Keyring(store, wrapper), manifest).ok


@pytest.fixture()
def world(
    seaweed: SeaweedS3,
    bucket_name: str,
    hsm_token: SoftHsmToken,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> World:
    # The playbook's stores take the standard boto3 credential chain: here, the environment.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    buckets = {"primary": bucket_name, **{r: f"{bucket_name}-{r}" for r in SOURCES}}
    stores = {}
    for region, bucket in buckets.items():
        make_bucket(seaweed.client(), bucket)
        stores[region] = open_s3_record_store(store_settings(seaweed, bucket), seaweed.session())
    primary = stores["primary"]
    source = tmp_path / "w.bin"
    source.write_bytes(os.urandom(4 * 4096))
    # The test's own PKCS#11 login ends before the worker logs in (one login per process).
    with open_pkcs11_key_wrapper(hsm_settings(hsm_token)) as wrapper:
        keyring = Keyring(primary, wrapper)
        manifest = write_shards(primary, keyring, NAME, VERSION, source, settings=SMALL)
        for region in SOURCES:
            dest = Region(region, stores[region], buckets[region])
            sync_weights(Region("primary", primary, bucket_name), dest, NAME, primary)
        pin = tmp_path / "pin"
        pin.write_text(hsm_token.pin + "\n")
        found = World(seaweed, hsm_token, buckets, stores, "", pin)
        found.damaged = shard_key(NAME, manifest.shards[2].shard_id)
        found.damage("primary")
        with pytest.raises(ManifestError, match="failed verification"):
            select_verified(primary, keyring, NAME, VERSION)
    verdict = load_verdict(primary, NAME, VERSION)
    assert verdict is not None and not verdict.ok
    return found


def _alert(fingerprint: str) -> dict[str, Any]:
    labels = {"alertname": "ShardVerificationFailed", "model": NAME, "model_version": VERSION,
              "severity": "page"}  # fmt: skip
    return alert(fingerprint, playbook="weights_resync", labels=labels)


def test_a_damaged_shard_is_resynced_from_the_first_healthy_region_and_verified(
    redis_url: str, world: World
) -> None:
    settings = world.settings(redis_url)
    [job] = run_jobs(settings, _alert("5e00000000000001"))
    assert job.status == "succeeded", (job.error, job.steps)
    # On a busy machine a worker can lose its lease in a slow step: the job is reclaimed and
    # re-planned from the store (a verdict already written plans the read-only check), so the
    # steps are counted across attempts.
    ran = [s["name"] for s in job.steps if s["phase"] == "execute" and s["ok"]]
    assert ran[0] == "resync" and ("reverify" in ran or ran[-1] == "check"), job.steps
    # Only the damaged shard was copied, from the first source; the second was not needed.
    synced = records(job, "synced")
    assert synced and synced[0]["data"]["region"] == "us-east", job.steps
    assert synced[0]["data"]["copied"] == [world.damaged]
    assert all(again["data"]["copied"] == [] for again in synced[1:])
    assert records(job, "source_refused") == []
    # The shard is whole again, and the verdict the exporter reads passed.
    assert world.verifies()
    verdict = load_verdict(world.stores["primary"], NAME, VERSION)
    assert verdict is not None and verdict.ok and verdict.mode == "full"
    table = load_sync_table(world.stores["primary"], NAME, "primary")
    assert VERSION in table.versions
    # Audited: the trail names the steps and ends succeeded.
    client = redis.Redis.from_url(redis_url)
    trail = [json.loads(line) for line in AuditLog(client, settings.key_prefix).records()]
    client.close()
    mine = [entry for entry in trail if entry.get("job_id") == job.id]
    assert mine and "succeeded" in json.dumps(mine[-1])
    for kind in ("resync", "synced"):
        assert any(kind in json.dumps(entry) for entry in mine), kind

    # The same alert again: only the read-only check; nothing copied, nothing re-verified.
    [again] = run_jobs(settings, _alert("5e00000000000002"))
    assert again.status == "succeeded", again.error
    assert [step["name"] for step in again.plan or []] == ["check"]
    assert records(again, "synced") == []
    assert load_verdict(world.stores["primary"], NAME, VERSION) == verdict


def test_shadow_mode_changes_nothing(redis_url: str, world: World) -> None:
    settings = world.settings(redis_url, policies={"weights_resync": PlaybookPolicy(mode="shadow")})
    before = load_verdict(world.stores["primary"], NAME, VERSION)
    [job] = run_jobs(settings, _alert("5e00000000000003"))
    assert job.status == "shadowed" and job.outcome == "shadow", (job.error, job.steps)
    assert [s["name"] for s in job.steps if s["phase"] == "shadow"] == ["resync", "reverify"]
    assert not [s for s in job.steps if s["phase"] in ("execute", "verify")]
    assert not world.verifies(), "shadow mode repaired the shard"
    assert load_verdict(world.stores["primary"], NAME, VERSION) == before


def test_every_source_damaged_fails_the_job_naming_each_region(
    redis_url: str, world: World
) -> None:
    for region in SOURCES:
        world.damage(region)
    [job] = run_jobs(world.settings(redis_url), _alert("5e00000000000004"))
    assert job.status == "failed", job.steps
    assert job.error is not None and "no healthy region to re-sync from" in job.error
    for region in SOURCES:
        assert f"damaged in region {region!r}" in job.error, job.error
    # A worker that lost its lease on a busy machine leaves its attempt's refusals too: the
    # last attempt refused every source, in order.
    refused = [r["data"]["region"] for r in records(job, "source_refused")]
    assert refused[-len(SOURCES) :] == list(SOURCES) and set(refused) == set(SOURCES), refused
    # A damaged source is not retried: the step failed once, for good.
    failed = [s for s in job.steps if s["phase"] == "execute" and s["name"] == "resync"
              and not s["ok"]]  # fmt: skip
    assert len(failed) == 1, job.steps
    assert not world.verifies()
