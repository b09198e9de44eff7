"""The gateways' `/admin/spot` API, as the drain flow calls it: drain a node (close its admission
and triage its requests), count what is still in flight on it, release it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from redline.platform.spot.errors import SpotAgentError


class GatewayAdmin:
    """The `/admin/spot` API of every gateway in front of the node."""

    def __init__(self, urls: Sequence[str], client: httpx.Client, token: str | None = None):
        self.urls = [u.rstrip("/") for u in urls]
        self.client = client
        self.headers = {"authorization": f"Bearer {token}"} if token else {}

    def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post(url, json=body, headers=self.headers)
        if response.status_code != 200:
            raise SpotAgentError(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
        data: dict[str, Any] = response.json()
        return data

    def drain(
        self,
        node: str,
        budget_seconds: float,
        continue_factor: float,
        close_seconds: float,
        reason: str,
    ) -> list[dict[str, Any]]:
        """Close the node's admission and triage its requests on every gateway; their reports."""
        body = {
            "node": node,
            "budget_seconds": budget_seconds,
            "continue_factor": continue_factor,
            "close_seconds": close_seconds,
            "reason": reason[:500],
        }
        return [self._post(f"{url}/admin/spot/drain", body) for url in self.urls]

    def inflight(self, node: str) -> int:
        """Requests still in flight on the node, over every gateway."""
        total = 0
        for url in self.urls:
            response = self.client.get(f"{url}/admin/spot/nodes/{node}", headers=self.headers)
            if response.status_code != 200:
                raise SpotAgentError(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
            total += int(response.json()["inflight"])
        return total

    def release(self, node: str) -> None:
        """Admit requests to the node again on every gateway."""
        for url in self.urls:
            self._post(f"{url}/admin/spot/release", {"node": node})


__all__ = ["GatewayAdmin"]
