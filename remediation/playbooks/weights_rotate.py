"""`weights_rotate`: rotate a keyring's DEK, and re-wrap its live DEKs under a new KEK.

Target: the alert's `keyring` label (`DEKRotationOverdue{cause="rotation"}`): the keyring's
current DEK is older than the spec's `weights.dek_rotation_hours`. (The `cause="retention"`
page has no playbook: shards under an expired DEK need re-encrypting, which a human decides.)

Firing (every step re-reads the keyring's records in `store` first and does only what is
missing):

- plan (read only, no HSM): the keyring's DEK records judged by the spec's `weights:` periods
  (`build_keyring_figures`); a keyring without any DEK in `store` is refused (the alert's label
  or the bucket is wrong: the playbook never starts a keyring). A current DEK younger than the
  rotation period, and every live DEK wrapped by the KEK in use: one read-only `check`. Else
  `rotate` when the current DEK is overdue (or none is current: all revoked), and `rewrap` when
  `new_kek_label` is set and a live DEK is still wrapped by another KEK.
- `rotate`: `Keyring.rotate` with the KEK in use (`new_kek_label`, else `kek_label`): a new DEK
  made locally, wrapped by the HSM's KEK, written with a conditional write (two workers rotating
  at once make one version); the older current DEK retires and keeps decrypting its shards for
  `weights.dek_retention_days`. Skipped when a concurrent rotation already made the current DEK
  young.
- `rewrap`: `Keyring.rewrap` from `kek_label` to `new_kek_label` (one login, both KEKs on the
  token): every DEK that still decrypts is unwrapped and wrapped again; expired and revoked ones
  stay as they are.
- verify: the current DEK is younger than the rotation period and unwraps with the KEK in use
  through the HSM; when re-wrapping, every live DEK is wrapped by the new KEK.

Shadow mode runs the plan only (`rotate` and `rewrap` are recorded as what they would do).

Options (`playbook_options.weights_rotate`, `WeightsRotate.Options`): `store` (the bucket holding
the keyring, the one the weights exporter reads; None: not configured, the receiver still starts
and a job reaching it fails naming the field), `pkcs11_module`, `token_label`, `kek_label`,
`new_kek_label`, `pin_file`. The PKCS#11 login shares `weights_resync`'s lock: one login per
process and token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from redline.core.settings import SettingsError, read_secret
from redline.platform.weights.errors import (
    KeyringError,
    KeyWrapError,
    RecordStoreError,
    StoreSettingsError,
)
from redline.platform.weights.keyring import (
    DekRecord,
    Keyring,
    build_dek_state,
    build_keyring_figures,
    load_dek_records,
)
from redline.platform.weights.keys import (
    Pkcs11KeyWrapper,
    open_pkcs11_key_wrapper,
    pkcs11_kek_id,
)
from redline.platform.weights.s3store import S3RecordStore, open_s3_record_store
from redline.platform.weights.settings import (
    DEFAULT_PKCS11_MODULE,
    KeyringSettings,
    Pkcs11Settings,
    S3StoreSettings,
)
from redline.remediation.playbook import (
    PlannedStep,
    Playbook,
    PlaybookContext,
    PlaybookError,
    StepResult,
    TransientError,
)
from redline.remediation.playbooks.weights import HSM_LOCK, load_weights_policy
from redline.remediation.settings import RemediationSettings
from redline.slo.spec import Weights

NAME = "weights_rotate"
_WHERE = f"playbook_options.{NAME}"


class WeightsRotateOptions(BaseModel):
    """`playbook_options.weights_rotate`: the keyring's bucket and the KEK (and a new one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    store: S3StoreSettings | None = Field(
        None,
        description="The bucket holding the keyrings: the one the weights exporter reads (None: "
        "the playbook is not configured).",
    )
    pkcs11_module: Path = Field(
        DEFAULT_PKCS11_MODULE, description="PKCS#11 module (.so) of the HSM holding the KEK."
    )
    token_label: str | None = Field(None, min_length=1, description="Token holding the KEK.")
    kek_label: str | None = Field(
        None, min_length=1, description="Label of the AES KEK wrapping the keyring's DEKs now."
    )
    new_kek_label: str | None = Field(
        None,
        min_length=1,
        description="A KEK on the same token to re-wrap every live DEK under (a KEK rotation); "
        "None: the DEKs stay under kek_label.",
    )
    pin_file: Path | None = Field(None, description="File holding the token's user PIN.")

    @model_validator(mode="after")
    def _new_kek_differs(self) -> WeightsRotateOptions:
        if self.new_kek_label is not None and self.new_kek_label == self.kek_label:
            raise ValueError(
                f"new_kek_label {self.new_kek_label!r} is kek_label: name the KEK to re-wrap "
                "under, or leave new_kek_label unset"
            )
        return self


