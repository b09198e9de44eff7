"""The three settings that point at a replicated index (the exporter's staleness probe,
`redline index`, the index playbooks) share one definition and build the same IndexConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from redline.exporters.settings import IndexStalenessSection
from redline.platform.index import IndexConfig, IndexSettings, TargetSpec
from redline.remediation.playbook import PlaybookError
from redline.remediation.playbooks.index import build_index_config
from redline.remediation.settings import VectorIndexSettings

TARGETS: dict[str, Any] = {
    "primary_uri": "http://127.0.0.1:1",
    "replica_uri": "http://127.0.0.1:2",
    "replica_collection": "documents_copy",
    "replica_name": "eu-replica",
    "metric_type": "L2",
}
EXPECTED = IndexConfig(
    collection="documents",
    dim=8,
    primary=TargetSpec("http://127.0.0.1:1", "documents", "primary", "t"),
    replica=TargetSpec("http://127.0.0.1:2", "documents_copy", "eu-replica", "t"),
    region="primary",
    metric_type="L2",
)


def test_every_settings_class_builds_the_same_index_config() -> None:
    probe = IndexStalenessSection(collection="documents", dim=8, **TARGETS)
    assert probe.index_config(probe.collection, probe.dim, "t", probe.region) == EXPECTED
    cli = IndexSettings(collection="documents", dim=8, **TARGETS)
    assert cli.collection_config("t") == EXPECTED  # `redline index` honours metric_type too
    playbooks = VectorIndexSettings(collections={"documents": {"dim": 8, **TARGETS}})
    assert build_index_config("documents", playbooks, "t") == EXPECTED


def test_playbook_targets_are_never_defaulted_and_unknown_collections_are_named() -> None:
    with pytest.raises(ValidationError, match="primary_uri"):
        VectorIndexSettings(collections={"documents": {"dim": 8}})
    settings = VectorIndexSettings(collections={"documents": {"dim": 8, **TARGETS}})
    with pytest.raises(PlaybookError, match=r"'orders' is not configured .*configured: documents"):
        build_index_config("orders", settings)


def test_the_same_copy_twice_is_refused() -> None:
    same = {**TARGETS, "replica_uri": TARGETS["primary_uri"], "replica_collection": None}
    settings = VectorIndexSettings(collections={"documents": {"dim": 8, **same}})
    with pytest.raises(PlaybookError, match="same collection on the same Milvus"):
        build_index_config("documents", settings)


def test_playbooks_refuse_a_pair_replicated_by_something_else(tmp_path: Path) -> None:
    external = VectorIndexSettings(
        collections={"documents": {"dim": 8, **TARGETS, "replication": "external"}}
    )
    with pytest.raises(PlaybookError, match=r"documents: replicated by something else"):
        build_index_config("documents", external)
    unreadable = VectorIndexSettings(
        collections={"documents": {"dim": 8, **TARGETS, "replica_token_file": tmp_path / "none"}}
    )
    with pytest.raises(PlaybookError, match=r"documents: replica_token_file: cannot read"):
        build_index_config("documents", unreadable)
