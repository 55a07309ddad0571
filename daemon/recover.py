"""``--recover``: salvage a damaged transcript into a new one, keeping the damaged file.

Runs instead of the daemon (no Trio, no server), under the data directory's lock:

1. A copy of the transcript (with its write-ahead log) is checked the way the daemon checks it
   and more: ``quick_check``, ``integrity_check`` and every row's checksum. If all pass there is
   nothing to recover and nothing is changed.
2. Otherwise every row SQLite can still reach is read from the copy, table by table in rowid
   order; a stretch it cannot read (a damaged page, or a damaged interior page and everything
   below it) is stepped over and counted.
3. A row is kept only if it is what was written: its checksum matches (a file from before
   checksums: its events are JSON), and its session was kept. A raw event row must also not
   belong to a prompt whose kept ledger row shows it ended: the turn boundary that latches a
   terminal deletes the session's raw events in the same transaction, so such a row is one
   that was deleted. Its bytes can still be read when damage makes the table point into a
   page SQLite had freed (``secure_delete=FAST`` leaves freed pages as they were), and kept it
   would come back as a second copy of a finished turn. Everything else is dropped and
   counted, per session where the row still names one.
4. The kept rows go into a new transcript with their original keys (so the order of events is
   kept), which is then moved into place; the damaged file and its log are renamed
   ``transcript.sqlite3.damaged-<UTC time>`` and never deleted.

Until the last step the damaged file stays where it was: a recovery cut short leaves the data
directory as it found it (the daemon still refuses to start on it) and can simply be run again.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import msgspec

from .core.checksum import row_crc
from .core.transcript_rows import events_are_json, row_events
from .server import TRANSCRIPT_FILE, DaemonStartError, acquire_lock
from .transcript_store import (
    CHECKED_TABLES,
    TranscriptDamagedError,
    TranscriptDatabase,
    TranscriptSchemaError,
)

__all__ = ["RecoveryReport", "recover_transcript", "run_recovery", "salvage_rows"]

_WAL_SUFFIXES: Final = ("-wal", "-shm")
# Rows read per query while nothing fails; one at a time next to a damaged stretch.
_CHUNK: Final = 256
_LARGEST_ROWID: Final = 2**63 - 1
_EVENT_TABLES: Final = ("raw_events", "records")


class RecoveryRefused(Exception):
    """The file is not one to recover (newer schema, or not a transcript): left alone."""


@dataclass
class TableSalvage:
    """What could be read of one table: its rows (rowid first, then the columns by name) and
    how many stretches could not be read."""

    columns: list[str]
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    unreadable_stretches: int = 0
    unreadable_table: bool = False


@dataclass
class RecoveryReport:
    damaged_copy: Path | None = None
    problem: str = ""
    kept: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)  # "<table>: <why>"
    unreadable_stretches: int = 0
    unreadable_tables: list[str] = field(default_factory=list)
    sessions_with_losses: set[str] = field(default_factory=set)
    sessions_lost: set[str] = field(default_factory=set)  # their own row was not kept

    def lines(self) -> list[str]:
        kept = ", ".join(f"{self.kept[t]} {t}" for t in CHECKED_TABLES)
        out = [f"kept {kept}"]
        if self.dropped:
            out.append("dropped " + ", ".join(f"{n} {why}" for why, n in
                                              sorted(self.dropped.items())))
        if self.unreadable_stretches:
            out.append(f"{self.unreadable_stretches} unreadable stretch(es) of rows were "
                       "stepped over (their sessions cannot be told)")
        if self.unreadable_tables:
            out.append("unreadable tables: " + ", ".join(self.unreadable_tables))
        if self.sessions_lost:
            out.append(f"{len(self.sessions_lost)} session row(s) were damaged, so those "
                       "sessions are gone (their ids as the rows still say): "
                       + ", ".join(sorted(self.sessions_lost)))
        if self.sessions_with_losses:
            out.append(f"{len(self.sessions_with_losses)} session(s) lost rows and are served "
                       "with what is left: " + ", ".join(sorted(self.sessions_with_losses)))
        return out


def run_recovery(data_dir: Path, out: TextIO) -> int:
    """``--recover`` for ``data_dir``: print what happened to ``out``; the exit status."""
    if not (data_dir / TRANSCRIPT_FILE).exists() and \
            not (data_dir / (TRANSCRIPT_FILE + "-wal")).exists():
        print(f"recover: no transcript in {data_dir}: nothing to recover", file=out)
        return 0
    try:
        lock = acquire_lock(data_dir)
    except DaemonStartError as exc:
        print(f"recover: {exc}; stop it first", file=out)
        return 1
    try:
        report = recover_transcript(data_dir)
    except RecoveryRefused as exc:
        print(f"recover: {exc}", file=out)
        return 1
    finally:
        lock.close()
    db = data_dir / TRANSCRIPT_FILE
    if report is None:
        print(f"recover: {db} is whole (quick_check, integrity_check and every row's checksum "
              "pass): nothing to recover", file=out)
        return 0
    print(f"recover: {db} was damaged: {report.problem}", file=out)
    for line in report.lines():
        print(f"recover: {line}", file=out)
    print(f"recover: the damaged file is kept as {report.damaged_copy}; {db} is the new "
          "transcript", file=out)
    return 0


def recover_transcript(data_dir: Path) -> RecoveryReport | None:
    """Check and, if damaged, rebuild ``data_dir``'s transcript (see the module docstring);
    ``None`` when it is whole. The caller holds the data directory's lock."""
    db = data_dir / TRANSCRIPT_FILE
    scratch = Path(tempfile.mkdtemp(prefix="recover-", dir=data_dir))
    try:
        copy = scratch / "damaged.sqlite3"
        for suffix in ("", *_WAL_SUFFIXES):
            source = Path(f"{db}{suffix}")
            if source.exists():
                shutil.copyfile(source, f"{copy}{suffix}")
        if not copy.exists():  # a log without its database: there is nothing to read
            copy.write_bytes(b"")
        check = Path(shutil.copyfile(copy, scratch / "check.sqlite3"))
        problem = _damage(check, copy)
        if problem is None:
            return None
        report = RecoveryReport(problem=problem.replace(repr(str(check)), repr(str(db)))
                                .replace(str(check), str(db)))
        salvage = salvage_rows(copy)
        fresh = scratch / "recovered.sqlite3"
        _rebuild(fresh, salvage, report)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        damaged = data_dir / f"{TRANSCRIPT_FILE}.damaged-{stamp}"
        for suffix in ("", *_WAL_SUFFIXES):
            if Path(f"{db}{suffix}").exists():
                os.replace(f"{db}{suffix}", f"{damaged}{suffix}")
        os.replace(fresh, db)
        report.damaged_copy = damaged
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _damage(check: Path, original: Path) -> str | None:
    """The first damage found in ``check`` (a copy: opening may upgrade or checkpoint it),
    or ``None`` when it is whole. A file this daemon must not touch raises
    :class:`RecoveryRefused`."""
    wal = Path(f"{original}-wal")
    if wal.exists():
        shutil.copyfile(wal, f"{check}-wal")
    if check.stat().st_size == 0:
        return "the file is empty"
    try:
        store = TranscriptDatabase(check, quick_check_s=float(24 * 3600))
    except TranscriptDamagedError as exc:
        return str(exc)
    except TranscriptSchemaError as exc:
        raise RecoveryRefused(f"{exc}; not recovering it") from None
    except sqlite3.DatabaseError as exc:
        return f"SQLite: {exc}"
    try:
        problems = store.integrity_problems()
        if problems:
            return f"integrity_check: {problems[0]}"
        for table in CHECKED_TABLES:
            after = -1
            while True:
                damaged, last = store.damaged_rows(table, after, _CHUNK)
                if damaged:
                    return str(damaged[0])
                if last == after:
                    break
                after = last
    except sqlite3.DatabaseError as exc:
        return f"SQLite: {exc}"
    finally:
        store.close()
    return None


