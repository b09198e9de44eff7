"""Where spot interruption notices come from: AWS instance metadata (IMDSv2), GCP metadata, or a
manual trigger; and the metadata services' documents and time format. Each source's `poll()`
returns the notices it has not reported before; a `NoticeWatcher` thread polls one source and puts
what it finds on a queue.

AWS: a session token from `PUT /latest/api/token` (TTL header), renewed before it expires and
once more on a 401; then `GET spot/instance-action` (404 until a notice; `{"action", "time"}`
after) and `GET events/recommendations/rebalance` (404, or `{"noticeTime"}`). AWS recommends
polling every 5 s; the spec's detection delay must cover the interval chosen. The notice is
taken to have been issued one AWS window (spec `spot.notice_seconds.aws`) before its `time`.

GCP: `GET instance/preempted?wait_for_change=true&last_etag=E&timeout_sec=T` with
`Metadata-Flavor: Google`: the first call (`last_etag=0`) answers at once, later ones hang until
the value changes, so detection is immediate. TRUE is the notice; termination is one GCP window
(spec `spot.notice_seconds.gcp`) later. A 503 (the metadata server under maintenance) is retried.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

import httpx

from redline.platform.spot.errors import SpotError
from redline.platform.spot.state import Clock, Notice
from redline.slo.spec import Spot

# The metadata services' request headers (IMDSv2 token and TTL; GCP's flavor check).
TOKEN_TTL_HEADER = "x-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "x-aws-ec2-metadata-token"
FLAVOR_HEADER = "metadata-flavor"

log = logging.getLogger(__name__)


# ---- cloud metadata formats ------------------------------------------------------------------


def format_metadata_time(unix: float) -> str:
    """AWS metadata's time format: `2017-09-18T08:22:00Z` (UTC, whole seconds)."""
    return datetime.fromtimestamp(math.floor(unix), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_metadata_time(text: str) -> float:
    """Unix seconds of an AWS metadata time; SpotError when it is not one."""
    try:
        value = datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise SpotError(f"not a metadata time (YYYY-MM-DDThh:mm:ssZ): {text[:60]!r}") from None
    return value.replace(tzinfo=UTC).timestamp()


def parse_instance_action(text: str) -> tuple[str, float]:
    """`spot/instance-action`'s `{"action", "time"}` as (action, unix time); SpotError otherwise."""
    try:
        data = json.loads(text)
        action, when = data["action"], data["time"]
    except (ValueError, KeyError, TypeError):
        raise SpotError(f"not an instance-action document: {text[:120]!r}") from None
    if action not in ("terminate", "stop", "hibernate") or not isinstance(when, str):
        raise SpotError(f"instance-action has an unknown action or time: {text[:120]!r}")
    return action, parse_metadata_time(when)


def parse_rebalance(text: str) -> float:
    """`events/recommendations/rebalance`'s `{"noticeTime"}` as unix time; SpotError otherwise."""
    try:
        when = json.loads(text)["noticeTime"]
    except (ValueError, KeyError, TypeError):
        raise SpotError(f"not a rebalance recommendation: {text[:120]!r}") from None
    if not isinstance(when, str):
        raise SpotError(f"rebalance noticeTime is not a time: {text[:120]!r}")
    return parse_metadata_time(when)


def parse_preempted(text: str) -> bool:
    """GCP `instance/preempted`: TRUE or FALSE; SpotError otherwise."""
    value = text.strip().upper()
    if value not in ("TRUE", "FALSE"):
        raise SpotError(f"instance/preempted is neither TRUE nor FALSE: {text[:60]!r}")
    return value == "TRUE"


# ---- notice sources --------------------------------------------------------------------------


class NoticeSourceError(SpotError):
    """The metadata service answered something a notice source cannot use."""


class NoticeSource(Protocol):
    """Something that reports interruption notices of one node."""

    @property
    def provider(self) -> str:
        """`aws`, `gcp` or `manual`."""
        ...

    def poll(self) -> list[Notice]:
        """Notices not reported before (may block for a long-poll); raises on failure."""
        ...


class AwsImdsSource:
    """AWS EC2 instance metadata (IMDSv2): spot instance-action and rebalance recommendation."""

    provider = "aws"

    def __init__(
        self,
        node: str,
        base_url: str,
        spot: Spot,
        client: httpx.Client,
        token_ttl_seconds: int = 21600,
        clock: Clock = time.time,
    ) -> None:
        if not 1 <= token_ttl_seconds <= 21600:
            raise NoticeSourceError(f"token TTL must be 1..21600 s, got {token_ttl_seconds}")
        self.node = node
        self.base_url = base_url.rstrip("/")
        self.spot = spot
        self.client = client
        self.token_ttl = token_ttl_seconds
        self.clock = clock
        self._token: str | None = None
        self._token_expires = 0.0
        self._seen_actions: set[tuple[str, float]] = set()
        self._seen_rebalances: set[float] = set()

    def _fetch_token(self) -> str:
        response = self.client.put(
            f"{self.base_url}/latest/api/token", headers={TOKEN_TTL_HEADER: str(self.token_ttl)}
        )
        if response.status_code != 200 or not response.text.strip():
            raise NoticeSourceError(f"IMDS token: HTTP {response.status_code}")
        self._token = response.text.strip()
        # Renew well before expiry so a poll never presents a token that lapses in flight.
        self._token_expires = time.monotonic() + self.token_ttl * 0.8
        return self._token

    def _get(self, path: str) -> httpx.Response:
        token = self._token
        if token is None or time.monotonic() >= self._token_expires:
            token = self._fetch_token()
        url = f"{self.base_url}/latest/meta-data/{path}"
        response = self.client.get(url, headers={TOKEN_HEADER: token})
        if response.status_code == 401:
            response = self.client.get(url, headers={TOKEN_HEADER: self._fetch_token()})
        return response

    def poll(self) -> list[Notice]:
        """The instance-action and rebalance recommendation, if new."""
        out: list[Notice] = []
        now = self.clock()
        action = self._get("spot/instance-action")
        if action.status_code == 200:
            try:
                kind, terminate_at = parse_instance_action(action.text)
            except SpotError as exc:
                raise NoticeSourceError(str(exc)) from None
            if (kind, terminate_at) not in self._seen_actions:
                self._seen_actions.add((kind, terminate_at))
                out.append(
                    Notice(
                        node=self.node,
                        provider="aws",
                        kind="interruption",
                        action=kind,
                        noticed_at=terminate_at - self.spot.notice_for("aws"),
                        detected_at=now,
                        terminate_at=terminate_at,
                        detail=f"spot/instance-action {action.text.strip()}",
                    )
                )
        elif action.status_code != 404:
            raise NoticeSourceError(f"spot/instance-action: HTTP {action.status_code}")
        rebalance = self._get("events/recommendations/rebalance")
        if rebalance.status_code == 200:
            try:
                noticed = parse_rebalance(rebalance.text)
            except SpotError as exc:
                raise NoticeSourceError(str(exc)) from None
            if noticed not in self._seen_rebalances:
                self._seen_rebalances.add(noticed)
                out.append(
                    Notice(
                        node=self.node,
                        provider="aws",
                        kind="rebalance",
                        action="rebalance",
                        noticed_at=noticed,
                        detected_at=now,
                        terminate_at=None,
                        detail=f"rebalance recommendation {rebalance.text.strip()}",
                    )
                )
        elif rebalance.status_code != 404:
            raise NoticeSourceError(f"rebalance recommendation: HTTP {rebalance.status_code}")
        return out


class GcpMetadataSource:
    """GCP metadata `instance/preempted`, long-polled with `wait_for_change`."""

    provider = "gcp"

    def __init__(
        self,
        node: str,
        base_url: str,
        spot: Spot,
        client: httpx.Client,
        wait_seconds: float = 30.0,
        clock: Clock = time.time,
    ) -> None:
        self.node = node
        self.base_url = base_url.rstrip("/")
        self.spot = spot
        self.client = client
        self.wait_seconds = wait_seconds
        self.clock = clock
        self._etag = "0"  # never a real ETag: the first call answers at once
        self._preempted = False

    def poll(self) -> list[Notice]:
        """Wait (up to `wait_seconds`) for `instance/preempted` to change; a notice on TRUE."""
        params: dict[str, str | float] = {
            "wait_for_change": "true",
            "last_etag": self._etag,
            "timeout_sec": max(1, round(self.wait_seconds)),
        }
        response = self.client.get(
            f"{self.base_url}/computeMetadata/v1/instance/preempted",
            params=params,
            headers={FLAVOR_HEADER: "Google"},
            timeout=httpx.Timeout(self.wait_seconds + 10, connect=5.0),
        )
        if response.status_code == 503:
            return []  # maintenance of the metadata server: retried by the next poll
        if response.status_code != 200:
            raise NoticeSourceError(f"instance/preempted: HTTP {response.status_code}")
        if response.headers.get(FLAVOR_HEADER, "").lower() != "google":
            raise NoticeSourceError("instance/preempted: answer without Metadata-Flavor: Google")
        try:
            preempted = parse_preempted(response.text)
        except SpotError as exc:
            raise NoticeSourceError(str(exc)) from None
        self._etag = response.headers.get("etag", self._etag)
        was, self._preempted = self._preempted, preempted
        if not preempted or was:
            return []
        now = self.clock()
        return [
            Notice(
                node=self.node,
                provider="gcp",
                kind="interruption",
                action="preempt",
                noticed_at=now,
                detected_at=now,
                terminate_at=now + self.spot.notice_for("gcp"),
                detail="instance/preempted TRUE",
            )
        ]


class ManualSource:
    """Notices handed in by an operator or a test (`redline spot-agent trigger`)."""

    provider = "manual"

    def __init__(self) -> None:
        self._queue: queue.Queue[Notice] = queue.Queue()

    def trigger(self, notice: Notice) -> None:
        """Hand in a notice; the next `poll` reports it."""
        self._queue.put(notice)

    def poll(self) -> list[Notice]:
        """Every notice handed in since the last poll."""
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out


class NoticeWatcher:
    """Polls one source in a daemon thread and hands every new notice to `deliver`."""

    def __init__(
        self,
        source: NoticeSource,
        deliver: Callable[[Notice], None],
        interval_seconds: float,
        stop: threading.Event,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.source = source
        self.deliver = deliver
        self.interval = interval_seconds
        self.stop = stop
        self.on_error = on_error
        self.errors = 0
        self.thread = threading.Thread(
            target=self._run, name=f"notices-{source.provider}", daemon=True
        )

    def start(self) -> None:
        """Start polling."""
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                notices = self.source.poll()
            except (httpx.HTTPError, NoticeSourceError) as exc:
                if self.stop.is_set():
                    return  # shutting down: the client was closed under a long-poll
                self.errors += 1
                message = f"{self.source.provider} notice source: {type(exc).__name__}: {exc}"
                log.warning("%s", message)
                if self.on_error is not None:
                    self.on_error(message)
                self.stop.wait(min(5.0, max(self.interval, 0.5)))
                continue
            for notice in notices:
                self.deliver(notice)
            self.stop.wait(self.interval)

    def join(self, timeout: float) -> None:
        """Wait for the thread after `stop` is set."""
        self.thread.join(timeout)


__all__ = [
    "FLAVOR_HEADER",
    "TOKEN_HEADER",
    "TOKEN_TTL_HEADER",
    "AwsImdsSource",
    "GcpMetadataSource",
    "ManualSource",
    "NoticeSource",
    "NoticeSourceError",
    "NoticeWatcher",
    "format_metadata_time",
    "parse_instance_action",
    "parse_metadata_time",
    "parse_preempted",
    "parse_rebalance",
]
