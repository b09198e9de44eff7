"""Who receives what, through a real Alertmanager running the generated config with human
receivers (`escalation:`): local servers stand in for the remediation webhook, Slack (incoming
webhook JSON), PagerDuty (Events API v2), a generic webhook and an SMTP smarthost.

- a playbook alert reaches the webhook AND its severity's humans (`continue: true`);
- alerts without a playbook (a critical red line, RemediationFailed, a ticket) reach humans only;
- a severity no human takes falls back to the webhook;
- every secret is read from a file (routing key, Slack URL, bearer token, SMTP password);
- and a failed playbook run, scraped and evaluated by a real Prometheus, pages within
  scrape + evaluation + group_wait + a margin.
"""

from __future__ import annotations

import base64
import json
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from redline.devstack.processes import Service, start_alertmanager, start_prometheus
from redline.rules.alertmanager import build_alertmanager_config
from redline.rules.build import build_rule_groups
from redline.rules.families import remediation
from redline.rules.model import AlertRule, format_duration
from redline.rules.promtool_cases import AlertIndex
from redline.rules.render import render_rule_file
from redline.slo import catalog
from redline.slo.load import apply_profile, load_spec
from redline.slo.spec import Escalation, Receiver, Spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WEBHOOK_TOKEN = "remediation-token-7f3a"
BOT_TOKEN = "bot-token-91c2"
ROUTING_KEY = "pd-routing-key-0123456789abcdef"
SMTP_USER, SMTP_PASSWORD = "redline", "smtp-pass-5e8d"
GROUP_WAIT = 0.2
SETTLE_SECONDS = 2.0
"""After the expected deliveries: time for any unexpected one to show up (>> group_wait)."""


@dataclass
class Delivery:
    """One request a stand-in received."""

    at: float
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Recorder:
    """A local HTTP server recording every POST; `reply` is what it answers."""

    name: str
    reply: tuple[int, dict[str, Any]] = (200, {"ok": True})
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """Base URL of the server."""
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def bodies(self) -> list[Any]:
        """The JSON bodies received so far."""
        with self.lock:
            return [d.body for d in self.deliveries]


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Serve `recorder` on a free loopback port for the duration of the block."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"null")
            with recorder.lock:
                recorder.deliveries.append(
                    Delivery(time.monotonic(), self.path, dict(self.headers.items()), body)
                )
            status, payload = recorder.reply
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Quiet: the test asserts on what was received."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recorder.server = server
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Mailbox:
    """Messages an SMTP stand-in accepted, with the AUTH PLAIN credentials it was given."""

    messages: list[str] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)
    server: socketserver.ThreadingTCPServer | None = None

    @property
    def smarthost(self) -> str:
        """host:port of the server."""
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"


@contextmanager
def smtp_server(mailbox: Mailbox) -> Iterator[Mailbox]:
    """A minimal SMTP server (EHLO, AUTH PLAIN, MAIL, RCPT, DATA, QUIT) on a free port."""

    class Handler(socketserver.StreamRequestHandler):
        def reply(self, line: str) -> None:
            self.wfile.write(line.encode() + b"\r\n")

        def handle(self) -> None:
            self.reply("220 stand-in ESMTP")
            while line := self.rfile.readline().decode().rstrip("\r\n"):
                verb = line.split(" ", 1)[0].upper()
                if verb == "EHLO":
                    self.reply("250-stand-in")
                    self.reply("250 AUTH PLAIN")
                elif verb == "AUTH":
                    _, user, password = base64.b64decode(line.split()[2]).decode().split("\0")
                    mailbox.logins.append((user, password))
                    ok = (user, password) == (SMTP_USER, SMTP_PASSWORD)
                    self.reply("235 ok" if ok else "535 bad credentials")
                elif verb == "DATA":
                    self.reply("354 go on")
                    lines = []
                    while (data := self.rfile.readline().decode()) not in (".\r\n", ""):
                        lines.append(data)
                    mailbox.messages.append("".join(lines))
                    self.reply("250 queued")
                elif verb == "QUIT":
                    self.reply("221 bye")
                    return
                else:  # MAIL, RCPT, RSET, NOOP
                    self.reply("250 ok")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    mailbox.server = server
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield mailbox
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class StandIns:
    """Every receiver the Alertmanager config names, as local servers."""

    webhook: Recorder
    slack: Recorder
    pagerduty: Recorder
    bot: Recorder
    mail: Mailbox


