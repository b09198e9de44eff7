"""The playbook framework: what a playbook is, what it is given, and the explicit registries.

Writing a playbook
------------------
Subclass `Playbook` in a module of your own, set `name` (the alert's `playbook` label selects
it) and `target_label` (the alert label naming what it acts on: `region`, `collection`,
`model`, ...), and implement:

- `plan(ctx) -> Sequence[PlannedStep]`: read state, decide the steps, change nothing. In dry-run
  mode the worker stops here and the plan is the job's result.
- `execute(ctx, step) -> StepResult | Deferred`: carry out one planned step.
- `verify(ctx) -> StepResult`: check the effect once every step has run.
- optionally `Options`: a pydantic model (frozen, `extra="forbid"`, every field described) of
  the playbook's own settings, read from `playbook_options.<name>` and validated at start-up
  (default `NoOptions`: the playbook takes none).
- optionally `from_settings(settings, options)`: the playbook built from the receiver's
  `RemediationSettings` and its validated `Options` (default: the class called without
  arguments).
- optionally `settings_problems()`: what is missing from the settings for the playbook to work,
  each naming the field. The receiver and worker refuse to start while an enabled playbook
  (mode `act` or `shadow`) reports one, instead of failing at the first alert.
- optionally `plan_resolve(ctx)` / `resolve(ctx, step)`: the steps run when the alert resolves
  (default: none). `ctx.firing_job` is the firing job's final record (e.g. unfreeze only if its
  replay was verified).

Rules every step follows:

- Idempotent. The worker may run a step again: after a transient failure (retry from the first
  step of the plan, which is re-made), or after the worker died and another one reclaimed the
  job. A step must check state and do only what is still missing.
- `raise TransientError(...)` for a failure worth retrying (a timeout, a busy dependency); the
  job is retried with exponential backoff up to `max_attempts`, then ends `failed`.
- Return `StepResult.failure(...)` (or raise any other exception) for a failure retrying will
  not fix; the job ends `failed` at once, with the reason in `/jobs` and the audit trail.
- Long steps call `ctx.ensure_lease()` now and then: it raises `LeaseLostError` when the target
  lock or the job was taken over (this worker stalled past the claim time), so the step stops.
- `ctx.record(name, detail, **data)` adds a sub-step record (a replayed batch, a probe result) to
  the job and the audit trail; the worker already records plan, each step, verify and resolve.
- A step that must wait (a hold-down, a region that has to stay healthy for a while) returns
  `Deferred(seconds, reason, state)` instead of sleeping: the worker records the progress, parks
  the job on the delayed queue (status `waiting`, no worker and no target lock held meanwhile) and
  any worker runs the same step again when it is due, with `ctx.state` = the `state` it returned.
  The plan is not remade; the steps before it are not run again. Waiting does not count as an
  attempt.
- A step that only reads (a probe, a check) is planned with `read_only=True`. In shadow mode the
  worker runs the plan's read-only steps and records every other step as what it would have done
  (`ctx.shadow` is True); verify and the steps that change something are not run. A read-only
  step that defers in a shadow run is recorded as the wait it would take; the run goes on.

Registering
-----------
Two explicit registries, both built by the caller, never global:

- `PlaybookClasses`: name -> playbook class, with where each came from. The only list of
  playbooks: `redline.remediation.catalog` fills it with the built-in classes, the installed
  `redline.playbooks` entry points and the settings' `playbook_classes` (`module:ClassName`);
  it is what the spec's playbook names are checked against.
- `PlaybookRegistry`: name -> playbook instance, what the worker runs. Instances carry their
  dependencies (adapters, URLs). The CLI builds it with the factory named by the `playbooks`
  setting (`module:function`, called with the `RemediationSettings`; default
  `redline.remediation.catalog:open_registry`, which builds every class of `PlaybookClasses`
  with `from_settings`). A factory of one's own may also build it by hand:
  `PlaybookRegistry([MyPlaybook(adapter)])`.

A playbook whose `playbook_options` do not validate is registered as a `MisconfiguredPlaybook`
of the same name: the start-up check names each bad field (unless its mode is `off`, whose jobs
are skipped as before), and a job that reaches it anyway fails naming them.
"""

from __future__ import annotations

import inspect
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar, Self, cast

import redis
from pydantic import BaseModel, ConfigDict, ValidationError

from redline.core.errors import TransientError as TransientError
from redline.remediation.models import Alert
from redline.slo.spec import PLAYBOOK_NAME_PATTERN

