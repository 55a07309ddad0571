"""The full check of the transcript file, run in the background once the daemon serves.

The start-up check is SQLite's ``quick_check``, bounded in time (see
:class:`~daemon.transcript_store.TranscriptDatabase`): it sees every page and b-tree but not
whether each index agrees with its table, nor whether a row's bytes are still the ones
written. This task does the rest while the daemon already answers:

1. SQLite's ``integrity_check`` (everything ``quick_check`` does, and every index entry
   against its table). It holds the one connection, so it yields: a commit or a read that
   needs the connection cuts it, and it starts again after a pause; the last attempt runs to
   its end whatever waits.
2. Every row's checksum, a few rows per turn on the connection, so commits pass in between.

What it finds is recorded on the writer (:meth:`TranscriptWriter.note_damage`): the sessions
whose rows it is in, or the whole file when a problem names no row. ``GET /daemon/status``
lists it, those sessions' status says ``transcriptDegraded``, and their transcript reads are
refused with a JSON 500 ``transcript_damaged`` instead of serving what may lack rows.
"""

from __future__ import annotations

import logging
import re
from functools import partial
from operator import methodcaller
from typing import Final

import trio

from .transcript_store import CHECKED_TABLES, INDEX_TABLES, TranscriptDatabase, is_corruption
from .transcript_writer import TranscriptWriter

__all__ = ["INTEGRITY_ATTEMPTS", "SCAN_ROWS", "check_transcript", "place_problem"]

log = logging.getLogger("daemon.transcript")

# Interruptible attempts at integrity_check before one that runs to its end.
INTEGRITY_ATTEMPTS: Final = 3
# Pause after a cut attempt (doubled each time).
RETRY_PAUSE_S: Final = 0.5
# Rows whose checksums one turn on the connection checks.
SCAN_ROWS: Final = 32

_ROW_IN_INDEX: Final = re.compile(r"\brow (\d+) missing from index (\w+)")


def place_problem(store: TranscriptDatabase, problem: str) -> str | None:
    """The session a problem ``integrity_check`` reported is in, when it names a row (``row N
    missing from index X``), else ``None`` (the whole file)."""
    found = _ROW_IN_INDEX.search(problem)
    if found is None:
        return None
    table = INDEX_TABLES.get(found.group(2))
    if table is None:
        return None
    return store.row_session(table, int(found.group(1)))


async def check_transcript(writer: TranscriptWriter, *,
                           retry_pause_s: float = RETRY_PAUSE_S) -> None:
    """Run the full check once (see the module docstring); ``writer.full_check`` follows it:
    ``running``, then ``ok`` or ``damaged``."""
    writer.full_check = "running"
    started = trio.current_time()
    try:
        await _integrity(writer, retry_pause_s)
        await _checksums(writer)
    except Exception as exc:  # a file too damaged to be read through is damage too
        what = f"SQLite: {exc}" if is_corruption(exc) else f"the check failed: {exc!r}"
        writer.note_damage(None, what)
    damaged = writer.store_damaged or bool(writer.damaged_sessions)
    writer.full_check = "damaged" if damaged else "ok"
    log.info("event=transcript_check_done result=%s damaged_sessions=%d whole_file=%s "
             "elapsed_ms=%d", writer.full_check, len(writer.damaged_sessions),
             writer.store_damaged, (trio.current_time() - started) * 1000)


async def _integrity(writer: TranscriptWriter, retry_pause_s: float) -> None:
    problems: list[str] | None = None
    for attempt in range(INTEGRITY_ATTEMPTS + 1):
        problems = await writer.maintain(methodcaller("integrity_problems"),
                                         interruptible=attempt < INTEGRITY_ATTEMPTS)
        if problems is not None:
            break
        log.info("event=transcript_check_yielded attempt=%d", attempt + 1)
        await trio.sleep(retry_pause_s * 2**attempt)
    for problem in problems or ():
        session_id = await writer.maintain(partial(place_problem, problem=problem))
        writer.note_damage(session_id, f"integrity_check: {problem}")


async def _checksums(writer: TranscriptWriter) -> None:
    for table in CHECKED_TABLES:
        after = -1
        while True:
            damaged, last = await writer.maintain(
                methodcaller("damaged_rows", table, after, SCAN_ROWS))
            for row in damaged:
                # A row whose session id is not a stored session's lost its place (its session
                # id may be the damaged value): the damage is then the whole file's.
                known = row.session_id is not None and await writer.maintain(
                    methodcaller("has_session", row.session_id))
                writer.note_damage(row.session_id if known else None, str(row))
            if last == after:
                break
            after = last
