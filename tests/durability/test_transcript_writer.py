"""TranscriptWriter: group commit, ordering, durable ids, failure isolation and shutdown."""

from __future__ import annotations

import errno
import logging
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing

from daemon.transcript_store import (
    AdmitPrompt,
    AppendEvent,
    DeleteSession,
    FinishTurn,
    Op,
    StoreHooks,
    TranscriptDatabase,
    UpsertSession,
)
from daemon.transcript_writer import TranscriptWriter, in_worker_thread

S1 = "11111111-1111-4111-8111-111111111111"
S2 = "22222222-2222-4222-8222-222222222222"
S3 = "33333333-3333-4333-8333-333333333333"


def append(sid: str, event_id: int) -> AppendEvent:
    return AppendEvent(sid, event_id, None, b'{"id":%d}' % event_id)


class BatchProbe:
    """Through the store's fault-injection seam (``StoreHooks.before_commit``): records every
    batch size, can hold the next batch before it is applied until released, and can be told
    to raise for the next batches (the batch then fails with nothing of it written)."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.failures: list[BaseException] = []
        self._hold_next = False
        self._token: trio.lowlevel.TrioToken | None = None
        self.entered = trio.Event()  # set (from the worker thread) when a held batch is inside
        self.release = threading.Event()
        self.hooks = StoreHooks(before_commit=self._before_commit)

    @property
    def hold_next(self) -> bool:
        return self._hold_next

    @hold_next.setter
    def hold_next(self, value: bool) -> None:
        # Set from a test running in Trio: the worker thread (not one of to_thread's) needs
        # the token to reach back into the loop.
        if value:
            self._token = trio.lowlevel.current_trio_token()
        self._hold_next = value

    def _before_commit(self, ops: Sequence[Op]) -> None:
        self.batches.append(len(ops))
        if self._hold_next:
            self._hold_next = False
            trio.from_thread.run_sync(self.entered.set, trio_token=self._token)
            self.release.wait()
        if self.failures:
            raise self.failures.pop(0)


@pytest.fixture
def probe() -> BatchProbe:
    return BatchProbe()


@pytest.fixture
def store(tmp_path: Path, probe: BatchProbe) -> TranscriptDatabase:
    s = TranscriptDatabase(tmp_path / "t.db", hooks=probe.hooks)
    s.apply([UpsertSession(S1, "/w", 1), UpsertSession(S2, "/w", 2), UpsertSession(S3, "/w", 3)])
    probe.batches.clear()
    return s


async def start(nursery: trio.Nursery, writer: TranscriptWriter) -> None:
    await nursery.start(writer.run)


async def test_many_submits_make_few_transactions(
        store: TranscriptDatabase, probe: BatchProbe) -> None:
    writer = TranscriptWriter(store, max_batch=300)
    seqs = [writer.submit(append(S1, i)) for i in range(1, 1001)]
    assert seqs == list(range(1, 1001))
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        assert await writer.wait_committed(seqs[-1]) is True
        # Everything was queued before the loop ran: full batches, one transaction each.
        assert probe.batches == [300, 300, 300, 100]
        assert writer.durable_event_id(S1) == 1000
        await writer.aclose()
    assert len(store.raw_events(S1)) == 1000


async def test_ops_submitted_during_a_commit_form_the_next_batch(
        store: TranscriptDatabase, probe: BatchProbe) -> None:
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        probe.hold_next = True
        first = writer.submit(append(S1, 1))
        await probe.entered.wait()  # batch [1] is inside apply, in the worker thread
        later = [writer.submit(append(S1, i)) for i in range(2, 502)]
        assert writer.pending_count == 500  # submit never waits for the stuck commit
        probe.release.set()
        assert await writer.wait_committed(first) is True
        assert await writer.wait_committed(later[-1]) is True
        assert probe.batches == [1, 500]
        await writer.aclose()


async def test_durable_id_moves_only_after_the_batch_is_in_the_file(
        store: TranscriptDatabase, probe: BatchProbe) -> None:
    """While a batch is inside ``apply`` (not yet committed), its events are not durable: the
    durable id stays at the last committed batch and no one waiting on it is woken; once
    ``apply`` returns, the id names the batch's last event and its rows are in the file."""
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        first = writer.submit(append(S1, 1))
        assert await writer.wait_committed(first) is True
        assert writer.durable_event_id(S1) == 1
        probe.hold_next = True
        held = [writer.submit(append(S1, i)) for i in range(2, 6)]
        woken = trio.Event()

        async def waiter() -> None:
            await writer.wait_committed(held[-1])
            woken.set()

        nursery.start_soon(waiter)
        await probe.entered.wait()  # the batch is inside apply, in the worker thread
        await trio.testing.wait_all_tasks_blocked()
        try:
            seen = (writer.durable_event_id(S1), woken.is_set(), store.raw_events(S1))
        finally:
            probe.release.set()  # never leave the worker thread parked, pass or fail
        assert seen == (1, False, [b'{"id":1}'])
        await woken.wait()
        assert writer.durable_event_id(S1) == 5
        assert len(store.raw_events(S1)) == 5
        await writer.aclose()


