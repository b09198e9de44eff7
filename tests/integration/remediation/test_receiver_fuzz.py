"""Fuzzing `POST /alerts` with a real redis-server behind it.

Bulk (> 10 000 requests): Hypothesis drives the ASGI app in-process with valid payloads (the
test's own oracle predicts accepted / duplicate / acknowledged per alert and the jobs created),
payloads broken by one known mutation, arbitrary JSON, arbitrary bytes and random headers. Every
answer must be < 500, and every request that is not a valid payload must leave the job store
untouched. Then a smaller sample goes over real HTTP (uvicorn) from Schemathesis, which
generates positive and negative cases from the app's own OpenAPI schema and runs its checks.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
import redis
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import negative_data_rejection

from redline.remediation.app import build_receiver_app
from redline.remediation.jobs import JobStore
from redline.remediation.settings import RemediationSettings
from tests.support.remediation import AUTH, TOKEN, make_settings, receiver, store_for

pytestmark = pytest.mark.slow

FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def fuzz(examples: int) -> settings:
    """The fuzz settings with `examples` examples."""
    return settings(FUZZ, max_examples=examples)


JSON = {**AUTH, "Content-Type": "application/json"}
FINGERPRINT = re.compile(r"^[0-9a-f]{8,64}$")
POOL = [f"{i:016x}" for i in range(1, 9)]  # a small pool, so duplicates happen often
LATIN_1 = st.characters(max_codepoint=255)  # what an HTTP header value can carry
STATUSES = ("firing", "resolved")
ZONES = [UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-9, minutes=-30))]


class InProcess:
    """The app's lifespan and an httpx client on ASGITransport, on one private event loop."""

    def __init__(self, app: FastAPI) -> None:
        self.loop = asyncio.new_event_loop()
        self.stack = AsyncExitStack()
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://receiver"
        )
        self.loop.run_until_complete(
            self.stack.enter_async_context(app.router.lifespan_context(app))
        )
        self.loop.run_until_complete(self.stack.enter_async_context(self.client))

    def post(self, body: bytes, headers: dict[str, str] | dict[str, bytes]) -> httpx.Response:
        """POST /alerts."""
        return self.loop.run_until_complete(
            self.client.post("/alerts", content=body, headers=headers)
        )

    def close(self) -> None:
        """Leave the lifespan, close the loop."""
        self.loop.run_until_complete(self.stack.aclose())
        self.loop.close()


@pytest.fixture()
def fuzz_settings(redis_url: str) -> RemediationSettings:
    """Receiver settings for the fuzz runs."""
    return make_settings(redis_url, max_body_bytes=64 * 1024)


@pytest.fixture()
def store(fuzz_settings: RemediationSettings) -> Iterator[tuple[JobStore, redis.Redis]]:
    """A synchronous view of the store."""
    job_store, client = store_for(fuzz_settings)
    yield job_store, client
    client.close()


@pytest.fixture()
def app(fuzz_settings: RemediationSettings) -> Iterator[InProcess]:
    """The receiver app running in-process."""
    running = InProcess(build_receiver_app(fuzz_settings, token=SecretStr(TOKEN)))
    yield running
    running.close()


# --- strategies -----------------------------------------------------------------------------

# Mostly cheap sampled values, sometimes arbitrary text: generation speed decides how many
# requests fit in the time budget.
NAMES = ["alertname", "region", "collection", "model", "severity", "summary", "x"]
label_names = st.sampled_from(NAMES) | st.text(min_size=1, max_size=8)
label_values = st.sampled_from(["", "primary", "critical", "é✓", "a b"]) | st.text(max_size=10)
label_sets = st.dictionaries(label_names, label_values, max_size=3)
fingerprints = st.sampled_from(POOL) | st.binary(min_size=4, max_size=32).map(bytes.hex)


@st.composite
def timestamps(draw: st.DrawFn) -> tuple[str, datetime]:
    """An RFC 3339 timestamp as Alertmanager could write it, and the instant it means."""
    seconds = draw(st.integers(min_value=0, max_value=4_102_444_800))  # 1970 .. 2100
    micros = draw(st.sampled_from([0, 1, 500_000, 999_999]) | st.integers(0, 999_999))
    zone = draw(st.sampled_from(ZONES))
    moment = datetime.fromtimestamp(seconds, UTC).replace(microsecond=micros).astimezone(zone)
    style = draw(st.integers(0, 3))
    if style == 0:
        moment = moment.replace(microsecond=0)  # what "seconds" precision leaves of it
        text = moment.isoformat(timespec="seconds")
    else:
        text = moment.isoformat(timespec="microseconds")
        if style == 2:
            text = text[:26] + "789" + text[26:]  # nanoseconds, truncated on read
    if style == 3 and zone is UTC:
        text = text.replace("+00:00", "Z")
    return text, moment


