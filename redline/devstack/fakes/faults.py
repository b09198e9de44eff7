"""The fault knobs of one simulated region (`GET`/`POST /admin/faults`): added latency (base +
uniform or lognormal jitter), error rate and status, outage, first-byte delay, generation speed,
and per model version an added latency and a wrong-answer probability."""

from __future__ import annotations

import math
import random
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

VERSION = re.compile(r"^[\x21-\x7e]{1,128}$")
"""A model version: 1-128 visible ASCII characters."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LatencyDistribution(_Strict):
    """Added latency: `base_seconds` plus jitter drawn from the chosen distribution."""

    base_seconds: float = Field(0.0, ge=0, le=600, description="Constant added latency.")
    jitter: Literal["none", "uniform", "lognormal"] = Field(
        "none", description="none; uniform: U(0, jitter_seconds); lognormal: median jitter_seconds."
    )
    jitter_seconds: float = Field(0.0, ge=0, le=600, description="Scale of the jitter.")
    sigma: float = Field(0.5, gt=0, le=5, description="Shape of the lognormal jitter.")

    def sample(self, rng: random.Random) -> float:
        """One draw of the added latency in seconds (capped at 600 s)."""
        if self.jitter == "uniform":
            jitter = rng.uniform(0.0, self.jitter_seconds)
        elif self.jitter == "lognormal" and self.jitter_seconds > 0:
            jitter = rng.lognormvariate(math.log(self.jitter_seconds), self.sigma)
        else:
            jitter = 0.0
        return min(600.0, self.base_seconds + jitter)


class VersionFaults(_Strict):
    """Faults of one model version (an adapter version, or the base model's version)."""

    wrong_answer_probability: float = Field(
        0.0, ge=0, le=1, description="Chance that a golden prompt gets a wrong answer."
    )
    latency: LatencyDistribution = Field(
        default_factory=LatencyDistribution, description="Latency added on top of the region's."
    )


class Faults(_Strict):
    """Every fault knob of one simulated region; the defaults inject nothing."""

    latency: LatencyDistribution = Field(
        default_factory=LatencyDistribution, description="Latency added to every request."
    )
    error_rate: float = Field(0.0, ge=0, le=1, description="Share of requests answered with 5xx.")
    error_status: int = Field(500, ge=500, le=599, description="Status of injected errors.")
    outage: Literal["none", "unavailable", "hang"] = Field(
        "none", description="unavailable: 503 everywhere; hang: no answer until the client quits."
    )
    hang_max_seconds: float = Field(300, gt=0, le=3600, description="Longest a hang lasts.")
    first_byte_delay_seconds: float = Field(
        0.0, ge=0, le=600, description="Extra wait before the response's first byte."
    )
    tokens_per_second: float | None = Field(
        None, gt=0, le=1_000_000, description="Generation speed; None generates instantly."
    )
    max_concurrency: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="The running batch's limit (vLLM's --max-num-seqs): a request beyond it "
        "waits, first come first served, and the engine's queue gauges and queue-time "
        "histogram show it; None: unlimited.",
    )
    versions: dict[str, VersionFaults] = Field(
        default_factory=dict, description="Faults per model version (x-redline-model-version)."
    )

    @field_validator("versions")
    @classmethod
    def _version_names(cls, value: dict[str, VersionFaults]) -> dict[str, VersionFaults]:
        for version in value:
            if not VERSION.match(version):
                raise ValueError(f"version {version!r} must be 1-128 visible ASCII characters")
        return value