# --- reading what can be read -------------------------------------------------------------


def _pad_truncated(path: Path) -> None:
    """Give a truncated file back the length its header says it has, in zero pages: SQLite
    refuses a schema whose tables start past the end of the file, which would make even the
    tables still whole unreadable. A length far beyond the file's (a damaged header) is left."""
    with open(path, "r+b") as handle:
        header = handle.read(100)
        if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
            return
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        declared = int.from_bytes(header[28:32], "big") * page_size
        size = handle.seek(0, os.SEEK_END)
        if size < declared <= 4 * size + (1 << 20):
            handle.truncate(declared)


def salvage_rows(path: Path) -> dict[str, TableSalvage]:
    """Every row of the transcript tables SQLite can still read from ``path`` (a copy: SQLite
    may write to it), stepping over what it cannot."""
    _pad_truncated(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        out: dict[str, TableSalvage] = {}
        for table in CHECKED_TABLES:
            try:
                columns = [str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")]
            except sqlite3.DatabaseError:
                columns = []
            salvage = TableSalvage(columns)
            if not columns:
                salvage.unreadable_table = True
            else:
                for row in _readable_rows(conn, table, salvage):
                    salvage.rows.append(row)
            out[table] = salvage
        return out
    finally:
        conn.close()


def _readable_rows(conn: sqlite3.Connection, table: str,
                   salvage: TableSalvage) -> Iterator[tuple[Any, ...]]:
    """The rows of ``table`` in rowid order, each once; a stretch that cannot be read is
    stepped over (:func:`_next_readable`) and counted.

    Damage can leave a b-tree whose keys are out of order (a page pointing into a page of
    another part of the tree, or into a freed one): SQLite then answers ``rowid > p`` with
    rows at or below ``p``. Only rows above the last one kept are taken, so the read always
    moves forward; an answer with none is the end of what can be read in order (the rest is
    counted as an unreadable stretch), never the same rows read again without end."""
    position = -1  # read rows with rowid > position
    careful = False  # next to a damaged stretch: one row per query
    while True:
        try:
            rows = conn.execute(
                f"SELECT rowid, * FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (position, 1 if careful else _CHUNK)).fetchall()
        except sqlite3.DatabaseError:
            if not careful:
                careful = True  # read up to the damage row by row
                continue
            salvage.unreadable_stretches += 1
            found = _next_readable(conn, table, position)
            if found is None:
                return
            position, careful = found, False
            continue
        if not rows:
            return
        start = position
        for row in rows:
            if isinstance(row[0], int) and row[0] > position:
                position = row[0]
                yield tuple(row)
        if position == start:
            salvage.unreadable_stretches += 1
            return
        careful = False


def _next_readable(conn: sqlite3.Connection, table: str, position: int) -> int | None:
    """The least ``p > position`` from which ``rowid > p`` reads again, or ``None`` if
    nothing after ``position`` can be read: steps of growing size find a readable point, then
    halving narrows the damaged stretch down to it."""

    def readable(after: int) -> bool:
        try:
            conn.execute(f"SELECT rowid FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT 1",
                         (after,)).fetchall()
        except sqlite3.DatabaseError:
            return False
        return True

    step = 1
    bad = position
    while True:
        probe = min(position + step, _LARGEST_ROWID)
        if readable(probe):
            break
        bad = probe
        if probe == _LARGEST_ROWID:
            return None
        step *= 2
    good = probe
    while good - bad > 1:  # bad fails, good reads: narrow the boundary
        middle = (bad + good) // 2
        if readable(middle):
            good = middle
        else:
            bad = middle
    return good


# --- keeping what is intact ---------------------------------------------------------------


def _values(salvage: TableSalvage, row: Sequence[Any], names: Sequence[str]) -> list[Any]:
    """``row``'s values of the columns ``names`` (a column the file does not have: None)."""
    index = {name: i + 1 for i, name in enumerate(salvage.columns)}  # rowid is row[0]
    return [row[index[name]] if name in index else None for name in names]


def _intact(table: str, salvage: TableSalvage, row: Sequence[Any],
            names: Sequence[str]) -> tuple[list[Any], str | None]:
    """The row's checksummed values, and why it is not kept (``None``: it is)."""
    values = _values(salvage, row, names)
    if "crc" in salvage.columns:
        crc = _values(salvage, row, ["crc"])[0]
        try:
            matches = crc is not None and crc == row_crc(*values)
        except TypeError:  # a value of a type the store never writes
            matches = False
        if not matches:
            return values, "checksum"
        return values, None
    # A file from before checksums: nothing vouches for its bytes but their form.
    if table in _EVENT_TABLES:
        raw = values[-1]
        if not isinstance(raw, bytes) or not events_are_json(raw, whole_row=table == "raw_events"):
            return values, "not events"
    return values, None


class _PromptOf(msgspec.Struct, rename="camel"):
    prompt_id: str | None = None


_PROMPT_OF: Final = msgspec.json.Decoder(_PromptOf)


def _of_ended_prompt(values: Sequence[Any], ended: set[tuple[str, str]]) -> bool:
    """Does a raw_events row (its checksummed values) hold an event of a prompt whose ledger
    row shows it ended? The row's own prompt is its last event's; its events are read too,
    as a row may begin with another prompt's."""
    session_id, _, prompt_id, raw = values
    if (session_id, prompt_id) in ended:
        return True
    try:
        envelopes = row_events(bytes(raw))
    except (ValueError, TypeError):
        return False  # the checksum vouched for it: its form is the reader's to refuse
    for envelope in envelopes:
        try:
            of = _PROMPT_OF.decode(envelope).prompt_id
        except msgspec.DecodeError:
            continue
        if of is not None and (session_id, of) in ended:
            return True
    return False


def _rebuild(fresh: Path, salvage: dict[str, TableSalvage], report: RecoveryReport) -> None:
    """Write the intact rows of ``salvage`` into a new transcript at ``fresh``."""
    for table, part in salvage.items():
        report.unreadable_stretches += part.unreadable_stretches
        if part.unreadable_table:
            report.unreadable_tables.append(table)
    store = TranscriptDatabase(fresh)
    try:
        sessions: set[str] = set()
        ended: set[tuple[str, str]] = set()  # (session, prompt) the kept ledger shows ended
        for table, columns in CHECKED_TABLES.items():
            names = [name.strip() for name in columns.split(",")]
            part = salvage[table]
            keep: list[tuple[int, list[Any]]] = []
            for row in part.rows:
                values, why = _intact(table, part, row, names)
                session_id = values[0]
                if why is None and table != "sessions" and session_id not in sessions:
                    why = "orphaned"  # its session was not kept
                if why is None and table == "raw_events" and _of_ended_prompt(values, ended):
                    # Deleted at its turn's boundary, read back from a freed page: not a
                    # loss of the session's, a row that must not come back.
                    report.dropped[f"{table} (of an ended prompt)"] += 1
                    continue
                if why is not None:
                    report.dropped[f"{table} ({why})"] += 1
                    if table == "sessions" and isinstance(session_id, str):
                        report.sessions_lost.add(session_id)
                    elif isinstance(session_id, str) and session_id in sessions:
                        report.sessions_with_losses.add(session_id)
                    continue
                keep.append((int(row[0]), values))
            kept = store.insert_salvaged(table, keep)
            report.kept[table] = kept
            if kept < len(keep):
                report.dropped[f"{table} (duplicate)"] += len(keep) - kept
            if table == "sessions":
                sessions = {values[0] for _, values in keep}
            elif table == "prompts":
                ended = {(values[0], values[1]) for _, values in keep
                         if values[2] != "in_flight"}
    finally:
        store.close()