async def test_read_waits_for_earlier_writes(store: TranscriptDatabase) -> None:
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        writer.submit(append(S1, 1))
        writer.submit(append(S1, 2))
        # No explicit wait: read() itself orders after everything submitted before it.
        events = await writer.read(lambda s: s.raw_events(S1))
        assert events == [b'{"id":1}', b'{"id":2}']
        writer.submit(FinishTurn(S1, None, "completed", "end_turn", 5, [("r1", b"{}")]))
        assert await writer.read(lambda s: (s.raw_events(S1), s.record_count(S1))) == ([], 1)
        await writer.aclose()


async def test_read_errors_propagate(store: TranscriptDatabase) -> None:
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        with pytest.raises(ValueError, match="limit"):
            await writer.read(lambda s: s.page(S1, limit=0))
        await writer.aclose()


async def test_durable_event_id_and_reset(store: TranscriptDatabase) -> None:
    writer = TranscriptWriter(store)
    assert writer.durable_event_id(S1) == 0
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        for i in range(1, 6):
            writer.submit(append(S1, i))
        writer.submit(append(S2, 9))
        assert await writer.wait_flushed() is True
        assert (writer.durable_event_id(S1), writer.durable_event_id(S2)) == (5, 9)
        # Old-bus ops still queued when the new bus starts must not count for it.
        writer.submit(append(S1, 6))
        writer.submit(append(S1, 7))
        writer.reset_durable(S1)
        assert writer.durable_event_id(S1) == 0
        writer.submit(append(S1, 1))
        assert await writer.wait_flushed() is True
        assert writer.durable_event_id(S1) == 1
        assert writer.durable_event_id(S2) == 9
        writer.submit(DeleteSession(S2))
        await writer.wait_flushed()
        assert writer.durable_event_id(S2) == 0
        await writer.aclose()


