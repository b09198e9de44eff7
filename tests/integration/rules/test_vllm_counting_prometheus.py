"""vLLM 0.33's counting paths through a real Prometheus and the rules generated for the vllm
profile: every request counts once, a failure inside a 200 stream is an error, an admission
rejection is an error, a client's own failure (a 422, a hang-up) is none.

The fake engine counts as vLLM 0.33's code does (`redline.devstack.fakes.engines`); the API
server's `http_requests_total`, which the profile read before, would see 60 of the 100 failures
here (the 40 failed streams went out as 200s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from redline.slo import catalog
from tests.integration.rules.test_profiles_prometheus import profile_stack

pytestmark = pytest.mark.integration

OK, STREAM_FAILED, FAILED, REFUSED, HUNG_UP, INVALID = 900, 40, 30, 30, 50, 100
REQUESTS = OK + STREAM_FAILED + FAILED + REFUSED
ERRORS = STREAM_FAILED + FAILED + REFUSED


def test_the_availability_slo_counts_vllms_failures_once_each(tmp_path: Path) -> None:
    with profile_stack("vllm", tmp_path) as stack:
        ratio = f'{catalog.slo_errors_record("5m")}{{slo="availability"}}'
        deadline = time.monotonic() + 60
        while not stack.prometheus.instant(ratio):  # the zero series scraped, the rules ran
            assert time.monotonic() < deadline, f"no {ratio}"
            time.sleep(0.5)
        engine = stack.engine
        engine.observe(0.3, count=OK, streamed=True)
        engine.observe(0.3, status=500, count=STREAM_FAILED, streamed=True)
        engine.observe(0.3, status=500, count=FAILED)
        engine.observe(0.01, status=503, count=REFUSED)
        engine.observe(0.3, status=499, count=HUNG_UP, streamed=True)
        engine.observe(0.01, status=422, count=INVALID)
        want = ERRORS / REQUESTS
        deadline = time.monotonic() + 60
        while True:
            got = [value for _, value in stack.prometheus.instant(ratio)]
            if got and got[0] == pytest.approx(want, rel=1e-6):
                break
            assert time.monotonic() < deadline, f"{ratio} = {got}, want {want}"
            time.sleep(0.5)
