"""`weights_resync`: re-sync a weights version's missing or damaged shards from a healthy region.

Target: the alert's `model` label (`ShardVerificationFailed`, labels `model` and
`model_version`): the newest verification of that version in the store the weights exporter
reads (`store`, this region: `region` in the sync tables) found a shard missing, truncated or
altered, so the version is refused and the last verified one serves.

Firing (every step re-reads the store first and does only what is missing):

- plan (read only): the version's newest verdict in `store`. Passed, and made of the manifest
  stored now (`manifest_sha256`): one read-only `check`. Else `resync`, then `reverify`.
- `resync`: `redline.platform.weights.sync.sync_weights` from each region of `sources` in
  order, for this version only, into `store` (the sync table `sync/<model>/<region>.json` in
  `store` updated). It copies only the shards whose copy differs from the manifest (by sha256),
  the manifest if missing, and the keyring's DEK records; a source whose own copy is damaged or
  missing is refused (`SyncError`): recorded, and the next region is tried. No region worked:
  the step fails naming each region's error.
- `reverify`: `verify_full` (every shard fetched, its DEK unwrapped by the HSM's KEK, decrypted,
  hashed; the whole file's sha256) and the verdict written beside the version, so the weights
  exporter clears `ShardVerificationFailed`. Problems left: the step fails listing them.
- verify: the newest verdict passed and matches the stored manifest.

Shadow mode runs the plan only (both changing steps are recorded as what they would do).

Options (`playbook_options.weights_resync`, `WeightsResync.Options`): `store` (the copy that
failed; None: the playbook is not configured and the receiver still starts, a job reaching it
fails naming the field), `region`, `sources` (healthy regions, tried in order), `pkcs11_module`,
`token_label`, `kek_label`, `pin_file`. The DEK retention verification honours is the spec's
`weights.dek_retention_days` (read at start-up, with the settings' profile). S3 credentials
come from the standard boto3 chain (environment, shared files, instance role; each store's
`profile`), the PIN from `pin_file`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from redline.core.settings import SettingsError, read_secret
from redline.platform.weights.errors import (
    KeyringError,
    KeyWrapError,
    ManifestError,
    RecordStoreError,
    StoreSettingsError,
    SyncError,
)
from redline.platform.weights.keyring import Keyring
from redline.platform.weights.keys import open_pkcs11_key_wrapper
from redline.platform.weights.s3store import S3RecordStore, open_s3_record_store
from redline.platform.weights.settings import (
    DEFAULT_PKCS11_MODULE,
    KeyringSettings,
    Pkcs11Settings,
    S3StoreSettings,
)
from redline.platform.weights.shards import (
    ShardManifest,
    VerificationReport,
    build_manifest_sha256,
    load_manifest,
    load_verdict,
    verify_full,
    write_verdict,
)
from redline.platform.weights.sync import Region, sync_weights
from redline.remediation.playbook import (
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookError,
    RegistryError,
    StepResult,
    TransientError,
)
from redline.remediation.settings import RemediationSettings
from redline.slo.load import SpecError, apply_profile, load_spec
from redline.slo.spec import Weights

NAME = "weights_resync"
VERSION_LABEL = "model_version"
_WHERE = f"playbook_options.{NAME}"
HSM_LOCK = threading.Lock()
"""PKCS#11 login is per process and token: the worker's threads, whichever weights playbook
they run, take turns (`weights_rotate` takes this lock too)."""


class WeightsResyncOptions(BaseModel):
    """`playbook_options.weights_resync`: the failed copy, the healthy ones and the KEK."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    store: S3StoreSettings | None = Field(
        None,
        description="The copy that failed: the bucket the weights exporter reads (None: the "
        "playbook is not configured).",
    )
    region: str = Field(
        "primary", min_length=1, description="This copy's region name in the sync tables."
    )
    sources: dict[str, S3StoreSettings] = Field(
        default_factory=dict,
        description="Healthy regions to copy from, region name -> its bucket, tried in order.",
    )
    pkcs11_module: Path = Field(
        DEFAULT_PKCS11_MODULE, description="PKCS#11 module (.so) of the HSM holding the KEK."
    )
    token_label: str | None = Field(None, min_length=1, description="Token holding the KEK.")
    kek_label: str | None = Field(None, min_length=1, description="Label of the AES KEK.")
    pin_file: Path | None = Field(None, description="File holding the token's user PIN.")

    @model_validator(mode="after")
    def _distinct(self) -> WeightsResyncOptions:
        if self.region in self.sources:
            raise ValueError(
                f"sources: {self.region!r} is this copy's region (region), not a source"
            )
        if self.store is not None:
            same = [
                name
                for name, source in self.sources.items()
                if (source.endpoint_url, source.bucket, source.prefix)
                == (self.store.endpoint_url, self.store.bucket, self.store.prefix)
            ]
            if same:
                raise ValueError(f"sources: {', '.join(same)} name the store's own bucket")
        return self


