"""The transcript writer: a Trio task that group-commits transcript ops (SPEC §5).

The bus calls :meth:`TranscriptWriter.submit` on its publish path; that only appends to an
in-memory queue. One loop takes everything queued (up to ``max_batch``) and applies it to the
:class:`~daemon.transcript_store.TranscriptStore` in ONE transaction in a worker thread. While a
commit runs, new ops accumulate for the next one, so an op waits at most about two commit times
and there is never one thread hop per event.

A failing batch never stops the writer and never blocks ``submit``: the sessions it touched are
latched in ``failed_sessions``, ``on_failure`` is told, waiters get ``False``, and later batches
are committed as usual. Reads go through the same lock as writes: the store has one connection.
"""

from __future__ import annotations

import bisect
import logging
import sqlite3
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

import trio

from daemon.transcript_store import AppendEvent, DeleteSession, Op, TranscriptStore

__all__ = ["DEFAULT_MAX_BATCH", "TranscriptWriter"]

DEFAULT_MAX_BATCH = 5000
# Ops gather for at most this long after a commit starts (well inside the 100 ms window).
DEFAULT_COALESCE_S = 0.01

logger = logging.getLogger("daemon.transcript")

T = TypeVar("T")

FailureCallback = Callable[[set[str], BaseException], None]


