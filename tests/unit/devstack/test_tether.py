"""The owner chain's text form and the registry of spawned processes (no process started)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from redline.devstack import tether
from redline.devstack.tether import Owner, parse_chain, record_spawned, render_chain


def test_a_chain_reads_back_and_ignores_what_is_not_an_owner() -> None:
    owners = (Owner(12, 345), Owner(67, 89))
    assert parse_chain(render_chain(owners)) == owners
    assert parse_chain("12:345, junk, 7:,:9,67:89") == owners
    assert parse_chain("") == ()


def test_this_process_is_alive_as_an_owner_and_a_reused_pid_is_not() -> None:
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    assert Owner(os.getpid(), ticks).alive()
    assert not Owner(os.getpid(), ticks + 1).alive()


def test_spawned_processes_are_recorded_per_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tether.tempfile, "tempdir", str(tmp_path))
    record_spawned(101, 5, "1:2")
    record_spawned(102, 6, "1:2")
    record_spawned(103, 7, "1:2,3:4")
    record_spawned(104, None, "1:2")  # exited before its start time was read
    record_spawned(105, 8, None)  # no owner: nothing to record
    files = {chain: entries for _, chain, entries in tether._recorded()}
    assert files == {"1:2": [(101, 5), (102, 6)], "1:2,3:4": [(103, 7)]}
    assert tether.registry_dir().parent == tmp_path
