"""The transcript's own checks on real SQLite files, below the daemon: the row checksum, the
bounded start-up ``quick_check``, the upgrade of a file from before checksums, the background
check that yields to commits, and ``--recover``.

The daemon-level proofs (a real daemon refusing, degrading and recovering) are in
``tests/durability/test_transcript_damage.py``.
"""

from __future__ import annotations

import io
import shutil
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from msgspec import to_builtins

from daemon import transcript_store
from daemon.core.checksum import row_crc
from daemon.recover import recover_transcript, run_recovery, salvage_rows
from daemon.server import TRANSCRIPT_FILE, acquire_lock
from daemon.transcript_check import check_transcript
from daemon.transcript_store import (
    AdmitPrompt,
    AppendEvent,
    DamagedRow,
    FinishTurn,
    StoreHooks,
    TranscriptDamagedError,
    TranscriptDatabase,
    UpsertSession,
)
from daemon.transcript_writer import TranscriptWriter
from tests.transcript_v2 import OldTranscript

S1 = "11111111-1111-4111-8111-111111111111"
S2 = "22222222-2222-4222-8222-222222222222"
P1 = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


def record(n: int, size: int = 100) -> tuple[str, bytes]:
    record_id = str(uuid.UUID(int=n))
    return record_id, msgspec.json.encode({"id": n, "v": 1, "type": "session_update",
                                           "data": {"n": n, "text": "r" * size,
                                                    "recordId": record_id}})


def event(n: int) -> bytes:
    return msgspec.json.encode({"id": n, "v": 1, "type": "tool_call", "data": n})


# --- the checksum ---------------------------------------------------------------------------


def test_row_crc_tells_apart_what_an_encoding_could_confuse() -> None:
    same = row_crc("a", 1, None, b"x")
    assert same == row_crc("a", 1, None, b"x")
    for other in (("a", 1, None, b"y"), ("a", "1", None, b"x"), ("a", 1, "", b"x"),
                  ("a1", None, b"x"), ("", "a", 1, None, b"x"), ("a", 1, b"x", None),
                  ("a", 1, None, bytearray(b"x") + b"\x00")):
        assert row_crc(*other) != same, other
    with pytest.raises(TypeError):
        row_crc(1.5)
    with pytest.raises(TypeError):
        row_crc(True)


@pytest.mark.parametrize("table", ["sessions", "prompts", "records", "raw_events"])
def test_every_single_bit_flip_of_a_row_is_found_when_it_is_read(tmp_path: Path,
                                                                 table: str) -> None:
    """Each bit of each checksummed value of a row, flipped in the database (below the store,
    as the disk would), makes its read raise instead of answer."""
    store = TranscriptDatabase(tmp_path / "t.db")
    store.apply([UpsertSession(S1, "/w", 1, "acp"), AdmitPrompt(S1, P1, 2, "key-1", "d" * 64, 3,
                                                                "epoch")])
    store.apply([AppendEvent(S1, 1, P1, event(1))])
    store.apply([FinishTurn(S1, P1, "completed", "end_turn", 4, [record(1, 10)]),
                 AppendEvent(S1, 2, None, event(2))])
    reads = {
        "sessions": lambda: store.get_session(S1),
        # A restore reads every ledger row of its session (a damaged key cannot hide its row).
        "prompts": lambda: (store.in_flight_prompts(S1), store.find_keyed_prompt(S1, "key-1")),
        "records": lambda: store.page(S1, limit=10),
        "raw_events": lambda: store.raw_events(S1),
    }
    whole = reads[table]()
    columns = transcript_store.CHECKED_TABLES[table].split(", ")
    conn = store.connection
    rowid, *values = conn.execute(
        f"SELECT rowid, {transcript_store.CHECKED_TABLES[table]} FROM {table}").fetchone()
    flips = 0
    for column, value in zip(columns, values, strict=True):
        if column == "session_id" or not isinstance(value, str | bytes):
            continue  # a changed session id takes the row out of its session's reads
        data = value.encode() if isinstance(value, str) else value
        for bit in range(len(data) * 8):
            changed = bytearray(data)
            changed[bit // 8] ^= 1 << (bit % 8)
            try:
                stored: Any = bytes(changed) if isinstance(value, bytes) else \
                    bytes(changed).decode()
            except UnicodeDecodeError:
                continue
            try:
                conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?",
                             (stored, rowid))
            except sqlite3.IntegrityError:
                continue  # a state SQLite's CHECK refuses (quick_check finds it on disk)
            with pytest.raises(DamagedRow):
                reads[table]()
            flips += 1
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (value, rowid))
    assert flips >= 30
    assert reads[table]() == whole
    store.close()


