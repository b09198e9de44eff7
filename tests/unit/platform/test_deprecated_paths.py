"""Entry points users import keep working from their old paths for one release: the moved
modules warn on every name taken from them (not on import), the others did not move."""

from __future__ import annotations

import importlib
import re
import warnings

import pytest

import redline.platform.index as index

OLD_PATHS = {
    "redline.platform.vectorindex": ("IndexWriter", "MilvusTarget", "Replicator", "DeltaLog"),
    "redline.platform.deltalog": ("DeltaLog", "DeltaLogError", "Entry", "parse_stream_id"),
}


@pytest.mark.parametrize("path", sorted(OLD_PATHS))
def test_importing_an_old_module_alone_is_quiet(path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(importlib.import_module(path))


@pytest.mark.parametrize(
    ("path", "name"), [(path, name) for path, names in OLD_PATHS.items() for name in names]
)
def test_an_old_name_resolves_to_the_moved_object_and_warns(path: str, name: str) -> None:
    module = importlib.import_module(path)
    message = rf"{re.escape(path)}\.{name} moved: import it from redline\.platform\.index"
    with pytest.warns(DeprecationWarning, match=message):
        moved = getattr(module, name)
    assert moved is getattr(index, name)


def test_every_old_name_is_still_exported_by_the_package() -> None:
    for path in OLD_PATHS:
        module = importlib.import_module(path)
        for name in dir(module):
            with pytest.warns(DeprecationWarning):
                assert getattr(module, name) is getattr(index, name)


def test_from_import_of_an_old_name_warns() -> None:
    with pytest.warns(DeprecationWarning, match="redline.platform.vectorindex.IndexWriter"):
        from redline.platform.vectorindex import IndexWriter
    assert IndexWriter is index.IndexWriter
    with pytest.warns(DeprecationWarning, match="redline.platform.deltalog.DeltaLog"):
        from redline.platform.deltalog import DeltaLog
    assert DeltaLog is index.DeltaLog


def test_an_unknown_name_is_an_attribute_error() -> None:
    module = importlib.import_module("redline.platform.vectorindex")
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        module.Nope  # noqa: B018


def test_entry_points_that_did_not_move_import_from_their_old_paths() -> None:
    from redline.exporters.drift import DriftProbe
    from redline.platform.sessions import SessionWriter
    from redline.remediation.catalog import open_registry
    from redline.remediation.playbook import PlaybookRegistry

    assert DriftProbe.__module__ == "redline.exporters.drift"
    assert SessionWriter.__module__ == "redline.platform.sessions"
    assert PlaybookRegistry.__module__ == "redline.remediation.playbook"
    assert open_registry.__module__ == "redline.remediation.catalog"


def test_the_old_factory_name_warns_and_builds_the_same_registry() -> None:
    from redline.remediation.catalog import build_registry, open_registry
    from redline.remediation.settings import RemediationSettings

    settings = RemediationSettings()
    with pytest.warns(DeprecationWarning, match="build_registry is now open_registry"):
        old = build_registry(settings)
    assert old.names() == open_registry(settings).names()