if TYPE_CHECKING:
    from redline.remediation.jobs import Job
    from redline.remediation.settings import RemediationSettings

_NAME = re.compile(PLAYBOOK_NAME_PATTERN)

ENTRY_POINT_GROUP = "redline.playbooks"
"""The entry-point group a distribution declares its playbook classes in (entry name = the
playbook's name, value `module:ClassName`)."""


def load_entry_point_names() -> tuple[str, ...]:
    """The names of the installed `redline.playbooks` entry points, sorted, without importing
    their classes (`redline validate` checks a spec's names with these)."""
    return tuple(sorted({entry.name for entry in entry_points(group=ENTRY_POINT_GROUP)}))


class PlaybookError(Exception):
    """A playbook cannot do its work; the job ends failed with this message."""


class LeaseLostError(Exception):
    """This worker no longer owns the job or the target lock; it must stop at once."""


class RegistryError(Exception):
    """A playbook cannot be registered (bad or duplicate name, not a playbook class) or a
    factory, entry point or class reference cannot be loaded."""


class OptionsError(Exception):
    """A playbook's `playbook_options` do not validate; `problems` holds one line per field."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


class NoOptions(BaseModel):
    """The options of a playbook that takes none: `playbook_options.<name>` stays unset."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class PlannedStep:
    """One step of a plan: a name, what it will do, its parameters (JSON-serializable), and
    whether it only reads (`read_only`: run in shadow mode too)."""

    name: str
    description: str
    params: Mapping[str, Any] = field(default_factory=dict)
    read_only: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON form, for the job record and the audit trail."""
        return {
            "name": self.name,
            "description": self.description,
            "params": dict(self.params),
            "read_only": self.read_only,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannedStep:
        """The step a recorded plan holds (`as_dict` form); PlaybookError when malformed."""
        try:
            params = data.get("params") or {}
            if not isinstance(params, Mapping):
                raise TypeError("params is not a mapping")
            return cls(
                str(data["name"]),
                str(data.get("description", "")),
                dict(params),
                bool(data.get("read_only", False)),
            )
        except (KeyError, TypeError) as exc:
            raise PlaybookError(f"recorded plan step {data!r} is malformed: {exc}") from None


@dataclass(frozen=True)
class Deferred:
    """A step's answer "not yet": run this step again in `seconds`, handing it `state` back.

    `record=False` updates the job's waiting reason without adding a step record (a step that
    re-checks every few seconds records only when what it sees changes).
    """

    seconds: float
    reason: str
    state: Mapping[str, Any] = field(default_factory=dict)
    record: bool = True

    def __post_init__(self) -> None:
        if not self.seconds >= 0:
            raise ValueError(f"Deferred.seconds must be >= 0, not {self.seconds!r}")


@dataclass(frozen=True)
class StepResult:
    """The outcome of a step: ok or not, a human detail, and data for the record."""

    ok: bool
    detail: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def success(cls, detail: str = "", **data: Any) -> StepResult:
        """A step that did what it should."""
        return cls(True, detail, data)

    @classmethod
    def failure(cls, detail: str, **data: Any) -> StepResult:
        """A step that failed for good (no retry)."""
        return cls(False, detail, data)


@dataclass(frozen=True)
class PlaybookContext:
    """Everything a playbook step is given by the worker."""

    job_id: str
    playbook: str
    alert: Alert
    target: str
    dry_run: bool
    attempt: int
    redis: redis.Redis
    firing_job: Job | None
    log: logging.Logger
    recorder: Callable[[str, str, Mapping[str, Any]], None]
    lease_check: Callable[[], None]
    state: Mapping[str, Any] = field(default_factory=dict)
    shadow: bool = False

    @property
    def resolved(self) -> bool:
        """True when this job handles the alert's resolution."""
        return self.alert.status == "resolved"

    @property
    def labels(self) -> Mapping[str, str]:
        """The alert's labels."""
        return self.alert.labels

    @property
    def annotations(self) -> Mapping[str, str]:
        """The alert's annotations."""
        return self.alert.annotations

    def record(self, name: str, detail: str = "", **data: Any) -> None:
        """Add a sub-step record to the job and the audit trail."""
        self.recorder(name, detail, data)

    def ensure_lease(self) -> None:
        """Raise LeaseLostError if the job or its target lock was taken over."""
        self.lease_check()