@pytest.mark.parametrize(
    "exc",
    [
        sqlite3.OperationalError("database is locked"),
        OSError(errno.ENOSPC, "No space left on device"),
    ],
    ids=["locked", "enospc"],
)
async def test_failed_batch_latches_its_sessions_and_writer_goes_on(
    store: TranscriptDatabase, probe: BatchProbe, exc: BaseException,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[tuple[set[str], BaseException]] = []
    writer = TranscriptWriter(store, on_failure=lambda s, e: calls.append((s, e)))
    probe.failures.append(exc)
    caplog.set_level(logging.ERROR, logger="daemon.transcript")
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        a = writer.submit(append(S1, 1))
        b = writer.submit(AdmitPrompt(S2, "p", 1))
        assert await writer.wait_committed(a) is False
        assert await writer.wait_committed(b) is False
        assert writer.failed_sessions == {S1, S2}
        assert writer.degraded is True
        assert writer.last_error is not None and str(exc) in writer.last_error
        assert calls == [({S1, S2}, exc)]
        assert writer.durable_event_id(S1) == 0
        [line] = [r.getMessage() for r in caplog.records if r.name == "daemon.transcript"]
        assert "event=transcript_write_failed" in line
        assert f"sessions={S1},{S2}" in line
        assert type(exc).__name__ in line
        # Later batches commit for healthy sessions; a failed session's later writes are
        # refused (the durable prefix rule: nothing may land after the hole), its durable id
        # stays where the failure hit, and the latch stays.
        c = writer.submit(append(S1, 2))
        d = writer.submit(append(S3, 1))
        e = writer.submit(FinishTurn(S2, "p", "completed", None, 2, [("r", b"{}")]))
        assert await writer.wait_committed(c) is False
        assert await writer.wait_committed(d) is True
        assert await writer.wait_committed(e) is False
        assert writer.failed_sessions == {S1, S2}
        assert writer.durable_event_id(S1) == 0
        assert writer.durable_event_id(S3) == 1
        assert writer.ops_refused == 2
        # Neither the failed batch's ops nor the refused ones are in the store.
        assert await writer.read(lambda s: s.raw_events(S1)) == []
        assert await writer.read(lambda s: (s.in_flight_prompts(S2), s.record_count(S2))) \
            == ([], 0)
        assert len(calls) == 1  # one failure told, not one per refused op
        await writer.aclose()


async def test_real_sqlite_error_fails_only_that_batch(store: TranscriptDatabase) -> None:
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        ok = writer.submit(FinishTurn(S1, "p1", "completed", None, 1, [("dup", b"{}")]))
        assert await writer.wait_committed(ok) is True
        bad = writer.submit(FinishTurn(S2, "p2", "completed", None, 1, [("dup", b"{}")]))
        assert await writer.wait_committed(bad) is False
        assert writer.failed_sessions == {S2}
        assert writer.last_error is not None and "IntegrityError" in writer.last_error
        refused = writer.submit(append(S2, 1))
        other = writer.submit(append(S1, 1))
        assert await writer.wait_committed(refused) is False
        assert await writer.wait_committed(other) is True
        await writer.aclose()


async def test_on_failure_raising_does_not_stop_the_writer(
        store: TranscriptDatabase, probe: BatchProbe) -> None:
    def boom(sessions: set[str], exc: BaseException) -> None:
        raise RuntimeError("callback bug")

    writer = TranscriptWriter(store, on_failure=boom)
    probe.failures.append(sqlite3.OperationalError("disk I/O error"))
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        assert await writer.wait_committed(writer.submit(append(S1, 1))) is False
        assert await writer.wait_committed(writer.submit(append(S2, 2))) is True
        await writer.aclose()


async def test_reset_durable_clears_the_failure_latch(
        store: TranscriptDatabase, probe: BatchProbe) -> None:
    writer = TranscriptWriter(store)
    probe.failures.append(sqlite3.OperationalError("database is locked"))
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        await writer.wait_committed(writer.submit(append(S1, 1)))
        assert writer.failed_sessions == {S1}
        writer.reset_durable(S1)
        assert writer.failed_sessions == set()
        assert writer.degraded is True  # the writer-level flag is history, not per bus
        await writer.aclose()


async def test_aclose_flushes_and_stops(store: TranscriptDatabase) -> None:
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        seqs = [writer.submit(append(S1, i)) for i in range(1, 51)]
        await writer.aclose()
        # The nursery can only exit because run() returned.
    assert store.raw_events(S1) == [b'{"id":%d}' % i for i in range(1, 51)]
    assert await writer.wait_committed(seqs[-1]) is True
    # After the stop nothing can commit an op: it fails at once instead of hanging a waiter.
    late = writer.submit(append(S2, 1))
    assert await writer.wait_committed(late) is False
    assert S2 in writer.failed_sessions
    assert store.raw_events(S2) == []


async def test_aclose_without_run_commits_inline(store: TranscriptDatabase) -> None:
    writer = TranscriptWriter(store)
    writer.submit(append(S1, 1))
    await writer.aclose()
    assert store.raw_events(S1) == [b'{"id":1}']
    await writer.run()  # a loop started after aclose() returns at once


async def test_cancelled_writer_still_commits_what_was_queued(store: TranscriptDatabase) -> None:
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        for i in range(1, 21):
            writer.submit(append(S1, i))
        nursery.cancel_scope.cancel()
    assert len(store.raw_events(S1)) == 20
    assert writer.durable_event_id(S1) == 20


async def test_wait_committed_rejects_unknown_seq(store: TranscriptDatabase) -> None:
    writer = TranscriptWriter(store)
    with pytest.raises(ValueError):
        await writer.wait_committed(1)
    assert await writer.wait_committed(0) is True


async def test_waiters_on_one_batch_all_wake(store: TranscriptDatabase) -> None:
    writer = TranscriptWriter(store)
    results: dict[int, bool] = {}

    async def waiter(seq: int) -> None:
        results[seq] = await writer.wait_committed(seq)

    async with trio.open_nursery() as nursery:
        seqs = [writer.submit(append(S1, i)) for i in range(1, 11)]
        for seq in seqs:
            nursery.start_soon(waiter, seq)
        await start(nursery, writer)
        await writer.wait_flushed()
        await writer.aclose()
    assert results == dict.fromkeys(seqs, True)


async def test_a_read_only_database_degrades_the_session_and_recovers(
        store: TranscriptDatabase) -> None:
    """A real read-only failure from SQLite (query_only: every write is refused the way a
    read-only file refuses it, even for root, whom file permissions do not stop)."""
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        store.connection.execute("PRAGMA query_only=ON")
        refused = writer.submit(append(S1, 1))
        assert await writer.wait_committed(refused) is False
        assert writer.failed_sessions == {S1} and writer.degraded
        assert writer.last_error is not None and "readonly" in writer.last_error
        store.connection.execute("PRAGMA query_only=OFF")
        later = writer.submit(append(S2, 1))
        assert await writer.wait_committed(later) is True
        assert writer.durable_event_id(S2) == 1 and writer.durable_event_id(S1) == 0
        await writer.aclose()


# --- the durable prefix rule ------------------------------------------------------------------


async def test_ops_queued_behind_a_failed_batch_are_refused(
        store: TranscriptDatabase, probe: BatchProbe) -> None:
    """Ops already queued when a session's batch fails never land after the hole; other
    sessions' ops in the same later batch commit."""
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        assert await writer.wait_committed(writer.submit(append(S1, 1))) is True
        probe.hold_next = True
        probe.failures.append(OSError(errno.EFBIG, "File too large"))
        failing = writer.submit(append(S1, 2))
        await probe.entered.wait()
        queued = [writer.submit(append(S1, 3)), writer.submit(append(S2, 1)),
                  writer.submit(append(S1, 4)), writer.submit(AdmitPrompt(S1, "p", 1)),
                  writer.submit(FinishTurn(S1, "p", "completed", None, 1, [("r", b"{}")]))]
        probe.release.set()
        assert await writer.wait_committed(failing) is False
        results = [await writer.wait_committed(seq) for seq in queued]
        assert results == [False, True, False, False, False]
        assert writer.durable_event_id(S1) == 1 and writer.durable_event_id(S2) == 1
        assert writer.ops_refused == 4
        assert await writer.read(lambda s: (s.raw_events(S1), s.record_count(S1),
                                            s.in_flight_prompts(S1))) == ([b'{"id":1}'], 0, [])
        # Only the tried batch reached SQLite: [1], [2] (failed), [S2's one op].
        assert probe.batches == [1, 1, 1]
        await writer.aclose()


async def test_a_failing_kept_op_below_refused_ones_is_reported_failed(
        store: TranscriptDatabase, probe: BatchProbe) -> None:
    writer = TranscriptWriter(store)
    probe.failures.append(sqlite3.OperationalError("disk I/O error"))
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        assert await writer.wait_committed(writer.submit(append(S1, 1))) is False
        # One batch: S2's op is tried (and fails), S1's is refused above it. (The held
        # blocker takes the first of the two failures.)
        probe.failures += [sqlite3.OperationalError("disk I/O error")] * 2
        probe.hold_next = True
        blocker = writer.submit(append(S3, 1))
        await probe.entered.wait()
        tried = writer.submit(append(S2, 1))
        refused = writer.submit(append(S1, 2))
        probe.release.set()
        assert await writer.wait_committed(blocker) is False
        assert await writer.wait_committed(tried) is False
        assert await writer.wait_committed(refused) is False
        assert writer.failed_sessions == {S1, S2, S3}
        await writer.aclose()


async def test_a_new_bus_writes_again_but_old_queued_ops_stay_refused(
        store: TranscriptDatabase, probe: BatchProbe) -> None:
    writer = TranscriptWriter(store)
    probe.failures.append(sqlite3.OperationalError("disk I/O error"))
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        assert await writer.wait_committed(writer.submit(append(S1, 1))) is False
        old = writer.submit(append(S1, 2))  # the dead bus's op, still queued
        writer.reset_durable(S1)
        assert writer.failed_sessions == set()
        new = writer.submit(append(S1, 1))
        assert await writer.wait_committed(old) is False
        assert await writer.wait_committed(new) is True
        assert writer.durable_event_id(S1) == 1
        assert await writer.read(lambda s: s.raw_events(S1)) == [b'{"id":1}']
        # Deleting the session forgets everything about it.
        assert await writer.wait_committed(writer.submit(DeleteSession(S1))) is True
        assert writer._refuse_before == {}
        await writer.aclose()


async def test_mark_failed_latches_and_refuses(store: TranscriptDatabase) -> None:
    calls: list[set[str]] = []
    writer = TranscriptWriter(store, on_failure=lambda s, e: calls.append(s))
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        assert await writer.wait_committed(writer.submit(append(S1, 1))) is True
        writer.mark_failed(S1, TimeoutError("commit did not finish"))
        writer.mark_failed(S1, TimeoutError("again"))  # once
        assert calls == [{S1}] and writer.degraded
        assert writer.last_error is not None and "commit did not finish" in writer.last_error
        assert await writer.wait_committed(writer.submit(append(S1, 2))) is False
        assert writer.durable_event_id(S1) == 1
        await writer.aclose()


async def test_in_worker_thread_returns_raises_and_leaves_the_thread_name_alone() -> None:
    """The writer's thread hop: the function's result comes back, its exception is raised in
    the caller, and the worker thread is not renamed per job (the rename and its undoing were
    two GIL hand-offs per commit)."""
    names: list[str] = []

    def job() -> int:
        names.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())
        return 42

    def broken() -> None:
        raise sqlite3.OperationalError("disk I/O error")

    for _ in range(3):
        assert await in_worker_thread(job) == 42
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        await in_worker_thread(broken)
    assert len(names) == 3 and len(set(names)) == 1  # one name every time: the thread's own
    assert not any("from" in name for name in names)  # not to_thread's "<fn> from <task>"


async def test_in_worker_thread_is_not_abandoned_on_cancel() -> None:
    """A cancelled caller still waits for the job it handed over and gets Cancelled only after
    the job returned: a batch taken off the queue is never left running unaccounted."""
    started = threading.Event()
    go_on = threading.Event()
    finished: list[bool] = []

    def job() -> None:
        started.set()
        go_on.wait(10)
        finished.append(True)

    async def caller(scope_box: list[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            scope_box.append(scope)
            await in_worker_thread(job)
            # Reached: the cancellation could not interrupt the wait; it is raised at the
            # next checkpoint.
            finished.append(False)
            await trio.lowlevel.checkpoint()
            finished.append(False)  # never reached

    box: list[trio.CancelScope] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller, box)
        await trio.to_thread.run_sync(started.wait, 10)
        box[0].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert finished == []  # still waiting for the job, not abandoned
        go_on.set()
    assert finished == [True, False]
    assert box[0].cancelled_caught
