"""The transcript writer: a Trio task that group-commits transcript ops.

The bus calls :meth:`TranscriptWriter.submit` on its publish path; that only appends to an
in-memory queue. One loop takes everything queued (up to ``max_batch``) and applies it to the
:class:`~daemon.transcript_store.TranscriptDatabase` in ONE transaction in a worker thread. While a
commit runs, new ops accumulate for the next one, so an op waits at most about two commit times
and there is never one thread hop per event.

A failing batch never stops the writer and never blocks ``submit``: the sessions it touched are
latched in ``failed_sessions``, ``on_failure`` is told, waiters get ``False``, and later batches
are committed as usual for every other session. Reads go through the same lock as writes: the
store has one connection.

The durable prefix rule. What is stored for a session on its current bus is always a true
prefix of what that bus published: once a write of the session failed, the writer refuses every
later :class:`AppendEvent`, :class:`AdmitPrompt` and :class:`FinishTurn` of that session (they
resolve as failed, never reach SQLite) until the session gets a new bus. A later batch that
happened to fit on a full disk therefore cannot land events after a hole, nor a terminal whose
turn lacks events, nor a next turn whose boundary deletes the unfinished one's raw events. So
:meth:`durable_event_id` only ever names an event with nothing missing at or below it, and it
stops where the failure hit. Only :class:`MarkClosed` and :class:`DeleteSession` still apply:
they remove, they never add history. A restore of such a session finds the durable prefix with
its prompt still ``in_flight`` and closes it as ``interrupted`` (its terminal truly was not
committed).
"""

from __future__ import annotations

import bisect
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

import trio

if TYPE_CHECKING:
    import outcome

from daemon.metrics import observe_commit
from daemon.transcript_store import (
    AdmitPrompt,
    AppendEvent,
    DeleteSession,
    FinishTurn,
    Op,
    TranscriptDamaged,
    TranscriptDatabase,
    is_corruption,
)

__all__ = ["DEFAULT_MAX_BATCH", "MAX_DAMAGE_LINES", "Replica", "TranscriptWriter"]

DEFAULT_MAX_BATCH = 5000
# Ops gather for at most this long after a commit starts (well inside the 100 ms window).
DEFAULT_COALESCE_S = 0.01
# Lines of damage kept for the status route (the first ones found; later ones are counted).
MAX_DAMAGE_LINES = 100

logger = logging.getLogger("daemon.transcript")

T = TypeVar("T")

FailureCallback = Callable[[set[str], BaseException], None]


async def in_worker_thread(fn: Callable[[], T], on_abort: Callable[[], None] | None = None) -> T:
    """Run ``fn()`` in one of Trio's cached worker threads; return its result or raise its error.

    What one ``trio.to_thread.run_sync`` call does, minus what the writer has no use for. That
    call renames the worker thread for every job and back again, two ``prctl`` calls through
    ctypes; each gives up the GIL and then has to take it back from the event loop, which holds
    it while a turn streams (a wait of up to one switch interval, then a forced hand-off the
    loop pays for too). Per commit that was five GIL hand-offs where three are needed (the
    thread waking up, the return from SQLite, the wake-up of the loop). It also takes a
    capacity limiter and copies the context, work on the event loop's thread per commit.

    Not cancellable, like a shielded ``to_thread`` call: a job handed to the thread cannot be
    stopped, so its result is always awaited and accounted for; a cancellation of the caller
    is raised at its next checkpoint instead (``on_abort``, if given, is called at that moment:
    to make ``fn`` end sooner). ``fn`` runs outside Trio: it must not call
    ``trio.from_thread`` without a ``trio_token``.
    """
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()

    def deliver(result: outcome.Outcome[T]) -> None:
        token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    def abort(_: object) -> trio.lowlevel.Abort:
        if on_abort is not None:
            on_abort()
        return trio.lowlevel.Abort.FAILED

    trio.lowlevel.start_thread_soon(fn, deliver)
    got: T = await trio.lowlevel.wait_task_rescheduled(abort)
    return got


