"""Model versions and checkpoints, read from the snapshot registry.

Publishes which snapshot each model serves (`model_active_info`), the baselines recorded when each
version was verified (what the two-signal rollback gate compares against), and the last successful
checkpoint of every LoRA adapter (against the adapter RPO). Reads JSON files only; hashes are not
recomputed here (that is the rollback playbook's and `redline snapshot verify`'s job).
"""

from __future__ import annotations

from collections.abc import Sequence

from redline.exporters.probe import MetricDef, Sample
from redline.platform.snapshots import SnapshotRegistry
from redline.slo import catalog

MODEL_METRICS = (
    MetricDef.of(catalog.MODEL_ACTIVE_INFO),
    MetricDef.of(catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS),
    MetricDef.of(catalog.MODEL_BASELINE_P99_SECONDS),
    MetricDef.of(catalog.MODEL_BASELINE_ACCURACY_RATIO),
)


class ModelVersionsProbe:
    """Active snapshot, verified baselines and adapter checkpoints from a SnapshotRegistry."""

    metrics: tuple[MetricDef, ...] = MODEL_METRICS

    def __init__(
        self,
        registry: SnapshotRegistry,
        models: Sequence[str] = (),
        interval_seconds: float = 15.0,
        max_versions: int = 10,
        name: str = "model_versions",
    ) -> None:
        if max_versions < 1:
            raise ValueError("max_versions must be at least 1")
        self.registry = registry
        self.models = tuple(models)
        self.interval_seconds = interval_seconds
        self.max_versions = max_versions
        self.name = name

    def run(self) -> list[Sample]:
        """Read the registry; a corrupt pointer or record raises (the probe reports failure)."""
        samples: list[Sample] = []
        for model in self.models or tuple(self.registry.models()):
            active = self.registry.active(model)
            if active is not None:
                samples.append(
                    Sample(
                        catalog.MODEL_ACTIVE_INFO.family,
                        1.0,
                        {
                            "model": model,
                            "version": active.version,
                            "weights_hash": active.weights_sha256,
                            "config_hash": active.config_sha256,
                        },
                    )
                )
            seen: set[str] = set()
            # Newest verified snapshot per version; the active one is always included.
            verified = [s for s in self.registry.list(model) if s.verified]
            if active is not None and active.verified:
                verified.insert(0, active)
            for snapshot in verified:
                if snapshot.version in seen or snapshot.baselines is None:
                    continue
                if len(seen) >= self.max_versions:
                    break
                seen.add(snapshot.version)
                labels = {"model": model, "model_version": snapshot.version}
                samples.append(
                    Sample(
                        catalog.MODEL_BASELINE_P99_SECONDS.family,
                        snapshot.baselines.p99_seconds,
                        labels,
                    )
                )
                samples.append(
                    Sample(
                        catalog.MODEL_BASELINE_ACCURACY_RATIO.family,
                        snapshot.baselines.accuracy_ratio,
                        labels,
                    )
                )
        for checkpoint in self.registry.checkpoints():
            samples.append(
                Sample(
                    catalog.MODEL_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS.family,
                    checkpoint.last_success,
                    {"adapter": checkpoint.adapter},
                )
            )
        return samples