def build_rotate_plan(
    keyring: str,
    records: Sequence[DekRecord],
    policy: Weights,
    now: float,
    kek_in_use: str,
    rewrapping: bool,
) -> list[PlannedStep]:
    """`rotate` when the current DEK is overdue (or missing), `rewrap` when re-wrapping and a
    live DEK is under another KEK; a read-only `check` when neither (pure)."""
    figures = build_keyring_figures(records, policy, now)
    age = figures.current_age_seconds
    info: dict[str, Any] = {
        "keyring": keyring,
        "current_version": figures.current_version,
        "age_seconds": age,
        "rotation_seconds": policy.rotation_seconds,
    }
    steps = []
    if age is None or age >= policy.rotation_seconds:
        shown = "no current DEK" if age is None else f"current DEK {age / 3600.0:.1f} h old"
        steps.append(
            PlannedStep(
                "rotate",
                f"rotate keyring {keyring!r} ({shown}, rotation every "
                f"{policy.dek_rotation_hours:g} h): a new DEK wrapped by {kek_in_use}",
                {**info, "kek": kek_in_use},
            )
        )
    stale = pending_rewrap(records, policy, now, kek_in_use) if rewrapping else []
    if stale:
        steps.append(
            PlannedStep(
                "rewrap",
                f"re-wrap DEK version(s) {', '.join(map(str, stale))} of keyring {keyring!r} "
                f"under {kek_in_use}",
                {**info, "kek": kek_in_use, "versions": stale},
            )
        )
    if steps:
        return steps
    return [
        PlannedStep(
            "check",
            f"keyring {keyring!r}: current DEK v{figures.current_version} within its rotation "
            f"period, wrapped by {kek_in_use}",
            info,
            read_only=True,
        )
    ]


def pending_rewrap(
    records: Sequence[DekRecord], policy: Weights, now: float, kek_in_use: str
) -> list[int]:
    """Versions that still decrypt and are wrapped by a KEK other than `kek_in_use` (pure)."""
    return [
        r.version
        for r in records
        if r.kek_id != kek_in_use and build_dek_state(r, policy, now) in ("current", "retired")
    ]


