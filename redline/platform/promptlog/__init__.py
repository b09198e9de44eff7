"""The tamper-evident prompt log: redacted records in batches, a Merkle tree per batch, roots
chained and anchored in two places (Redis and `roots.jsonl`), and a session index for
trace-back without a scan.

Modules, bottom up: `errors`; `settings` (the gateway's `prompt_log:` section); `merkle` (leaf
and node hashes, levels, inclusion proofs: pure); `format` (records, their content hash and
segment lines, batches and their anchors, the chain's head: pure); `segments` (the records and
tree files, ranged reads); `verify` (both copies of the chain, the stored trees, the sealed
bytes of segments, the diagnosis of a batch that changed); `store` (`PromptLog`: append, anchor,
mirror, trace, verify); `watch` (the watcher: tampering reported as it happens, through
`inotify`), which is not imported here. Import from this package; the modules are its layout.
What the gateway captures of a request and its background writer live in `redline.gateway`.
"""

from __future__ import annotations

from redline.platform.promptlog.errors import PromptLogError
from redline.platform.promptlog.format import (
    EMPTY_HEAD,
    ENTRY_FIELDS,
    GENESIS,
    RECORD_FIELDS,
    TRUNCATED,
    BatchEntry,
    BuiltBatch,
    Head,
    PromptRecord,
    build_batch,
    build_record,
    canonical_json,
    content_hash,
    parse_record,
    record_content_hash,
    record_line,
    sha256_hex,
)
from redline.platform.promptlog.merkle import (
    build_levels,
    inclusion_proof,
    leaf_hash,
    level_sizes,
    node_hash,
    root_from_proof,
    split_levels,
    verify_proof,
)
from redline.platform.promptlog.segments import SegmentFiles, read_range, stored_proof
from redline.platform.promptlog.settings import PromptLogSettings
from redline.platform.promptlog.store import (
    SHIFTED,
    PromptLog,
    PromptLogKeys,
    Trace,
    TracedRecord,
    as_text,
    open_prompt_log,
    read_lines,
)
from redline.platform.promptlog.verify import (
    RESEALED,
    Problem,
    VerifyReport,
    check_chain,
    check_segments,
    check_tree,
    compare_copies,
    diagnose_batch,
)

__all__ = [
    "EMPTY_HEAD",
    "ENTRY_FIELDS",
    "GENESIS",
    "RECORD_FIELDS",
    "RESEALED",
    "SHIFTED",
    "TRUNCATED",
    "BatchEntry",
    "BuiltBatch",
    "Head",
    "Problem",
    "PromptLog",
    "PromptLogError",
    "PromptLogKeys",
    "PromptLogSettings",
    "PromptRecord",
    "SegmentFiles",
    "Trace",
    "TracedRecord",
    "VerifyReport",
    "as_text",
    "build_batch",
    "build_levels",
    "build_record",
    "canonical_json",
    "check_chain",
    "check_segments",
    "check_tree",
    "compare_copies",
    "content_hash",
    "diagnose_batch",
    "inclusion_proof",
    "leaf_hash",
    "level_sizes",
    "node_hash",
    "open_prompt_log",
    "parse_record",
    "read_lines",
    "read_range",
    "record_content_hash",
    "record_line",
    "root_from_proof",
    "sha256_hex",
    "split_levels",
    "stored_proof",
    "verify_proof",
]
