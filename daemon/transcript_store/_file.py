"""Opening a transcript file: the checks before anything is written to it, a new file made
whole before it takes its name, and the connection's settings.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Final, Literal, NamedTuple

from ._errors import TranscriptDamagedError, TranscriptSchemaError, is_corruption, unreadable
from ._integrity import CheckStep, quick_check
from ._schema import check_version, create_or_upgrade

__all__ = ["CACHE_BUSY_KIB", "CACHE_KIB", "CACHE_SPILL_KIB", "PAGE_SIZE", "WAL_CHECKPOINT_BYTES",
           "OpenFile", "open_file", "release_memory"]

# A short wait rides out a brief lock taken by another opener before this connection holds
# its exclusive lock (see ``locking_mode`` in ``_connect``) instead of failing at once. It stays
# far below anything that would make the writer look hung.
_BUSY_TIMEOUT_MS: Final = 1000

# Page size of a newly created transcript file (see ``_configure``), the page cache, the dirty
# pages a transaction may hold before it writes some out early, and the WAL size at which a
# checkpoint runs.
PAGE_SIZE: Final = 64 * 1024
CACHE_KIB: Final = 512
CACHE_SPILL_KIB: Final = 2048
CACHE_BUSY_KIB: Final = CACHE_SPILL_KIB
WAL_CHECKPOINT_BYTES: Final = 4 * 1024 * 1024


class OpenFile(NamedTuple):
    """A transcript file, open and at the current schema version."""

    conn: sqlite3.Connection
    quick_check: Literal["ok", "incomplete", "off"]  # what it found; ``off``: not run
    session_ids: set[str]  # the sessions stored


def open_file(path: str, quick_check_s: float | None, check_step: CheckStep | None = None,
              connected: Callable[[sqlite3.Connection], None] | None = None) -> OpenFile:
    """Open the transcript at ``path`` (made if there is none): checked, set up and at the
    current schema version.

    An existing file is checked before anything is written to it: one that is empty or
    whose ``-wal`` is there without it, that is not SQLite, or (with ``quick_check_s``)
    that fails SQLite's ``quick_check`` raises :class:`TranscriptDamagedError`; one with a
    newer schema or someone else's tables :class:`TranscriptSchemaError`. The check is
    bounded: past ``quick_check_s`` seconds it is cut (``incomplete``; the full check then
    belongs to the caller). A new file is made under another name and renamed into place
    once its schema is committed, so a transcript file is never legitimately empty.
    ``connected`` is called with the connection before anything reads the file.
    """
    if path != ":memory:":
        _refuse_emptied(path)
        if not os.path.exists(path):
            _create_file(path)
    conn = _connect(path)
    checked: Literal["ok", "incomplete", "off"] = "off"
    try:
        if connected is not None:
            connected(conn)
        _small_cache_first(conn, path)
        check_version(conn, path)
        if quick_check_s is not None:
            checked = quick_check(conn, path, quick_check_s, check_step)
        _configure(conn)
        create_or_upgrade(conn, path)
        session_ids = {row[0] for row in conn.execute("SELECT session_id FROM sessions")}
    except sqlite3.DatabaseError as exc:
        conn.close()
        # A session id whose bytes are not UTF-8 any more is damage too (only ever written
        # as text; a flipped byte in it fails the decode before any checksum is read).
        if is_corruption(exc) or "Could not decode" in str(exc):
            raise TranscriptDamagedError(
                f"transcript database {path!r} is damaged ({exc})") from exc
        raise
    except BaseException:
        conn.close()
        raise
    return OpenFile(conn, checked, session_ids)


def release_memory(conn: sqlite3.Connection) -> None:
    """Give back the memory SQLite holds for the connection that it can drop (the page
    cache's clean pages, its spare buffers); what a later statement needs is read again
    from the file. For a pause in the work, never inside a transaction."""
    conn.execute("PRAGMA shrink_memory")


def _small_cache_first(conn: sqlite3.Connection, path: str) -> None:
    """The small page cache from the first page read on (``_configure`` sets it again):
    SQLite sizes the block it preallocates for the cache by the cache size in force at the
    first read, and keeps that block for the connection's life (at the default size and
    64 KiB pages, 1.3 MB of the idle daemon's RSS). Setting it reads the header, so a file
    that is not a database is refused here, as the schema check would refuse it."""
    try:
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    except sqlite3.DatabaseError as exc:
        raise unreadable(path, exc) from exc


def _connect(path: str) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT), so one
    # batch is exactly one transaction whatever the Python version's implicit-BEGIN rules.
    # cached_statements=0: every statement is prepared for its call and finalized when its
    # cursor goes. SQLite keeps a statement's bound values until they are bound again
    # (``sqlite3_reset`` does not clear them), so a cached INSERT held on to its last batch's
    # blobs: up to 16 rows of up to ROW_MAX_BYTES for each multi-row INSERT shape, held for
    # the connection's life. Preparing per call is cheap beside that: a batch of events is
    # one statement.
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


def _refuse_emptied(path: str) -> None:
    """An empty file, or a WAL without its database, is what is left of a transcript
    (truncated, or deleted under a running daemon), never a new one: SQLite would open
    either as an empty database and every session would be gone without a word."""
    wal = path + "-wal"
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        if os.path.exists(wal):
            raise TranscriptDamagedError(
                f"transcript database {path!r} is missing but its write-ahead log "
                f"{wal!r} is there (the database was deleted or moved); refusing to start "
                "a new one over it") from None
        return
    if size == 0:
        raise TranscriptDamagedError(
            f"transcript database {path!r} is empty (0 bytes): a transcript file is "
            "never empty, so it was truncated or replaced; refusing to treat it as a new "
            "store (the file was not modified)")


def _create_file(path: str) -> None:
    """Make a new transcript under a temporary name and move it into place once its schema
    is committed (a crash in between leaves only the temporary file, made again next
    time)."""
    temp = path + ".new"
    for leftover in (temp, temp + "-wal", temp + "-shm"):
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            pass
    conn = _connect(temp)
    try:
        # Before the file exists: pages freed by retention are then given back to the file
        # system a bounded step at a time (daemon.transcript_retention).
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        _configure(conn)
        create_or_upgrade(conn, path)
    finally:
        conn.close()  # checkpoints the WAL into the file and removes it
    os.rename(temp, path)


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
    # (writes are appends; reads are rare pages of history) and a WAL of about 4 MB. Small,
    # but as large as the dirty pages a transaction may hold (below): SQLite keeps a
    # transaction's dirty pages in the cache whatever its size, and once they fill it every
    # clean page is dropped as soon as it is used. A batch of events of many sessions (the
    # LLM-paced load: a few events each of dozens of sessions per commit) dirties a leaf of
    # the session index per session, and with an 8-page cache each row's insert then read
    # both trees' interior pages back from the file, two 64 KiB reads per row. The block
    # SQLite preallocates stays the small one (_small_cache_first); what the cache holds is
    # given back at the daemon's pauses (release_memory).
    conn.execute(f"PRAGMA cache_size=-{CACHE_BUSY_KIB}")
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
    # content that lives on in the turn's compacted records anyway (the writer thread's cost
    # is in benchmarks/README.md). A deleted session's bytes are all overwritten, free
    # pages included (``_writes``' ``_delete_session``): the one delete whose bytes nothing
    # else keeps.
    conn.execute("PRAGMA secure_delete=FAST")