class Replica(Protocol):
    """Another place every op goes to besides the local store (cluster mode: Redis, see
    ``daemon.cluster``). With replicas an op counts as committed once the store and every
    replica have it, and ``durableEventId`` is what the replicas acknowledged."""

    # How long the prompt route may wait for an admission before refusing to acknowledge it
    # (None: no bound), and how long a terminal waits before its session is degraded.
    admission_bound_s: float | None
    durable_bound_s: float | None

    def accept(self, seq: int, op: Op, *, local_only: bool = False) -> None:
        """Op ``seq`` of the writer (``local_only``: one that stays in the local store; only
        its place in the sequence counts). Never blocks."""

    async def wait_acked(self, seq: int) -> bool:
        """Once op ``seq`` is resolved here: True if the replica has it."""
        ...

    def durable_event_id(self, session_id: str) -> int:
        """The newest event of the session's current bus the replica acknowledged."""
        ...

    def reset_durable(self, session_id: str) -> None:
        """The session got a new bus (its event ids restart)."""

    def is_lagging(self, session_id: str) -> bool:
        """Is the replica behind on the session (``transcriptDegraded`` until it catches up)?"""
        ...

    def hold_back(self, session_id: str, seq: int, why: str) -> bool:
        """The session's commits up to ``seq`` did not finish in time (``why``): True when the
        replica has not answered ``seq``, so the session only lags (nothing is latched);
        False when the replica has it (the local store is what failed to keep up)."""
        ...


