"""Webhook ingestion: alerts/s the receiver accepts (202, durably enqueued) vs a bare endpoint.

Starts one real redis-server (AOF, fsync every second), then, one after the other on loopback:
`redline remediation --workers 0` (the real receiver: bearer check, body limit, v4 validation,
the jobs and their audit records written by one Lua script per group commit) and a bare FastAPI
app whose `POST /alerts` reads the body and answers 202, the ceiling. The same load hits both:
`--clients` keep-alive connections (50) posting Alertmanager payloads with fresh fingerprints,
from an asyncio client on raw sockets (light enough not to be the bottleneck). Rounds alternate
so both see the same machine. Prints requests/s, alerts/s, p50/p99 latency, server CPU per
request (measured window only) and the ratio to the ceiling, checks that every accepted alert
is a job in the Redis stream. Target: >= 2000 alerts/s and >= 0.4 x the ceiling.

Run: `.venv/bin/python -m bench.ingest [--seconds S] [--clients N] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench.figures import Figure, at_least, check, exit_code, info
from redline.devstack.processes import Service, free_port, http_ok, start_redis, start_service

TARGET_ALERTS_PER_SECOND = 2000
TARGET_RATIO = 0.4
TOKEN = "bench-webhook-token"
PREFIX = "redline:remediation"

BARE_APP = """
import sys
import uvicorn
from fastapi import FastAPI, Request, Response

app = FastAPI()

@app.post("/alerts")
async def alerts(request: Request) -> Response:
    await request.body()
    return Response(status_code=202)

@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


@dataclass
class Result:
    """One round against one server."""

    name: str
    alerts_per_request: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    cpu_seconds: float | None = None

    @property
    def requests(self) -> int:
        """Requests answered in the measured window."""
        return len(self.latencies)

    @property
    def accepted_alerts(self) -> int:
        """Alerts answered 202."""
        return self.statuses[202] * self.alerts_per_request

    def quantile(self, q: float) -> float:
        """Latency quantile in milliseconds."""
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _payload_template(alerts: int) -> bytes:
    """A v4 payload whose fingerprints are placeholders `@@@@@@@@@@@@@@@@`, `####...` etc."""
    body = {
        "version": "4",
        "groupKey": '{}/{playbook=~".+"}:{alertname="RedLineIndexStaleness"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "redline-remediation",
        "groupLabels": {"alertname": "RedLineIndexStaleness"},
        "commonLabels": {"alertname": "RedLineIndexStaleness", "severity": "critical"},
        "commonAnnotations": {"summary": "index replica is stale"},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": [
            {
                "status": "firing",
                "labels": {
                    "alertname": "RedLineIndexStaleness",
                    "collection": f"docs{index}",
                    "playbook": "freeze_and_replay",
                    "severity": "critical",
                },
                "annotations": {"summary": "index replica is stale", "runbook_url": "x"},
                "startsAt": "2024-05-01T12:00:00.123456789Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://127.0.0.1:9090/graph?g0.expr=x",
                "fingerprint": f"FP{index:02d}" + "@" * 12,
            }
            for index in range(alerts)
        ],
    }
    return json.dumps(body).encode()


def _request_factory(alerts: int, serial: itertools.count[int]) -> Callable[[], bytes]:
    template = _payload_template(alerts)
    head = (
        "POST /alerts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(template)}\r\n\r\n"
    ).encode()

    def make() -> bytes:
        body = template
        for index in range(alerts):
            fingerprint = f"{next(serial):016x}".encode()
            body = body.replace(f"FP{index:02d}".encode() + b"@" * 12, fingerprint, 1)
        return head + body

    return make


