"""Where registries come from: the built-in factory and loading a factory by `module:function`.

`build_registry(settings)` is the default factory: it registers the built-in playbooks
(`semantic_rollback`, `freeze_writes`, `delta_log_replay`, `freeze_and_replay`, `reroute`,
`spot_drain`, `rollback_candidate`),
constructed from the settings sections `serving`, `rollback`, `vector_index` and `reroute` (and
the spec, for the reroute's restore limits). A playbook whose section is not configured is still
registered; `redline remediation` refuses to start while an enabled one (mode act or shadow)
reports a missing setting (`Playbook.settings_problems`), naming the field. A deployment or a
test names another factory with the `playbooks` setting
(`--playbooks`, `REDLINE_PLAYBOOKS`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

from redline.remediation.playbook import PlaybookRegistry, RegistryError
from redline.remediation.playbooks import (
    DeltaLogReplay,
    FreezeAndReplay,
    FreezeWrites,
    Reroute,
    RollbackCandidate,
    SemanticRollback,
    SpotDrain,
)
from redline.remediation.settings import RemediationSettings
from redline.slo.load import SpecError, apply_profile, load_spec

RegistryFactory = Callable[[RemediationSettings], PlaybookRegistry]


def build_registry(settings: RemediationSettings) -> PlaybookRegistry:
    """The built-in playbooks, wired to their dependencies from `settings`."""
    state = f"{settings.key_prefix}:playbook"
    retention = settings.retention_seconds
    index = settings.vector_index
    try:
        spec = apply_profile(load_spec(settings.spec).spec, settings.profile)
    except SpecError as exc:
        raise RegistryError("playbooks: the spec: " + "; ".join(exc.problems)) from None
    return PlaybookRegistry(
        [
            SemanticRollback(settings.rollback, settings.serving, state, retention),
            FreezeWrites(index, settings.redis_url, state, retention),
            DeltaLogReplay(index, settings.redis_url, state, retention),
            FreezeAndReplay(index, settings.redis_url, state, retention),
            Reroute(settings.reroute, settings.serving, settings.redis_url, spec),
            SpotDrain(
                settings.playbook_options.get("spot_drain", {}),
                settings.serving,
                settings.redis_url,
                settings.spec,
                settings.profile,
            ),
            RollbackCandidate(state, retention),
        ]
    )


def load_registry(reference: str, settings: RemediationSettings) -> PlaybookRegistry:
    """Import `module:function`, call it with `settings`; RegistryError with the reason."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise RegistryError(f"playbooks: {reference!r} is not of the form module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RegistryError(f"playbooks: cannot import {module_name}: {exc}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise RegistryError(f"playbooks: {module_name} has no function {attribute}")
    registry = cast(RegistryFactory, factory)(settings)
    if not isinstance(registry, PlaybookRegistry):
        raise RegistryError(f"playbooks: {reference} returned {type(registry).__name__}")
    return registry
