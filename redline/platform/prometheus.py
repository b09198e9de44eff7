"""The one Prometheus HTTP API client (httpx): reports, dashboard checks, drills and benchmarks.

`PrometheusClient(url, timeout=30.0, retries=2, trust_env=True)` is a context manager (or call
`close()`); it is thread-safe, so a pool of workers can share one. Queries:
`instant(query, at=None) -> [(labels, value)]` and `range(query, start, end, step) ->
[(labels, [(time, value)])]` give floats exactly as Prometheus sent them (NaN and ±Inf
included; callers drop what they do not want) in Prometheus' order; `instant_raw` and
`range_raw` give the API's `data` / `data.result` JSON untouched (a range-vector instant query
answers a matrix); `label_values(label, match, start, end)` lists a label's values (sorted);
`alerts()` the active alerts; `check()` raises unless the API answers; `get(path, params)` is the
`data` of any other API endpoint. `sent` counts the HTTP requests made (retries not included).
Connection failures, timeouts and 429/502/503/504 answers are retried `retries` times with a
short backoff; what still fails, any other 5xx and an answer that is not Prometheus' raise
`PrometheusUnavailableError`; an answer refusing the request (a bad query, any other 4xx) raises
`PrometheusError`, whose `detail` is Prometheus' own message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx

Labels = dict[str, str]
Points = list[tuple[float, float]]

RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers worth asking again (overloaded or restarting); other errors are final."""

BACKOFF_SECONDS = 0.2
"""Wait before the second retry; doubles for each further one (the first retry is at once)."""


class PrometheusError(Exception):
    """Prometheus refused a request (bad query, 4xx); `detail` is Prometheus' own message."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = message if detail is None else detail


class PrometheusUnavailableError(PrometheusError):
    """Prometheus cannot be reached (down, wrong URL, timeout, or 429/5xx after retries)."""


def _reason(exc: httpx.HTTPError) -> str:
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text[:200]}"


class PrometheusClient:
    """A Prometheus HTTP API client with retries and a request counter."""

    def __init__(
        self, url: str, timeout: float = 30.0, retries: int = 2, trust_env: bool = True
    ) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        self._http = httpx.Client(base_url=self.url, timeout=timeout, trust_env=trust_env)
        self._sent = 0
        self._lock = threading.Lock()

    @property
    def sent(self) -> int:
        """HTTP requests sent so far (retries not included)."""
        return self._sent

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, path: str, params: Mapping[str, Any]) -> httpx.Response:
        with self._lock:
            self._sent += 1
        attempt = 0
        while True:
            try:
                response = self._http.get(path, params=dict(params))
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise PrometheusUnavailableError(
                        f"Prometheus at {self.url} is not reachable ({_reason(exc)}); "
                        "is it running, and is its URL right?"
                    ) from None
            else:
                if response.status_code not in RETRY_STATUSES or attempt >= self.retries:
                    return response
            attempt += 1
            if attempt > 1:
                time.sleep(BACKOFF_SECONDS * 2 ** (attempt - 2))

    def get(self, path: str, params: Mapping[str, Any] | None = None, what: str = "") -> Any:
        """The `data` of a GET on an API path (e.g. `/api/v1/targets`)."""
        what = what or f"a request to {path}"
        response = self._send(path, params or {})
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "status" not in body:
            raise PrometheusUnavailableError(
                f"Prometheus at {self.url} did not answer {what} "
                f"(HTTP {response.status_code}, not a Prometheus API answer)"
            )
        if response.status_code == 200 and body["status"] == "success":
            return body.get("data")
        detail = str(body.get("error", response.text))
        if response.status_code in RETRY_STATUSES or response.status_code >= 500:
            raise PrometheusUnavailableError(
                f"Prometheus at {self.url} failed {what} with HTTP {response.status_code} "
                f"after {self.retries} retries: {detail}",
                detail,
            )
        raise PrometheusError(f"Prometheus at {self.url} rejected {what}: {detail}", detail)

    def check(self) -> None:
        """Raise PrometheusUnavailableError unless Prometheus answers its query API."""
        self.get("/api/v1/query", {"query": "vector(1)"}, "a status query")

    def instant_raw(self, query: str, at: float | None = None) -> dict[str, Any]:
        """An instant query's `data` (`resultType` and `result`) as Prometheus sent it."""
        params: dict[str, Any] = {"query": query}
        if at is not None:
            params["time"] = at
        data: dict[str, Any] = self.get("/api/v1/query", params, f"query {query!r}")
        return data

    def instant(self, query: str, at: float | None = None) -> list[tuple[Labels, float]]:
        """An instant vector query at `at` (now when None): each series' labels and value."""
        data = self.instant_raw(query, at)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(dict(item["metric"]), float(item["value"][1])) for item in data["result"]]

    def range_raw(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's `result` as Prometheus sent it (`metric` and `values` per series)."""
        params = {"query": query, "start": start, "end": end, "step": step}
        data = self.get("/api/v1/query_range", params, f"range query {query!r}")
        result: list[dict[str, Any]] = data["result"]
        return result

    def range(
        self, query: str, start: float, end: float, step: float
    ) -> list[tuple[Labels, Points]]:
        """A range query: each series' labels and (time, value) points."""
        return [
            (dict(item["metric"]), [(float(t), float(v)) for t, v in item["values"]])
            for item in self.range_raw(query, start, end, step)
        ]

    def label_values(
        self,
        label: str,
        match: str | None = None,
        start: float | None = None,
        end: float | None = None,
    ) -> list[str]:
        """A label's values (of the series `match` selects, within [start, end]), sorted."""
        params: dict[str, Any] = {}
        if match:
            params["match[]"] = match
        if start is not None:
            params["start"] = start
        if end is not None:
            params["end"] = end
        values = self.get(f"/api/v1/label/{label}/values", params, f"label values of {label}")
        return sorted(str(v) for v in values)

    def alerts(self) -> list[dict[str, Any]]:
        """The active alerts (pending and firing), each with `labels`, `state`, `activeAt`."""
        data = self.get("/api/v1/alerts", {}, "the alerts request")
        alerts: list[dict[str, Any]] = data["alerts"]
        return alerts