# --- the start-up check ---------------------------------------------------------------------


@pytest.mark.parametrize("slow_call", [0, 1], ids=["before-the-statement", "inside-it"])
def test_the_quick_check_is_cut_at_its_budget_and_the_store_still_opens(
        tmp_path: Path, slow_call: int) -> None:
    """The budget runs out before the check's statement has started (SQLite forgets an
    interrupt made then) or while it runs: either way the check is cut."""
    path = tmp_path / "t.db"
    store = TranscriptDatabase(path)
    store.apply([UpsertSession(S1, "/w", 1)])
    store.close()
    whole = TranscriptDatabase(path, quick_check_s=60)
    assert whole.quick_check == "ok"
    whole.close()
    calls: list[int] = []
    held: list[bool] = []

    def slow_step(budget_out: threading.Event) -> None:
        """A slow disk: this step of the check outlasts its budget (the cut was made)."""
        calls.append(1)
        if len(calls) - 1 == slow_call:
            held.append(budget_out.wait(30))

    cut = TranscriptDatabase(path, quick_check_s=0.01, hooks=StoreHooks(check_step=slow_step))
    assert held == [True]
    assert cut.quick_check == "incomplete"
    assert cut.get_session(S1) is not None  # the interrupt did not outlive the check
    cut.close()


def test_a_damaged_page_fails_the_quick_check_and_the_file_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = TranscriptDatabase(path)
    store.apply([UpsertSession(S1, "/w", 1)])
    store.apply([FinishTurn(S1, None, "completed", None, 2, [record(n) for n in range(1, 50)])])
    root = store.connection.execute("SELECT rootpage FROM sqlite_master WHERE name = 'records'"
                               ).fetchone()[0]
    store.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * transcript_store.PAGE_SIZE] = 0x07  # no such page type
    path.write_bytes(bytes(data))
    with pytest.raises(TranscriptDamagedError, match="quick_check"):
        TranscriptDatabase(path, quick_check_s=60)
    assert path.read_bytes() == bytes(data)


# --- a file from before checksums -----------------------------------------------------------


def _old_file(path: Path) -> None:
    old = OldTranscript(path)
    old.session(S1, "/w/one")
    old.session(S2, "/w/two", agent_session_id=None)
    old.prompt(S1, P1, "completed", stop_reason="end_turn", ended_at=9, terminal_seq=1)
    old.prompt(S2, P1)
    for n in range(1, 4):
        record_id, raw = record(n)
        old.record(S1, record_id, 1, P1, raw)
    old.raw(S2, [event(1), event(2)], P1, 2)
    old.close()


