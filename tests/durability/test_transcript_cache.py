"""The transcript's page cache under the LLM-paced load: a batch holding a few events of each of
many sessions (every session's index leaf dirtied) must not read the b-trees' interior pages
back from the file for each row it inserts. Counted in read system calls of the thread that
applies the batch (Linux's per-thread I/O counters), not timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.transcript_store import AppendEvent, TranscriptDatabase, UpsertSession

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
