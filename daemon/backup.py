"""``POST /daemon/backup`` in the running daemon: a consistent copy of the transcript taken a
bounded step at a time between the writer's commits, then streamed to the client.

Trio shell over :mod:`daemon.transcript_backup`. The copy is made into a file of the data
directory (the running daemon's lock keeps every other process from reading the transcript,
so the copy cannot be made from outside), checked with SQLite's ``quick_check``, opened and
unlinked, and its bytes are sent from the open file: nothing is left behind however the
response ends. The client (``turnkeeper-daemon backup DEST``) writes them to DEST.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Final

import trio

from .transcript_backup import SteppedBackup, check_copy
from .transcript_writer import TranscriptWriter

__all__ = ["BackupFailed", "file_body", "take_backup"]

log = logging.getLogger("daemon.backup")

#: Bytes read from the copy per chunk of the response.
CHUNK_BYTES: Final = 1 << 20


class BackupFailed(Exception):
    """The copy could not be made (the file system refused it, or it is not whole)."""


async def take_backup(writer: TranscriptWriter, data_dir: Path) -> tuple[IO[bytes], int]:
    """Copy the transcript; the copy, open for reading (its file already unlinked), and its
    size. Each step holds the writer's connection for one step of ``STEP_PAGES`` pages; the
    writer commits between steps. A cancellation stops the backup and removes the copy."""
    dest = data_dir / f".backup-{uuid.uuid4().hex}.sqlite3"
    started = time.monotonic()
    commits = writer.batches_committed
    backup = SteppedBackup(writer.store, dest)
    try:
        try:
            while not await writer.maintain(backup.step):
                await trio.lowlevel.checkpoint()  # the commits waiting for the connection go
        except BaseException:
            with trio.CancelScope(shield=True):
                await writer.maintain(backup.stop)
            raise
        problems = await trio.to_thread.run_sync(check_copy, dest)
        if problems:
            raise BackupFailed(f"the copy failed SQLite's quick_check: {problems[0]}")
        handle = open(dest, "rb")  # closed by file_body
        size = os.fstat(handle.fileno()).st_size
    except OSError as exc:
        raise BackupFailed(f"could not write the copy in {data_dir}: {exc}") from exc
    except Exception as exc:
        if isinstance(exc, BackupFailed):
            raise
        raise BackupFailed(f"{type(exc).__name__}: {exc}") from exc
    finally:
        for leftover in (dest, Path(f"{dest}-journal")):
            try:
                os.unlink(leftover)  # the open handle keeps the copy's bytes until closed
            except FileNotFoundError:
                pass
    log.info("event=backup_taken bytes=%d steps=%d commits_between=%d seconds=%.3f", size,
             backup.steps, writer.batches_committed - commits, time.monotonic() - started)
    return handle, size


async def file_body(handle: IO[bytes]) -> AsyncIterator[bytes]:
    """The bytes of ``handle`` a chunk at a time, read in a worker thread; closes it."""
    try:
        while True:
            chunk = await trio.to_thread.run_sync(handle.read, CHUNK_BYTES)
            if not chunk:
                return
            yield chunk
    finally:
        handle.close()