class TranscriptWriter:
    """Group-commit writer over one :class:`TranscriptDatabase`, and over any :class:`Replica`
    given (every op goes to the store and to each replica).

    Sequence numbers start at 1 and grow by one per submitted op; batches are contiguous
    ranges of them, committed in order.
    """

    def __init__(
        self,
        store: TranscriptDatabase,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        on_failure: FailureCallback | None = None,
        coalesce_s: float = DEFAULT_COALESCE_S,
        replicas: Sequence[Replica] = (),
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.store = store
        self.replicas = tuple(replicas)
        # How long the prompt route may wait for an admission before refusing to acknowledge
        # it (Session.wait_admitted). None: a single node acknowledges whatever the store did
        # (a failing store degrades the session, it does not refuse prompts); a replica (the
        # cluster's) may set a bound tied to its lease.
        self.admission_bound_s: float | None = min(
            (r.admission_bound_s for r in self.replicas if r.admission_bound_s is not None),
            default=None)
        # How long a terminal waits for the transcript before the session is marked degraded
        # (Session.wait_durable); None: the session's own default.
        self.durable_bound_s: float | None = min(
            (r.durable_bound_s for r in self.replicas if r.durable_bound_s is not None),
            default=None)
        self.max_batch = max_batch
        self.on_failure = on_failure
        self.coalesce_s = coalesce_s
        self._waiters = 0
        self._urgent = trio.Event()
        self._last_commit_at = float("-inf")
        self.failed_sessions: set[str] = set()
        self.degraded = False
        self.last_error: str | None = None
        # Damage found in the file (by a read, a write, or the check): the sessions it is in, and
        # whether some of it could not be placed in a session (then every read is refused).
        self.damaged_sessions: set[str] = set()
        self.store_damaged = False
        self.damage: list[str] = []
        self.damage_found = 0
        # The file's checks (GET /daemon/status): the bounded quick_check at start, and the
        # full check (see daemon.transcript_check).
        self.quick_check: Literal["ok", "incomplete", "off"] = store.quick_check
        self.full_check: Literal["running", "ok", "damaged", "off"] = "off"
        self._maintaining = False  # an interruptible maintenance job holds the connection
        self.batches_committed = 0
        self.batches_failed = 0
        self.ops_refused = 0  # ops of latched sessions never sent to SQLite (durable prefix rule)
        self._pending: deque[tuple[int, Op]] = deque()
        self._last_seq = 0
        self._resolved = 0  # every seq <= this is committed or failed
        self._failed: list[list[int]] = []  # sorted, disjoint [lo, hi] seq ranges that failed
        self._durable: dict[str, int] = {}
        self._reset_at: dict[str, int] = {}  # AppendEvents below this seq belong to an old bus
        # A latched session got a new bus: its old bus's ops still queued (seq below this) stay
        # refused, although the latch itself was cleared for the new bus.
        self._refuse_before: dict[str, int] = {}
        self._db_lock = trio.Lock()
        self._store_closed = False  # close_store ran: nobody may use the connection again
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
        seq = self._submit(op)
        for replica in self.replicas:
            replica.accept(seq, op)
        return seq

    def submit_local(self, op: Op) -> int:
        """:meth:`submit` into the local store only, not to the replicas (replaying the op log
        of a session a cluster node took over: the replica holds it already)."""
        seq = self._submit(op)
        for replica in self.replicas:
            replica.accept(seq, op, local_only=True)
        return seq

    def _submit(self, op: Op) -> int:
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
        """Wait until op ``seq`` is resolved: ``True`` if it was committed (by the store and
        every replica), ``False`` if the batch holding it failed (or a replica refused it)."""
        if not 0 <= seq <= self._last_seq:
            raise ValueError(f"no op with sequence number {seq} was submitted")
        await self._wait_resolved(seq)
        committed = not self._is_failed(seq)
        for replica in self.replicas:
            committed = await replica.wait_acked(seq) and committed
        return committed

    async def wait_flushed(self) -> bool:
        """Wait until every op submitted so far is resolved; ``True`` if the newest one was
        committed (the prompt runner's "everything published is durable" wait)."""
        return await self.wait_committed(self._last_seq)

    async def read(self, fn: Callable[[TranscriptDatabase], T], *,
                   session_id: str | None = None) -> T:
        """Run ``fn(store)`` in a worker thread once every op submitted before this call is
        committed (or failed); serialized with the writes on the one connection.

        With ``session_id``, a read of a session whose transcript is known to be damaged is
        refused at once (:class:`TranscriptDamaged`): with a damaged index, what it would return
        could silently lack rows. Damage the read itself finds (a row whose checksum does not
        match, or SQLite reporting a corrupt page) is recorded and raised as
        :class:`TranscriptDamaged`, never returned."""
        if session_id is not None and self.is_damaged(session_id):
            raise TranscriptDamaged(session_id, f"the transcript of session {session_id} is "
                                    "damaged")
        await self._wait_resolved(self._last_seq)
        self._yield_maintenance()
        async with self._db_lock:
            self._check_open()
            try:
                return await in_worker_thread(partial(fn, self.store))
            except TranscriptDamaged as exc:
                self.note_damage(exc.session_id, str(exc))
                raise
            except sqlite3.DatabaseError as exc:
                if not is_corruption(exc):
                    raise
                self.note_damage(None, f"SQLite: {exc}")
                raise TranscriptDamaged(session_id, f"the transcript file is damaged: {exc}"
                                        ) from exc

    async def maintain(self, fn: Callable[[TranscriptDatabase], T], *,
                       interruptible: bool = False) -> T:
        """Run ``fn(store)`` in a worker thread on the connection, without waiting for the
        commits queued before it. ``interruptible``: a commit or a read that needs the
        connection meanwhile cuts it (:meth:`TranscriptDatabase.interrupt`; ``fn`` must expect
        that), so a long check never holds back the daemon's work. A cancellation cuts it too."""
        async with self._db_lock:
            self._check_open()
            self.store.interruptible(interruptible)
            self._maintaining = interruptible
            try:
                return await in_worker_thread(partial(fn, self.store),
                                              on_abort=self.store.interrupt)
            finally:
                self._maintaining = False
                self.store.interruptible(False)

    async def close_store(self) -> None:
        """Close the connection, once nobody uses it: a read or a maintenance step (retention,
        a check) still running in a worker thread is cut (a step rolls back) and waited for
        first; closing under it would free what SQLite is still using in that thread. Any use
        after this is refused. For the end of a daemon that has stopped the writer
        (:meth:`aclose`)."""
        self._yield_maintenance()
        async with self._db_lock:
            if not self._store_closed:
                self._store_closed = True
                self.store.close()

    def _check_open(self) -> None:
        if self._store_closed:
            raise RuntimeError("the transcript store is closed")

    def release_memory(self) -> bool:
        """Let SQLite give back its cache (:meth:`TranscriptDatabase.release_memory`) when the
        writer is idle: nothing queued and nobody on the connection. Runs on the caller's
        thread (it takes microseconds); True if it ran. For a pause in the work (before a heap
        trim), so the pages a busy writer is about to reuse are never dropped."""
        if self._pending or self._db_lock.locked() or self._stopped or self._store_closed:
            return False
        self.store.release_memory()
        return True

    def _yield_maintenance(self) -> None:
        if self._maintaining:
            self._maintaining = False
            self.store.interrupt()

    # --- damage ---

    def is_damaged(self, session_id: str) -> bool:
        """Is damage known in ``session_id``'s transcript (or in the file, unplaced)?"""
        return self.store_damaged or session_id in self.damaged_sessions

    def note_damage(self, session_id: str | None, problem: str) -> None:
        """Record damage found in the file: in ``session_id``'s rows, or (``None``) not
        placed in any session, which makes every session's reads refused."""
        if session_id is None:
            new = not self.store_damaged
            self.store_damaged = True
        else:
            new = session_id not in self.damaged_sessions
            self.damaged_sessions.add(session_id)
        self.damage_found += 1
        if problem not in self.damage and len(self.damage) < MAX_DAMAGE_LINES:
            self.damage.append(problem)
        if new:
            logger.error("event=transcript_damaged session=%s problem=%s hint=%s",
                         session_id or "-", problem,
                         "stop the daemon and recover the transcript (--recover)")

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
        """Highest ``AppendEvent.event_id`` committed for the session on its current bus, with
        every event of that bus at or below it committed too (the durable prefix rule: after
        a failed write nothing more of the session commits, so this stops where it failed).
        With replicas: the highest every replica acknowledged."""
        if self.replicas:
            return min(replica.durable_event_id(session_id) for replica in self.replicas)
        return self._durable.get(session_id, 0)

    def is_degraded(self, session_id: str) -> bool:
        """Does the session's transcript miss writes (``transcriptDegraded``)?"""
        return session_id in self.failed_sessions or any(
            replica.is_lagging(session_id) for replica in self.replicas)

    async def wait_admitted(self, seq: int) -> bool:
        """Is op ``seq`` (an admission) durable? Waited for by the prompt route when
        :attr:`admission_bound_s` is set: with replicas, once every replica has it."""
        if not self.replicas:
            return await self.wait_committed(seq)
        admitted = True
        for replica in self.replicas:
            admitted = await replica.wait_acked(seq) and admitted
        return admitted

    def reset_durable(self, session_id: str) -> None:
        """The session got a new bus: its ids restart, so forget the old durable id (ops of the
        old bus still queued will not raise it again) and clear its failure latch: a load's
        ``fullTranscriptAvailable`` counts write failures from the bus's creation."""
        for replica in self.replicas:
            replica.reset_durable(session_id)
        self._durable.pop(session_id, None)
        self._reset_at[session_id] = self._last_seq + 1
        if session_id in self.failed_sessions:
            self._refuse_before[session_id] = self._last_seq + 1
        self.failed_sessions.discard(session_id)

    def mark_failed(self, session_id: str, exc: BaseException) -> None:
        """Latch ``session_id`` as failed although no batch of it failed (e.g. its commits
        did not finish in time for a terminal): from here on it is degraded and its later
        writes are refused, exactly as after a failed batch. A replica that has not answered
        yet keeps it from being latched: the session only lags until it does (see
        :meth:`Replica.hold_back`)."""
        held = [replica.hold_back(session_id, self._last_seq, f"{exc}")
                for replica in self.replicas]
        if any(held):
            return
        if session_id in self.failed_sessions:
            return
        self.failed_sessions.add(session_id)
        self.degraded = True
        self.last_error = f"{type(exc).__name__}: {exc}"
        logger.error("event=transcript_write_failed sessions=%s ops=0 error_type=%s error=%r",
                     session_id, type(exc).__name__, str(exc))
        self._tell_failure({session_id}, exc)

    def _refused(self, seq: int, op: Op) -> bool:
        """Is ``op`` barred by the durable prefix rule (its session's earlier write failed)?"""
        if not isinstance(op, AppendEvent | AdmitPrompt | FinishTurn):
            return False
        sid = op.session_id
        if seq < self._refuse_before.get(sid, 0):
            return True
        return sid in self.failed_sessions and seq >= self._reset_at.get(sid, 0)

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
        self._yield_maintenance()
        async with self._db_lock:
            # Taken under the lock so that a cancellation while waiting for it loses nothing.
            count = min(len(self._pending), self.max_batch)
            taken = [self._pending.popleft() for _ in range(count)]
            if not taken:
                return
            batch = taken
            if self.failed_sessions or self._refuse_before:
                batch = self._drop_refused(taken)
            if batch:
                ops = [op for _, op in batch]
                try:
                    # Not cancellable (see in_worker_thread): a batch taken off the queue is
                    # applied and accounted for, never dropped half-way by a cancellation.
                    started = time.perf_counter()
                    await in_worker_thread(partial(self.store.apply, ops))
                    observe_commit(time.perf_counter() - started)
                except Exception as exc:
                    # Not only sqlite3.Error/OSError: a bad op (a bug upstream) must not take
                    # the writer, and with it every other session's durability, down either.
                    self._fail(batch, exc)
                else:
                    self._committed(batch)
        self._advance(taken[-1][0])

    def _drop_refused(self, taken: list[tuple[int, Op]]) -> list[tuple[int, Op]]:
        """Split off the ops the durable prefix rule refuses; they resolve as failed."""
        kept: list[tuple[int, Op]] = []
        run: list[int] = []  # a run of consecutive refused seqs, recorded as one range
        for seq, op in taken:
            if self._refused(seq, op):
                if run and run[1] + 1 != seq:
                    self._record_failed(run[0], run[1])
                    run = []
                run = [run[0] if run else seq, seq]
            else:
                kept.append((seq, op))
        if run:
            self._record_failed(run[0], run[1])
        self.ops_refused += len(taken) - len(kept)
        return kept

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
                self._refuse_before.pop(op.session_id, None)
                self.failed_sessions.discard(op.session_id)

    def _record_failed(self, lo: int, hi: int) -> None:
        """Seqs ``lo..hi`` resolved as failed. Ranges nearly always arrive in ascending order
        (appended, merged with the last); a batch's own failure can land just below refused
        ops recorded a moment before, so an out-of-order range is inserted and merged."""
        failed = self._failed
        if not failed or failed[-1][1] + 1 < lo:
            failed.append([lo, hi])
            return
        if failed[-1][0] <= lo:
            failed[-1][1] = max(failed[-1][1], hi)
            return
        i = bisect.bisect_left(failed, lo, key=lambda r: r[0])
        failed.insert(i, [lo, hi])
        merged: list[list[int]] = []
        for rng in failed[max(i - 1, 0):]:
            if merged and merged[-1][1] + 1 >= rng[0]:
                merged[-1][1] = max(merged[-1][1], rng[1])
            else:
                merged.append(rng)
        failed[max(i - 1, 0):] = merged

    def _fail(self, batch: Sequence[tuple[int, Op]], exc: BaseException) -> None:
        sessions = {op.session_id for _, op in batch}
        lo, hi = batch[0][0], batch[-1][0]
        if len(batch) == hi - lo + 1:
            self._record_failed(lo, hi)
        else:  # refused ops were taken out of the middle: only the ones tried failed
            for seq, _ in batch:
                self._record_failed(seq, seq)
        if isinstance(exc, TranscriptDamaged):
            self.note_damage(exc.session_id, str(exc))
        elif is_corruption(exc):
            self.note_damage(None, f"SQLite: {exc}")
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
        self._tell_failure(sessions, exc)
        if self._stopped:
            self._advance(hi)

    def _tell_failure(self, sessions: set[str], exc: BaseException) -> None:
        if self.on_failure is not None:
            try:
                self.on_failure(set(sessions), exc)
            except Exception:
                logger.exception(
                    "event=transcript_on_failure_raised sessions=%s", ",".join(sorted(sessions))
                )

    def _advance(self, seq: int) -> None:
        if seq > self._resolved:
            self._resolved = seq
        self._progress.set()
        self._progress = trio.Event()
