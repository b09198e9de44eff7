"""The DEK lifecycle on real object storage, wrapped by a real HSM KEK: rotation every 72 h,
retired DEKs decrypting for 30 days, then expired; revocation; concurrent rotation; KEK
rotation (rewrap); the figures for monitoring."""

from __future__ import annotations

import threading

import pytest

from redline.platform.weights.errors import DekExpiredError, DekRevokedError, KeyringError
from redline.platform.weights.keyring import Dek, Keyring, build_dek_state
from redline.platform.weights.keys import Pkcs11KeyWrapper
from redline.platform.weights.s3store import S3RecordStore
from redline.platform.weights.settings import KeyringSettings
from redline.slo.load import parse_spec
from redline.slo.spec import Weights
from tests.integration.platform.weights.conftest import KEK_B
from tests.support.seaweedfs import SeaweedS3

T0 = 1_800_000_000.0
HOUR = 3600.0
DAY = 86400.0


def test_rotation_retention_expiry(locked_store: S3RecordStore, wrapper: Pkcs11KeyWrapper) -> None:
    keyring = Keyring(locked_store, wrapper)
    first = keyring.current(T0)
    assert first.version == 1 and len(first.key) == 32
    assert keyring.current(T0 + 71.9 * HOUR) == first  # younger than 72 h: kept
    second = keyring.current(T0 + 72 * HOUR)
    assert second.version == 2 and second.key != first.key
    old = keyring.record(1)
    assert old.retired_at == T0 + 72 * HOUR and old.kek_id == wrapper.kek_id
    assert keyring.state(old, T0 + 73 * HOUR) == "retired"

    # A retired DEK still decrypts older shards for 30 days after its retirement ...
    assert keyring.dek_for_decrypt(1, T0 + 72 * HOUR + 29.9 * DAY) == first
    # ... and then nothing: "expired", naming the setting.
    with pytest.raises(DekExpiredError, match=r"v1 expired.*30-day retention.*retention_days"):
        keyring.dek_for_decrypt(1, T0 + 72 * HOUR + 30 * DAY + 1)
    assert keyring.dek_for_decrypt(2, T0 + 80 * HOUR) == second

    figures = keyring.figures([1, 1, 2], now=T0 + 72 * HOUR + 31 * DAY)
    # Figures only read: v2 is overdue for rotation (next current() makes v3), v1 expired.
    assert figures.current_version == 2 and figures.seconds_to_rotation == 0
    assert figures.versions_by_state["expired"] == [1]
    assert figures.shards_past_retention == 2


def test_the_keyring_rotates_and_retires_by_the_specs_weights_section(
    locked_store: S3RecordStore, wrapper: Pkcs11KeyWrapper
) -> None:
    spec = parse_spec(
        "version: v1\nservice: s\nregions: [a]\n"
        "weights: {dek_rotation_hours: 24, dek_retention_days: 2}\n",
        "spec.yaml",
    ).spec
    keyring = Keyring(locked_store, wrapper, KeyringSettings(name="spec"), policy=spec.weights)
    first = keyring.current(T0)
    assert keyring.current(T0 + 23.9 * HOUR) == first  # younger than the spec's 24 h
    assert keyring.current(T0 + 24 * HOUR).version == 2
    assert keyring.dek_for_decrypt(1, T0 + 24 * HOUR + 2 * DAY) == first
    with pytest.raises(DekExpiredError, match=r"2-day retention \(spec weights\.dek_retention_d"):
        keyring.dek_for_decrypt(1, T0 + 24 * HOUR + 2 * DAY + 1)
    # A rewrap keeps the spec's periods.
    assert keyring.rewrap(wrapper).policy == spec.weights


def test_figures_of_the_current_dek(locked_store: S3RecordStore, wrapper: Pkcs11KeyWrapper) -> None:
    keyring = Keyring(
        locked_store, wrapper, KeyringSettings(name="fig"), policy=Weights(dek_rotation_hours=72)
    )
    keyring.current(T0)
    figures = keyring.figures([1, 1], now=T0 + 10 * HOUR)
    assert figures.current_version == 1
    assert figures.current_age_seconds == pytest.approx(10 * HOUR)
    assert figures.seconds_to_rotation == pytest.approx(62 * HOUR)
    assert figures.shards_by_version == {1: 2} and figures.shards_past_retention == 0


def test_revoked_dek_is_refused_and_replaced(
    locked_store: S3RecordStore, wrapper: Pkcs11KeyWrapper
) -> None:
    keyring = Keyring(locked_store, wrapper)
    keyring.current(T0)
    keyring.revoke(1, reason="key material exposed", now=T0 + HOUR)
    with pytest.raises(DekRevokedError, match=r"v1 was revoked.*key material exposed"):
        keyring.dek_for_decrypt(1, T0 + 2 * HOUR)
    replacement = keyring.current(T0 + 2 * HOUR)
    assert replacement.version == 2  # a revoked DEK encrypts nothing new either
    record = keyring.record(1)
    assert build_dek_state(record, keyring.policy, T0 + 2 * HOUR) == "revoked"
    assert keyring.figures([1, 2], now=T0 + 2 * HOUR).shards_past_retention == 1


def test_rotation_is_forced_and_an_interrupted_one_healed(
    locked_store: S3RecordStore, wrapper: Pkcs11KeyWrapper
) -> None:
    keyring = Keyring(locked_store, wrapper)
    keyring.current(T0)
    created = keyring.rotate(T0 + HOUR)
    assert created.version == 2 and keyring.record(1).retired_at == T0 + HOUR
    # A crash after creating v3 but before retiring v2: the next current() retires it.
    keyring._create(3, T0 + 2 * HOUR)
    assert keyring.record(2).retired_at is None
    assert keyring.current(T0 + 3 * HOUR).version == 3
    assert keyring.record(2).retired_at == T0 + 2 * HOUR


def test_concurrent_rotation_makes_one_dek(
    seaweed: SeaweedS3, locked_store: S3RecordStore, wrapper: Pkcs11KeyWrapper
) -> None:
    Keyring(locked_store, wrapper).current(T0)
    keyrings = [
        Keyring(S3RecordStore(seaweed.client(), locked_store.bucket), wrapper) for _ in range(3)
    ]
    barrier = threading.Barrier(len(keyrings), timeout=30)
    got: list[Dek] = []

    def rotate(keyring: Keyring) -> None:
        barrier.wait()
        got.append(keyring.current(T0 + 100 * HOUR))

    threads = [threading.Thread(target=rotate, args=(k,)) for k in keyrings]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(got) == 3 and len({(d.version, d.key) for d in got}) == 1
    assert [r.version for r in keyrings[0].records()] == [1, 2]


def test_rewrap_moves_every_live_dek_to_a_new_kek(
    locked_store: S3RecordStore, wrapper: Pkcs11KeyWrapper
) -> None:
    keyring = Keyring(locked_store, wrapper)
    first = keyring.current(T0)
    keyring.rotate(T0 + HOUR)
    new_kek = wrapper.with_kek(KEK_B)
    moved = keyring.rewrap(new_kek, now=T0 + 2 * HOUR)
    assert {r.kek_id for r in moved.records()} == {new_kek.kek_id}
    assert moved.dek_for_decrypt(1, T0 + 2 * HOUR) == first  # the same DEK, another KEK
    with pytest.raises(KeyringError, match="rewrap pending"):
        keyring.dek_for_decrypt(1, T0 + 2 * HOUR)  # the old KEK's keyring no longer unwraps
