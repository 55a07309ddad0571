"""The transcript's row codec without SQLite (daemon/core/transcript_rows.py): the rows a batch
of ops becomes read back as the batch's envelopes, byte for byte, whatever the row cap; the page
cursor names the record it was made for and refuses anything else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.core.checksum import row_crc
from daemon.core.frame_codec import EnvelopeSplicer, run_envelopes
from daemon.core.transcript_ops import AppendEvent
from daemon.core.transcript_rows import (
    InvalidCursor,
    decode_cursor,
    encode_cursor,
    event_rows,
    events_are_json,
    row_events,
)
from tests.hypothesis_profiles import examples

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), max_size=12)


def _chunk(text: str) -> bytes:
    return (b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"%b"}}'
            % text.replace("\\", "\\\\").replace('"', '\\"').encode())


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[AppendEvent], dict[str, list[bytes]]]:
    """Ops of two sessions, some single envelopes, some runs of spliced chunks, and the
    envelopes each session's ops stand for, in order."""
    ops: list[AppendEvent] = []
    expected: dict[str, list[bytes]] = {"a": [], "b": []}
    next_id = {"a": 1, "b": 1}
    for _ in range(draw(st.integers(1, 8))):
        sid = draw(st.sampled_from(["a", "b"]))
        first = next_id[sid]
        if draw(st.booleans()):
            updates = [_chunk(text) for text in draw(st.lists(TEXT, min_size=1, max_size=5))]
            splicer = EnvelopeSplicer(sid, draw(st.sampled_from([None, "p%1"])), None, 7)
            events, template = splicer.run(first, updates)
            ops.append(AppendEvent(sid, first + len(updates) - 1, None, b"\n".join(updates),
                                   template))
            expected[sid] += [event.raw for event in events]
            assert run_envelopes(template, updates) == [event.raw for event in events]
            next_id[sid] += len(updates)
        else:
            raw = b'{"id":%d,"v":1,"type":"x","data":%b}' % (first, _chunk(draw(TEXT)))
            ops.append(AppendEvent(sid, first, None, raw))
            expected[sid].append(raw)
            next_id[sid] += 1
    return ops, expected


@settings(max_examples=examples(150), deadline=None)
@given(batches(), st.integers(64, 4096))
def test_rows_read_back_as_the_envelopes_of_their_ops(
        batch: tuple[list[AppendEvent], dict[str, list[bytes]]], max_bytes: int) -> None:
    ops, expected = batch
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    for session_id, event_id, prompt_id, raw, crc in event_rows(ops, max_bytes):
        assert crc == row_crc(session_id, event_id, prompt_id, raw)
        events = row_events(raw)
        assert events_are_json(raw, whole_row=True)
        assert b'"id":%d,' % event_id in events[-1]  # a row's id is its last event's
        got[session_id] += events
    assert got == expected


def test_a_row_of_neither_form_is_refused() -> None:
    with pytest.raises(ValueError, match="neither form"):
        row_events(b"\x93garbage")
    assert not events_are_json(b"\x93garbage", whole_row=True)
    assert not events_are_json(b"[1]", whole_row=False)


@given(st.text(max_size=40))
def test_a_cursor_names_its_record(record_id: str) -> None:
    assert decode_cursor(encode_cursor(record_id)) == record_id


@pytest.mark.parametrize("cursor", ["", "tc2.abc", "abc", "tc1.gA"])
def test_a_cursor_of_another_form_is_refused(cursor: str) -> None:
    with pytest.raises(InvalidCursor):
        decode_cursor(cursor)
