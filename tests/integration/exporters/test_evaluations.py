"""`POST /v1/evaluations` on the real exporter app (uvicorn), read back from its `/metrics`, and
the Python client against it; a bad golden-set file stopping `redline exporters`."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from redline.core.servers import ServerThread, serve_in_thread
from redline.exporters.app import build_exporter_app
from redline.exporters.settings import ExporterSettings
from redline.platform.evaluations import EvaluationClient, EvaluationError, build_verdict
from redline.platform.snapshots import SnapshotRegistry
from redline.slo import catalog
from redline.slo.load import load_spec
from tests.support.snapshots import make_artifacts

pytestmark = pytest.mark.integration

REDLINE = str(Path(sys.executable).with_name("redline"))
MODEL = "chat"
TOKEN = "s3cret-evaluator-token"
REQUESTS = catalog.LLM_EVAL_REQUESTS_TOTAL.name
CORRECT = catalog.LLM_EVAL_CORRECT_TOTAL.name
OTHER_SECTIONS = ("endpoints", "golden_set", "index_staleness", "session_rpo", "keepalive", "drift")


@pytest.fixture()
def registry(tmp_path: Path) -> SnapshotRegistry:
    """`chat` with versions v1 and v2 recorded, v2 active."""
    registry = SnapshotRegistry(tmp_path / "snapshots")
    ids = {}
    for version in ("v1", "v2"):
        weights, config = make_artifacts(tmp_path / "artifacts", version)
        ids[version] = registry.create(MODEL, version, weights, config).snapshot_id
    registry.activate(MODEL, ids["v2"])
    return registry


def settings_for(
    registry: SnapshotRegistry, tmp_path: Path, **evaluations: Any
) -> ExporterSettings:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    section: dict[str, Any] = {"token_file": str(token_file), **evaluations}
    return ExporterSettings.model_validate(
        {
            **{name: {"enabled": False} for name in OTHER_SECTIONS},
            "models": {
                "root": str(registry.root),
                "interval_seconds": 1,
                "version_ttl_seconds": 0.1,
            },
            "evaluations": {k: v for k, v in section.items() if v is not None},
            "gzip": False,
        }
    )


@pytest.fixture()
def serve() -> Iterator[Callable[[ExporterSettings], ServerThread]]:
    servers: list[ServerThread] = []

    def start(settings: ExporterSettings) -> ServerThread:
        exporter = build_exporter_app(settings, load_spec().spec)
        server = serve_in_thread(exporter.app)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture()
def exporter(
    registry: SnapshotRegistry, tmp_path: Path, serve: Callable[[ExporterSettings], ServerThread]
) -> ServerThread:
    return serve(settings_for(registry, tmp_path))


def counters(url: str) -> dict[tuple[str, str, str], float]:
    """Every llm_eval counter sample on /metrics by (name, model, model_version)."""
    text = httpx.get(f"{url}/metrics").text
    found: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (REQUESTS, CORRECT):
                labels = sample.labels
                found[(sample.name, labels["model"], labels["model_version"])] = sample.value
    return found


def post(url: str, body: object, token: str | None = TOKEN) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.post(f"{url}/v1/evaluations", json=body, headers=headers)


def test_verdicts_feed_the_counters_under_the_active_version(exporter: ServerThread) -> None:
    assert counters(exporter.url) == {}
    for correct in (True, True, False):
        answer = post(exporter.url, {"model": MODEL, "correct": correct, "score": 0.5})
        assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "accepted": 1,
        "verdicts": [{"model": MODEL, "model_version": "v2", "correct": False}],
    }
    assert post(exporter.url, {"model": MODEL, "version": "v1", "correct": True}).status_code == 200
    assert counters(exporter.url) == {
        (REQUESTS, MODEL, "v2"): 3,
        (CORRECT, MODEL, "v2"): 2,
        (REQUESTS, MODEL, "v1"): 1,
        (CORRECT, MODEL, "v1"): 1,
    }


def test_a_batch_counts_all_or_nothing(exporter: ServerThread) -> None:
    good = [{"model": MODEL, "correct": True}, {"model": MODEL, "version": "v1", "correct": False}]
    bad = [*good, {"model": MODEL, "version": "v7", "correct": True}]
    refused = post(exporter.url, bad)
    assert refused.status_code == 422
    assert refused.json()["error"]["problems"] == [
        "[2].version: unknown version 'v7' of 'chat': neither the active one (v2) nor a "
        "snapshot in the registry (known: v1, v2)"
    ]
    assert counters(exporter.url) == {}
    accepted = post(exporter.url, good * 50)
    assert accepted.status_code == 200 and accepted.json()["accepted"] == 100
    assert counters(exporter.url) == {
        (REQUESTS, MODEL, "v2"): 50,
        (CORRECT, MODEL, "v2"): 50,
        (REQUESTS, MODEL, "v1"): 50,
        (CORRECT, MODEL, "v1"): 0,
    }


@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x", TOKEN[:6]])
def test_a_missing_or_wrong_token_is_401(exporter: ServerThread, token: str | None) -> None:
    answer = post(exporter.url, {"model": MODEL, "correct": True}, token=token)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert answer.json()["error"]["message"] == "missing or wrong bearer token"
    raw = httpx.post(
        f"{exporter.url}/v1/evaluations",
        json={"model": MODEL, "correct": True},
        headers={"Authorization": TOKEN},  # the token without the scheme
    )
    assert raw.status_code == 401
    assert counters(exporter.url) == {}


def test_unknown_model_and_version_are_422_naming_the_field(exporter: ServerThread) -> None:
    answer = post(exporter.url, {"model": "gpt-9", "correct": True})
    assert answer.status_code == 422
    message = answer.json()["error"]["message"]
    assert message.startswith("model: unknown model 'gpt-9': not in the snapshot registry at ")
    assert message.endswith("(known: chat)")
    answer = post(exporter.url, {"model": MODEL, "version": "v3", "correct": True})
    assert answer.status_code == 422
    assert answer.json()["error"]["message"].startswith("version: unknown version 'v3' of 'chat'")
    assert post(exporter.url, {"model": MODEL, "correct": "yes"}).status_code == 422
    not_json = httpx.post(
        f"{exporter.url}/v1/evaluations",
        content=b"{nope",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert not_json.status_code == 400
    assert counters(exporter.url) == {}


def test_a_rollback_moves_the_default_version(
    exporter: ServerThread, registry: SnapshotRegistry
) -> None:
    assert (
        post(exporter.url, {"model": MODEL, "correct": True}).json()["verdicts"][0]["model_version"]
        == "v2"
    )
    (v1,) = [s for s in registry.list(MODEL) if s.version == "v1"]
    registry.activate(MODEL, v1.snapshot_id)

    def version_now() -> str:
        body = post(exporter.url, {"model": MODEL, "correct": True}).json()
        return str(body["verdicts"][0]["model_version"])

    # The exporter caches the active version for version_ttl_seconds (0.1 s here).
    deadline = time.monotonic() + 5.0
    while version_now() != "v1":
        assert time.monotonic() < deadline, "the rollback never showed"
        time.sleep(0.05)
    assert counters(exporter.url)[(REQUESTS, MODEL, "v1")] >= 1


def test_without_a_token_the_endpoint_is_closed_unless_opened(
    registry: SnapshotRegistry, tmp_path: Path, serve: Callable[[ExporterSettings], ServerThread]
) -> None:
    closed = serve(settings_for(registry, tmp_path, token_file=None))
    answer = post(closed.url, {"model": MODEL, "correct": True}, token=None)
    assert answer.status_code == 403
    assert "set evaluations.token_file" in answer.json()["error"]["message"]
    assert post(closed.url, {"model": MODEL, "correct": True}).status_code == 403
    opened = serve(settings_for(registry, tmp_path, token_file=None, allow_unauthenticated=True))
    assert post(opened.url, {"model": MODEL, "correct": True}, token=None).status_code == 200
    assert counters(opened.url) == {(REQUESTS, MODEL, "v2"): 1, (CORRECT, MODEL, "v2"): 1}
    disabled = serve(settings_for(registry, tmp_path, enabled=False))
    assert post(disabled.url, {"model": MODEL, "correct": True}).status_code == 404


def test_the_python_client_against_the_real_app(exporter: ServerThread, tmp_path: Path) -> None:
    with EvaluationClient(exporter.url, token=TOKEN) as client:
        answer = client.post(MODEL, correct=True, score=0.9)
        assert answer["verdicts"] == [{"model": MODEL, "model_version": "v2", "correct": True}]
        client.post(MODEL, correct=False, version="v1")
        batch = client.post_many([build_verdict(MODEL, True), build_verdict(MODEL, False)])
        assert batch["accepted"] == 2
        with pytest.raises(EvaluationError, match="HTTP 422: model: unknown model 'nope'") as bad:
            client.post("nope", correct=True)
        assert bad.value.status == 422 and not bad.value.retryable
        with pytest.raises(EvaluationError, match=r"HTTP 422: version: unknown version 'v9'"):
            client.post(MODEL, correct=True, version="v9")
    token_file = tmp_path / "client-token"
    token_file.write_text(TOKEN + "\n")
    with EvaluationClient.from_token_file(exporter.url + "/v1/evaluations", token_file) as client:
        client.post(MODEL, correct=True)
    with EvaluationClient(exporter.url, token="wrong") as client:
        with pytest.raises(EvaluationError, match="HTTP 401: missing or wrong bearer token") as no:
            client.post(MODEL, correct=True)
        assert no.value.status == 401
    assert counters(exporter.url) == {
        (REQUESTS, MODEL, "v2"): 4,
        (CORRECT, MODEL, "v2"): 3,
        (REQUESTS, MODEL, "v1"): 1,
        (CORRECT, MODEL, "v1"): 0,
    }
    with EvaluationClient("http://127.0.0.1:1", token=TOKEN, timeout_seconds=1) as client:
        with pytest.raises(EvaluationError, match="ConnectError") as down:
            client.post(MODEL, correct=True)
        assert down.value.retryable and down.value.status is None


def test_a_bad_golden_file_stops_the_exporter_command(tmp_path: Path) -> None:
    golden = tmp_path / "golden.jsonl"
    golden.write_text(
        '{"id": "a", "prompt": "p?", "expected": "4", "matcher": "numeric-tolerance"}\n'
        '{"id": "b", "prompt": "q?", "expected": "x", "matcher": "fuzzy"}\n'
    )
    config = tmp_path / "exporter.yaml"
    config.write_text(
        "golden_set:\n"
        "  gateway_url: http://127.0.0.1:1\n"
        f"  path: {golden}\n"
        + "".join(f"{name}:\n  enabled: false\n" for name in OTHER_SECTIONS if name != "golden_set")
    )
    result = subprocess.run(
        [REDLINE, "exporters", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"{golden}:2: matcher: 'fuzzy' is not one of exact, normalized, regex" in result.stderr
    assert "Traceback" not in result.stderr
