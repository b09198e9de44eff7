"""Encrypted weights on object storage, as series: DEK age and rotation, shards past their DEK's
retention, verification verdicts, per-region sync lag, and LoRA checkpoint age from object
versions.

The DEK rotation period and retention are the spec's (`weights.dek_rotation_hours`,
`weights.dek_retention_days`): the probe publishes that rotation period beside each keyring's
DEK age, so `DEKRotationOverdue` and the `weights_rotate` playbook judge by the same number.

It reads the source region's bucket only (records, manifests, verdicts, sync tables, object
versions) and never unwraps a DEK: monitoring needs no KEK and no HSM login. The checkpoint age
is published as `model_checkpoint_last_success_timestamp_seconds` (the newest object version's
`LastModified`), the series the file registry publishes too, so `LoRACheckpointRPOBreach` judges
either source; a checkpoint whose newest version is a delete marker is published as 0 (no
checkpoint: the RPO is breached).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from redline.exporters.probe import MetricDef, Sample
from redline.exporters.settings import WeightsSection
from redline.platform.weights.keyring import (
    KeyringFigures,
    build_keyring_figures,
    load_dek_records,
)
from redline.platform.weights.records import RecordStore
from redline.platform.weights.shards import (
    VerificationReport,
    list_versions,
    load_manifest,
    load_verdict,
)
from redline.platform.weights.sync import RegionLag, build_region_lag, load_sync_table
from redline.slo import catalog
from redline.slo.spec import Weights

if TYPE_CHECKING:  # boto3 is imported when a probe is built, not with the exporter's settings
    from redline.platform.weights.checkpoints import CheckpointAge

WEIGHTS_METRICS = tuple(
    MetricDef.of(metric)
    for metric in (
        catalog.WEIGHTS_DEK_AGE_SECONDS,
        catalog.WEIGHTS_DEK_ROTATION_SECONDS,
        catalog.WEIGHTS_DEK_SECONDS_TO_ROTATION,
        catalog.WEIGHTS_DEK_VERSIONS,
        catalog.WEIGHTS_SHARDS_PAST_RETENTION,
        catalog.WEIGHTS_SHARDS_FAILED_VERIFICATION,
        catalog.WEIGHTS_VERIFIED_TIMESTAMP_SECONDS,
        catalog.WEIGHTS_SYNC_LAG_SECONDS,
        catalog.WEIGHTS_SYNC_SHARDS_MISSING,
        catalog.WEIGHTS_SYNC_SHARDS_EXPECTED,
        catalog.WEIGHTS_SYNC_VERSIONS_MISSING,
        catalog.WEIGHTS_SYNC_LAST_TIMESTAMP_SECONDS,
        catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS,
    )
)


@dataclass(frozen=True)
class WeightsFigures:
    """What the probe read at one moment, before it becomes samples."""

    now: float
    policy: Weights = field(default_factory=Weights)
    """The spec's DEK rotation and retention the keyring figures were judged by."""
    keyrings: dict[str, KeyringFigures] = field(default_factory=dict)
    verdicts: dict[tuple[str, str], VerificationReport] = field(default_factory=dict)
    """(model, version) -> its newest verification report (unverified versions left out)."""
    lags: dict[str, dict[str, RegionLag]] = field(default_factory=dict)
    """model -> region -> how far the region is behind."""
    checkpoints: dict[str, CheckpointAge] = field(default_factory=dict)


def fetch_weights_figures(
    store: RecordStore,
    settings: WeightsSection,
    now: float,
    policy: Weights,
    checkpoint_ages: Callable[[], dict[str, CheckpointAge]] | None = None,
) -> WeightsFigures:
    """Read keyrings (judged by the spec's `policy`), verdicts, sync tables and (with
    `checkpoint_ages`) checkpoint versions."""
    # Distinct shard objects per keyring: versions share the shards they did not change.
    shards: dict[str, dict[str, int]] = {k.name: {} for k in settings.keyrings}
    verdicts: dict[tuple[str, str], VerificationReport] = {}
    lags: dict[str, dict[str, RegionLag]] = {}
    for model in settings.models:
        manifests = [load_manifest(store, model, v) for v in list_versions(store, model)]
        for manifest in manifests:
            found = shards.setdefault(manifest.keyring, {})
            found.update({e.shard_id: e.key_version for e in manifest.shards})
            report = load_verdict(store, model, manifest.version)
            if report is not None:
                verdicts[(model, manifest.version)] = report
        tables = {region: load_sync_table(store, model, region) for region in settings.regions}
        lags[model] = build_region_lag(manifests, tables, now)
    keyrings = {
        k.name: build_keyring_figures(
            load_dek_records(store, k.name), policy, now, shards[k.name].values()
        )
        for k in settings.keyrings
    }
    checkpoints = checkpoint_ages() if checkpoint_ages is not None else {}
    return WeightsFigures(now, policy, keyrings, verdicts, lags, checkpoints)


