"""redline's gateway against the LiteLLM proxy, its anchor: requests/s through each, one upstream.

Starts one real redis-server (the gateway's routing store), one `redline simulate upstream`,
`redline gateway` in front of it as shipped (the spec's circuit breakers on, tracing, quotas and
the prompt log off) and the LiteLLM proxy (`litellm --config ...`, one worker, one model routed
to the simulator as an OpenAI-compatible base URL; offline: the local model cost map, no
database, no telemetry, its logging at ERROR, a master key: it refuses to start without one),
each a process of its own on loopback. Then, for
1 and for 32 concurrent keep-alive connections (httpx for one; a raw asyncio HTTP/1.1 client for
32, since httpx's async pool cannot drive redline's rate), it sends identical chat completions
(`max_tokens` 16, not streamed) through each side for `--seconds` per round, the sides
alternating over `--rounds` rounds so both meet the same machine, after a warm-up. Prints
requests/s, p50 latency and errors per side and concurrency, and the ratio. Targets (the
earlier figures): redline >= 20x LiteLLM's requests/s at one connection, >= 42x at 32.

The load generator shares the machine's two cores with both servers and the simulator, and
costs the same per request for both sides; it is a larger share of redline's cost, so the
ratios it shows are lower bounds.

LiteLLM is found as `$REDLINE_BENCH_LITELLM`, the `litellm` beside this interpreter, on PATH, or
in a venv of its own at build/bench-litellm (`python3 -m venv build/bench-litellm &&
build/bench-litellm/bin/pip install 'litellm[proxy]'`), which keeps its dependencies out of
redline's venv (it brings uvloop, which uvicorn then picks for every redline server, and an
older rich). Without it the benchmark is skipped.

Run: `.venv/bin/python -m bench.gateway_vs_litellm [--seconds S] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.figures import Figure, MissingDependencyError, at_least, check, exit_code, info
from redline.devstack.processes import Service, free_port, http_ok, start_redis, start_service

NAME = "gateway_vs_litellm"
SIDES = ("redline", "litellm", "direct")
"""The two proxies and the simulator called directly: the load generator's ceiling here."""
TARGETS = {1: 20.0, 32: 42.0}
"""Concurrent connections -> redline's requests/s over LiteLLM's, at least."""
MODEL = "redline-base"
KEY = f"sk-{secrets.token_hex(16)}"
"""LiteLLM's master key: it refuses to start without one (every request would be accepted);
both sides get the same `Authorization` header (the gateway forwards it, the simulator ignores
it), so LiteLLM's check of the key is part of its cost, as it is deployed."""
HEADERS = {"authorization": f"Bearer {KEY}"}
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "benchmark prompt of a few words"}],
    "max_tokens": 16,
    "stream": False,
}
ROOT = Path(__file__).resolve().parent.parent
OWN_VENV = ROOT / "build" / "bench-litellm" / "bin" / "litellm"
INSTALL_HINT = (
    "pip install 'litellm[proxy]', or a venv of its own: python3 -m venv build/bench-litellm && "
    "build/bench-litellm/bin/pip install 'litellm[proxy]'"
)
CONFIG = """model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {api_base}
      api_key: sk-bench-not-checked
litellm_settings:
  telemetry: false
  drop_params: true
  set_verbose: false
  request_timeout: 30
general_settings:
  disable_spend_logs: true
  disable_error_logs: true
"""
OFFLINE_ENV = {
    # The model cost map ships with the package; by default it is fetched at start-up.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOG": "ERROR",
    "LITELLM_TELEMETRY": "False",
    "DISABLE_SCHEMA_UPDATE": "true",
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "true",
    "NO_DOCS": "True",
}


