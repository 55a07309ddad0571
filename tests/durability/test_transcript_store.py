"""TranscriptDatabase: schema, ops, ledger, paging and restore seeding on real SQLite files."""

from __future__ import annotations

import ctypes
import gc
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import to_builtins

from daemon.malloc import MMAP_THRESHOLD
from daemon.transcript_store import (
    PAGE_SIZE,
    ROW_MAX_BYTES,
    SCHEMA_VERSION,
    WAL_CHECKPOINT_BYTES,
    AdmitPrompt,
    AppendEvent,
    DeleteSession,
    InvalidCursor,
    MarkClosed,
    TranscriptDatabase,
    TranscriptSchemaError,
    UpsertSession,
)
from tests.builders.transcript_store import S1, S2, append, ev, finish, rec
from tests.hypothesis_profiles import examples

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast


@pytest.fixture
def store(tmp_path: Path) -> TranscriptDatabase:
    s = TranscriptDatabase(tmp_path / "transcript.db")
    s.apply([UpsertSession(S1, "/w", 100, "acp-1"), UpsertSession(S2, "/w2", 200)])
    return s


# --- schema ----------------------------------------------------------------------------------


def test_new_database_has_schema_version_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = TranscriptDatabase(path)
    assert store.schema_version == SCHEMA_VERSION == 3
    store.close()
    conn = sqlite3.connect(path)
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"sessions", "raw_events", "records", "prompts"} <= names
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    conn.close()


