"""Load the heavy command modules (Milvus, FastAPI apps) only when their command runs.

`redline validate` should not pay seconds importing pymilvus and pandas: the top-level group
knows which module registers which command and imports a module on first use of one of its
commands (or for `--help`, which lists them all).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperGroup

# typer >= 0.29 carries its own copy of click (typer._click) while older releases use click
# itself, so the click types stay loose here.
ClickCommand = Any
ClickContext = Any

LAZY_MODULES: dict[str, tuple[str, ...]] = {
    "redline.cli.exporters": ("exporters", "snapshot"),
    "redline.cli.sessions": ("sessions",),
    "redline.cli.index": ("index",),
    "redline.cli.serving": ("gateway", "simulate"),
    "redline.cli.remediation": ("remediation", "audit"),
    "redline.cli.stack": ("up", "down", "status", "drill", "loadgen"),
    "redline.cli.spot": ("spot-agent",),
    "redline.cli.report": ("report",),
    "redline.cli.dashboards": ("dashboards",),
    "redline.cli.compose": ("compose",),
    "redline.cli.prompts": ("prompts",),
    "redline.cli.explain": ("explain",),
    "redline.cli.gameday": ("gameday",),
}
"""Module → the top-level commands its `register(app)` adds."""


class LazyCommandError(Exception):
    """A lazy module did not register the commands it is listed with."""


def load_module_commands(module_name: str) -> dict[str, ClickCommand]:
    """Import a command module, let it register on a scratch app, return its click commands."""
    module = importlib.import_module(module_name)
    register: Callable[[typer.Typer], None] = module.register
    scratch = typer.Typer()
    register(scratch)

    @scratch.callback()
    def _scratch() -> None:  # forces a group even when the module adds one command
        """Scratch group."""

    group = typer.main.get_group(scratch)
    commands = dict(group.commands)
    expected = set(LAZY_MODULES[module_name])
    if set(commands) != expected:
        raise LazyCommandError(
            f"{module_name} registers {sorted(commands)}, LAZY_MODULES lists {sorted(expected)}"
        )
    return commands


class LazyGroup(TyperGroup):
    """A typer group whose listed-but-not-yet-loaded commands are imported on demand."""

    def list_commands(self, ctx: ClickContext) -> list[str]:
        """Eager commands first, then every lazy one."""
        lazy = [name for names in LAZY_MODULES.values() for name in names]
        return [*super().list_commands(ctx), *[n for n in lazy if n not in self.commands]]

    def get_command(self, ctx: ClickContext, cmd_name: str) -> ClickCommand | None:
        """The command, importing its module the first time it is asked for."""
        if cmd_name not in self.commands:
            for module_name, names in LAZY_MODULES.items():
                if cmd_name in names:
                    for name, command in load_module_commands(module_name).items():
                        self.add_command(command, name)
                    break
        return super().get_command(ctx, cmd_name)
