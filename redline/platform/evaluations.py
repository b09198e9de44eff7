"""Client of the exporter's `POST /v1/evaluations`: accuracy verdicts from your own evaluator.

    from redline.platform.evaluations import EvaluationClient

    with EvaluationClient("http://exporter:9109", token=token) as client:
        client.post("chat", correct=judge(answer) >= 0.5, score=judge(answer))

Each verdict counts once in `llm_eval_requests_total` (and in `llm_eval_correct_total` when
correct) under the model and version, which default to the model's active version in the
snapshot registry. A refused verdict raises `EvaluationError` with the server's message (401:
the token; 422: the field, e.g. an unknown model or version); so does a transport failure or a
5xx, marked `retryable`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

PATH = "/v1/evaluations"


class EvaluationError(Exception):
    """The exporter refused the verdicts (`status` 4xx) or could not take them (`retryable`)."""

    def __init__(self, message: str, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


def build_verdict(
    model: str, correct: bool, version: str | None = None, score: float | None = None
) -> dict[str, Any]:
    """The JSON body of one verdict (optional fields left out when None)."""
    body: dict[str, Any] = {"model": model, "correct": correct}
    if version is not None:
        body["version"] = version
    if score is not None:
        body["score"] = score
    return body


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return response.text[:300]
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return response.text[:300]


class EvaluationClient:
    """Posts verdicts to an exporter; `url` is its base URL (or the full endpoint URL)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_seconds: float = 5.0,
        client: httpx.Client | None = None,
    ) -> None:
        base = url.rstrip("/")
        self.url = base if base.endswith(PATH) else base + PATH
        self._headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._own = client is None
        self._client = client or httpx.Client(
            timeout=timeout_seconds, trust_env=False, follow_redirects=False
        )

    @classmethod
    def from_token_file(
        cls, url: str, token_file: Path, timeout_seconds: float = 5.0
    ) -> EvaluationClient:
        """A client whose token is read (stripped) from a file."""
        try:
            token = Path(token_file).read_text("utf-8").strip()
        except OSError as exc:
            raise EvaluationError(f"cannot read the token file {token_file}: {exc}") from None
        if not token:
            raise EvaluationError(f"the token file {token_file} is empty")
        return cls(url, token, timeout_seconds)

    def post(
        self,
        model: str,
        correct: bool,
        version: str | None = None,
        score: float | None = None,
    ) -> dict[str, Any]:
        """Post one verdict; the server's answer (`accepted`, resolved `verdicts`)."""
        return self._send(build_verdict(model, correct, version, score))

    def post_many(self, verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Post a batch (bodies as `build_verdict` makes them): all are counted or none."""
        return self._send([dict(verdict) for verdict in verdicts])

    def _send(self, body: object) -> dict[str, Any]:
        try:
            response = self._client.post(self.url, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise EvaluationError(
                f"POST {self.url}: {type(exc).__name__}: {exc}", retryable=True
            ) from exc
        if response.status_code >= 400:
            raise EvaluationError(
                f"POST {self.url}: HTTP {response.status_code}: {_message(response)}",
                status=response.status_code,
                retryable=response.status_code >= 500,
            )
        try:
            answer = response.json()
        except ValueError:
            raise EvaluationError(f"POST {self.url}: the answer is not JSON") from None
        if not isinstance(answer, dict):
            raise EvaluationError(f"POST {self.url}: the answer is not a JSON object")
        return answer

    def close(self) -> None:
        """Close the HTTP client (only one this object opened)."""
        if self._own:
            self._client.close()

    def __enter__(self) -> EvaluationClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