@pytest.fixture()
def stand_ins() -> Iterator[StandIns]:
    """The remediation webhook, Slack, PagerDuty, a generic webhook and SMTP, all local."""
    accepted = (202, {"status": "success", "message": "Event processed", "dedup_key": "k"})
    with (
        recording(Recorder("webhook")) as webhook,
        recording(Recorder("slack", reply=(200, {}))) as slack,
        recording(Recorder("pagerduty", reply=accepted)) as pagerduty,
        recording(Recorder("bot")) as bot,
        smtp_server(Mailbox()) as mail,
    ):
        yield StandIns(webhook, slack, pagerduty, bot, mail)


def _secret(tmp_path: Path, name: str, value: str, newline: str = "\n") -> str:
    path = tmp_path / "secrets" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(value + newline)
    return str(path)


def escalation_spec(base: Spec, tmp_path: Path, s: StandIns, group_wait: float) -> Spec:
    """`base` with the stand-ins as its receivers, every secret in a file; critical pages and
    goes to the bot, page pages, ticket goes to Slack and e-mail, warning to nobody."""
    escalation = Escalation.model_validate(
        {
            "receivers": [
                {
                    "name": "pager",
                    "pagerduty": {
                        "routing_key_file": _secret(tmp_path, "pd", ROUTING_KEY),
                        "url": f"{s.pagerduty.url}/v2/enqueue",
                    },
                },
                {
                    "name": "chat",
                    "slack": {
                        "api_url_file": _secret(tmp_path, "slack", f"{s.slack.url}/services/T/B/X"),
                        "channel": "#genai-oncall",
                    },
                },
                {
                    "name": "bot",
                    "webhook": {
                        "url": f"{s.bot.url}/hook",
                        "bearer_token_file": _secret(tmp_path, "bot", BOT_TOKEN),
                    },
                },
                {
                    "name": "mail",
                    "email": {
                        "to": "oncall@example.com",
                        "from": "redline@example.com",
                        "smarthost": s.mail.smarthost,
                        "auth_username": SMTP_USER,
                        # Alertmanager 0.25 sends this file verbatim: a trailing newline
                        # would be part of the password (the other files are trimmed).
                        "auth_password_file": _secret(tmp_path, "smtp", SMTP_PASSWORD, ""),
                        "require_tls": False,
                    },
                },
            ],
            "routes": {"critical": ["pager", "bot"], "page": ["pager"], "ticket": ["chat", "mail"]},
        }
    )
    receiver = Receiver(
        url=f"{s.webhook.url}/alerts",
        bearer_token_file=_secret(tmp_path, "webhook", WEBHOOK_TOKEN),
    )
    timing = base.timing.model_copy(
        update={
            "group_wait_seconds": group_wait,
            "group_interval_seconds": 1,
            "repeat_interval_seconds": 3600,
        }
    )
    return base.model_copy(
        update={"escalation": escalation, "receiver": receiver, "timing": timing}
    )


@contextmanager
def alertmanager(tmp_path: Path, spec: Spec) -> Iterator[Service]:
    """A real Alertmanager running the config generated from `spec`."""
    config = tmp_path / "alertmanager.yml"
    built = build_alertmanager_config(spec, build_rule_groups(spec))
    config.write_text(yaml.safe_dump(built, sort_keys=False))
    service = start_alertmanager(tmp_path / "am", config)
    try:
        yield service
    finally:
        service.stop()


def _alert(rule: AlertRule, **labels: str) -> dict[str, Any]:
    """The alert Prometheus would send for `rule` (its labels, plus the series' `labels`)."""
    starts = datetime.now(UTC) - timedelta(seconds=5)
    all_labels = {"alertname": rule.alert, **rule.labels, **labels}
    return {
        "labels": all_labels,
        "annotations": {
            "summary": f"{rule.alert} summary",
            "description": f"{rule.alert} description",
            "runbook_url": rule.annotations["runbook_url"],
        },
        "startsAt": starts.isoformat(),
        "endsAt": (starts + timedelta(hours=1)).isoformat(),
        "generatorURL": "http://127.0.0.1:9090/graph",
    }


def _names(body: Any) -> set[str]:
    """Alert names in one webhook (v4) or Slack body."""
    if "alerts" in body:
        return {a["labels"]["alertname"] for a in body["alerts"]}
    text = " ".join(a.get("text", "") for a in body.get("attachments", []))
    return {word.strip("*") for word in text.split() if word.startswith("*")}


def _received(recorder: Recorder) -> set[str]:
    return {name for body in recorder.bodies() for name in _names(body)}


def _paged(pagerduty: Recorder) -> set[str]:
    """Alert names PagerDuty got a trigger for (the description starts `[sev] Name: ...`)."""
    return {
        body["payload"]["summary"].split("] ", 1)[1].split(":", 1)[0]
        for body in pagerduty.bodies()
        if body["event_action"] == "trigger"
    }


