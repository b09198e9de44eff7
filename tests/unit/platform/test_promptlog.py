"""The prompt log's pure parts: Merkle trees and proofs, the root chain, batch diagnosis."""

from __future__ import annotations

import hashlib
import json

import pytest

from redline.gateway.promptcapture import answer_text, prompt_text, session_of, streamed_text
from redline.platform.promptlog import (
    GENESIS,
    BatchEntry,
    Head,
    PromptLogError,
    PromptRecord,
    build_batch,
    build_levels,
    build_record,
    check_chain,
    check_tree,
    compare_copies,
    content_hash,
    diagnose_batch,
    inclusion_proof,
    leaf_hash,
    node_hash,
    parse_record,
    record_content_hash,
    record_line,
    split_levels,
    verify_proof,
)
from redline.platform.redaction import build_redactor


def leaves(n: int) -> list[bytes]:
    return [leaf_hash(f"t{k}", "s", f"{k:064x}") for k in range(n)]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 100])
def test_every_leaf_proves_its_inclusion(count: int) -> None:
    levels = build_levels(leaves(count))
    root = levels[-1][0]
    for index, leaf in enumerate(levels[0]):
        proof = inclusion_proof(levels, index)
        assert verify_proof(leaf, index, count, proof, root)
        # The proof binds the position: the same leaf and proof at another index fail.
        for other in {index ^ 1, (index + 1) % count} - {index}:
            assert not verify_proof(leaf, other, count, proof, root)
        if proof:
            forged = [bytes(32), *proof[1:]]
            assert not verify_proof(leaf, index, count, forged, root)
            assert not verify_proof(leaf, index, count, proof[:-1], root)


def test_known_small_tree() -> None:
    a, b, c = leaves(3)
    assert build_levels([a, b, c])[-1][0] == node_hash(node_hash(a, b), c)


def test_leaf_and_node_are_domain_separated() -> None:
    a, b = leaves(2)
    assert node_hash(a, b) == hashlib.sha256(b"\x01" + a + b).digest()
    framed = b"".join(len(x).to_bytes(4, "big") + x for x in (b"t", b"s", b"c"))
    assert leaf_hash("t", "s", "c") == hashlib.sha256(b"\x00" + framed).digest()
    # Framing: moving a character from one field to the next changes the leaf.
    assert leaf_hash("a", "bc", "d") != leaf_hash("ab", "c", "d")


def records(n: int, session: str = "s1") -> list[PromptRecord]:
    return [
        PromptRecord(f"2026-01-01T00:00:{k:02d}.000000+00:00", session, f"r{k}", f"p{k}", f"a{k}")
        for k in range(n)
    ]


def chain(batches: int) -> list[BatchEntry]:
    out: list[BatchEntry] = []
    prev, offset, tree_at = GENESIS, 0, 0
    for b in range(batches):
        built = build_batch(records(3), b, prev, offset, tree_at)
        out.append(built.entry)
        prev, offset, tree_at = built.entry.chain, built.entry.records_end, built.entry.tree_end
    return out


def test_batch_roundtrip_and_index() -> None:
    built = build_batch(records(5) + records(2, "s2"), 4, "ab" * 32, 1000, 64)
    entry = built.entry
    assert entry.count == 7 and entry.prev == "ab" * 32 and entry.records_offset == 1000
    assert entry.chain == entry.expected_chain()
    assert BatchEntry.parse(entry.render()) == entry
    assert split_levels(built.tree, 7)[-1][0].hex() == entry.root
    assert [x.split(":")[:2] for x in built.index["s2"]] == [["4", "5"], ["4", "6"]]
    lines = built.records.splitlines()
    offset, length = (int(x) for x in built.index["s2"][0].split(":")[2:])
    assert built.records[offset - 1000 : offset - 1000 + length].rstrip(b"\n") == lines[5]
    assert diagnose_batch(entry, lines, built.tree) == []


def test_chain_checks() -> None:
    entries = chain(4)
    lines = [e.render() for e in entries]
    head = Head(4, entries[-1].chain)
    assert check_chain(lines, head, "redis")[1] == []
    # An edited root breaks that entry's chain hash.
    edited = json.loads(lines[2]) | {"root": "00" * 32}
    problems = check_chain([*lines[:2], json.dumps(edited), lines[3]], head, "redis")[1]
    assert [(p.batch, "edited" in p.reason) for p in problems] == [(2, True)]
    # A removed root: the next one sits at the wrong position.
    problems = check_chain([lines[0], lines[2], lines[3]], head, "redis")[1]
    assert problems[0].batch == 1 and "removed" in problems[0].reason
    # Two roots swapped.
    problems = check_chain([lines[0], lines[2], lines[1], lines[3]], head, "redis")[1]
    assert problems[0].batch == 1
    # The last root removed: only the head can tell.
    problems = check_chain(lines[:3], head, "redis")[1]
    assert "head" in problems[0].reason
    # A root re-chained consistently in one copy: the copies disagree.
    assert compare_copies(entries, entries, "roots.jsonl") == []
    other = chain(4)[:2] + [
        entries[2].__class__(**{**entries[2].body(), "root": "11" * 32, "chain": "x"})
    ]
    found = compare_copies(entries, other, "roots.jsonl")
    assert found[0].batch == 2 and "root" in found[0].reason


