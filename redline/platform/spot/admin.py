"""The gateways' `/admin/spot` API: the client the drain flow calls it with (drain a node: close
its admission and triage its requests; count what is still in flight on it; release it), and
`AdminAuth`, the bearer-token check that guards it and the spot agent's own `POST /notice`.

An admin API is secure by default: it takes a bearer token (from a file or the environment,
compared in constant time), or it is explicitly opened (logged as a warning at start-up), or it
refuses every request with 403 and says how to configure a token. It never opens by omission.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from redline.platform.spot.errors import SpotAgentError

AdminMode = Literal["token", "open", "closed"]


@dataclass(frozen=True)
class AdminRefusal:
    """An admin request refused: the HTTP status, the message and the error type."""

    status: int
    message: str
    kind: str

    @property
    def headers(self) -> dict[str, str]:
        """Headers of the answer (RFC 6750: a 401 names the Bearer scheme)."""
        return {"www-authenticate": "Bearer"} if self.status == 401 else {}


class AdminAuth:
    """The bearer-token check of one admin API: a token, explicitly open, or closed."""

    def __init__(self, service: str, token: str | None, open_: bool, how: str) -> None:
        if token is not None and open_:
            # Settings validation rejects this first; a token must never be silently ignored.
            raise ValueError(f"{service}: an admin token and admin_open are exclusive")
        if token is not None and not token:
            raise ValueError(f"{service}: the admin token is empty")
        self.service = service
        self.how = how
        self._token = None if token is None else token.encode()
        self.mode: AdminMode = "token" if token is not None else "open" if open_ else "closed"

    def check(self, authorization: str | None) -> AdminRefusal | None:
        """None when a request with this Authorization header may proceed; else the refusal."""
        if self.mode == "open":
            return None
        if self._token is None:
            return AdminRefusal(
                403,
                f"the {self.service} admin API is disabled: no admin token is configured. "
                f"{self.how}",
                "PermissionDeniedError",
            )
        scheme, _, presented = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return AdminRefusal(
                401,
                f"the {self.service} admin API requires a bearer token "
                "(header Authorization: Bearer <token>)",
                "AuthenticationError",
            )
        # Constant time: the comparison must not tell how much of a guess was right.
        if not hmac.compare_digest(presented.strip().encode(), self._token):
            return AdminRefusal(401, "wrong bearer token", "AuthenticationError")
        return None

    def announce(self, logger: logging.Logger) -> None:
        """Log how the admin API is guarded: a WARNING when it is open to anyone."""
        if self.mode == "open":
            logger.warning(
                "the %s admin API is OPEN (admin_open): anyone who can reach it may call it "
                "without a token; use this only on a trusted network or in tests",
                self.service,
            )
        elif self.mode == "closed":
            logger.info(
                "the %s admin API refuses every request (403): no admin token. %s",
                self.service,
                self.how,
            )
        else:
            logger.info("the %s admin API requires a bearer token", self.service)


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


__all__ = ["AdminAuth", "AdminMode", "AdminRefusal", "GatewayAdmin"]