def load_weights_policy(settings: RemediationSettings) -> Weights:
    """The spec's `weights:` section (with the settings' profile); RegistryError naming the
    spec's problems."""
    try:
        return apply_profile(load_spec(settings.spec).spec, settings.profile).weights
    except SpecError as exc:
        raise RegistryError("playbooks: the spec: " + "; ".join(exc.problems)) from None


def verdict_passed(manifest: ShardManifest | None, verdict: VerificationReport | None) -> bool:
    """Whether the newest verdict passed and was made of the manifest stored now (pure)."""
    return (
        manifest is not None
        and verdict is not None
        and verdict.ok
        and verdict.manifest_sha256 == build_manifest_sha256(manifest)
    )


def build_resync_plan(
    verdict_ok: bool,
    model: str,
    version: str,
    region: str,
    sources: Sequence[str],
    problems: Sequence[str] = (),
) -> list[PlannedStep]:
    """A read-only `check` when the version's verdict passed; else `resync` from `sources` (in
    order) then `reverify` (pure)."""
    info: dict[str, Any] = {"model": model, "version": version, "region": region}
    if verdict_ok:
        return [
            PlannedStep(
                "check", f"{model} {version} in {region} already verified", info, read_only=True
            )
        ]
    return [
        PlannedStep(
            "resync",
            f"copy {model} {version}'s missing or damaged shards into {region} from the first "
            f"healthy of {', '.join(sources) or 'no source'}",
            {**info, "sources": list(sources), "problems": list(problems)},
        ),
        PlannedStep(
            "reverify",
            f"verify every shard of {model} {version} in {region} and record the verdict",
            info,
        ),
    ]


