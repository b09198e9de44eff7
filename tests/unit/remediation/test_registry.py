"""The open playbook registry: the classes are the one list of playbooks (the built-in ones,
entry points, `playbook_classes`), each built from the settings with its validated options;
the spec's names are checked against it."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator, Sequence
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, Self

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from redline.cli import app as cli_app
from redline.cli.remediation import remediation_app
from redline.core.settings import SettingsError, load_settings
from redline.remediation.catalog import (
    BUILTIN_PLAYBOOKS,
    builtin_playbook_names,
    load_known_playbooks,
    load_playbook_classes,
    load_playbooks,
    open_registry,
)
from redline.remediation.guards import Policies, build_startup_problems, load_policies
from redline.remediation.playbook import (
    MisconfiguredPlaybook,
    NoOptions,
    PlannedStep,
    Playbook,
    PlaybookClasses,
    PlaybookContext,
    PlaybookError,
    RegistryError,
    StepResult,
    build_options,
    load_entry_point_names,
)
from redline.remediation.playbooks import SpotDrain
from redline.remediation.settings import RemediationSettings
from redline.slo.load import SpecError, load_spec
from redline.slo.spec import PLAYBOOK_NAMES, PlaybookPolicy

ENV = {"REDLINE_WEBHOOK_TOKEN": "t0ken"}


class _MarkOptions(BaseModel):
    """Options of the test playbook."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    marker: str = Field("marked", description="What the step writes.")
    times: int = Field(1, ge=1, le=3, description="How often.")


class Mark(Playbook):
    """A user's playbook: one step, its options typed."""

    name = "mark"
    target_label = "region"
    Options = _MarkOptions

    def __init__(self, marker: str, prefix: str) -> None:
        self.marker = marker
        self.prefix = prefix

    @classmethod
    def from_settings(cls, settings: RemediationSettings, options: _MarkOptions) -> Self:
        """The marker from the options, the key prefix from the settings."""
        return cls(options.marker, settings.key_prefix)

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """One step."""
        return (PlannedStep("mark", "mark"),)

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Nothing to do here."""
        return StepResult.success(self.marker)

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """Fine."""
        return StepResult.success()


class Bare(Playbook):
    """A playbook without options nor `from_settings`: built by calling the class."""

    name = "bare"
    target_label = "node"

    def plan(self, ctx: PlaybookContext) -> Sequence[PlannedStep]:
        """Nothing."""
        return ()

    def execute(self, ctx: PlaybookContext, step: PlannedStep) -> StepResult:
        """Nothing."""
        return StepResult.success()

    def verify(self, ctx: PlaybookContext) -> StepResult:
        """Nothing."""
        return StepResult.success()


class _Loose(BaseModel):
    """Not frozen, extra fields allowed."""

    colour: str = Field("red", description="A colour.")


class _Undescribed(BaseModel):
    """A field without a description."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    colour: str = "red"


def _subclass(class_name: str, **attributes: Any) -> type[Playbook]:
    return type(class_name, (Bare,), attributes)


def test_the_spec_s_built_in_names_are_the_built_in_classes() -> None:
    # slo keeps the names for the pure layers (dashboards) and `redline validate`: the same.
    assert builtin_playbook_names() == PLAYBOOK_NAMES
    assert tuple(playbook.name for playbook in open_registry(RemediationSettings())) == (
        PLAYBOOK_NAMES
    )
    classes = load_playbook_classes(entries=[])
    assert classes.names() == tuple(sorted(PLAYBOOK_NAMES))
    assert classes.origin("spot_drain") == ("built-in redline.remediation.playbooks.spot:SpotDrain")


def test_every_built_in_class_meets_the_contract() -> None:
    for playbook in BUILTIN_PLAYBOOKS:
        config = playbook.Options.model_config
        assert config.get("extra") == "forbid" and config.get("frozen"), playbook
        assert all(info.description for info in playbook.Options.model_fields.values())
    assert SpotDrain.Options is not NoOptions
    assert {p.name for p in BUILTIN_PLAYBOOKS if p.Options is NoOptions} == (
        set(PLAYBOOK_NAMES) - {"spot_drain", "gpu_node_failure", "weights_resync", "weights_rotate"}
    )


