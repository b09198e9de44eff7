"""HTTP client of an OpenAI-compatible serving endpoint (vLLM and compatible servers): model
discovery, dry-run health probes, vLLM's LoRA adapter API.

vLLM's runtime LoRA API (served with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`):
`POST /v1/load_lora_adapter {"lora_name", "lora_path"[, "load_inplace"]}` and
`POST /v1/unload_lora_adapter {"lora_name"}`, both answering 200 with plain text, or a JSON
error (400: bad input or, without `load_inplace`, a name already loaded; 404: no adapter at the
path, or the name not loaded). `load_inplace: true` (vLLM releases with PR #31326) replaces the
weights behind a loaded name without a moment where the name is missing; an older vLLM ignores
the field and answers 400 "already been loaded". `/v1/models` lists each adapter as a card with
`id` = its name and `root` = the path it was loaded from.

Callers (the remediation playbooks) reach the serving layer over HTTP only, never by importing
the gateway. Transport failures and 5xx answers raise `redline.core.errors.TransientError` (a
remediation job is then retried with backoff); a 4xx is the server's considered answer and is
returned to the caller to judge.
"""

from __future__ import annotations

import functools
import json
import ssl
import time
from dataclasses import dataclass
from typing import Any

import httpx

from redline.core.errors import TransientError

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MODELS_PATH = "/v1/models"
CHAT_PATH = "/v1/chat/completions"


class ServingError(Exception):
    """A server answered something the caller cannot use (4xx, malformed body)."""


@dataclass(frozen=True)
class HttpAnswer:
    """Status, body text and headers of one answered request."""

    status: int
    text: str
    headers: dict[str, str]

    def json_object(self) -> dict[str, Any]:
        """The body as a JSON object; ServingError when it is not one."""
        try:
            data = json.loads(self.text)
        except ValueError:
            raise ServingError(
                f"HTTP {self.status}: body is not JSON: {self.text[:200]!r}"
            ) from None
        if not isinstance(data, dict):
            raise ServingError(f"HTTP {self.status}: body is not a JSON object")
        return data

    def error_message(self) -> str:
        """The OpenAI/vLLM error message of a failed answer, else the start of the body."""
        try:
            error = self.json_object().get("error")
        except ServingError:
            error = None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        return self.text[:200]


@dataclass(frozen=True)
class HealthCheck:
    """A dry-run probe of one base URL: healthy or not, why, and how long it took."""

    url: str
    healthy: bool
    detail: str
    seconds: float
    headers: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        """JSON form, for step records."""
        return {
            "url": self.url,
            "healthy": self.healthy,
            "detail": self.detail,
            "seconds": round(self.seconds, 4),
        }


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Loading the CA bundle costs ~20 ms; playbooks open a client per step, so load it once
    # (an SSLContext is safe to share between clients and threads).
    return httpx.create_ssl_context(trust_env=False)


def http_client(timeout_seconds: float) -> httpx.Client:
    """A client for loopback or cluster-internal calls: no proxies from the environment."""
    return httpx.Client(
        timeout=timeout_seconds, trust_env=False, follow_redirects=False, verify=_tls_context()
    )


def call(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    body: Any = None,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> HttpAnswer:
    """One request; TransientError on a transport failure or a 5xx answer."""
    try:
        response = client.request(method, url, json=body, params=params, headers=headers)
    except httpx.HTTPError as exc:
        raise TransientError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    answer = HttpAnswer(response.status_code, response.text, dict(response.headers))
    if response.status_code >= 500:
        raise TransientError(
            f"{method} {url}: HTTP {response.status_code}: {answer.error_message()}"
        )
    return answer


def fetch_models(client: httpx.Client, base_url: str) -> list[dict[str, Any]]:
    """The model cards of `/v1/models`; TransientError when unreachable, ServingError if odd."""
    answer = call(client, "GET", base_url + MODELS_PATH)
    if answer.status != 200:
        raise ServingError(
            f"{base_url}{MODELS_PATH}: HTTP {answer.status}: {answer.error_message()}"
        )
    data = answer.json_object().get("data")
    if not isinstance(data, list) or not all(isinstance(card, dict) for card in data):
        raise ServingError(f"{base_url}{MODELS_PATH}: `data` is not a list of model cards")
    return data


def find_card(cards: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The card whose `id` is `name`."""
    return next((card for card in cards if card.get("id") == name), None)


def probe_model(client: httpx.Client, base_url: str, configured: str | None) -> str:
    """The model to probe with: the configured one, else the first the server lists."""
    if configured:
        return configured
    cards = fetch_models(client, base_url)
    if not cards or not isinstance(cards[0].get("id"), str):
        raise ServingError(f"{base_url}{MODELS_PATH}: no model listed")
    return str(cards[0]["id"])


def dry_run(client: httpx.Client, base_url: str, model: str) -> HttpAnswer:
    """`POST /v1/chat/completions?dry-run=true`: validated and answered without generating."""
    body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    return call(client, "POST", base_url + CHAT_PATH, body=body, params={"dry-run": "true"})


def check_health(client: httpx.Client, base_url: str, model: str | None) -> HealthCheck:
    """Probe a base URL with a dry-run chat completion; any failure is an unhealthy result."""
    started = time.monotonic()
    try:
        answer = dry_run(client, base_url, probe_model(client, base_url, model))
        if answer.status != 200:
            raise ServingError(f"dry run answered HTTP {answer.status}: {answer.error_message()}")
        answer.json_object()
    except (TransientError, ServingError) as exc:
        return HealthCheck(base_url, False, str(exc), time.monotonic() - started, {})
    return HealthCheck(base_url, True, "dry run answered 200", time.monotonic() - started,
                       answer.headers)  # fmt: skip


def unload_lora_adapter(client: httpx.Client, base_url: str, name: str) -> HttpAnswer:
    """vLLM `POST /v1/unload_lora_adapter {"lora_name"}` (200 unloaded; 404/400 not loaded)."""
    return call(client, "POST", base_url + UNLOAD_PATH, body={"lora_name": name})


def load_lora_adapter(
    client: httpx.Client, base_url: str, name: str, path: str, *, inplace: bool = False
) -> HttpAnswer:
    """vLLM `POST /v1/load_lora_adapter {"lora_name", "lora_path"[, "load_inplace"]}` (200
    loaded; with `inplace` a loaded name is given the new weights without being unloaded)."""
    body: dict[str, Any] = {"lora_name": name, "lora_path": path}
    if inplace:
        body["load_inplace"] = True
    return call(client, "POST", base_url + LOAD_PATH, body=body)


def adapter_roots(cards: list[dict[str, Any]]) -> dict[str, str | None]:
    """Name -> `root` (the path it was loaded from) of every card that has a parent (an
    adapter on a base model; the base model itself has none)."""
    roots: dict[str, str | None] = {}
    for card in cards:
        name = card.get("id")
        if isinstance(name, str) and card.get("parent"):
            root = card.get("root")
            roots[name] = root if isinstance(root, str) else None
    return roots


def is_already_loaded(answer: HttpAnswer) -> bool:
    """A load refused because the name is loaded (how a vLLM without `load_inplace` answers)."""
    return answer.status == 400 and "already been loaded" in answer.error_message()
