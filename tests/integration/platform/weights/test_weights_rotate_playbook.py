"""`weights_rotate` end to end on real components: a keyring on a real SeaweedFS bucket, its DEKs
wrapped by a real SoftHSM2 KEK, the real receiver over HTTP, a real worker and Redis. The spec
says `weights.dek_rotation_hours: 24`; a `DEKRotationOverdue{cause="rotation"}` alert on a
keyring whose DEK is 30 h old rotates it (the old DEK retired, still decrypting its shards), the
exporter's figures then clear the alert's condition, and a rerun only checks; shadow mode changes
nothing; with `new_kek_label` every live DEK is re-wrapped under the new KEK."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from redline.exporters.settings import WeightsSection
from redline.exporters.weights import build_weights_samples, fetch_weights_figures
from redline.platform.weights.keyring import Keyring, load_dek_records
from redline.platform.weights.keys import open_pkcs11_key_wrapper, pkcs11_kek_id
from redline.platform.weights.s3store import S3RecordStore
from redline.platform.weights.settings import KeyringSettings, ShardSettings
from redline.platform.weights.shards import write_shards
from redline.remediation.audit import AuditLog
from redline.remediation.settings import RemediationSettings
from redline.slo import catalog
from redline.slo.alerts import Alert
from redline.slo.load import default_spec_text, load_spec
from redline.slo.spec import PlaybookPolicy
from tests.integration.platform.weights.conftest import KEK_A, KEK_B, hsm_settings, store_settings
from tests.support.playbook import playbook_settings, records, run_jobs
from tests.support.remediation import alert
from tests.support.seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedS3
from tests.support.softhsm import SoftHsmToken

pytestmark = pytest.mark.integration

KEYRING = "serving"
HOUR = 3600.0
AGE = 30 * HOUR
"""The DEK's age: overdue under the test spec's 24 h, not under the default 72 h."""


@dataclass
class World:
    seaweed: SeaweedS3
    token: SoftHsmToken
    store: S3RecordStore
    spec_file: Path
    pin_file: Path
    shards: list[int]
    """The key versions of the shards written under the first DEK."""

    def settings(self, redis_url: str, **options: Any) -> RemediationSettings:
        playbook = {
            "store": store_settings(self.seaweed, self.store.bucket).model_dump(mode="json"),
            "pkcs11_module": str(self.token.module_path),
            "token_label": self.token.label,
            "kek_label": KEK_A,
            "pin_file": str(self.pin_file),
            **options.pop("playbook", {}),
        }
        return playbook_settings(
            redis_url,
            spec=self.spec_file,
            playbook_options={"weights_rotate": playbook},
            **options,
        )

    def versions(self) -> list[tuple[int, str, bool]]:
        """(version, KEK id, retired) of each DEK record."""
        return [
            (r.version, r.kek_id, r.retired_at is not None)
            for r in load_dek_records(self.store, KEYRING)
        ]

    def decrypts(self, kek: str, *versions: int) -> bool:
        """Whether each version unwraps with `kek` through the HSM (the test's own login)."""
        policy = load_spec(self.spec_file).spec.weights
        with open_pkcs11_key_wrapper(hsm_settings(self.token, kek)) as wrapper:
            keyring = Keyring(self.store, wrapper, KeyringSettings(name=KEYRING), policy=policy)
            return all(len(keyring.dek_for_decrypt(v).key) == 32 for v in versions)


@pytest.fixture()
def world(
    seaweed: SeaweedS3,
    locked_store: S3RecordStore,
    hsm_token: SoftHsmToken,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> World:
    # The playbook's store takes the standard boto3 credential chain: here, the environment.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(default_spec_text() + "\nweights:\n  dek_rotation_hours: 24\n")
    pin = tmp_path / "pin"
    pin.write_text(hsm_token.pin + "\n")
    source = tmp_path / "w.bin"
    source.write_bytes(os.urandom(2 * 4096))
    then = time.time() - AGE
    # The test's own PKCS#11 login ends before the worker logs in (one login per process).
    with open_pkcs11_key_wrapper(hsm_settings(hsm_token)) as wrapper:
        keyring = Keyring(locked_store, wrapper, KeyringSettings(name=KEYRING))
        manifest = write_shards(locked_store, keyring, "m", "v1", source,
                                settings=ShardSettings(shard_size=4096), now=then)  # fmt: skip
    assert manifest.keyring == KEYRING
    return World(seaweed, hsm_token, locked_store, spec_file, pin,
                 [s.key_version for s in manifest.shards])  # fmt: skip


def _alert(fingerprint: str) -> dict[str, Any]:
    labels = {"alertname": str(Alert.DEK_ROTATION_OVERDUE), "keyring": KEYRING,
              "cause": "rotation", "severity": "ticket"}  # fmt: skip
    return alert(fingerprint, playbook="weights_rotate", labels=labels)


def _overdue(world: World) -> bool:
    """The alert's condition, as the exporter publishes it: DEK age over the rotation period."""
    section = WeightsSection(keyrings=(KeyringSettings(name=KEYRING),))
    policy = load_spec(world.spec_file).spec.weights
    samples = build_weights_samples(
        fetch_weights_figures(world.store, section, time.time(), policy)
    )
    value = {s.name: s.value for s in samples if s.labels.get("keyring") == KEYRING}
    age = value[catalog.WEIGHTS_DEK_AGE_SECONDS.family]
    return age > value[catalog.WEIGHTS_DEK_ROTATION_SECONDS.family]


def test_an_overdue_dek_is_rotated_by_the_specs_period_audited_and_a_rerun_only_checks(
    redis_url: str, world: World
) -> None:
    assert _overdue(world)
    settings = world.settings(redis_url)
    [job] = run_jobs(settings, _alert("d0e0000000000001"))
    assert job.status == "succeeded", (job.error, job.steps)
    assert [step["name"] for step in job.plan or []] == ["rotate"]
    [rotated] = records(job, "rotated")
    assert rotated["data"]["version"] == 2 and rotated["data"]["retired"] == 1
    kek_a = pkcs11_kek_id(world.token.label, KEK_A)
    assert world.versions() == [(1, kek_a, True), (2, kek_a, False)]
    assert not _overdue(world)
    # The retired DEK still decrypts its shards (30 days of retention), the new one too.
    assert set(world.shards) == {1} and world.decrypts(KEK_A, 1, 2)
    # Audited: the trail names the step and ends succeeded.
    client = redis.Redis.from_url(redis_url)
    trail = [json.loads(line) for line in AuditLog(client, settings.key_prefix).records()]
    client.close()
    mine = [entry for entry in trail if entry.get("job_id") == job.id]
    assert mine and "succeeded" in json.dumps(mine[-1])
    assert any("rotated" in json.dumps(entry) for entry in mine)

    # The same alert again: only the read-only check; nothing rotated.
    [again] = run_jobs(settings, _alert("d0e0000000000002"))
    assert again.status == "succeeded", again.error
    assert [step["name"] for step in again.plan or []] == ["check"]
    assert records(again, "rotated") == []
    assert len(world.versions()) == 2


def test_shadow_mode_changes_nothing(redis_url: str, world: World) -> None:
    settings = world.settings(redis_url, policies={"weights_rotate": PlaybookPolicy(mode="shadow")})
    before = world.versions()
    [job] = run_jobs(settings, _alert("d0e0000000000003"))
    assert job.status == "shadowed" and job.outcome == "shadow", (job.error, job.steps)
    assert [s["name"] for s in job.steps if s["phase"] == "shadow"] == ["rotate"]
    assert not [s for s in job.steps if s["phase"] in ("execute", "verify")]
    assert world.versions() == before and _overdue(world)


def test_a_new_kek_label_rewraps_every_live_dek_under_it(redis_url: str, world: World) -> None:
    settings = world.settings(redis_url, playbook={"new_kek_label": KEK_B})
    [job] = run_jobs(settings, _alert("d0e0000000000004"))
    assert job.status == "succeeded", (job.error, job.steps)
    assert [step["name"] for step in job.plan or []] == ["rotate", "rewrap"]
    kek_b = pkcs11_kek_id(world.token.label, KEK_B)
    # The new DEK was made under the new KEK; the retired one re-wrapped under it.
    assert world.versions() == [(1, kek_b, True), (2, kek_b, False)]
    assert world.decrypts(KEK_B, 1, 2) and not _overdue(world)
    [rewrapped] = records(job, "rewrapped")
    assert rewrapped["data"]["versions"] == [1]
    # Rerun with the same options: every DEK is under the new KEK already; a check only.
    [again] = run_jobs(settings, _alert("d0e0000000000005"))
    assert [step["name"] for step in again.plan or []] == ["check"], again.steps


def test_a_keyring_the_bucket_lacks_is_refused_not_started(redis_url: str, world: World) -> None:
    body = _alert("d0e0000000000006")
    body["labels"]["keyring"] = "nobody"
    [job] = run_jobs(world.settings(redis_url), body)
    assert job.status == "failed", job.steps
    assert job.error is not None and "keyring 'nobody' has no DEK" in job.error
    assert "playbook_options.weights_rotate.store" in job.error
    assert load_dek_records(world.store, "nobody") == []
