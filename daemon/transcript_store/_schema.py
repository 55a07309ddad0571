"""The transcript's schema: its tables, each row's checksum, and how an older file becomes
the current version.

Every row carries ``crc``, the checksum of its values (:func:`daemon.core.checksum.row_crc`)
read by column name in the order :data:`CHECKED_TABLES` gives; :func:`checked` is the one place
a row read back is held to it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from daemon.core.checksum import row_crc
from daemon.core.transcript_rows import events_are_json

from ._errors import DamagedRow, TranscriptDamagedError, TranscriptSchemaError, unreadable

__all__ = ["CHECKED_TABLES", "INDEX_TABLES", "PROMPT_COLUMNS", "RAW_COLUMNS", "RECORD_COLUMNS",
           "SCHEMA_VERSION", "SESSION_COLUMNS", "check_version", "checked", "create_or_upgrade"]

# 2: raw_events rows may hold segments (see the package docstring). A version-1 file is
# upgraded in place when opened (its rows are all of the first form, which stays readable).
# 3: every row has its checksum (``crc``), and a prompt its idempotency key, request digest and
# 202 body. A version-1 or -2 file is upgraded in place when opened: the columns are added and
# every row's checksum computed, after its events were checked to be JSON (see ``_upgrade_to_3``).
SCHEMA_VERSION: Final = 3

_SCHEMA: Final = """
CREATE TABLE sessions (
    session_id       TEXT PRIMARY KEY,
    workspace_cwd    TEXT NOT NULL,
    created_at       INTEGER NOT NULL,
    agent_session_id TEXT,
    closed           INTEGER NOT NULL DEFAULT 0,
    crc              INTEGER
);
-- seq is the rowid: rows of a session are read back in seq order. It is not AUTOINCREMENT
-- because only the order among rows that exist matters, and plain rowids keep that order.
CREATE TABLE raw_events (
    seq        INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    event_id   INTEGER NOT NULL,
    prompt_id  TEXT,
    raw        BLOB NOT NULL,
    crc        INTEGER
);
CREATE INDEX raw_events_by_session ON raw_events (session_id, seq);
CREATE TABLE records (
    seq        INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    record_id  TEXT NOT NULL UNIQUE,
    turn       INTEGER NOT NULL,
    prompt_id  TEXT,
    raw        BLOB NOT NULL,
    crc        INTEGER
);
CREATE INDEX records_by_session ON records (session_id, seq);
CREATE INDEX records_by_turn ON records (session_id, turn);
CREATE TABLE prompts (
    session_id   TEXT NOT NULL,
    prompt_id    TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN
                     ('in_flight', 'completed', 'cancelled', 'error', 'interrupted')),
    stop_reason  TEXT,
    admitted_at  INTEGER,
    ended_at     INTEGER,
    terminal_seq INTEGER,
    idempotency_key   TEXT,
    request_digest    TEXT,
    accepted_event_id INTEGER,
    accepted_epoch    TEXT,
    crc          INTEGER,
    PRIMARY KEY (session_id, prompt_id)
);
CREATE INDEX prompts_by_terminal ON prompts (session_id, terminal_seq);
CREATE INDEX prompts_by_key ON prompts (session_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""
# What version 3 adds to a version-1 or -2 file (the columns above, in this order, at the end
# of their tables: the checksums read the values by name, never by position).
_UPGRADE_TO_3: Final = """
ALTER TABLE sessions ADD COLUMN crc INTEGER;
ALTER TABLE raw_events ADD COLUMN crc INTEGER;
ALTER TABLE records ADD COLUMN crc INTEGER;
ALTER TABLE prompts ADD COLUMN idempotency_key TEXT;
ALTER TABLE prompts ADD COLUMN request_digest TEXT;
ALTER TABLE prompts ADD COLUMN accepted_event_id INTEGER;
ALTER TABLE prompts ADD COLUMN accepted_epoch TEXT;
ALTER TABLE prompts ADD COLUMN crc INTEGER;
CREATE INDEX prompts_by_key ON prompts (session_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""

# GET /sessions' order (newest created first) over the sessions not closed, all and per
# workspace: a page is read from its cursor on, not sorted from every session. Made when a file
# is opened (any version: an index changes no row, and an older daemon keeps it up to date).
_LIST_INDEXES: Final = (
    "CREATE INDEX IF NOT EXISTS sessions_listed ON sessions (created_at, session_id) "
    "WHERE closed = 0",
    "CREATE INDEX IF NOT EXISTS sessions_listed_by_workspace "
    "ON sessions (workspace_cwd, created_at, session_id) WHERE closed = 0",
)

# Each table's columns in the order its checksum reads them.
SESSION_COLUMNS: Final = "session_id, workspace_cwd, created_at, agent_session_id, closed"
RAW_COLUMNS: Final = "session_id, event_id, prompt_id, raw"
RECORD_COLUMNS: Final = "session_id, record_id, turn, prompt_id, raw"
PROMPT_COLUMNS: Final = ("session_id, prompt_id, state, stop_reason, admitted_at, ended_at, "
                         "terminal_seq, idempotency_key, request_digest, accepted_event_id, "
                         "accepted_epoch")
#: The checksummed tables and their columns (the key is ``seq`` or the rowid).
CHECKED_TABLES: Final = {"sessions": SESSION_COLUMNS, "prompts": PROMPT_COLUMNS,
                         "records": RECORD_COLUMNS, "raw_events": RAW_COLUMNS}
# The table each index of the schema belongs to (to place a problem integrity_check names).
INDEX_TABLES: Final = {
    "raw_events_by_session": "raw_events", "records_by_session": "records",
    "records_by_turn": "records", "sqlite_autoindex_records_1": "records",
    "prompts_by_terminal": "prompts", "prompts_by_key": "prompts",
    "sqlite_autoindex_prompts_1": "prompts", "sqlite_autoindex_sessions_1": "sessions",
    "sessions_listed": "sessions", "sessions_listed_by_workspace": "sessions",
}


def checked(row: Sequence[Any], table: str, session_id: str | None = None) -> Sequence[Any]:
    """``row`` (key first, checksum last, the table's checksummed columns between) if its
    checksum matches, else :class:`DamagedRow`."""
    values = row[1:-1]
    crc = row[-1]
    if crc is None or crc != row_crc(*values):
        sid = values[0] if isinstance(values[0], str) and session_id is None else session_id
        raise DamagedRow(sid, table, int(row[0]) if isinstance(row[0], int) else -1,
                         "no checksum" if crc is None else "checksum mismatch")
    return row


def check_version(conn: sqlite3.Connection, path: str) -> None:
    """Refuse, before anything is written, a file that is not ours or is too new."""
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        raise unreadable(path, exc) from exc
    if version > SCHEMA_VERSION:
        raise TranscriptSchemaError(
            f"transcript database {path!r} has schema_version {version}, newer than "
            f"this daemon's {SCHEMA_VERSION}; refusing to open it (the file was not modified)"
        )
    if version == 0 and tables:
        raise TranscriptSchemaError(
            f"{path!r} is an SQLite database but not a turnkeeper transcript "
            "(schema_version 0 with existing tables); refusing to open it"
        )


def create_or_upgrade(conn: sqlite3.Connection, path: str) -> None:
    """Create the schema in an empty file, or bring an older one to :data:`SCHEMA_VERSION`,
    in one transaction (an upgrade that fails leaves the file as it was)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Re-read under the write lock: another opener may have created it meanwhile.
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
        elif version < 3:
            _upgrade_to_3(conn, path)
        for statement in _LIST_INDEXES:
            conn.execute(statement)
        if version < SCHEMA_VERSION:
            # Version 1 differs only in what a raw_events row may hold: from now on a
            # daemon that cannot read segments refuses the file instead of misreading it.
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _upgrade_to_3(conn: sqlite3.Connection, path: str) -> None:
    """Add the version-3 columns and give every existing row its checksum, in the caller's
    transaction. A row's checksum vouches for the bytes it is computed over, so the events
    are checked first: a raw_events row or record that is not JSON events is damage found
    now, and the whole upgrade is rolled back (the file stays as it was)."""
    for statement in _UPGRADE_TO_3.split(";"):
        if statement.strip():
            conn.execute(statement)
    bad: list[str] = []
    for table, columns in CHECKED_TABLES.items():
        last = -1
        while True:
            rows = conn.execute(
                f"SELECT rowid, {columns} FROM {table} WHERE rowid > ? ORDER BY rowid "
                "LIMIT 256", (last,)).fetchall()
            if not rows:
                break
            last = rows[-1][0]
            sums = []
            for row in rows:
                if table in ("raw_events", "records") and not events_are_json(
                        bytes(row[-1]), whole_row=table == "raw_events"):
                    bad.append(f"{table} row {row[0]} of session {row[1]} is not JSON")
                    continue
                sums.append((row_crc(*row[1:]), row[0]))
            conn.executemany(f"UPDATE {table} SET crc = ? WHERE rowid = ?", sums)
    if bad:
        raise TranscriptDamagedError(
            f"transcript database {path!r} is damaged: {len(bad)} row(s) hold bytes "
            f"that are not events, the first: {bad[0]}; refusing to upgrade it to schema "
            f"version {SCHEMA_VERSION} (the file was not modified)")