def _mailed(mailbox: Mailbox) -> set[str]:
    return {
        name
        for message in mailbox.messages
        for name in ("AvailabilityErrorBudgetBurn", "EmbeddingDrift", "RedLineLatencyP99")
        if name in message
    }


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `check` until true; the seconds it took (fails the test after `timeout`)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def test_each_alert_reaches_exactly_its_receivers(tmp_path: Path, stand_ins: StandIns) -> None:
    s = stand_ins
    spec = escalation_spec(load_spec().spec, tmp_path, s, GROUP_WAIT)
    rules = AlertIndex(build_rule_groups(spec))
    posted = [
        # a red line with a playbook: the webhook acts, the pager and the bot are told
        _alert(rules.get("RedLineLatencyP99"), region="primary"),
        # a critical red line without a playbook: humans only
        _alert(rules.get("SessionRPOBreach"), stream="sessions", group="replica"),
        # a ticket: Slack and e-mail, nobody paged
        _alert(rules.get("AvailabilityErrorBudgetBurn", severity="ticket")),
        # remediation failed: the pager, never the webhook (it names no `playbook`)
        _alert(rules.get("RemediationFailed"), remediation_playbook="reroute"),
        # a warning no human takes: back to the webhook (audited)
        _alert(rules.get("EmbeddingDrift"), collection="documents", method="mmd"),
    ]
    with alertmanager(tmp_path, spec) as am:
        answer = httpx.post(f"{am.url}/api/v2/alerts", json=posted)
        assert answer.status_code == 200, answer.text
        expected = {
            "webhook": {"RedLineLatencyP99", "EmbeddingDrift"},
            "pagerduty": {"RedLineLatencyP99", "SessionRPOBreach", "RemediationFailed"},
            "bot": {"RedLineLatencyP99", "SessionRPOBreach"},
            "slack": {"AvailabilityErrorBudgetBurn"},
            "mail": {"AvailabilityErrorBudgetBurn"},
        }

        def got() -> dict[str, set[str]]:
            return {
                "webhook": _received(s.webhook),
                "pagerduty": _paged(s.pagerduty),
                "bot": _received(s.bot),
                "slack": _received(s.slack),
                "mail": _mailed(s.mail),
            }

        try:
            wait_for(lambda: got() == expected, 20, "every expected delivery")
        finally:
            time.sleep(SETTLE_SECONDS)  # nothing else arrives
            assert got() == expected

    # The webhooks got Alertmanager's v4 JSON with the bearer token read from its file.
    assert {d.headers["Authorization"] for d in s.webhook.deliveries} == {f"Bearer {WEBHOOK_TOKEN}"}
    assert {d.headers["Authorization"] for d in s.bot.deliveries} == {f"Bearer {BOT_TOKEN}"}
    assert all(body["version"] == "4" for body in s.webhook.bodies() + s.bot.bodies())
    # PagerDuty: Events API v2 with the routing key from its file, severity mapped.
    events = {b["payload"]["summary"].split(":")[0]: b for b in s.pagerduty.bodies()}
    assert {d.path for d in s.pagerduty.deliveries} == {"/v2/enqueue"}
    assert {b["routing_key"] for b in events.values()} == {ROUTING_KEY}
    assert events["[critical] RedLineLatencyP99"]["payload"]["severity"] == "critical"
    assert events["[page] RemediationFailed"]["payload"]["severity"] == "error"
    latency_details = events["[critical] RedLineLatencyP99"]["payload"]["custom_details"]
    assert latency_details["playbook"] == "reroute"
    assert latency_details["runbook_url"].endswith("/RedLineLatencyP99")
    # Slack: the incoming-webhook URL from its file, the channel, summary and runbook in the text.
    (slack,) = s.slack.deliveries
    assert slack.path == "/services/T/B/X"
    assert slack.body["channel"] == "#genai-oncall"
    (attachment,) = slack.body["attachments"]
    assert "AvailabilityErrorBudgetBurn summary" in attachment["text"]
    assert "/AvailabilityErrorBudgetBurn" in attachment["text"]
    # E-mail: one message, after AUTH PLAIN with the password from its file.
    assert s.mail.logins and set(s.mail.logins) == {(SMTP_USER, SMTP_PASSWORD)}
    assert len(s.mail.messages) == 1 and "To: oncall@example.com" in s.mail.messages[0]


