"""Gateway overhead: latency added by `redline gateway` over calling the upstream directly.

Starts one real redis-server, one `redline simulate upstream` and one `redline gateway` in front
of it (separate processes, loopback), then alternates identical requests straight to the
simulator and through the gateway from one keep-alive client, so both see the same machine state.
Prints p50/p99 per mode, the added milliseconds and the ratio. Target: <= 2 ms added at p50.

Run: `.venv/bin/python -m bench.gateway_overhead [--requests N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from redline.devstack.processes import Service, free_port, http_ok, start_redis, start_service

TARGET_ADDED_P50_MS = 2.0


def _start(name: str, argv: list[str], log: Path, port: int) -> Service:
    """Spawn a server with the devstack spawner and wait for its `/healthz`."""
    ready = http_ok(f"http://127.0.0.1:{port}/healthz", timeout=0.5)
    return start_service(name, argv, log, port, ready, timeout=20)


def redline(*args: str) -> list[str]:
    """argv running the `redline` CLI of this interpreter."""
    return [sys.executable, "-m", "redline.cli", *args]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc), or None where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    """One mode's latencies and the CPU each process spent on it."""

    mode: str
    direct: list[float]
    proxied: list[float]
    gateway_cpu: float | None
    simulator_cpu: float | None


def _measure(
    client: httpx.Client,
    requests: int,
    direct: str,
    proxied: str,
    stream: bool,
    pids: tuple[int, int],
) -> Run:
    body = {
        "model": "redline-base",
        "messages": [{"role": "user", "content": "benchmark prompt of a few words"}],
        "max_tokens": 16,
        "stream": stream,
    }

    def once(url: str) -> float:
        started = time.perf_counter()
        response = client.post(url, json=body)
        response.read()
        elapsed = time.perf_counter() - started
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
        return elapsed

    for _ in range(200):  # warm-up: connections, caches, the gateway's label children
        once(direct)
        once(proxied)
    direct_times: list[float] = []
    proxied_times: list[float] = []
    before = [_cpu_seconds(pid) for pid in pids]
    for index in range(requests):
        # Alternate which goes first so neither side always follows the other.
        pair: list[tuple[list[float], str]] = [(direct_times, direct), (proxied_times, proxied)]
        for times, url in pair if index % 2 == 0 else reversed(pair):
            times.append(once(url))
    after = [_cpu_seconds(pid) for pid in pids]
    cpu = [None if b is None or a is None else a - b for b, a in zip(before, after, strict=True)]
    mode = "stream" if stream else "json"
    return Run(mode, direct_times, proxied_times, cpu[1], cpu[0])


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests per mode and side")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="redline-bench-") as tmp:
        root = Path(tmp)
        redis = start_redis(root / "redis")
        sim_port, gw_port = free_port(), free_port()
        sim_url, gw_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gw_port}"
        processes: list[Service] = []
        try:
            processes.append(
                _start(
                    "simulator",
                    redline("simulate", "upstream", "--region", "primary", "--port", str(sim_port)),
                    root / "simulator.log",
                    sim_port,
                )
            )
            processes.append(
                _start(
                    "gateway",
                    redline(
                        "gateway",
                        "--port",
                        str(gw_port),
                        "--redis-url",
                        redis.extra["url"],
                        "--upstream",
                        f"primary={sim_url}",
                    ),
                    root / "gateway.log",
                    gw_port,
                )
            )
            runs = []
            pids = (processes[0].process.pid, processes[1].process.pid)
            with httpx.Client(timeout=10.0, trust_env=False) as client:
                for stream in (False, True):
                    runs.append(
                        _measure(
                            client,
                            args.requests,
                            f"{sim_url}/v1/chat/completions",
                            f"{gw_url}/v1/chat/completions",
                            stream,
                            pids,
                        )
                    )
        finally:
            for process in processes:
                process.stop()
            redis.stop()

    print(f"gateway overhead, {args.requests} requests per side and mode, one keep-alive client")
    header = (
        f"{'mode':<7}{'quantile':>9}{'direct ms':>11}{'gateway ms':>12}{'added ms':>10}{'ratio':>8}"
    )
    print(header)
    print("-" * len(header))
    verdicts = []
    for run in runs:
        mode, direct, proxied = run.mode, run.direct, run.proxied
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            d, p = _quantile(direct, q) * 1000, _quantile(proxied, q) * 1000
            print(f"{mode:<7}{name:>9}{d:>11.3f}{p:>12.3f}{p - d:>10.3f}{p / d:>7.2f}x")
            if name == "p50":
                verdicts.append((mode, p - d))
        mean_added = (statistics.fmean(proxied) - statistics.fmean(direct)) * 1000
        print(f"{mode:<7}{'mean':>9}{'':>11}{'':>12}{mean_added:>10.3f}")
    print("CPU per request (load-independent view of the cost; simulator serves both sides):")
    for run in runs:
        if run.gateway_cpu is None or run.simulator_cpu is None:
            print(f"{run.mode}: CPU times unavailable on this platform")
            continue
        gateway_ms = run.gateway_cpu / len(run.proxied) * 1000
        simulator_ms = run.simulator_cpu / (len(run.direct) + len(run.proxied)) * 1000
        print(
            f"{run.mode}: gateway {gateway_ms:.3f} ms per proxied request, simulator "
            f"{simulator_ms:.3f} ms per request ({gateway_ms / simulator_ms:.2f}x)"
        )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"1-minute load average at the end: {load:.2f} on {os.cpu_count()} CPUs")
    for mode, added in verdicts:
        ok = "meets" if added <= TARGET_ADDED_P50_MS else "MISSES"
        print(f"{mode}: {added:.3f} ms added at p50 {ok} the {TARGET_ADDED_P50_MS:g} ms target")


if __name__ == "__main__":
    main()
