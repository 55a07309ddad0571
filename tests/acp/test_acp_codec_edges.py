"""ACP codec details pinned down by mutation testing: the exact reason a line is refused, the
line cap being inclusive on every path through the splitter, params arrays, request ids."""

from __future__ import annotations

import pytest

from daemon.core.acp_codec import (
    LineSplitter,
    Malformed,
    PendingRequests,
    Request,
    Response,
    parse_message,
)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"jsonrpc":"2.0","method":"m","params":3}', "params must be an object or an array"),
        (b'{"jsonrpc":"2.0","id":null,"method":"m"}', "request id must not be null"),
        (b'{"jsonrpc":"2.0","id":1,"method":"m","result":1}',
         "message has both a method and a result/error"),
        (b'{"jsonrpc":"2.0","id":1,"method":"m","error":{"code":1,"message":"x"}}',
         "message has both a method and a result/error"),
        (b'{"jsonrpc":"2.0","id":1}', "reply has neither a result nor an error"),
        (b'{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"m"}}',
         "reply has both a result and an error"),
        (b'{"jsonrpc":"2.0"}', "message has neither a method nor an id"),
        (b'{"jsonrpc":"2.0","id":null,"result":{}}', "success reply must have a non-null id"),
        (b'{"jsonrpc":"2.1","id":1,"result":{}}', "unsupported jsonrpc version '2.1'"),
        (b'{"jsonrpc":"2.0","method":"m","params":{"a":' + b"[" * 100_000 + b"]" * 100_000
         + b"}}", "JSON nested too deeply"),
    ],
)
def test_malformed_reason_names_the_broken_rule(line: bytes, reason: str) -> None:
    msg = parse_message(line)
    assert isinstance(msg, Malformed)
    assert msg.reason == reason


def test_params_may_be_an_array() -> None:
    assert parse_message(b'{"jsonrpc":"2.0","id":3,"method":"m","params":[1,"a"]}') == Request(
        id=3, method="m", params=[1, "a"])


@pytest.mark.parametrize(
    "chunks",
    [
        [b"123", b"45", b"678", b"\nok\n"],  # the partial line grows to exactly the cap
        [b"12345678", b"\nok\n"],  # one tail of exactly the cap
        [b"x\n12345678", b"\nok\n"],  # a tail of exactly the cap after a complete line
        [b"12345678\nok\n"],  # a complete line of exactly the cap
    ],
)
def test_a_line_of_exactly_the_cap_is_kept_wherever_the_chunks_fall(chunks: list[bytes]) -> None:
    splitter = LineSplitter(max_line_bytes=8)
    lines = [line for chunk in chunks for line in splitter.feed(chunk)]
    assert [line for line in lines if line != b"x"] == [b"12345678", b"ok"]
    assert splitter.discarded_lines == 0


def test_splitter_recovers_after_a_discarded_line() -> None:
    splitter = LineSplitter(max_line_bytes=4)
    assert splitter.feed(b"123456789") == []
    assert splitter.feed(b"more") == []
    assert splitter.feed(b"\nab") == []
    assert splitter.feed(b"cd\n") == [b"abcd"]
    assert splitter.discarded_lines == 1
    assert splitter.buffered_bytes == 0


def test_request_ids_count_up_from_one() -> None:
    table: PendingRequests[None] = PendingRequests()
    assert [table.allocate("m", None) for _ in range(3)] == [1, 2, 3]


def test_discarding_an_unknown_request_is_harmless() -> None:
    table: PendingRequests[None] = PendingRequests()
    request_id = table.allocate("m", None)
    assert table.discard(request_id) is not None
    assert table.discard(request_id) is None
    assert table.discard(42) is None


def test_a_boolean_reply_id_never_matches_request_one() -> None:
    table: PendingRequests[str] = PendingRequests()
    assert table.allocate("m", "w") == 1
    assert table.resolve(Response(id=True, result={})) is None
    assert 1 in table and table.unknown_replies == 1
