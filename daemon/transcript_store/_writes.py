"""The transcript's write path: a batch of :data:`Op` values applied in one transaction (what
makes group commit atomic), every row written with its checksum, and the sessions stored as
committed (which lets a batch of nothing but events skip the existence checks in SQL).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, Final

from daemon.core.checksum import row_crc
from daemon.core.transcript_ops import (
    TERMINAL_STATES,
    AdmitPrompt,
    AppendEvent,
    DeleteSession,
    FinishTurn,
    MarkClosed,
    Op,
    UpsertSession,
)
from daemon.core.transcript_rows import RawRow, event_rows, op_runs
from daemon.malloc import MMAP_THRESHOLD

from ._schema import CHECKED_TABLES, PROMPT_COLUMNS, RECORD_COLUMNS, SESSION_COLUMNS, checked

__all__ = ["ROW_MAX_BYTES", "TranscriptWrites"]

# Largest raw_events row a batch's events are joined into (a single bigger event gets a row of
# its own). Kept below the daemon's fixed malloc mmap threshold (``daemon.malloc``): a row is
# built twice, by the join and by SQLite's copy of the bound blob, and a block at or above the
# threshold is a fresh mmap each time, page-faulted in and unmapped again (``python -m
# benchmarks transcript_cost``; figures: benchmarks/README.md, "Figures behind the code").
# Statements are not cached (see ``_file._connect``), so each row is freed as soon as its
# INSERT is done.
ROW_MAX_BYTES: Final = MMAP_THRESHOLD - 64 * 1024

# Pages per row of the zeros that overwrite the free pages when a session is deleted.
_WIPE_ROW_PAGES: Final = 2048

_SESSION_EXISTS: Final = "EXISTS (SELECT 1 FROM sessions WHERE session_id = ?)"
# Most raw_events rows one INSERT statement writes (5 bound values each; see _append_only):
# any 16 rows, or up to 256 small ones (their blobs together at most _ONE_STATEMENT_BYTES,
# which SQLite copies all at once for the statement).
_ONE_STATEMENT_ROWS: Final = 16
_ONE_STATEMENT_SMALL_ROWS: Final = 256
_ONE_STATEMENT_BYTES: Final = 1024 * 1024
_INSERT_RAW: Final = (
    "INSERT INTO raw_events (session_id, event_id, prompt_id, raw, crc) VALUES (?, ?, ?, ?, ?)"
)
_RAW_VALUES: Final = ", (?, ?, ?, ?, ?)"


class TranscriptWrites:
    """Every change to the transcript, on one connection, one caller at a time."""

    def __init__(self, conn: sqlite3.Connection, stored: Iterable[str]) -> None:
        self._conn = conn
        # The sessions stored, as committed: lets a batch of nothing but events (the usual
        # one) skip the existence checks in SQL. Only a commit here changes it (and
        # :meth:`forget_session`).
        self._stored: set[str] = set(stored)

    def has_session(self, session_id: str) -> bool:
        """Is ``session_id`` a stored session (as committed)?"""
        return session_id in self._stored

    def forget_session(self, session_id: str) -> None:
        """The session's rows were deleted by SQL run outside this class (retention)."""
        self._stored.discard(session_id)

    def apply(self, ops: Sequence[Op]) -> None:
        """Apply ``ops`` in order in one transaction; on any error roll all of them back and
        re-raise. Ops naming a session that is not stored (never created, or deleted) write
        nothing: a late write must not leave rows no session owns."""
        if all(type(op) is AppendEvent for op in ops):
            self._append_only(ops)  # type: ignore[arg-type]
            return
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for group in op_runs(ops):
                first = group[0]
                if isinstance(first, AppendEvent):
                    self._insert_events(event_rows(group, ROW_MAX_BYTES),  # type: ignore[arg-type]
                                        checked=False)
                else:
                    self._apply_one(first)
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        stored = self._stored
        for op in ops:
            if isinstance(op, UpsertSession):
                stored.add(op.session_id)
            elif isinstance(op, DeleteSession):
                stored.discard(op.session_id)

    def insert_salvaged(self, table: str, rows: Sequence[tuple[int, Sequence[Any]]]) -> int:
        """Recovery: insert rows read from a damaged transcript, each ``(rowid, values)`` with
        the values of ``table``'s checksummed columns, under their old rowids and with their
        checksums, in one transaction. A row whose rowid or unique key is taken already is
        left out; returns how many were inserted."""
        columns = CHECKED_TABLES[table]
        marks = ", ".join("?" * (len(columns.split(",")) + 2))
        key = "seq" if table in ("raw_events", "records") else "rowid"
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            before = conn.total_changes
            conn.executemany(
                f"INSERT OR IGNORE INTO {table} ({key}, {columns}, crc) VALUES ({marks})",
                [(rowid, *values, row_crc(*values)) for rowid, values in rows])
            inserted = conn.total_changes - before
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        if table == "sessions":
            self._stored.update(str(values[0]) for _, values in rows)
        return inserted

    def _append_only(self, ops: Sequence[AppendEvent]) -> None:
        """A batch of nothing but events: no op in it creates or deletes a session, so the
        committed set of stored sessions decides which rows are written. Up to
        ``_ONE_STATEMENT_ROWS`` rows (a fast turn's batch is one to three), or up to
        ``_ONE_STATEMENT_SMALL_ROWS`` small ones (the LLM-paced batch: a row for each of dozens
        of sessions), are one INSERT with that many VALUES tuples, its own transaction: one
        SQLite call instead of BEGIN, an INSERT per row and COMMIT, each of which the worker
        thread leaves and re-takes the GIL for, against the event loop. Outside an explicit
        transaction such a statement needs no statement journal: if it fails, the whole
        (implicit) transaction is rolled back."""
        stored = self._stored
        rows = [row for row in event_rows(ops, ROW_MAX_BYTES) if row[0] in stored]
        if not rows:
            return
        if len(rows) == 1:
            self._conn.execute(_INSERT_RAW, rows[0])
            return
        if len(rows) <= _ONE_STATEMENT_ROWS or (
                len(rows) <= _ONE_STATEMENT_SMALL_ROWS
                and sum(len(row[3]) for row in rows) <= _ONE_STATEMENT_BYTES):
            self._conn.execute(_INSERT_RAW + _RAW_VALUES * (len(rows) - 1),
                               [value for row in rows for value in row])
            return
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._insert_events(rows, checked=True)
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        conn = self._conn
        # Some errors (SQLITE_FULL, SQLITE_IOERR) already rolled the transaction back.
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the original error is the one worth reporting

    def _insert_events(self, rows: list[RawRow], *, checked: bool) -> None:
        # A plain one-row INSERT, the session's existence checked first (in SQL, in this
        # transaction, unless the caller already checked: an earlier op of the batch that
        # deleted it counts): the INSERT ... SELECT ... WHERE EXISTS it replaces is a
        # multi-row statement to SQLite, which then keeps a statement journal (a temp file)
        # of every page it touches.
        conn = self._conn
        if not checked:
            stored = {sid for sid in {row[0] for row in rows}
                      if conn.execute(f"SELECT {_SESSION_EXISTS}", (sid,)).fetchone()[0]}
            rows = [row for row in rows if row[0] in stored]
        conn.executemany(_INSERT_RAW, rows)

    def _apply_one(self, op: Op) -> None:
        conn = self._conn
        if isinstance(op, UpsertSession):
            self._upsert_session(op)
        elif isinstance(op, AdmitPrompt):
            values = (op.session_id, op.prompt_id, "in_flight", None, op.at_ms, None, None,
                      op.idempotency_key, op.request_digest, op.accepted_event_id,
                      op.accepted_epoch)
            conn.execute(
                f"INSERT INTO prompts ({PROMPT_COLUMNS}, crc) "
                f"SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE {_SESSION_EXISTS} "
                "ON CONFLICT (session_id, prompt_id) DO NOTHING",
                (*values, row_crc(*values), op.session_id),
            )
        elif isinstance(op, FinishTurn):
            self._finish_turn(op)
        elif isinstance(op, DeleteSession):
            self._delete_session(op.session_id)
        elif isinstance(op, MarkClosed):
            row = self._session_values(op.session_id)
            if row is not None:
                values = (*row[1:5], 1)
                conn.execute("UPDATE sessions SET closed = 1, crc = ? WHERE rowid = ?",
                             (row_crc(*values), row[0]))
        else:
            raise TypeError(f"not a transcript op: {op!r}")

    def _session_values(self, session_id: str) -> Sequence[Any] | None:
        """The session's row (rowid, the checksummed columns, crc), its checksum checked: a
        change to a damaged row must fail, not vouch for the damage with a new checksum."""
        row = self._conn.execute(
            f"SELECT rowid, {SESSION_COLUMNS}, crc FROM sessions WHERE session_id = ?",
            (session_id,)).fetchone()
        return None if row is None else checked(row, "sessions", session_id)

    def _upsert_session(self, op: UpsertSession) -> None:
        row = self._session_values(op.session_id)
        if row is None:
            values = (op.session_id, op.workspace_cwd, op.created_at_ms, op.agent_session_id, 0)
            self._conn.execute(
                f"INSERT INTO sessions ({SESSION_COLUMNS}, crc) VALUES (?, ?, ?, ?, ?, ?)",
                (*values, row_crc(*values)))
            return
        agent_session_id = op.agent_session_id if op.agent_session_id is not None else row[4]
        values = (op.session_id, op.workspace_cwd, row[3], agent_session_id, 0)
        self._conn.execute(
            "UPDATE sessions SET workspace_cwd = ?, agent_session_id = ?, closed = 0, crc = ? "
            "WHERE rowid = ?", (op.workspace_cwd, agent_session_id, row_crc(*values), row[0]))

    def _delete_session(self, session_id: str) -> None:
        """Remove every row of the session and leave none of its bytes in the file. Deleted
        cells are zeroed inside the pages that stay in use (``secure_delete=FAST``, see
        ``_file._configure``); whole pages freed, by this delete or by earlier turn boundaries
        (which may still hold this session's raw events), are overwritten with zeros by a row
        that takes every free page and is deleted again. That costs one write of the free
        pages per deleted session instead of one per turn."""
        conn = self._conn
        for table in ("raw_events", "records", "prompts", "sessions"):
            conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
        free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        if free:
            page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            # An overflow page holds page_size - 4 bytes; blobs stay far below SQLite's limit.
            per_row = _WIPE_ROW_PAGES * (page_size - 4)
            left = (free + 1) * (page_size - 4)  # + 1: the local part on the leaf
            rows = []
            while left > 0:
                rows.append((min(left, per_row),))
                left -= per_row
            # No session row is named '': no reader can see these rows, and they go at once.
            conn.executemany("INSERT INTO raw_events (session_id, event_id, prompt_id, raw) "
                             "VALUES ('', 0, NULL, zeroblob(?))", rows)
            conn.execute("DELETE FROM raw_events WHERE session_id = ''")

    def _finish_turn(self, op: FinishTurn) -> None:
        if op.terminal not in TERMINAL_STATES:
            raise ValueError(
                f"FinishTurn.terminal must be one of {sorted(TERMINAL_STATES)}, "
                f"got {op.terminal!r} (session {op.session_id})"
            )
        conn = self._conn
        sid = op.session_id
        if conn.execute(f"SELECT {_SESSION_EXISTS}", (sid,)).fetchone()[0] == 0:
            return
        conn.execute("DELETE FROM raw_events WHERE session_id = ?", (sid,))
        last = conn.execute(
            "SELECT turn FROM records WHERE session_id = ? ORDER BY seq DESC LIMIT 1", (sid,)
        ).fetchone()
        turn = (last[0] if last else 0) + 1
        conn.executemany(
            f"INSERT INTO records ({RECORD_COLUMNS}, crc) VALUES (?, ?, ?, ?, ?, ?)",
            [(sid, record_id, turn, op.prompt_id, raw,
              row_crc(sid, record_id, turn, op.prompt_id, raw)) for record_id, raw in op.records],
        )
        if op.prompt_id is not None:
            self._latch_terminal(op)

    def _latch_terminal(self, op: FinishTurn) -> None:
        """The ledger terminal of ``op.prompt_id``. The first terminal wins, like the runner's
        per-prompt latch: a second FinishTurn for the same prompt cannot rewrite how it ended.
        The admission's row is checked before it is rewritten with a new checksum."""
        conn = self._conn
        sid = op.session_id
        row = conn.execute(
            f"SELECT rowid, {PROMPT_COLUMNS}, crc FROM prompts "
            "WHERE session_id = ? AND prompt_id = ?", (sid, op.prompt_id)).fetchone()
        if row is not None and checked(row, "prompts", sid)[3] != "in_flight":
            return
        terminal_seq = conn.execute(
            "SELECT coalesce(max(terminal_seq), 0) + 1 FROM prompts WHERE session_id = ?",
            (sid,)).fetchone()[0]
        if row is None:
            values = (sid, op.prompt_id, op.terminal, op.stop_reason, None, op.at_ms,
                      terminal_seq, None, None, None, None)
            conn.execute(f"INSERT INTO prompts ({PROMPT_COLUMNS}, crc) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (*values, row_crc(*values)))
            return
        values = (sid, op.prompt_id, op.terminal, op.stop_reason, row[5], op.at_ms,
                  terminal_seq, *row[8:12])
        conn.execute("UPDATE prompts SET state = ?, stop_reason = ?, ended_at = ?, "
                     "terminal_seq = ?, crc = ? WHERE rowid = ?",
                     (op.terminal, op.stop_reason, op.at_ms, terminal_seq, row_crc(*values),
                      row[0]))
