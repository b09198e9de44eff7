"""The engines' counting paths through a real Prometheus and the rules generated for each
profile: every request counts once, one failed request is one error, a failure inside a 200
stream is an error, a client's own failure (a 422, a hang-up) is none.

The fake engines count as the engines' code does (`redline.devstack.fakes.engines`). What the
profiles read before would be off here: vLLM's `http_requests_total{status="5xx"}` misses the 40
streams that failed after their 200 (60 errors of 100); TGI's `tgi_request_count` counts every
chat request twice (the error ratio halved)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from redline.devstack.fakes.engines import ABORTED
from redline.slo import catalog
from tests.integration.rules.test_profiles_prometheus import profile_stack

pytestmark = pytest.mark.integration

REL = 0.05
"""rate() extrapolates each series over its own samples: series created at different moments
(TGI's lazy failure counters) read a few per mille apart. The old contracts were 25 to 45 % off
here (vLLM 60 / 1004 where 103 / 1004; TGI about 150 / 2302 where 100 / 1151)."""


@dataclass(frozen=True)
class Path_:
    """`count` requests answered `status` (`streamed`: as a stream), and whether the profile
    must count them as requests and as errors. `lazy`: the engine creates the series at its
    first such request (TGI's failure counters, by the metrics crate), so rate() cannot see
    that first one: the warm-up request of the path is not counted."""

    count: int
    status: int
    streamed: bool
    request: bool
    error: bool
    lazy: bool = False


PATHS = {
    "vllm": (  # vLLM 0.33
        Path_(900, 200, True, True, False),
        Path_(40, 500, True, True, True),  # FinishReason.ERROR inside a 200 stream
        Path_(30, 500, False, True, True),  # FinishReason.ERROR answered 500
        Path_(30, 503, False, True, True),  # refused at admission (QueueOverflowError)
        Path_(50, ABORTED, True, False, False),  # the client hung up: no finished stats
        Path_(100, 422, False, False, False),  # refused by the API server's validation
    ),
    "otel-genai": (  # opentelemetry-instrumentation-openai-v2 2.4b0 around the OpenAI SDK
        Path_(900, 200, False, True, False),
        # Recorded when the stream is handed back, before it fails (the profile says so).
        Path_(40, 500, True, True, False, lazy=True),
        Path_(30, 500, False, True, True, lazy=True),  # InternalServerError
        Path_(30, 503, False, True, True, lazy=True),  # InternalServerError
        Path_(50, ABORTED, False, True, False),  # cancelled: no error.type
        Path_(100, 422, False, True, False, lazy=True),  # UnprocessableEntityError: the client's
    ),
    "sglang": (  # SGLang 0.5.23's HTTP middleware: every labelled series created lazily
        Path_(900, 200, True, True, False, lazy=True),
        # A failure after the stream's 200: SGLang cannot tell (the profile's `missing` says).
        Path_(40, 500, True, True, False, lazy=True),
        Path_(30, 500, False, True, True, lazy=True),
        Path_(30, 503, False, True, True, lazy=True),
        Path_(50, ABORTED, True, True, False, lazy=True),  # hung up mid-stream: a 200
        Path_(100, 422, False, True, False, lazy=True),
    ),
    "tgi": (  # TGI 3.3 router
        Path_(900, 200, True, True, False),
        Path_(40, 500, True, True, True, lazy=True),  # incomplete generation inside a stream
        Path_(30, 424, False, True, True, lazy=True),  # generation error
        Path_(30, 429, False, True, True, lazy=True),  # overloaded
        Path_(50, ABORTED, True, True, False, lazy=True),  # dropped before its batch: client's
        Path_(100, 422, False, True, False, lazy=True),  # validation: the client's own
    ),
}


@pytest.mark.parametrize("profile", sorted(PATHS))
def test_the_availability_slo_counts_each_failure_once(tmp_path: Path, profile: str) -> None:
    paths = PATHS[profile]
    # One warm-up request per path (its series then exist), then the paths' counts.
    counted = {p: p.count + (0 if p.lazy else 1) for p in paths}
    requests = sum(n for p, n in counted.items() if p.request)
    errors = sum(n for p, n in counted.items() if p.error)
    with profile_stack(profile, tmp_path) as stack:
        ratio = f'{catalog.slo_errors_record("5m")}{{slo="availability"}}'
        scraped_after = 'timestamp(up{job="engine"}) > '
        deadline = time.monotonic() + 60
        while not stack.prometheus.instant('up{job="engine"} == 1'):  # a first scrape
            assert time.monotonic() < deadline, "the engine was never scraped"
            time.sleep(0.5)
        for path in paths:
            stack.engine.observe(0.3, status=path.status, streamed=path.streamed)
        warmed = time.time()
        # A scrape after the warm-up (the series it created have their first sample), and the
        # rules ran over it.
        while not (
            stack.prometheus.instant(f"{scraped_after}{warmed}") and stack.prometheus.instant(ratio)
        ):
            assert time.monotonic() < deadline, f"no scrape after the warm-up, or no {ratio}"
            time.sleep(0.5)
        for path in paths:
            stack.engine.observe(0.3, status=path.status, count=path.count, streamed=path.streamed)
        want = errors / requests
        deadline = time.monotonic() + 60
        while True:
            got = [value for _, value in stack.prometheus.instant(ratio)]
            if got and got[0] == pytest.approx(want, rel=REL):
                break
            assert time.monotonic() < deadline, f"{ratio} = {got}, want {want}"
            time.sleep(0.5)
