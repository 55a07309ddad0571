"""Retention's SQL on the transcript: what is stored per session, a session removed a bounded
step at a time, and space given back a bounded step at a time. Synchronous (sqlite3), run in
the writer's worker thread between commits (:mod:`daemon.retention`) or by ``turnkeeper-daemon
prune`` with the daemon stopped.

Every step is one short transaction: at most ``rows`` rows deleted, or at most ``pages``
pages moved by SQLite's ``incremental_vacuum``. A step cut by :meth:`TranscriptDatabase.interrupt`
(a commit wanted the connection) rolls back whole and is simply taken again later.

Space: a transcript file made by this version uses ``auto_vacuum=INCREMENTAL``, so the pages a
deletion frees are given back to the file system by the vacuum steps (the file shrinks at the
next WAL checkpoint). An older file (``auto_vacuum`` off) reuses its free pages for new rows,
so it stops growing but does not shrink, until ``turnkeeper-daemon prune`` rewrites it.

Bytes: a removed session leaves none of its text in the file. Deleted cells are zeroed in the
pages that stay in use (``secure_delete=FAST``), but whole pages freed (a session's overflow
pages, and the pages its raw events were freed from at every turn boundary) keep what they
held. A file with ``auto_vacuum=INCREMENTAL`` gives those pages back; whatever free pages are
left after a pass that removed a session (all of them in an older file) are overwritten with
zeros, a bounded step at a time (:func:`wipe_step`).
"""

from __future__ import annotations

import sqlite3
from typing import Final

from .core.checksum import row_crc
from .core.retention import StoredSession
from .transcript_store import TranscriptDatabase

__all__ = ["AUTO_VACUUM_INCREMENTAL", "auto_vacuum", "delete_step", "free_pages",
           "stored_sessions", "used_bytes", "vacuum_step", "wipe_done", "wipe_step"]

#: ``PRAGMA auto_vacuum`` of a file whose freed pages the vacuum steps give back.
AUTO_VACUUM_INCREMENTAL: Final = 2

# Newest activity of a session: its creation, or its newest prompt's admission or end.
_SESSIONS: Final = """
SELECT s.session_id, s.closed,
       max(s.created_at, coalesce((SELECT max(max(coalesce(p.admitted_at, 0),
                                                  coalesce(p.ended_at, 0)))
                                   FROM prompts p WHERE p.session_id = s.session_id), 0))
FROM sessions s
"""


def stored_sessions(store: TranscriptDatabase) -> list[StoredSession]:
    return [StoredSession(str(row[0]), bool(row[1]), int(row[2]))
            for row in store.connection.execute(_SESSIONS)]


def _pragma(conn: sqlite3.Connection, name: str) -> int:
    return int(conn.execute(f"PRAGMA {name}").fetchone()[0])


def used_bytes(store: TranscriptDatabase) -> int:
    """Bytes the transcript's rows take in its file (its pages less the free ones)."""
    conn = store.connection
    return (_pragma(conn, "page_count") - _pragma(conn, "freelist_count")) \
        * _pragma(conn, "page_size")


def free_pages(store: TranscriptDatabase) -> int:
    return _pragma(store.connection, "freelist_count")


def auto_vacuum(store: TranscriptDatabase) -> int:
    return _pragma(store.connection, "auto_vacuum")


def delete_step(store: TranscriptDatabase, session_id: str, rows: int) -> bool:
    """Delete at most ``rows`` event rows of the session (its unfinished turn's first, then
    its records), or, when none is left, its prompts and the session itself; ``True`` once the
    session is gone. One transaction."""
    conn = store.connection
    conn.execute("BEGIN IMMEDIATE")
    try:
        done = True
        for table in ("raw_events", "records"):
            deleted = conn.execute(
                f"DELETE FROM {table} WHERE seq IN (SELECT seq FROM {table} "
                "WHERE session_id = ? ORDER BY seq LIMIT ?)", (session_id, rows)).rowcount
            if deleted:
                done = False
                break
        if done:
            conn.execute("DELETE FROM prompts WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
        conn.execute("COMMIT")
        if done:
            store.forget_session(session_id)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return done


def vacuum_step(store: TranscriptDatabase, pages: int) -> int:
    """Give at most ``pages`` free pages back (``incremental_vacuum``); returns the free pages
    left (0 when done, or when the file's auto_vacuum is off: its free pages are reused)."""
    conn = store.connection
    if _pragma(conn, "auto_vacuum") != AUTO_VACUUM_INCREMENTAL:
        return 0
    # Each run of the statement gives back one page (Python's sqlite3 steps a statement that
    # returns no rows once), so a step is that many runs in one transaction.
    conn.execute("BEGIN IMMEDIATE")
    try:
        for _ in range(min(pages, _pragma(conn, "freelist_count"))):
            conn.execute("PRAGMA incremental_vacuum")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return _pragma(conn, "freelist_count")


# The rows that hold free pages while they are overwritten: no session is named '' (no reader
# asks for it), and they carry their checksum, so a check that reads them meanwhile (or after
# a crash between two steps) finds nothing damaged; recovery drops them (no session owns them).
_FILLER: Final = ""


def wipe_step(store: TranscriptDatabase, pages: int) -> int:
    """Overwrite at most ``pages`` free pages with zeros: one row of zeros that takes them
    (SQLite gives a new row's pages from the free list first), committed. Returns the free
    pages left; :func:`wipe_done` removes the rows once none is."""
    conn = store.connection
    free = _pragma(conn, "freelist_count")
    if not free:
        return 0
    # An overflow page holds page_size - 4 bytes of a row.
    zeros = bytes(min(free, pages) * (_pragma(conn, "page_size") - 4))
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("INSERT INTO raw_events (session_id, event_id, prompt_id, raw, crc) "
                     "VALUES (?, 0, NULL, ?, ?)", (_FILLER, zeros, row_crc(_FILLER, 0, None,
                                                                             zeros)))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return _pragma(conn, "freelist_count")


def wipe_done(store: TranscriptDatabase) -> None:
    """Remove the rows :func:`wipe_step` wrote: their pages go back to the free list holding
    zeros."""
    conn = store.connection
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("DELETE FROM raw_events WHERE session_id = ?", (_FILLER,))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