class Playbook(ABC):
    """Base class of playbooks: `plan` → `execute` each step → `verify`; `resolve` on resolution."""

    name: ClassVar[str]
    target_label: ClassVar[str]
    Options: ClassVar[type[BaseModel]] = NoOptions
    """The model of `playbook_options.<name>` (frozen, extra="forbid", every field described)."""

    @classmethod
    def from_settings(cls, settings: RemediationSettings, options: Any) -> Self:
        """This playbook wired from the receiver's settings and its validated options (an
        instance of `Options`); the default calls the class without arguments."""
        return cls()

    def target(self, alert: Alert) -> str:
        """What the job acts on (the lock key): the `target_label` value of the alert."""
        value = alert.labels.get(self.target_label, "").strip()
        if not value:
            raise PlaybookError(
                f"playbook {self.name}: the alert has no {self.target_label!r} label "
                f"(labels: {', '.join(sorted(alert.labels)) or 'none'})"
            )
        return f"{self.target_label}={value}"

    @abstractmethod
    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """The steps a firing alert calls for; reads state, changes nothing."""

    @abstractmethod
    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult | Deferred:
        """Carry out one planned step, idempotently (or ask to run it again later)."""

    @abstractmethod
    def verify(self, ctx: PlaybookContext) -> StepResult:
        """Check that the executed plan had its effect."""

    def plan_resolve(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """The steps the alert's resolution calls for (default: none)."""
        return ()

    def resolve(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult | Deferred:
        """Carry out one resolve step, idempotently (or ask to run it again later)."""
        return StepResult.failure(f"playbook {self.name} planned {step.name} but has no resolve")

    def settings_problems(self) -> Sequence[str]:
        """What the settings lack for this playbook to work, each naming the field (default:
        nothing). Checked at start-up for every enabled playbook."""
        return ()


class MisconfiguredPlaybook(Playbook):
    """Stands in for a playbook whose `playbook_options` do not validate: it reports them as its
    settings problems and fails every step naming them."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)

    @classmethod
    def standing_in_for(
        cls, playbook: type[Playbook], problems: Sequence[str]
    ) -> MisconfiguredPlaybook:
        """A stand-in with `playbook`'s name and target label, reporting `problems`."""
        # `name` and `target_label` are class attributes (the worker reads them off the
        # instance), so each stand-in is a subclass of its own.
        attributes = {"name": playbook.name, "target_label": playbook.target_label}
        stand_in = type(f"Misconfigured{playbook.__name__}", (cls,), attributes)
        return cast(MisconfiguredPlaybook, stand_in(problems))

    def _refuse(self) -> PlaybookError:
        return PlaybookError(f"{self.name}: not configured: {'; '.join(self.problems)}")

    def settings_problems(self) -> Sequence[str]:
        """The options' problems, one per field."""
        return self.problems

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """Refuse: the options do not validate."""
        raise self._refuse()

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Refuse: the options do not validate."""
        raise self._refuse()

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """Refuse: the options do not validate."""
        raise self._refuse()

    def plan_resolve(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """Refuse: the options do not validate."""
        raise self._refuse()


def _option_problem(where: str, model: type[BaseModel], error: Any) -> str:
    field_path = ".".join(str(part) for part in error["loc"]) or "(the section)"
    if error["type"] == "extra_forbidden":
        allowed = ", ".join(model.model_fields)
        if not allowed:
            return f"{where}: {field_path}: unknown option; this playbook takes no options"
        return f"{where}: {field_path}: unknown option; allowed: {allowed}"
    if error["type"] == "missing":
        return f"{where}: {field_path}: required option is missing"
    given = error.get("input")
    shown = f" (got {given!r})" if isinstance(given, str | int | float | bool) else ""
    return f"{where}: {field_path}: {str(error['msg']).removeprefix('Value error, ')}{shown}"


def build_options(playbook: type[Playbook], raw: Mapping[str, Any] | None) -> BaseModel:
    """`playbook_options.<name>` validated against the playbook's `Options`; OptionsError with
    one `playbook_options.<name>: <field>: <message>` line per problem."""
    try:
        return playbook.Options.model_validate(dict(raw or {}))
    except ValidationError as exc:
        where = f"playbook_options.{playbook.name}"
        raise OptionsError(
            [_option_problem(where, playbook.Options, error) for error in exc.errors()]
        ) from None


def check_playbook_class(candidate: object, origin: str) -> type[Playbook]:
    """`candidate` as a playbook class; RegistryError naming `origin` and what is wrong: not a
    concrete `Playbook` subclass, a malformed name or target label, or an `Options` model that
    is not frozen, does not forbid extra fields or leaves a field undescribed."""
    if not isinstance(candidate, type) or not issubclass(candidate, Playbook):
        raise RegistryError(f"{origin}: {candidate!r} is not a Playbook subclass")
    label = f"{origin}: {candidate.__module__}:{candidate.__qualname__}"
    if inspect.isabstract(candidate):
        missing = ", ".join(sorted(getattr(candidate, "__abstractmethods__", ())))
        raise RegistryError(f"{label} is abstract (implement {missing})")
    name = getattr(candidate, "name", None)
    if not isinstance(name, str) or not _NAME.match(name):
        raise RegistryError(f"{label}: name {name!r} must match {_NAME.pattern}")
    target = getattr(candidate, "target_label", None)
    if not isinstance(target, str) or not target:
        raise RegistryError(f"{label}: target_label must be a label name")
    options = getattr(candidate, "Options", None)
    if not isinstance(options, type) or not issubclass(options, BaseModel):
        raise RegistryError(f"{label}: Options must be a pydantic model")
    config = options.model_config
    if config.get("extra") != "forbid" or not config.get("frozen"):
        raise RegistryError(
            f"{label}: Options must be frozen and forbid extra fields "
            '(model_config = ConfigDict(extra="forbid", frozen=True))'
        )
    for field_name, info in options.model_fields.items():
        if not info.description:
            raise RegistryError(f"{label}: Options.{field_name} has no description")
    return candidate


class PlaybookClasses:
    """An explicit name → playbook class mapping, each with where it came from (the built-ins,
    an entry point, a `playbook_classes` reference); built by the caller, never global."""

    def __init__(self, classes: Iterable[tuple[object, str]] = ()) -> None:
        self._classes: dict[str, type[Playbook]] = {}
        self._origins: dict[str, str] = {}
        for candidate, origin in classes:
            self.add(candidate, origin)

    def add(self, candidate: object, origin: str) -> type[Playbook]:
        """Add a playbook class found at `origin`; RegistryError when it is not a usable
        playbook class (`check_playbook_class`) or its name is already taken."""
        playbook = check_playbook_class(candidate, origin)
        taken = self._origins.get(playbook.name)
        if taken is not None:
            raise RegistryError(
                f"{origin}: playbook {playbook.name!r} is already registered by {taken}"
            )
        self._classes[playbook.name] = playbook
        self._origins[playbook.name] = origin
        return playbook

    def get(self, name: str) -> type[Playbook] | None:
        """The class of playbook `name`, if registered."""
        return self._classes.get(name)

    def origin(self, name: str) -> str:
        """Where the class of playbook `name` came from (KeyError if not registered)."""
        return self._origins[name]

    def names(self) -> tuple[str, ...]:
        """Registered names, sorted."""
        return tuple(sorted(self._classes))

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[type[Playbook]]:
        return iter(self._classes.values())

    def __len__(self) -> int:
        return len(self._classes)


class PlaybookRegistry:
    """An explicit name → playbook instance mapping; built by the caller, never global.

    `problems`: what was wrong with the settings as a whole while building it (options for a
    playbook that is not registered); the start-up check reports them."""

    def __init__(self, playbooks: Iterable[Playbook] = (), problems: Sequence[str] = ()) -> None:
        self._playbooks: dict[str, Playbook] = {}
        self.problems = tuple(problems)
        for playbook in playbooks:
            self.register(playbook)

    def register(self, playbook: Playbook) -> Playbook:
        """Add `playbook`; RegistryError on a malformed or already registered name."""
        name = getattr(playbook, "name", None)
        if not isinstance(name, str) or not _NAME.match(name):
            raise RegistryError(
                f"{type(playbook).__name__}: name {name!r} must match {_NAME.pattern}"
            )
        label = getattr(playbook, "target_label", None)
        if not isinstance(label, str) or not label:
            raise RegistryError(f"{type(playbook).__name__}: target_label must be a label name")
        if name in self._playbooks:
            raise RegistryError(f"playbook {name!r} is already registered")
        self._playbooks[name] = playbook
        return playbook

    def get(self, name: str) -> Playbook | None:
        """The playbook called `name`, if registered."""
        return self._playbooks.get(name)

    def names(self) -> tuple[str, ...]:
        """Registered names, sorted."""
        return tuple(sorted(self._playbooks))

    def __contains__(self, name: object) -> bool:
        return name in self._playbooks

    def __iter__(self) -> Iterator[Playbook]:
        return iter(self._playbooks.values())

    def __len__(self) -> int:
        return len(self._playbooks)