class WeightsRotate(Playbook):
    """Rotate an overdue DEK (and re-wrap the keyring under a new KEK), then verify it."""

    name = NAME
    target_label = "keyring"
    Options = WeightsRotateOptions

    def __init__(
        self,
        options: WeightsRotateOptions,
        policy: Weights | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.options = options
        self.policy = policy or Weights()
        self.clock = clock

    @classmethod
    def from_settings(cls, settings: RemediationSettings, options: WeightsRotateOptions) -> Self:
        """The playbook on its options and the spec's `weights:` periods (with the settings'
        profile); RegistryError naming the spec's problems."""
        return cls(options, load_weights_policy(settings))

    def settings_problems(self) -> Sequence[str]:
        """Nothing while `store` is unset (a receiver without object storage starts); else
        each missing piece of the KEK, named."""
        options = self.options
        if options.store is None:
            return []
        return [
            f"{_WHERE}.{field} is not set ({what})"
            for field, what in (
                ("token_label", "the token holding the KEK"),
                ("kek_label", "the KEK that wraps the DEKs"),
                ("pin_file", "the token's user PIN"),
            )
            if getattr(options, field) is None
        ]

    # ---- helpers -----------------------------------------------------------------------------

    def _target(self, ctx: PlaybookContext) -> str:
        if self.options.store is None:
            raise PlaybookError(
                f"{self.name}: not configured: set {_WHERE}.store (the bucket holding the "
                "keyrings, the one the weights exporter reads)"
            )
        problems = self.settings_problems()
        if problems:
            raise PlaybookError(f"{self.name}: not configured: {'; '.join(problems)}")
        keyring = ctx.labels[self.target_label].strip()
        try:
            KeyringSettings(name=keyring)
        except ValueError:
            raise PlaybookError(
                f"{self.name}: the alert's {self.target_label} label {keyring!r} is not a "
                "keyring name (letters, digits, '.', '_', '-')"
            ) from None
        return keyring

    @property
    def _kek_in_use(self) -> str:
        options = self.options
        kek = options.new_kek_label or options.kek_label or ""
        return pkcs11_kek_id(options.token_label or "", kek)

    @contextmanager
    def _store(self) -> Iterator[S3RecordStore]:
        assert self.options.store is not None  # _target checked
        try:
            store = open_s3_record_store(self.options.store)
        except StoreSettingsError as exc:
            raise PlaybookError(f"{self.name}: {_WHERE}.store: {exc}") from None
        try:
            yield store
        except RecordStoreError as exc:
            raise TransientError(f"{self.name}: {exc}") from exc
        finally:
            store.client.close()

    @contextmanager
    def _keyrings(self, store: S3RecordStore, name: str) -> Iterator[tuple[Keyring, Keyring]]:
        """The keyring under `kek_label` and under the KEK in use (the same one unless
        re-wrapping), on one PKCS#11 login held under the process's HSM lock."""
        options = self.options
        try:
            pin = read_secret(options.pin_file, None, f"{_WHERE}.pin_file")
        except SettingsError as exc:
            raise PlaybookError(f"{self.name}: {exc}") from None
        pkcs11 = Pkcs11Settings(
            module_path=options.pkcs11_module,
            token_label=options.token_label or "",
            kek_label=options.kek_label or "",
            pin=pin,
        )
        settings = KeyringSettings(name=name)
        with HSM_LOCK:
            try:
                with open_pkcs11_key_wrapper(pkcs11) as old:
                    new: Pkcs11KeyWrapper = old
                    if options.new_kek_label is not None:
                        new = old.with_kek(options.new_kek_label)
                    yield (
                        Keyring(store, old, settings, self.clock, self.policy),
                        Keyring(store, new, settings, self.clock, self.policy),
                    )
            except (KeyWrapError, KeyringError) as exc:
                raise PlaybookError(f"{self.name}: {_WHERE}: {exc}") from None

    # ---- firing ------------------------------------------------------------------------------

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """`check` when the DEK is in time and wrapped right; else `rotate` and/or `rewrap`."""
        keyring = self._target(ctx)
        with self._store() as store:
            records = load_dek_records(store, keyring)
        if not records:
            # Never start a keyring from an alert: the label or the bucket is wrong.
            assert self.options.store is not None
            raise PlaybookError(
                f"{self.name}: keyring {keyring!r} has no DEK in bucket "
                f"{self.options.store.bucket!r} ({_WHERE}.store: the bucket the weights exporter "
                "reads)"
            )
        return build_rotate_plan(
            keyring,
            records,
            self.policy,
            self.clock(),
            self._kek_in_use,
            self.options.new_kek_label is not None,
        )

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Carry out `check`, `rotate` or `rewrap` (each reads the records first)."""
        keyring = self._target(ctx)
        if step.name == "check":
            return self.verify(ctx)
        if step.name == "rotate":
            return self._rotate(ctx, keyring)
        if step.name == "rewrap":
            return self._rewrap(ctx, keyring)
        return StepResult.failure(f"{self.name}: unknown step {step.name!r}")

    def _rotate(self, ctx: PlaybookContext, name: str) -> StepResult:
        with self._store() as store, self._keyrings(store, name) as (_, keyring):
            now = self.clock()
            figures = keyring.figures(now=now)
            age = figures.current_age_seconds
            if age is not None and age < self.policy.rotation_seconds:
                # A concurrent run (or a rerun after a lost lease) rotated already.
                return StepResult.success(
                    f"keyring {name!r}: DEK v{figures.current_version} is {age:.0f} s old, "
                    "rotated already",
                    version=figures.current_version,
                )
            ctx.ensure_lease()
            created = keyring.rotate(now)
        ctx.record(
            "rotated",
            f"keyring {name!r}: DEK v{created.version} wrapped by {created.kek_id}",
            keyring=name,
            version=created.version,
            retired=figures.current_version,
            kek=created.kek_id,
        )
        return StepResult.success(
            f"keyring {name!r}: DEK v{created.version} made and wrapped by {created.kek_id}; "
            f"v{figures.current_version} retired, decrypting for "
            f"{self.policy.dek_retention_days:g} days",
            version=created.version,
            retired=figures.current_version,
        )

    def _rewrap(self, ctx: PlaybookContext, name: str) -> StepResult:
        kek = self._kek_in_use
        with self._store() as store, self._keyrings(store, name) as (old, new):
            stale = pending_rewrap(old.records(), self.policy, self.clock(), kek)
            if stale:
                ctx.ensure_lease()
                # Records already under the new KEK are skipped; any other KEK fails naming it.
                old.rewrap(new.wrapper)
        ctx.record("rewrapped", f"keyring {name!r}: {stale} under {kek}", versions=stale, kek=kek)
        return StepResult.success(
            f"keyring {name!r}: {len(stale)} DEK(s) re-wrapped under {kek}", versions=stale
        )

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """The current DEK is younger than the rotation period and unwraps with the KEK in use;
        when re-wrapping, every live DEK is wrapped by the new KEK."""
        name = self._target(ctx)
        kek = self._kek_in_use
        with self._store() as store:
            now = self.clock()
            records = load_dek_records(store, name)
            figures = build_keyring_figures(records, self.policy, now)
            age = figures.current_age_seconds
            if age is None or figures.current_version is None:
                return StepResult.failure(f"keyring {name!r} has no current DEK")
            if age >= self.policy.rotation_seconds:
                return StepResult.failure(
                    f"keyring {name!r}: current DEK v{figures.current_version} is "
                    f"{age / 3600.0:.1f} h old, past the {self.policy.dek_rotation_hours:g} h "
                    "rotation period (spec weights.dek_rotation_hours)"
                )
            stale = pending_rewrap(records, self.policy, now, kek)
            if self.options.new_kek_label is not None and stale:
                return StepResult.failure(
                    f"keyring {name!r}: DEK version(s) {stale} not wrapped by {kek}",
                    versions=stale,
                )
            with self._keyrings(store, name) as (_, keyring):
                keyring.dek_for_decrypt(figures.current_version, now)
        return StepResult.success(
            f"keyring {name!r}: DEK v{figures.current_version} {age:.0f} s old, unwraps with {kek}",
            version=figures.current_version,
            age_seconds=age,
            kek=kek,
        )


__all__ = [
    "WeightsRotate",
    "WeightsRotateOptions",
    "build_rotate_plan",
    "pending_rewrap",
]
