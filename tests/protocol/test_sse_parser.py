"""The incremental SSE parser: framing, field rules, invalid frames, buffer cap, chunking."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdk._errors import SSEBufferOverflow
from sdk.protocol.envelope import DaemonEvent
from sdk.protocol.sse import MAX_BUFFER_BYTES, SSEParser, parse_sse


def frame(env: dict[str, Any], nl: str = "\n") -> bytes:
    """An SSE frame the way the daemon writes it (id only when the event has one)."""
    lines = []
    if "id" in env:
        lines.append(f"id: {env['id']}")
    lines.append(f"event: {env['type']}")
    lines.append("data: " + msgspec.json.encode(env).decode())
    return (nl.join(lines) + nl + nl).encode()


def env(ident: int | None, kind: str = "session_update", **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"v": 1, "type": kind, "data": {"n": ident}, **extra}
    if ident is not None:
        out["id"] = ident
    return out


def ids(events: list[DaemonEvent]) -> list[int | None]:
    return [e.id for e in events]


def test_reference_sample_stream() -> None:
    stream = (
        b"retry: 3000\n\n"
        + frame(env(2, promptId="p"))
        + frame(env(3))
        + b": heartbeat\n\n"
        + frame(env(None, "replay_complete"))
        + b": heartbeat\n\n"
    )
    events = parse_sse([stream])
    assert ids(events) == [2, 3, None]
    assert events[0].prompt_id == "p"
    assert events[2].type == "replay_complete"


def test_crlf_frames() -> None:
    stream = frame(env(1), "\r\n") + frame(env(2), "\r\n")
    assert ids(parse_sse([stream])) == [1, 2]


def test_mixed_line_endings() -> None:
    body = msgspec.json.encode(env(5)).decode()
    stream = (
        f"id: 5\r\nevent: x\ndata: {body}\r\n\ndata: {msgspec.json.encode(env(6)).decode()}\n\r\n"
    ).encode()
    assert ids(parse_sse([stream])) == [5, 6]


def test_crlf_split_between_chunks() -> None:
    stream = frame(env(1), "\r\n")
    cut = stream.index(b"\r\n") + 1  # between \r and \n
    parser = SSEParser()
    out = parser.feed(stream[:cut]) + parser.feed(stream[cut:])
    assert ids(out) == [1]


def test_comments_retry_id_and_event_lines_are_ignored() -> None:
    # The JSON carries the id; a contradicting id: or event: line changes nothing.
    data = msgspec.json.encode(env(9, "turn_complete")).decode()
    stream = f": a comment\nretry: 10\nid: 1234\nevent: other\ndata: {data}\n\n".encode()
    events = parse_sse([stream])
    assert ids(events) == [9] and events[0].type == "turn_complete"


def test_comment_only_and_empty_frames_yield_nothing() -> None:
    assert parse_sse([b": heartbeat\n\n\n\nretry: 3000\n\nid: 4\nevent: x\n\n"]) == []


def test_multiple_data_lines_are_joined_with_newline() -> None:
    stream = b'data: {"v":1,\ndata: "type":"multi",\ndata:"id":3}\n\n'
    events = parse_sse([stream])
    assert ids(events) == [3] and events[0].type == "multi"


def test_space_after_colon_is_optional() -> None:
    # With two spaces the value keeps one, which JSON tolerates; with none nothing is lost.
    stream = b'data:  {"v":1,"type":"a","id":1}\n\ndata:{"v":1,"type":"b","id":2}\n\n'
    assert [e.type for e in parse_sse([stream])] == ["a", "b"]


def test_data_line_without_colon_contributes_an_empty_line() -> None:
    stream = b'data: {"v":1,\ndata\ndata: "type":"a","id":1}\n\n'
    events = parse_sse([stream])
    assert ids(events) == [1]


def test_field_named_like_data_prefix_is_not_data() -> None:
    stream = b'dataset: {"v":1,"type":"a","id":1}\n\n'
    assert parse_sse([stream]) == []


@pytest.mark.parametrize(
    "bad",
    [
        {"v": 2, "type": "x", "id": 1},
        {"v": True, "type": "x", "id": 1},
        {"type": "x", "id": 1},
        {"v": 1, "type": 3, "id": 1},
        {"v": 1, "type": "x", "id": True},
        {"v": 1, "type": "x", "id": 0},
        {"v": 1, "type": "x", "id": 2**53},
        {"v": 1, "type": "x", "id": -4},
        [1, 2, 3],
        "string",
        None,
    ],
)
def test_invalid_frames_are_skipped_silently(bad: Any) -> None:
    stream = frame(env(1)) + b"data: " + msgspec.json.encode(bad) + b"\n\n" + frame(env(2))
    assert ids(parse_sse([stream])) == [1, 2]


def test_non_json_frame_is_skipped() -> None:
    stream = frame(env(1)) + b"data: {not json\n\n" + b"data: \xff\xfe\n\n" + frame(env(2))
    assert ids(parse_sse([stream])) == [1, 2]


def test_max_safe_id_is_accepted() -> None:
    assert ids(parse_sse([frame(env(2**53 - 1))])) == [2**53 - 1]


def test_trailing_partial_frame_is_discarded_at_close() -> None:
    parser = SSEParser()
    complete = parser.feed(frame(env(1)) + b'data: {"v":1,"type":"x","id":2}\n')
    assert ids(complete) == [1]
    assert parser.pending_bytes > 0
    assert parser.close() == []
    assert parser.pending_bytes == 0


def test_feed_after_close_is_an_error() -> None:
    parser = SSEParser()
    parser.close()
    with pytest.raises(RuntimeError, match="after close"):
        parser.feed(b"data: x\n\n")


def test_leading_bom_is_ignored() -> None:
    assert ids(parse_sse([b"\xef\xbb", b"\xbf" + frame(env(1))])) == [1]


def test_oversized_unterminated_buffer_raises() -> None:
    parser = SSEParser(max_buffer=1024)
    parser.feed(b"data: " + b"x" * 1000)
    with pytest.raises(SSEBufferOverflow, match="1024"):
        parser.feed(b"y" * 100)


def test_oversized_frame_over_many_data_lines_raises() -> None:
    parser = SSEParser(max_buffer=1024)
    with pytest.raises(SSEBufferOverflow):
        for _ in range(100):
            parser.feed(b"data: " + b"z" * 50 + b"\n")


def test_default_cap_is_16_mib() -> None:
    assert MAX_BUFFER_BYTES == 16 * 1024 * 1024
    parser = SSEParser()
    parser.feed(b"data: " + b"a" * (MAX_BUFFER_BYTES - 100))
    with pytest.raises(SSEBufferOverflow):
        parser.feed(b"a" * 200)


def test_large_stream_in_one_chunk_is_not_an_overflow() -> None:
    # Complete frames are consumed as they are found; only the unfinished tail counts.
    parser = SSEParser(max_buffer=4096)
    stream = b"".join(frame(env(i)) for i in range(1, 501))
    assert len(stream) > 4096
    assert ids(parser.feed(stream)) == list(range(1, 501))


# --- property: chunk boundaries never change the result ----------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=12)
)
payloads = st.dictionaries(st.text(max_size=6), json_scalars, max_size=3)


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[int | None]]:
    parts: list[bytes] = [b"retry: 3000\n\n"]
    expected: list[int | None] = []
    next_id = 1
    for _ in range(draw(st.integers(0, 12))):
        nl = draw(st.sampled_from(["\n", "\r\n"]))
        kind = draw(st.sampled_from(["event", "synthetic", "heartbeat", "invalid"]))
        if kind == "heartbeat":
            parts.append(f": heartbeat{nl}{nl}".encode())
        elif kind == "invalid":
            bad = draw(
                st.sampled_from([{"v": 2, "type": "x"}, {"v": 1, "type": "x", "id": True}, [1], 5])
            )
            parts.append(b"data: " + msgspec.json.encode(bad) + (nl * 2).encode())
        else:
            ident = next_id if kind == "event" else None
            if ident is not None:
                next_id += 1
            body = env(ident, draw(st.sampled_from(["session_update", "turn_complete"])))
            body["data"] = draw(payloads)
            parts.append(frame(body, nl))
            expected.append(ident)
    return b"".join(parts), expected


@given(data=streams(), cuts=st.lists(st.integers(0, 10_000), max_size=20))
def test_chunking_does_not_change_events(
    data: tuple[bytes, list[int | None]], cuts: list[int]
) -> None:
    stream, expected = data
    whole = parse_sse([stream])
    assert ids(whole) == expected
    points = sorted({c % (len(stream) + 1) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    assert parse_sse(chunks) == whole


@given(data=streams())
def test_byte_by_byte_feed_matches_whole(data: tuple[bytes, list[int | None]]) -> None:
    stream, _ = data
    parser = SSEParser()
    out: list[DaemonEvent] = []
    for i in range(len(stream)):
        out.extend(parser.feed(stream[i : i + 1]))
    assert out == parse_sse([stream])