def test_new_database_uses_large_pages_and_a_4_mib_wal(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = TranscriptDatabase(path)
    conn = store.connection
    assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 65536
    assert (conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
            == WAL_CHECKPOINT_BYTES // PAGE_SIZE == 64)
    store.close()


def test_an_existing_small_page_database_keeps_its_pages_and_works(tmp_path: Path) -> None:
    # A transcript created with SQLite's default 4 KiB pages (an older daemon) is not rebuilt:
    # it keeps its page size, checkpoints at the same WAL size, and reads back what it holds.
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA page_size=4096")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    store = TranscriptDatabase(path)
    store.apply([UpsertSession(S1, "/w", 100, None), append(S1, 1)])
    store.close()
    again = TranscriptDatabase(path)
    assert again.connection.execute("PRAGMA page_size").fetchone()[0] == 4096
    assert again.connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1024
    assert again.raw_events(S1) == [ev(1)]
    again.close()


def test_reopen_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = TranscriptDatabase(path)
    store.apply(
        [
            UpsertSession(S1, "/w", 100, "acp-1"),
            AdmitPrompt(S1, "p1", 110),
            append(S1, 1, "p1"),
            finish(S1, "p1", [rec(1), rec(2)]),
            AdmitPrompt(S1, "p2", 120),
            append(S1, 3, "p2"),
        ]
    )
    store.close()
    again = TranscriptDatabase(path)
    assert again.get_session(S1) is not None
    assert again.record_count(S1) == 2
    assert again.raw_events(S1) == [ev(3, prompt_id="p2")]
    assert again.in_flight_prompts(S1) == ["p2"]
    assert [t.prompt_id for t in again.prompt_terminals(S1)] == ["p1"]
    again.close()


def test_newer_schema_version_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE future (x)")
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(TranscriptSchemaError, match="schema_version 99"):
        TranscriptDatabase(path)
    assert path.read_bytes() == before


def test_corrupt_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    path.write_bytes(b"definitely not an sqlite database\n" * 200)
    before = path.read_bytes()
    with pytest.raises(TranscriptSchemaError, match="corrupt"):
        TranscriptDatabase(path)
    assert path.read_bytes() == before


def test_foreign_sqlite_database_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE someone_elses (x)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(TranscriptSchemaError, match="not a turnkeeper transcript"):
        TranscriptDatabase(path)
    assert path.read_bytes() == before


def test_committed_batch_survives_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    script = (
        "import os, signal, sys\n"
        "from daemon.transcript_store import TranscriptDatabase, UpsertSession, AppendEvent\n"
        "s = TranscriptDatabase(sys.argv[1])\n"
        f"s.apply([UpsertSession({S1!r}, '/w', 1), AppendEvent({S1!r}, 1, None, b'{{}}')])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", script, str(path)], cwd=root, check=False)
    assert proc.returncode == -9
    store = TranscriptDatabase(path)
    assert store.raw_events(S1) == [b"{}"]
    store.close()


# --- ops -------------------------------------------------------------------------------------


def test_upsert_session_updates_and_keeps_created_at(store: TranscriptDatabase) -> None:
    row = store.get_session(S1)
    assert row is not None
    assert (row.workspace_cwd, row.created_at_ms, row.agent_session_id, row.closed) == (
        "/w",
        100,
        "acp-1",
        False,
    )
    store.apply([UpsertSession(S1, "/other", 999, None)])
    row = store.get_session(S1)
    assert row is not None
    # None keeps the known agent session id; created_at is the first one.
    assert (row.workspace_cwd, row.created_at_ms, row.agent_session_id) == ("/other", 100, "acp-1")
    store.apply([UpsertSession(S1, "/other", 999, "acp-2")])
    row = store.get_session(S1)
    assert row is not None and row.agent_session_id == "acp-2"
    assert store.get_session("nope") is None
    assert [r.session_id for r in store.list_sessions()] == [S1, S2]


def test_mark_closed_and_upsert_reopens(store: TranscriptDatabase) -> None:
    store.apply([MarkClosed(S1)])
    row = store.get_session(S1)
    assert row is not None and row.closed
    store.apply([UpsertSession(S1, "/w", 100)])
    row = store.get_session(S1)
    assert row is not None and not row.closed


def test_append_event_keeps_order_and_sessions_apart(store: TranscriptDatabase) -> None:
    store.apply([append(S1, 1, "p"), append(S2, 1), append(S1, 2, "p"), append(S1, 3, "p")])
    assert store.raw_events(S1) == [
        ev(1, prompt_id="p"),
        ev(2, prompt_id="p"),
        ev(3, prompt_id="p"),
    ]
    assert store.raw_events(S2) == [ev(1)]
    assert store.max_raw_event_id(S1) == 3


def test_admit_prompt_is_in_flight_until_finished(store: TranscriptDatabase) -> None:
    store.apply([AdmitPrompt(S1, "p1", 10), AdmitPrompt(S1, "p2", 11), AdmitPrompt(S1, "p1", 99)])
    assert store.in_flight_prompts(S1) == ["p1", "p2"]
    row = store.get_prompt(S1, "p1")
    assert row is not None and (row.state, row.admitted_at_ms) == ("in_flight", 10)
    store.apply([finish(S1, "p1", [rec(1)], at_ms=50)])
    assert store.in_flight_prompts(S1) == ["p2"]
    row = store.get_prompt(S1, "p1")
    assert row is not None
    assert (row.state, row.stop_reason, row.admitted_at_ms, row.ended_at_ms) == (
        "completed",
        "end_turn",
        10,
        50,
    )


def test_finish_turn_deletes_only_raw_events_before_it(store: TranscriptDatabase) -> None:
    store.apply([append(S1, 1, "p1"), append(S2, 1)])
    store.apply(
        [
            append(S1, 2, "p1"),
            finish(S1, "p1", [rec(1), rec(2), rec(3)]),
            append(S1, 3, "p2"),
            append(S1, 4, "p2"),
        ]
    )
    assert store.raw_events(S1) == [ev(3, prompt_id="p2"), ev(4, prompt_id="p2")]
    assert store.raw_events(S2) == [ev(1)]  # another session's raw events are not touched
    page = store.page(S1, limit=10)
    assert page.events == [
        rec(1)[1],
        rec(2)[1],
        rec(3)[1],
        ev(3, prompt_id="p2"),
        ev(4, prompt_id="p2"),
    ]
    assert store.oldest_record_id(S1) == rec(1)[0]
    assert store.newest_record_id(S1) == rec(3)[0]
    assert store.newest_record_id(S2) is None


def test_delete_session_removes_everything(store: TranscriptDatabase) -> None:
    store.apply(
        [AdmitPrompt(S1, "p1", 1), append(S1, 1), finish(S1, "p1", [rec(1)]), append(S1, 2)]
    )
    store.apply([DeleteSession(S1)])
    assert store.get_session(S1) is None
    assert store.raw_events(S1) == []
    assert store.record_count(S1) == 0
    assert to_builtins(store.prompt_terminals(S1)) == []
    assert store.get_prompt(S1, "p1") is None
    assert store.get_session(S2) is not None


def test_ops_for_an_unknown_session_write_nothing(store: TranscriptDatabase) -> None:
    store.apply([DeleteSession(S1)])
    store.apply(
        [append(S1, 5), AdmitPrompt(S1, "late", 1), finish(S1, "late", [rec(7)]), MarkClosed(S1)]
    )
    assert store.raw_events(S1) == []
    assert store.record_count(S1) == 0
    assert store.get_prompt(S1, "late") is None
    # The record id was not consumed either.
    store.apply([finish(S2, None, [rec(7)])])
    assert store.newest_record_id(S2) == rec(7)[0]


def test_a_session_deleted_earlier_in_the_same_batch_gets_no_rows(store: TranscriptDatabase) -> None:
    store.apply([append(S1, 1), append(S2, 2), DeleteSession(S1), append(S1, 3), append(S2, 4),
                 UpsertSession(S1, "/w", 300), append(S1, 5)])
    assert store.raw_events(S1) == [ev(5)]
    assert store.raw_events(S2) == [ev(2), ev(4)]


def test_event_only_batches_follow_the_committed_sessions(tmp_path: Path) -> None:
    """Batches of nothing but events take the short path (the stored sessions as
    committed decide): it must agree with the full path at every change of the set."""
    path = tmp_path / "t.db"
    store = TranscriptDatabase(path)
    store.apply([append(S1, 1)])  # never created
    assert store.raw_events(S1) == []
    store.apply([UpsertSession(S1, "/w", 1)])
    store.apply([append(S1, 2)])  # one row: a single INSERT
    store.apply([append(S1, 3), append(S2, 4), append(S1, 5)])  # several rows, S2 unknown
    assert store.raw_events(S1) == [ev(2), ev(3), ev(5)]
    assert store.raw_events(S2) == []
    with pytest.raises(ValueError):  # a failed batch creating S2 is rolled back...
        store.apply([UpsertSession(S2, "/w", 2), finish(S2, None, [], terminal="bogus")])
    store.apply([append(S2, 6)])  # ...so S2 is still not stored
    assert store.raw_events(S2) == []
    store.apply([DeleteSession(S1)])
    store.apply([append(S1, 7)])
    assert store.raw_events(S1) == []
    store.apply([UpsertSession(S2, "/w", 2)])
    store.close()
    reopened = TranscriptDatabase(path)  # the set is read back from the file
    reopened.apply([append(S2, 8), append(S1, 9)])
    assert reopened.raw_events(S2) == [ev(8)]
    assert reopened.raw_events(S1) == []
    reopened.close()


def test_a_big_batch_is_split_into_rows_below_the_mmap_threshold(store: TranscriptDatabase) -> None:
    """A batch's run of events is joined into rows of at most ROW_MAX_BYTES (below malloc's
    mmap threshold, so neither the join nor SQLite's copy is a fresh mapping), never splitting
    an event; each row's event_id is its own last event, and reading back gives every event
    once, in order. An event bigger than the cap gets a row of its own."""
    assert ROW_MAX_BYTES < MMAP_THRESHOLD
    body = "z" * 20_000
    ops = [append(S1, i, text=body) for i in range(1, 61)]  # ~1.2 MB: three rows or more
    big = "b" * (ROW_MAX_BYTES + 10)
    ops.append(append(S1, 61, text=big))
    ops.append(append(S1, 62))
    store.apply(ops)
    rows = store.connection.execute(
        "SELECT event_id, length(raw) FROM raw_events WHERE session_id = ? ORDER BY seq",
        (S1,)).fetchall()
    assert len(rows) >= 4
    assert all(size <= ROW_MAX_BYTES for _, size in rows[:-2])
    assert rows[-2] == (61, len(ev(61, big)))  # the oversized event alone
    assert rows[-1] == (62, len(ev(62)))
    assert [event_id for event_id, _ in rows] == sorted({event_id for event_id, _ in rows})
    # Each row ends exactly where its last event ends: ids line up with the split.
    events = store.raw_events(S1)
    assert events == [op.raw for op in ops]
    ends = [sum(len(op.raw) + 1 for op in ops[:i]) - 1 for i in range(1, len(ops) + 1)]
    offset = 0
    for event_id, size in rows:
        offset += size
        assert ends[event_id - 1] == offset
        offset += 1
    assert store.max_raw_event_id(S1) == 62


def _sqlite_memory_used() -> Callable[[], int]:
    """SQLite's own count of the bytes it has allocated (``sqlite3_memory_used``), read from the
    library the ``sqlite3`` module is linked against."""
    import _sqlite3

    try:
        fn = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used
    except (OSError, AttributeError):
        pytest.skip("this sqlite3 module does not expose sqlite3_memory_used")
    fn.restype = ctypes.c_int64
    fn.argtypes = []
    return lambda: int(fn())


_MIB = 1024 * 1024
# One kind of write each, all big enough that a statement holding its values would hold at
# least 2 MiB of them: one row; a multi-row INSERT (12 rows); more rows than one INSERT takes
# (20 events of 2 MiB, a row each: BEGIN, executemany, COMMIT); a turn's records.
_BIG_WRITES: dict[str, Callable[[], list[Any]]] = {
    "one row": lambda: [append(S1, 2, text="w" * (6 * _MIB))],
    "one multi-row INSERT": lambda: [
        append(S1, 2 + i, text="q" * (ROW_MAX_BYTES - 1024)) for i in range(12)],
    "more rows than one INSERT takes": lambda: [
        append(S1, 2 + i, text="m" * (2 * _MIB)) for i in range(20)],
    "a turn's records": lambda: [finish(S1, None, [rec(n, size=3 * _MIB) for n in range(1, 4)])],
}


@pytest.mark.parametrize("what", list(_BIG_WRITES))
def test_no_statement_keeps_a_batch_bound_after_it_is_written(tmp_path: Path, what: str) -> None:
    """SQLite keeps a prepared statement's bound values until they are bound again, so a cached
    INSERT would hold its last batch's blobs (every multi-row shape its own, up to 16 rows of
    ROW_MAX_BYTES) for as long as the daemon runs. After each kind of write SQLite's memory is
    back within 1 MiB of where it started (measured: 0-257 KiB, the page cache; 2-6 MiB with the
    statement cache on)."""
    memory_used = _sqlite_memory_used()
    # The probe sees a retained binding: a plain connection, statement cached, 8 MiB bound.
    probe = sqlite3.connect(":memory:", isolation_level=None)
    probe.execute("CREATE TABLE t (b BLOB)")
    gc.collect()
    before = memory_used()
    probe.execute("INSERT INTO t (b) VALUES (?)", (b"p" * (8 * _MIB),))
    probe.execute("DELETE FROM t")
    assert memory_used() - before >= 8 * _MIB
    probe.close()

    store = TranscriptDatabase(tmp_path / "transcript.db")
    store.apply([UpsertSession(S1, "/w", 100)])
    store.apply([append(S1, 1)])
    ops = _BIG_WRITES[what]()
    gc.collect()
    baseline = memory_used()
    store.apply(ops)
    held = memory_used() - baseline
    assert held < _MIB, f"after {what}: SQLite still holds {held / _MIB:.1f} MiB"
    # The write itself happened.
    if isinstance(ops[0], AppendEvent):
        assert store.max_raw_event_id(S1) == ops[-1].event_id
    else:
        assert store.connection.execute(
            "SELECT count(*) FROM records WHERE session_id = ?", (S1,)).fetchone()[0] == 3
    store.close()


@pytest.mark.parametrize("sessions", [2, 40])
def test_an_event_batch_is_written_whole_or_not_at_all(tmp_path: Path, sessions: int) -> None:
    """A batch of events, however many rows it makes (one INSERT statement for a few rows, a
    transaction of them for many), is one transaction: a row that cannot be written (here a
    NULL event id, which the schema refuses) leaves none of the batch's rows behind."""
    store = TranscriptDatabase(tmp_path / "t.db")
    ids = [str(uuid.UUID(int=n + 1)) for n in range(sessions)]
    store.apply([UpsertSession(sid, "/w", 1) for sid in ids])
    good = [append(ids[n % sessions], n + 1) for n in range(sessions * 2)]
    bad = AppendEvent(ids[-1], None, None, b"{}")  # type: ignore[arg-type]
    with pytest.raises(sqlite3.IntegrityError):
        store.apply([*good, bad])
    assert store.connection.execute("SELECT count(*) FROM raw_events").fetchone()[0] == 0
    store.apply(good)  # and the same batch without the bad row is written whole
    for n, sid in enumerate(ids):
        assert store.raw_events(sid) == [ev(n + 1), ev(n + 1 + sessions)]
    store.close()


def _bytes_written() -> int:
    """Bytes this thread has written: the process's count would take in the writes of its
    other threads too (an xdist worker's report to the controller, sent meanwhile)."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/thread-self/io")


@pytest.mark.skipif(not Path("/proc/thread-self/io").exists(),
                    reason="needs Linux /proc/thread-self/io")
def test_commits_write_each_page_once(tmp_path: Path) -> None:
    """A commit writes each page it changes to the WAL once, though it changes more pages than
    the page cache holds: nothing is spilled early and written again. The turn boundary is the
    case that did: deleting a turn's rows reads every overflow page, which pushed the freelist
    trunk page (changed again with every page freed) out of the cache over and over. Every
    byte this thread writes during a commit is then one WAL frame."""
    path = tmp_path / "t.db"
    store = TranscriptDatabase(path)
    store.apply([UpsertSession(S1, "/w", 1)])
    body = "q" * 10_000
    event_id = 0
    for turn in range(2):  # the second turn reuses the pages the first one freed
        for _ in range(6):
            store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            ops = [append(S1, event_id + i, text=body) for i in range(1, 89)]  # two rows
            event_id += 88
            before = _bytes_written()
            store.apply(ops)
            wrote = _bytes_written() - before
            wal = Path(f"{path}-wal").stat().st_size
            assert wrote == wal, f"batch: {wrote} bytes written for a {wal}-byte WAL"
        store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        before = _bytes_written()
        store.apply([finish(S1, None, [rec(turn + 1)])])
        wrote = _bytes_written() - before
        wal = Path(f"{path}-wal").stat().st_size
        assert wrote == wal, f"boundary: {wrote} bytes written for a {wal}-byte WAL"
        assert store.raw_events(S1) == []
    store.close()


def _file_bytes(path: Path) -> bytes:
    wal = Path(f"{path}-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def test_a_deleted_session_leaves_none_of_its_bytes_in_the_files(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = TranscriptDatabase(path)
    marker = b"SECRET-7f3a9c"
    body = (marker * (300_000 // len(marker))).decode()  # several overflow pages per row
    store.apply([UpsertSession(S1, "/w", 1), UpsertSession(S2, "/w", 2)])
    store.apply([append(S1, 1, text=body), append(S2, 2, text="kept"),
                 append(S1, 3, text=body)])
    store.apply([finish(S1, None, [(str(uuid.UUID(int=9)), ev(9, body))]),
                 append(S1, 4, text=body)])
    store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert marker in _file_bytes(path)
    store.apply([DeleteSession(S1)])
    store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert store.raw_events(S2) == [ev(2, "kept")]
    assert store.connection.execute("SELECT count(*) FROM raw_events").fetchone()[0] == 1
    store.close()
    data = _file_bytes(path)
    assert marker not in data
    assert b"kept" in data


def test_a_turn_boundary_does_not_rewrite_the_pages_it_frees(tmp_path: Path) -> None:
    """The raw events a turn boundary deletes are not zeroed page by page (the compacted
    records keep their content): the boundary's commit writes a few pages, not the turn."""
    path = tmp_path / "t.db"
    store = TranscriptDatabase(path)
    store.apply([UpsertSession(S1, "/w", 1)])
    text = "y" * 4000
    for batch in range(8):  # 8 rows of 100 events: about 3 MB, ~50 pages of overflow
        store.apply([append(S1, batch * 100 + i, text=text) for i in range(100)])
    store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    freed_before = store.connection.execute("PRAGMA freelist_count").fetchone()[0]
    store.apply([finish(S1, None, [rec(1)])])
    freed = store.connection.execute("PRAGMA freelist_count").fetchone()[0] - freed_before
    wal_frames = (Path(f"{path}-wal").stat().st_size - 32) // (PAGE_SIZE + 24)
    store.close()
    assert freed >= 40
    assert wal_frames <= 12, f"{wal_frames} WAL frames for a boundary that freed {freed} pages"


def test_failed_batch_rolls_back_entirely(store: TranscriptDatabase) -> None:
    store.apply([finish(S1, "p0", [rec(1)])])
    with pytest.raises(sqlite3.IntegrityError):
        store.apply(
            [
                append(S2, 1),
                AdmitPrompt(S1, "p1", 5),
                finish(S1, "p1", [rec(2), rec(1)]),  # rec(1) already exists
            ]
        )
    assert store.raw_events(S2) == []
    assert store.get_prompt(S1, "p1") is None
    assert store.record_count(S1) == 1
    with pytest.raises(ValueError, match="terminal"):
        store.apply([append(S2, 1), finish(S1, "p2", [], terminal="bogus")])
    assert store.raw_events(S2) == []
    # The connection is usable after a rollback.
    store.apply([append(S2, 2)])
    assert store.raw_events(S2) == [ev(2)]


# --- ledger ----------------------------------------------------------------------------------


def test_prompt_terminals_shape_order_and_limit(store: TranscriptDatabase) -> None:
    store.apply(
        [
            AdmitPrompt(S1, "p1", 1),
            AdmitPrompt(S1, "p2", 2),
            AdmitPrompt(S1, "p3", 3),
            AdmitPrompt(S1, "p4", 4),
            finish(S1, "p1", [rec(1)], "completed", "end_turn", 10),
            finish(S1, "p2", [rec(2)], "cancelled", "cancelled", 20),
            finish(S1, "p3", [rec(3)], "error", None, 30),
        ]
    )
    # p3's error lands before p4 is interrupted, even with an earlier clock reading.
    store.apply([finish(S1, "p4", [rec(4)], "interrupted", None, 25)])
    assert to_builtins(store.prompt_terminals(S1)) == [
        {"v": 1, "promptId": "p1", "terminal": "completed", "stopReason": "end_turn", "at": 10},
        {"v": 1, "promptId": "p2", "terminal": "cancelled", "stopReason": "cancelled", "at": 20},
        {"v": 1, "promptId": "p3", "terminal": "error", "at": 30},
        {"v": 1, "promptId": "p4", "terminal": "interrupted", "at": 25},
    ]
    assert [t.prompt_id for t in store.prompt_terminals(S1, limit=2)] == ["p3", "p4"]
    assert store.in_flight_prompts(S1) == []
    assert to_builtins(store.prompt_terminals(S2)) == []


def test_first_terminal_wins(store: TranscriptDatabase) -> None:
    store.apply([AdmitPrompt(S1, "p1", 1), finish(S1, "p1", [rec(1)], "completed", "end_turn", 10)])
    store.apply([finish(S1, "p1", [rec(2)], "error", None, 20)])
    assert to_builtins(store.prompt_terminals(S1)) == [
        {"v": 1, "promptId": "p1", "terminal": "completed", "stopReason": "end_turn", "at": 10}
    ]


def test_terminal_without_admission_is_recorded(store: TranscriptDatabase) -> None:
    store.apply([finish(S1, "px", [rec(1)], "interrupted", None, 7)])
    assert to_builtins(store.prompt_terminals(S1)) == [
        {"v": 1, "promptId": "px", "terminal": "interrupted", "at": 7}
    ]


# --- paging ----------------------------------------------------------------------------------


def fill(store: TranscriptDatabase, sid: str, turns: list[int], start: int = 1) -> list[bytes]:
    """Store turns of the given record counts; return every record's raw in order."""
    out: list[bytes] = []
    n = start
    for i, count in enumerate(turns):
        records = [rec(n + k) for k in range(count)]
        n += count
        store.apply([finish(sid, f"{sid}-p{i}", records)])
        out.extend(raw for _, raw in records)
    return out


def test_newest_page_has_records_then_raw_events(store: TranscriptDatabase) -> None:
    raws = fill(store, S1, [3, 3, 4])
    store.apply([append(S1, 50, "live"), append(S1, 51, "live")])
    page = store.page(S1, limit=3)
    assert page.events == [*raws[-3:], ev(50, prompt_id="live"), ev(51, prompt_id="live")]
    assert page.has_more is True
    assert page.next_cursor is not None
    # limit counts records only: a large limit returns all 10 records plus the raw events.
    everything = store.page(S1, limit=500)
    assert everything.events == [*raws, ev(50, prompt_id="live"), ev(51, prompt_id="live")]
    assert (everything.has_more, everything.next_cursor) == (False, None)


def test_cursor_chain_covers_everything_once(store: TranscriptDatabase) -> None:
    raws = fill(store, S1, [7] * 15)  # 105 records
    store.apply([append(S1, 999)])
    pages = [store.page(S1, limit=10)]
    while pages[-1].has_more:
        cursor = pages[-1].next_cursor
        assert cursor is not None
        pages.append(store.page(S1, limit=10, cursor=cursor))
    assert len(pages) == 11
    assert pages[0].events[-1] == ev(999)
    assert all(ev(999) not in p.events for p in pages[1:])
    assert pages[-1].next_cursor is None
    collected = [e for p in reversed(pages) for e in p.events if e != ev(999)]
    assert collected == raws
    assert [len(p.events) for p in pages[1:]] == [10] * 9 + [5]


def test_before_record_id(store: TranscriptDatabase) -> None:
    raws = fill(store, S1, [4, 4])
    store.apply([append(S1, 77)])
    anchor = rec(6)[0]
    page = store.page(S1, limit=3, before_record_id=anchor)
    assert page.events == raws[2:5]  # records 3, 4, 5; no raw events off the newest page
    assert page.has_more is True
    assert page.next_cursor is not None
    rest = store.page(S1, limit=3, cursor=page.next_cursor)
    assert rest.events == raws[0:2]
    assert (rest.has_more, rest.next_cursor) == (False, None)
    oldest = store.page(S1, limit=3, before_record_id=rec(1)[0])
    assert (oldest.events, oldest.has_more, oldest.next_cursor) == ([], False, None)


def test_page_of_a_session_without_records(store: TranscriptDatabase) -> None:
    store.apply([append(S2, 1)])
    page = store.page(S2, limit=5)
    assert (page.events, page.has_more, page.next_cursor) == ([ev(1)], False, None)
    assert store.page("unknown", limit=5).events == []


def test_invalid_cursors_and_record_ids(store: TranscriptDatabase) -> None:
    fill(store, S1, [3])
    fill(store, S2, [2], start=100)
    good = store.page(S1, limit=1).next_cursor
    assert good is not None
    for bad in ["", "garbage", "tc1.!!!", "tc1." + "A" * 7, good + "x"]:
        with pytest.raises(InvalidCursor):
            store.page(S1, limit=1, cursor=bad)
    with pytest.raises(InvalidCursor):
        store.page(S2, limit=1, cursor=good)  # a cursor of another session
    with pytest.raises(InvalidCursor):
        store.page(S1, limit=1, before_record_id=str(uuid.uuid4()))
    with pytest.raises(InvalidCursor):
        store.page(S1, limit=1, before_record_id=rec(100)[0])  # S2's record
    with pytest.raises(InvalidCursor):
        store.page(S1, limit=1, cursor=good, before_record_id=rec(2)[0])
    with pytest.raises(ValueError):
        store.page(S1, limit=0)


@settings(max_examples=examples(25))
@given(
    turns=st.lists(st.integers(min_value=1, max_value=6), max_size=12),
    limit=st.integers(min_value=1, max_value=9),
    raw_count=st.integers(min_value=0, max_value=3),
)
def test_paging_property(turns: list[int], limit: int, raw_count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = TranscriptDatabase(Path(tmp) / "t.db")
        store.apply([UpsertSession(S1, "/w", 1)])
        raws = fill(store, S1, turns)
        live = [ev(1000 + i) for i in range(raw_count)]
        store.apply([AppendEvent(S1, 1000 + i, None, raw) for i, raw in enumerate(live)])
        page = store.page(S1, limit=limit)
        assert page.events[len(page.events) - raw_count :] == live
        chunks = [page.events[: len(page.events) - raw_count]]
        while page.has_more:
            assert page.next_cursor is not None
            page = store.page(S1, limit=limit, cursor=page.next_cursor)
            chunks.append(page.events)
            assert 1 <= len(page.events) <= limit
        assert page.next_cursor is None
        assert [e for chunk in reversed(chunks) for e in chunk] == raws
        assert all(len(c) == limit for c in chunks[:-1])
        store.close()


# --- restore seeding -------------------------------------------------------------------------


def seed_turns(store: TranscriptDatabase) -> list[list[tuple[str, bytes]]]:
    """Four turns of 100-byte records: 2, 3, 1 and 2 records."""
    turns: list[list[tuple[str, bytes]]] = []
    n = 1
    for i, count in enumerate([2, 3, 1, 2]):
        records = [rec(n + k, size=100) for k in range(count)]
        n += count
        store.apply([finish(S1, f"p{i}", records)])
        turns.append(records)
    return turns


def test_newest_records_by_byte_budget(store: TranscriptDatabase) -> None:
    turns = seed_turns(store)
    flat = [r for t in turns for r in t]
    # Exactly the last two turns fit in 300 bytes.
    assert store.newest_records(S1, 300) == (flat[5:], 5, 2)
    assert store.newest_turns(S1, 300) == (turns[2:], 5, 2)
    # One byte less: only the newest turn.
    assert store.newest_records(S1, 299) == (flat[6:], 6, 3)
    # Too small for anything: the newest turn still comes back whole.
    assert store.newest_records(S1, 1) == (flat[6:], 6, 3)
    # Everything fits.
    assert store.newest_records(S1, 800) == (flat, 0, 0)
    assert store.newest_turns(S1, 10_000) == (turns, 0, 0)
    # 799: the oldest turn (200 bytes) no longer fits.
    assert store.newest_records(S1, 799) == (flat[2:], 2, 1)
    assert store.newest_records(S2, 1000) == ([], 0, 0)


def test_raw_events_and_records_after_restore_style_close(store: TranscriptDatabase) -> None:
    """The restore path: an in-flight prompt's raw events are read back, compacted by the caller
    and closed with an interrupted terminal in one batch."""
    store.apply([AdmitPrompt(S1, "p1", 1), append(S1, 1, "p1", "a"), append(S1, 2, "p1", "b")])
    assert store.in_flight_prompts(S1) == ["p1"]
    assert store.raw_events(S1) == [ev(1, "a", "p1"), ev(2, "b", "p1")]
    store.apply([finish(S1, "p1", [rec(1), rec(2)], "interrupted", None, 9)])
    assert store.in_flight_prompts(S1) == []
    assert store.raw_events(S1) == []
    assert store.newest_records(S1, 10**6) == ([rec(1), rec(2)], 0, 0)