@pytest.mark.parametrize(
    ("candidate", "message"),
    [
        (object, "is not a Playbook subclass"),
        (Playbook, "is abstract (implement execute, plan, verify)"),
        (_subclass("Caps", name="Mark_Me"), "name 'Mark_Me' must match"),
        (_subclass("NoLabel", name="no_label", target_label=""), "target_label must be"),
        (_subclass("Plain", name="plain", Options=dict), "Options must be a pydantic model"),
        (_subclass("Loose", name="loose", Options=_Loose), "Options must be frozen and forbid"),
        (_subclass("Undoc", name="undoc", Options=_Undescribed), "Options.colour has no desc"),
    ],
)
def test_a_class_that_breaks_the_contract_is_refused_naming_where_it_came_from(
    candidate: object, message: str
) -> None:
    with pytest.raises(RegistryError, match="^playbook_classes\\[0\\] \\(x:Y\\)") as caught:
        PlaybookClasses([(candidate, "playbook_classes[0] (x:Y)")])
    assert message in str(caught.value)


def test_a_second_class_of_the_same_name_names_both_origins() -> None:
    classes = PlaybookClasses([(Mark, "first")])
    with pytest.raises(RegistryError) as caught:
        classes.add(_subclass("Other", name="mark"), "second")
    assert str(caught.value) == "second: playbook 'mark' is already registered by first"
    with pytest.raises(RegistryError, match="already registered by built-in .*rerout"):
        load_playbook_classes([f"{__name__}:Clash"], entries=[])


class Clash(Bare):
    """Takes a built-in's name."""

    name = "reroute"


def test_playbook_classes_are_imported_from_module_colon_class() -> None:
    classes = load_playbook_classes([f"{__name__}:Mark", f"{__name__}:Bare"], entries=[])
    assert classes.get("mark") is Mark and classes.get("bare") is Bare
    assert classes.origin("mark") == f"playbook_classes[0] ({__name__}:Mark)"
    for reference, message in [
        ("no_such_module_xyz:Thing", "playbook_classes[0] (no_such_module_xyz:Thing): cannot "
                                     "import no_such_module_xyz"),
        (f"{__name__}:Nope", f"playbook_classes[0] ({__name__}:Nope): {__name__} has no Nope"),
        (f"{__name__}:ENV", "is not a Playbook subclass"),
    ]:  # fmt: skip
        with pytest.raises(RegistryError) as caught:
            load_playbook_classes([reference], entries=[])
        assert message in str(caught.value)


def test_the_setting_refuses_a_malformed_reference(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump({"playbook_classes": ["mine.Playbook"]}))
    with pytest.raises(SettingsError) as caught:
        load_settings(RemediationSettings, config)
    assert f"{config}: playbook_classes:" in str(caught.value)
    assert "item 0, 'mine.Playbook', is not of the form module:ClassName" in str(caught.value)


def test_an_entry_point_must_be_named_like_its_playbook() -> None:
    good = EntryPoint("mark", f"{__name__}:Mark", "redline.playbooks")
    classes = load_playbook_classes(entries=[good])
    assert classes.get("mark") is Mark
    assert classes.origin("mark") == f"entry point redline.playbooks:mark = {__name__}:Mark"
    misnamed = EntryPoint("marker", f"{__name__}:Mark", "redline.playbooks")
    with pytest.raises(RegistryError, match="playbook name is 'mark'; name the entry point 'mark'"):
        load_playbook_classes(entries=[misnamed])
    broken = EntryPoint("gone", "no_such_module_xyz:Gone", "redline.playbooks")
    with pytest.raises(RegistryError, match="redline.playbooks:gone .*: cannot load"):
        load_playbook_classes(entries=[broken])


def test_options_are_typed_and_their_errors_name_the_setting_and_the_allowed_values() -> None:
    assert build_options(Mark, None) == _MarkOptions()
    assert build_options(Mark, {"marker": "x"}) == _MarkOptions(marker="x")
    with pytest.raises(Exception) as caught:
        build_options(Mark, {"times": 5, "colour": "red"})
    assert caught.value.problems == (  # type: ignore[attr-defined]
        "playbook_options.mark: times: Input should be less than or equal to 3 (got 5)",
        "playbook_options.mark: colour: unknown option; allowed: marker, times",
    )
    with pytest.raises(Exception) as none:
        build_options(Bare, {"colour": "red"})
    assert none.value.problems == (  # type: ignore[attr-defined]
        "playbook_options.bare: colour: unknown option; this playbook takes no options",
    )