async def _client(
    port: int, make: Callable[[], bytes], start: float, stop: float, result: Result
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while True:
            began = time.perf_counter()
            if began >= stop:
                return
            writer.write(make())
            status = int((await reader.readline()).split()[1])
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            if began >= start:
                result.latencies.append(time.perf_counter() - began)
                result.statuses[status] += 1
    finally:
        writer.close()
        await writer.wait_closed()


async def _server_cpu(pid: int, start: float, stop: float) -> float | None:
    """The server's CPU seconds between `start` and `stop` (the measured window, no warm-up)."""
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    before = _cpu_seconds(pid)
    await asyncio.sleep(max(0.0, stop - time.perf_counter()))
    after = _cpu_seconds(pid)
    return None if before is None or after is None else after - before


async def _load(
    pid: int,
    port: int,
    clients: int,
    alerts: int,
    seconds: float,
    warmup: float,
    serial: itertools.count[int],
    name: str,
) -> Result:
    result = Result(name, alerts, seconds)
    make = _request_factory(alerts, serial)
    start = time.perf_counter() + warmup
    stop = start + seconds
    cpu = asyncio.create_task(_server_cpu(pid, start, stop))
    await asyncio.gather(*(_client(port, make, start, stop, result) for _ in range(clients)))
    result.cpu_seconds = await cpu
    return result


def _run_round(
    pid: int,
    port: int,
    clients: int,
    alerts: int,
    seconds: float,
    serial: itertools.count[int],
    name: str,
) -> Result:
    return asyncio.run(_load(pid, port, clients, alerts, seconds, 1.0, serial, name))


def _merge(results: list[Result]) -> Result:
    merged = Result(results[0].name, results[0].alerts_per_request, 0.0, cpu_seconds=0.0)
    for result in results:
        merged.seconds += result.seconds
        merged.latencies += result.latencies
        merged.statuses += result.statuses
        if result.cpu_seconds is None or merged.cpu_seconds is None:
            merged.cpu_seconds = None
        else:
            merged.cpu_seconds += result.cpu_seconds
    return merged


def _start(name: str, argv: list[str], log: Path, port: int, env: dict[str, str]) -> Service:
    """Spawn a server with the devstack spawner and wait for its `/healthz`."""
    ready = http_ok(f"http://127.0.0.1:{port}/healthz", timeout=0.5)
    return start_service(name, argv, log, port, ready, timeout=60, env={**os.environ, **env})


def _row(result: Result, ceiling: Result | None) -> str:
    rate = result.requests / result.seconds
    alerts = result.accepted_alerts / result.seconds
    cpu = (
        f"{1000 * result.cpu_seconds / result.requests:10.2f}"
        if result.cpu_seconds is not None and result.requests
        else "         -"
    )
    ratio = f"{rate / (ceiling.requests / ceiling.seconds):6.2f}" if ceiling else "     -"
    other = sum(count for status, count in result.statuses.items() if status != 202)
    return (
        f"{result.name:<28} {result.alerts_per_request:>6} {rate:>10.0f} {alerts:>10.0f} "
        f"{result.quantile(0.5):>8.2f} {result.quantile(0.99):>8.2f} {cpu} {ratio} {other:>7}"
    )


def run(argv: list[str] | None = None) -> list[Figure]:
    """Run the benchmark, print the table; the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per round")
    parser.add_argument("--clients", type=int, default=50, help="concurrent connections")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per server")
    parser.add_argument("--batch", type=int, default=10, help="alerts per payload, 2nd row")
    args = parser.parse_args(argv)
    serial = itertools.count(1)
    with tempfile.TemporaryDirectory(prefix="redline-bench-ingest-") as tmp:
        root = Path(tmp)
        redis_service = start_redis(root / "redis")
        token_file = root / "token"
        token_file.write_text(TOKEN)
        receiver_port, bare_port = free_port(), free_port()
        processes: list[Service] = []
        try:
            receiver = _start(
                "receiver", [sys.executable, "-m", "redline.cli", "remediation", "--workers", "0",
                 "--port", str(receiver_port), "--redis-url", redis_service.extra["url"],
                 "--token-file", str(token_file)],
                root / "receiver.log", receiver_port, {"REDLINE_LOG_LEVEL": "warning"},
            )  # fmt: skip
            processes.append(receiver)
            bare = _start(
                "bare", [sys.executable, "-c", BARE_APP, str(bare_port)], root / "bare.log",
                bare_port, {},
            )  # fmt: skip
            processes.append(bare)
            runs: dict[str, list[Result]] = {"bare": [], "receiver": [], "batch": []}
            for _ in range(args.rounds):
                runs["bare"].append(
                    _run_round(bare.process.pid, bare_port, args.clients, 1, args.seconds, serial,
                               "bare FastAPI (ceiling)")
                )  # fmt: skip
                runs["receiver"].append(
                    _run_round(receiver.process.pid, receiver_port, args.clients, 1, args.seconds,
                               serial, "redline receiver")
                )  # fmt: skip
            runs["batch"].append(
                _run_round(receiver.process.pid, receiver_port, args.clients, args.batch,
                           args.seconds, serial, "redline receiver, grouped")
            )  # fmt: skip
            client = redis.Redis.from_url(redis_service.extra["url"], decode_responses=True)
            try:
                stream = client.xlen(f"{{{PREFIX}}}:jobs")
                audit = client.llen(f"{{{PREFIX}}}:audit")
            finally:
                client.close()
        finally:
            for process in processes:
                process.stop(timeout=15)
            redis_service.stop()
    bare_result = _merge(runs["bare"])
    receiver_result = _merge(runs["receiver"])
    batch_result = _merge(runs["batch"])
    print(
        f"loopback, {args.clients} keep-alive clients, {args.rounds} x {args.seconds:g} s per "
        f"server (alternating), load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'server':<28} {'alerts':>6} {'req/s':>10} {'alerts/s':>10} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'cpu ms/req':>10} {'ratio':>6} {'non-202':>7}"
    )
    print(_row(bare_result, None))
    print(_row(receiver_result, bare_result))
    print(_row(batch_result, bare_result))
    # Every 202 in the measured windows and in the warm-ups is a job in the stream.
    accepted = receiver_result.accepted_alerts + batch_result.accepted_alerts
    durable = stream >= accepted and audit >= accepted
    print(
        f"durability: {stream} jobs in the Redis stream, {audit} audit records "
        f"(>= {accepted} alerts answered 202 in the measured windows: "
        f"{'ok' if durable else 'MISSING JOBS'})"
    )
    rate = receiver_result.accepted_alerts / receiver_result.seconds
    ratio = rate / (bare_result.requests / bare_result.seconds)
    met = rate >= TARGET_ALERTS_PER_SECOND and ratio >= TARGET_RATIO
    print(
        f"one alert per request: {rate:.0f} alerts/s, {ratio:.2f} x the ceiling: "
        f"{'meets' if met else 'misses'} the target of {TARGET_ALERTS_PER_SECOND} alerts/s and "
        f"{TARGET_RATIO} x; "
        f"{batch_result.accepted_alerts / batch_result.seconds:.0f} alerts/s with "
        f"{args.batch} alerts per notification"
    )
    grouped = batch_result.accepted_alerts / batch_result.seconds
    return [
        at_least(
            "ingest",
            "alerts/s accepted, one alert per request",
            rate,
            "alerts/s",
            TARGET_ALERTS_PER_SECOND,
        ),
        at_least("ingest", "receiver / bare FastAPI requests/s", ratio, "x", TARGET_RATIO),
        info("ingest", f"alerts/s accepted, {args.batch} alerts per request", grouped, "alerts/s"),
        check("ingest", "every alert answered 202 is a job and an audit record", durable, "all"),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when a figure missed its target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
