"""The receiver's group commit against a real redis-server: the new jobs of the waiting
deliveries and their audit records are written by one script, together or not at all."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis

from redline.remediation.audit import AsyncAuditLog, AuditLog
from redline.remediation.jobs import IngestOutcome
from redline.remediation.models import WebhookPayload
from redline.remediation.receiver_store import AsyncJobStore
from redline.remediation.settings import RemediationSettings
from tests.support.remediation import alert, make_settings, payload, post, receiver, store_for

Scenario = Callable[[AsyncJobStore], Awaitable[Any]]


def _run(settings: RemediationSettings, scenario: Scenario) -> Any:
    """`scenario` on a receiver-side store (with its audit log) on a private event loop."""

    async def main() -> Any:
        client = aredis.Redis.from_url(settings.redis_url, decode_responses=True)
        try:
            audit = AsyncAuditLog(client, settings.key_prefix, settings.audit_file)
            store = AsyncJobStore(client, settings.key_prefix, settings.retention_seconds, audit)
            await store.ensure_group()
            return await scenario(store)
        finally:
            await client.aclose()

    return asyncio.run(main())


def _v4(*alerts: dict[str, Any]) -> WebhookPayload:
    return WebhookPayload.model_validate(payload(*alerts))


def _results(outcomes: list[IngestOutcome]) -> list[tuple[str, str | None]]:
    return [(outcome.result, outcome.job_id) for outcome in outcomes]


def _trail(client: redis.Redis, settings: RemediationSettings) -> list[dict[str, Any]]:
    """The audit records, once the whole chain (records and head) verified."""
    audit = AuditLog(client, settings.key_prefix)
    result = audit.verify()
    assert result.ok, result.render("redis")
    return [json.loads(line) for line in audit.records()]


def test_deliveries_committed_together_make_one_job_and_one_record_per_alert(
    redis_url: str, tmp_path: Path
) -> None:
    settings = make_settings(redis_url, audit_file=tmp_path / "audit.jsonl")
    twice = _v4(alert("00000000000000e1"), alert("00000000000000e1"))
    mixed = _v4(alert("00000000000000e1"), alert("00000000000000e2", playbook=None))

    async def scenario(store: AsyncJobStore) -> list[list[IngestOutcome]]:
        # The first delivery is committed alone; the other two wait and share the next commit,
        # where e1 is taken already (by the first commit) and e2 appears once.
        return list(
            await asyncio.gather(
                store.ingest(twice, False), store.ingest(mixed, False), store.ingest(twice, False)
            )
        )

    first, second, third = _run(settings, scenario)
    job_store, client = store_for(settings)
    try:
        job_id = first[0].job_id
        assert job_id is not None
        assert _results(first) == [("accepted", job_id), ("duplicate", job_id)]
        assert _results(second) == [("duplicate", job_id), ("acknowledged", None)]
        assert _results(third) == [("duplicate", job_id), ("duplicate", job_id)]
        assert client.xlen(job_store.keys.stream) == 1
        assert client.zrange(job_store.keys.index, 0, -1) == [job_id]
        records = _trail(client, settings)
        assert [(r["kind"], r["job_id"], r["data"]["fingerprint"]) for r in records] == [
            ("job.accepted", job_id, "00000000000000e1"),
            ("alert.acknowledged", None, "00000000000000e2"),
        ]
        mirror = (tmp_path / "audit.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in mirror] == records
    finally:
        client.close()


def test_records_are_rebuilt_on_a_head_another_writer_moved(redis_url: str) -> None:
    settings = make_settings(redis_url)
    job_store, client = store_for(settings)
    worker_audit = AuditLog(client, settings.key_prefix)

    async def scenario(store: AsyncJobStore) -> list[list[IngestOutcome]]:
        first = await store.ingest(_v4(alert("00000000000000f1")), False)
        # A worker (another client) appends: the receiver's known head is stale now.
        worker_audit.append("step", first[0].job_id, detail="between two deliveries")
        second = await store.ingest(_v4(alert("00000000000000f2")), False)
        return [first, second]

    try:
        first, second = _run(settings, scenario)
        assert [o.result for o in first + second] == ["accepted", "accepted"]
        records = _trail(client, settings)
        assert [(r["kind"], r["job_id"]) for r in records] == [
            ("job.accepted", first[0].job_id),
            ("step", first[0].job_id),
            ("job.accepted", second[0].job_id),
        ]
        assert client.xlen(job_store.keys.stream) == 2
    finally:
        client.close()


def test_a_trail_without_its_head_refuses_the_delivery_and_records_nothing(
    redis_url: str,
) -> None:
    settings = make_settings(redis_url)
    job_store, client = store_for(settings)
    try:
        with receiver(settings) as server:
            assert post(server.url, payload(alert("00000000000000a7"))).status_code == 202
            # The head gone while records exist: a tampered trail is never silently restarted.
            client.delete(AuditLog(client, settings.key_prefix).keys.head)
            refused = post(server.url, payload(alert("00000000000000a8")))
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert "audit trail unavailable; nothing was recorded" in refused.json()["message"]
        # Neither the job nor its idempotency key: the redelivery will be a new alert.
        assert client.xlen(job_store.keys.stream) == 1
        assert client.zcard(job_store.keys.index) == 1
        assert len(list(client.scan_iter(match="*idem*"))) == 1
        assert client.llen(AuditLog(client, settings.key_prefix).keys.records) == 1
    finally:
        client.close()