def _prometheus_config(spec: Spec, rule_file: Path, metrics: str, alertmanager_url: str) -> str:
    timing = spec.timing
    config = {
        "global": {
            "scrape_interval": format_duration(timing.scrape_interval_seconds),
            "scrape_timeout": format_duration(timing.scrape_interval_seconds),
            "evaluation_interval": format_duration(timing.evaluation_interval_seconds),
        },
        "rule_files": [str(rule_file)],
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [alertmanager_url.removeprefix("http://")]}]}
            ]
        },
        "scrape_configs": [
            {"job_name": spec.receiver.scrape_job, "static_configs": [{"targets": [metrics]}]}
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


@dataclass
class ReceiverMetrics:
    """The remediation receiver's exposition, as far as the escalation rules read it."""

    failed: int = 0
    server: ThreadingHTTPServer | None = None

    def text(self) -> str:
        """Prometheus text format."""
        runs, alerts = catalog.REDLINE_REMEDIATION_RUNS_TOTAL, catalog.REDLINE_WEBHOOK_ALERTS_TOTAL
        return (
            f"# TYPE {alerts.family} counter\n"
            f'{alerts}{{status="firing"}} 0\n'
            f"# TYPE {runs.family} counter\n"
            f'{runs}{{playbook="reroute",outcome="failed"}} {self.failed}\n'
            f'{runs}{{playbook="reroute",outcome="succeeded"}} 3\n'
        )


@contextmanager
def serving_metrics(metrics: ReceiverMetrics) -> Iterator[str]:
    """Serve `metrics` at /metrics; yields host:port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            data = metrics.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    metrics.server = server
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host, port = server.server_address[:2]
        yield f"{host!s}:{port}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_failed_playbook_run_pages_a_human_within_the_pipeline_budget(
    tmp_path: Path, stand_ins: StandIns
) -> None:
    """Receiver metrics -> Prometheus (local profile: 1 s scrape and evaluation) ->
    RemediationFailed -> Alertmanager (group_wait 1 s) -> PagerDuty, never the webhook."""
    s = stand_ins
    local = apply_profile(load_spec().spec, "local")
    # Prometheus applies new scrape targets every 5 s: the local profile's 5 s absent_for could
    # page ReceiverDown before the first scrape. Not what this test measures.
    local = local.model_copy(
        update={"timing": local.timing.model_copy(update={"absent_for_seconds": 60})}
    )
    spec = escalation_spec(local, tmp_path, s, local.timing.group_wait_seconds)
    timing = spec.timing
    rule_file = tmp_path / "escalation.rules.yml"
    rule_file.write_text(render_rule_file(remediation.build_rules(spec), "test"))
    metrics = ReceiverMetrics()
    with (
        serving_metrics(metrics) as target,
        alertmanager(tmp_path, spec) as am,
    ):
        config = tmp_path / "prometheus.yml"
        config.write_text(_prometheus_config(spec, rule_file, target, am.url))
        prometheus = start_prometheus(tmp_path / "prom", config)
        try:
            runs = catalog.REDLINE_REMEDIATION_RUNS_TOTAL

            def scraped_twice() -> bool:
                answer = httpx.get(
                    f"{prometheus.url}/api/v1/query",
                    params={"query": f'count_over_time({runs}{{outcome="failed"}}[1m])'},
                ).json()
                found = answer["data"]["result"]
                return bool(found) and float(found[0]["value"][1]) >= 2

            wait_for(scraped_twice, 30, "two scrapes of the receiver's counters")
            metrics.failed = 1  # a reroute job just ended failed
            budget = (
                timing.scrape_interval_seconds
                + timing.evaluation_interval_seconds
                + timing.group_wait_seconds
            )
            margin = 5.0
            took = wait_for(
                lambda: "RemediationFailed" in _paged(s.pagerduty),
                budget + margin,
                "the pager to get RemediationFailed",
            )
            print(
                f"failed run -> PagerDuty trigger: {took:.2f} s (scrape "
                f"{timing.scrape_interval_seconds:g} + evaluation "
                f"{timing.evaluation_interval_seconds:g} + group_wait "
                f"{timing.group_wait_seconds:g} = {budget:g} s, margin {margin:g} s)"
            )
            assert took <= budget + margin
            (event,) = [
                b for b in s.pagerduty.bodies() if "RemediationFailed" in b["payload"]["summary"]
            ]
            assert (
                event["payload"]["summary"] == "[page] RemediationFailed: Playbook reroute failed"
            )
            time.sleep(SETTLE_SECONDS)
            assert _received(s.webhook) == set()  # the receiver is not asked to fix its failure
            assert _paged(s.pagerduty) == {"RemediationFailed"}  # ReceiverDown stays silent
        finally:
            prometheus.stop()
