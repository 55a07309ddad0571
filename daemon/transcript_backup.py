"""A consistent copy of the transcript database, with SQLite's online backup API.

Synchronous (sqlite3 and one thread); the Trio shell is :mod:`daemon.backup`.

While the daemon runs, its connection holds the file with an exclusive lock (see
``daemon.transcript_store._file``), so no other connection, in this process or another, can read it:
the copy is made from that connection. :class:`SteppedBackup` runs ``Connection.backup`` in a
thread of its own, which copies ``pages`` pages and then waits in the progress callback until it
is told to take the next step. Each step is taken while the caller holds the writer's connection
(:meth:`TranscriptWriter.maintain`), so the writer's commits run between two steps, never
during one. SQLite keeps the copy whole across them: a page the same connection changes after
the backup copied it is written to the copy as well, so the finished copy is the database as it
stands after the last step (every commit before it included).

A turn streaming meanwhile grows the file between two steps; were a step a fixed number of
pages, a stream that adds more pages per commit than a step copies would keep the copy from
ever finishing (seen: a 2,000,000-chunk turn ran to its end before the backup did). So one
turn of the connection copies ``pages`` pages plus twice what the file grew since the previous
turn: with no writes that is one step, and under any stream the pages left shrink each turn.

With the daemon stopped, :func:`backup_file` copies the file directly (the caller holds the data
directory's lock).
"""

from __future__ import annotations

import os
import queue
import sqlite3
import threading
from pathlib import Path
from typing import Final, Literal

from .transcript_store import TranscriptDatabase

__all__ = ["STEP_PAGES", "BackupStopped", "SteppedBackup", "backup_file", "check_copy"]

#: Pages one step copies (64 KiB pages: 1 MiB): about a millisecond of the connection.
STEP_PAGES: Final = 16

_Message = tuple[Literal["step", "finished", "error"], BaseException | None]


class BackupStopped(Exception):
    """The backup was stopped before it finished (:meth:`SteppedBackup.stop`)."""


class SteppedBackup:
    """A backup of ``store`` into the new file ``dest``, one step per :meth:`step` call.

    Every call of :meth:`step` and :meth:`stop` must be made while the caller has the store's
    connection to itself (no other statement runs on it until the call returns). Between two
    calls the connection is free for the writer."""

    def __init__(self, store: TranscriptDatabase, dest: Path, *, pages: int = STEP_PAGES) -> None:
        self.store = store
        self.dest = dest
        self.pages = pages
        self.steps = 0
        self.remaining = -1  # pages left to copy after the last step (-1: none taken yet)
        self.total = -1
        self._turn_total = -1  # the file's pages when this turn of the connection began
        self._turn_copied = 0  # pages copied in this turn
        self._go: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[_Message] = queue.SimpleQueue()
        self._over = False
        self._thread = threading.Thread(target=self._run, name="transcript-backup", daemon=True)
        self._thread.start()

    @property
    def over(self) -> bool:
        """Finished, failed or stopped: the thread is gone or going."""
        return self._over

    def _run(self) -> None:
        if not self._go.get():
            self._done.put(("error", BackupStopped("stopped before the first step")))
            return
        try:
            target = sqlite3.connect(self.dest, isolation_level=None)
            try:
                self.store.connection.backup(target, pages=self.pages, progress=self._progress)
            finally:
                target.close()
        except BaseException as exc:  # handed to the caller of step()
            self._done.put(("error", exc))
            return
        self._done.put(("finished", None))

    def _progress(self, status: int, remaining: int, total: int) -> None:
        # Called after each step, in this thread: report it, then wait for the next turn
        # (the backup's finish also touches the source connection, so it waits too).
        self.steps += 1
        if self._turn_total < 0:
            self._turn_total = self.total if self.total >= 0 else total
        self.remaining, self.total = remaining, total
        self._turn_copied += self.pages
        if remaining > 0 and self._turn_copied < self.pages + 2 * (total - self._turn_total):
            return  # the file grew since the last turn: copy on until that much is caught up
        self._done.put(("step", None))
        if not self._go.get():
            raise BackupStopped("stopped")
        self._turn_total, self._turn_copied = -1, 0

    def step(self, _store: TranscriptDatabase | None = None) -> bool:
        """Take the next step; ``True`` once the copy is complete. Raises what the backup
        raised (a full disk, a file that cannot be written)."""
        if self._over:
            raise RuntimeError("the backup is over")
        self._go.put(True)
        kind, error = self._done.get()
        if kind == "step":
            return False
        self._over = True
        self._thread.join()
        if error is not None:
            raise error
        return True

    def stop(self, _store: TranscriptDatabase | None = None) -> None:
        """Abandon the backup (the copy is left incomplete: the caller removes it)."""
        if self._over:
            return
        self._over = True
        self._go.put(False)
        self._done.get()
        self._thread.join()


def check_copy(path: Path) -> list[str]:
    """SQLite's ``quick_check`` of a finished copy: its problems (none: it is whole)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")  # no -shm file beside it
        rows = conn.execute("PRAGMA quick_check(10)").fetchall()
    finally:
        conn.close()
    return [str(row[0]) for row in rows if row[0] != "ok"]


def backup_file(source: Path, dest: Path, *, pages: int = STEP_PAGES) -> None:
    """Copy the transcript ``source`` of a stopped daemon into the new file ``dest`` (which
    must not exist). The source is opened the way the daemon opens it (exclusive locking, no
    ``-shm`` file) and only read; a write-ahead log left by a daemon that died is part of what
    is copied, and SQLite checkpoints it into the source when the connection closes, as the
    daemon's next start would."""
    if not source.exists():
        raise FileNotFoundError(f"no transcript at {source}")
    conn = sqlite3.connect(source, isolation_level=None)
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        conn.execute("PRAGMA query_only=1")
        target = sqlite3.connect(dest, isolation_level=None)
        try:
            conn.backup(target, pages=pages)
        finally:
            target.close()
    finally:
        conn.close()
    with open(dest, "rb") as handle:
        os.fsync(handle.fileno())
