"""Output consistency over time: canary answers against the last accepted ones (design notes §4.4).

`MutationProbe` (one per region) asks every canary prompt of every configured model
deterministically (temperature 0, the canary's `max_tokens`) and compares each answer with the
previous *accepted* answer of the same (model, model version, region, prompt), kept in Redis
(`AcceptedStore`). The comparison is a Myers O(ND) diff (`myers_diff`) over the tokens of both
answers after normalisation (`normalise`), which applies the notes' false-positive controls in
order:

1. whitelisted template fields are masked: a canary names built-in patterns (`timestamp`,
   `date`, `time`, `uuid`, `number`, `hex`) or its own regexes (`re:<pattern>`); each match
   becomes one placeholder token (`__uuid__`), so a new UUID or timestamp is no change;
2. case is folded (NFKC, `casefold`) and punctuation and whitespace are ignored: tokens are the
   runs of word characters;
3. equivalent spellings are mapped to the first spelling of their group (the settings' table
   plus the canary's own, e.g. `["6", "six"]`, `["usa", "united states"]`; phrases match, the
   longest first).

Published per (model, model_version, region, prompt):

- `llm_output_consistency_changes`: a gauge of the last diff's size in tokens (inserted +
  deleted). A gauge, not a counter: the accepted answer is kept while the model answers
  otherwise, so the gauge stays up as long as the mutation lasts and falls to 0 when the answer
  is the accepted one again; the alert reads it directly (a counter would need a rate over a
  window the probe interval does not fix).
- `llm_output_mutation_score`: changed-token ratio `D / (n + m)` of the diff (D edits between
  answers of n and m tokens) times `min(1, sqrt(short_answer_tokens / max(n, m)))`: a short
  answer counts in full, a long one is damped, since a burst of changes on a short answer is the
  hallucination-mutation signal and a long answer varies more for harmless reasons.
- `llm_output_consistency_diff_info{..., diff}` = 1 while the answer differs: the normalised
  diff (`-deleted +inserted` per hunk, hunks joined by ` | `), truncated to
  `diff_label_chars` characters. Its value set is bounded: tokens are word characters only (no
  raw answer text, no newlines), one series per canary at a time, and only while it differs;
  the alert carries it into its annotations (the receiver records it with the candidate).

Accepting: the first answer ever seen for a (model, region, prompt) is accepted. A model
version seen for the first time is compared with the answer accepted last for the same model,
region and prompt under another version, so a release that answers a canary differently shows
at once, labelled with the new version; an equal answer is accepted for it. A different answer
is never accepted at once: with `accept_after` N > 0 it is accepted once the model has given
the same (normalised) answer N runs in a row (a deliberate change settles; a flapping answer
never does), with 0 only by an operator (`AcceptedStore.forget`, or deleting the Redis hash
field). The model version is the `x-redline-model-version` header of the answer when the server
sends one (redline's simulator, a gateway that stamps it), else the snapshot registry's active
version of the model (`ActiveVersions`), else "unknown".

The canary file: `redline.exporters.canary_file`; normalisation, diff and score:
`redline.exporters.mutation_diff`.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import redis
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from redline.exporters.canary_file import DEFAULT_CANARIES, Canary, load_canaries
from redline.exporters.mutation_diff import WORD, Comparison, Normaliser, compare
from redline.exporters.probe import MetricDef, Probe, Sample
from redline.platform.golden import MODEL_VERSION_HEADER
from redline.platform.sessions import open_redis
from redline.platform.snapshots import ActiveVersions
from redline.slo import catalog

log = logging.getLogger(__name__)

MUTATION_METRICS = (
    MetricDef.of(catalog.LLM_OUTPUT_CONSISTENCY_CHANGES),
    MetricDef.of(catalog.LLM_OUTPUT_MUTATION_SCORE),
    MetricDef.of(catalog.LLM_OUTPUT_CONSISTENCY_DIFF_INFO),
)
UNKNOWN_VERSION = "unknown"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]+")


class MutationProbeError(Exception):
    """A region did not answer a canary (the run fails; its gauges become unknown)."""


# ---- accepted answers in Redis -------------------------------------------------------------


@dataclass(frozen=True)
class Accepted:
    """An accepted answer: its raw text, the version it was given by, when it was accepted."""

    text: str
    version: str
    at: float


class AcceptedStore:
    """Accepted and pending answers in three Redis hashes under `prefix`.

    `{prefix}:accepted` (field `["model","version","region","prompt"]`), `{prefix}:latest`
    (field `["model","region","prompt"]`: the last answer accepted under any version) and
    `{prefix}:pending` (a different answer and how many runs in a row it was given). Values are
    JSON. Raw texts are stored, so a changed normalisation applies to the old answers too.
    """

    def __init__(self, client: redis.Redis, prefix: str = "redline:mutation") -> None:
        self.client = client
        self.prefix = prefix

    @staticmethod
    def field(*parts: str) -> str:
        """The hash field of a key tuple (JSON: unambiguous whatever the names hold)."""
        return json.dumps(list(parts), separators=(",", ":"))

    def _get(self, hash_name: str, key: str) -> dict[str, Any] | None:
        raw = self.client.hget(f"{self.prefix}:{hash_name}", key)
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            log.warning("%s:%s %s is not JSON; ignored", self.prefix, hash_name, key)
            return None
        return value if isinstance(value, dict) else None

    def accepted(self, model: str, version: str, region: str, prompt: str) -> Accepted | None:
        """The answer accepted for this exact version, if any."""
        found = self._get("accepted", self.field(model, version, region, prompt))
        return _accepted(found)

    def latest(self, model: str, region: str, prompt: str) -> Accepted | None:
        """The answer accepted last for the model under any version, if any."""
        return _accepted(self._get("latest", self.field(model, region, prompt)))

    def accept(
        self, model: str, version: str, region: str, prompt: str, text: str, at: float
    ) -> None:
        """Make `text` the accepted answer of this version (and the model's latest)."""
        value = json.dumps({"text": text, "version": version, "at": at})
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(f"{self.prefix}:accepted", self.field(model, version, region, prompt), value)
        pipe.hset(f"{self.prefix}:latest", self.field(model, region, prompt), value)
        pipe.hdel(f"{self.prefix}:pending", self.field(model, version, region, prompt))
        pipe.execute()

    def pending(self, model: str, version: str, region: str, prompt: str) -> tuple[str, int]:
        """The different answer being given (normalised, joined) and its runs in a row."""
        found = self._get("pending", self.field(model, version, region, prompt)) or {}
        return str(found.get("tokens", "")), int(found.get("runs", 0))

    def set_pending(
        self, model: str, version: str, region: str, prompt: str, tokens: str, runs: int
    ) -> None:
        """Remember the different answer being given and its runs in a row."""
        value = json.dumps({"tokens": tokens, "runs": runs})
        self.client.hset(
            f"{self.prefix}:pending", self.field(model, version, region, prompt), value
        )

    def clear_pending(self, model: str, version: str, region: str, prompt: str) -> None:
        """Forget a pending different answer (the accepted one came back)."""
        self.client.hdel(f"{self.prefix}:pending", self.field(model, version, region, prompt))

    def forget(self, model: str, version: str, region: str, prompt: str) -> None:
        """Drop the accepted answer of a version: its next answer is compared with the model's
        latest (another version's), or accepted when there is none; an operator's reset."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(f"{self.prefix}:accepted", self.field(model, version, region, prompt))
        pipe.hdel(f"{self.prefix}:latest", self.field(model, region, prompt))
        pipe.hdel(f"{self.prefix}:pending", self.field(model, version, region, prompt))
        pipe.execute()


def _accepted(found: Mapping[str, Any] | None) -> Accepted | None:
    if not found or not isinstance(found.get("text"), str):
        return None
    return Accepted(found["text"], str(found.get("version", "")), float(found.get("at", 0.0)))


# ---- the probe -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Judgement:
    """What one answer did to the store: its comparison and whether it was accepted."""

    comparison: Comparison
    accepted: bool
    baseline_version: str | None


def judge(
    store: AcceptedStore,
    key: tuple[str, str, str, str],
    answer: str,
    normaliser: Normaliser,
    *,
    accept_after: int,
    short_tokens: int,
    diff_chars: int,
    now: float,
) -> Judgement:
    """Compare `answer` with the accepted one of `key` (model, version, region, prompt) or, for a
    version never seen, the model's latest; accept it when there is none, when it agrees, or
    when it has been the same for `accept_after` runs in a row."""
    model, version, region, prompt = key
    own = store.accepted(*key)
    baseline = own or store.latest(model, region, prompt)
    if baseline is None:
        store.accept(*key, answer, now)
        return Judgement(Comparison(0, 0.0, ""), True, None)
    comparison = compare(baseline.text, answer, normaliser, short_tokens, diff_chars)
    if comparison.changes == 0:
        if own is None:
            store.accept(*key, answer, now)  # a new version agreeing with the old one
        else:
            store.clear_pending(*key)
        return Judgement(comparison, own is None, baseline.version)
    tokens = " ".join(normaliser(answer))
    seen, runs = store.pending(*key)
    runs = runs + 1 if seen == tokens else 1
    if accept_after > 0 and runs >= accept_after:
        log.info(
            "%s %s %s %s: a different answer given %d runs in a row is now accepted: %s",
            model,
            version,
            region,
            prompt,
            runs,
            comparison.diff,
        )
        store.accept(*key, answer, now)
        return Judgement(Comparison(0, 0.0, ""), True, baseline.version)
    store.set_pending(*key, tokens, runs)
    return Judgement(comparison, False, baseline.version)


class MutationProbe:
    """Asks the canaries of every model of one region and compares each answer with the
    accepted one (see the module docstring)."""

    metrics: tuple[MetricDef, ...] = MUTATION_METRICS
    writes_canaries = True
    """Canary prompts and accepted answers: with exporter replicas, the lease holder's only."""

    def __init__(
        self,
        region: str,
        base_url: str,
        models: Sequence[str],
        canaries: Sequence[Canary],
        redis_url: str,
        *,
        key_prefix: str = "redline:mutation",
        equivalents: Sequence[Sequence[str]] = (),
        accept_after: int = 0,
        short_answer_tokens: int = 32,
        diff_label_chars: int = 120,
        interval_seconds: float = 30.0,
        timeout_seconds: float = 5.0,
        versions: ActiveVersions | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not canaries:
            raise ValueError("the canary set is empty")
        if not models:
            raise ValueError("mutation.models is empty")
        self.region = region
        self.base_url = base_url.rstrip("/")
        self.models = tuple(models)
        self.canaries = tuple(canaries)
        self.name = f"output_mutation_{_UNSAFE.sub('_', region)}"
        self.interval_seconds = interval_seconds
        self.redis_url = redis_url
        self.key_prefix = key_prefix
        self.accept_after = accept_after
        self.short_answer_tokens = short_answer_tokens
        self.diff_label_chars = diff_label_chars
        self.versions = versions
        self.timeout_seconds = timeout_seconds
        shared = tuple(tuple(g) for g in equivalents)
        # Built once: a bad whitelist or table fails at start-up, not at the first run.
        self.normalisers = {
            c.id: Normaliser(c.whitelist, (*c.equivalents, *shared)) for c in self.canaries
        }
        self._clock = clock
        self._http = httpx.Client(timeout=timeout_seconds, trust_env=False, follow_redirects=False)
        self._redis: redis.Redis | None = None
        self._lock = threading.Lock()

    def _store(self) -> AcceptedStore:
        with self._lock:
            if self._redis is None:
                self._redis = open_redis(self.redis_url, self.timeout_seconds)
            return AcceptedStore(self._redis, self.key_prefix)

    def ask(self, model: str, canary: Canary) -> tuple[str, str]:
        """The answer of this region to one canary and the version that gave it."""
        url = f"{self.base_url}/v1/chat/completions"
        try:
            response = self._http.post(url, json=canary.request(model))
        except httpx.HTTPError as exc:
            raise MutationProbeError(f"{url}: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise MutationProbeError(f"{url}: HTTP {response.status_code} for {canary.id}")
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise MutationProbeError(f"{url}: malformed chat completion: {exc!r}") from None
        if not isinstance(content, str):
            raise MutationProbeError(f"{url}: malformed chat completion: content not a string")
        reported = response.headers.get(MODEL_VERSION_HEADER)
        if reported:
            return content, reported
        if self.versions is not None:
            return content, self.versions.resolve(model, None)
        return content, UNKNOWN_VERSION

    def run(self) -> list[Sample]:
        """Ask every canary of every model; MutationProbeError when one goes unanswered."""
        store = self._store()
        samples: list[Sample] = []
        for model in self.models:
            for canary in self.canaries:
                answer, version = self.ask(model, canary)
                key = (model, version, self.region, canary.id)
                verdict = judge(
                    store,
                    key,
                    answer,
                    self.normalisers[canary.id],
                    accept_after=self.accept_after,
                    short_tokens=self.short_answer_tokens,
                    diff_chars=self.diff_label_chars,
                    now=self._clock(),
                )
                samples.extend(self._samples(key, verdict.comparison))
        return samples

    @staticmethod
    def _samples(key: tuple[str, str, str, str], comparison: Comparison) -> list[Sample]:
        model, version, region, prompt = key
        labels = {
            catalog.LABEL_MODEL: model,
            catalog.LABEL_MODEL_VERSION: version,
            catalog.LABEL_REGION: region,
            "prompt": prompt,
        }
        out = [
            Sample(catalog.LLM_OUTPUT_CONSISTENCY_CHANGES.family, comparison.changes, labels),
            Sample(catalog.LLM_OUTPUT_MUTATION_SCORE.family, comparison.score, labels),
        ]
        if comparison.changes:
            diff_labels = {**labels, "diff": comparison.diff}
            out.append(Sample(catalog.LLM_OUTPUT_CONSISTENCY_DIFF_INFO.family, 1.0, diff_labels))
        return out

    def close(self) -> None:
        """Close the HTTP and Redis clients."""
        self._http.close()
        with self._lock:
            if self._redis is not None:
                self._redis.close()
                self._redis = None


class MutationSettings(BaseModel):
    """Settings of the output-mutation probes (embed in the exporter's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="Run the output-mutation probes.")
    interval_seconds: PositiveFloat = Field(30.0, description="Seconds between two runs.")
    timeout_seconds: PositiveFloat = Field(5.0, description="HTTP and Redis timeout.")
    upstreams: dict[str, str] = Field(
        default_factory=dict, description="Region -> upstream base URL, one probe each."
    )
    models: tuple[str, ...] = Field(("redline-base",), min_length=1, description="Models asked.")
    path: Path | None = Field(
        None,
        description="Canary prompts: a JSONL file, one {id, messages | prompt, max_tokens?, "
        "whitelist?, equivalents?} a line. Unset: the 4 built-in demo canaries.",
    )
    equivalents: tuple[tuple[str, ...], ...] = Field(
        (), description="Groups of equivalent spellings applied to every canary."
    )
    accept_after: int = Field(
        0,
        ge=0,
        description="Accept a different answer once given this many runs in a row (0: only an "
        "operator accepts one).",
    )
    short_answer_tokens: PositiveInt = Field(
        32, description="Answers up to this many tokens weigh fully in the mutation score."
    )
    diff_label_chars: int = Field(
        120, ge=16, le=512, description="Longest `diff` label value (truncated)."
    )
    redis_url: str | None = Field(
        None, description="Redis of the accepted answers; default: service."
    )
    key_prefix: str = Field("redline:mutation", min_length=1, description="Redis key prefix.")


def mutation_canaries(settings: MutationSettings) -> tuple[Canary, ...]:
    """The canaries `settings.path` names (CanaryFileError if unusable), else the built-in set."""
    if settings.path is not None:
        canaries = load_canaries(settings.path)
        log.info("output mutation: %d canary prompt(s) from %s", len(canaries), settings.path)
        return canaries
    return DEFAULT_CANARIES


def build_mutation_probes(
    settings: MutationSettings, redis_url: str, versions: ActiveVersions | None = None
) -> list[MutationProbe]:
    """One probe per configured region (none when disabled); CanaryFileError on a bad file,
    ValueError on a bad equivalence table."""
    if not settings.enabled:
        return []
    canaries = mutation_canaries(settings)
    for index, group in enumerate(settings.equivalents):
        if len(group) < 2 or not all(WORD.search(s) for s in group):
            raise ValueError(
                f"mutation.equivalents[{index}]: must list at least two spellings, each with a word"
            )
    return [
        MutationProbe(
            region,
            url,
            settings.models,
            canaries,
            settings.redis_url or redis_url,
            key_prefix=settings.key_prefix,
            equivalents=settings.equivalents,
            accept_after=settings.accept_after,
            short_answer_tokens=settings.short_answer_tokens,
            diff_label_chars=settings.diff_label_chars,
            interval_seconds=settings.interval_seconds,
            timeout_seconds=settings.timeout_seconds,
            versions=versions,
        )
        for region, url in settings.upstreams.items()
    ]


if TYPE_CHECKING:

    def _conforms(probe: MutationProbe) -> Probe:
        """mypy proves the class satisfies the scheduler's Probe protocol."""
        return probe
