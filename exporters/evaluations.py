"""Accuracy verdicts: the shared tally and `POST /v1/evaluations` for the user's own evaluator.

`EvalTally` keeps cumulative `llm_eval_requests_total` / `llm_eval_correct_total` by `model` and
`model_version`. The exporter app builds one, the golden-set probes add their graded answers to
it, and `POST /v1/evaluations` adds the verdicts of the user's evaluator (an LLM judge, human
review, a downstream check) to the same counters, so the two-signal gate sees both. It is a
collector of its own, read at every scrape: a posted verdict is on the next `/metrics` at once
(the probe cache would publish it only after its next run), and one publisher means a golden
answer and an online verdict on the same version never make two series with the same labels.

The endpoint takes one verdict or a list (a batch, applied all or nothing):

    {"model": "chat", "version": "v7", "correct": true, "score": 0.92}

`version` defaults to the model's active version in the snapshot registry; given, it must be the
active one or a version the registry holds a snapshot of. `score` (0..1) is validated and
acknowledged; only `correct` feeds the counters. A bearer token is required (`token_file`,
compared in constant time): a missing or wrong one is a 401, and with no token configured the
endpoint answers 403 unless `allow_unauthenticated` opens it (logged as a warning at start-up).
An unknown model or version is a 422 naming the field (`[2].version` in a batch).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from redline.core.settings import SettingsError, read_secret
from redline.exporters.probe import MetricDef, Sample
from redline.platform.snapshots import UNKNOWN_VERSION, ActiveVersions
from redline.slo import catalog

if TYPE_CHECKING:
    from fastapi import APIRouter
    from starlette.requests import Request
    from starlette.responses import Response

log = logging.getLogger(__name__)

EVAL_METRICS = (
    MetricDef.of(catalog.LLM_EVAL_REQUESTS_TOTAL),
    MetricDef.of(catalog.LLM_EVAL_CORRECT_TOTAL),
)
EVALUATIONS_PATH = "/v1/evaluations"
_VERDICT_FIELDS = ("model", "version", "correct", "score")


class EvaluationConfigError(Exception):
    """The evaluations endpoint cannot start with these settings (e.g. an unreadable token)."""


class EvaluationsSettings(BaseModel):
    """Settings of `POST /v1/evaluations` (embed in the exporter's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Serve POST /v1/evaluations (off: 404).")
    token_file: Path | None = Field(
        None,
        description="File holding the bearer token evaluators must send. Unset: the endpoint "
        "answers 403 unless allow_unauthenticated is true.",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Accept verdicts without a token when no token_file is set (anyone who can "
        "reach the port can then move the accuracy signal; logged as a warning).",
    )
    max_batch: PositiveInt = Field(1000, description="Most verdicts in one request.")
    max_body_bytes: PositiveInt = Field(1 << 20, description="Largest request body accepted.")


@dataclass(frozen=True)
class Verdict:
    """One accepted verdict, its version resolved."""

    model: str
    version: str
    correct: bool
    score: float | None = None


class EvalTally(Collector):
    """Cumulative verdicts by (model, model_version), thread-safe, published at every scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[tuple[str, str], list[int]] = {}

    def add(self, model: str, version: str, requests: int, correct: int) -> None:
        """Count `requests` verdicts of which `correct` were right."""
        self.add_many([(model, version, requests, correct)])

    def add_many(self, counts: Sequence[tuple[str, str, int, int]]) -> None:
        """Count several (model, version, requests, correct) at once: a scrape sees all or none."""
        with self._lock:
            for model, version, requests, correct in counts:
                totals = self._totals.setdefault((model, version), [0, 0])
                totals[0] += requests
                totals[1] += correct

    def totals(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(requests, correct) by (model, version)."""
        with self._lock:
            return {key: (value[0], value[1]) for key, value in self._totals.items()}

    def samples(self, model: str | None = None) -> list[Sample]:
        """The counters as probe samples (of one model, or all), sorted."""
        out: list[Sample] = []
        for (name, version), (requests, correct) in sorted(self.totals().items()):
            if model is not None and name != model:
                continue
            labels = {"model": name, "model_version": version}
            out.append(Sample(catalog.LLM_EVAL_REQUESTS_TOTAL.family, float(requests), labels))
            out.append(Sample(catalog.LLM_EVAL_CORRECT_TOTAL.family, float(correct), labels))
        return out

    def describe(self) -> list[Metric]:
        """The two families (without samples), for registry checks."""
        return list(self._families([]))

    def collect(self) -> Iterator[Metric]:
        """The two counter families with every (model, version) seen."""
        yield from self._families(self.samples())

    @staticmethod
    def _families(samples: Sequence[Sample]) -> list[Metric]:
        families = {
            d.name: CounterMetricFamily(d.name, d.help, labels=d.labels) for d in EVAL_METRICS
        }
        for sample in samples:
            definition = next(d for d in EVAL_METRICS if d.name == sample.name)
            values = [sample.labels[label] for label in definition.labels]
            families[sample.name].add_metric(values, sample.value)
        return list(families.values())


def _field_problem(where: str, field: str, message: str) -> str:
    return f"{where}{field}: {message}"


def build_verdicts(
    body: object, versions: ActiveVersions, max_batch: int
) -> tuple[list[Verdict], list[str]]:
    """The verdicts a request body holds, or the problems (each naming its field) that refuse it."""
    batch = isinstance(body, list)
    entries: list[object] = list(body) if isinstance(body, list) else [body]
    if batch and not entries:
        return [], ["body: an empty list holds no verdict"]
    if len(entries) > max_batch:
        return [], [f"body: {len(entries)} verdicts; at most {max_batch} per request"]
    verdicts: list[Verdict] = []
    problems: list[str] = []
    for index, entry in enumerate(entries):
        where = f"[{index}]." if batch else ""
        verdict, found = _verdict(entry, versions, where)
        problems.extend(found)
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts, problems


def _verdict(
    entry: object, versions: ActiveVersions, where: str
) -> tuple[Verdict | None, list[str]]:
    if not isinstance(entry, dict):
        label = where.rstrip(".") or "body"
        return None, [f"{label}: expected a JSON object with model and correct"]
    problems = [
        _field_problem(where, str(key), f"unknown field (allowed: {', '.join(_VERDICT_FIELDS)})")
        for key in entry
        if key not in _VERDICT_FIELDS
    ]
    model = entry.get("model")
    correct = entry.get("correct")
    version = entry.get("version")
    score = entry.get("score")
    if not isinstance(model, str) or not model:
        problems.append(
            _field_problem(where, "model", f"required, a non-empty string; got {model!r}")
        )
    if not isinstance(correct, bool):
        problems.append(
            _field_problem(where, "correct", f"required, true or false; got {correct!r}")
        )
    if version is not None and (not isinstance(version, str) or not version):
        problems.append(
            _field_problem(where, "version", f"must be a non-empty string; got {version!r}")
        )
    if score is not None and (
        isinstance(score, bool)
        or not isinstance(score, int | float)
        or not math.isfinite(score)
        or not 0 <= score <= 1
    ):
        problems.append(
            _field_problem(where, "score", f"must be a number in [0, 1]; got {score!r}")
        )
    if problems or not isinstance(model, str) or not isinstance(correct, bool):
        return None, problems
    known_models = versions.models()
    if model not in known_models:
        return None, [
            _field_problem(
                where,
                "model",
                f"unknown model {model!r}: not in the snapshot registry at "
                f"{versions.registry.root} (known: {', '.join(known_models) or 'none'})",
            )
        ]
    active = versions.version(model)
    if version is None:
        if active == UNKNOWN_VERSION:
            return None, [
                _field_problem(
                    where,
                    "version",
                    f"model {model!r} has no active snapshot; name the version the verdict is on",
                )
            ]
        resolved = active
    else:
        assert isinstance(version, str)
        known = versions.known(model)
        if version != active and version not in known:
            listed = ", ".join(sorted(known)) or "none"
            return None, [
                _field_problem(
                    where,
                    "version",
                    f"unknown version {version!r} of {model!r}: neither the active one "
                    f"({active}) nor a snapshot in the registry (known: {listed})",
                )
            ]
        resolved = version
    return Verdict(model, resolved, correct, None if score is None else float(score)), []


def _error(status: int, message: str, problems: Sequence[str] = (), **headers: str) -> Response:
    from starlette.responses import JSONResponse

    body: dict[str, Any] = {"error": {"message": message, "code": status}}
    if problems:
        body["error"]["problems"] = list(problems)
    return JSONResponse(body, status_code=status, headers=headers or None)


def build_evaluations_router(
    settings: EvaluationsSettings, versions: ActiveVersions, tally: EvalTally
) -> APIRouter:
    """`POST /v1/evaluations` over `tally`; EvaluationConfigError if the token cannot be read."""
    # Imported here: the settings module imports this one, and `redline snapshot ...` commands
    # load the settings without serving anything.
    from fastapi import APIRouter
    from starlette.responses import JSONResponse

    router = APIRouter()
    if not settings.enabled:
        return router
    try:
        secret = read_secret(settings.token_file, None, "evaluations.token_file")
    except SettingsError as exc:
        raise EvaluationConfigError(str(exc)) from None
    expected = None if secret is None else f"Bearer {secret.get_secret_value()}".encode()
    if expected is None and settings.allow_unauthenticated:
        log.warning(
            "POST %s accepts verdicts WITHOUT a token (evaluations.allow_unauthenticated): "
            "anyone who reaches this port can move the accuracy signal",
            EVALUATIONS_PATH,
        )
    elif expected is None:
        log.info(
            "POST %s refuses every request: set evaluations.token_file to accept verdicts",
            EVALUATIONS_PATH,
        )

    async def evaluations(request: Request) -> Response:
        if expected is None and not settings.allow_unauthenticated:
            return _error(
                403,
                "the evaluations endpoint is closed: no token is configured (set "
                "evaluations.token_file in the exporter settings)",
            )
        if expected is not None:
            presented = request.headers.get("authorization", "").encode()
            # Constant time, so the token cannot be guessed byte by byte from response times.
            if not hmac.compare_digest(presented, expected):
                return _error(
                    401, "missing or wrong bearer token", **{"WWW-Authenticate": "Bearer"}
                )
        raw = await _read_body(request, settings.max_body_bytes)
        if raw is None:
            return _error(413, f"request body exceeds {settings.max_body_bytes} bytes")
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return _error(400, f"request body is not valid JSON: {exc}")
        verdicts, problems = build_verdicts(body, versions, settings.max_batch)
        if problems:
            return _error(422, "; ".join(problems), problems)
        tally.add_many([(v.model, v.version, 1, int(v.correct)) for v in verdicts])
        return JSONResponse(
            {
                "accepted": len(verdicts),
                "verdicts": [
                    {"model": v.model, "model_version": v.version, "correct": v.correct}
                    for v in verdicts
                ],
            }
        )

    # A plain route: the endpoint takes the request as it is (no parameter injection).
    router.add_route(EVALUATIONS_PATH, evaluations, methods=["POST"])
    return router


async def _read_body(request: Request, limit: int) -> bytes | None:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            return None
        parts.append(part)
    return b"".join(parts)
