"""The webhook receiver over real HTTP (uvicorn on loopback) with a real redis-server."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from typer.testing import CliRunner

from redline.cli.remediation import remediation_app
from redline.devstack.processes import find_binary, free_port, start_redis
from redline.remediation.jobs import JobStore
from redline.remediation.settings import RemediationSettings
from redline.slo import catalog
from tests.support.remediation import (
    AUTH,
    REGISTRY_REF,
    REPO,
    TOKEN,
    alert,
    make_settings,
    payload,
    post,
    receiver,
    store_for,
    wait_for,
    wait_terminal,
    workers,
)


@pytest.fixture()
def settings(redis_url: str, tmp_path: Path) -> RemediationSettings:
    """Short timings, a small body limit, the audit mirror in the test's directory."""
    return make_settings(redis_url, max_body_bytes=4096, audit_file=tmp_path / "audit.jsonl")


@pytest.fixture()
def store(settings: RemediationSettings) -> Iterator[tuple[JobStore, redis.Redis]]:
    """A synchronous store on the test database."""
    job_store, client = store_for(settings)
    yield job_store, client
    client.close()


def _nothing_recorded(job_store: JobStore, client: redis.Redis) -> None:
    assert client.xlen(job_store.keys.stream) == 0
    assert client.zcard(job_store.keys.index) == 0
    assert not list(client.scan_iter(match="*idem*"))


