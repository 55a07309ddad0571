"""The durable transcript: schema and SQL over one SQLite file.

Synchronous and trio-free: :class:`~daemon.transcript_writer.TranscriptWriter` calls it from a
worker thread, one call at a time, on the one connection this object owns.

What is stored, per session:

- ``sessions``: the daemon session id, its workspace, creation time, the agent's ACP session id
  and whether the session was closed.
- ``raw_events``: every durable event published since the session's last turn boundary (the
  unfinished turn); a row holds one batch's run of a session's events (split into rows of at
  most ``ROW_MAX_BYTES``), and ``event_id`` is the row's last id. A row is either their
  envelopes as the bus encoded them, joined by newlines (it starts with ``{``: the only form
  schema version 1 wrote), or, when the batch has runs of spliced chunks
  (``AppendEvent.run``), a MessagePack array of segments ``[first_id, head, tail, joined]``:
  a run's template and its updates joined by newlines, or ``first_id`` 0 and envelopes joined
  by newlines. Either form reads back as the same envelopes, byte for byte. The row codec (and
  the page cursor) is the pure :mod:`daemon.core.transcript_rows`; this module runs the SQL.
- ``records``: the compacted, record-stamped events of completed turns, each with its
  ``record_id`` and its per-session ``turn`` number (so seeding can keep whole turns and count the
  turns it leaves out).
- ``prompts``: the prompt ledger, ``in_flight`` from admission until its terminal; a prompt sent
  with an ``Idempotency-Key`` also holds the key, its request's digest and its 202 body.

Every row carries ``crc``, the checksum of its values (:func:`daemon.core.checksum.row_crc`),
written with it and checked whenever it is read: a row whose bytes changed on disk raises
:class:`DamagedRow` instead of being served. Opening the file refuses one that is empty, not
SQLite, or fails SQLite's ``quick_check`` (:class:`TranscriptDamagedError`).

Writes arrive as a batch of :data:`Op` values applied in one transaction (:meth:`apply`); that is
what makes group commit atomic.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Collection, Sequence
from os import PathLike
from typing import Any, Final, Literal

import msgspec

from daemon.core.checksum import row_crc
from daemon.core.transcript_ops import (
    TERMINAL_STATES,
    AdmitPrompt,
    AppendEvent,
    DeleteSession,
    FinishTurn,
    KeyedPromptRow,
    MarkClosed,
    Op,
    PromptRow,
    RunTemplate,
    SessionRow,
    StoredPage,
    TerminalState,
    UpsertSession,
)
from daemon.core.transcript_rows import (
    InvalidCursor,
    RawRow,
    decode_cursor,
    encode_cursor,
    event_rows,
    events_are_json,
    op_runs,
    row_events,
)
from daemon.malloc import MMAP_THRESHOLD
from sdk.protocol.http import PromptTerminal

__all__ = [
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "AdmitPrompt",
    "AppendEvent",
    "DamagedRow",
    "DeleteSession",
    "FinishTurn",
    "InvalidCursor",
    "KeyedPromptRow",
    "MarkClosed",
    "Op",
    "PromptRow",
    "RunTemplate",
    "SessionRow",
    "StoredPage",
    "TerminalState",
    "TranscriptDamaged",
    "TranscriptDamagedError",
    "TranscriptDatabase",
    "TranscriptSchemaError",
    "UpsertSession",
    "events_are_json",
    "is_corruption",
]

# 2: raw_events rows may hold segments (see the module docstring). A version-1 file is
# upgraded in place when opened (its rows are all of the first form, which stays readable).
# 3: every row has its checksum (``crc``), and a prompt its idempotency key, request digest and
# 202 body. A version-1 or -2 file is upgraded in place when opened: the columns are added and
# every row's checksum computed, after its events were checked to be JSON (see ``_upgrade``).
SCHEMA_VERSION: Final = 3

# A short wait rides out a brief lock taken by another opener before this connection holds
# its exclusive lock (see ``locking_mode`` in ``__init__``) instead of failing at once. It stays
# far below anything that would make the writer look hung.
_BUSY_TIMEOUT_MS: Final = 1000


# Pages per row of the zeros that overwrite the free pages when a session is deleted.
_WIPE_ROW_PAGES: Final = 2048

# Page size of a newly created transcript file (see ``_configure``), the page cache, the dirty
# pages a transaction may hold before it writes some out early, and the WAL size at which a
# checkpoint runs.
PAGE_SIZE: Final = 64 * 1024
CACHE_KIB: Final = 512
CACHE_SPILL_KIB: Final = 2048
WAL_CHECKPOINT_BYTES: Final = 4 * 1024 * 1024
# Largest raw_events row a batch's events are joined into (a single bigger event gets a row of
# its own). Kept below the daemon's fixed malloc mmap threshold (``daemon.malloc``): a row is
# built twice, by the join and by SQLite's copy of the bound blob, and a block at or above the
# threshold is a fresh mmap each time, page-faulted in and unmapped again (``python -m
# benchmarks transcript_cost``; figures: benchmarks/README.md, "Figures behind the code").
# Statements are not cached (see ``__init__``), so each row is freed as soon as its INSERT is
# done.
ROW_MAX_BYTES: Final = MMAP_THRESHOLD - 64 * 1024

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
_SESSION_COLUMNS: Final = "session_id, workspace_cwd, created_at, agent_session_id, closed"
_RAW_COLUMNS: Final = "session_id, event_id, prompt_id, raw"
_RECORD_COLUMNS: Final = "session_id, record_id, turn, prompt_id, raw"
_PROMPT_COLUMNS: Final = ("session_id, prompt_id, state, stop_reason, admitted_at, ended_at, "
                          "terminal_seq, idempotency_key, request_digest, accepted_event_id, "
                          "accepted_epoch")
#: The checksummed tables and their columns (the key is ``seq`` or the rowid).
CHECKED_TABLES: Final = {"sessions": _SESSION_COLUMNS, "prompts": _PROMPT_COLUMNS,
                         "records": _RECORD_COLUMNS, "raw_events": _RAW_COLUMNS}
# SQLite's primary result codes for a damaged file and for an interrupted statement.
_SQLITE_CORRUPT: Final = 11
_SQLITE_NOTADB: Final = 26
_SQLITE_INTERRUPT: Final = 9
# Most problems a check lists (SQLite stops looking after this many).
MAX_PROBLEMS: Final = 100
# The table each index of the schema belongs to (to place a problem integrity_check names).
INDEX_TABLES: Final = {
    "raw_events_by_session": "raw_events", "records_by_session": "records",
    "records_by_turn": "records", "sqlite_autoindex_records_1": "records",
    "prompts_by_terminal": "prompts", "prompts_by_key": "prompts",
    "sqlite_autoindex_prompts_1": "prompts", "sqlite_autoindex_sessions_1": "sessions",
    "sessions_listed": "sessions", "sessions_listed_by_workspace": "sessions",
}

_SESSION_EXISTS: Final = "EXISTS (SELECT 1 FROM sessions WHERE session_id = ?)"
# Most raw_events rows one INSERT statement writes (4 bound values each; see _append_only).
_ONE_STATEMENT_ROWS: Final = 16
_INSERT_RAW: Final = (
    "INSERT INTO raw_events (session_id, event_id, prompt_id, raw, crc) VALUES (?, ?, ?, ?, ?)"
)
_RAW_VALUES: Final = ", (?, ?, ?, ?, ?)"


class TranscriptSchemaError(Exception):
    """The file is not a transcript database this daemon can use. It is left untouched."""


class TranscriptDamagedError(TranscriptSchemaError):
    """The file was a transcript and is damaged (empty, truncated, not SQLite any more, or
    failing ``quick_check``): what is readable can be recovered from it. Left untouched."""


class TranscriptDamaged(Exception):
    """What a read would return is damaged, so it is not returned. ``session_id`` names the
    session it belongs to, ``None`` when the damage is the file's (or its owner unknown)."""

    def __init__(self, session_id: str | None, message: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class DamagedRow(TranscriptDamaged):
    """A row read back is not what was written: its checksum does not match its values (or it
    has none). Raised instead of serving it."""

    def __init__(self, session_id: str | None, table: str, key: int, detail: str = "") -> None:
        where = f"session {session_id}" if session_id else "an unknown session"
        super().__init__(session_id, f"damaged {table} row {key} of {where}"
                         + (f": {detail}" if detail else ""))
        self.table = table
        self.key = key


def is_corruption(exc: BaseException) -> bool:
    """Is ``exc`` SQLite saying the file is damaged (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``)?"""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(exc, sqlite3.DatabaseError) and isinstance(code, int):
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    return False


def _problems(rows: Sequence[Sequence[Any]]) -> list[str]:
    """What an ``integrity_check`` or ``quick_check`` answered, one problem per line (none
    when it says ``ok``), without the ``*** in database main ***`` headings."""
    lines = [line.strip() for row in rows for line in str(row[0]).splitlines()]
    return [line for line in lines if line and line != "ok" and not line.startswith("*** ")]


def _checked(row: Sequence[Any], table: str, session_id: str | None = None) -> Sequence[Any]:
    """``row`` (key first, checksum last, the table's checksummed columns between) if its
    checksum matches, else :class:`DamagedRow`."""
    values = row[1:-1]
    crc = row[-1]
    if crc is None or crc != row_crc(*values):
        sid = values[0] if isinstance(values[0], str) and session_id is None else session_id
        raise DamagedRow(sid, table, int(row[0]) if isinstance(row[0], int) else -1,
                         "no checksum" if crc is None else "checksum mismatch")
    return row


class TranscriptDatabase:
    """One SQLite transcript database. Not thread-safe: one caller at a time (any thread)."""

    def __init__(self, path: str | PathLike[str], *, quick_check_s: float | None = None) -> None:
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
        self.quick_check: Literal["ok", "incomplete", "off"] = "off"
        if self.path != ":memory:":
            self._refuse_emptied()
            if not os.path.exists(self.path):
                self._create_file()
        conn = self._connect(self.path)
        try:
            self._check_schema(conn)
            if quick_check_s is not None:
                self.quick_check = self._quick_check(conn, quick_check_s)
            self._configure(conn)
            self._create_schema(conn)
            # The sessions stored, as committed: lets a batch of nothing but events (the usual
            # one) skip the existence checks in SQL. Only ``apply`` changes it, after a commit.
            self._stored: set[str] = {
                row[0] for row in conn.execute("SELECT session_id FROM sessions")
            }
        except sqlite3.DatabaseError as exc:
            conn.close()
            # A session id whose bytes are not UTF-8 any more is damage too (only ever written
            # as text; a flipped byte in it fails the decode before any checksum is read).
            if is_corruption(exc) or "Could not decode" in str(exc):
                raise TranscriptDamagedError(
                    f"transcript database {self.path!r} is damaged ({exc})") from exc
            raise
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._cut = False  # a cut asked of the running interruptible job (see interrupt)

    @staticmethod
    def _connect(path: str) -> sqlite3.Connection:
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT), so one
        # batch is exactly one transaction whatever the Python version's implicit-BEGIN rules.
        # cached_statements=0: every statement is prepared for its call and finalized when its
        # cursor goes. SQLite keeps a statement's bound values until they are bound again
        # (``sqlite3_reset`` does not clear them), so a cached INSERT held on to its last batch's
        # blobs: up to 16 rows of up to ROW_MAX_BYTES for each multi-row INSERT shape, over
        # 100 MB of RSS after a turn of large chunks. Preparing costs about 10 us a statement,
        # and a batch of events is one statement.
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                               cached_statements=0)
        try:
            # Before anything touches the file: with EXCLUSIVE locking set before the first
            # WAL access, SQLite keeps the WAL index in heap memory and never maps a "-shm"
            # file. A mapped -shm that someone truncates or that cannot get disk blocks kills
            # the process with SIGBUS (no exception, no log line); a heap index cannot fail
            # that way, so every disk fault stays an ordinary write error the writer degrades
            # on. The cost is that no other process can read the database while the daemon
            # has it open, which the daemon's own data-directory lock already implies.
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        except BaseException:
            conn.close()
            raise
        return conn

    # --- opening ---

    def _refuse_emptied(self) -> None:
        """An empty file, or a WAL without its database, is what is left of a transcript
        (truncated, or deleted under a running daemon), never a new one: SQLite would open
        either as an empty database and every session would be gone without a word."""
        wal = self.path + "-wal"
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            if os.path.exists(wal):
                raise TranscriptDamagedError(
                    f"transcript database {self.path!r} is missing but its write-ahead log "
                    f"{wal!r} is there (the database was deleted or moved); refusing to start "
                    "a new one over it") from None
            return
        if size == 0:
            raise TranscriptDamagedError(
                f"transcript database {self.path!r} is empty (0 bytes): a transcript file is "
                "never empty, so it was truncated or replaced; refusing to treat it as a new "
                "store (the file was not modified)")

    def _create_file(self) -> None:
        """Make a new transcript under a temporary name and move it into place once its schema
        is committed (a crash in between leaves only the temporary file, made again next
        time)."""
        temp = self.path + ".new"
        for leftover in (temp, temp + "-wal", temp + "-shm"):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass
        conn = self._connect(temp)
        try:
            # Before the file exists: pages freed by retention are then given back to the file
            # system a bounded step at a time (daemon.transcript_retention).
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            self._configure(conn)
            self._create_schema(conn)
        finally:
            conn.close()  # checkpoints the WAL into the file and removes it
        os.rename(temp, self.path)

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        """Refuse, before anything is written, a file that is not ours or is too new."""
        try:
            # The small page cache from the first page read on (``_configure`` sets it again):
            # SQLite sizes the block it preallocates for the cache by the cache size in force
            # at the first read, and keeps that block for the connection's life (at the
            # default size and 64 KiB pages, 1.3 MB of the idle daemon's RSS). Setting it
            # reads the header, so a file that is not a database is refused here.
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise TranscriptDamagedError(
                f"transcript database {self.path!r} is unreadable or corrupt ({exc}); "
                "refusing to open it (the file was not modified)"
            ) from exc
        if version > SCHEMA_VERSION:
            raise TranscriptSchemaError(
                f"transcript database {self.path!r} has schema_version {version}, newer than "
                f"this daemon's {SCHEMA_VERSION}; refusing to open it (the file was not modified)"
            )
        if version == 0 and tables:
            raise TranscriptSchemaError(
                f"{self.path!r} is an SQLite database but not a turnkeeper transcript "
                "(schema_version 0 with existing tables); refusing to open it"
            )

    def _quick_check(self, conn: sqlite3.Connection, budget_s: float) -> Literal["ok",
                                                                               "incomplete"]:
        """SQLite's ``quick_check`` (every page and b-tree, not the indexes' content against
        their tables), cut after ``budget_s`` seconds. ``sqlite3_interrupt`` is what stops
        it: the check is one step of SQLite's program, which a progress handler cannot cut."""
        timer = threading.Timer(budget_s, conn.interrupt)
        timer.daemon = True
        timer.start()
        try:
            rows = conn.execute(f"PRAGMA quick_check({MAX_PROBLEMS})").fetchall()
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF == _SQLITE_INTERRUPT:
                return "incomplete"
            if not is_corruption(exc):
                raise
            raise TranscriptDamagedError(
                f"transcript database {self.path!r} is damaged: quick_check stopped at it "
                f"({exc}); refusing to open it (the file was not modified)") from exc
        finally:
            timer.cancel()
        problems = _problems(rows)
        if problems:
            raise TranscriptDamagedError(
                f"transcript database {self.path!r} is damaged: quick_check found "
                f"{len(problems)}{'+' if len(problems) >= MAX_PROBLEMS else ''} problem(s), "
                f"the first: {problems[0]}; refusing to open it (the file was not modified)")
        return "ok"

    @staticmethod
    def _configure(conn: sqlite3.Connection) -> None:
        # Large pages for a new file (SQLite ignores this for an existing one, which keeps
        # its page size): a turn's raw events are appended as big blobs, and every page they
        # fill is one WAL frame written, later read back and written again by a checkpoint,
        # each a system call. At 4 KiB pages that was about one call per event; at 64 KiB the
        # same bytes take 1/16 of the calls (the writer thread's system time per 1,000 events
        # halved). Must come before the switch to WAL, which writes the file's header.
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise TranscriptSchemaError(f"could not switch the transcript to WAL mode ({mode})")
        # synchronous=NORMAL under WAL: COMMIT appends the batch to the -wal file with write()
        # before returning, so a committed batch survives a crash or SIGKILL of this process
        # (the OS holds the pages). Only an OS crash or power cut can drop the last commits,
        # and even then the database stays consistent. FULL would add an fsync per batch for
        # that last case; the durability promise is about the daemon process dying.
        conn.execute("PRAGMA synchronous=NORMAL")
        # The daemon's memory should track its journals, not the database: a small page cache
        # (writes are appends; reads are rare pages of history) and a WAL of about 4 MB.
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        # A transaction's dirty pages may outgrow that cache (8 pages of 64 KiB); SQLite then
        # writes some out early ("spills" them to the WAL mid-transaction), and a spilled page
        # the transaction changes again is written again. The turn boundary did that all the
        # time: deleting a turn's raw rows reads every overflow page, which pushed the
        # freelist trunk page (changed with every page freed) out of the cache over and over,
        # writing several times the commit's bytes. Up to CACHE_SPILL_KIB of dirty pages stay
        # in memory for the length of a transaction; a huge record (the compacted text of a
        # 300 MB turn) still spills beyond that (figures: benchmarks/README.md, "Figures
        # behind the code").
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        conn.execute(f"PRAGMA cache_spill={max(1, CACHE_SPILL_KIB * 1024 // page_size)}")
        # Checkpoint at about 4 MiB of WAL whatever the page size (the default, 1,000 pages,
        # is 64 MiB of WAL file at 64 KiB pages).
        conn.execute(f"PRAGMA wal_autocheckpoint={max(1, WAL_CHECKPOINT_BYTES // page_size)}")
        conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        # Deleted content: SQLite builds differ (Debian's is compiled with SECURE_DELETE on,
        # others off), so say it here. FAST zeroes what a delete frees inside b-tree pages but
        # leaves whole pages that go to the freelist as they are. A turn boundary frees every
        # overflow page of its raw events; with ON each of them was zeroed and written to the
        # WAL, then checkpointed into the file again: twice the turn's bytes written for
        # content that lives on in the turn's compacted records anyway, about 0.35 ms of the
        # writer thread per 1,000 events. A deleted session's bytes are all overwritten, free
        # pages included (``_delete_session``): the one delete whose bytes nothing else keeps.
        conn.execute("PRAGMA secure_delete=FAST")

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another opener may have created it meanwhile.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
            elif version < 3:
                self._upgrade_to_3(conn)
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

    def _upgrade_to_3(self, conn: sqlite3.Connection) -> None:
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
                f"transcript database {self.path!r} is damaged: {len(bad)} row(s) hold bytes "
                f"that are not events, the first: {bad[0]}; refusing to upgrade it to schema "
                f"version {SCHEMA_VERSION} (the file was not modified)")

    def close(self) -> None:
        self._conn.close()

    def release_memory(self) -> None:
        """Give back the memory SQLite holds for the connection that it can drop (the page
        cache's clean pages, its spare buffers); what a later statement needs is read again
        from the file. For a pause in the work, never inside a transaction."""
        self._conn.execute("PRAGMA shrink_memory")

    @property
    def schema_version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    # --- writing ---

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

    def _append_only(self, ops: Sequence[AppendEvent]) -> None:
        """A batch of nothing but events: no op in it creates or deletes a session, so the
        committed set of stored sessions decides which rows are written. Up to
        ``_ONE_STATEMENT_ROWS`` rows (a fast turn's batch is one to three) are one INSERT with
        that many VALUES tuples, its own transaction: one SQLite call instead of BEGIN, an
        INSERT per row and COMMIT, each of which the worker thread leaves and re-takes the GIL
        for, against the event loop. Outside an explicit transaction such a statement needs no
        statement journal: if it fails, the whole (implicit) transaction is rolled back."""
        stored = self._stored
        rows = [row for row in event_rows(ops, ROW_MAX_BYTES) if row[0] in stored]
        if not rows:
            return
        if len(rows) == 1:
            self._conn.execute(_INSERT_RAW, rows[0])
            return
        if len(rows) <= _ONE_STATEMENT_ROWS:
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
                f"INSERT INTO prompts ({_PROMPT_COLUMNS}, crc) "
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
            f"SELECT rowid, {_SESSION_COLUMNS}, crc FROM sessions WHERE session_id = ?",
            (session_id,)).fetchone()
        return None if row is None else _checked(row, "sessions", session_id)

    def _upsert_session(self, op: UpsertSession) -> None:
        row = self._session_values(op.session_id)
        if row is None:
            values = (op.session_id, op.workspace_cwd, op.created_at_ms, op.agent_session_id, 0)
            self._conn.execute(
                f"INSERT INTO sessions ({_SESSION_COLUMNS}, crc) VALUES (?, ?, ?, ?, ?, ?)",
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
        ``_configure``); whole pages freed, by this delete or by earlier turn boundaries (which
        may still hold this session's raw events), are overwritten with zeros by a row that
        takes every free page and is deleted again. That costs one write of the free pages
        per deleted session instead of one per turn."""
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
            f"INSERT INTO records ({_RECORD_COLUMNS}, crc) VALUES (?, ?, ?, ?, ?, ?)",
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
            f"SELECT rowid, {_PROMPT_COLUMNS}, crc FROM prompts "
            "WHERE session_id = ? AND prompt_id = ?", (sid, op.prompt_id)).fetchone()
        if row is not None and _checked(row, "prompts", sid)[3] != "in_flight":
            return
        terminal_seq = conn.execute(
            "SELECT coalesce(max(terminal_seq), 0) + 1 FROM prompts WHERE session_id = ?",
            (sid,)).fetchone()[0]
        if row is None:
            values = (sid, op.prompt_id, op.terminal, op.stop_reason, None, op.at_ms,
                      terminal_seq, None, None, None, None)
            conn.execute(f"INSERT INTO prompts ({_PROMPT_COLUMNS}, crc) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (*values, row_crc(*values)))
            return
        values = (sid, op.prompt_id, op.terminal, op.stop_reason, row[5], op.at_ms,
                  terminal_seq, *row[8:12])
        conn.execute("UPDATE prompts SET state = ?, stop_reason = ?, ended_at = ?, "
                     "terminal_seq = ?, crc = ? WHERE rowid = ?",
                     (op.terminal, op.stop_reason, op.at_ms, terminal_seq, row_crc(*values),
                      row[0]))

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

    # --- checking ---

    def forget_session(self, session_id: str) -> None:
        """The session's rows were deleted by retention's own SQL: it is no longer stored."""
        self._stored.discard(session_id)

    @property
    def connection(self) -> sqlite3.Connection:
        """The one connection, for the modules that run their own SQL on the transcript in
        the writer's thread (``daemon.transcript_retention``)."""
        return self._conn

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
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF == _SQLITE_INTERRUPT:
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
                _checked(row, table, None)
            except DamagedRow as exc:
                damaged.append(exc)
        return damaged, (rows[-1][0] if rows else after)

    def has_session(self, session_id: str) -> bool:
        """Is ``session_id`` a stored session (as committed)?"""
        return session_id in self._stored

    def row_session(self, table: str, rowid: int) -> str | None:
        """The session a row belongs to, as the row says (to place a problem ``integrity_check``
        names by rowid)."""
        if table not in CHECKED_TABLES:
            return None
        row = self._conn.execute(f"SELECT session_id FROM {table} WHERE rowid = ?",
                                 (rowid,)).fetchone()
        return row[0] if row is not None and isinstance(row[0], str) else None

    # --- reading: sessions and ledger ---

    def get_session(self, session_id: str) -> SessionRow | None:
        row = self._conn.execute(
            f"SELECT rowid, {_SESSION_COLUMNS}, crc FROM sessions WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        return _session_row(_checked(row, "sessions", session_id)) if row else None

    def list_sessions(self) -> list[SessionRow]:
        rows = self._conn.execute(
            f"SELECT rowid, {_SESSION_COLUMNS}, crc FROM sessions "
            "ORDER BY created_at, session_id"
        ).fetchall()
        return [_session_row(_checked(row, "sessions")) for row in rows]

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
            f"SELECT rowid, {_SESSION_COLUMNS}, crc FROM sessions WHERE {' AND '.join(where)} "
            "ORDER BY created_at DESC, session_id DESC" + ("" if skip else " LIMIT ?"),
            (*args,) if skip else (*args, limit))
        out: list[SessionRow] = []
        for row in rows:
            if len(out) >= limit:
                break
            if row[1] not in skip:
                out.append(_session_row(_checked(row, "sessions")))
        return out

    def _prompt_rows(self, session_id: str, where: str, args: Sequence[Any],
                     order: str = "rowid", limit: int = -1) -> list[Sequence[Any]]:
        """The session's ledger rows matching ``where`` (rowid, the checksummed columns,
        crc), each checked."""
        rows = self._conn.execute(
            f"SELECT rowid, {_PROMPT_COLUMNS}, crc FROM prompts WHERE session_id = ? "
            f"AND {where} ORDER BY {order} LIMIT ?", (session_id, *args, limit)).fetchall()
        return [_checked(row, "prompts", session_id) for row in rows]

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

    # --- reading: events ---

    def raw_events(self, session_id: str) -> list[bytes]:
        """The unfinished turn's durable events, in publish order."""
        rows = self._conn.execute(
            f"SELECT seq, {_RAW_COLUMNS}, crc FROM raw_events WHERE session_id = ? ORDER BY seq",
            (session_id,)
        ).fetchall()
        events: list[bytes] = []
        for row in rows:
            _checked(row, "raw_events", session_id)
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
            f"SELECT seq, {_RECORD_COLUMNS}, crc FROM records WHERE session_id = ? AND seq > ? "
            "ORDER BY seq LIMIT ?", (session_id, after_seq, limit)).fetchall()
        events = [bytes(_checked(row, "records", session_id)[5]) for row in rows]
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
                f"SELECT seq, {_RECORD_COLUMNS}, crc FROM records WHERE session_id = ? "
                f"AND record_id IN ({marks})",
                (session_id, *chunk),
            ):
                _checked(row, "records", session_id)
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
                f"SELECT seq, {_RECORD_COLUMNS}, crc FROM records WHERE session_id = ? "
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
                f"SELECT seq, {_RECORD_COLUMNS}, crc FROM records WHERE session_id = ? "
                "AND seq < ? ORDER BY seq DESC LIMIT ?",
                (session_id, found[0], limit + 1),
            ).fetchall()
        has_more = len(rows) > limit
        rows = rows[:limit]
        rows.reverse()
        events = [bytes(_checked(row, "records", session_id)[5]) for row in rows]
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
            f"SELECT seq, {_RECORD_COLUMNS}, crc FROM records WHERE session_id = ? "
            "AND turn >= ? ORDER BY seq",
            (session_id, keep_from),
        ):
            _checked(row, "records", session_id)
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