def test_spot_drain_options_are_validated_when_the_registry_is_built() -> None:
    settings = RemediationSettings(playbook_options={"spot_drain": {"time_scale": 0.5}})
    spot = open_registry(settings).get("spot_drain")
    assert isinstance(spot, SpotDrain) and spot.options.time_scale == 0.5
    bad = RemediationSettings(playbook_options={"spot_drain": {"time_scale": 5, "colour": 1}})
    stand_in = open_registry(bad).get("spot_drain")
    assert isinstance(stand_in, MisconfiguredPlaybook)
    assert (stand_in.name, stand_in.target_label) == ("spot_drain", "node")
    assert list(stand_in.settings_problems()) == [
        "playbook_options.spot_drain: time_scale: Input should be less than or equal to 1 (got 5)",
        "playbook_options.spot_drain: colour: unknown option; allowed: redis_url, "
        "routing_key_prefix, state_key_prefix, gateway_urls, gateway_token_file, model, "
        "time_scale, readiness_timeout_seconds, poll_seconds",
    ]
    with pytest.raises(PlaybookError, match="spot_drain: not configured: playbook_options"):
        stand_in.plan(None)  # type: ignore[arg-type]


def test_bad_options_are_a_start_up_problem_unless_the_playbook_is_off() -> None:
    settings = RemediationSettings(
        playbook_classes=[f"{__name__}:Mark"],
        playbook_options={"mark": {"times": 0}, "spot_dran": {}},
    )
    registry = load_playbooks(load_playbook_classes(settings.playbook_classes, []), settings)
    off = {name: PlaybookPolicy(mode="off") for name in builtin_playbook_names()}
    problems = build_startup_problems(registry, Policies(off))
    assert problems == [
        "playbook_options.spot_dran: no playbook 'spot_dran' is registered (registered: "
        + ", ".join(sorted([*PLAYBOOK_NAMES, "mark"]))
        + ")",
        "playbook mark (mode act): playbook_options.mark: times: Input should be greater than "
        "or equal to 1 (got 0) (or set remediation.playbooks.mark.mode: off)",
    ]
    quiet = Policies({**off, "mark": PlaybookPolicy(mode="off")})
    assert build_startup_problems(registry, quiet) == problems[:1]


def test_a_user_class_is_built_from_the_settings_and_its_options() -> None:
    settings = RemediationSettings(
        key_prefix="acme",
        playbook_classes=[f"{__name__}:Mark", f"{__name__}:Bare"],
        playbook_options={"mark": {"marker": "restarted"}},
    )
    registry = open_registry(settings)
    mark = registry.get("mark")
    assert isinstance(mark, Mark) and (mark.marker, mark.prefix) == ("restarted", "acme")
    assert isinstance(registry.get("bare"), Bare)
    assert set(registry.names()) == {*PLAYBOOK_NAMES, "mark", "bare"}


def _spec(tmp_path: Path, playbook: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "service": "chat",
                "regions": ["a", "b"],
                "red_lines": {"latency_p99": {"playbook": playbook}},
                "remediation": {"playbooks": {playbook: {"mode": "shadow"}}},
            }
        )
    )
    return path


def test_the_spec_names_are_checked_against_the_classes_and_the_registry(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "mark")
    assert load_spec(spec).spec.red_lines.latency_p99.playbook == "mark"  # plain names
    with pytest.raises(SpecError) as caught:
        load_spec(spec, playbooks=load_known_playbooks(RemediationSettings()))
    known = ", ".join(repr(name) for name in sorted(PLAYBOOK_NAMES))
    assert caught.value.problems == [
        f"{spec}: red_lines.latency_p99.playbook: Input should be a known playbook, not "
        f"'mark'; known: {known}",
        f"{spec}: remediation.playbooks.mark: Input should be a known playbook, not 'mark'; "
        f"known: {known}",
    ]
    with_class = RemediationSettings(playbook_classes=[f"{__name__}:Mark"])
    assert load_spec(spec, playbooks=load_known_playbooks(with_class)).spec
    registry = open_registry(RemediationSettings())
    registry.register(Mark("m", "p"))
    assert "mark" in load_known_playbooks(RemediationSettings(), registry)