def _raw_chunked_post(port: int, chunk: bytes, chunks: int) -> tuple[str, int]:
    """POST a chunked body one chunk at a time; stop sending once the server answers.

    Returns the status line and how many chunks were sent before the answer came.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            b"POST /alerts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n".encode()
            + b"Transfer-Encoding: chunked\r\n\r\n"
        )
        sock.settimeout(0.05)
        for sent in range(1, chunks + 1):
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            try:
                answer = sock.recv(4096)
            except TimeoutError:
                continue
            return answer.split(b"\r\n", 1)[0].decode(), sent
    return "no answer", chunks


def test_bad_requests_get_4xx_with_a_clear_message_and_record_nothing(
    settings: RemediationSettings,
    store: tuple[JobStore, redis.Redis],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    job_store, client = store
    good = payload(alert("00000000000000a1"))
    with receiver(settings) as server:
        url = f"{server.url}/alerts"
        missing = httpx.post(url, json=good)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = httpx.post(url, json=good, headers={"Authorization": f"Bearer {TOKEN}x"})
        assert wrong.status_code == 401
        basic = httpx.post(url, json=good, headers={"Authorization": f"Basic {TOKEN}"})
        assert basic.status_code == 401
        assert httpx.get(f"{server.url}/jobs").status_code == 401

        text = httpx.post(
            url, content=json.dumps(good), headers={**AUTH, "Content-Type": "text/plain"}
        )
        assert text.status_code == 415
        assert "application/json" in text.json()["message"]

        big = {**good, "externalURL": "x" * 5000}
        too_big = post(server.url, big)
        assert too_big.status_code == 413
        assert "4096" in too_big.json()["message"]
        # No Content-Length: the limit is enforced while the chunks arrive, long before the end.
        status, sent = _raw_chunked_post(server.port, b" " * 1024, chunks=200)
        assert status == "HTTP/1.1 413 Request Entity Too Large"
        assert sent <= 10

        malformed = httpx.post(
            url, content=b'{"version": "4",', headers={**AUTH, "Content-Type": "application/json"}
        )
        assert malformed.status_code == 422
        assert "invalid Alertmanager webhook payload" in malformed.json()["message"]
        old = post(server.url, {**good, "version": "3"})
        assert old.status_code == 422
        assert old.json()["message"].startswith(
            "invalid Alertmanager webhook payload (v4): version: Input should be '4'"
        )
        bad_alert = payload(alert("00000000000000a1"))
        del bad_alert["alerts"][0]["fingerprint"]
        bad_alert["alerts"][0]["startsAt"] = "yesterday"
        answer = post(server.url, bad_alert)
        assert answer.status_code == 422
        assert [e["loc"] for e in answer.json()["detail"]] == [
            ["alerts", 0, "startsAt"],
            ["alerts", 0, "fingerprint"],
        ]
        assert "(and 1 more)" in answer.json()["message"]
        _nothing_recorded(job_store, client)
    assert TOKEN not in caplog.text
    assert TOKEN not in "".join(client.lrange("{redline:remediation}:audit", 0, -1))


def test_same_payload_three_times_concurrently_runs_the_playbook_once(
    settings: RemediationSettings, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, client = store
    body = payload(alert("00000000000000b1"), alert("00000000000000b2", region="secondary"))
    statuses: list[int] = []
    barrier = threading.Barrier(3)

    def deliver(url: str) -> None:
        barrier.wait()
        statuses.append(post(url, body).status_code)

    with receiver(settings) as server:
        threads = [threading.Thread(target=deliver, args=(server.url,)) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(statuses) == [200, 200, 202]
        answer = post(server.url, body)
        assert answer.status_code == 200 and answer.json()["duplicates"] == 2
        ids = [item["job_id"] for item in answer.json()["alerts"]]
        with workers(settings, 3):
            jobs = [wait_terminal(job_store, job_id) for job_id in ids]
        metrics = httpx.get(f"{server.url}/metrics").text
    assert all(job.status == "succeeded" for job in jobs)
    assert [client.get(f"rt:runs:{job_id}") for job_id in ids] == ["1", "1"]
    assert client.get("rt:runs:total") == "2"
    assert client.zcard(job_store.keys.index) == 2
    assert f"{catalog.REDLINE_WEBHOOK_DUPLICATES_TOTAL} 6.0" in metrics
    assert f'{catalog.REDLINE_WEBHOOK_ALERTS_TOTAL}{{status="firing"}} 8.0' in metrics
    runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL
    assert f'{runs}{{outcome="succeeded",playbook="counter"}} 2.0' in metrics


def test_payload_replayed_after_a_receiver_restart_still_runs_once(
    settings: RemediationSettings, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, client = store
    body = payload(alert("00000000000000b3"))
    with receiver(settings) as first:
        accepted = post(first.url, body)
        port = first.port
    assert accepted.status_code == 202
    with receiver(settings, port=port) as second:
        replayed = post(second.url, body)
    assert replayed.status_code == 200
    assert replayed.json()["alerts"][0]["result"] == "duplicate"
    job_id = accepted.json()["alerts"][0]["job_id"]
    assert replayed.json()["alerts"][0]["job_id"] == job_id
    with workers(settings):
        wait_terminal(job_store, job_id)
    assert client.get(f"rt:runs:{job_id}") == "1"


@pytest.mark.slow
def test_redis_down_answers_503_and_the_redelivery_is_accepted_once_it_is_back(
    tmp_path: Path,
) -> None:
    own = start_redis(tmp_path / "redis")
    try:
        settings = make_settings(own.extra["url"])
        first = payload(alert("00000000000000c1"))
        second = payload(alert("00000000000000c2"))
        with receiver(settings) as server:
            accepted = post(server.url, first)
            assert accepted.status_code == 202
            own.stop()
            down = post(server.url, second)
            assert down.status_code == 503
            assert down.headers["retry-after"] == "1"
            assert "retry" in down.json()["message"]
            assert httpx.get(f"{server.url}/readyz").status_code == 503
            assert httpx.get(f"{server.url}/healthz").status_code == 200
            assert httpx.get(f"{server.url}/jobs", headers=AUTH).status_code == 503
            own = start_redis(tmp_path / "redis", port=own.port)
            back = post(server.url, second)
            assert back.status_code == 202, back.text
            # The first delivery survived the restart (AOF): replaying it is a duplicate.
            assert post(server.url, first).status_code == 200
            assert httpx.get(f"{server.url}/readyz").status_code == 200
        ids = [answer.json()["alerts"][0]["job_id"] for answer in (accepted, back)]
        job_store, client = store_for(settings)
        try:
            with workers(settings):
                done = [wait_terminal(job_store, job_id) for job_id in ids]
            assert [job.status for job in done] == ["succeeded", "succeeded"]
            assert client.get("rt:runs:total") == "2"
        finally:
            client.close()
    finally:
        own.stop()


def test_alert_without_playbook_is_acknowledged_and_audited_without_a_job(
    settings: RemediationSettings, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, client = store
    body = payload(alert("00000000000000d1", playbook=None))
    with receiver(settings) as server:
        first = post(server.url, body)
        second = post(server.url, body)
    assert first.status_code == 200 and first.json()["acknowledged"] == 1
    assert first.json()["alerts"][0]["job_id"] is None
    assert second.status_code == 200 and second.json()["duplicates"] == 1
    assert client.zcard(job_store.keys.index) == 0 and client.xlen(job_store.keys.stream) == 0
    records = [json.loads(r) for r in client.lrange("{redline:remediation}:audit", 0, -1)]
    assert [r["kind"] for r in records] == ["alert.acknowledged"]
    assert records[0]["data"]["fingerprint"] == "00000000000000d1"
    lines = (settings.audit_file or Path("-")).read_text().splitlines()
    assert [json.loads(line) for line in lines] == records


@pytest.mark.parametrize("mode", ["settings", "label", "annotation"])
def test_dry_run_returns_the_plan_and_changes_nothing(
    mode: str, redis_url: str, tmp_path: Path
) -> None:
    settings = make_settings(redis_url, dry_run=mode == "settings")
    extra_labels = {"dry_run": "true"} if mode == "label" else None
    extra_annotations = {"dry_run": "yes"} if mode == "annotation" else None
    body = payload(alert("00000000000000e1", labels=extra_labels, annotations=extra_annotations))
    job_store, client = store_for(settings)
    try:
        with receiver(settings) as server:
            job_id = post(server.url, body).json()["alerts"][0]["job_id"]
            with workers(settings):
                wait_terminal(job_store, job_id)
            job = httpx.get(f"{server.url}/jobs/{job_id}", headers=AUTH).json()
        assert job["status"] == "planned" and job["outcome"] == "dry_run" and job["dry_run"]
        assert job["plan"] == [
            {"name": "mark", "description": "mark region=primary remediated",
             "params": {"target": "region=primary"}, "read_only": False}
        ]  # fmt: skip
        assert client.get("rt:state:region=primary") is None
        assert client.get(f"rt:runs:{job_id}") is None
    finally:
        client.close()


def test_jobs_api_shows_jobs_and_filters_them(
    settings: RemediationSettings, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, _ = store
    body = payload(
        alert("00000000000000f1"),
        alert("00000000000000f2", playbook="broken", region="x"),
    )
    with receiver(settings) as server:
        ids = [item["job_id"] for item in post(server.url, body).json()["alerts"]]
        with workers(settings):
            for job_id in ids:
                wait_terminal(job_store, job_id)
        get = lambda path: httpx.get(f"{server.url}{path}", headers=AUTH)  # noqa: E731
        one = get(f"/jobs/{ids[0]}")
        assert one.status_code == 200
        detail = one.json()
        assert detail["status"] == "succeeded" and detail["target"] == "region=primary"
        assert [s["phase"] for s in detail["steps"]] == ["plan", "execute", "verify"]
        assert detail["alert"]["fingerprint"] == "00000000000000f1"
        assert get("/jobs/" + "0" * 32).status_code == 404
        assert get("/jobs/not-a-job").status_code == 422
        failed = get("/jobs?status=failed").json()["jobs"]
        assert [j["id"] for j in failed] == [ids[1]]
        assert failed[0]["error"] == "step break failed: the dependency refused"
        assert [j["id"] for j in get("/jobs?playbook=counter").json()["jobs"]] == [ids[0]]
        assert len(get("/jobs").json()["jobs"]) == 2
        assert get("/jobs?limit=1").json()["jobs"][0]["id"] in ids
        assert get("/jobs?status=bogus").status_code == 422
        assert get("/jobs?limit=0").status_code == 422
        typo = get("/jobs?playbok=counter")
        assert typo.status_code == 422
        assert typo.json()["message"] == (
            "unknown query parameter(s): 'playbok'; allowed: playbook, status, limit"
        )
        twice = get("/jobs?playbook=counter&playbook=broken")
        assert twice.status_code == 422 and "more than once: playbook" in twice.json()["message"]
        assert get(f"/jobs/{ids[0]}?verbose=1").status_code == 422


def test_metrics_exposition_is_valid_and_has_no_created_series(
    settings: RemediationSettings, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, _ = store
    with receiver(settings) as server:
        job_id = post(server.url, payload(alert("0000000000000a01"))).json()["alerts"][0]["job_id"]
        with workers(settings):
            wait_terminal(job_store, job_id)
        response = httpx.get(f"{server.url}/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    duration = catalog.REDLINE_REMEDIATION_DURATION_SECONDS
    for family in (
        catalog.REDLINE_WEBHOOK_ALERTS_TOTAL.name,
        catalog.REDLINE_WEBHOOK_DUPLICATES_TOTAL.name,
        catalog.REDLINE_REMEDIATION_RUNS_TOTAL.name,
        duration.bucket,
    ):
        assert family in text
    assert "_created" not in text
    assert f'{duration.count}{{playbook="counter"}} 1.0' in text
    lint = subprocess.run(
        [find_binary("promtool"), "check", "metrics"], input=text.encode(), capture_output=True
    )
    assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()


def test_openapi_schema_documents_the_v4_payload(settings: RemediationSettings) -> None:
    with receiver(settings) as server:
        schema = httpx.get(f"{server.url}/openapi.json").json()
    body = schema["paths"]["/alerts"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/WebhookPayload"}
    components = schema["components"]["schemas"]
    assert set(components["WebhookPayload"]["properties"]) == {
        "version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels",
        "commonLabels", "commonAnnotations", "externalURL", "alerts",
    }  # fmt: skip
    assert set(components["Alert"]["properties"]) == {
        "status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint",
    }  # fmt: skip
    responses = schema["paths"]["/alerts"]["post"]["responses"]
    assert {"200", "202", "401", "413", "415", "422", "503"} <= set(responses)
    assert {"/jobs", "/jobs/{job_id}", "/healthz", "/readyz", "/metrics"} <= set(schema["paths"])


def test_redline_remediation_command_serves_and_runs_jobs(redis_url: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    log = tmp_path / "receiver.log"
    argv = [
        sys.executable, "-m", "redline.cli", "remediation", "--port", str(port),
        "--redis-url", redis_url, "--token-file", str(token_file), "--workers", "1",
        "--playbooks", REGISTRY_REF, "--audit-file", str(tmp_path / "audit.jsonl"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "REDLINE_POLL_SECONDS": "0.1"}
    with log.open("wb") as out:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), timeout=60, what="redline remediation to serve")
        answer = post(url, payload(alert("0000000000000b01")))
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["alerts"][0]["job_id"]

        def finished() -> dict[str, object] | None:
            job = httpx.get(f"{url}/jobs/{job_id}", headers=AUTH).json()
            return job if job["status"] == "succeeded" else None

        job = wait_for(finished, timeout=30, what="the job to run in the receiver's worker")
        assert job["attempts"] == 1
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    text = log.read_text()
    assert code == 0, text
    assert TOKEN not in text
    # The embedded spec names playbooks the test registry does not have: said at start-up.
    assert "playbooks named by the spec but not registered" in text
    assert (tmp_path / "audit.jsonl").read_text().count("\n") >= 5


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_redline_remediation_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        remediation_app, ["--port", str(free_port())], env={"REDLINE_WEBHOOK_TOKEN": ""}
    )
    assert result.exit_code == 2
    assert "webhook token: set --token-file FILE or the REDLINE_WEBHOOK_TOKEN variable" in (
        result.output
    )
    missing = CliRunner().invoke(remediation_app, ["--token-file", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "cannot read" in missing.output