@st.composite
def valid_alerts(draw: st.DrawFn) -> tuple[dict[str, Any], tuple[str, datetime, str], bool]:
    """A valid alert, its identity (fingerprint, instant, status), whether it names a playbook."""
    labels = draw(label_sets)
    playbook = draw(st.sampled_from([None, "counter", "no_such_playbook", "", "  "]))
    if playbook is None:
        labels.pop("playbook", None)
    else:
        labels["playbook"] = playbook
    status = draw(st.sampled_from(["firing", "resolved"]))
    start_text, start = draw(timestamps())
    fingerprint = draw(fingerprints)
    alert = {
        "status": status,
        "labels": labels,
        "annotations": draw(label_sets),
        "startsAt": start_text,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else draw(timestamps())[0],
        "generatorURL": draw(st.sampled_from(["", "http://prometheus:9090/graph"])),
        "fingerprint": fingerprint,
    }
    instant = start.astimezone(UTC).replace(tzinfo=None)
    return alert, (fingerprint, instant, status), bool((playbook or "").strip())


@st.composite
def valid_payloads(draw: st.DrawFn) -> tuple[dict[str, Any], list[Any]]:
    """A valid v4 payload and, per alert, (identity, names a playbook)."""
    alerts = draw(st.lists(valid_alerts(), max_size=4))
    body = {
        "version": "4",
        "groupKey": draw(st.sampled_from(['{}:{alertname="A"}', ""]) | st.text(max_size=20)),
        "truncatedAlerts": draw(st.integers(min_value=0, max_value=2**40)),
        "status": draw(st.sampled_from(["firing", "resolved"])),
        "receiver": draw(st.sampled_from(["redline-remediation", ""])),
        "groupLabels": draw(label_sets),
        "commonLabels": draw(label_sets),
        "commonAnnotations": draw(label_sets),
        "externalURL": draw(st.sampled_from(["http://alertmanager:9093", ""])),
        "alerts": [alert for alert, _, _ in alerts],
    }
    return body, [(identity, named) for _, identity, named in alerts]


not_str = st.none() | st.booleans() | st.integers() | st.floats() | st.lists(st.text(), max_size=2)
not_map = st.none() | st.booleans() | st.integers() | st.text() | st.lists(st.integers())
bad_map = st.dictionaries(label_names, st.none() | st.integers() | st.lists(st.text()), min_size=1)


def _mutations() -> list[tuple[str, Callable[[dict[str, Any], st.DataObject], None]]]:
    """Each breaks a valid payload (with at least one alert) in one known way."""

    def drop(key: str) -> Callable[[dict[str, Any], st.DataObject], None]:
        return lambda body, data: body.pop(key)

    def drop_alert(key: str) -> Callable[[dict[str, Any], st.DataObject], None]:
        return lambda body, data: body["alerts"][-1].pop(key)

    def setter(key: str, values: st.SearchStrategy[Any]) -> Callable[..., None]:
        return lambda body, data: body.__setitem__(key, data.draw(values))

    def alert_setter(key: str, values: st.SearchStrategy[Any]) -> Callable[..., None]:
        return lambda body, data: body["alerts"][-1].__setitem__(key, data.draw(values))

    bad_time = (
        st.text(max_size=30).filter(lambda t: not re.match(r"^\d{4}-\d\d-\d\d[T ]", t))
        | st.just("2024-05-01T12:00:00")  # no offset: not an instant
        | st.integers()
        | st.none()
    )
    required = ["version", "groupKey", "status", "receiver", "groupLabels", "commonLabels"]
    required += ["commonAnnotations", "externalURL", "alerts"]
    mutations: list[tuple[str, Callable[[dict[str, Any], st.DataObject], None]]] = []
    mutations += [(f"drop {k}", drop(k)) for k in required]
    mutations += [
        (f"drop alert {k}", drop_alert(k))
        for k in ("status", "labels", "startsAt", "endsAt", "fingerprint")
    ]
    mutations += [
        ("version", setter("version", st.text().filter(lambda v: v != "4") | not_str)),
        ("status", setter("status", st.text().filter(lambda v: v not in STATUSES))),
        ("groupKey", setter("groupKey", not_str)),
        ("receiver", setter("receiver", not_str)),
        ("externalURL", setter("externalURL", not_str)),
        ("groupLabels", setter("groupLabels", not_map | bad_map)),
        ("commonLabels", setter("commonLabels", not_map | bad_map)),
        ("commonAnnotations", setter("commonAnnotations", not_map | bad_map)),
        (
            "truncatedAlerts",
            setter(
                "truncatedAlerts",
                st.integers(max_value=-1)
                | st.floats().filter(lambda f: not f.is_integer())
                | st.text()
                | st.booleans(),
            ),
        ),
        ("alerts", setter("alerts", not_map.filter(lambda v: not isinstance(v, list)))),
        ("alert item", lambda body, data: body["alerts"].append(data.draw(not_map))),
        ("alert status", alert_setter("status", st.text().filter(lambda v: v not in STATUSES))),
        ("alert labels", alert_setter("labels", not_map | bad_map)),
        ("alert empty label name", alert_setter("labels", st.just({"": "x"}))),
        ("alert annotations", alert_setter("annotations", not_map | bad_map)),
        ("alert startsAt", alert_setter("startsAt", bad_time)),
        ("alert endsAt", alert_setter("endsAt", bad_time)),
        (
            "alert fingerprint",
            alert_setter(
                "fingerprint", st.text().filter(lambda v: not FINGERPRINT.match(v)) | not_str
            ),
        ),
        ("alert generatorURL", alert_setter("generatorURL", not_str)),
    ]  # fmt: skip
    return mutations


