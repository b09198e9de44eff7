"""The Alertmanager webhook payload (version 4), every field, and the idempotency key of an alert.

Alertmanager (notify/webhook) posts `{version, groupKey, truncatedAlerts, status, receiver,
groupLabels, commonLabels, commonAnnotations, externalURL, alerts[]}`; each alert carries
`{status, labels, annotations, startsAt, endsAt, generatorURL, fingerprint}`. Timestamps are
RFC 3339 with up to nanosecond precision; `endsAt` of a firing alert is `0001-01-01T00:00:00Z`.

Unknown fields are ignored (newer Alertmanagers and compatible senders add some), but every
documented field is typed and bounded, and `version` must be "4": a payload of another shape is
rejected with 422 rather than half-understood.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

MAX_ALERTS = 1000
"""Alerts per payload (Alertmanager's `max_alerts` is unbounded by default; the body limit too)."""

LabelName = Annotated[str, StringConstraints(min_length=1, max_length=256)]
LabelValue = Annotated[str, StringConstraints(max_length=8192)]
LabelSet = Annotated[dict[LabelName, LabelValue], Field(max_length=256)]

PLAYBOOK_LABEL = "playbook"
"""The alert label naming the playbook to run; alerts without it are acknowledged only."""

DRY_RUN_KEY = "dry_run"
"""A label or annotation `dry_run: "true"` asks for the plan only, whatever the settings say."""


def _integral(value: object) -> object:
    # JSON has one number type: 2.0 is the integer 2 (as JSON Schema says), 2.5 is not.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})$"
)


def _rfc3339(value: object) -> object:
    # pydantic alone would also read "0" or "1700000000" as Unix times; Alertmanager sends
    # RFC 3339 with up to nanoseconds, which datetime holds to the microsecond.
    if not isinstance(value, str):
        return value
    match = _RFC3339.match(value)
    if match is None:
        raise ValueError("must be an RFC 3339 timestamp such as 2024-01-01T00:00:00Z")
    whole, fraction, zone = match.groups()
    micros = f".{(fraction or '')[:6]:0<6}"
    offset = "+00:00" if zone in ("Z", "z") else zone
    return datetime.fromisoformat(whole.replace("t", "T") + micros + offset)


Timestamp = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, strict=True)


class Alert(_Model):
    """One alert of a notification."""

    status: Literal["firing", "resolved"] = Field(description="firing or resolved.")
    labels: LabelSet = Field(description="Identifying labels; `playbook` selects the playbook.")
    annotations: LabelSet = Field(default_factory=dict, description="summary, description, ...")
    starts_at: Timestamp = Field(alias="startsAt", description="When the alert started.")
    ends_at: Timestamp = Field(
        alias="endsAt", description="When it ended; 0001-01-01T00:00:00Z while firing."
    )
    generator_url: Annotated[str, StringConstraints(max_length=8192)] = Field(
        "", alias="generatorURL", description="Back-link to the rule that produced it."
    )
    fingerprint: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8,64}$")] = Field(
        description="Alertmanager's hash of the label set (hex)."
    )

    @property
    def playbook(self) -> str | None:
        """The playbook label, if the alert names one."""
        value = self.labels.get(PLAYBOOK_LABEL, "").strip()
        return value or None

    @property
    def dry_run_requested(self) -> bool:
        """True when a `dry_run` label or annotation is set to a true value."""
        raw = self.labels.get(DRY_RUN_KEY) or self.annotations.get(DRY_RUN_KEY) or ""
        return raw.strip().lower() in {"1", "true", "yes", "on"}


class WebhookPayload(_Model):
    """Alertmanager's webhook notification, payload version 4."""

    version: Literal["4"] = Field(description='Payload version; only "4" is understood.')
    group_key: Annotated[str, StringConstraints(max_length=8192)] = Field(
        alias="groupKey", description="Identifies the alert group (route + group labels)."
    )
    truncated_alerts: Annotated[int, BeforeValidator(_integral)] = Field(
        0, ge=0, alias="truncatedAlerts", description="Alerts left out because of max_alerts."
    )
    status: Literal["firing", "resolved"] = Field(description="firing if any alert fires.")
    receiver: Annotated[str, StringConstraints(max_length=1024)] = Field(
        description="Name of the Alertmanager receiver that sent this."
    )
    group_labels: LabelSet = Field(alias="groupLabels", description="Labels the group is by.")
    common_labels: LabelSet = Field(
        alias="commonLabels", description="Labels every alert of the group shares."
    )
    common_annotations: LabelSet = Field(
        alias="commonAnnotations", description="Annotations every alert shares."
    )
    external_url: Annotated[str, StringConstraints(max_length=8192)] = Field(
        alias="externalURL", description="Back-link to the Alertmanager."
    )
    alerts: list[Alert] = Field(max_length=MAX_ALERTS, description="The alerts of the group.")


def utc_iso(moment: datetime) -> str:
    """`moment` in UTC as ISO 8601; at the ends of the calendar, where UTC overflows, as given."""
    try:
        return moment.astimezone(UTC).isoformat()
    except OverflowError:
        return moment.isoformat()


def idempotency_key(alert: Alert) -> str:
    """The alert's identity for exactly-once effect: hash of fingerprint, startsAt, status.

    HA Alertmanagers and retries send the same three values, so they map to the same key; the
    resolution of an alert has its own key, so it runs the playbook's resolve step once.
    """
    raw = f"{alert.fingerprint}|{utc_iso(alert.starts_at)}|{alert.status}"
    return hashlib.sha256(raw.encode()).hexdigest()


def job_id_for(alert: Alert, status: Literal["firing", "resolved"] | None = None) -> str:
    """The job id of `alert` (or of its `status` twin): derived from the idempotency key."""
    if status is not None and status != alert.status:
        alert = alert.model_copy(update={"status": status})
    return idempotency_key(alert)[:32]