def build_weights_samples(figures: WeightsFigures, adapters: Sequence[str] = ()) -> list[Sample]:
    """The series of the figures; an expected adapter without a checkpoint is published as 0."""
    samples: list[Sample] = []

    def add(metric: catalog.Metric, value: float, **labels: str) -> None:
        samples.append(Sample(metric.family, value, labels))

    for name, keys in sorted(figures.keyrings.items()):
        add(catalog.WEIGHTS_DEK_ROTATION_SECONDS, figures.policy.rotation_seconds, keyring=name)
        if keys.current_age_seconds is not None:
            add(catalog.WEIGHTS_DEK_AGE_SECONDS, keys.current_age_seconds, keyring=name)
        if keys.seconds_to_rotation is not None:
            add(catalog.WEIGHTS_DEK_SECONDS_TO_ROTATION, keys.seconds_to_rotation, keyring=name)
        for state, versions in sorted(keys.versions_by_state.items()):
            add(catalog.WEIGHTS_DEK_VERSIONS, len(versions), keyring=name, state=state)
        add(catalog.WEIGHTS_SHARDS_PAST_RETENTION, keys.shards_past_retention, keyring=name)
    for (model, version), report in sorted(figures.verdicts.items()):
        labels = {catalog.LABEL_MODEL: model, catalog.LABEL_MODEL_VERSION: version}
        add(catalog.WEIGHTS_SHARDS_FAILED_VERIFICATION, len(report.problems), **labels)
        add(catalog.WEIGHTS_VERIFIED_TIMESTAMP_SECONDS, report.verified_at, **labels)
    for model, regions in sorted(figures.lags.items()):
        for region, lag in sorted(regions.items()):
            labels = {catalog.LABEL_MODEL: model, catalog.LABEL_REGION: region}
            add(catalog.WEIGHTS_SYNC_LAG_SECONDS, lag.lag_seconds, **labels)
            add(catalog.WEIGHTS_SYNC_SHARDS_MISSING, lag.shards_missing, **labels)
            add(catalog.WEIGHTS_SYNC_SHARDS_EXPECTED, lag.shards_expected, **labels)
            add(catalog.WEIGHTS_SYNC_VERSIONS_MISSING, len(lag.versions_missing), **labels)
            if lag.last_sync_age_seconds is not None:
                last = figures.now - lag.last_sync_age_seconds
                add(catalog.WEIGHTS_SYNC_LAST_TIMESTAMP_SECONDS, last, **labels)
    checkpoint = catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS
    for adapter in sorted(set(adapters) | set(figures.checkpoints)):
        found = figures.checkpoints.get(adapter)
        stamp = 0.0 if found is None or found.deleted else found.last_modified
        add(checkpoint, stamp, adapter=adapter)
    return samples


class WeightsProbe:
    """The weights series from one bucket (see the module's docstring)."""

    metrics: tuple[MetricDef, ...] = WEIGHTS_METRICS

    def __init__(
        self,
        settings: WeightsSection,
        policy: Weights,
        store: RecordStore | None = None,
        clock: Callable[[], float] = time.time,
        name: str = "weights",
    ) -> None:
        if store is None and settings.store is None:
            raise ValueError("weights.store is required when weights.enabled is true")
        self.settings = settings
        self.policy = policy
        self.store = store
        self.clock = clock
        self.interval_seconds = settings.interval_seconds
        self.name = name

    def _open(self) -> RecordStore:
        # Opened on the first run, not at start-up: a bucket that is down fails the probe, not
        # the exporter (versioning and Object Lock are checked on opening).
        from redline.platform.weights.s3store import open_s3_record_store

        if self.store is None:
            assert self.settings.store is not None
            self.store = open_s3_record_store(self.settings.store)
        return self.store

    def run(self) -> list[Sample]:
        """Read the bucket; an unreachable bucket or a corrupt record raises (probe failed)."""
        from redline.platform.weights.checkpoints import fetch_checkpoint_ages
        from redline.platform.weights.s3store import S3RecordStore

        store = self._open()
        now = self.clock()
        ages: Callable[[], dict[str, CheckpointAge]] | None = None
        if self.settings.checkpoints and isinstance(store, S3RecordStore):
            wanted = self.settings.adapters or None
            ages = lambda: fetch_checkpoint_ages(store, wanted, now)  # noqa: E731
        figures = fetch_weights_figures(store, self.settings, now, self.policy, ages)
        return build_weights_samples(figures, self.settings.adapters)


__all__ = [
    "WEIGHTS_METRICS",
    "WeightsFigures",
    "WeightsProbe",
    "build_weights_samples",
    "fetch_weights_figures",
]
