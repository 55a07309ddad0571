"""The transcript's write path under the LLM-paced load, where a commit holds a few events of
each of many sessions: the batch must not read the b-trees' interior pages back from the file
for each row it inserts (counted in read system calls of the thread that applies it, Linux's
per-thread I/O counters), and is one SQL statement (counted by SQLite's trace callback). Not
timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.transcript_store import AppendEvent, StoreHooks, TranscriptDatabase, UpsertSession

THREAD_IO = Path("/proc/thread-self/io")
pytestmark = pytest.mark.skipif(not THREAD_IO.exists(), reason="needs Linux's /proc/thread-self/io")

SESSIONS = 48
# Enough history that each session's index entries sit on leaves of their own and the table
# has interior pages: a batch then dirties about one index leaf per session it touches.
HISTORY = 300
RAW = b'{"update":"' + b"x" * 600 + b'"}'


def _read_calls() -> int:
    for line in THREAD_IO.read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "syscr":
            return int(value)
    raise AssertionError("no syscr in " + str(THREAD_IO))


def test_a_batch_across_many_sessions_reads_few_pages_back(tmp_path: Path) -> None:
    sids = [f"{i:08d}-1111-4111-8111-111111111111" for i in range(SESSIONS)]
    store = TranscriptDatabase(tmp_path / "t.sqlite3", quick_check_s=5)
    try:
        store.apply([UpsertSession(sid, "/w", i) for i, sid in enumerate(sids)])
        for event_id in range(1, HISTORY + 1, 10):  # interleaved, as paced turns write them
            store.apply([AppendEvent(sid, event_id + k, None, RAW)
                         for k in range(10) for sid in sids])
        # The LLM-paced commit: one new event of every session, a few times over.
        rows = 0
        before = _read_calls()
        for event_id in range(HISTORY + 1, HISTORY + 6):
            store.apply([AppendEvent(sid, event_id, None, RAW) for sid in sids])
            rows += SESSIONS
        reads = _read_calls() - before
        # With the interior pages evicted by the dirty leaves, every row read two pages
        # back (about 2 * rows); kept, a commit reads at most a few.
        assert reads <= rows // 4, f"{reads} reads for {rows} rows"
        assert len(store.raw_events(sids[0])) == HISTORY + 5
    finally:
        store.close()


def test_a_batch_of_a_row_for_each_of_many_sessions_is_one_statement(tmp_path: Path) -> None:
    """The LLM-paced commit (one small row for each of dozens of sessions) is one INSERT, its
    own transaction: one SQLite call, where BEGIN, a row at a time and COMMIT made the writer
    thread give up and take back the GIL for every row."""
    statements: list[str] = []
    sids = [f"{i:08d}-2222-4222-8222-222222222222" for i in range(SESSIONS)]
    store = TranscriptDatabase(tmp_path / "t.sqlite3", quick_check_s=5,
                               hooks=StoreHooks(connected=lambda conn: conn.set_trace_callback(
                                   statements.append)))
    try:
        store.apply([UpsertSession(sid, "/w", i) for i, sid in enumerate(sids)])
        statements.clear()
        store.apply([AppendEvent(sid, 1, None, RAW) for sid in sids])
        assert len(statements) == 1 and statements[0].startswith("INSERT INTO raw_events")
        # Big rows still go one at a time in one transaction (SQLite would copy them all).
        statements.clear()
        big = b'{"update":"' + b"y" * 60_000 + b'"}'
        store.apply([AppendEvent(sid, 2, None, big) for sid in sids])
        assert statements[0] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT"
        assert [sid for sid in sids if len(store.raw_events(sid)) != 2] == []
    finally:
        store.close()