MUTATIONS = _mutations()
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=16,
)
PAYLOAD_KEYS = (
    "version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels",
    "commonLabels", "commonAnnotations", "externalURL", "alerts",
)  # fmt: skip
near_payloads = st.fixed_dictionaries({}, optional=dict.fromkeys(PAYLOAD_KEYS, json_values))


# --- the bulk, in-process -------------------------------------------------------------------


def test_fuzz_alerts_in_process_no_5xx_and_no_job_from_invalid_input(
    app: InProcess, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, client = store
    seen: set[tuple[str, datetime, str]] = set()
    counts: Counter[str] = Counter()
    expected_jobs = 0

    def jobs() -> int:
        return int(client.zcard(job_store.keys.index))

    def assert_rejected(response: httpx.Response, before: int, kind: str) -> None:
        assert response.status_code < 500, (kind, response.status_code, response.text)
        assert 400 <= response.status_code < 500, (kind, response.status_code, response.text)
        assert jobs() == before, f"{kind}: a rejected request created a job"
        counts[kind] += 1

    @fuzz(1000)
    @given(valid_payloads())
    def valid(case: tuple[dict[str, Any], list[Any]]) -> None:
        nonlocal expected_jobs
        body, alerts = case
        expected: list[str] = []
        for identity, named in alerts:
            if identity in seen:
                expected.append("duplicate")
            else:
                seen.add(identity)
                expected.append("accepted" if named else "acknowledged")
        before = jobs()
        response = app.post(json.dumps(body).encode(), JSON)
        assert response.status_code == (202 if "accepted" in expected else 200), response.text
        assert [a["result"] for a in response.json()["alerts"]] == expected
        expected_jobs += expected.count("accepted")
        assert jobs() == before + expected.count("accepted")
        counts["valid"] += 1

    @fuzz(1000)
    @given(valid_payloads(), st.data())
    def mutated(case: tuple[dict[str, Any], list[Any]], data: st.DataObject) -> None:
        base, _ = case
        if not base["alerts"]:
            base["alerts"].append(data.draw(valid_alerts())[0])
        # Four different breakages of the same generated payload, one request each.
        chosen = data.draw(
            st.lists(st.sampled_from(MUTATIONS), min_size=4, max_size=4, unique_by=lambda m: m[0])
        )
        for name, mutate in chosen:
            body = copy.deepcopy(base)
            mutate(body, data)
            before = jobs()
            response = app.post(json.dumps(body).encode(), JSON)
            assert response.status_code == 422, (name, response.status_code, response.text)
            assert response.json()["message"].startswith("invalid Alertmanager webhook payload")
            assert_rejected(response, before, "mutated")

    @fuzz(1000)
    @given(json_values | near_payloads)
    def arbitrary_json(value: Any) -> None:
        before = jobs()
        assert_rejected(app.post(json.dumps(value).encode(), JSON), before, "json")

    @fuzz(3000)
    @given(st.binary(max_size=512))
    def arbitrary_bytes(raw: bytes) -> None:
        before = jobs()
        assert_rejected(app.post(raw, JSON), before, "bytes")

    @fuzz(1300)
    @given(
        fingerprints,
        st.one_of(st.none(), st.just(f"Bearer {TOKEN}"), st.text(LATIN_1, max_size=40)),
        st.one_of(
            st.none(),
            st.sampled_from(["application/json", "application/json; charset=utf-8", "TEXT/JSON"]),
            st.text(LATIN_1, max_size=30),
        ),
    )  # fmt: skip
    def headers(fingerprint: str, auth: str | None, content_type: str | None) -> None:
        nonlocal expected_jobs
        try:
            sent = {
                name: value.encode("latin-1")
                for name, value in (("Authorization", auth), ("Content-Type", content_type))
                if value is not None
            }
        except UnicodeEncodeError:
            return  # not sendable as an HTTP header
        body = {
            "version": "4", "groupKey": "", "status": "firing", "receiver": "",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "",
            "alerts": [{"status": "firing", "labels": {"playbook": "counter"},
                        "startsAt": "2024-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                        "fingerprint": fingerprint}],
        }  # fmt: skip
        authorized = auth == f"Bearer {TOKEN}"
        media = (content_type or "").split(";", 1)[0].strip().lower()
        before = jobs()
        response = app.post(json.dumps(body).encode(), sent)
        counts["headers"] += 1
        if not authorized:
            assert response.status_code == 401
        elif media != "application/json":
            assert response.status_code == 415
        else:
            assert response.status_code in (200, 202)
            expected_jobs += response.json()["accepted"]
            return
        assert jobs() == before

    valid()
    mutated()
    arbitrary_json()
    arbitrary_bytes()
    headers()
    total = sum(counts.values())
    assert total >= 10_000, counts
    assert jobs() == expected_jobs
    assert set(counts) == {"valid", "mutated", "json", "bytes", "headers"}, counts


def test_extreme_timestamps_are_handled(app: InProcess) -> None:
    body = {
        "version": "4", "groupKey": "", "status": "firing", "receiver": "", "groupLabels": {},
        "commonLabels": {}, "commonAnnotations": {}, "externalURL": "",
        "alerts": [
            {"status": "firing", "labels": {"playbook": "counter"}, "fingerprint": "ab" * 8,
             "startsAt": "0001-01-01T00:00:00+14:00", "endsAt": "9999-12-31T23:59:59-12:00"},
            {"status": "resolved", "labels": {}, "fingerprint": "cd" * 8,
             "startsAt": "9999-12-31T23:59:59.999999999-12:00", "endsAt": "0001-01-01T00:00:00Z"},
        ],
    }  # fmt: skip
    response = app.post(json.dumps(body).encode(), JSON)
    assert response.status_code == 202, response.text
    assert [a["result"] for a in response.json()["alerts"]] == ["accepted", "acknowledged"]


# --- a sample over real HTTP, generated by Schemathesis from the OpenAPI schema -----------


def test_schemathesis_over_real_http(
    fuzz_settings: RemediationSettings, store: tuple[JobStore, redis.Redis]
) -> None:
    job_store, client = store
    with receiver(fuzz_settings) as server:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
        # 413 (body over the limit) is a rejection too.
        rejection = schema.config.checks.negative_data_rejection
        rejection.expected_statuses = [*rejection.expected_statuses, "413"]
        alerts = schema["/alerts"]["POST"]
        counts: Counter[str] = Counter()

        @fuzz(90)
        @given(alerts.as_strategy(GenerationMode.NEGATIVE))
        def negative(case: schemathesis.Case) -> None:
            before = client.zcard(job_store.keys.index)
            # Our token replaces any generated Authorization; the checks judge the rest.
            response = case.call_and_validate(base_url=server.url, headers=AUTH)
            assert response.status_code < 500, response.text
            body = case.meta.components.get(ParameterLocation.BODY) if case.meta else None
            if body is not None and body.mode is GenerationMode.NEGATIVE:
                assert 400 <= response.status_code < 500, response.text
                assert client.zcard(job_store.keys.index) == before, "job from invalid payload"
                counts["negative body"] += 1
            counts["negative"] += 1

        @fuzz(90)
        @given(alerts.as_strategy(GenerationMode.POSITIVE))
        def positive(case: schemathesis.Case) -> None:
            response = case.call_and_validate(base_url=server.url, headers=AUTH)
            assert response.status_code in (200, 202), response.text
            counts["positive"] += 1

        @fuzz(40)
        @given(
            schema["/jobs"]["GET"].as_strategy(GenerationMode.POSITIVE)
            | schema["/jobs"]["GET"].as_strategy(GenerationMode.NEGATIVE)
            | schema["/jobs/{job_id}"]["GET"].as_strategy(GenerationMode.NEGATIVE)
        )
        def jobs_api(case: schemathesis.Case) -> None:
            # A one-element array in the query serializes exactly like the string it holds,
            # so "negative" query cases are not always negative on the wire: only the other
            # checks (no 5xx, status and response conformance) apply here.
            response = case.call_and_validate(
                base_url=server.url, headers=AUTH, excluded_checks=[negative_data_rejection]
            )
            assert response.status_code < 500
            counts["jobs"] += 1

        negative()
        positive()
        jobs_api()
    assert counts["positive"] >= 80 and counts["negative"] >= 80, counts
    assert counts["negative body"] >= 20, counts