class TranscriptWriter:
    """Group-commit writer over one :class:`TranscriptStore`.

    Sequence numbers start at 1 and grow by one per submitted op; batches are contiguous
    ranges of them, committed in order.
    """

    def __init__(
        self,
        store: TranscriptStore,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        on_failure: FailureCallback | None = None,
        coalesce_s: float = DEFAULT_COALESCE_S,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.store = store
        self.max_batch = max_batch
        self.on_failure = on_failure
        self.coalesce_s = coalesce_s
        self._waiters = 0
        self._urgent = trio.Event()
        self._last_commit_at = float("-inf")
        self.failed_sessions: set[str] = set()
        self.degraded = False
        self.last_error: str | None = None
        self.batches_committed = 0
        self.batches_failed = 0
        self._pending: deque[tuple[int, Op]] = deque()
        self._last_seq = 0
        self._resolved = 0  # every seq <= this is committed or failed
        self._failed: list[list[int]] = []  # sorted, disjoint [lo, hi] seq ranges that failed
        self._durable: dict[str, int] = {}
        self._reset_at: dict[str, int] = {}  # AppendEvents below this seq belong to an old bus
        self._db_lock = trio.Lock()
        self._wakeup = trio.Event()
        self._progress = trio.Event()
        self._running = False
        self._closing = False
        self._stopped = False
        self._loop_done = trio.Event()

    # --- submitting (publish path: sync, never blocks) ---

    @property
    def last_seq(self) -> int:
        """Sequence number of the newest submitted op (0 before the first)."""
        return self._last_seq

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def submit(self, op: Op) -> int:
        """Queue ``op`` for the next batch and return its sequence number.

        After the writer has stopped nothing can commit it any more: the op is recorded as
        failed at once (its session is latched failed, waiters get ``False``) instead of raising
        into the caller's publish path.
        """
        self._last_seq += 1
        seq = self._last_seq
        if self._stopped:
            self._fail([(seq, op)], RuntimeError("transcript writer is stopped; op not written"))
            return seq
        self._pending.append((seq, op))
        self._wakeup.set()
        return seq

    # --- waiting and reading ---

    async def wait_committed(self, seq: int) -> bool:
        """Wait until op ``seq`` is resolved: ``True`` if it was committed, ``False`` if the
        batch holding it failed."""
        if not 0 <= seq <= self._last_seq:
            raise ValueError(f"no op with sequence number {seq} was submitted")
        await self._wait_resolved(seq)
        return not self._is_failed(seq)

    async def wait_flushed(self) -> bool:
        """Wait until every op submitted so far is resolved; ``True`` if the newest one was
        committed (the prompt runner's "everything published is durable" wait)."""
        return await self.wait_committed(self._last_seq)

    async def read(self, fn: Callable[[TranscriptStore], T]) -> T:
        """Run ``fn(store)`` in a worker thread once every op submitted before this call is
        committed (or failed); serialized with the writes on the one connection."""
        await self._wait_resolved(self._last_seq)
        async with self._db_lock:
            return await trio.to_thread.run_sync(fn, self.store)

    async def _wait_resolved(self, seq: int) -> None:
        if self._resolved >= seq:
            return
        # Somebody is waiting on the disk: the loop stops coalescing until they are served.
        self._waiters += 1
        self._urgent.set()
        try:
            while self._resolved < seq:
                await self._progress.wait()
        finally:
            self._waiters -= 1

    def _is_failed(self, seq: int) -> bool:
        i = bisect.bisect_right(self._failed, seq, key=lambda r: r[0]) - 1
        return i >= 0 and self._failed[i][0] <= seq <= self._failed[i][1]

    # --- durable ids ---

    def durable_event_id(self, session_id: str) -> int:
        """Highest ``AppendEvent.event_id`` committed for the session on its current bus."""
        return self._durable.get(session_id, 0)

    def reset_durable(self, session_id: str) -> None:
        """The session got a new bus: its ids restart, so forget the old durable id (ops of the
        old bus still queued will not raise it again) and clear its failure latch, which SPEC
        §2.3 counts from the bus's creation."""
        self._durable.pop(session_id, None)
        self._reset_at[session_id] = self._last_seq + 1
        self.failed_sessions.discard(session_id)

    # --- the loop ---

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer loop; run it in a nursery the caller owns. Returns after :meth:`aclose`.
        If cancelled, it still commits what is queued (shielded) before it goes."""
        if self._running:
            raise RuntimeError("TranscriptWriter.run() is already running")
        if self._stopped:  # aclose() got here first and already flushed
            task_status.started()
            return
        self._running = True
        try:
            task_status.started()
            while True:
                if not self._pending:
                    if self._closing:
                        break
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
                    continue
                await self._coalesce()
                self._last_commit_at = trio.current_time()
                await self._commit_next()
        finally:
            with trio.CancelScope(shield=True):
                while self._pending:
                    await self._commit_next()
            self._stop()

    async def _coalesce(self) -> None:
        """Under a steady stream, let ops gather for up to ``coalesce_s`` since the last
        commit began, so a fast turn costs tens of transactions a second rather than one per
        scheduler tick; skipped when anyone waits on a commit or a read, or when closing."""
        if self.coalesce_s <= 0 or self._waiters or self._closing:
            return
        if len(self._pending) >= self.max_batch:
            return
        remaining = self._last_commit_at + self.coalesce_s - trio.current_time()
        if remaining <= 0:
            return
        self._urgent = trio.Event()
        with trio.move_on_after(remaining):
            await self._urgent.wait()

    async def aclose(self) -> None:
        """Commit everything queued, then stop the loop (or, if it never ran, commit here)."""
        self._closing = True
        self._wakeup.set()
        self._urgent.set()
        if self._running:
            await self._loop_done.wait()
            return
        while self._pending:
            await self._commit_next()
        self._stop()

    def _stop(self) -> None:
        self._running = False
        self._stopped = True
        if self._pending:  # only reachable if a final commit itself blew up
            batch = list(self._pending)
            self._pending.clear()
            self._fail(batch, RuntimeError("transcript writer stopped before committing"))
        self._loop_done.set()
        self._advance(self._resolved)

    async def _commit_next(self) -> None:
        async with self._db_lock:
            # Taken under the lock so that a cancellation while waiting for it loses nothing.
            count = min(len(self._pending), self.max_batch)
            batch = [self._pending.popleft() for _ in range(count)]
            if not batch:
                return
            ops = [op for _, op in batch]
            try:
                # Shielded: a batch taken off the queue is applied and accounted for, never
                # dropped half-way by a cancellation (the thread could not be stopped anyway).
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self.store.apply, ops)
            except Exception as exc:
                # Not only sqlite3.Error/OSError: a bad op (a bug upstream) must not take the
                # writer, and with it every other session's durability, down either.
                self._fail(batch, exc)
            else:
                self._committed(batch)
        self._advance(batch[-1][0])

    def _committed(self, batch: Sequence[tuple[int, Op]]) -> None:
        self.batches_committed += 1
        durable = self._durable
        reset_at = self._reset_at
        for seq, op in batch:
            if isinstance(op, AppendEvent):
                sid = op.session_id
                if seq >= reset_at.get(sid, 0) and op.event_id > durable.get(sid, 0):
                    durable[sid] = op.event_id
            elif isinstance(op, DeleteSession):
                durable.pop(op.session_id, None)
                reset_at.pop(op.session_id, None)
                self.failed_sessions.discard(op.session_id)

    def _fail(self, batch: Sequence[tuple[int, Op]], exc: BaseException) -> None:
        sessions = {op.session_id for _, op in batch}
        lo, hi = batch[0][0], batch[-1][0]
        if self._failed and self._failed[-1][1] + 1 >= lo:
            self._failed[-1][1] = max(self._failed[-1][1], hi)
        else:
            self._failed.append([lo, hi])
        self.batches_failed += 1
        self.failed_sessions |= sessions
        self.degraded = True
        self.last_error = f"{type(exc).__name__}: {exc}"
        logger.error(
            "event=transcript_write_failed sessions=%s ops=%d seq=%d..%d error_type=%s error=%r",
            ",".join(sorted(sessions)),
            len(batch),
            lo,
            hi,
            type(exc).__name__,
            str(exc),
            # Storage errors explain themselves; anything else is a bug worth a traceback.
            exc_info=not isinstance(exc, sqlite3.Error | OSError | RuntimeError),
        )
        if self.on_failure is not None:
            try:
                self.on_failure(set(sessions), exc)
            except Exception:
                logger.exception(
                    "event=transcript_on_failure_raised sessions=%s", ",".join(sorted(sessions))
                )
        if self._stopped:
            self._advance(hi)

    def _advance(self, seq: int) -> None:
        if seq > self._resolved:
            self._resolved = seq
        self._progress.set()
        self._progress = trio.Event()