def test_the_worker_refuses_a_spec_naming_an_unknown_playbook(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "rerote")
    result = CliRunner().invoke(remediation_app, ["worker"], env={**ENV, "REDLINE_SPEC": str(spec)})
    assert result.exit_code == 2
    assert (
        f"{spec}: red_lines.latency_p99.playbook: Input should be a known playbook, not "
        "'rerote'; known: 'delta_log_replay'"
    ) in result.output
    receiver = CliRunner().invoke(
        remediation_app, ["--workers", "0"], env={**ENV, "REDLINE_SPEC": str(spec)}
    )
    assert receiver.exit_code == 2
    assert "remediation.playbooks.rerote: Input should be a known playbook" in receiver.output


def test_the_start_up_check_names_a_user_playbook_s_bad_options(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    off = {name: {"mode": "off"} for name in builtin_playbook_names()}
    config.write_text(
        yaml.safe_dump(
            {
                "spec": str(_spec(tmp_path, "mark")),
                "playbook_classes": [f"{__name__}:Mark"],
                "playbook_options": {"mark": {"colour": "red"}},
                "policies": off,
            }
        )
    )
    result = CliRunner().invoke(remediation_app, ["worker", "--config", str(config)], env=ENV)
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        "refusing to start:",
        "playbook mark (mode shadow): playbook_options.mark: colour: unknown option; allowed: "
        "marker, times (or set remediation.playbooks.mark.mode: off)",
    ]
    policies = load_policies(_spec(tmp_path, "mark"), None, {})
    assert policies.get("mark").mode == "shadow"


def test_validate_knows_the_built_ins_and_with_config_the_user_classes(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "mark")
    plain = CliRunner().invoke(cli_app, ["validate", str(spec)])
    assert plain.exit_code == 2
    assert "red_lines.latency_p99.playbook: Input should be a known playbook, not 'mark'" in (
        plain.output
    )
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump({"playbook_classes": [f"{__name__}:Mark"]}))
    known = CliRunner().invoke(cli_app, ["validate", str(spec), "--config", str(config)])
    assert known.exit_code == 0, known.output
    assert "ok: spec v1 for chat" in known.output
    config.write_text(yaml.safe_dump({"playbook_classes": ["no_such_module_xyz:Mark"]}))
    broken = CliRunner().invoke(cli_app, ["validate", str(spec), "--config", str(config)])
    assert broken.exit_code == 2
    assert "playbook_classes[0] (no_such_module_xyz:Mark): cannot import" in broken.output


PLUGIN = '''
from typing import Self

from pydantic import BaseModel, ConfigDict, Field

from redline.remediation.playbook import Playbook, PlannedStep, StepResult


class Options(BaseModel):
    """Options."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    marker: str = Field("installed", description="What it writes.")


class Installed(Playbook):
    """An installed playbook."""

    name = "{name}"
    target_label = "region"
    Options = Options

    def __init__(self, marker):
        self.marker = marker

    @classmethod
    def from_settings(cls, settings, options):
        return cls(options.marker)

    def plan(self, ctx):
        return (PlannedStep("mark", "mark"),)

    def execute(self, ctx, step):
        return StepResult.success(self.marker)

    def verify(self, ctx):
        return StepResult.success()
'''


def write_distribution(root: Path, module: str, name: str) -> None:
    """A distribution as pip installs it: the module and a `.dist-info` whose entry point of
    the group `redline.playbooks` names its playbook class."""
    (root / f"{module}.py").write_text(textwrap.dedent(PLUGIN).replace("{name}", name))
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[redline.playbooks]\n{name} = {module}:Installed\n")


@pytest.fixture()
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A distribution with the playbook `installed_mark` on sys.path."""
    root = tmp_path / "site"
    root.mkdir()
    write_distribution(root, "acme_unit_playbooks", "installed_mark")
    monkeypatch.syspath_prepend(str(root))
    yield "installed_mark"
    sys.modules.pop("acme_unit_playbooks", None)


def test_an_installed_entry_point_registers_its_class_without_any_edit(
    installed: str, tmp_path: Path
) -> None:
    assert installed in load_entry_point_names()
    classes = load_playbook_classes()
    assert classes.origin(installed) == (
        "entry point redline.playbooks:installed_mark = acme_unit_playbooks:Installed "
        "(distribution acme_unit_playbooks 1.0)"
    )
    settings = RemediationSettings(playbook_options={installed: {"marker": "from options"}})
    playbook = open_registry(settings).get(installed)
    assert playbook is not None and playbook.marker == "from options"  # type: ignore[attr-defined]
    spec = _spec(tmp_path, installed)
    validated = CliRunner().invoke(cli_app, ["validate", str(spec)])
    assert validated.exit_code == 0, validated.output
