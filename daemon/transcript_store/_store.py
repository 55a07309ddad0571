"""The store: one transcript file, its write path, read path and checks composed over the one
connection, behind one object the writer's thread calls."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection, Sequence
from os import PathLike
from typing import Any, Literal

import msgspec

from daemon.core.transcript_ops import KeyedPromptRow, Op, PromptRow, SessionRow, StoredPage
from sdk.protocol.http import PromptTerminal

from ._errors import DamagedRow
from ._file import open_file, release_memory
from ._integrity import CheckStep, Integrity
from ._reads import TranscriptReads
from ._writes import TranscriptWrites

__all__ = ["StoreHooks", "TranscriptDatabase"]


class StoreHooks(msgspec.Struct, frozen=True):
    """The store's one deliberate seam for fault injection: tests hold, count, record or fail
    commits and slow the opening check through it, on a real file and a real connection. The
    daemon never passes one. Every hook runs in the thread that called the store.

    - ``before_commit(ops)``: before a batch is applied. It may block (the commit is held:
      nothing of the batch is written yet) or raise (the batch fails; nothing is written).
    - ``after_commit(ops)``: once the batch is committed.
    - ``check_step(budget_out)``: before and at every step of the ``quick_check`` run when
      the file is opened, with the event set once the check's budget has run out (a slow disk).
    - ``connected(conn)``: with the connection as soon as it is open, before anything reads
      the file (to trace the statements it runs from the first on).
    """

    before_commit: Callable[[Sequence[Op]], None] | None = None
    after_commit: Callable[[Sequence[Op]], None] | None = None
    check_step: CheckStep | None = None
    connected: Callable[[sqlite3.Connection], None] | None = None


class TranscriptDatabase:
    """One SQLite transcript database. Not thread-safe: one caller at a time (any thread)."""

    def __init__(self, path: str | PathLike[str], *, quick_check_s: float | None = None,
                 hooks: StoreHooks | None = None) -> None:
        """Open (or create) the transcript at ``path``.

        An existing file is checked before anything is written to it: one that is empty or
        whose ``-wal`` is there without it, that is not SQLite, or (with ``quick_check_s``)
        that fails SQLite's ``quick_check`` raises :class:`TranscriptDamagedError`; one with a
        newer schema or someone else's tables :class:`TranscriptSchemaError`. The check is
        bounded: past ``quick_check_s`` seconds it is cut and :attr:`quick_check` says
        ``incomplete`` (the full check then belongs to the caller, see
        :meth:`integrity_problems`). A new file is made under another name and renamed into
        place once its schema is committed, so a transcript file is never legitimately empty.
        """
        self.path = str(path)
        opened = (open_file(self.path, quick_check_s) if hooks is None else
                  open_file(self.path, quick_check_s, hooks.check_step, hooks.connected))
        self.quick_check: Literal["ok", "incomplete", "off"] = opened.quick_check
        self._conn = opened.conn
        self._hooks = hooks
        self._writes = TranscriptWrites(opened.conn, opened.session_ids)
        self._reads = TranscriptReads(opened.conn)
        self._integrity = Integrity(opened.conn)

    def close(self) -> None:
        self._conn.close()

    def release_memory(self) -> None:
        """Give back what SQLite holds for the connection that it can drop (its clean cached
        pages, spare buffers). For a pause in the work, never inside a transaction."""
        release_memory(self._conn)

    @property
    def schema_version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    @property
    def connection(self) -> sqlite3.Connection:
        """The one connection, for the modules that run their own SQL on the transcript in
        the writer's thread (``daemon.transcript_retention``)."""
        return self._conn

    # --- writing (``_writes``) ---

    def apply(self, ops: Sequence[Op]) -> None:
        """Apply ``ops`` in order in one transaction; on any error roll all of them back and
        re-raise. Ops naming a session that is not stored (never created, or deleted) write
        nothing: a late write must not leave rows no session owns."""
        hooks = self._hooks
        if hooks is None:
            self._writes.apply(ops)
            return
        if hooks.before_commit is not None:
            hooks.before_commit(ops)
        self._writes.apply(ops)
        if hooks.after_commit is not None:
            hooks.after_commit(ops)

    def insert_salvaged(self, table: str, rows: Sequence[tuple[int, Sequence[Any]]]) -> int:
        """Recovery: insert rows read from a damaged transcript under their old rowids (see
        :meth:`TranscriptWrites.insert_salvaged`); returns how many were inserted."""
        return self._writes.insert_salvaged(table, rows)

    def has_session(self, session_id: str) -> bool:
        """Is ``session_id`` a stored session (as committed)?"""
        return self._writes.has_session(session_id)

    def forget_session(self, session_id: str) -> None:
        """The session's rows were deleted by retention's own SQL: it is no longer stored."""
        self._writes.forget_session(session_id)

    # --- checking (``_integrity``) ---

    def interrupt(self) -> None:
        """Cut the statement running now, from any thread (see :meth:`Integrity.interrupt`)."""
        self._integrity.interrupt()

    def interruptible(self, on: bool) -> None:
        """Arm or disarm :meth:`interrupt` for a maintenance job's statements."""
        self._integrity.interruptible(on)

    def integrity_problems(self) -> list[str] | None:
        """SQLite's full ``integrity_check``: the problems it lists, ``None`` if it was cut."""
        return self._integrity.integrity_problems()

    def damaged_rows(self, table: str, after: int, limit: int) -> tuple[list[DamagedRow], int]:
        """The damaged rows among ``table``'s next ``limit`` after rowid ``after``, and the
        last rowid read."""
        return self._integrity.damaged_rows(table, after, limit)

    def row_session(self, table: str, rowid: int) -> str | None:
        """The session a row belongs to, as the row says."""
        return self._integrity.row_session(table, rowid)

    # --- reading (``_reads``) ---

    def get_session(self, session_id: str) -> SessionRow | None:
        return self._reads.get_session(session_id)

    def list_sessions(self) -> list[SessionRow]:
        return self._reads.list_sessions()

    def sessions_before(self, before: tuple[int, str] | None, limit: int,
                        workspace: str | None = None,
                        skip: Collection[str] = ()) -> list[SessionRow]:
        """Up to ``limit`` sessions not closed, newest created first, below ``before``."""
        return self._reads.sessions_before(before, limit, workspace, skip)

    def get_prompt(self, session_id: str, prompt_id: str) -> PromptRow | None:
        return self._reads.get_prompt(session_id, prompt_id)

    def find_keyed_prompt(self, session_id: str, key: str) -> KeyedPromptRow | None:
        """The prompt of the session admitted with idempotency key ``key``, or ``None``."""
        return self._reads.find_keyed_prompt(session_id, key)

    def in_flight_prompts(self, session_id: str) -> list[str]:
        """Prompts admitted and never ended, in admission order (every ledger row checked)."""
        return self._reads.in_flight_prompts(session_id)

    def prompt_terminals(self, session_id: str, limit: int = 64) -> list[PromptTerminal]:
        """The last ``limit`` ledger terminals, oldest first, as load answers carry them."""
        return self._reads.prompt_terminals(session_id, limit)

    def raw_events(self, session_id: str) -> list[bytes]:
        """The unfinished turn's durable events, in publish order."""
        return self._reads.raw_events(session_id)

    def records_forward(self, session_id: str, after_seq: int, limit: int
                        ) -> tuple[list[bytes], int]:
        """Up to ``limit`` records after ``after_seq``, oldest first, and where to go on."""
        return self._reads.records_forward(session_id, after_seq, limit)

    def max_raw_event_id(self, session_id: str) -> int:
        """Highest event id among the unfinished turn's raw events (0 if none)."""
        return self._reads.max_raw_event_id(session_id)

    def record_count(self, session_id: str) -> int:
        return self._reads.record_count(session_id)

    def newest_record_id(self, session_id: str) -> str | None:
        return self._reads.newest_record_id(session_id)

    def oldest_record_id(self, session_id: str) -> str | None:
        return self._reads.oldest_record_id(session_id)

    def records_by_id(self, session_id: str, record_ids: Sequence[str]) -> list[bytes] | None:
        """The stored events of ``record_ids``, in that order; None if any is not stored."""
        return self._reads.records_by_id(session_id, record_ids)

    def page(self, session_id: str, *, limit: int, cursor: str | None = None,
             before_record_id: str | None = None) -> StoredPage:
        """A page of the transcript, going back in time (see :meth:`TranscriptReads.page`)."""
        return self._reads.page(session_id, limit=limit, cursor=cursor,
                                before_record_id=before_record_id)

    def newest_turns(self, session_id: str, max_bytes: int
                     ) -> tuple[list[list[tuple[str, bytes]]], int, int]:
        """The newest whole turns that fit ``max_bytes`` and the older records and turns
        left out (seeding the replay window on restore)."""
        return self._reads.newest_turns(session_id, max_bytes)

    def newest_records(self, session_id: str, max_bytes: int
                       ) -> tuple[list[tuple[str, bytes]], int, int]:
        """:meth:`newest_turns` flattened."""
        return self._reads.newest_records(session_id, max_bytes)
