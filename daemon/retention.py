"""Retention in the running daemon: closed sessions, and those ``--retain-days`` or
``--retain-bytes`` let go, removed from the transcript a bounded step at a time, then the space
given back. Trio shell over :mod:`daemon.core.retention` (which sessions) and
:mod:`daemon.transcript_retention` (the SQL).

One task. A pass runs every ``interval_s`` (a minute), and at once when ``DELETE
/session/{id}`` closes a session (:meth:`Retention.wake`). Each step (a few hundred rows, or a
few MiB of pages) is one short transaction on the writer's connection between its commits,
interruptible: a commit that wants the connection cuts the step, which rolls back and is taken
again after it (:meth:`TranscriptWriter.maintain`). A live turn therefore never waits on more
than the start of a step, and never on a whole session's deletion.

A session not yet closed is first closed for good under the manager's restore lock
(:meth:`SessionManager.retire`), so it cannot be restored half-deleted; one loaded meanwhile is
left alone. A live session is never removed.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Final, TypeVar

import msgspec
import trio

from .core.retention import RetentionPolicy, by_bytes_order, expired
from .transcript_retention import (
    delete_step,
    free_pages,
    stored_sessions,
    used_bytes,
    vacuum_step,
    wipe_done,
    wipe_step,
)
from .transcript_store import TranscriptDatabase
from .transcript_writer import TranscriptWriter

if TYPE_CHECKING:
    from .manager import SessionManager

__all__ = ["DELETE_ROWS", "VACUUM_PAGES", "Retention", "RetentionStats"]

log = logging.getLogger("daemon.retention")

T = TypeVar("T")

#: Event rows one deletion step removes.
DELETE_ROWS: Final = 256
#: Pages one vacuum step gives back, or one wipe step overwrites (64 KiB pages: 4 MiB).
VACUUM_PAGES: Final = 64
DEFAULT_INTERVAL_S: Final = 60.0
# A step cut this many times in a row runs once without being cut (a daemon that commits
# without pause must still reclaim, a step is short).
MAX_CUTS: Final = 20


class RetentionStats(msgspec.Struct):
    passes: int = 0
    sessions_removed: int = 0
    steps: int = 0
    steps_cut: int = 0
    pages_returned: int = 0


class Retention:
    def __init__(self, writer: TranscriptWriter, manager: SessionManager,
                 policy: RetentionPolicy, *, interval_s: float = DEFAULT_INTERVAL_S,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.writer = writer
        self.manager = manager
        self.policy = policy
        self.interval_s = interval_s
        self.clock_ms = clock_ms
        self.stats = RetentionStats()
        self._wake = trio.Event()

    def wake(self) -> None:
        """Run a pass now (a session was closed for good)."""
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        while True:
            with trio.move_on_after(self.interval_s):
                await self._wake.wait()
            self._wake = trio.Event()
            if self.writer.store_damaged or self.writer.damaged_sessions:
                continue  # nothing is removed from a damaged transcript: --recover first
            try:
                await self.run_pass()
            except Exception as exc:  # the next pass tries again; the daemon serves on
                log.warning("event=retention_failed error_type=%s error=%r",
                            type(exc).__name__, str(exc))

    async def _step(self, fn: Callable[[TranscriptDatabase], T]) -> T:
        """``fn`` on the writer's connection, cut by any commit and taken again after it."""
        cuts = 0
        while True:
            self.stats.steps += 1
            try:
                return await self.writer.maintain(fn, interruptible=cuts < MAX_CUTS)
            except sqlite3.OperationalError as exc:
                if "interrupted" not in str(exc):
                    raise
            cuts += 1
            self.stats.steps_cut += 1
            await trio.lowlevel.checkpoint()

    async def run_pass(self) -> int:
        """One pass: remove what the policy lets go, then give the space back. Returns the
        sessions removed."""
        self.stats.passes += 1
        removed = 0
        await self.writer.wait_flushed()  # a close just submitted is seen
        sessions = await self._step(stored_sessions)
        closed = {s.session_id for s in sessions if s.closed}
        gone: set[str] = set()
        for session_id in expired(sessions, self.manager.sessions, self.policy,
                                  self.clock_ms()):
            gone.add(session_id)
            removed += await self._remove(session_id, closed=session_id in closed)
        if self.policy.retain_bytes is not None:
            for session_id in by_bytes_order(sessions, self.manager.sessions):
                if await self._step(used_bytes) <= self.policy.retain_bytes:
                    break
                if session_id not in gone:
                    gone.add(session_id)
                    removed += await self._remove(session_id, closed=session_id in closed)
        await self._vacuum()
        if removed:
            await self._wipe()
            await self._vacuum()  # the wipe's pages, free again (a file with auto_vacuum)
            log.info("event=retention_pass removed=%d used_bytes=%d", removed,
                     await self._step(used_bytes))
        return removed

    async def _remove(self, session_id: str, *, closed: bool) -> int:
        if not closed and not await self.manager.retire(session_id):
            return 0  # loaded meanwhile: live, kept
        if session_id in self.manager.sessions:
            return 0
        while not await self._step(partial(delete_step, session_id=session_id,
                                           rows=DELETE_ROWS)):
            pass
        self.stats.sessions_removed += 1
        log.info("event=session_removed session=%s reason=%s", session_id,
                 "closed" if closed else "retention")
        return 1

    async def _wipe(self) -> None:
        """Overwrite the free pages a removal left (see :mod:`daemon.transcript_retention`)."""
        previous: int | None = None
        while True:
            left = await self._step(partial(wipe_step, pages=VACUUM_PAGES))
            if left == 0 or left == previous:
                break
            previous = left
        await self._step(wipe_done)

    async def _vacuum(self) -> None:
        previous: int | None = await self._step(free_pages)
        while True:
            left = await self._step(partial(vacuum_step, pages=VACUUM_PAGES))
            if previous is not None:
                self.stats.pages_returned += max(0, previous - left)
            if left == 0 or left == previous:
                return
            previous = left
