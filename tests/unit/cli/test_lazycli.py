"""The top-level CLI loads command modules lazily, and each registers what it is listed with."""

from __future__ import annotations

import pytest

from redline.cli.lazy import LAZY_MODULES, load_module_commands


@pytest.mark.parametrize("module", sorted(LAZY_MODULES))
def test_each_module_registers_exactly_its_listed_commands(module: str) -> None:
    assert set(load_module_commands(module)) == set(LAZY_MODULES[module])
