"""The upstream simulator over real HTTP: OpenAI wire format, SSE, LoRA API, fault knobs."""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.faults import LatencyDistribution
from redline.devstack.fakes.lora import adapter_version
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.platform.golden import GOLDEN_SET, MODEL_VERSION_HEADER, grade

pytestmark = pytest.mark.integration

BASE = "redline-base"


@pytest.fixture(scope="module")
def sim() -> Iterator[ServerThread]:
    server = serve_in_thread(build_simulator_app(SimulatorSettings(region="primary", seed=7)))
    yield server
    server.stop()


@pytest.fixture()
def client(sim: ServerThread) -> Iterator[httpx.Client]:
    """A client of the module's simulator, reset to no faults and no adapters."""
    with httpx.Client(base_url=sim.url, timeout=5.0) as c:
        set_faults(c)
        for model in c.get("/v1/models").json()["data"][1:]:
            c.post("/v1/unload_lora_adapter", json={"lora_name": model["id"]})
        yield c


def chat(prompt: str, model: str = BASE, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], **extra}


def set_faults(client: httpx.Client, **faults: Any) -> None:
    response = client.post("/admin/faults", json=faults)
    assert response.status_code == 200, response.text


def parse_sse(raw: bytes) -> list[Any]:
    """Strict SSE parse: every event is one `data: ` line followed by a blank line."""
    assert raw.endswith(b"\n\n")
    events = raw[:-2].split(b"\n\n")
    out: list[Any] = []
    for event in events:
        assert event.startswith(b"data: "), event
        assert b"\n" not in event
        data = event[len(b"data: ") :]
        out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


def test_non_streaming_answer_and_usage(client: httpx.Client) -> None:
    item = GOLDEN_SET[0]
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": BASE,
            "messages": [
                {"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": [{"type": "text", "text": item.prompt}]},
            ],
        },
    )
    assert response.status_code == 200
    assert response.headers[MODEL_VERSION_HEADER] == "base"
    body = response.json()
    assert body["object"] == "chat.completion"
    answer = body["choices"][0]["message"]["content"]
    assert answer == item.reference and grade(answer, item.expected)
    assert body["choices"][0]["finish_reason"] == "stop"
    prompt_words = len("You answer briefly.".split()) + len(item.prompt.split())
    assert body["usage"] == {
        "prompt_tokens": prompt_words,
        "completion_tokens": len(answer.split()),
        "total_tokens": prompt_words + len(answer.split()),
    }


def test_filler_answers_are_max_tokens_long_and_deterministic(client: httpx.Client) -> None:
    first = client.post("/v1/chat/completions", json=chat("tell me a story", max_tokens=7)).json()
    again = client.post("/v1/chat/completions", json=chat("tell me a story", max_tokens=7)).json()
    text = first["choices"][0]["message"]["content"]
    assert len(text.split()) == 7 == first["usage"]["completion_tokens"]
    assert first["choices"][0]["finish_reason"] == "length"
    assert again["choices"][0]["message"]["content"] == text


def test_sse_stream_is_valid_openai_chunks(client: httpx.Client) -> None:
    prompt = "hello there simulator"
    plain = client.post("/v1/chat/completions", json=chat(prompt, max_tokens=5)).json()
    body = chat(prompt, max_tokens=5, stream=True, stream_options={"include_usage": True})
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers[MODEL_VERSION_HEADER] == "base"
    events = parse_sse(response.content)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert all(content)  # one token per content chunk
    assert "".join(content) == plain["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == plain["usage"]
    assert len(content) == plain["usage"]["completion_tokens"]


def test_stream_without_include_usage_has_no_usage(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json=chat("hi", max_tokens=2, stream=True))
    events = parse_sse(response.content)
    assert events[-1] == "[DONE]"
    assert all("usage" not in chunk for chunk in events[:-1])
    assert all(chunk["choices"] for chunk in events[:-1])


def test_stream_is_paced_by_tokens_per_second(client: httpx.Client) -> None:
    set_faults(client, tokens_per_second=40)
    arrivals: list[float] = []
    started = time.perf_counter()
    with client.stream(
        "POST", "/v1/chat/completions", json=chat("pace me", max_tokens=10, stream=True)
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"role"' not in line:
                arrivals.append(time.perf_counter() - started)
    assert len(arrivals) == 10
    # 10 tokens at 40/s: the first arrives after ~25 ms, the last after ~250 ms. Judged from
    # the request's start: a client descheduled at the first token reads it late, which shrank
    # last - first under 9 intervals, while the last token can never come early.
    assert arrivals[-1] >= 9 / 40
    assert arrivals[-1] < 1.0


def test_stream_options_need_stream(client: httpx.Client) -> None:
    response = client.post(
        "/v1/chat/completions", json=chat("x", stream_options={"include_usage": True})
    )
    assert response.status_code == 400
    assert "stream" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"model": BASE, "messages": []}).encode(), 400, "messages"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), 400, "model"),
        (json.dumps(chat("x", max_tokens=0)).encode(), 400, "max_tokens"),
        (json.dumps(chat("x", max_tokens=5000)).encode(), 400, "max_tokens"),
        (json.dumps(chat("x", model="nope")).encode(), 404, "does not exist"),
    ],
)
def test_bad_chat_requests_get_openai_errors(
    client: httpx.Client, body: bytes, status: int, fragment: str
) -> None:
    response = client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == status and fragment in error["message"]


