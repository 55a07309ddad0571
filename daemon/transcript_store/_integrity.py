"""The transcript file's checks: SQLite's bounded ``quick_check`` when a file is opened, the
full ``integrity_check`` and the row checksums a background job walks, and the cut that lets
such a job give the connection back at once.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

from ._errors import DamagedRow, TranscriptDamagedError, is_corruption, is_interrupt
from ._schema import CHECKED_TABLES, checked

__all__ = ["MAX_PROBLEMS", "CheckStep", "Integrity", "quick_check"]

# Most problems a check lists (SQLite stops looking after this many).
MAX_PROBLEMS: Final = 100

#: Called before and at every step of the opening ``quick_check`` (see ``StoreHooks.check_step``) with the
#: event that is set once the check's budget has run out and its cut was made.
CheckStep = Callable[[threading.Event], None]


def _problems(rows: Sequence[Sequence[Any]]) -> list[str]:
    """What an ``integrity_check`` or ``quick_check`` answered, one problem per line (none
    when it says ``ok``), without the ``*** in database main ***`` headings."""
    lines = [line.strip() for row in rows for line in str(row[0]).splitlines()]
    return [line for line in lines if line and line != "ok" and not line.startswith("*** ")]


def quick_check(conn: sqlite3.Connection, path: str, budget_s: float,
                step: CheckStep | None = None) -> Literal["ok", "incomplete"]:
    """SQLite's ``quick_check`` (every page and b-tree, not the indexes' content against
    their tables), cut after ``budget_s`` seconds (``incomplete``). ``sqlite3_interrupt`` is
    what stops it: the check is one step of SQLite's program, which a progress handler cannot
    cut. A damaged file raises :class:`TranscriptDamagedError`.

    SQLite forgets an interrupt made while none of the connection's statements runs (the next
    one clears it as it starts), so a budget that ran out just before the check began would be
    lost and the check would run unbounded. A progress handler therefore also ends the check
    at its first step once the budget is spent; and the timer's thread is joined before
    anything else runs on the connection, so its interrupt cannot reach a later statement."""
    spent = threading.Event()

    def cut() -> None:
        spent.set()
        conn.interrupt()

    def progress() -> bool:
        if step is not None:
            step(spent)
        return spent.is_set()  # true: SQLite ends the statement ("interrupted")

    timer = threading.Timer(budget_s, cut)
    timer.daemon = True
    conn.set_progress_handler(progress, 1)  # the check is a few steps; the work is one of them
    timer.start()
    try:
        if step is not None:
            step(spent)  # before the statement starts: a cut made now must not be lost
        rows = conn.execute(f"PRAGMA quick_check({MAX_PROBLEMS})").fetchall()
    except sqlite3.DatabaseError as exc:
        if is_interrupt(exc):
            return "incomplete"
        if not is_corruption(exc):
            raise
        raise TranscriptDamagedError(
            f"transcript database {path!r} is damaged: quick_check stopped at it "
            f"({exc}); refusing to open it (the file was not modified)") from exc
    finally:
        timer.cancel()
        timer.join()  # a cut already under way ends before the connection is used again
        conn.set_progress_handler(None, 0)
    problems = _problems(rows)
    if problems:
        raise TranscriptDamagedError(
            f"transcript database {path!r} is damaged: quick_check found "
            f"{len(problems)}{'+' if len(problems) >= MAX_PROBLEMS else ''} problem(s), "
            f"the first: {problems[0]}; refusing to open it (the file was not modified)")
    return "ok"


class Integrity:
    """The checks a background job runs on the open file, and the cut that ends one early."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._cut = False  # a cut asked of the running interruptible job (see interrupt)

    def interrupt(self) -> None:
        """Cut the statement running now (from any thread): it raises ``interrupted``. Inside
        an :meth:`interruptible` job the cut also reaches a statement that has not started yet
        (SQLite's own interrupt is lost when no statement is running at that moment)."""
        self._cut = True
        self._conn.interrupt()

    def interruptible(self, on: bool) -> None:
        """Arm (``on``) or disarm :meth:`interrupt` for a maintenance job's statements: a
        progress check every 1,000 SQLite steps ends the statement once a cut was asked."""
        self._cut = False
        self._conn.set_progress_handler((lambda: self._cut) if on else None, 1000)

    def integrity_problems(self) -> list[str] | None:
        """SQLite's full ``integrity_check`` (pages, b-trees, and every index against its
        table): the problems it lists (at most ``MAX_PROBLEMS``; none when the file is whole),
        or ``None`` if it was cut by :meth:`interrupt`."""
        try:
            rows = self._conn.execute(f"PRAGMA integrity_check({MAX_PROBLEMS})").fetchall()
        except sqlite3.OperationalError as exc:
            if is_interrupt(exc):
                return None
            raise
        return _problems(rows)

    def damaged_rows(self, table: str, after: int, limit: int) -> tuple[list[DamagedRow], int]:
        """Check the checksums of ``table``'s next ``limit`` rows after rowid ``after``: the
        damaged ones and the last rowid read (``after`` itself when there were none: the
        table is done)."""
        columns = CHECKED_TABLES[table]
        rows = self._conn.execute(
            f"SELECT rowid, {columns}, crc FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT ?",
            (after, limit)).fetchall()
        damaged = []
        for row in rows:
            try:
                checked(row, table, None)
            except DamagedRow as exc:
                damaged.append(exc)
        return damaged, (rows[-1][0] if rows else after)

    def row_session(self, table: str, rowid: int) -> str | None:
        """The session a row belongs to, as the row says (to place a problem ``integrity_check``
        names by rowid)."""
        if table not in CHECKED_TABLES:
            return None
        row = self._conn.execute(f"SELECT session_id FROM {table} WHERE rowid = ?",
                                 (rowid,)).fetchone()
        return row[0] if row is not None and isinstance(row[0], str) else None
