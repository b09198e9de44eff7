"""Node records in Redis, one hash per node (`<prefix>:node:<node>`), and each node's latest
interruption notice (`<prefix>:notice:<node>`): the agent of a replacement, a restarted agent or
the `spot_drain` playbook continues where the last one stopped."""

from __future__ import annotations

import redis

from redline.core.redisconn import open_redis
from redline.platform.spot.errors import SpotError
from redline.platform.spot.state import NodeRecord, Notice

DEFAULT_STATE_PREFIX = "redline:spot"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class SpotStateStore:
    """Node records in Redis: one hash per node."""

    def __init__(self, client: redis.Redis, prefix: str = DEFAULT_STATE_PREFIX) -> None:
        self.client = client
        self.prefix = prefix

    @classmethod
    def from_url(cls, url: str, prefix: str = DEFAULT_STATE_PREFIX) -> SpotStateStore:
        """A store on its own connection pool; `close()` it."""
        return cls(open_redis(url, socket_timeout=2.0, socket_connect_timeout=2.0), prefix)

    def key(self, node: str) -> str:
        """The node's Redis key."""
        return f"{self.prefix}:node:{node}"

    def get(self, node: str) -> NodeRecord:
        """The node's record (READY when it has none)."""
        raw = self.client.hgetall(self.key(node))
        if not raw:
            return NodeRecord(node)
        assert isinstance(raw, dict)
        decoded = {_text(k): _text(v) for k, v in raw.items()}
        return NodeRecord.from_fields(node, decoded)

    def put(self, record: NodeRecord) -> None:
        """Replace the node's record."""
        key = self.key(record.node)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)
        pipe.hset(key, mapping=record.to_fields())  # type: ignore[arg-type]
        pipe.execute()

    def put_notice(self, notice: Notice) -> None:
        """Remember the node's latest interruption notice (the playbook drains from it)."""
        fields = {
            "provider": notice.provider,
            "kind": notice.kind,
            "action": notice.action,
            "noticed_at": repr(notice.noticed_at),
            "detected_at": repr(notice.detected_at),
            "detail": notice.detail,
        }
        if notice.terminate_at is not None:
            fields["terminate_at"] = repr(notice.terminate_at)
        key = f"{self.prefix}:notice:{notice.node}"
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)
        pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
        pipe.execute()

    def get_notice(self, node: str) -> Notice | None:
        """The node's latest interruption notice, or None."""
        raw = self.client.hgetall(f"{self.prefix}:notice:{node}")
        if not raw:
            return None
        assert isinstance(raw, dict)
        data = {_text(k): _text(v) for k, v in raw.items()}
        try:
            kind = data["kind"]
            if kind not in ("interruption", "rebalance"):
                raise ValueError(f"kind {kind!r}")
            terminate = data.get("terminate_at")
            return Notice(
                node=node,
                provider=data["provider"],
                kind="interruption" if kind == "interruption" else "rebalance",
                action=data["action"],
                noticed_at=float(data["noticed_at"]),
                detected_at=float(data["detected_at"]),
                terminate_at=None if terminate is None else float(terminate),
                detail=data.get("detail", ""),
            )
        except (KeyError, ValueError) as exc:
            raise SpotError(f"node {node}: unreadable notice: {exc!r}") from None

    def notice_pending(self, node: str) -> Notice | None:
        """The node's latest interruption notice when no drain has handled it yet."""
        notice = self.get_notice(node)
        if notice is None or notice.kind != "interruption":
            return None
        record = self.get(node)
        handled = record.draining_at is not None and record.draining_at >= notice.detected_at
        return None if handled else notice

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()


__all__ = ["DEFAULT_STATE_PREFIX", "SpotStateStore"]