class WeightsResync(Playbook):
    """Re-sync a failed weights version from a healthy region, then verify it again."""

    name = NAME
    target_label = "model"
    Options = WeightsResyncOptions

    def __init__(self, options: WeightsResyncOptions, policy: Weights | None = None) -> None:
        self.options = options
        self.policy = policy or Weights()

    @classmethod
    def from_settings(cls, settings: RemediationSettings, options: WeightsResyncOptions) -> Self:
        """The playbook on its options and the spec's DEK retention (the stores are opened per
        step); RegistryError naming the spec's problems."""
        return cls(options, load_weights_policy(settings))

    def settings_problems(self) -> Sequence[str]:
        """Nothing while `store` is unset (a receiver without object storage starts); else
        each missing piece, named."""
        options = self.options
        if options.store is None:
            return []
        problems = []
        if not options.sources:
            problems.append(f"{_WHERE}.sources is empty (the healthy regions to copy from)")
        for field, what in (
            ("token_label", "the token holding the KEK"),
            ("kek_label", "the KEK that unwraps the DEKs"),
            ("pin_file", "the token's user PIN"),
        ):
            if getattr(options, field) is None:
                problems.append(f"{_WHERE}.{field} is not set ({what})")
        return problems

    # ---- helpers -----------------------------------------------------------------------------

    def _target(self, ctx: PlaybookContext) -> tuple[str, str]:
        if self.options.store is None:
            raise PlaybookError(
                f"{self.name}: not configured: set {_WHERE}.store (the bucket the weights "
                "exporter reads)"
            )
        problems = self.settings_problems()
        if problems:
            raise PlaybookError(f"{self.name}: not configured: {'; '.join(problems)}")
        model = ctx.labels[self.target_label].strip()
        version = ctx.labels.get(VERSION_LABEL, "").strip()
        if not version:
            raise PlaybookError(
                f"{self.name}: the alert has no {VERSION_LABEL!r} label "
                f"(labels: {', '.join(sorted(ctx.labels))})"
            )
        return model, version

    @contextmanager
    def _open(self, settings: S3StoreSettings, where: str) -> Iterator[S3RecordStore]:
        try:
            store = open_s3_record_store(settings)
        except StoreSettingsError as exc:
            raise PlaybookError(f"{self.name}: {where}: {exc}") from None
        try:
            yield store
        except RecordStoreError as exc:
            raise TransientError(f"{self.name}: {exc}") from exc
        finally:
            store.client.close()

    def _store(self) -> AbstractContextManager[S3RecordStore]:
        assert self.options.store is not None  # _target checked
        return self._open(self.options.store, f"{_WHERE}.store")

    def _pkcs11(self) -> Pkcs11Settings:
        options = self.options
        try:
            pin = read_secret(options.pin_file, None, f"{_WHERE}.pin_file")
        except SettingsError as exc:
            raise PlaybookError(f"{self.name}: {exc}") from None
        return Pkcs11Settings(
            module_path=options.pkcs11_module,
            token_label=options.token_label or "",
            kek_label=options.kek_label or "",
            pin=pin,
        )

    @staticmethod
    def _state(
        store: S3RecordStore, model: str, version: str
    ) -> tuple[ShardManifest | None, VerificationReport | None]:
        try:
            manifest: ShardManifest | None = load_manifest(store, model, version)
        except ManifestError:
            manifest = None  # missing here too: the re-sync copies it
        return manifest, load_verdict(store, model, version)

    # ---- firing ------------------------------------------------------------------------------

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """`check` when the newest verdict passed; else `resync` and `reverify`."""
        model, version = self._target(ctx)
        with self._store() as store:
            try:
                manifest, verdict = self._state(store, model, version)
            except ManifestError as exc:
                raise PlaybookError(f"{self.name}: {exc}") from None
        problems = verdict.problems if verdict is not None else ["never verified"]
        if manifest is None:
            problems = [f"no manifest of {model} {version} in {self.options.region}"]
        return build_resync_plan(
            verdict_passed(manifest, verdict),
            model,
            version,
            self.options.region,
            list(self.options.sources),
            problems,
        )

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Carry out `check`, `resync` or `reverify` (each reads the store first)."""
        model, version = self._target(ctx)
        if step.name == "check":
            return self.verify(ctx)
        if step.name == "resync":
            return self._resync(ctx, model, version)
        if step.name == "reverify":
            return self._reverify(model, version)
        return StepResult.failure(f"{self.name}: unknown step {step.name!r}")

    def _resync(self, ctx: PlaybookContext, model: str, version: str) -> StepResult:
        options = self.options
        assert options.store is not None
        errors: dict[str, str] = {}
        unreachable = False
        with self._store() as store:
            dest = Region(options.region, store, options.store.bucket)
            for name, settings in options.sources.items():
                ctx.ensure_lease()
                try:
                    with self._open(settings, f"{_WHERE}.sources.{name}") as source:
                        result = sync_weights(
                            Region(name, source, settings.bucket),
                            dest,
                            model,
                            table_store=store,
                            versions=[version],
                        )
                except (SyncError, ManifestError, PlaybookError, TransientError) as exc:
                    unreachable = unreachable or isinstance(exc, TransientError)
                    errors[name] = str(exc)
                    ctx.record("source_refused", f"{name}: {exc}", region=name, error=str(exc))
                    continue
                ctx.record(
                    "synced",
                    f"from {name}: {len(result.copied)} shard(s) copied, "
                    f"{len(result.present)} present",
                    region=name,
                    copied=result.copied,
                    manifests_copied=result.manifests_copied,
                    deks_copied=result.deks_copied,
                )
                return StepResult.success(
                    f"{model} {version}: {len(result.copied)} shard(s) copied from {name} into "
                    f"{options.region}",
                    source=name,
                    copied=result.copied,
                    refused=errors,
                )
        detail = f"{model} {version}: no healthy region to re-sync from: " + "; ".join(
            f"{name}: {error}" for name, error in errors.items()
        )
        if unreachable:
            raise TransientError(detail)
        return StepResult.failure(detail, refused=errors)

    def _reverify(self, model: str, version: str) -> StepResult:
        pkcs11 = self._pkcs11()
        with self._store() as store:
            try:
                manifest = load_manifest(store, model, version)
            except ManifestError as exc:
                return StepResult.failure(str(exc))
            keyring_settings = KeyringSettings(name=manifest.keyring)
            with HSM_LOCK:
                try:
                    with open_pkcs11_key_wrapper(pkcs11) as wrapper:
                        report = verify_full(
                            store,
                            Keyring(store, wrapper, keyring_settings, policy=self.policy),
                            manifest,
                        )
                except (KeyWrapError, KeyringError) as exc:
                    raise PlaybookError(f"{self.name}: {exc}") from None
            write_verdict(store, report)
        if not report.ok:
            return StepResult.failure(
                f"{model} {version} still fails verification: {'; '.join(report.problems)}",
                problems=report.problems,
            )
        return StepResult.success(
            f"{model} {version}: {len(report.checked)} shard(s) verified, verdict recorded",
            checked=len(report.checked),
            manifest_sha256=report.manifest_sha256,
        )

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """The newest verdict passed and matches the stored manifest."""
        model, version = self._target(ctx)
        with self._store() as store:
            try:
                manifest, verdict = self._state(store, model, version)
            except ManifestError as exc:
                return StepResult.failure(str(exc))
        if not verdict_passed(manifest, verdict):
            shown: Mapping[str, Any] = {} if verdict is None else {"problems": verdict.problems}
            return StepResult.failure(
                f"{model} {version} in {self.options.region}: no passed verdict of its manifest",
                **shown,
            )
        assert verdict is not None
        return StepResult.success(
            f"{model} {version} in {self.options.region} verified",
            verified_at=verdict.verified_at,
            manifest_sha256=verdict.manifest_sha256,
        )


__all__ = [
    "HSM_LOCK",
    "WeightsResync",
    "WeightsResyncOptions",
    "build_resync_plan",
    "load_weights_policy",
    "verdict_passed",
]
