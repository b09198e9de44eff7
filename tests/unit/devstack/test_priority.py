"""The autogroup nice that a niced run hands to the sessions it spawns."""

from __future__ import annotations

from pathlib import Path

from redline.devstack.priority import (
    inherit_autogroup_nice,
    parse_autogroup,
    read_autogroup_nice,
    set_autogroup_nice,
)


def _proc(tmp_path: Path, pid: str, text: str) -> None:
    (tmp_path / pid).mkdir(parents=True, exist_ok=True)
    (tmp_path / pid / "autogroup").write_text(text)


def test_parse_reads_the_nice_value_and_rejects_anything_else() -> None:
    assert parse_autogroup("/autogroup-12 nice 10\n") == 10
    assert parse_autogroup("/autogroup-1 nice -5") == -5
    assert parse_autogroup("") is None
    assert parse_autogroup("/autogroup-1 nice ten") is None
    assert parse_autogroup("/autogroup-1 weight 10") is None


def test_a_raised_autogroup_is_handed_to_the_child(tmp_path: Path) -> None:
    _proc(tmp_path, "self", "/autogroup-7 nice 10\n")
    _proc(tmp_path, "42", "/autogroup-9 nice 0\n")
    inherit_autogroup_nice(42, tmp_path)
    assert (tmp_path / "42" / "autogroup").read_text() == "10\n"


def test_an_unraised_autogroup_leaves_the_child_alone(tmp_path: Path) -> None:
    _proc(tmp_path, "self", "/autogroup-7 nice 0\n")
    _proc(tmp_path, "42", "/autogroup-9 nice 0\n")
    inherit_autogroup_nice(42, tmp_path)
    assert (tmp_path / "42" / "autogroup").read_text() == "/autogroup-9 nice 0\n"


def test_no_autogroups_and_gone_processes_are_no_error(tmp_path: Path) -> None:
    assert read_autogroup_nice(proc=tmp_path) is None
    assert set_autogroup_nice(42, 10, tmp_path) is False
    _proc(tmp_path, "self", "/autogroup-7 nice 10\n")
    inherit_autogroup_nice(42, tmp_path)  # the child is gone: nothing to set, nothing raised
    assert not (tmp_path / "42").exists()
