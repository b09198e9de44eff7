"""The readiness gate of a replacement: `/healthz` answers 200 from a new instance (its
`x-redline-instance` differs from the preempted one's, when the server names instances),
`/v1/models` lists the model, and a one-token dummy inference succeeds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

INSTANCE_HEADER = "x-redline-instance"


@dataclass(frozen=True)
class ReadinessCheck:
    """One pass of the readiness gate over a replacement."""

    healthy: bool
    model_loaded: bool
    inference_ok: bool
    instance: str | None
    detail: str

    @property
    def ready(self) -> bool:
        """All three checks passed."""
        return self.healthy and self.model_loaded and self.inference_ok

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "ready": self.ready,
            "healthy": self.healthy,
            "model_loaded": self.model_loaded,
            "inference_ok": self.inference_ok,
            "instance": self.instance,
            "detail": self.detail,
        }


class ReadinessGate:
    """Health, model loaded, dummy inference: the replacement serves only after all three."""

    def __init__(
        self, client: httpx.Client, model: str | None = None, prompt: str = "readiness check"
    ) -> None:
        self.client = client
        self.model = model
        self.prompt = prompt

    def instance(self, url: str) -> str | None:
        """The instance id the server at `url` names (None when it names none or is down)."""
        try:
            response = self.client.get(f"{url.rstrip('/')}/healthz")
        except httpx.HTTPError:
            return None
        instance = response.headers.get(INSTANCE_HEADER)
        return None if instance is None else str(instance)

    def check(self, url: str, not_instance: str | None = None) -> ReadinessCheck:
        """Run the three checks once; `not_instance` is the preempted node's instance id."""
        base = url.rstrip("/")
        try:
            health = self.client.get(f"{base}/healthz")
        except httpx.HTTPError as exc:
            return ReadinessCheck(False, False, False, None, f"health: {type(exc).__name__}")
        instance = health.headers.get(INSTANCE_HEADER)
        if health.status_code != 200:
            return ReadinessCheck(
                False, False, False, instance, f"health: HTTP {health.status_code}"
            )
        if not_instance is not None and instance == not_instance:
            return ReadinessCheck(
                False, False, False, instance, f"health: still the preempted instance {instance}"
            )
        try:
            listed = self.client.get(f"{base}/v1/models")
            ids = [m.get("id") for m in listed.json().get("data", [])] if listed.is_success else []
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            return ReadinessCheck(True, False, False, instance, f"models: {type(exc).__name__}")
        model = self.model or (ids[0] if ids else None)
        if model is None or model not in ids:
            wanted = self.model or "any model"
            return ReadinessCheck(True, False, False, instance, f"models: {wanted} not loaded")
        body = {
            "model": model,
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": 1,
        }
        try:
            answer = self.client.post(f"{base}/v1/chat/completions", json=body)
            content = (
                answer.json()["choices"][0]["message"]["content"] if answer.is_success else None
            )
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            return ReadinessCheck(True, True, False, instance, f"inference: {type(exc).__name__}")
        if not content:
            return ReadinessCheck(
                True, True, False, instance, f"inference: HTTP {answer.status_code}, no answer"
            )
        return ReadinessCheck(True, True, True, instance, f"ready: {model} answered")

    def wait(
        self,
        url: str,
        timeout: float,
        interval: float,
        not_instance: str | None = None,
        stop: threading.Event | None = None,
        observe: Callable[[ReadinessCheck], None] | None = None,
    ) -> ReadinessCheck:
        """Check until ready or `timeout`; the last check either way (each one to `observe`)."""
        deadline = time.monotonic() + timeout
        while True:
            check = self.check(url, not_instance)
            if observe is not None:
                observe(check)
            if check.ready or time.monotonic() >= deadline:
                return check
            if stop is not None and stop.wait(interval):
                return check
            if stop is None:
                time.sleep(interval)


__all__ = ["INSTANCE_HEADER", "ReadinessCheck", "ReadinessGate"]
