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

from daemon.transcript_store import (
    AdmitPrompt,
    AppendEvent,
    DeleteSession,
    FinishTurn,
    Op,
    TranscriptStore,
    UpsertSession,
)
from daemon.transcript_writer import TranscriptWriter

S1 = "11111111-1111-4111-8111-111111111111"
S2 = "22222222-2222-4222-8222-222222222222"
S3 = "33333333-3333-4333-8333-333333333333"


def append(sid: str, event_id: int) -> AppendEvent:
    return AppendEvent(sid, event_id, None, b'{"id":%d}' % event_id)


class CountingStore(TranscriptStore):
    """Records every batch size; can hold a batch inside apply() until released, and can be
    told to raise for the next batches."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.batches: list[int] = []
        self.failures: list[BaseException] = []
        self.hold_next = False
        self.entered = trio.Event()  # set (from the worker thread) when a held batch is inside
        self.release = threading.Event()

    def apply(self, ops: Sequence[Op]) -> None:
        self.batches.append(len(ops))
        if self.hold_next:
            self.hold_next = False
            trio.from_thread.run_sync(self.entered.set)
            self.release.wait()
        if self.failures:
            raise self.failures.pop(0)
        super().apply(ops)


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    s = CountingStore(tmp_path / "t.db")
    s.apply([UpsertSession(S1, "/w", 1), UpsertSession(S2, "/w", 2), UpsertSession(S3, "/w", 3)])
    s.batches.clear()
    return s


async def start(nursery: trio.Nursery, writer: TranscriptWriter) -> None:
    await nursery.start(writer.run)


async def test_many_submits_make_few_transactions(store: CountingStore) -> None:
    writer = TranscriptWriter(store, max_batch=300)
    seqs = [writer.submit(append(S1, i)) for i in range(1, 1001)]
    assert seqs == list(range(1, 1001))
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        assert await writer.wait_committed(seqs[-1]) is True
        # Everything was queued before the loop ran: full batches, one transaction each.
        assert store.batches == [300, 300, 300, 100]
        assert writer.durable_event_id(S1) == 1000
        await writer.aclose()
    assert len(store.raw_events(S1)) == 1000


async def test_ops_submitted_during_a_commit_form_the_next_batch(store: CountingStore) -> None:
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        store.hold_next = True
        first = writer.submit(append(S1, 1))
        await store.entered.wait()  # batch [1] is inside apply, in the worker thread
        later = [writer.submit(append(S1, i)) for i in range(2, 502)]
        assert writer.pending_count == 500  # submit never waits for the stuck commit
        store.release.set()
        assert await writer.wait_committed(first) is True
        assert await writer.wait_committed(later[-1]) is True
        assert store.batches == [1, 500]
        await writer.aclose()


async def test_read_waits_for_earlier_writes(store: CountingStore) -> None:
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


async def test_read_errors_propagate(store: CountingStore) -> None:
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        with pytest.raises(ValueError, match="limit"):
            await writer.read(lambda s: s.page(S1, limit=0))
        await writer.aclose()


async def test_durable_event_id_and_reset(store: CountingStore) -> None:
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
    store: CountingStore, exc: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[set[str], BaseException]] = []
    writer = TranscriptWriter(store, on_failure=lambda s, e: calls.append((s, e)))
    store.failures.append(exc)
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
        # Later batches commit, for failed and healthy sessions alike; the latch stays.
        c = writer.submit(append(S1, 2))
        d = writer.submit(append(S3, 1))
        assert await writer.wait_committed(c) is True
        assert await writer.wait_committed(d) is True
        assert writer.failed_sessions == {S1, S2}
        assert writer.durable_event_id(S1) == 2
        # The failed batch's ops really are not in the store.
        assert await writer.read(lambda s: s.raw_events(S1)) == [b'{"id":2}']
        assert await writer.read(lambda s: s.in_flight_prompts(S2)) == []
        await writer.aclose()


async def test_real_sqlite_error_fails_only_that_batch(store: CountingStore) -> None:
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        ok = writer.submit(FinishTurn(S1, "p1", "completed", None, 1, [("dup", b"{}")]))
        assert await writer.wait_committed(ok) is True
        bad = writer.submit(FinishTurn(S2, "p2", "completed", None, 1, [("dup", b"{}")]))
        assert await writer.wait_committed(bad) is False
        assert writer.failed_sessions == {S2}
        assert writer.last_error is not None and "IntegrityError" in writer.last_error
        good = writer.submit(append(S2, 1))
        assert await writer.wait_committed(good) is True
        await writer.aclose()


async def test_on_failure_raising_does_not_stop_the_writer(store: CountingStore) -> None:
    def boom(sessions: set[str], exc: BaseException) -> None:
        raise RuntimeError("callback bug")

    writer = TranscriptWriter(store, on_failure=boom)
    store.failures.append(sqlite3.OperationalError("disk I/O error"))
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        assert await writer.wait_committed(writer.submit(append(S1, 1))) is False
        assert await writer.wait_committed(writer.submit(append(S1, 2))) is True
        await writer.aclose()


async def test_reset_durable_clears_the_failure_latch(store: CountingStore) -> None:
    writer = TranscriptWriter(store)
    store.failures.append(sqlite3.OperationalError("database is locked"))
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        await writer.wait_committed(writer.submit(append(S1, 1)))
        assert writer.failed_sessions == {S1}
        writer.reset_durable(S1)
        assert writer.failed_sessions == set()
        assert writer.degraded is True  # the writer-level flag is history, not per bus
        await writer.aclose()


async def test_aclose_flushes_and_stops(store: CountingStore) -> None:
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


async def test_aclose_without_run_commits_inline(store: CountingStore) -> None:
    writer = TranscriptWriter(store)
    writer.submit(append(S1, 1))
    await writer.aclose()
    assert store.raw_events(S1) == [b'{"id":1}']
    await writer.run()  # a loop started after aclose() returns at once


async def test_cancelled_writer_still_commits_what_was_queued(store: CountingStore) -> None:
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        for i in range(1, 21):
            writer.submit(append(S1, i))
        nursery.cancel_scope.cancel()
    assert len(store.raw_events(S1)) == 20
    assert writer.durable_event_id(S1) == 20


async def test_wait_committed_rejects_unknown_seq(store: CountingStore) -> None:
    writer = TranscriptWriter(store)
    with pytest.raises(ValueError):
        await writer.wait_committed(1)
    assert await writer.wait_committed(0) is True


async def test_waiters_on_one_batch_all_wake(store: CountingStore) -> None:
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
        store: CountingStore) -> None:
    """A real read-only failure from SQLite (query_only: every write is refused the way a
    read-only file refuses it, even for root, whom file permissions do not stop)."""
    writer = TranscriptWriter(store)
    async with trio.open_nursery() as nursery:
        await start(nursery, writer)
        store._conn.execute("PRAGMA query_only=ON")
        refused = writer.submit(append(S1, 1))
        assert await writer.wait_committed(refused) is False
        assert writer.failed_sessions == {S1} and writer.degraded
        assert writer.last_error is not None and "readonly" in writer.last_error
        store._conn.execute("PRAGMA query_only=OFF")
        later = writer.submit(append(S2, 1))
        assert await writer.wait_committed(later) is True
        assert writer.durable_event_id(S2) == 1 and writer.durable_event_id(S1) == 0
        await writer.aclose()