def test_dry_run_validates_without_generating(client: httpx.Client) -> None:
    set_faults(client, tokens_per_second=2)  # a real generation of 16 tokens would take 8 s
    started = time.perf_counter()
    response = client.post("/v1/chat/completions?dry-run=true", json=chat("What is 17 + 25?"))
    assert time.perf_counter() - started < 4.0  # half the generation it must not run
    assert response.status_code == 200
    assert response.json()["valid"] is True and response.json()["prompt_tokens"] == 5
    assert response.headers[MODEL_VERSION_HEADER] == "base"
    missing = client.post("/v1/chat/completions?dry-run=true", json=chat("x", model="nope"))
    assert missing.status_code == 404


def test_healthz_and_models(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "region": "primary"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [BASE]


def make_adapter(root: Path, name: str, version_file: str | None = None) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    if version_file is not None:
        (path / "version").write_text(version_file + "\n")
    return path


def test_adapter_version_convention(tmp_path: Path) -> None:
    assert adapter_version(str(make_adapter(tmp_path, "chat-lora/v7"))) == "v7"
    assert adapter_version(str(tmp_path / "chat-lora" / "v7") + "/") == "v7"
    with_file = make_adapter(tmp_path, "snap-0001", version_file="2024-06-01.3")
    assert adapter_version(str(with_file)) == "2024-06-01.3"


def test_lora_load_unload_changes_model_version(client: httpx.Client, tmp_path: Path) -> None:
    v1 = make_adapter(tmp_path, "chat/v1")
    v2 = make_adapter(tmp_path, "snapshots/0002", version_file="v2")
    loaded = client.post("/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": str(v1)})
    assert loaded.status_code == 200
    assert loaded.text == "Success: LoRA adapter 'chat' added successfully."
    models = client.get("/v1/models").json()["data"]
    assert [(m["id"], m["parent"]) for m in models] == [(BASE, None), ("chat", BASE)]
    answer = client.post("/v1/chat/completions", json=chat(GOLDEN_SET[1].prompt, model="chat"))
    assert answer.headers[MODEL_VERSION_HEADER] == "v1"
    assert grade(answer.json()["choices"][0]["message"]["content"], GOLDEN_SET[1].expected)

    again = client.post("/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": str(v2)})
    assert again.status_code == 400
    assert again.json()["error"]["message"] == "The lora adapter 'chat' has already been loaded."
    inplace = client.post(
        "/v1/load_lora_adapter",
        json={"lora_name": "chat", "lora_path": str(v2), "load_inplace": True},
    )
    assert inplace.status_code == 200
    answer = client.post("/v1/chat/completions", json=chat("x", model="chat"))
    assert answer.headers[MODEL_VERSION_HEADER] == "v2"

    unloaded = client.post("/v1/unload_lora_adapter", json={"lora_name": "chat"})
    assert unloaded.status_code == 200
    assert unloaded.text == "Success: LoRA adapter 'chat' removed successfully."
    assert client.post("/v1/chat/completions", json=chat("x", model="chat")).status_code == 404
    gone = client.post("/v1/unload_lora_adapter", json={"lora_name": "chat"})
    assert gone.status_code == 404
    assert gone.json()["error"]["type"] == "NotFoundError"


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/v1/load_lora_adapter", {"lora_name": "a"}, 400, "must be provided"),
        ("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/no/such"}, 404, "No adapter"),
        ("/v1/load_lora_adapter", {"lora_name": BASE, "lora_path": "/tmp"}, 400, "base model"),
        ("/v1/unload_lora_adapter", {}, 400, "lora_name"),
        ("/v1/unload_lora_adapter", {"lora_name": "never"}, 404, "cannot be found"),
    ],
)
def test_lora_api_errors(
    client: httpx.Client, path: str, body: dict[str, Any], status: int, fragment: str
) -> None:
    response = client.post(path, json=body)
    assert response.status_code == status
    assert fragment in response.json()["error"]["message"]


