"""The lean RESP connection's wire format: URLs it speaks, commands it writes, replies it reads
(including replies split across reads); no process is started."""

from __future__ import annotations

import pytest

from redline.gateway.resp import Address, RespConnectionError, RespError, encode, lean_url, parse


def test_only_plain_redis_urls_take_the_lean_path() -> None:
    assert lean_url("redis://127.0.0.1:6390/2") == Address("127.0.0.1", 6390, 2)
    assert lean_url("redis://:s%40cret@cache") == Address("cache", 6379, 0, None, "s@cret")
    assert lean_url("redis://bob:pw@cache:1/0") == Address("cache", 1, 0, "bob", "pw")
    for other in (
        "rediss://cache:6379/0",
        "unix:///run/redis.sock",
        "redis+sentinel://s1:26379/mymaster",
        "redis://cache:6379/0?socket_timeout=1",
        "redis://cache/not-a-db",
    ):
        assert lean_url(other) is None, other


def test_commands_are_arrays_of_bulk_strings() -> None:
    assert encode(("EVALSHA", "ab", 1, 0.5)) == (
        b"*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$3\r\n0.5\r\n"
    )


def test_replies_parse_and_report_where_they_end() -> None:
    take = b"*2\r\n:1\r\n$7\r\n299.125\r\n"
    assert parse(take + b"+OK\r\n") == ([1, b"299.125"], len(take))
    assert parse(b"$-1\r\n") == (None, 5)
    error, end = parse(b"-NOSCRIPT No matching script\r\n")
    assert isinstance(error, RespError) and "NOSCRIPT" in str(error) and end == 30


def test_a_reply_cut_short_waits_for_more_bytes() -> None:
    take = b"*2\r\n:0\r\n$4\r\n-1.5\r\n"
    for cut in range(1, len(take)):
        with pytest.raises(Exception) as caught:
            parse(take[:cut])
        assert type(caught.value).__name__ == "_Incomplete", cut


def test_garbage_is_a_connection_error() -> None:
    with pytest.raises(RespConnectionError):
        parse(b"?what\r\n")
