"""LLM probes: endpoint health and dry-run per region, and the golden-set accuracy evaluator.

`EndpointProbe` (one per region) calls the upstream's `GET /healthz` and
`POST /v1/chat/completions?dry-run=true` (the redline simulator validates and answers without
generating; a real vLLM ignores the parameter and generates the one token asked for) and
publishes `llm_probe_success{region,probe}` and `llm_probe_duration_seconds{region,probe}` with
`probe` = `healthz` / `chat_dry_run`. A region that is down is a measurement, not a probe
failure: its `llm_probe_success` reads 0 (an absent series could not tell "down" from "not
measured"), and the run succeeds.

`GoldenSetProbe` (one per model) sends the golden prompts (`redline.platform.golden`) through the
gateway, grades each answer with its matcher and counts it in `llm_eval_requests_total` and
`llm_eval_correct_total` by `model` and `model_version`. The version is the snapshot registry's
active version of the model when the answer arrives (`ActiveVersions`); only a model the registry
has no active snapshot of falls back to the answer's `x-redline-model-version` header (the demo
simulator's), else "unknown". The prompts are the user's JSONL file (`golden_set.path`); the 12
built-in prompts are for the demo and local stack only, and a warning says so when they are used
against a gateway that is not on loopback. Counts go to an `EvalTally`: the exporter app shares
one with `POST /v1/evaluations` and publishes it itself (the probe then returns no samples); a
probe built alone keeps and publishes its own. When the gateway does not answer, the prompts
graded so far still count and the run raises, so the cache marks the probe failed.

Both use a sync httpx client with short timeouts; call `close()` at shutdown.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from redline.exporters.evaluations import EVAL_METRICS, EvalTally
from redline.exporters.probe import MetricDef, Probe, Sample
from redline.platform.golden import (
    GOLDEN_SET,
    GoldenAnswer,
    GoldenFetchError,
    GoldenPrompt,
    fetch_golden_answer,
    load_golden_set,
)
from redline.platform.snapshots import ActiveVersions
from redline.slo import catalog

log = logging.getLogger(__name__)

ENDPOINT_METRICS = (
    MetricDef.of(catalog.LLM_PROBE_SUCCESS),
    MetricDef.of(catalog.LLM_PROBE_DURATION_SECONDS),
)
GOLDEN_METRICS = EVAL_METRICS
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]+")


class LlmProbeError(Exception):
    """A golden-set run could not complete (the gateway did not answer a prompt)."""


def _client(timeout_seconds: float) -> httpx.Client:
    return httpx.Client(timeout=timeout_seconds, trust_env=False, follow_redirects=False)


class EndpointProbe:
    """`/healthz` and a dry-run chat completion against one region's upstream."""

    def __init__(
        self,
        region: str,
        base_url: str,
        model: str | None = None,
        interval_seconds: float = 5.0,
        timeout_seconds: float = 2.0,
    ) -> None:
        self.region = region
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"llm_endpoint_{_UNSAFE.sub('_', region)}"
        self.interval_seconds = interval_seconds
        self.metrics: tuple[MetricDef, ...] = ENDPOINT_METRICS
        self._client = _client(timeout_seconds)

    def run(self) -> list[Sample]:
        """Check both endpoints; each check's failure is a 0, never an exception."""
        checks: tuple[tuple[str, Callable[[], None]], ...] = (
            ("healthz", self._healthz),
            ("chat_dry_run", self._dry_run),
        )
        samples: list[Sample] = []
        for probe, check in checks:
            started = time.perf_counter()
            try:
                check()
            except (httpx.HTTPError, LlmProbeError) as exc:
                log.info("%s %s failed: %s: %s", self.region, probe, type(exc).__name__, exc)
                ok = 0.0
            else:
                ok = 1.0
            labels = {"region": self.region, "probe": probe}
            samples.append(Sample(catalog.LLM_PROBE_SUCCESS.family, ok, labels))
            samples.append(
                Sample(
                    catalog.LLM_PROBE_DURATION_SECONDS.family, time.perf_counter() - started, labels
                )
            )
        return samples

    def _healthz(self) -> None:
        response = self._client.get(f"{self.base_url}/healthz")
        if response.status_code != 200:
            raise LlmProbeError(f"/healthz answered HTTP {response.status_code}")

    def _model(self) -> str:
        if self.model is not None:
            return self.model
        response = self._client.get(f"{self.base_url}/v1/models")
        if response.status_code != 200:
            raise LlmProbeError(f"/v1/models answered HTTP {response.status_code}")
        try:
            model = response.json()["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LlmProbeError(f"/v1/models: malformed model list: {exc!r}") from None
        if not isinstance(model, str):
            raise LlmProbeError("/v1/models: model id is not a string")
        return model

    def _dry_run(self) -> None:
        body = {
            "model": self._model(),
            "messages": [{"role": "user", "content": "ping"}],
            "max_tokens": 1,
        }
        response = self._client.post(
            f"{self.base_url}/v1/chat/completions", params={"dry-run": "true"}, json=body
        )
        if response.status_code != 200:
            raise LlmProbeError(f"dry run answered HTTP {response.status_code}")
        try:
            payload = response.json()
        except ValueError:
            raise LlmProbeError("dry run answered a body that is not JSON") from None
        if not isinstance(payload, dict):
            raise LlmProbeError("dry run answered JSON that is not an object")

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()


class GoldenSetProbe:
    """Sends the golden prompts through the gateway and counts correct answers by version."""

    def __init__(
        self,
        gateway_url: str,
        model: str,
        items: Sequence[GoldenPrompt] = GOLDEN_SET,
        interval_seconds: float = 30.0,
        timeout_seconds: float = 5.0,
        max_tokens: int = 32,
        versions: ActiveVersions | None = None,
        tally: EvalTally | None = None,
    ) -> None:
        if not items:
            raise ValueError("the golden set is empty")
        self.gateway_url = gateway_url.rstrip("/")
        self.model = model
        self.items = tuple(items)
        self.max_tokens = max_tokens
        self.name = f"llm_golden_{_UNSAFE.sub('_', model)}"
        self.interval_seconds = interval_seconds
        self.versions = versions
        # A shared tally is published by its owner (the app); a probe's own one by the probe.
        self.publishes = tally is None
        self.tally = EvalTally() if tally is None else tally
        self.metrics: tuple[MetricDef, ...] = GOLDEN_METRICS if self.publishes else ()
        self.last_answers: list[GoldenAnswer] = []
        self._client = _client(timeout_seconds)

    def _version(self, answer: GoldenAnswer) -> str:
        """The registry's active version now; the header only for a model it does not serve."""
        if self.versions is None:
            return answer.model_version
        return self.versions.resolve(self.model, answer.model_version)

    def run(self) -> list[Sample]:
        """Ask every golden prompt; raise LlmProbeError (after counting) if one goes unanswered."""
        answers: list[GoldenAnswer] = []
        failure: str | None = None
        for item in self.items:
            try:
                answer = fetch_golden_answer(
                    self._client, self.gateway_url, self.model, item, self.max_tokens
                )
            except GoldenFetchError as exc:
                failure = f"{item.id}: {exc}"
                break
            answer = dataclasses.replace(answer, model_version=self._version(answer))
            answers.append(answer)
            self.tally.add(self.model, answer.model_version, 1, int(answer.correct))
        self.last_answers = answers
        if failure is not None:
            raise LlmProbeError(f"golden set for {self.model} via {self.gateway_url}: {failure}")
        return self.samples()

    def samples(self) -> list[Sample]:
        """The cumulative counters of this model (none when the tally is published elsewhere)."""
        return self.tally.samples(self.model) if self.publishes else []

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()


class EndpointProbeSettings(BaseModel):
    """Settings of the endpoint probes (embed in the exporter's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Run the endpoint probes.")
    interval_seconds: PositiveFloat = Field(5.0, description="Seconds between two runs.")
    timeout_seconds: PositiveFloat = Field(2.0, description="HTTP timeout of each check.")
    upstreams: dict[str, str] = Field(
        default_factory=dict, description="Region -> upstream base URL, one probe each."
    )
    model: str | None = Field(None, description="Model of the dry run (None: the first listed).")


class GoldenSetSettings(BaseModel):
    """Settings of the golden-set probes (embed in the exporter's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Run the golden-set probes.")
    interval_seconds: PositiveFloat = Field(30.0, description="Seconds between two runs.")
    timeout_seconds: PositiveFloat = Field(5.0, description="HTTP timeout of each prompt.")
    gateway_url: str | None = Field(None, description="The gateway's base URL (None: disabled).")
    models: tuple[str, ...] = Field(("redline-base",), description="Models to evaluate.")
    max_tokens: PositiveInt = Field(32, description="max_tokens of each golden request.")
    path: Path | None = Field(
        None,
        description="Your golden set: a JSONL file, one {id, prompt, expected, matcher "
        "(exact|normalized|regex|numeric-tolerance|contains), tolerance?, reference?} a line "
        "(docs/accuracy.md). Unset: the 12 built-in trivia prompts, which only the demo and "
        "local stack's simulator answers; outside them a file is expected (a warning is logged "
        "when the built-in set is used against a gateway that is not on loopback).",
    )


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def golden_items(settings: GoldenSetSettings) -> tuple[GoldenPrompt, ...]:
    """The golden set `settings.path` names (GoldenSetError if unusable), else the built-in one."""
    if settings.path is not None:
        items = load_golden_set(settings.path)
        log.info("golden set: %d prompt(s) from %s", len(items), settings.path)
        return items
    if settings.gateway_url and not _loopback(settings.gateway_url):
        # The demo stack runs on loopback; a remote gateway is somebody's real serving stack.
        log.warning(
            "golden_set.path is not set: evaluating %s with the %d built-in demo prompts, which "
            "say little about your models; point golden_set.path at your own JSONL golden set "
            "(docs/accuracy.md)",
            settings.gateway_url,
            len(GOLDEN_SET),
        )
    return GOLDEN_SET


def build_llm_probes(
    endpoint: EndpointProbeSettings,
    golden: GoldenSetSettings,
    versions: ActiveVersions | None = None,
    tally: EvalTally | None = None,
) -> list[EndpointProbe | GoldenSetProbe]:
    """The enabled LLM probes; each has `close()`. GoldenSetError if `golden.path` is unusable."""
    # Read the golden set before opening any client, so a bad file leaks nothing.
    items = golden_items(golden) if golden.enabled and golden.gateway_url else ()
    probes: list[EndpointProbe | GoldenSetProbe] = []
    if endpoint.enabled:
        for region, url in endpoint.upstreams.items():
            probes.append(
                EndpointProbe(
                    region, url, endpoint.model, endpoint.interval_seconds, endpoint.timeout_seconds
                )
            )
    if items and golden.gateway_url:
        for model in golden.models:
            probes.append(
                GoldenSetProbe(
                    golden.gateway_url,
                    model,
                    items=items,
                    interval_seconds=golden.interval_seconds,
                    timeout_seconds=golden.timeout_seconds,
                    max_tokens=golden.max_tokens,
                    versions=versions,
                    tally=tally,
                )
            )
    return probes


if TYPE_CHECKING:

    def _conforms(endpoint: EndpointProbe, golden: GoldenSetProbe) -> tuple[Probe, Probe]:
        """mypy proves both classes satisfy the scheduler's Probe protocol."""
        return endpoint, golden
