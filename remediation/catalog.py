"""Where the playbooks come from: the built-in classes, the `redline.playbooks` entry points, the
settings' `playbook_classes`, the default factory and loading a factory by `module:function`.

`BUILTIN_PLAYBOOKS` lists the built-in classes (`semantic_rollback`, `freeze_writes`,
`delta_log_replay`, `freeze_and_replay`, `reroute`, `spot_drain`, `rollback_candidate`,
`gpu_node_failure`, `weights_resync`, `weights_rotate`).
`load_playbook_classes(references)` adds to them every installed entry point of the group
`redline.playbooks` (each entry a `Playbook` subclass, named like its playbook) and every
`module:ClassName` reference of the `playbook_classes` setting: that `PlaybookClasses` is the
one list of playbooks, and the spec's playbook names are checked against it.

`open_registry(settings)` is the default factory: it builds every one of those classes with
`from_settings(settings, options)`, `options` being its `playbook_options.<name>` validated
against its `Options`. A playbook whose section is not configured is still registered;
`redline remediation` refuses to start while an enabled one (mode act or shadow) reports a
missing setting (`Playbook.settings_problems`) or options that do not validate, naming the
field. A deployment or a test names another factory with the `playbooks` setting
(`--playbooks`, `REDLINE_PLAYBOOKS`); such a factory decides its playbooks itself (it may call
`open_registry` and register more).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import cast

from redline.remediation.playbook import (
    ENTRY_POINT_GROUP,
    MisconfiguredPlaybook,
    OptionsError,
    Playbook,
    PlaybookClasses,
    PlaybookRegistry,
    RegistryError,
    build_options,
)
from redline.remediation.playbooks import (
    DeltaLogReplay,
    FreezeAndReplay,
    FreezeWrites,
    GpuNodeFailure,
    Reroute,
    RollbackCandidate,
    SemanticRollback,
    SpotDrain,
    WeightsResync,
    WeightsRotate,
)
from redline.remediation.settings import RemediationSettings

RegistryFactory = Callable[[RemediationSettings], PlaybookRegistry]

BUILTIN_PLAYBOOKS: tuple[type[Playbook], ...] = (
    SemanticRollback,
    FreezeWrites,
    DeltaLogReplay,
    FreezeAndReplay,
    Reroute,
    SpotDrain,
    RollbackCandidate,
    GpuNodeFailure,
    WeightsResync,
    WeightsRotate,
)
"""The built-in playbook classes, in registration order."""


def builtin_playbook_names() -> tuple[str, ...]:
    """The built-in playbooks' names, in registration order."""
    return tuple(playbook.name for playbook in BUILTIN_PLAYBOOKS)


def _builtin_origin(playbook: type[Playbook]) -> str:
    return f"built-in {playbook.__module__}:{playbook.__qualname__}"


def _entry_point_origin(entry: EntryPoint) -> str:
    dist = entry.dist
    source = f" (distribution {dist.name} {dist.version})" if dist is not None else ""
    return f"entry point {ENTRY_POINT_GROUP}:{entry.name} = {entry.value}{source}"


def _load_entry_point(entry: EntryPoint) -> object:
    origin = _entry_point_origin(entry)
    try:
        loaded = entry.load()
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"{origin}: cannot load: {exc}") from None
    name = getattr(loaded, "name", None)
    if isinstance(name, str) and name != entry.name:
        # The entry's name is what a reader of the distribution's metadata sees; a class
        # registered under another name would make the spec's names impossible to trace.
        raise RegistryError(
            f"{origin}: the class's playbook name is {name!r}; name the entry point {name!r}"
        )
    return loaded


def _load_reference(reference: str, where: str) -> object:
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise RegistryError(f"{where}: {reference!r} is not of the form module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RegistryError(f"{where}: cannot import {module_name}: {exc}") from None
    found: object = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise RegistryError(f"{where}: {module_name} has no {attribute}")
    return found


def load_playbook_classes(
    references: Sequence[str] = (), entries: Iterable[EntryPoint] | None = None
) -> PlaybookClasses:
    """The built-in classes, then the installed `redline.playbooks` entry points (or `entries`),
    then `references` (`module:ClassName`, the `playbook_classes` setting); RegistryError
    naming the entry point or `playbook_classes[i]` that cannot be loaded or registered."""
    classes = PlaybookClasses(
        (playbook, _builtin_origin(playbook)) for playbook in BUILTIN_PLAYBOOKS
    )
    found = entry_points(group=ENTRY_POINT_GROUP) if entries is None else entries
    for entry in sorted(found, key=lambda item: item.name):
        classes.add(_load_entry_point(entry), _entry_point_origin(entry))
    for index, reference in enumerate(references):
        where = f"playbook_classes[{index}] ({reference})"
        classes.add(_load_reference(reference, where), where)
    return classes


def load_playbooks(classes: PlaybookClasses, settings: RemediationSettings) -> PlaybookRegistry:
    """Every class of `classes` built with `from_settings` and its validated
    `playbook_options.<name>`; a class whose options do not validate is registered as a
    `MisconfiguredPlaybook` naming each bad field, and options for no registered playbook are
    the registry's problems."""
    playbooks: list[Playbook] = []
    for playbook in classes:
        try:
            options = build_options(playbook, settings.playbook_options.get(playbook.name))
        except OptionsError as exc:
            playbooks.append(MisconfiguredPlaybook.standing_in_for(playbook, exc.problems))
            continue
        playbooks.append(playbook.from_settings(settings, options))
    known = ", ".join(classes.names())
    orphans = [
        f"playbook_options.{name}: no playbook {name!r} is registered (registered: {known})"
        for name in sorted(set(settings.playbook_options) - set(classes.names()))
    ]
    return PlaybookRegistry(playbooks, orphans)


def open_registry(settings: RemediationSettings) -> PlaybookRegistry:
    """The default factory: every playbook class (`load_playbook_classes` of the settings'
    `playbook_classes`, entry points included) wired to its dependencies from `settings`."""
    return load_playbooks(load_playbook_classes(settings.playbook_classes), settings)


def build_registry(settings: RemediationSettings) -> PlaybookRegistry:
    """`open_registry` under its old name (it imports modules and opens clients: not pure);
    kept for one release for settings naming `...catalog:build_registry`."""
    warnings.warn(
        "redline.remediation.catalog:build_registry is now open_registry (the old name goes in "
        "the next release)",
        DeprecationWarning,
        stacklevel=2,
    )
    return open_registry(settings)


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


def load_known_playbooks(
    settings: RemediationSettings, registry: PlaybookRegistry | None = None
) -> tuple[str, ...]:
    """The names a spec may use: every playbook class (`load_playbook_classes`) and whatever
    `registry` (built by a factory of one's own) registers, sorted."""
    names = set(load_playbook_classes(settings.playbook_classes).names())
    if registry is not None:
        names.update(registry.names())
    return tuple(sorted(names))