def test_accuracy_and_latency_faults_follow_the_adapter_version(
    client: httpx.Client, tmp_path: Path
) -> None:
    good = make_adapter(tmp_path, "lora/v1")
    bad = make_adapter(tmp_path, "lora/v2")
    client.post("/v1/load_lora_adapter", json={"lora_name": "good", "lora_path": str(good)})
    client.post("/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(bad)})
    set_faults(
        client,
        versions={
            "v2": {"wrong_answer_probability": 1.0, "latency": {"base_seconds": 0.25}},
        },
    )
    for model, correct, slow in (("good", True, False), ("bad", False, True), (BASE, True, False)):
        for item in GOLDEN_SET[:3]:
            started = time.perf_counter()
            body = client.post("/v1/chat/completions", json=chat(item.prompt, model=model)).json()
            elapsed = time.perf_counter() - started
            answer = body["choices"][0]["message"]["content"]
            assert grade(answer, item.expected) is correct, (model, answer)
            assert (elapsed >= 0.25) is slow, (model, elapsed)


def test_wrong_answer_probability_is_a_probability(client: httpx.Client) -> None:
    set_faults(client, versions={"base": {"wrong_answer_probability": 0.5}})
    item = GOLDEN_SET[0]
    results = [
        grade(
            client.post("/v1/chat/completions", json=chat(item.prompt)).json()["choices"][0][
                "message"
            ]["content"],
            item.expected,
        )
        for _ in range(60)
    ]
    assert 10 <= sum(results) <= 50


def test_error_rate_injects_5xx(client: httpx.Client) -> None:
    set_faults(client, error_rate=1.0, error_status=502)
    response = client.post("/v1/chat/completions", json=chat("x"))
    assert response.status_code == 502
    assert response.json()["error"]["code"] == 502
    set_faults(client, error_rate=0.0)
    assert client.post("/v1/chat/completions", json=chat("x")).status_code == 200


def test_added_latency_and_first_byte_delay(client: httpx.Client) -> None:
    set_faults(
        client,
        latency={"base_seconds": 0.1, "jitter": "uniform", "jitter_seconds": 0.05},
        first_byte_delay_seconds=0.05,
    )
    started = time.perf_counter()
    client.post("/v1/chat/completions", json=chat("x"))
    elapsed = time.perf_counter() - started
    assert 0.15 <= elapsed < 0.4


def test_latency_distributions_sample_as_documented() -> None:
    rng = random.Random(3)
    uniform = LatencyDistribution(base_seconds=0.1, jitter="uniform", jitter_seconds=0.2)
    draws = [uniform.sample(rng) for _ in range(2000)]
    assert 0.1 <= min(draws) and max(draws) <= 0.3
    lognormal = LatencyDistribution(jitter="lognormal", jitter_seconds=0.05, sigma=0.5)
    assert statistics.median(lognormal.sample(rng) for _ in range(4000)) == pytest.approx(
        0.05, rel=0.1
    )
    assert LatencyDistribution().sample(rng) == 0.0


def test_outage_unavailable_answers_503_everywhere_but_admin(client: httpx.Client) -> None:
    set_faults(client, outage="unavailable")
    assert client.get("/healthz").status_code == 503
    assert client.get("/v1/models").status_code == 503
    response = client.post("/v1/chat/completions", json=chat("x"))
    assert response.status_code == 503
    assert "unavailable" in response.json()["error"]["message"]
    assert client.get("/admin/faults").json()["outage"] == "unavailable"
    set_faults(client)
    assert client.get("/healthz").status_code == 200


def test_outage_hang_holds_requests_until_the_client_gives_up(
    sim: ServerThread, client: httpx.Client
) -> None:
    set_faults(client, outage="hang")
    started = time.perf_counter()
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{sim.url}/healthz", timeout=0.3)
    assert time.perf_counter() - started >= 0.3
    set_faults(client)
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("faults", "fragment"),
    [
        ({"error_rate": 1.5}, "error_rate: Input should be less than or equal to 1"),
        ({"error_status": 404}, "error_status"),
        ({"outage": "down"}, "outage: Input should be 'none', 'unavailable' or 'hang'"),
        ({"latency": {"jitter": "gaussian"}}, "latency.jitter"),
        ({"latency": {"base_seconds": -1}}, "latency.base_seconds"),
        ({"tokens_per_second": 0}, "tokens_per_second"),
        ({"versions": {"v1": {"wrong_answer_probability": 2}}}, "wrong_answer_probability"),
        ({"versions": {"has space": {}}}, "visible ASCII"),
        ({"eror_rate": 0.1}, "eror_rate: Extra inputs are not permitted"),
    ],
)
def test_admin_faults_rejects_bad_input_with_422(
    client: httpx.Client, faults: dict[str, Any], fragment: str
) -> None:
    response = client.post("/admin/faults", json=faults)
    assert response.status_code == 422
    assert fragment in response.json()["detail"]
    assert client.get("/admin/faults").json()["error_rate"] == 0.0  # unchanged


def test_admin_faults_round_trip(client: httpx.Client) -> None:
    set_faults(client, error_rate=0.25, versions={"v3": {"wrong_answer_probability": 0.1}})
    current = client.get("/admin/faults").json()
    assert current["error_rate"] == 0.25
    assert current["versions"]["v3"]["wrong_answer_probability"] == 0.1
    set_faults(client)
    assert client.get("/admin/faults").json()["error_rate"] == 0.0


def test_adapters_from_settings_are_loaded_at_start(tmp_path: Path) -> None:
    path = make_adapter(tmp_path, "preloaded/v5")
    settings = SimulatorSettings(region="secondary", adapters={"chat": str(path)})
    server = serve_in_thread(build_simulator_app(settings))
    try:
        with httpx.Client(base_url=server.url) as c:
            response = c.post("/v1/chat/completions", json=chat("x", model="chat"))
            assert response.headers[MODEL_VERSION_HEADER] == "v5"
            assert response.headers["x-redline-region"] == "secondary"
    finally:
        server.stop()
