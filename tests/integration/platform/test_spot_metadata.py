"""The local AWS IMDSv2 / GCP metadata servers over real HTTP, and the notice sources on them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from redline.devstack.fakes.metadata_server import MetadataSettings, build_metadata_app
from redline.devstack.fakes.simulator import ServerThread, serve_in_thread
from redline.platform.spot import (
    AwsImdsSource,
    GcpMetadataSource,
    NoticeSourceError,
    parse_instance_action,
    parse_metadata_time,
)
from redline.slo.spec import Spot

pytestmark = pytest.mark.integration

TTL = "x-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "x-aws-ec2-metadata-token"


@pytest.fixture()
def aws() -> Iterator[ServerThread]:
    server = serve_in_thread(build_metadata_app(MetadataSettings(provider="aws")))
    yield server
    server.stop()


@pytest.fixture()
def gcp() -> Iterator[ServerThread]:
    server = serve_in_thread(build_metadata_app(MetadataSettings(provider="gcp")))
    yield server
    server.stop()


@pytest.fixture()
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0, trust_env=False) as http:
        yield http


def token(client: httpx.Client, url: str, ttl: str = "60") -> str:
    response = client.put(f"{url}/latest/api/token", headers={TTL: ttl})
    assert response.status_code == 200
    assert response.headers[TTL] == ttl
    return response.text


def test_imdsv2_token_rules(aws: ServerThread, client: httpx.Client) -> None:
    url = f"{aws.url}/latest/api/token"
    assert client.put(url).status_code == 400  # no TTL header
    assert client.put(url, headers={TTL: "0"}).status_code == 400
    assert client.put(url, headers={TTL: "21601"}).status_code == 400
    assert client.put(url, headers={TTL: "abc"}).status_code == 400
    assert client.put(url, headers={TTL: "60", "X-Forwarded-For": "10.0.0.1"}).status_code == 403
    assert client.get(url).status_code == 405
    assert client.put(url, headers={TTL: "21600"}).status_code == 200
    action = f"{aws.url}/latest/meta-data/spot/instance-action"
    assert client.get(action).status_code == 401  # IMDSv2 only: no token, no answer
    assert client.get(action, headers={TOKEN: "forged"}).status_code == 401
    short = token(client, aws.url, "1")
    assert client.get(action, headers={TOKEN: short}).status_code == 404
    time.sleep(1.1)
    assert client.get(action, headers={TOKEN: short}).status_code == 401  # expired


def wait_visible(client: httpx.Client, url: str, headers: dict[str, str]) -> httpx.Response:
    deadline = time.monotonic() + 2.0
    while True:
        answer = client.get(url, headers=headers)
        if answer.status_code != 404 or time.monotonic() > deadline:
            assert answer.status_code == 200
            return answer
        time.sleep(0.02)


def test_spot_instance_action_and_rebalance(aws: ServerThread, client: httpx.Client) -> None:
    headers = {TOKEN: token(client, aws.url)}
    meta = f"{aws.url}/latest/meta-data"
    for path in ("spot/instance-action", "spot/termination-time",
                 "events/recommendations/rebalance"):  # fmt: skip
        assert client.get(f"{meta}/{path}", headers=headers).status_code == 404
    assert client.get(f"{meta}/instance-life-cycle", headers=headers).text == "spot"
    issued = client.post(f"{aws.url}/admin/notice", json={"in_seconds": 120}).json()
    # Issued exactly 120 s before its whole-second time: visible within a second of the ask.
    assert issued["terminate_at"] == int(issued["terminate_at"])
    assert issued["terminate_at"] - issued["issued_at"] == 120
    answer = wait_visible(client, f"{meta}/spot/instance-action", headers)
    assert time.time() >= issued["issued_at"]
    assert answer.headers["content-type"].startswith("text/plain")
    action, when = parse_instance_action(answer.text)
    assert action == "terminate"
    assert when == issued["terminate_at"]
    assert answer.text.startswith('{"action": "terminate", "time": "20')
    termination = client.get(f"{meta}/spot/termination-time", headers=headers).text
    assert parse_metadata_time(termination) == when
    client.post(f"{aws.url}/admin/rebalance")
    rebalance = client.get(f"{meta}/events/recommendations/rebalance", headers=headers)
    assert rebalance.status_code == 200
    assert set(rebalance.json()) == {"noticeTime"}
    assert client.post(f"{aws.url}/admin/notice", json={"in_seconds": -1}).status_code == 422


def test_aws_source_reports_each_notice_once_and_renews_its_token(
    aws: ServerThread, client: httpx.Client
) -> None:
    spot = Spot()
    source = AwsImdsSource("spot-a", aws.url, spot, client, token_ttl_seconds=60)
    assert source.poll() == []
    issued = client.post(f"{aws.url}/admin/notice", json={"in_seconds": 120}).json()
    time.sleep(max(0.0, issued["issued_at"] - time.time()))
    (notice,) = source.poll()
    assert (notice.node, notice.provider, notice.kind, notice.action) == (
        "spot-a", "aws", "interruption", "terminate",
    )  # fmt: skip
    assert notice.terminate_at is not None
    assert notice.noticed_at == notice.terminate_at - spot.notice_seconds.aws == issued["issued_at"]
    assert notice.detection_delay < 0.5
    assert source.poll() == []  # the same instance-action is not a new notice
    client.post(f"{aws.url}/admin/rebalance")
    (rebalance,) = source.poll()
    assert (rebalance.kind, rebalance.terminate_at) == ("rebalance", None)
    # A reset instance forgets its tokens: the source gets a 401, renews, and goes on.
    client.post(f"{aws.url}/admin/reset")
    assert source.poll() == []
    issued = client.post(f"{aws.url}/admin/notice", json={"in_seconds": 30}).json()
    time.sleep(max(0.0, issued["issued_at"] - time.time()))
    (second,) = source.poll()
    assert second.terminate_at is not None and second.terminate_at != notice.terminate_at


def test_aws_source_rejects_garbage(client: httpx.Client) -> None:
    with pytest.raises(NoticeSourceError, match="token TTL"):
        AwsImdsSource("n", "http://127.0.0.1:9", Spot(), client, token_ttl_seconds=0)
    with pytest.raises(httpx.ConnectError):
        AwsImdsSource("n", "http://127.0.0.1:9", Spot(), client).poll()


def gcp_get(client: httpx.Client, url: str, **params: str) -> httpx.Response:
    return client.get(
        f"{url}/computeMetadata/v1/instance/preempted",
        params=params,
        headers={"Metadata-Flavor": "Google"},
    )


def test_gcp_metadata_rules(gcp: ServerThread, client: httpx.Client) -> None:
    path = f"{gcp.url}/computeMetadata/v1/instance/preempted"
    refused = client.get(path)
    assert refused.status_code == 403
    assert "Metadata-Flavor" in refused.text
    assert client.get(path, headers={"Metadata-Flavor": "Google", "X-Forwarded-For": "1.2.3.4"}
                      ).status_code == 403  # fmt: skip
    answer = gcp_get(client, gcp.url)
    assert (answer.status_code, answer.text) == (200, "FALSE")
    assert answer.headers["metadata-flavor"] == "Google"
    etag = answer.headers["etag"]
    # A different last_etag answers at once; the current one waits until timeout_sec.
    started = time.monotonic()
    assert gcp_get(client, gcp.url, wait_for_change="true", last_etag="0").text == "FALSE"
    assert time.monotonic() - started < 0.5
    started = time.monotonic()
    same = gcp_get(client, gcp.url, wait_for_change="true", last_etag=etag, timeout_sec="1")
    assert same.text == "FALSE" and same.headers["etag"] == etag
    assert 0.9 <= time.monotonic() - started < 3
    assert gcp_get(client, gcp.url, wait_for_change="true", timeout_sec="x").status_code == 400


def test_gcp_long_poll_answers_as_soon_as_the_vm_is_preempted(
    gcp: ServerThread, client: httpx.Client
) -> None:
    source = GcpMetadataSource("spot-g", gcp.url, Spot(), client, wait_seconds=10)
    assert source.poll() == []  # FALSE at once (last_etag=0)

    def preempt() -> None:
        time.sleep(0.5)
        httpx.post(f"{gcp.url}/admin/notice", json={"in_seconds": 30})

    thread = threading.Thread(target=preempt)
    started = time.monotonic()
    thread.start()
    (notice,) = source.poll()  # hangs in the long-poll until the change
    waited = time.monotonic() - started
    thread.join()
    assert 0.4 < waited < 2.0
    assert (notice.provider, notice.kind) == ("gcp", "interruption")
    assert notice.terminate_at == notice.noticed_at + Spot().notice_seconds.gcp
    # Without last_etag a long-poll waits for the next change, not for the current value.
    started = time.monotonic()
    answer = gcp_get(client, gcp.url, wait_for_change="true", timeout_sec="1")
    assert answer.text == "TRUE" and time.monotonic() - started >= 0.9
