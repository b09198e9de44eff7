"""The serving client's LoRA calls against redline's vLLM simulator (in a thread): in-place loads,
how an engine without them answers, and reading which files each adapter is served from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from redline.core.servers import ServerThread, serve_in_thread
from redline.devstack.fakes.simulator import SimulatorSettings, build_simulator_app
from redline.platform.serving import (
    HttpAnswer,
    adapter_roots,
    fetch_models,
    http_client,
    is_already_loaded,
    load_lora_adapter,
    unload_lora_adapter,
)


def _adapter(root: Path, version: str) -> str:
    directory = root / version
    directory.mkdir()
    (directory / "version").write_text(version)
    return str(directory)


@pytest.fixture()
def engine(tmp_path: Path) -> Iterator[tuple[ServerThread, httpx.Client, dict[str, str]]]:
    paths = {v: _adapter(tmp_path, v) for v in ("v1", "v2")}
    settings = SimulatorSettings(adapters={"chat": paths["v1"]}, seed=1)
    server = serve_in_thread(build_simulator_app(settings))
    try:
        with http_client(5.0) as client:
            yield server, client, paths
    finally:
        server.stop()


def _versions(client: httpx.Client, url: str, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    answer = client.post(f"{url}/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-redline-model-version"]


def test_an_in_place_load_swaps_the_weights_behind_a_served_name(
    engine: tuple[ServerThread, httpx.Client, dict[str, str]],
) -> None:
    server, client, paths = engine
    assert adapter_roots(fetch_models(client, server.url)) == {"chat": paths["v1"]}
    plain = load_lora_adapter(client, server.url, "chat", paths["v2"])
    assert plain.status == 400 and is_already_loaded(plain)
    # Beside it under another name, then in place under the served name.
    assert load_lora_adapter(client, server.url, "chat@v2", paths["v2"]).status == 200
    assert adapter_roots(fetch_models(client, server.url)) == {
        "chat": paths["v1"],
        "chat@v2": paths["v2"],
    }
    assert _versions(client, server.url, "chat@v2") == "v2"
    assert load_lora_adapter(client, server.url, "chat", paths["v2"], inplace=True).status == 200
    assert _versions(client, server.url, "chat") == "v2"
    assert unload_lora_adapter(client, server.url, "chat@v2").status == 200
    assert unload_lora_adapter(client, server.url, "chat@v2").status == 404
    assert adapter_roots(fetch_models(client, server.url)) == {"chat": paths["v2"]}


def test_adapter_roots_lists_adapters_not_the_base_model() -> None:
    cards: list[dict[str, Any]] = [
        {"id": "base", "root": "base", "parent": None},
        {"id": "chat", "root": "/a/v1", "parent": "base"},
        {"id": "odd", "root": 7, "parent": "base"},
    ]
    assert adapter_roots(cards) == {"chat": "/a/v1", "odd": None}


def test_already_loaded_is_told_from_other_refusals() -> None:
    loaded = '{"error": {"message": "The lora adapter \'chat\' has already been loaded."}}'
    assert is_already_loaded(HttpAnswer(400, loaded, {}))
    assert not is_already_loaded(HttpAnswer(404, loaded, {}))
    assert not is_already_loaded(HttpAnswer(400, '{"error": {"message": "bad path"}}', {}))
