"""The transcript's read path: sessions, the prompt ledger, a page of a transcript, and what
a restore or a load reads back. Every row is held to its checksum as it is read
(:func:`~daemon.transcript_store._schema.checked`): a damaged one raises :class:`DamagedRow`,
never reaches a caller.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence
from typing import Any, Literal

import msgspec

from daemon.core.transcript_ops import KeyedPromptRow, PromptRow, SessionRow, StoredPage
from daemon.core.transcript_rows import InvalidCursor, decode_cursor, encode_cursor, row_events
from sdk.protocol.http import PromptTerminal

from ._errors import DamagedRow
from ._schema import PROMPT_COLUMNS, RAW_COLUMNS, RECORD_COLUMNS, SESSION_COLUMNS, checked

__all__ = ["TranscriptReads"]


class TranscriptReads:
    """Every query of the transcript, on one connection, one caller at a time."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    # --- sessions and the ledger ---

    def get_session(self, session_id: str) -> SessionRow | None:
        row = self._conn.execute(
            f"SELECT rowid, {SESSION_COLUMNS}, crc FROM sessions WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        return _session_row(checked(row, "sessions", session_id)) if row else None

    def list_sessions(self) -> list[SessionRow]:
        rows = self._conn.execute(
            f"SELECT rowid, {SESSION_COLUMNS}, crc FROM sessions "
            "ORDER BY created_at, session_id"
        ).fetchall()
        return [_session_row(checked(row, "sessions")) for row in rows]

    def sessions_before(self, before: tuple[int, str] | None, limit: int,
                        workspace: str | None = None,
                        skip: Collection[str] = ()) -> list[SessionRow]:
        """Up to ``limit`` sessions not closed, newest created first (ties: session id
        descending), each below ``before`` (created at ms, session id) when given, in
        ``workspace`` when given, and not one of ``skip`` (``GET /sessions``)."""
        where, args = ["closed = 0"], list[object]()
        if before is not None:
            where.append("(created_at, session_id) < (?, ?)")
            args.extend(before)
        if workspace is not None:
            where.append("workspace_cwd = ?")
            args.append(workspace)
        rows = self._conn.execute(
            f"SELECT rowid, {SESSION_COLUMNS}, crc FROM sessions WHERE {' AND '.join(where)} "
            "ORDER BY created_at DESC, session_id DESC" + ("" if skip else " LIMIT ?"),
            (*args,) if skip else (*args, limit))
        out: list[SessionRow] = []
        for row in rows:
            if len(out) >= limit:
                break
            if row[1] not in skip:
                out.append(_session_row(checked(row, "sessions")))
        return out

    def _prompt_rows(self, session_id: str, where: str, args: Sequence[Any],
                     order: str = "rowid", limit: int = -1) -> list[Sequence[Any]]:
        """The session's ledger rows matching ``where`` (rowid, the checksummed columns,
        crc), each checked."""
        rows = self._conn.execute(
            f"SELECT rowid, {PROMPT_COLUMNS}, crc FROM prompts WHERE session_id = ? "
            f"AND {where} ORDER BY {order} LIMIT ?", (session_id, *args, limit)).fetchall()
        return [checked(row, "prompts", session_id) for row in rows]

    def get_prompt(self, session_id: str, prompt_id: str) -> PromptRow | None:
        for row in self._prompt_rows(session_id, "prompt_id = ?", (prompt_id,)):
            return PromptRow(row[1], row[2], row[3], row[4], row[5], row[6])
        return None

    def find_keyed_prompt(self, session_id: str, key: str) -> KeyedPromptRow | None:
        """The prompt of the session admitted with idempotency key ``key`` (the newest,
        should there be two: a cluster node admits a key again after withdrawing a prompt it
        answered 503), or ``None``."""
        for row in self._prompt_rows(session_id, "idempotency_key = ?", (key,),
                                     order="rowid DESC", limit=1):
            if row[9] is None or row[10] is None or row[11] is None:
                raise DamagedRow(session_id, "prompts", row[0], "keyed admission incomplete")
            return KeyedPromptRow(
                prompt_id=row[2], idempotency_key=row[8], request_digest=row[9],
                accepted_event_id=row[10], accepted_epoch=row[11], state=row[3],
                stop_reason=row[4], admitted_at_ms=row[5], ended_at_ms=row[6])
        return None

    def in_flight_prompts(self, session_id: str) -> list[str]:
        """Prompts admitted and never ended, in admission order. Every ledger row of the
        session is read (and checked) for it: a restore, which asks this, thereby finds a
        damaged row before a request with an idempotency key could miss it (a damaged key
        is looked up in vain)."""
        rows = self._prompt_rows(session_id, "1", (), order="admitted_at, rowid")
        return [row[2] for row in rows if row[3] == "in_flight"]

    def prompt_terminals(self, session_id: str, limit: int = 64) -> list[PromptTerminal]:
        """The last ``limit`` ledger terminals, oldest first, as load answers carry them."""
        rows = self._prompt_rows(session_id, "terminal_seq IS NOT NULL", (),
                                 order="terminal_seq DESC", limit=limit)
        return [PromptTerminal(prompt_id=row[2], terminal=row[3],
                               stop_reason=row[4] if row[4] is not None else msgspec.UNSET,
                               at=row[6])
                for row in reversed(rows)]

    # --- events ---

    def raw_events(self, session_id: str) -> list[bytes]:
        """The unfinished turn's durable events, in publish order."""
        rows = self._conn.execute(
            f"SELECT seq, {RAW_COLUMNS}, crc FROM raw_events WHERE session_id = ? ORDER BY seq",
            (session_id,)
        ).fetchall()
        events: list[bytes] = []
        for row in rows:
            checked(row, "raw_events", session_id)
            try:
                events.extend(row_events(bytes(row[4])))
            except ValueError as exc:  # its checksum matched: what was written was not events
                raise DamagedRow(session_id, "raw_events", row[0], str(exc)) from None
        return events

    def records_forward(self, session_id: str, after_seq: int, limit: int
                        ) -> tuple[list[bytes], int]:
        """Up to ``limit`` records of the session stored after ``after_seq`` (0: from its
        first), oldest first, and the position to go on from (``after_seq`` when there were
        none): a whole transcript read in order a page at a time (export)."""
        rows = self._conn.execute(
            f"SELECT seq, {RECORD_COLUMNS}, crc FROM records WHERE session_id = ? AND seq > ? "
            "ORDER BY seq LIMIT ?", (session_id, after_seq, limit)).fetchall()
        events = [bytes(checked(row, "records", session_id)[5]) for row in rows]
        return events, rows[-1][0] if rows else after_seq

    def max_raw_event_id(self, session_id: str) -> int:
        """Highest event id among the unfinished turn's raw events (0 if none)."""
        row = self._conn.execute(
            "SELECT coalesce(max(event_id), 0) FROM raw_events WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        return int(row[0])

    def record_count(self, session_id: str) -> int:
        row = self._conn.execute(
            "SELECT count(*) FROM records WHERE session_id = ?", (session_id,)
        ).fetchone()
        return int(row[0])

    def newest_record_id(self, session_id: str) -> str | None:
        return self._edge_record_id(session_id, "DESC")

    def oldest_record_id(self, session_id: str) -> str | None:
        return self._edge_record_id(session_id, "ASC")

    def _edge_record_id(self, session_id: str, order: Literal["ASC", "DESC"]) -> str | None:
        row = self._conn.execute(
            f"SELECT record_id FROM records WHERE session_id = ? ORDER BY seq {order} LIMIT 1",
            (session_id,),
        ).fetchone()
        return row[0] if row else None

    def records_by_id(self, session_id: str, record_ids: Sequence[str]) -> list[bytes] | None:
        """The stored events of ``record_ids``, in that order; None if any is not stored for
        this session (for a load serving a turn the replay window keeps only by id)."""
        found: dict[str, bytes] = {}
        ids = list(record_ids)
        for start in range(0, len(ids), 500):  # well under SQLite's bound-parameter limit
            chunk = ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for row in self._conn.execute(
                f"SELECT seq, {RECORD_COLUMNS}, crc FROM records WHERE session_id = ? "
                f"AND record_id IN ({marks})",
                (session_id, *chunk),
            ):
                checked(row, "records", session_id)
                found[row[2]] = bytes(row[5])
        if len(found) < len(set(ids)):
            return None
        return [found[record_id] for record_id in ids]

    def page(
        self,
        session_id: str,
        *,
        limit: int,
        cursor: str | None = None,
        before_record_id: str | None = None,
    ) -> StoredPage:
        """A page of the transcript, going back in time.

        No cursor and no ``before_record_id``: the newest ``limit`` records, then the raw
        events of the unfinished turn (not counted in ``limit``). ``before_record_id=X``: the
        newest ``limit`` records older than X. ``cursor``: the page after the one that returned
        it. Raises :class:`InvalidCursor` for both anchors at once or one naming no record of
        this session, and ``ValueError`` for ``limit < 1``.
        """
        if limit < 1:
            raise ValueError(f"page limit must be >= 1, got {limit}")
        if cursor is not None and before_record_id is not None:
            raise InvalidCursor("give either a cursor or beforeRecordId, not both")
        anchor = decode_cursor(cursor) if cursor is not None else before_record_id
        conn = self._conn
        if anchor is None:
            rows = conn.execute(
                f"SELECT seq, {RECORD_COLUMNS}, crc FROM records WHERE session_id = ? "
                "ORDER BY seq DESC LIMIT ?",
                (session_id, limit + 1),
            ).fetchall()
        else:
            found = conn.execute(
                "SELECT seq FROM records WHERE record_id = ? AND session_id = ?",
                (anchor, session_id),
            ).fetchone()
            if found is None:
                what = "cursor" if cursor is not None else "beforeRecordId"
                raise InvalidCursor(
                    f"transcript {what} {cursor if cursor is not None else anchor!r} "
                    f"names no record of session {session_id}"
                )
            rows = conn.execute(
                f"SELECT seq, {RECORD_COLUMNS}, crc FROM records WHERE session_id = ? "
                "AND seq < ? ORDER BY seq DESC LIMIT ?",
                (session_id, found[0], limit + 1),
            ).fetchall()
        has_more = len(rows) > limit
        rows = rows[:limit]
        rows.reverse()
        events = [bytes(checked(row, "records", session_id)[5]) for row in rows]
        if anchor is None:
            events.extend(self.raw_events(session_id))
        next_cursor = encode_cursor(rows[0][2]) if has_more else None
        return StoredPage(events=events, next_cursor=next_cursor, has_more=has_more)

    def newest_turns(
        self, session_id: str, max_bytes: int
    ) -> tuple[list[list[tuple[str, bytes]]], int, int]:
        """The newest whole turns whose records fit ``max_bytes`` together (always at least the
        newest turn, like the replay window keeps its newest segment), oldest turn first; plus
        the number of older records and of older turns left out. For seeding the replay window
        on restore."""
        conn = self._conn
        keep_from: int | None = None  # lowest turn number kept
        total = 0
        turn_now: int | None = None
        turn_bytes = 0
        sizes = conn.execute(
            "SELECT turn, length(raw) FROM records WHERE session_id = ? ORDER BY seq DESC",
            (session_id,),
        )
        try:
            for turn, size in sizes:
                if turn != turn_now:
                    if turn_now is not None:
                        if keep_from is not None and total + turn_bytes > max_bytes:
                            turn_now = None  # this turn does not fit: stop here
                            break
                        total += turn_bytes
                        keep_from = turn_now
                    turn_now, turn_bytes = turn, 0
                turn_bytes += size
            if turn_now is not None and (keep_from is None or total + turn_bytes <= max_bytes):
                keep_from = turn_now
        finally:
            sizes.close()
        if keep_from is None:
            return [], 0, 0
        turns: list[list[tuple[str, bytes]]] = []
        last_turn: int | None = None
        for row in conn.execute(
            f"SELECT seq, {RECORD_COLUMNS}, crc FROM records WHERE session_id = ? "
            "AND turn >= ? ORDER BY seq",
            (session_id, keep_from),
        ):
            checked(row, "records", session_id)
            turn = row[3]
            if turn != last_turn:
                turns.append([])
                last_turn = turn
            turns[-1].append((row[2], bytes(row[5])))
        older = conn.execute(
            "SELECT count(*), count(DISTINCT turn) FROM records WHERE session_id = ? AND turn < ?",
            (session_id, keep_from),
        ).fetchone()
        return turns, int(older[0]), int(older[1])

    def newest_records(
        self, session_id: str, max_bytes: int
    ) -> tuple[list[tuple[str, bytes]], int, int]:
        """:meth:`newest_turns` flattened: the records, oldest first, then the counts of
        older records and older turns left out."""
        turns, older_records, older_turns = self.newest_turns(session_id, max_bytes)
        return [record for turn in turns for record in turn], older_records, older_turns


def _session_row(row: Sequence[Any]) -> SessionRow:
    """A ``sessions`` row as read (rowid, its checksummed columns, crc)."""
    return SessionRow(
        session_id=row[1],
        workspace_cwd=row[2],
        created_at_ms=row[3],
        agent_session_id=row[4],
        closed=bool(row[5]),
    )



