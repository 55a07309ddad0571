"""SSE parser details pinned down by mutation testing: the stream-leading BOM only, how many
bytes an unfinished frame holds (what the 16 MiB cap counts), the ``retry:`` field, and the
exact two-line join."""

from __future__ import annotations

import pytest

from sdk._errors import SSEBufferOverflow
from sdk.protocol.sse import SSEParser, parse_sse

BOM = b"\xef\xbb\xbf"
ONE = b'{"v":1,"type":"a","id":1}'
TWO = b'{"v":1,"type":"b","id":2}'


def test_a_bom_before_the_first_data_line_is_stripped() -> None:
    assert [e.id for e in parse_sse([BOM + b"data: " + ONE + b"\n\n"])] == [1]


def test_only_the_stream_leading_bom_is_stripped() -> None:
    # WHATWG: the BOM is skipped once, at the very start; later it is part of the line.
    stream = b"data: " + ONE + b"\n\n" + BOM + b"data: " + TWO + b"\n\n"
    assert [e.id for e in parse_sse([stream])] == [1]


def test_two_data_lines_are_joined_with_one_newline() -> None:
    events = parse_sse([b'data: {"v":1,"type":"m",\ndata: "id":5}\n\n'])
    assert [(e.type, e.id) for e in events] == [("m", 5)]


def test_pending_bytes_count_the_data_values_and_the_unfinished_line() -> None:
    parser = SSEParser()
    assert parser.pending_bytes == 0
    parser.feed(b"data: abc\n")  # value "abc" (one leading space stripped) + its newline
    assert parser.pending_bytes == 4
    parser.feed(b"data:xy\n")
    assert parser.pending_bytes == 4 + 3
    parser.feed(b"data\n")  # a bare field name is an empty value
    assert parser.pending_bytes == 4 + 3 + 1
    parser.feed(b"event: x\nid: 9\n: comment\nretry: 5\n")  # other fields hold nothing
    assert parser.pending_bytes == 8
    parser.feed(b"dat")  # the unfinished line
    assert parser.pending_bytes == 8 + 3
    parser.feed(b"a: z\n\n")  # the frame ends (not JSON: dropped) and nothing is held
    assert parser.pending_bytes == 0


def test_the_cap_counts_exactly_the_pending_bytes() -> None:
    parser = SSEParser(max_buffer=10)
    parser.feed(b"data: 12345\n")  # 6 held
    parser.feed(b"data: 123\n")  # 4 more: 10, at the cap, not beyond it
    assert parser.pending_bytes == 10
    assert parser.feed(b"\n") == []


def test_a_one_byte_buffer_is_allowed_and_a_zero_one_refused() -> None:
    assert SSEParser(max_buffer=1).pending_bytes == 0
    with pytest.raises(ValueError, match=r"^max_buffer must be positive, got 0$"):
        SSEParser(max_buffer=0)


def test_feed_after_close_names_the_mistake() -> None:
    parser = SSEParser()
    parser.close()
    with pytest.raises(RuntimeError, match=r"^SSEParser\.feed\(\) after close\(\)$"):
        parser.feed(b"data: x\n\n")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"retry: 1500", 1500),
        (b"retry:250", 250),
        (b"retry:  15", None),  # one space is stripped, the second is part of the value
        (b"retry: 15x", None),
        (b"retry: abc", None),
        (b"retry:", None),
        (b"retry: -5", None),
        (b"retry: 1.5", None),
        (b"RETRY: 10", None),
        (b"Retry: 10", None),
    ],
)
def test_retry_sets_the_reconnection_time_only_for_ascii_digits(
    line: bytes, expected: int | None
) -> None:
    parser = SSEParser()
    assert parser.retry_ms is None
    assert parser.feed(line + b"\n") == []
    assert parser.retry_ms == expected
    assert parser.pending_bytes == 0


def test_the_last_valid_retry_wins_and_an_invalid_one_keeps_it() -> None:
    parser = SSEParser()
    parser.feed(b"retry: 100\n\nretry: 200\nretry: nope\n")
    assert parser.retry_ms == 200


def test_a_chunk_starting_with_the_blank_line_ends_the_frame_even_if_it_ends_in_cr() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: " + ONE + b"\n") == []
    # The blank line is the chunk's first byte; the chunk happens to end in a bare CR.
    assert [e.id for e in parser.feed(b"\ndata: " + TWO + b"\r")] == [1]
    assert [e.id for e in parser.feed(b"\n\n")] == [2]


def test_an_overflow_reports_the_pending_size_and_closes_the_parser() -> None:
    parser = SSEParser(max_buffer=10)
    parser.feed(b"data: 1234\n")  # 5 held
    with pytest.raises(SSEBufferOverflow, match=r"^SSE frame exceeds the 10-byte buffer "
                       r"without ending \(12 bytes pending\)$"):
        parser.feed(b"data: 1")  # + 7 unfinished bytes
    with pytest.raises(RuntimeError):
        parser.feed(b"\n\n")
