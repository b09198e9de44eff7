"""`rollback_candidate` on the real receiver and worker over a real Redis: a mutation alert
records its model version as a rollback candidate with the diff; a second canary of the same
version adds evidence; resolutions close the evidence, then the record."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import redis

from redline.remediation.playbooks.candidate import read_candidates
from tests.support.playbook import playbook_settings, records, run_jobs
from tests.support.remediation import alert

DIFF = "-the capital of france +i believe it | -paris +lyon"
START = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def _mutation(fingerprint: str, prompt: str, status: str = "firing") -> dict[str, Any]:
    return alert(
        fingerprint,
        playbook="rollback_candidate",
        region="secondary",
        status=status,
        starts_at=START,
        labels={
            "alertname": "OutputConsistencyMutation",
            "model": "chat-lora",
            "model_version": "v2",
            "prompt": prompt,
            "diff": DIFF,
        },
        annotations={"description": f"The canary's answer differs: {DIFF}."},
    )


def test_a_mutation_is_recorded_as_a_rollback_candidate(redis_url: str) -> None:
    settings = playbook_settings(redis_url)
    prefix = f"{settings.key_prefix}:playbook"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        (job,) = run_jobs(settings, _mutation("aaaa0001", "capital-france"))
        assert job.status == "succeeded", job.error
        (verify,) = [s for s in job.steps if s.get("phase") == "verify"]
        assert verify["ok"] and DIFF in verify["detail"]
        (record,) = read_candidates(client, prefix)
        assert (record["model"], record["model_version"], record["status"]) == (
            "chat-lora", "v2", "open"
        )  # fmt: skip
        evidence = record["evidence"]["secondary/capital-france"]
        assert evidence["diff"] == DIFF and evidence["job_id"] == job.id
        assert evidence["since"] == START.timestamp()

        (other,) = run_jobs(settings, _mutation("aaaa0002", "hexagon"))
        assert other.status == "succeeded", other.error
        (record,) = read_candidates(client, prefix)
        assert set(record["evidence"]) == {"secondary/capital-france", "secondary/hexagon"}

        (closed,) = run_jobs(settings, _mutation("aaaa0001", "capital-france", "resolved"))
        assert closed.status == "succeeded", closed.error
        assert records(closed, "close_evidence")
        (record,) = read_candidates(client, prefix)
        assert record["status"] == "open"  # hexagon still differs
        assert record["evidence"]["secondary/capital-france"]["resolved_at"] is not None

        (last,) = run_jobs(settings, _mutation("aaaa0002", "hexagon", "resolved"))
        assert last.status == "succeeded", last.error
        (record,) = read_candidates(client, prefix)
        assert record["status"] == "resolved"
    finally:
        client.close()
