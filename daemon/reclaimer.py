"""The Trio shell of :mod:`daemon.core.reclaim`: buses report the bytes they publish, one task
trims the C heap when the policy says it is due. One per daemon, in the root nursery, and the
daemon's only caller of :func:`daemon.malloc.trim`: what wants a trim at once (the end of
start-up, a spilled turn) asks it (:meth:`Reclaimer.trim_now`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from daemon import malloc
from daemon.core.reclaim import ReclaimPolicy

__all__ = ["Reclaimer"]

log = logging.getLogger(__name__)


class Reclaimer:
    """``note`` is what a bus calls on each flush with the bytes it published since the last
    one; ``run`` is the task that trims; ``trim_now`` trims at once."""

    def __init__(self, policy: ReclaimPolicy | None = None,
                 trim: Callable[[], bool] = malloc.trim) -> None:
        self.policy = policy if policy is not None else ReclaimPolicy()
        self._trim = trim
        self._due = trio.Event()
        # Called before each trim: what else holds memory it can drop when the daemon pauses
        # (the transcript writer's SQLite cache, see TranscriptWriter.release_memory).
        self.releasers: list[Callable[[], object]] = []
        self.trims = 0  # trims run so far
        self.released = 0  # of them, the ones that gave memory back

    def note(self, nbytes: int) -> None:
        if self.policy.note(nbytes, trio.current_time()):
            self._due.set()

    def trim_now(self, reason: str, *, quiet: bool = False) -> bool:
        """Trim now (``reason`` goes to the log line, unless ``quiet``): a lot of heap was
        freed in many pieces at once. True if memory went back to the OS. The count of
        published bytes starts again."""
        return self._trim_logged(reason, quiet=quiet)

    def _trim_logged(self, reason: str, *, quiet: bool = False,
                     now: float | None = None) -> bool:
        self.trims += 1
        for release in self.releasers:
            release()
        released = self._trim()
        if released:
            self.released += 1
        if not quiet:
            log.info("event=heap_trimmed reason=%s published_bytes=%d released=%s", reason,
                     self.policy.churn, released)
        self.policy.trimmed(now)
        return released

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        policy = self.policy
        while True:
            await self._due.wait()
            # Later notes push the time on (up to the policy's longest delay): sleep until it
            # stops moving.
            while (due := policy.due_at()) is not None and due > trio.current_time():
                await trio.sleep_until(due)
            self._trim_logged("churn", now=trio.current_time())
            self._due = trio.Event()
