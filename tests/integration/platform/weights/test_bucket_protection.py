"""Start-up check of a bucket's versioning and Object Lock, and what Object Lock really does on
SeaweedFS 4.48: a locked version cannot be deleted (GOVERNANCE: only with the bypass header by
an identity allowed to; COMPLIANCE: by nobody), while an unlocked version can."""

from __future__ import annotations

import logging

import boto3
import pytest
from botocore.exceptions import ClientError

from redline.platform.weights.errors import StoreSettingsError, UnprotectedBucketError
from redline.platform.weights.s3store import open_s3_record_store
from tests.integration.platform.weights.conftest import store_settings
from tests.support.seaweedfs import SeaweedS3, make_bucket


def _code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


def test_bucket_without_versioning_is_refused(seaweed: SeaweedS3, bucket_name: str) -> None:
    make_bucket(seaweed.client(), bucket_name, versioning=False, lock_mode=None)
    with pytest.raises(UnprotectedBucketError) as caught:
        open_s3_record_store(store_settings(seaweed, bucket_name), seaweed.session())
    message = str(caught.value)
    assert f"bucket {bucket_name!r}: Versioning is never enabled" in message
    assert "Object Lock is not enabled" in message and "allow_unlocked" in message


def test_versioned_bucket_without_object_lock_is_refused(
    seaweed: SeaweedS3, bucket_name: str
) -> None:
    make_bucket(seaweed.client(), bucket_name, lock_mode=None)
    with pytest.raises(UnprotectedBucketError) as caught:
        open_s3_record_store(store_settings(seaweed, bucket_name), seaweed.session())
    assert "Versioning" not in str(caught.value)
    assert f"bucket {bucket_name!r}: Object Lock is not enabled" in str(caught.value)


def test_object_lock_without_default_retention_is_refused(
    seaweed: SeaweedS3, bucket_name: str
) -> None:
    seaweed.client().create_bucket(Bucket=bucket_name, ObjectLockEnabledForBucket=True)
    with pytest.raises(UnprotectedBucketError, match="no default retention"):
        open_s3_record_store(store_settings(seaweed, bucket_name), seaweed.session())


def test_allow_unlocked_opens_with_a_warning(
    seaweed: SeaweedS3, bucket_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    make_bucket(seaweed.client(), bucket_name, versioning=False, lock_mode=None)
    settings = store_settings(seaweed, bucket_name, allow_unlocked=True)
    with caplog.at_level(logging.WARNING, logger="redline.platform.weights.s3store"):
        store = open_s3_record_store(settings, seaweed.session())
    assert store.protection is not None and not store.protection.worm
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("allow_unlocked" in m and "Versioning is never enabled" in m for m in warned)
    store.put("works", b"yes")
    assert store.get("works") is not None


def test_protected_bucket_reports_its_retention(seaweed: SeaweedS3, bucket_name: str) -> None:
    make_bucket(seaweed.client(), bucket_name, lock_mode="COMPLIANCE", days=2)
    store = open_s3_record_store(store_settings(seaweed, bucket_name), seaweed.session())
    assert store.protection is not None and store.protection.worm
    assert (store.protection.retention_mode, store.protection.retention_days) == ("COMPLIANCE", 2)


def test_missing_bucket_and_bad_credentials_are_named(seaweed: SeaweedS3, bucket_name: str) -> None:
    with pytest.raises(StoreSettingsError, match=f"bucket {bucket_name!r} at .*no such bucket"):
        open_s3_record_store(store_settings(seaweed, bucket_name), seaweed.session())
    make_bucket(seaweed.client(), bucket_name)
    wrong = boto3.Session(aws_access_key_id="redline-test", aws_secret_access_key="wrong")
    with pytest.raises(StoreSettingsError, match="credentials were refused"):
        open_s3_record_store(store_settings(seaweed, bucket_name), wrong)
    dead = store_settings(seaweed, bucket_name, endpoint_url="http://127.0.0.1:9")
    with pytest.raises(StoreSettingsError, match="cannot reach endpoint_url"):
        open_s3_record_store(dead, seaweed.session())


def test_governance_retention_prevents_deleting_a_locked_version(
    seaweed: SeaweedS3, bucket_name: str
) -> None:
    client = seaweed.client()
    make_bucket(client, bucket_name, lock_mode="GOVERNANCE")
    store = open_s3_record_store(store_settings(seaweed, bucket_name), seaweed.session())
    store.put("models/m/active.json", b"v1")
    store.put("models/m/active.json", b"v2")  # an overwrite is a new version, the old one kept
    versions = client.list_object_versions(Bucket=bucket_name, Prefix="models/m/")["Versions"]
    assert len(versions) == 2
    oldest = min(versions, key=lambda v: (v["LastModified"], v["IsLatest"]))
    head = client.head_object(Bucket=bucket_name, Key=oldest["Key"], VersionId=oldest["VersionId"])
    assert head["ObjectLockMode"] == "GOVERNANCE"

    with pytest.raises(ClientError) as caught:
        client.delete_object(Bucket=bucket_name, Key=oldest["Key"], VersionId=oldest["VersionId"])
    assert _code(caught) == "AccessDenied"
    # Plain DELETE only adds a delete marker: every version is still there.
    client.delete_object(Bucket=bucket_name, Key="models/m/active.json")
    after = client.list_object_versions(Bucket=bucket_name, Prefix="models/m/")
    assert len(after["Versions"]) == 2 and len(after["DeleteMarkers"]) == 1
    # A read-only identity cannot bypass; the admin identity can (as on AWS with
    # s3:BypassGovernanceRetention): that is what GOVERNANCE, unlike COMPLIANCE, allows.
    with pytest.raises(ClientError):
        seaweed.client(reader=True).delete_object(
            Bucket=bucket_name,
            Key=oldest["Key"],
            VersionId=oldest["VersionId"],
            BypassGovernanceRetention=True,
        )
    client.delete_object(
        Bucket=bucket_name,
        Key=oldest["Key"],
        VersionId=oldest["VersionId"],
        BypassGovernanceRetention=True,
    )


def test_compliance_retention_cannot_be_bypassed(seaweed: SeaweedS3, bucket_name: str) -> None:
    client = seaweed.client()
    make_bucket(client, bucket_name, lock_mode="COMPLIANCE")
    version = client.put_object(Bucket=bucket_name, Key="k", Body=b"data")["VersionId"]
    for bypass in (False, True):
        with pytest.raises(ClientError) as caught:
            client.delete_object(
                Bucket=bucket_name, Key="k", VersionId=version, BypassGovernanceRetention=bypass
            )
        assert _code(caught) == "AccessDenied"
    with pytest.raises(ClientError) as caught:
        client.put_bucket_versioning(
            Bucket=bucket_name, VersioningConfiguration={"Status": "Suspended"}
        )
    assert _code(caught) == "InvalidBucketState"  # versioning stays on under Object Lock


def test_unlocked_versions_can_be_deleted(seaweed: SeaweedS3, bucket_name: str) -> None:
    """The control: without a retention the same delete succeeds, so the refusals above are
    Object Lock's doing, not a permission problem."""
    client = seaweed.client()
    make_bucket(client, bucket_name, lock_mode=None)
    version = client.put_object(Bucket=bucket_name, Key="k", Body=b"data")["VersionId"]
    client.delete_object(Bucket=bucket_name, Key="k", VersionId=version)
    assert "Versions" not in client.list_object_versions(Bucket=bucket_name, Prefix="k")
