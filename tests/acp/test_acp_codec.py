"""The pure ACP JSON-RPC line codec: splitting, parsing, encoding, request matching."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.core.acp_codec import (
    MAX_LINE_BYTES,
    METHOD_NOT_FOUND,
    LineSplitter,
    Malformed,
    Notification,
    PendingRequests,
    Request,
    Response,
    RpcError,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
    parse_message,
)

# -- LineSplitter ------------------------------------------------------------------------------

_line_bytes = st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b"\r" not in b)


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for point in [*points, len(data)]:
        pieces.append(data[last:point])
        last = point
    return pieces


@given(
    lines=st.lists(_line_bytes, max_size=30),
    crlf=st.lists(st.booleans(), min_size=30, max_size=30),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
)
def test_splitting_is_independent_of_chunk_boundaries(
    lines: list[bytes], crlf: list[bool], cuts: list[int]
) -> None:
    stream = b"".join(line + (b"\r\n" if crlf[i] else b"\n") for i, line in enumerate(lines))
    splitter = LineSplitter()
    out: list[bytes] = []
    for piece in _cut(stream, cuts):
        out.extend(splitter.feed(piece))
    assert out == lines
    assert splitter.buffered_bytes == 0
    assert splitter.discarded_lines == 0


@given(
    lines=st.lists(st.binary(max_size=30).filter(lambda b: b"\n" not in b), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
    cap=st.integers(min_value=1, max_value=25),
)
def test_oversized_lines_are_dropped_wherever_the_chunks_fall(
    lines: list[bytes], cuts: list[int], cap: int
) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    splitter = LineSplitter(max_line_bytes=cap)
    out: list[bytes] = []
    for piece in _cut(stream, cuts):
        out.extend(splitter.feed(piece))
        assert splitter.buffered_bytes <= cap

    def clean(line: bytes) -> bytes:
        return line[:-1] if line.endswith(b"\r") else line

    expected = [clean(line) for line in lines if len(line) <= cap and clean(line)]
    assert out == expected
    assert splitter.discarded_lines == sum(1 for line in lines if len(line) > cap)


def test_crlf_and_blank_lines() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b'{"a":1}\r\n\r\n\n{"b":2}\r') == [b'{"a":1}']
    assert splitter.feed(b"\n") == [b'{"b":2}']


def test_partial_line_waits_for_its_newline() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b'{"jsonrpc":') == []
    assert splitter.buffered_bytes == len(b'{"jsonrpc":')
    assert splitter.feed(b'"2.0"}\n{"x"') == [b'{"jsonrpc":"2.0"}']
    assert splitter.feed(b":1}\n") == [b'{"x":1}']


def test_a_line_over_16_mib_is_discarded_without_being_buffered() -> None:
    splitter = LineSplitter()
    assert splitter.max_line_bytes == MAX_LINE_BYTES == 16 * 1024 * 1024
    piece = b"x" * (256 * 1024)
    out = splitter.feed(b'{"before":1}\n' + piece)
    assert out == [b'{"before":1}']
    fed = len(piece)
    while fed <= MAX_LINE_BYTES + 2 * len(piece):
        assert splitter.feed(piece) == []
        fed += len(piece)
        assert splitter.buffered_bytes <= MAX_LINE_BYTES
    assert splitter.discarded_lines == 1
    assert splitter.buffered_bytes == 0  # discarding, not holding
    assert splitter.feed(b'xxx\n{"after":2}\n') == [b'{"after":2}']
    assert splitter.discarded_lines == 1


def test_a_line_of_exactly_the_cap_is_kept() -> None:
    splitter = LineSplitter(max_line_bytes=8)
    assert splitter.feed(b"12345678\n123456789\nok\n") == [b"12345678", b"ok"]
    assert splitter.discarded_lines == 1


def test_splitter_rejects_a_nonsense_cap() -> None:
    with pytest.raises(ValueError, match="max_line_bytes"):
        LineSplitter(max_line_bytes=0)


# -- parse_message -----------------------------------------------------------------------------


def test_parse_request() -> None:
    msg = parse_message(
        b'{"jsonrpc":"2.0","id":0,"method":"session/request_permission","params":{"sessionId":"s"}}'
    )
    assert msg == Request(id=0, method="session/request_permission", params={"sessionId": "s"})
    assert parse_message(b'{"jsonrpc":"2.0","id":"abc","method":"x"}') == Request(
        id="abc", method="x", params=None
    )


def test_parse_notification() -> None:
    line = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"chunk-0"}}}}'
    )
    msg = parse_message(line)
    assert isinstance(msg, Notification)
    assert msg.method == "session/update"
    assert msg.params["update"]["content"]["text"] == "chunk-0"


def test_parse_responses() -> None:
    assert parse_message(
        b'{"jsonrpc":"2.0","id":7,"result":{"stopReason":"end_turn"}}'
    ) == Response(id=7, result={"stopReason": "end_turn"})
    ok_null = parse_message(b'{"jsonrpc":"2.0","id":3,"result":null}')
    assert ok_null == Response(id=3, result=None, error=None)
    err = parse_message(
        b'{"jsonrpc":"2.0","id":4,"error":{"code":-32603,"message":"injected error","data":[1]}}'
    )
    assert err == Response(id=4, error=RpcError(code=-32603, message="injected error", data=[1]))
    parse_error = parse_message(
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"p"}}'
    )
    assert isinstance(parse_error, Response) and parse_error.id is None


def test_missing_jsonrpc_member_is_tolerated() -> None:
    assert parse_message(b'{"id":1,"result":{}}') == Response(id=1, result={})


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"not json at all", "invalid JSON"),
        (b'{"jsonrpc":"2.0","id":1,"result":{}', "invalid JSON"),
        (b"[1,2,3]", "not a JSON-RPC message"),
        (b'"a string"', "not a JSON-RPC message"),
        (b'{"jsonrpc":"1.0","id":1,"result":{}}', "unsupported jsonrpc version"),
        (b'{"jsonrpc":"2.0","id":1.5,"result":{}}', "not a JSON-RPC message"),
        (b'{"jsonrpc":"2.0","id":true,"result":{}}', "not a JSON-RPC message"),
        (b'{"jsonrpc":"2.0","method":5}', "not a JSON-RPC message"),
        (b'{"jsonrpc":"2.0","method":"m","params":3}', "params must be"),
        (b'{"jsonrpc":"2.0","id":null,"method":"m"}', "must not be null"),
        (b'{"jsonrpc":"2.0","id":1,"method":"m","result":1}', "both a method"),
        (b'{"jsonrpc":"2.0","id":1}', "neither a result nor an error"),
        (b'{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"m"}}', "both a result"),
        (b'{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"m"}}', "not a JSON-RPC message"),
        (b'{"jsonrpc":"2.0"}', "neither a method nor an id"),
        (b'{"jsonrpc":"2.0","id":null,"result":{}}', "non-null id"),
    ],
)
def test_malformed_lines(line: bytes, reason: str) -> None:
    msg = parse_message(line)
    assert isinstance(msg, Malformed)
    assert reason in msg.reason
    assert msg.excerpt == line[:200]


def test_malformed_excerpt_is_bounded() -> None:
    msg = parse_message(b"{" * 100_000)
    assert isinstance(msg, Malformed)
    assert len(msg.excerpt) == 200


@given(st.binary(max_size=200))
def test_parse_never_raises(line: bytes) -> None:
    assert isinstance(parse_message(line), Request | Notification | Response | Malformed)


# -- encoders ----------------------------------------------------------------------------------


def test_encoders_make_one_line_each_that_parses_back() -> None:
    request = encode_request(
        5, "session/prompt", {"sessionId": "s", "prompt": [{"type": "text", "text": "a\nb"}]}
    )
    notification = encode_notification("session/cancel", {"sessionId": "s"})
    result = encode_result("r1", {"outcome": {"outcome": "cancelled"}})
    error = encode_error(0, METHOD_NOT_FOUND, "Method not found: fs/read_text_file")
    for line in (request, notification, result, error):
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert json.loads(line)["jsonrpc"] == "2.0"
    assert parse_message(request.rstrip()) == Request(
        id=5,
        method="session/prompt",
        params={"sessionId": "s", "prompt": [{"type": "text", "text": "a\nb"}]},
    )
    assert parse_message(notification.rstrip()) == Notification(
        method="session/cancel", params={"sessionId": "s"}
    )
    assert parse_message(result.rstrip()) == Response(
        id="r1", result={"outcome": {"outcome": "cancelled"}}
    )
    assert json.loads(error) == {
        "jsonrpc": "2.0",
        "id": 0,
        "error": {"code": -32601, "message": "Method not found: fs/read_text_file"},
    }
    assert json.loads(encode_error(None, -32700, "Parse error"))["id"] is None


# -- PendingRequests ---------------------------------------------------------------------------


def test_pending_requests_match_replies_by_id() -> None:
    table: PendingRequests[str] = PendingRequests()
    first = table.allocate("initialize", "w1")
    second = table.allocate("session/new", "w2")
    assert first != second and len(table) == 2 and first in table
    matched = table.resolve(Response(id=second, result={"sessionId": "s"}))
    assert matched is not None and (matched.id, matched.method, matched.waiter) == (
        second,
        "session/new",
        "w2",
    )
    assert second not in table
    assert table.resolve(Response(id=second, result={})) is None  # answered twice
    assert table.unknown_replies == 1
    matched = table.resolve(Response(id=first, error=RpcError(code=-1, message="m")))
    assert matched is not None and matched.waiter == "w1"
    assert len(table) == 0


def test_pending_requests_report_unknown_ids() -> None:
    table: PendingRequests[int] = PendingRequests()
    request_id = table.allocate("session/prompt", 1)
    assert table.resolve(Response(id=999, result={})) is None
    assert table.resolve(Response(id=str(request_id), result={})) is None  # "1" is not 1
    assert table.resolve(Response(id=None, error=RpcError(code=-32700, message="p"))) is None
    assert table.unknown_replies == 3
    assert request_id in table


def test_pending_requests_discard_and_drain() -> None:
    table: PendingRequests[str] = PendingRequests()
    a = table.allocate("a", "wa")
    b = table.allocate("b", "wb")
    c = table.allocate("c", "wc")
    assert table.discard(b) is not None
    assert table.resolve(Response(id=b, result={})) is None  # a late reply after the caller left
    assert sorted(p.waiter for p in table.drain()) == ["wa", "wc"]
    assert len(table) == 0 and a not in table and c not in table
    assert table.allocate("d", "wd") > c  # ids are never reused


def test_deeply_nested_line_is_malformed_not_a_crash() -> None:
    depth = 100_000
    line = (b'{"jsonrpc":"2.0","method":"session/update","params":{"update":'
            + b"[" * depth + b"]" * depth + b"}}")
    msg = parse_message(line)
    assert isinstance(msg, Malformed)
