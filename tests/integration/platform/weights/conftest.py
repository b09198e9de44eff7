"""Fixtures of the weights adapters' integration tests: one real SeaweedFS and one SoftHSM2
token directory for the session (each test makes buckets of its own), a PKCS#11 KEK wrapper per
test (PKCS#11 login is per process and token, so a test that logs in anew finds it closed)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from redline.platform.weights.keys import (
    Pkcs11KeyWrapper,
    create_pkcs11_kek,
    open_pkcs11_key_wrapper,
)
from redline.platform.weights.s3store import S3RecordStore, open_s3_record_store
from redline.platform.weights.settings import Pkcs11Settings, S3StoreSettings
from tests.support.seaweedfs import SeaweedS3, make_bucket, seaweedfs
from tests.support.softhsm import SoftHsmToken, softhsm

KEK_A = "redline-kek-a"
KEK_B = "redline-kek-b"
NO_USER_PIN = "redline-no-user-pin"
"""A second token on the same module, initialised with an SO PIN only."""


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One real SeaweedFS (`weed mini`) for the session."""
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture()
def bucket_name() -> str:
    """A bucket name no other test uses."""
    return f"t-{uuid.uuid4().hex[:16]}"


def store_settings(seaweed: SeaweedS3, bucket: str, **extra: object) -> S3StoreSettings:
    """Settings of a bucket on the test server."""
    return S3StoreSettings.model_validate(
        {"endpoint_url": seaweed.endpoint_url, "bucket": bucket, "max_attempts": 1, **extra}
    )


@pytest.fixture()
def locked_store(seaweed: SeaweedS3, bucket_name: str) -> S3RecordStore:
    """A record store on a fresh bucket with versioning and a GOVERNANCE default retention."""
    make_bucket(seaweed.client(), bucket_name)
    return open_s3_record_store(store_settings(seaweed, bucket_name), seaweed.session())


@pytest.fixture(scope="session")
def hsm_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftHsmToken]:
    """A SoftHSM2 token with two KEKs (KEK_A, KEK_B) made by `create_pkcs11_kek`; beside it on
    the module, the token NO_USER_PIN (made before the module is first loaded: it reads its
    token directory once)."""
    with softhsm(tmp_path_factory.mktemp("softhsm"), without_user_pin=(NO_USER_PIN,)) as tokens:
        token = tokens[0]
        for label in (KEK_A, KEK_B):
            create_pkcs11_kek(hsm_settings(token, label))
        yield token


def hsm_settings(token: SoftHsmToken, kek: str = KEK_A, pin: str | None = None) -> Pkcs11Settings:
    """Settings naming the token's module, label and PIN and the KEK `kek`."""
    return Pkcs11Settings.model_validate(
        {
            "module_path": token.module_path,
            "token_label": token.label,
            "kek_label": kek,
            "pin": token.pin if pin is None else pin,
        }
    )


@pytest.fixture()
def wrapper(hsm_token: SoftHsmToken) -> Iterator[Pkcs11KeyWrapper]:
    """KEK_A on the test token, logged in for the test and closed after it."""
    with open_pkcs11_key_wrapper(hsm_settings(hsm_token)) as opened:
        yield opened
