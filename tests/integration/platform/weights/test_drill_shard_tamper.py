"""Drill `shard-tamper` (#29): a byte flipped in one shard of the next version. The activation
is refused, the alert fires, the fallback holds, and no request fails.

End to end on real components: two buckets of a real SeaweedFS (the primary region and a
healthy `us-east` copy), DEKs wrapped by a real SoftHSM2 KEK, the real exporter app running the
weights probe, a real Prometheus on the generated weights rules (local profile: 1 s scrape and
evaluation), a real Alertmanager on the generated config, the real receiver and a real worker.

"Activation" is `select_verified` (`redline.platform.weights.shards`): the serving side verifies
a candidate version (incrementally against the last verified one) before it serves it and
records the verdict; a failure falls back to that last verified version, which keeps serving.
Throughout, a reader plays the serving side's loads: the active version's shards fetched from
the primary bucket, each DEK unwrapped through the HSM, decrypted and checked
(`load_weights`), every 50 ms; any error is a failed request.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from redline.exporters.settings import WeightsSection
from redline.exporters.weights import WeightsProbe
from redline.platform.weights.keyring import Keyring
from redline.platform.weights.keys import open_pkcs11_key_wrapper
from redline.platform.weights.s3store import S3RecordStore, open_s3_record_store
from redline.platform.weights.settings import ShardSettings
from redline.platform.weights.shards import (
    Selection,
    ShardManifest,
    load_weights,
    select_verified,
    shard_key,
    write_shards,
)
from redline.platform.weights.sync import Region, sync_weights
from redline.remediation.jobs import TERMINAL, Job
from redline.remediation.playbooks.weights import HSM_LOCK
from redline.remediation.playbooks.weights import NAME as RESYNC
from redline.slo import catalog
from redline.slo.alerts import Alert
from tests.integration.platform.weights.conftest import KEK_A, hsm_settings, store_settings
from tests.integration.platform.weights.drill import (
    PROBE_SECONDS,
    Timeline,
    active,
    drill_spec,
    fired_at,
    monitoring,
    wait_until,
)
from tests.support.playbook import playbook_settings, real_workers, records
from tests.support.remediation import TOKEN, receiver, store_for
from tests.support.seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedS3, make_bucket
from tests.support.softhsm import SoftHsmToken

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAME = "support-lora"
SMALL = ShardSettings(shard_size=4096)
SHARDS = 6
CHANGED = 3
"""The shard the next version changes, and the one whose byte the drill flips."""
HEALTHY = "us-east"


@dataclass
class Reader:
    """The serving side's loads of the active version, counted by outcome."""

    store: S3RecordStore
    token: SoftHsmToken
    out: Path
    active: ShardManifest
    stop: threading.Event = field(default_factory=threading.Event)
    outcomes: Counter[str] = field(default_factory=Counter)
    versions: Counter[str] = field(default_factory=Counter)
    thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self.stop.is_set():
            manifest = self.active
            try:
                # One PKCS#11 login per process and token: the worker's playbook takes turns.
                with HSM_LOCK, open_pkcs11_key_wrapper(hsm_settings(self.token)) as wrapper:
                    load_weights(self.store, Keyring(self.store, wrapper), manifest, self.out)
                outcome = "ok"
            except Exception as exc:  # any failure of a load is a failed request: counted
                outcome = f"{type(exc).__name__}: {exc}"
            self.outcomes[outcome] += 1
            self.versions[manifest.version] += 1
            time.sleep(0.05)

    def start(self) -> None:
        """Start loading in a thread."""
        self.thread = threading.Thread(target=self._run, name="weights-reader", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop and join the reader."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(15)


def _flip(store: S3RecordStore, key: str) -> None:
    found = store.get(key)
    assert found is not None
    data = bytearray(found[0])
    data[len(data) // 2] ^= 0x01  # one bit of one byte in the ciphertext
    store.put(key, bytes(data))


def _activate(store: S3RecordStore, token: SoftHsmToken, version: str) -> Selection:
    with HSM_LOCK, open_pkcs11_key_wrapper(hsm_settings(token)) as wrapper:
        return select_verified(store, Keyring(store, wrapper), NAME, version)


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_shard_tamper_is_refused_falls_back_alerts_and_is_resynced(  # noqa: PLR0915 - one story
    seaweed: SeaweedS3,
    bucket_name: str,
    hsm_token: SoftHsmToken,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    began = time.monotonic()
    # The worker's stores take the standard boto3 credential chain: here, the environment.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    buckets = {"primary": bucket_name, HEALTHY: f"{bucket_name}-{HEALTHY}"}
    stores = {}
    for region, bucket in buckets.items():
        make_bucket(seaweed.client(), bucket)
        stores[region] = open_s3_record_store(store_settings(seaweed, bucket), seaweed.session())
    primary = stores["primary"]

    # Version N verified and active; version N+1 changes one shard; both reach us-east.
    source = tmp_path / "w.bin"
    source.write_bytes(os.urandom(SHARDS * 4096))
    with HSM_LOCK, open_pkcs11_key_wrapper(hsm_settings(hsm_token)) as wrapper:
        keyring = Keyring(primary, wrapper)
        v1 = write_shards(primary, keyring, NAME, "v1", source, settings=SMALL,
                          now=time.time() - 10)  # fmt: skip
        first = select_verified(primary, keyring, NAME, "v1")
        assert first.report.ok and not first.fell_back
        data = bytearray(source.read_bytes())
        data[CHANGED * 4096 + 7] ^= 0xFF
        source.write_bytes(bytes(data))
        v2 = write_shards(primary, keyring, NAME, "v2", source, settings=SMALL, base=v1)
    sync_weights(Region("primary", primary, bucket_name),
                 Region(HEALTHY, stores[HEALTHY], buckets[HEALTHY]), NAME, primary)  # fmt: skip
    tampered = shard_key(NAME, v2.shards[CHANGED].shard_id)
    assert v2.shards[CHANGED].shard_id not in {e.shard_id for e in v1.shards}

    pin = tmp_path / "pin"
    pin.write_text(hsm_token.pin + "\n")
    (tmp_path / "webhook").write_text(TOKEN + "\n")

    def where(region: str) -> dict[str, object]:
        return store_settings(seaweed, buckets[region]).model_dump(mode="json")

    settings = playbook_settings(redis_url, playbook_options={RESYNC: {
        "store": where("primary"), "region": "primary", "sources": {HEALTHY: where(HEALTHY)},
        "pkcs11_module": str(hsm_token.module_path), "token_label": hsm_token.label,
        "kek_label": KEK_A, "pin_file": str(pin)}})  # fmt: skip
    section = WeightsSection(
        interval_seconds=PROBE_SECONDS, models=(NAME,), regions=(HEALTHY,), checkpoints=False
    )
    failed_series = catalog.WEIGHTS_SHARDS_FAILED_VERIFICATION
    with ExitStack() as stack:
        the_receiver = stack.enter_context(receiver(settings))
        spec = drill_spec(the_receiver.url, tmp_path / "webhook")
        probe_store = S3RecordStore(seaweed.client(), bucket_name)
        probe = WeightsProbe(section, spec.weights, probe_store)
        prometheus = stack.enter_context(monitoring(tmp_path / "mon", spec, probe))
        stack.enter_context(real_workers(settings))
        reader = Reader(S3RecordStore(seaweed.client(), bucket_name), hsm_token,
                        tmp_path / "serving" / "weights.bin", first.manifest)  # fmt: skip
        stack.callback(reader.close)
        reader.start()
        wait_until(
            lambda: prometheus.instant(f'{failed_series}{{model_version="v1"}}'),
            timeout=20,
            what="Prometheus scraping v1's verdict",
        )
        wait_until(lambda: reader.outcomes["ok"] >= 3, timeout=10, what="the reader loading v1")

        # The fault: one bit of one byte of v2's changed shard, in the primary's copy only.
        timeline = Timeline("shard-tamper", time.time())
        _flip(primary, tampered)
        selection = _activate(primary, hsm_token, "v2")
        timeline.mark("activation refused (select_verified)", time.time())
        assert selection.fell_back and selection.manifest.version == "v1", selection
        assert selection.failed is not None and selection.failed.checked == [
            v2.shards[CHANGED].shard_id
        ], selection.failed
        assert any(primary.where(tampered) in problem for problem in selection.failed.problems)
        reader.active = selection.manifest  # the fallback: v1 stays active

        detected = wait_until(
            lambda: fired_at(
                prometheus, Alert.SHARD_VERIFICATION_FAILED, model=NAME, model_version="v2"
            ),  # fmt: skip
            timeout=20,
            what=f"{Alert.SHARD_VERIFICATION_FAILED} firing in Prometheus",
        )
        timeline.mark("detect: alert firing in Prometheus", detected)
        jobs, client = store_for(settings)
        stack.callback(client.close)

        def finished() -> Job | None:
            done = [j for j in jobs.list_jobs(playbook=RESYNC) if j.status in TERMINAL]
            return jobs.get(done[0].id) if done else None

        job: Job = wait_until(finished, timeout=30, what=f"the {RESYNC} job to end")
        assert job.status == "succeeded", (job.error, job.steps)
        assert job.alert["labels"]["model_version"] == "v2", job.alert
        executed = [s for s in job.steps if s["phase"] == "execute" and s["ok"]]
        timeline.mark("notify: receiver job accepted", _stamp(job.created_at))
        timeline.mark("playbook start", min(s["at"] for s in job.steps))
        timeline.mark("remediate: shard re-synced and verified", max(s["at"] for s in executed))
        [synced, *_] = records(job, "synced")
        assert synced["data"]["region"] == HEALTHY and synced["data"]["copied"] == [tampered]

        wait_until(
            lambda: not active(prometheus, Alert.SHARD_VERIFICATION_FAILED),
            timeout=20,
            what=f"{Alert.SHARD_VERIFICATION_FAILED} to resolve",
        )
        timeline.mark("recover: alert resolved", time.time())
        # Activated again, v2 now passes and serves.
        again = _activate(primary, hsm_token, "v2")
        assert again.report.ok and not again.fell_back and again.manifest.version == "v2"
        reader.active = again.manifest
        served = reader.versions["v2"]
        wait_until(lambda: reader.versions["v2"] >= served + 3, timeout=10, what="v2 served")
        reader.close()

    failures = {k: v for k, v in reader.outcomes.items() if k != "ok"}
    timeline.checks = {
        "activation of v2": f"refused, fell back to {selection.manifest.version}",
        "problems found": f"{len(selection.failed.problems)}: shard {CHANGED} of {SHARDS}",
        "incremental check": f"{len(selection.failed.checked)} checked, "
        f"{len(selection.failed.reused)} reused",
        "loads through the HSM": f"{sum(reader.outcomes.values())} "
        f"(v1 {reader.versions['v1']}, v2 {reader.versions['v2']})",
        "failed loads": str(sum(failures.values())),
        "drill wall time (s)": f"{time.monotonic() - began:.1f}",
    }
    print("\n" + timeline.render())
    assert not failures, failures
    order = [step for step in timeline.steps.values() if step is not None]
    assert len(order) == len(timeline.steps) and order[0] >= 0, timeline.render()
    assert order == sorted(order), timeline.render()  # each step after the one before
