"""The transcript's row codec: the ``raw_events`` rows a batch of ops becomes, the envelopes a
row reads back as, and the page cursor. Pure (no SQLite, no I/O): ``daemon.transcript_store``
runs the SQL around it.

A row holds one batch's run of a session's events: either their envelopes joined by newlines
(it starts with ``{``), or, when the batch has runs of spliced chunks, a MessagePack array of
segments ``[first_id, head, tail, joined]`` (a run's template and its updates joined by
newlines, or ``first_id`` 0 and envelopes joined by newlines). Either form reads back as the
same envelopes, byte for byte (:func:`row_events`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Sequence
from typing import Any, Final

import msgspec

from daemon.core.checksum import row_crc
from daemon.core.transcript_ops import AppendEvent, Op, RunTemplate

__all__ = ["CURSOR_PREFIX", "InvalidCursor", "RawRow", "Segment", "decode_cursor",
           "encode_cursor", "event_rows", "events_are_json", "op_runs", "row_events"]

#: What a transcript page cursor starts with (the version of its form).
CURSOR_PREFIX: Final = "tc1."


class InvalidCursor(ValueError):
    """A page cursor or ``beforeRecordId`` that names no record of the session."""


def encode_cursor(record_id: str) -> str:
    token = base64.urlsafe_b64encode(record_id.encode()).rstrip(b"=").decode("ascii")
    return CURSOR_PREFIX + token


def decode_cursor(cursor: str) -> str:
    if not cursor.startswith(CURSOR_PREFIX):
        raise InvalidCursor(f"invalid transcript cursor {cursor!r}")
    token = cursor[len(CURSOR_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        return raw.decode()
    except (binascii.Error, ValueError) as exc:
        raise InvalidCursor(f"invalid transcript cursor {cursor!r}") from exc


Segment = tuple[int, bytes, bytes, bytes]
_encode_segments: Final = msgspec.msgpack.Encoder().encode
_decode_segments: Final = msgspec.msgpack.Decoder(list[Segment]).decode
# What a segment adds to its bytes: the MessagePack headers of the array and its four members.
_SEGMENT_OVERHEAD: Final = 24


def _segment(op: AppendEvent) -> Segment:
    run = op.run
    if run is None:
        return (0, b"", b"", op.raw)
    return (run.first_id, run.head, run.tail, op.raw)


def _op_size(op: AppendEvent) -> int:
    run = op.run
    return len(op.raw) + (0 if run is None else len(run.head) + len(run.tail) + _SEGMENT_OVERHEAD)


#: A ``raw_events`` row as written: session_id, event_id, prompt_id, raw, crc.
RawRow = tuple[str, int, str | None, bytes, int]


def event_rows(ops: Sequence[AppendEvent], max_bytes: int) -> list[RawRow]:
    """One ``raw_events`` row per run of a session's events among ``ops``, split where it would
    pass ``max_bytes``, with the row's last id and prompt. A 100,000-chunk turn costs a few
    hundred rows, not 100,000, which keeps the transcript off the daemon's throughput budget.

    A row of ops none of which is a run of spliced chunks is their JSON joined with newlines
    (compact JSON never contains one); any other row is their segments (see the module
    docstring). Each row carries its checksum."""
    rows: list[RawRow] = []
    start = 0
    count = len(ops)
    while start < count:
        session_id = ops[start].session_id
        size = _op_size(ops[start])
        runs = ops[start].run is not None
        end = start + 1
        while end < count and ops[end].session_id == session_id:
            size += 1 + _op_size(ops[end])
            if size > max_bytes:
                break
            runs = runs or ops[end].run is not None
            end += 1
        last = ops[end - 1]
        if runs:
            raw = _encode_segments([_segment(op) for op in ops[start:end]])
        elif end == start + 1:
            raw = ops[start].raw
        else:
            raw = b"\n".join([op.raw for op in ops[start:end]])
        rows.append((session_id, last.event_id, last.prompt_id, raw,
                     row_crc(session_id, last.event_id, last.prompt_id, raw)))
        start = end
    return rows


def row_events(raw: bytes) -> list[bytes]:
    """The envelopes a ``raw_events`` row holds, in order (see :func:`event_rows`). Raises
    ``ValueError`` for a row that is neither form: a reader must not be handed bytes that are
    not an event."""
    if raw[:1] == b"{":
        return raw.split(b"\n")
    try:
        segments = _decode_segments(raw)
    except msgspec.DecodeError as exc:
        raise ValueError(f"a raw_events row that is neither form ({exc})") from None
    # The frame codec (and the event types it splices with) loads with the first row of runs
    # read back, not with the store: a daemon reading no events has no use for it.
    from daemon.core.frame_codec import run_envelopes

    events: list[bytes] = []
    for first_id, head, tail, joined in segments:
        if first_id == 0:
            events.extend(joined.split(b"\n"))
        else:
            events.extend(run_envelopes(RunTemplate(first_id, head, tail), joined.split(b"\n")))
    return events


_decode_object: Final = msgspec.json.Decoder(dict[str, Any]).decode


def events_are_json(raw: bytes, *, whole_row: bool) -> bool:
    """Does ``raw`` (a raw_events row when ``whole_row``, else one record) hold nothing but
    JSON objects?"""
    try:
        for event in (row_events(raw) if whole_row else [raw]):
            _decode_object(event)
    except (ValueError, msgspec.DecodeError):
        return False
    return True


def op_runs(ops: Sequence[Op]) -> Iterator[Sequence[Op]]:
    """Split ``ops`` into runs: consecutive AppendEvents together (one executemany), every
    other op alone. Order is preserved."""
    start = 0
    n = len(ops)
    while start < n:
        end = start + 1
        if isinstance(ops[start], AppendEvent):
            while end < n and isinstance(ops[end], AppendEvent):
                end += 1
        yield ops[start:end]
        start = end