def test_diagnose_edit_delete_reorder() -> None:
    built = build_batch(records(6), 0, GENESIS, 0, 0)
    lines = built.records.splitlines()
    entry, tree = built.entry, built.tree

    edited = json.loads(lines[3]) | {"answer": "changed"}
    found = diagnose_batch(entry, [*lines[:3], json.dumps(edited).encode(), *lines[4:]], tree)
    assert [(p.leaf, "edited" in p.reason) for p in found] == [(3, True)]

    # Edited with its content hash recomputed: the leaf no longer matches the anchored tree.
    forged = json.loads(lines[2]) | {"answer": "forged"}
    forged["content_hash"] = content_hash(forged["request"], forged["prompt"], forged["answer"])
    found = diagnose_batch(entry, [*lines[:2], json.dumps(forged).encode(), *lines[3:]], tree)
    assert [p.leaf for p in found] == [2]
    assert diagnose_batch(entry, [*lines[:2], json.dumps(forged).encode(), *lines[3:]], None)

    found = diagnose_batch(entry, [*lines[:4], *lines[5:]], tree)
    assert [(p.leaf, "deleted" in p.reason) for p in found] == [(4, True)]

    found = diagnose_batch(entry, [lines[0], lines[2], lines[1], *lines[3:]], tree)
    assert sorted(p.leaf for p in found if p.leaf is not None) == [1, 2]
    assert all("reordered" in p.reason for p in found)


def test_capture_helpers() -> None:
    payload = {"messages": [{"role": "user", "content": "mail me at a@b.io"}], "user": "u-7"}
    assert prompt_text(payload) == "user: mail me at a@b.io"
    assert prompt_text({"prompt": "hi"}) == "hi"
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "ok"}}]})
    assert answer_text(body.encode()) == "ok"
    assert answer_text(b"data: {}") is None
    assert session_of([("X-Redline-Session-Id", "sess-1")], payload, "r1") == "sess-1"
    assert session_of([], payload, "r1") == "u-7"
    assert session_of([], None, "r1") == "r1"
    record = build_record(0.0, "r1", "u-7", prompt_text(payload), "ok", build_redactor(), "text")
    assert record.prompt == "user: mail me at [REDACTED:email]"
    assert record.ts == "1970-01-01T00:00:00.000000+00:00"
    hashed = build_record(0.0, "r1", "u-7", "x", None, build_redactor(), "hashes")
    assert hashed.prompt is not None and hashed.prompt.startswith("sha256:")
    assert hashed.answer is None


def test_a_truncated_answer_is_marked_and_the_mark_is_hashed() -> None:
    whole = PromptRecord("t", "s", "r1", "p", "partial answer")
    cut = PromptRecord("t", "s", "r1", "p", "partial answer", truncated=True)
    line, digest = record_line(0, 0, cut)
    record = parse_record(line)
    assert record is not None and record["truncated"] is True
    assert record_content_hash(record) == record["content_hash"] == digest
    assert "truncated" not in json.loads(record_line(0, 0, whole)[0])
    assert digest != record_line(0, 0, whole)[1]
    # The mark removed (or set false) no longer matches the content hash, or is not a record.
    unmarked = {k: v for k, v in record.items() if k != "truncated"}
    assert record_content_hash(unmarked) != record["content_hash"]
    assert parse_record(json.dumps(record | {"truncated": False})) is None
    assert parse_record(json.dumps(record | {"extra": 1})) is None
    assert parse_record(b"[1, 2]") is None and parse_record(b"{nope") is None

    built = build_batch([whole, cut], 0, GENESIS, 0, 0)
    lines = built.records.splitlines()
    assert diagnose_batch(built.entry, lines, built.tree) == []
    stripped = json.loads(lines[1])
    del stripped["truncated"]
    found = diagnose_batch(built.entry, [lines[0], json.dumps(stripped).encode()], built.tree)
    assert [(p.leaf, "edited" in p.reason) for p in found] == [(1, True)]


def test_streamed_text_joins_the_deltas_raw_json_strings() -> None:
    assert streamed_text([b"Hello", b" w\\u00f6rld", b' \\"q\\"', b"\\n"]) == 'Hello wörld "q"\n'
    # A surrogate pair split over two deltas joins up; an undecodable part is skipped alone.
    assert streamed_text([b"\\ud83d", b"\\ude00!"]) == "\U0001f600!"
    assert streamed_text([b"ok", b"\\x", b" then"]) == "ok then"
    assert streamed_text([]) == ""
    record = build_record(
        0.0, "r", "s", "p", streamed_text([b"mail a@b.io"]), build_redactor(), "text", True
    )
    assert record.answer == "mail [REDACTED:email]" and record.truncated


def test_check_tree() -> None:
    built = build_batch(records(5), 0, GENESIS, 0, 0)
    assert check_tree(built.entry, built.tree) is None
    assert "cannot be read" in str(check_tree(built.entry, None))
    assert "cut" in str(check_tree(built.entry, built.tree[:-32]))
    edited = bytearray(built.tree)
    edited[5 * 32 + 3] ^= 1  # a node of the second level
    assert "do not hash" in str(check_tree(built.entry, bytes(edited)))
    other = build_batch(records(5, "s9"), 0, GENESIS, 0, 0)  # consistent, other leaves
    assert "another root" in str(check_tree(built.entry, other.tree))


def test_entries_name_their_segment() -> None:
    built = build_batch(records(2), 7, GENESIS, 0, 0, segment=3)
    assert built.entry.segment == 3 and '"segment":3' in built.entry.render()
    assert BatchEntry.parse(built.entry.render()) == built.entry
    moved = json.loads(built.entry.render()) | {"segment": 4}
    assert BatchEntry.parse(json.dumps(moved)).expected_chain() != built.entry.chain
    # Numbers locate bytes: a forged entry cannot pass a string, a bool or a negative for one.
    for field, value in (("segment", "4"), ("count", True), ("records_offset", -1), ("root", 1)):
        with pytest.raises(PromptLogError, match="wrong type"):
            BatchEntry.parse(json.dumps(moved | {field: value}))
