"""Cross-region semantic consistency: the same canary prompts on the primary and each backup.

`ConsistencyProbe` (one per model) asks every canary prompt deterministically (temperature 0, a
fixed `max_tokens`; `redline.platform.golden.build_golden_request`) of the primary region's
upstream (the spec's first region) and of every other configured region's, then publishes per
model and backup region:

- `llm_cross_region_output_agreement_ratio`: the share of prompts whose answers have the same
  hash after normalisation (`golden.normalize`: case, accents, punctuation, spacing ignored);
- `llm_cross_region_embedding_similarity`: the mean cosine similarity of the two answers'
  embeddings, and `llm_cross_region_embedding_similarity_min` the lowest one.

Embeddings come from the user's OpenAI-compatible `POST /v1/embeddings` when
`consistency.embeddings.url` is set (both answers of every prompt in one request), else from
`golden.embed`: a deterministic feature-hashing embedding of character n-grams, which measures
surface overlap, not meaning (an identical answer scores 1.0, a changed one clearly less; a
paraphrase scores low too). The report's maturity level 2 holds the mean to the spec's
`maturity.semantic_similarity_min` (0.97).

Canary prompts: the user's file (`prompts_path`: a golden-set JSONL file, whose prompts are
used, or plain text, one prompt a line, `#` comments), else the 12 built-in golden prompts, which
the local stack's simulator answers. A region that does not answer fails the run (the cache then
drops the gauges: unknown, not zero).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, SecretStr

from redline.exporters.probe import MetricDef, Probe, Sample
from redline.platform.golden import (
    GOLDEN_SET,
    GoldenFetchError,
    GoldenPrompt,
    GoldenSetError,
    cosine,
    embed,
    fetch_golden_answer,
    load_golden_set,
    normalize,
)
from redline.slo import catalog

log = logging.getLogger(__name__)

CONSISTENCY_METRICS = (
    MetricDef.of(catalog.LLM_CROSS_REGION_OUTPUT_AGREEMENT_RATIO),
    MetricDef.of(catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY),
    MetricDef.of(catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY_MIN),
)
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]+")

Vector = npt.NDArray[np.float64]


class ConsistencyError(Exception):
    """A consistency run could not complete (a region or the embedding endpoint failed)."""


class EmbeddingEndpointSettings(BaseModel):
    """The user's OpenAI-compatible embedding endpoint (unset url: the local embedding)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = Field(
        None, description="Base URL of an OpenAI-compatible API (POST {url}/v1/embeddings)."
    )
    model: str = Field("text-embedding-3-small", description="Embedding model to ask for.")
    api_key: SecretStr | None = Field(None, description="Bearer token (from env only).")
    api_key_file: Path | None = Field(None, description="File holding the bearer token.")
    timeout_seconds: PositiveFloat = Field(10.0, description="HTTP timeout of one request.")


