"""FileRecordStore: conditional writes, listing, key checks, and the registry's old layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.platform.weights.errors import RecordConflictError, RecordStoreError
from redline.platform.weights.records import FileRecordStore, check_key, encode_part, sha256_hex


def test_versions_and_conditions(tmp_path: Path) -> None:
    store = FileRecordStore(tmp_path)
    assert store.get("a/b.json") is None and store.digest("a/b.json") is None
    token = store.put("a/b.json", b"one", if_absent=True)
    assert token == sha256_hex(b"one") and store.get("a/b.json") == (b"one", token)
    with pytest.raises(RecordConflictError, match=r"b\.json: exists already"):
        store.put("a/b.json", b"two", if_absent=True)
    newer = store.put("a/b.json", b"two", if_version=token)
    with pytest.raises(RecordConflictError, match="changed since it was read"):
        store.put("a/b.json", b"three", if_version=token)
    with pytest.raises(RecordConflictError):
        store.put("a/missing.json", b"x", if_version=token)
    assert store.get("a/b.json") == (b"two", newer) and store.digest("a/b.json") == newer
    assert (tmp_path / "a" / "b.json").read_bytes() == b"two"
    assert store.where("a/b.json") == str(tmp_path / "a" / "b.json")


def test_list_and_children_skip_hidden_files(tmp_path: Path) -> None:
    store = FileRecordStore(tmp_path)
    for key in ("m/x/snapshots/1.json", "m/x/snapshots/2.json", "m/y/active.json", "c/z.json"):
        store.put(key, b"{}")
    (tmp_path / "m" / "x" / "snapshots" / ".1.json.abc.tmp").write_bytes(b"partial")
    with store.lock("m/x"):
        pass
    assert store.list("m/x/") == ["m/x/snapshots/1.json", "m/x/snapshots/2.json"]
    assert store.list("m/x/snapshots/1") == ["m/x/snapshots/1.json"]
    assert store.list("nothing/") == []
    assert store.children("m/") == ["x", "y"] and store.children("") == ["c", "m"]
    assert (tmp_path / "m" / "x" / ".lock").exists()
    with pytest.raises(RecordStoreError, match="must end with '/'"):
        store.children("m")


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "a/.hidden", "."])
def test_bad_keys_are_named(key: str) -> None:
    with pytest.raises(RecordStoreError, match="is not valid"):
        check_key(key)


def test_names_become_one_safe_key_part() -> None:
    assert encode_part("org/chat-7b") == "org%2Fchat-7b"
    assert encode_part(".hidden") == "%2Ehidden"
    assert check_key(f"models/{encode_part('..')}/x") == "models/%2E./x"
    with pytest.raises(RecordStoreError, match="must not be empty"):
        encode_part("")