def test_a_version_2_file_is_upgraded_in_place_and_checked_from_then_on(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    _old_file(path)
    store = TranscriptDatabase(path)
    assert store.schema_version == 3
    one = store.get_session(S1)
    assert one is not None and one.workspace_cwd == "/w/one"
    assert store.page(S1, limit=10).events == [record(n)[1] for n in range(1, 4)]
    assert store.raw_events(S2) == [event(1), event(2)]
    assert store.in_flight_prompts(S2) == [P1]
    assert to_builtins(store.prompt_terminals(S1)) == [{"v": 1, "promptId": P1, "terminal": "completed",
                                          "stopReason": "end_turn", "at": 9}]
    # From now on a changed byte of an old row is found like a new one's.
    raw = store.connection.execute("SELECT raw FROM records WHERE seq = 2").fetchone()[0]
    store.connection.execute("UPDATE records SET raw = ? WHERE seq = 2",
                        (raw.replace(b'"n":2', b'"n":3'),))
    with pytest.raises(DamagedRow, match="records row 2"):
        store.page(S1, limit=10)
    store.close()


def test_a_version_2_file_holding_bytes_that_are_not_events_is_not_upgraded(
        tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    _old_file(path)
    old = sqlite3.connect(path)
    old.execute("UPDATE records SET raw = ? WHERE seq = 2", (b'{"id":2,"v":1,"ty\xffpe',))
    old.commit()
    old.close()
    before = path.read_bytes()
    with pytest.raises(TranscriptDamagedError, match=r"records row 2 .* not JSON"):
        TranscriptDatabase(path)
    assert path.read_bytes() == before
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    conn.close()


# --- the background check yields ------------------------------------------------------------


class _LongCheckStore(TranscriptDatabase):
    """A store whose integrity_check runs until it is interrupted (what SQLite then answers:
    ``None``) or until the test lets it finish (nothing found)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.started = threading.Event()
        self._wake = threading.Condition()
        self._cut = False
        self._finish = False
        self.attempts = 0
        self.interrupts = 0

    def interrupt(self) -> None:
        with self._wake:
            self.interrupts += 1
            self._cut = True
            self._wake.notify_all()

    def finish(self) -> None:
        with self._wake:
            self._finish = True
            self._wake.notify_all()

    def integrity_problems(self) -> list[str] | None:
        with self._wake:
            self.attempts += 1
            self._cut = False
            self.started.set()
            self._wake.wait_for(lambda: self._cut or self._finish, 30)
            return None if self._cut else []


async def test_the_background_check_gives_way_to_every_commit(tmp_path: Path) -> None:
    store = _LongCheckStore(tmp_path / "t.db")
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        done = trio.Event()

        async def check() -> None:
            await check_transcript(writer, retry_pause_s=0.001)
            done.set()

        nursery.start_soon(check)
        for n in range(4):
            await trio.to_thread.run_sync(store.started.wait, 30)
            store.started.clear()
            seq = writer.submit(UpsertSession(f"{S1[:-1]}{n}", "/w", n))
            if n < 3:  # an interruptible attempt is cut by the commit that needs the file
                with trio.fail_after(30):
                    assert await writer.wait_committed(seq)
                assert store.interrupts == n + 1
        # The last attempt runs to its end whatever waits: the commit waits for it.
        await trio.testing.wait_all_tasks_blocked()
        assert store.interrupts == 3 and writer.pending_count == 1  # waiting for the file
        assert not writer._is_failed(seq) and store.get_session(f"{S1[:-1]}3") is None
        store.finish()
        with trio.fail_after(30):
            assert await writer.wait_committed(seq)
            await done.wait()
        assert store.attempts == 4 and store.interrupts == 3
        assert writer.full_check == "ok"
        await writer.aclose()


async def test_the_background_check_finds_a_row_changed_on_disk(tmp_path: Path) -> None:
    store = TranscriptDatabase(tmp_path / "t.db")
    store.apply([UpsertSession(S1, "/w", 1), UpsertSession(S2, "/w", 2)])
    store.apply([FinishTurn(S2, None, "completed", None, 2, [record(n) for n in range(1, 80)])])
    store.connection.execute("UPDATE records SET raw = ? WHERE seq = 77", (record(78)[1],))
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await check_transcript(writer)
        assert writer.full_check == "damaged"
        assert writer.damaged_sessions == {S2} and not writer.store_damaged
        assert writer.damage == [f"damaged records row 77 of session {S2}: checksum mismatch"]
        with pytest.raises(transcript_store.TranscriptDamaged):
            await writer.read(lambda s: s.page(S2, limit=5), session_id=S2)
        assert (await writer.read(lambda s: s.get_session(S1), session_id=S1)) is not None
        await writer.aclose()


# --- recovery -------------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    data = tmp_path / "data"
    data.mkdir()
    store = TranscriptDatabase(data / TRANSCRIPT_FILE)
    store.apply([UpsertSession(S1, "/w", 1), UpsertSession(S2, "/w", 2),
                 AdmitPrompt(S1, P1, 3)])
    store.apply([FinishTurn(S1, P1, "completed", "end_turn", 4,
                            [record(n, 2000) for n in range(1, 301)])])
    store.apply([AppendEvent(S2, n, None, event(n)) for n in range(1, 6)])
    store.close()
    yield data


def _rows(path: Path) -> dict[tuple[str, int], tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return {(table, row[0]): tuple(row) for table in transcript_store.CHECKED_TABLES
                for row in conn.execute(f"SELECT rowid, * FROM {table}")}
    finally:
        conn.close()


def _leaf_pages(path: Path, table: str) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY pageno",
            (table,))]
    finally:
        conn.close()


def test_recovery_of_a_whole_transcript_changes_nothing(data_dir: Path) -> None:
    before = (data_dir / TRANSCRIPT_FILE).read_bytes()
    out = io.StringIO()
    assert run_recovery(data_dir, out) == 0
    assert "is whole" in out.getvalue() and "nothing to recover" in out.getvalue()
    assert (data_dir / TRANSCRIPT_FILE).read_bytes() == before
    assert sorted(p.name for p in data_dir.iterdir()) == ["daemon.lock", TRANSCRIPT_FILE]


def test_recovery_steps_over_an_unreadable_page_and_keeps_every_intact_row(
        data_dir: Path) -> None:
    db = data_dir / TRANSCRIPT_FILE
    clean = _rows(db)
    leaves = _leaf_pages(db, "records")
    assert len(leaves) >= 5
    damaged = bytearray(db.read_bytes())
    page = leaves[len(leaves) // 2]
    damaged[(page - 1) * transcript_store.PAGE_SIZE] = 0x07
    db.write_bytes(bytes(damaged))

    report = recover_transcript(data_dir)
    assert report is not None and "quick_check" in report.problem
    assert report.damaged_copy is not None and report.damaged_copy.read_bytes() == bytes(damaged)
    assert report.unreadable_stretches == 1
    rows = _rows(db)
    assert all(clean[key] == row for key, row in rows.items())
    lost = sorted(seq for (table, seq) in clean.keys() - rows.keys())
    assert all(table == "records" for table, _ in clean.keys() - rows.keys())
    # Exactly the rows of the one unreadable page: a contiguous stretch, nothing around it.
    assert 0 < len(lost) < 300 // (len(leaves) - 2)
    assert lost == list(range(lost[0], lost[-1] + 1))
    assert report.kept["records"] == 300 - len(lost)
    assert report.kept["sessions"] == 2 and report.kept["raw_events"] == 1
    store = TranscriptDatabase(db, quick_check_s=60)
    assert store.integrity_problems() == []
    assert store.raw_events(S2) == [event(n) for n in range(1, 6)]
    store.close()


def test_recovery_drops_the_rows_whose_checksum_fails(data_dir: Path) -> None:
    db = data_dir / TRANSCRIPT_FILE
    clean = _rows(db)
    damaged = bytearray(db.read_bytes())
    target = record(150, 2000)[1]
    at = damaged.index(target)
    damaged[at + 20] ^= 0x04  # one bit of record 150's payload
    db.write_bytes(bytes(damaged))
    out = io.StringIO()
    assert run_recovery(data_dir, out) == 0
    text = out.getvalue()
    assert "1 records (checksum)" in text and S1 in text, text
    rows = _rows(db)
    assert clean.keys() - rows.keys() == {("records", 150)}
    assert all(clean[key] == row for key, row in rows.items())
    assert list(data_dir.glob(TRANSCRIPT_FILE + ".damaged-*"))


def test_recovery_of_an_empty_file_keeps_it_and_starts_a_new_transcript(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / TRANSCRIPT_FILE).write_bytes(b"")
    out = io.StringIO()
    assert run_recovery(data, out) == 0
    assert "the file is empty" in out.getvalue()
    kept = list(data.glob(TRANSCRIPT_FILE + ".damaged-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == b""
    store = TranscriptDatabase(data / TRANSCRIPT_FILE, quick_check_s=60)
    assert store.list_sessions() == []
    store.close()


def test_recovery_waits_for_no_daemon_and_refuses_a_newer_file(data_dir: Path) -> None:
    lock = acquire_lock(data_dir)
    out = io.StringIO()
    try:
        assert run_recovery(data_dir, out) == 1
    finally:
        lock.close()
    assert "another daemon is already using" in out.getvalue()
    conn = sqlite3.connect(data_dir / TRANSCRIPT_FILE)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    before = (data_dir / TRANSCRIPT_FILE).read_bytes()
    out = io.StringIO()
    assert run_recovery(data_dir, out) == 1
    assert "schema_version 99" in out.getvalue()
    assert (data_dir / TRANSCRIPT_FILE).read_bytes() == before


def test_recovery_does_not_bring_back_raw_events_a_turn_boundary_deleted(tmp_path: Path) -> None:
    """A finished turn's raw events, deleted at its boundary, still lie in the pages SQLite
    freed (``secure_delete=FAST`` leaves a freed page as it was). Damage that makes the table
    point into such a page (here: the raw_events root, an empty leaf after the boundary,
    rewritten as an interior page whose only child is the freed leaf) hands recovery rows
    whose checksums match: they must not come back, the prompt's ledger row shows it ended."""
    data = tmp_path / "data"
    data.mkdir()
    db = data / TRANSCRIPT_FILE
    store = TranscriptDatabase(db)
    p2 = "0b1c2d3e-4f50-4a6b-8c7d-8e9fa0b1c2d3"
    store.apply([UpsertSession(S1, "/w", 1), UpsertSession(S2, "/w", 2),
                 AdmitPrompt(S1, P1, 3)])
    for n in range(1, 400):  # one row per commit, like a slow turn: several leaves
        store.apply([AppendEvent(S1, n, P1, msgspec.json.encode(
            {"id": n, "v": 1, "type": "x", "promptId": P1, "data": f"STALE{n:05d}" + "y" * 300}))])
    conn = store.connection
    leaves = [row[0] for row in conn.execute(
        "SELECT pageno FROM dbstat WHERE name = 'raw_events' AND pagetype = 'leaf'")]
    assert len(leaves) >= 2
    store.apply([FinishTurn(S1, P1, "completed", "end_turn", 4, [record(1)]),
                 AdmitPrompt(S2, p2, 5)])
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'raw_events'"
                        ).fetchone()[0]
    assert conn.execute("SELECT count(*) FROM raw_events").fetchone()[0] == 0
    store.close()  # checkpoints: everything is in the file

    raw = bytearray(db.read_bytes())
    size = transcript_store.PAGE_SIZE

    def page(n: int) -> bytearray:
        return raw[(n - 1) * size:n * size]

    # Freed leaves that still hold the deleted rows, as SQLite left them.
    stale = [n for n in leaves if page(n)[0] == 0x0D and b"STALE" in page(n)]
    assert len(stale) >= 2
    at = (root - 1) * size
    assert raw[at] == 0x0D and raw[at + 3:at + 5] == b"\x00\x00"  # an empty table leaf
    # Now an interior table page (SQLite takes one without cells for damage): one cell, left
    # child the first stale leaf below key 16383, right child the second.
    cell = stale[0].to_bytes(4, "big") + b"\xff\x7f"
    raw[at:at + 14] = (bytes([0x05, 0, 0, 0, 1]) + (size - len(cell)).to_bytes(2, "big")
                       + bytes([0]) + stale[1].to_bytes(4, "big")
                       + (size - len(cell)).to_bytes(2, "big"))
    raw[at + size - len(cell):at + size] = cell
    db.write_bytes(bytes(raw))
    # What recovery reads: rows whose checksums match, of a prompt the ledger ended.
    salvaged = salvage_rows(Path(shutil.copyfile(db, tmp_path / "peek.sqlite3")))
    columns = salvaged["raw_events"].columns
    back = [row for row in salvaged["raw_events"].rows
            if row[1 + columns.index("crc")] == row_crc(*row[2:6])]
    assert back and all(row[1 + columns.index("prompt_id")] == P1 for row in back)

    report = recover_transcript(data)
    assert report is not None, "the damage was not found"
    assert report.dropped["raw_events (of an ended prompt)"] == len(back)
    assert report.kept["raw_events"] == 0
    assert S1 not in report.sessions_with_losses
    store = TranscriptDatabase(db, quick_check_s=60)
    try:
        assert store.integrity_problems() == []
        assert store.raw_events(S1) == []
        assert store.get_prompt(S1, P1) is not None
        assert store.get_prompt(S1, P1).state == "completed"  # type: ignore[union-attr]
        assert store.record_count(S1) == 1
        assert store.in_flight_prompts(S2) == [p2]
    finally:
        store.close()
    assert b"STALE" not in db.read_bytes()
