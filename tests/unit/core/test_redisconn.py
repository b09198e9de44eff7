"""The Redis URL forms the connection factory accepts, and the errors it names (no sockets)."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.sentinel
from redis.crc import key_slot

from redline.core.redisconn import (
    ClusterTarget,
    RedisConfigError,
    has_hash_tag,
    hash_tagged,
    is_cluster,
    is_cluster_url,
    is_sentinel_url,
    mask_url,
    open_async_redis,
    open_redis,
    parse_redis_url,
)
from redline.core.settings import SettingsError


def test_plain_urls_go_to_redis_py_unchanged() -> None:
    url = "redis://:pw@127.0.0.1:6390/3?socket_timeout=2"
    client = open_redis(url, decode_responses=True)
    expected = redis.Redis.from_url(url, decode_responses=True)
    assert parse_redis_url(url) is None
    assert isinstance(client.connection_pool, type(expected.connection_pool))
    ours, theirs = (
        client.connection_pool.connection_kwargs,
        expected.connection_pool.connection_kwargs,
    )
    simple = (str, int, float, bool, type(None))
    assert {k: v for k, v in ours.items() if isinstance(v, simple)} == {
        k: v for k, v in theirs.items() if isinstance(v, simple)
    }
    assert ours["password"] == "pw" and ours["db"] == 3 and ours["socket_timeout"] == 2.0


def test_rediss_url_keeps_its_tls_query_options() -> None:
    url = "rediss://h:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.pem"
    kwargs = open_redis(url).connection_pool.connection_kwargs
    assert kwargs["ssl_ca_certs"] == "/etc/ca.pem" and kwargs["ssl_cert_reqs"] == "required"


def test_sentinel_url_parses_hosts_master_db_and_credentials() -> None:
    url = (
        "redis+sentinel://app:s%40cret@10.0.0.1:26379,[::1]:26380,sentinel-c/mymaster/2"
        "?sentinel_password=sp&socket_timeout=1.5&min_other_sentinels=1"
    )
    target = parse_redis_url(url)
    assert target is not None
    assert target.sentinels == (("10.0.0.1", 26379), ("::1", 26380), ("sentinel-c", 26379))
    assert (target.master, target.db) == ("mymaster", 2)
    assert (target.username, target.password, target.sentinel_password) == ("app", "s@cret", "sp")
    assert target.min_other_sentinels == 1 and not target.ssl
    master = target.master_kwargs({"decode_responses": True})
    assert master["socket_timeout"] == 1.5 and master["db"] == 2 and master["password"] == "s@cret"
    assert target.sentinel_kwargs({})["password"] == "sp"
    assert is_sentinel_url(url) and not is_sentinel_url("redis://h/0")


def test_tls_sentinel_url_sets_tls_for_sentinels_and_primary() -> None:
    url = "rediss+sentinel://h:26379/m?ssl_ca_certs=/ca.pem&ssl_cert_reqs=none"
    target = parse_redis_url(url)
    assert target is not None and target.ssl
    for kwargs in (target.master_kwargs({}), target.sentinel_kwargs({})):
        assert kwargs["ssl"] is True and kwargs["ssl_ca_certs"] == "/ca.pem"
        assert kwargs["ssl_cert_reqs"] == "none"
    on = parse_redis_url("redis+sentinel://h/m/0?ssl=true")
    assert on is not None and on.ssl


def test_open_redis_on_a_sentinel_url_builds_a_sentinel_managed_client() -> None:
    client = open_redis("redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster/4", socket_timeout=3)
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster" and pool.connection_kwargs["db"] == 4
    aclient = open_async_redis("redis+sentinel://127.0.0.1:1/mymaster")
    assert isinstance(aclient, redis.asyncio.Redis)
    assert type(aclient.connection_pool).__name__ == "SentinelConnectionPool"


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("", "empty Redis URL"),
        ("http://h:6379/0", "unknown scheme 'http'"),
        ("redis+sentinel:///mymaster/0", "no sentinel address"),
        ("redis+sentinel://h:26379", "no master name"),
        ("redis+sentinel://h:26379/m/x", "database 'x' is not a number"),
        ("redis+sentinel://h:26379/m/0/extra", "is not /<master>/<db>"),
        ("redis+sentinel://h:99999/m", "bad port"),
        ("redis+sentinel://h:26379,,h2/m", "empty sentinel address"),
        ("redis+sentinel://h/m?socket_timeout=soon", "socket_timeout='soon' is not a number"),
        ("redis+sentinel://h/m?colour=blue", "unknown option 'colour'"),
        ("redis+sentinel://h/m?ssl_ca_certs=/ca.pem", "TLS options given without TLS"),
        ("redis+sentinel://h/m?ssl=maybe", "not a boolean"),
        ("rediss+sentinel://h/m?ssl_cert_reqs=always", "not one of none, optional, required"),
        ("redis://h:notaport/0", "malformed URL"),
    ],
)
def test_malformed_urls_name_the_setting_and_the_problem(url: str, what: str) -> None:
    with pytest.raises(RedisConfigError) as info:
        open_redis(url, setting="remediation.redis_url")
    message = str(info.value)
    assert message.startswith("remediation.redis_url: ") and what in message
    assert isinstance(info.value, SettingsError)


def test_passwords_never_appear_in_errors() -> None:
    url = "redis+sentinel://u:topsecret@h/m?sentinel_password=alsosecret&colour=x"
    with pytest.raises(RedisConfigError) as info:
        parse_redis_url(url)
    assert "topsecret" not in str(info.value) and "alsosecret" not in str(info.value)
    assert mask_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert mask_url("redis://pw@h:1/0") == "redis://***@h:1/0"
    assert mask_url("redis://h:1/0") == "redis://h:1/0"


# --- Cluster URLs ----------------------------------------------------------------------------


def test_cluster_url_parses_nodes_credentials_and_options() -> None:
    url = (
        "redis+cluster://app:s%40cret@10.0.0.1:7000,[::1]:7001,node-c/"
        "?socket_timeout=1.5&max_connections=20&client_name=redline"
    )
    target = parse_redis_url(url)
    assert isinstance(target, ClusterTarget)
    assert target.nodes == (("10.0.0.1", 7000), ("::1", 7001), ("node-c", 6379))
    assert (target.username, target.password, target.ssl) == ("app", "s@cret", False)
    kwargs = target.node_kwargs({"decode_responses": True, "socket_timeout": 9.0})
    assert kwargs["socket_timeout"] == 1.5  # the URL wins over the caller
    assert kwargs["decode_responses"] is True and kwargs["max_connections"] == 20
    assert kwargs["client_name"] == "redline" and kwargs["password"] == "s@cret"
    assert target.check_kwargs()["socket_connect_timeout"] == 2.0
    assert "max_connections" not in target.check_kwargs()
    assert is_cluster_url(url) and not is_cluster_url("redis+sentinel://h/m")
    assert not is_sentinel_url(url)
    assert parse_redis_url("redis+cluster://h:7000") == ClusterTarget(nodes=(("h", 7000),))
    assert isinstance(parse_redis_url("redis+cluster://:pw@h:7000/0"), ClusterTarget)


def test_tls_cluster_url_sets_tls_for_every_node() -> None:
    target = parse_redis_url("rediss+cluster://h:7000/?ssl_ca_certs=/ca.pem&ssl_cert_reqs=none")
    assert isinstance(target, ClusterTarget) and target.ssl
    kwargs = target.node_kwargs({})
    assert kwargs["ssl"] is True and kwargs["ssl_ca_certs"] == "/ca.pem"
    assert kwargs["ssl_cert_reqs"] == "none"
    on = parse_redis_url("redis+cluster://h:7000/?ssl=yes")
    assert isinstance(on, ClusterTarget) and on.ssl


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("redis+cluster:///", "no node address"),
        ("redis+cluster://h:7000/3", "a Redis Cluster has one database, 0"),
        ("redis+cluster://h:7000/0/x", "a Redis Cluster has one database, 0"),
        ("redis+cluster://h:70000/", "node address 'h:70000' has a bad port"),
        ("redis+cluster://h:7000,,h2:7001/", "empty node address (stray comma?)"),
        ("redis+cluster://:7000/", "node address ':7000' has no host"),
        ("redis+cluster://h/?socket_timeout=-1", "socket_timeout='-1' must be positive"),
        ("redis+cluster://h/?health_check_interval=5", "unknown option 'health_check_interval'"),
        ("redis+cluster://h/?sentinel_password=x", "unknown option 'sentinel_password'"),
        ("redis+cluster://h/?ssl_certfile=/c.pem", "TLS options given without TLS"),
        ("rediss+cluster://h/?ssl_check_hostname=perhaps", "not a boolean"),
        ("redis+clusters://h/", "unknown scheme 'redis+clusters'"),
    ],
)
def test_malformed_cluster_urls_name_the_setting_and_the_problem(url: str, what: str) -> None:
    with pytest.raises(RedisConfigError) as info:
        parse_redis_url(url, setting="gateway.redis_url")
    message = str(info.value)
    assert message.startswith("gateway.redis_url: ") and what in message, message
    if url.startswith("redis+cluster:"):
        assert "malformed Cluster URL" in message


def test_cluster_url_passwords_never_appear_in_errors() -> None:
    url = "redis+cluster://u:topsecret@h1:7000,h2:7001/?colour=x"
    with pytest.raises(RedisConfigError) as info:
        parse_redis_url(url, "gateway.redis_url")
    assert "topsecret" not in str(info.value)
    assert "redis+cluster://u:***@h1:7000,h2:7001/" in str(info.value)
    assert mask_url("rediss+cluster://secret@h:7000/") == "rediss+cluster://***@h:7000/"


def test_open_async_redis_on_a_cluster_url_builds_a_cluster_client_lazily() -> None:
    # The asyncio client reads the slot map at its first command: nothing is contacted here,
    # and options it has no parameter for (retry_on_timeout) are left out rather than refused.
    client = open_async_redis(
        "redis+cluster://127.0.0.1:1,127.0.0.1:2/?socket_timeout=3",
        decode_responses=True,
        retry_on_timeout=True,
    )
    assert isinstance(client, redis.asyncio.cluster.RedisCluster) and is_cluster(client)
    assert not is_cluster(redis.Redis())
    nodes = client.get_nodes() or [*client.nodes_manager.startup_nodes.values()]
    assert {(n.host, n.port) for n in nodes} == {("127.0.0.1", 1), ("127.0.0.1", 2)}
    assert all(n.connection_kwargs["socket_timeout"] == 3.0 for n in nodes)


@pytest.mark.parametrize(
    ("key", "tagged"),
    [
        ("redline:routing", "{redline:routing}"),
        ("{tenant-a}:routing", "{tenant-a}:routing"),
        ("a{b}c", "a{b}c"),
        ("a{}b", "{a{}b}"),  # an empty tag hashes the whole key: not a tag
        ("a}{b", "{a}{b}"),  # no "}" after the "{": no tag
        ("a{b", "{a{b}"),
    ],
)
def test_hash_tagged_keeps_a_real_tag_and_adds_one_otherwise(key: str, tagged: str) -> None:
    assert hash_tagged(key) == tagged
    assert has_hash_tag(tagged) and has_hash_tag(key) == (key == tagged)
    # What Redis Cluster computes: every key under the prefix lands in one slot.
    slots = {key_slot(f"{tagged}:{suffix}".encode()) for suffix in ("override", "x:eu", "")}
    assert len(slots) == 1