class ConsistencySettings(BaseModel):
    """Settings of the cross-region consistency probes (embed in the exporter's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        False,
        description="Run the probes (they send every canary prompt to every region each run).",
    )
    interval_seconds: PositiveFloat = Field(60.0, description="Seconds between two runs.")
    timeout_seconds: PositiveFloat = Field(10.0, description="HTTP timeout of each prompt.")
    upstreams: dict[str, str] = Field(
        default_factory=dict,
        description="Region -> upstream base URL; empty: endpoints.upstreams. The spec's first "
        "region is the primary, every other one listed a backup compared with it.",
    )
    models: tuple[str, ...] = Field(("redline-base",), description="Models to compare.")
    max_tokens: PositiveInt = Field(32, description="max_tokens of each canary request.")
    prompts_path: Path | None = Field(
        None,
        description="Canary prompts: a golden-set .jsonl file (its prompts) or a text file, one "
        "prompt a line; unset: the 12 built-in golden prompts (the local stack's).",
    )
    embeddings: EmbeddingEndpointSettings = Field(default_factory=EmbeddingEndpointSettings)


@dataclass(frozen=True)
class PairFigures:
    """How one backup's answers compare with the primary's over the canary prompts."""

    prompts: int
    agreement_ratio: float
    similarity_mean: float
    similarity_min: float


def answer_hash(text: str) -> str:
    """SHA-256 of the normalised answer (case, accents, punctuation, spacing ignored)."""
    return hashlib.sha256(normalize(text).encode()).hexdigest()


def compare_answers(
    primary: Sequence[str],
    backup: Sequence[str],
    primary_vectors: Sequence[Vector] | None = None,
    backup_vectors: Sequence[Vector] | None = None,
) -> PairFigures:
    """Hash agreement and embedding similarity of two regions' answers to the same prompts.

    Without vectors the local embedding (`golden.embed`) is used; identical normalised answers
    score 1.0 either way (a remote model's float noise must not cost the bar).
    """
    if len(primary) != len(backup) or not primary:
        raise ValueError(
            f"need the same non-zero number of answers, got {len(primary)} and {len(backup)}"
        )
    if (primary_vectors is None) != (backup_vectors is None):
        raise ValueError("give the embeddings of both regions' answers or of neither")
    equal = [answer_hash(a) == answer_hash(b) for a, b in zip(primary, backup, strict=True)]
    scores: list[float] = []
    for i, same in enumerate(equal):
        if same:
            scores.append(1.0)
        elif primary_vectors is not None and backup_vectors is not None:
            scores.append(cosine(primary_vectors[i], backup_vectors[i]))
        else:
            scores.append(cosine(embed(primary[i]), embed(backup[i])))
    return PairFigures(
        prompts=len(equal),
        agreement_ratio=sum(equal) / len(equal),
        similarity_mean=math.fsum(scores) / len(scores),
        similarity_min=min(scores),
    )


def load_canary_prompts(path: Path) -> tuple[GoldenPrompt, ...]:
    """Canary prompts from a golden-set JSONL file or a text file (one a line, `#` comments)."""
    if path.suffix == ".jsonl":
        return load_golden_set(path)
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GoldenSetError([f"{path}: cannot read the canary prompts: {exc}"]) from None
    lines = [line.strip() for line in text.splitlines()]
    prompts = [line for line in lines if line and not line.startswith("#")]
    if not prompts:
        raise GoldenSetError([f"{path}: no canary prompts (write one prompt a line)"])
    return tuple(GoldenPrompt(f"canary-{i}", p, "") for i, p in enumerate(prompts, start=1))


class EmbeddingClient:
    """`POST {url}/v1/embeddings` of an OpenAI-compatible API: texts in, vectors out."""

    def __init__(self, settings: EmbeddingEndpointSettings, api_key: str | None = None) -> None:
        if settings.url is None:
            raise ValueError("consistency.embeddings.url is not set")
        self.url = settings.url.rstrip("/") + "/v1/embeddings"
        self.model = settings.model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            timeout=settings.timeout_seconds, trust_env=False, headers=headers
        )

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """One vector per text, in order; ConsistencyError on any failure or malformed body."""
        try:
            response = self._client.post(self.url, json={"model": self.model, "input": list(texts)})
        except httpx.HTTPError as exc:
            raise ConsistencyError(f"{self.url}: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise ConsistencyError(
                f"{self.url}: HTTP {response.status_code}: {response.text[:200]}"
            )
        try:
            data = response.json()["data"]
            # OpenAI returns items with an `index`; order by it rather than trust the list order.
            items = sorted(data, key=lambda item: int(item.get("index", 0)))
            vectors = [np.asarray(item["embedding"], dtype=np.float64) for item in items]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConsistencyError(f"{self.url}: malformed embeddings: {exc!r}") from None
        if len(vectors) != len(texts) or any(v.ndim != 1 or not v.size for v in vectors):
            raise ConsistencyError(
                f"{self.url}: asked for {len(texts)} embeddings, got {len(vectors)} usable"
            )
        return vectors

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()


class ConsistencyProbe:
    """The canary prompts on the primary and every backup region, for one model."""

    writes_canaries = True
    """Canary prompts to every region: with exporter replicas, the canary lease holder's only."""

    def __init__(
        self,
        model: str,
        primary: tuple[str, str],
        backups: Sequence[tuple[str, str]],
        items: Sequence[GoldenPrompt] = GOLDEN_SET,
        interval_seconds: float = 60.0,
        timeout_seconds: float = 10.0,
        max_tokens: int = 32,
        embeddings: EmbeddingClient | None = None,
    ) -> None:
        if not items:
            raise ValueError("no canary prompts")
        if not backups:
            raise ValueError("the consistency probe needs at least one backup region")
        self.model = model
        self.primary = (primary[0], primary[1].rstrip("/"))
        self.backups = tuple((region, url.rstrip("/")) for region, url in backups)
        self.items = tuple(items)
        self.max_tokens = max_tokens
        self.name = f"llm_consistency_{_UNSAFE.sub('_', model)}"
        self.interval_seconds = interval_seconds
        self.metrics: tuple[MetricDef, ...] = CONSISTENCY_METRICS
        self.embeddings = embeddings
        self.last: dict[str, PairFigures] = {}
        self._client = httpx.Client(timeout=timeout_seconds, trust_env=False)

    def _answers(self, region: str, url: str) -> list[str]:
        answers = []
        for item in self.items:
            try:
                got = fetch_golden_answer(self._client, url, self.model, item, self.max_tokens)
            except GoldenFetchError as exc:
                raise ConsistencyError(f"{self.model} on {region}: {item.id}: {exc}") from None
            answers.append(got.answer)
        return answers

    def _vectors(self, answers: Sequence[str]) -> list[Vector] | None:
        return None if self.embeddings is None else self.embeddings.embed(answers)

    def run(self) -> list[Sample]:
        """Ask every region, compare each backup with the primary; raise if a region fails."""
        primary = self._answers(*self.primary)
        primary_vectors = self._vectors(primary)
        samples: list[Sample] = []
        figures: dict[str, PairFigures] = {}
        for region, url in self.backups:
            backup = self._answers(region, url)
            pair = compare_answers(primary, backup, primary_vectors, self._vectors(backup))
            figures[region] = pair
            labels = {catalog.LABEL_MODEL: self.model, catalog.LABEL_REGION: region}
            samples += [
                Sample(
                    catalog.LLM_CROSS_REGION_OUTPUT_AGREEMENT_RATIO.family,
                    pair.agreement_ratio,
                    labels,
                ),
                Sample(
                    catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY.family,
                    pair.similarity_mean,
                    labels,
                ),
                Sample(
                    catalog.LLM_CROSS_REGION_EMBEDDING_SIMILARITY_MIN.family,
                    pair.similarity_min,
                    labels,
                ),
            ]
        self.last = figures
        return samples

    def close(self) -> None:
        """Close the HTTP clients."""
        self._client.close()
        if self.embeddings is not None:
            self.embeddings.close()


def canary_items(settings: ConsistencySettings) -> tuple[GoldenPrompt, ...]:
    """The prompts `settings.prompts_path` names (GoldenSetError if unusable), else built-in."""
    if settings.prompts_path is not None:
        return load_canary_prompts(settings.prompts_path)
    return GOLDEN_SET


def build_consistency_probes(
    settings: ConsistencySettings,
    regions: Sequence[str],
    fallback_upstreams: dict[str, str],
    api_key: str | None = None,
) -> list[ConsistencyProbe]:
    """One probe per model when enabled; `regions` in failover order (the first is primary).

    ValueError when the primary or every backup lacks an upstream; GoldenSetError when the
    prompts file is unusable.
    """
    if not settings.enabled:
        return []
    upstreams = settings.upstreams or fallback_upstreams
    unknown = sorted(set(upstreams) - set(regions))
    if unknown:
        raise ValueError(
            f"consistency.upstreams: regions {', '.join(unknown)} are not in the spec's regions "
            f"({', '.join(regions)})"
        )
    primary = regions[0]
    if primary not in upstreams:
        raise ValueError(
            f"consistency: no upstream for the primary region {primary!r} (set "
            "consistency.upstreams or endpoints.upstreams)"
        )
    backups = [(region, upstreams[region]) for region in regions[1:] if region in upstreams]
    if not backups:
        raise ValueError("consistency: no upstream for any backup region to compare with")
    items = canary_items(settings)
    probes = []
    for model in settings.models:
        embeddings = (
            EmbeddingClient(settings.embeddings, api_key)
            if settings.embeddings.url is not None
            else None
        )
        probes.append(
            ConsistencyProbe(
                model,
                (primary, upstreams[primary]),
                backups,
                items=items,
                interval_seconds=settings.interval_seconds,
                timeout_seconds=settings.timeout_seconds,
                max_tokens=settings.max_tokens,
                embeddings=embeddings,
            )
        )
    return probes


if TYPE_CHECKING:

    def _conforms(probe: ConsistencyProbe) -> Probe:
        """mypy proves the class satisfies the scheduler's Probe protocol."""
        return probe