def find_litellm() -> str:
    """The `litellm` executable; MissingDependencyError when there is none."""
    candidates = [
        os.environ.get("REDLINE_BENCH_LITELLM"),
        str(Path(sys.executable).parent / "litellm"),
        shutil.which("litellm"),
        str(OWN_VENV),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise MissingDependencyError(f"litellm not installed ({INSTALL_HINT})")


@dataclass
class Load:
    """Requests answered through one side at one concurrency, over the measured windows."""

    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""

    @property
    def rate(self) -> float:
        """Requests answered 200 per second."""
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def add(self, other: Load) -> None:
        """Merge another window's counts into this one."""
        self.seconds += other.seconds
        self.latencies += other.latencies
        self.errors += other.errors
        self.first_error = self.first_error or other.first_error


def _problem(status: int, body: bytes) -> str:
    """ "" when the answer is a chat completion, else what is wrong with it."""
    if status != 200:
        return f"HTTP {status}: {body[:200]!r}"
    try:
        choices = json.loads(body).get("choices")
    except (ValueError, AttributeError):
        return f"not a JSON object: {body[:200]!r}"
    return "" if choices else f"no choices: {body[:200]!r}"


def one_connection(url: str, seconds: float) -> Load:
    """Back-to-back requests over one keep-alive connection for `seconds`."""
    load = Load()
    with httpx.Client(timeout=30.0, trust_env=False, headers=HEADERS) as client:
        started = time.perf_counter()
        deadline = started + seconds
        while (began := time.perf_counter()) < deadline:
            response = client.post(url, json=BODY)
            problem = _problem(response.status_code, response.content)
            if problem:
                load.errors += 1
                load.first_error = load.first_error or problem
            else:
                load.latencies.append(time.perf_counter() - began)
        load.seconds = time.perf_counter() - started
    return load


def _request_bytes(url: str) -> tuple[str, int, bytes]:
    """(host, port, the whole HTTP/1.1 request) of one chat completion to `url`."""
    parts = httpx.URL(url)
    body = json.dumps(BODY).encode()
    head = (
        f"POST {parts.raw_path.decode()} HTTP/1.1\r\nhost: {parts.host}:{parts.port}\r\n"
        f"authorization: {HEADERS['authorization']}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return parts.host, parts.port or 80, head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Status and body of one response (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, chunked = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
    if not chunked:
        return status, await reader.readexactly(length)
    parts = []
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        parts.append((await reader.readexactly(size + 2))[:-2])
    await reader.readuntil(b"\r\n")  # no trailers are sent here: the blank line
    return status, b"".join(parts)


async def _connections(url: str, connections: int, seconds: float) -> Load:
    # Raw keep-alive HTTP/1.1 on asyncio streams, not httpx.AsyncClient: against the bare
    # simulator at 32 connections httpx's async pool peaked near 200 requests/s on this
    # machine (its own CPU per request), below redline's rate, where this client does ~1900.
    load = Load()
    host, port, request = _request_bytes(url)
    started = time.perf_counter()
    deadline = started + seconds

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while (began := time.perf_counter()) < deadline:
                writer.write(request)
                status, body = await asyncio.wait_for(_read_response(reader), 30.0)
                problem = _problem(status, body)
                if problem:
                    load.errors += 1
                    load.first_error = load.first_error or problem
                else:
                    load.latencies.append(time.perf_counter() - began)
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    load.seconds = time.perf_counter() - started
    return load


def measure(url: str, connections: int, seconds: float) -> Load:
    """Requests/s through `url` with `connections` concurrent keep-alive connections."""
    if connections == 1:
        return one_connection(url, seconds)
    return asyncio.run(_connections(url, connections, seconds))


def _redline(*args: str) -> list[str]:
    return [sys.executable, "-m", "redline.cli", *args]


def _start(
    name: str,
    argv: list[str],
    root: Path,
    port: int,
    health: str,
    timeout: float,
    env: dict[str, str],
) -> Service:
    ready = http_ok(f"http://127.0.0.1:{port}{health}", timeout=1.0)
    return start_service(name, argv, root / f"{name}.log", port, ready, timeout, env=env)


def start_sides(root: Path, litellm: str, redis_url: str) -> tuple[list[Service], dict[str, str]]:
    """Simulator, redline's gateway and the LiteLLM proxy; (services, side -> completions URL).
    On a failure the services already started are stopped."""
    plain = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    services: list[Service] = []
    try:
        sim_port = free_port()
        services.append(
            _start(
                "simulator",
                _redline("simulate", "upstream", "--region", "primary", "--port", str(sim_port)),
                root,
                sim_port,
                "/healthz",
                30,
                plain,
            )
        )
        sim_url = f"http://127.0.0.1:{sim_port}"
        gateway_port = free_port()
        services.append(
            _start(
                "gateway",
                _redline(
                    "gateway",
                    "--port",
                    str(gateway_port),
                    "--redis-url",
                    redis_url,
                    "--upstream",
                    f"primary={sim_url}",
                ),
                root,
                gateway_port,
                "/healthz",
                30,
                plain,
            )
        )
        config = root / "litellm.yaml"
        config.write_text(CONFIG.format(model=MODEL, api_base=f"{sim_url}/v1"))
        litellm_port = free_port()
        env = {**plain, **OFFLINE_ENV, "LITELLM_MASTER_KEY": KEY}
        env.pop("DATABASE_URL", None)  # no spend logs, no keys: no database
        services.append(
            _start(
                "litellm",
                [
                    litellm,
                    "--config",
                    str(config),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(litellm_port),
                    "--num_workers",
                    "1",
                ],
                root,
                litellm_port,
                "/health/liveliness",
                180,
                env,
            )
        )
    except BaseException:
        for service in reversed(services):
            service.stop()
        raise
    urls = {
        "direct": f"{sim_url}/v1/chat/completions",
        "redline": f"http://127.0.0.1:{gateway_port}/v1/chat/completions",
        "litellm": f"http://127.0.0.1:{litellm_port}/v1/chat/completions",
    }
    return services, urls


def run(argv: list[str] | None = None) -> list[Figure]:
    """Run the benchmark, print the table; the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per side")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per side")
    args = parser.parse_args(argv)
    litellm = find_litellm()
    results: dict[int, dict[str, Load]] = {c: {side: Load() for side in SIDES} for c in TARGETS}
    with tempfile.TemporaryDirectory(prefix="redline-bench-litellm-") as tmp:
        root = Path(tmp)
        redis = start_redis(root / "redis")
        services: list[Service] = []
        try:
            services, urls = start_sides(root, litellm, redis.extra["url"])
            for side in SIDES:
                warm = measure(urls[side], 1, args.warmup)
                if warm.errors and not warm.latencies:
                    raise RuntimeError(f"{side} answers no request: {warm.first_error}")
                measure(urls[side], 32, args.warmup)
            for connections in TARGETS:
                for number in range(args.rounds):
                    shift = number % len(SIDES)  # which side goes first rotates
                    for side in SIDES[shift:] + SIDES[:shift]:
                        load = measure(urls[side], connections, args.seconds)
                        results[connections][side].add(load)
                        print(
                            f"  {connections:>2} connections, round {number + 1}, {side}: "
                            f"{load.rate:.0f} requests/s",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            for service in reversed(services):
                service.stop()
            redis.stop()
    return _report(results, args)


def _report(results: dict[int, dict[str, Load]], args: argparse.Namespace) -> list[Figure]:
    print(
        f"redline gateway vs LiteLLM proxy, same simulated upstream, one process each; "
        f"{args.rounds} x {args.seconds:g} s per side and concurrency (alternating); load "
        f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    header = (
        f"{'connections':>11} {'side':<8} {'requests/s':>11} {'p50 ms':>8} {'errors':>7} "
        f"{'ratio':>8} {'target':>8}"
    )
    print(header)
    print("-" * len(header))
    figures: list[Figure] = []
    clean = True
    for connections, sides in results.items():
        ours, theirs = sides["redline"], sides["litellm"]
        ratio = ours.rate / theirs.rate if theirs.rate else float("inf")
        for side, load in sides.items():
            p50 = statistics.median(load.latencies) * 1000 if load.latencies else float("nan")
            shown = f"{ratio:7.1f}x" if side == "redline" else ""
            target = f">= {TARGETS[connections]:g}x" if side == "redline" else ""
            print(
                f"{connections:>11} {side:<8} {load.rate:>11.1f} {p50:>8.2f} {load.errors:>7} "
                f"{shown:>8} {target:>8}"
            )
            if load.errors:
                clean = False
                print(f"{'':>11} {side}: first error: {load.first_error}")
        verdict = "meets" if ratio >= TARGETS[connections] else "MISSES"
        print(
            f"{connections} connections: redline serves {ratio:.1f}x LiteLLM's requests/s, "
            f"{verdict} the {TARGETS[connections]:g}x target"
        )
        label = f"redline / LiteLLM requests/s, {connections} connection" + (
            "s" if connections > 1 else ""
        )
        figures.append(at_least(NAME, label, ratio, "x", TARGETS[connections]))
        figures.append(info(NAME, f"redline requests/s, {connections} conn.", ours.rate, "req/s"))
        figures.append(info(NAME, f"LiteLLM requests/s, {connections} conn.", theirs.rate, "req/s"))
    print("direct: the simulator called without a proxy, the ceiling of this load generator here")
    figures.append(check(NAME, "every request answered 200 with choices", clean, "all"))
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on its own; exit 1 when a figure missed its target."""
    return exit_code(run(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
