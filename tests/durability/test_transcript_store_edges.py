"""Transcript-store details pinned down by mutation testing: paging limits and
cursors, the refusal texts, and reading records back by id (more than one SQL batch)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from daemon.transcript_store import InvalidCursor, TranscriptDatabase, UpsertSession
from tests.builders.transcript_store import S1, S2, append, finish, rec


@pytest.fixture
def store(tmp_path: Path) -> TranscriptDatabase:
    s = TranscriptDatabase(tmp_path / "transcript.db")
    s.apply([UpsertSession(S1, "/w", 100, "acp-1"), UpsertSession(S2, "/w2", 200)])
    return s


def test_pages_walk_back_exactly_limit_records_at_a_time(store: TranscriptDatabase) -> None:
    records = [rec(n) for n in range(1, 8)]
    store.apply([finish(S1, None, records), append(S1, 50)])
    first = store.page(S1, limit=3)
    assert first.events[:3] == [raw for _, raw in records[4:]]
    assert len(first.events) == 4  # plus the unfinished turn's raw event
    assert first.has_more and first.next_cursor is not None
    second = store.page(S1, limit=3, cursor=first.next_cursor)
    assert second.events == [raw for _, raw in records[1:4]]
    assert second.has_more and second.next_cursor is not None
    third = store.page(S1, limit=3, cursor=second.next_cursor)
    assert third.events == [records[0][1]]
    assert (third.has_more, third.next_cursor) == (False, None)
    # Exactly `limit` older records left: no further page.
    exact = store.page(S1, limit=4, before_record_id=records[4][0])
    assert exact.events == [raw for _, raw in records[:4]]
    assert (exact.has_more, exact.next_cursor) == (False, None)
    assert store.page(S1, limit=7).has_more is False
    assert store.page(S1, limit=6).has_more is True


def test_cursors_are_opaque_and_round_trip_any_record_id(store: TranscriptDatabase) -> None:
    # Ids of every length mod 3, so the base64 padding differs.
    # "aaW" encodes to a token ending in "X"; "abcdefg" to a 10-character one.
    ids = ["a", "ab", "abc", "abcd", "é", "aaW", "abcdefg", "x"]
    records = [(rid, rec(i)[1]) for i, rid in enumerate(ids, 1)]
    store.apply([finish(S1, None, records)])
    page = store.page(S1, limit=1)
    seen = [page.events]
    while page.next_cursor is not None:
        assert "=" not in page.next_cursor
        page = store.page(S1, limit=1, cursor=page.next_cursor)
        seen.append(page.events)
    assert seen == [[raw] for _, raw in reversed(records)]


def test_refusals_name_the_problem(store: TranscriptDatabase) -> None:
    store.apply([finish(S1, None, [rec(1)]), finish(S2, None, [rec(2)])])
    with pytest.raises(ValueError, match=r"^page limit must be >= 1, got 0$"):
        store.page(S1, limit=0)
    store.page(S1, limit=1)
    with pytest.raises(InvalidCursor, match=r"^give either a cursor or beforeRecordId, not both$"):
        store.page(S1, limit=1, cursor="c", before_record_id="r")
    other = rec(2)[0]  # a record of S2, not of S1
    with pytest.raises(InvalidCursor, match=re.escape(
            f"transcript beforeRecordId {other!r} names no record of session {S1}")):
        store.page(S1, limit=1, before_record_id=other)
    store.apply([finish(S2, None, [rec(3)])])
    s2_cursor = store.page(S2, limit=1).next_cursor  # names S2's rec(3)
    assert s2_cursor is not None
    assert store.page(S2, limit=1, cursor=s2_cursor).events == [rec(2)[1]]
    with pytest.raises(InvalidCursor, match=re.escape(
            f"transcript cursor {s2_cursor!r} names no record of session {S1}")):
        store.page(S1, limit=1, cursor=s2_cursor)
    with pytest.raises(InvalidCursor, match=r"^invalid transcript cursor 'nope'$"):
        store.page(S1, limit=1, cursor="nope")


def test_records_by_id_in_the_asked_order_across_sql_batches(store: TranscriptDatabase) -> None:
    records = [rec(n) for n in range(1, 1202)]
    store.apply([finish(S1, None, records)])
    wanted = [records[i][0] for i in (1200, 0, 600, 499, 500, 1000, 0)]
    assert store.records_by_id(S1, wanted) == [records[i][1] for i in (1200, 0, 600, 499, 500,
                                                                       1000, 0)]
    every = [rid for rid, _ in records]
    assert store.records_by_id(S1, every) == [raw for _, raw in records]
    assert store.records_by_id(S1, [records[0][0], "missing"]) is None
    assert store.records_by_id(S2, [records[0][0]]) is None
    assert store.records_by_id(S1, []) == []


def test_raw_events_keep_spaces_inside_their_json(store: TranscriptDatabase) -> None:
    store.apply([append(S1, 1, text="a b  c"), append(S1, 2, text="d\te")])
    assert store.raw_events(S1) == [append(S1, 1, text="a b  c").raw,
                                    append(S1, 2, text="d\te").raw]
