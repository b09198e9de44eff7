"""Connecting to Milvus: gRPC keepalive per kind of URI (no `too_many_pings`, idle connections
kept alive off loopback), and credentials (token, user/password, per-copy token files) resolved
from settings and never shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from redline.core.settings import SettingsError
from redline.exporters.settings import IndexStalenessSection
from redline.platform.index import IndexSettings, is_local_uri, keepalive_options


@pytest.mark.parametrize(
    ("uri", "local"),
    [
        ("/var/lib/milvus/docs.db", True),
        ("http://127.0.0.1:19530", True),
        ("http://localhost:19530", True),
        ("http://127.0.0.2:19530", True),
        ("http://[::1]:19530", True),
        ("unix:/tmp/milvus.sock", True),
        ("http://milvus.prod.svc:19530", False),
        ("https://in01-abc.aws-us-west-2.vectordb.zillizcloud.com:19530", False),
    ],
)
def test_keepalive_pings_idle_connections_only_off_loopback(uri: str, local: bool) -> None:
    options = keepalive_options(uri)
    assert is_local_uri(uri) is local
    if local:  # Milvus Lite's gRPC server refuses pings between calls and faster than 5 min
        assert options["grpc.keepalive_time_ms"] == 330_000
        assert options["grpc.keepalive_permit_without_calls"] == 0
        assert "grpc.http2.max_pings_without_data" not in options
    else:  # Milvus (Go) accepts a ping every 5 s, idle or not; LBs drop idle connections
        assert options["grpc.keepalive_time_ms"] == 60_000
        assert options["grpc.keepalive_permit_without_calls"] == 1
        assert options["grpc.http2.max_pings_without_data"] == 0


def test_keepalive_can_be_set_but_never_below_what_milvus_accepts() -> None:
    options = keepalive_options("https://zilliz.example:443", 120.0, idle_pings=False)
    assert options["grpc.keepalive_time_ms"] == 120_000
    assert options["grpc.keepalive_permit_without_calls"] == 0
    with pytest.raises(ValueError, match="too_many_pings"):
        keepalive_options("http://milvus:19530", 5.0)
    with pytest.raises(ValidationError, match="milvus_keepalive_seconds"):
        IndexSettings(milvus_keepalive_seconds=5.0)


def test_settings_pass_keepalive_and_schema_choices_to_both_copies() -> None:
    settings = IndexSettings(
        milvus_keepalive_seconds=90.0, milvus_idle_pings=True, vector_field="dense",
        bookkeeping="dynamic",
    )  # fmt: skip
    config = settings.collection_config()
    for spec in (config.primary, config.replica):
        assert (spec.keepalive_seconds, spec.idle_pings) == (90.0, True)
        assert (spec.vector_field, spec.bookkeeping) == ("dense", "dynamic")
    external = IndexStalenessSection(replication="external", bookkeeping="dynamic")
    config = external.index_config("docs", 4)
    assert config.replication == "external"
    assert config.primary.bookkeeping == config.replica.bookkeeping == "none"


def test_user_and_password_become_the_token_and_never_show(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cr3t-pw\n")
    settings = IndexSettings(milvus_user="redline", milvus_password_file=secret)
    config = settings.collection_config()
    assert config.primary.token == config.replica.token == "redline:s3cr3t-pw"
    shown = f"{config!r} {settings!r} {config.primary} {settings.model_dump()}"
    assert "s3cr3t" not in shown
    from_env = IndexSettings(milvus_user="redline", milvus_password=SecretStr("envpw"))
    assert from_env.collection_config().primary.token == "redline:envpw"
    # an explicit token (e.g. a Zilliz API key) wins over user/password
    assert settings.collection_config("api-key").replica.token == "api-key"


def test_each_copy_may_have_its_own_token(tmp_path: Path) -> None:
    (tmp_path / "replica").write_text("replica-key")
    settings = IndexSettings(replica_token_file=tmp_path / "replica")
    config = settings.collection_config("shared-key")
    assert (config.primary.token, config.replica.token) == ("shared-key", "replica-key")


def test_unusable_credentials_are_refused_with_the_setting_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="milvus_user is set but no milvus_password"):
        IndexSettings(milvus_user="redline").collection_config()
    with pytest.raises(SettingsError, match="primary_token_file: cannot read"):
        IndexSettings(primary_token_file=tmp_path / "absent").collection_config()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SettingsError, match="milvus_password: .* is empty"):
        IndexSettings(milvus_user="u", milvus_password_file=tmp_path / "empty").collection_config()
