"""Shipping the transcript to Redis: every op of an owned session, in order, fenced by the
lease generation. Trio shell over :mod:`daemon.core.cluster`.

The transcript writer hands every op it is given to its replicas as well as to the local store
(:class:`daemon.transcript_writer.Replica`); :class:`Shipping` is the cluster's. Per session and
in order, one fenced script call per batch appends the ops to the op log (``tk:{id}:ops``, the
transcript every node can read) and, for the events of the current bus, to the session's event
stream (``tk:{id}:events``, at most the ring's events); a turn's end compacts the turn's raw
events away. An op counts as acknowledged once Redis has it; ``durableEventId`` is the newest
event Redis acknowledged. A batch Redis does not answer is retried until it does (the op log
never gets a hole); a fenced one means the session is lost here.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from sdk.protocol.http import TranscriptRecovery

from ..clock import now_ms
from ..core.cluster import (
    Compaction,
    LogTail,
    append_args,
    compact_ops,
    encode_op,
    event_run,
    session_keys,
    stream_keep_from,
)
from ..core.transcript_ops import AppendEvent, FinishTurn, MarkClosed, Op, UpsertSession
from ._membership import Membership
from ._redis import ClusterUnavailable, Redis

if TYPE_CHECKING:
    from ..bus import SessionBus

log = logging.getLogger("daemon.cluster")


@dataclass
class OpLog:
    """What this node knows of an owned session's op log in Redis."""

    length: int  # as this node's appends left it
    epoch: str | None = None  # the current bus's epoch once its UpsertSession was shipped
    tail: LogTail = field(default_factory=lambda: LogTail(0))  # since the last turn boundary


@dataclass(frozen=True)
class _Pending:
    seq: int
    op: Op
    local_only: bool  # a placeholder keeping the ack sequence contiguous (see accept)

    @property
    def session_id(self) -> str:
        return self.op.session_id


class Shipping:
    """The cluster's replica of the transcript writer (see the module docstring)."""

    def __init__(self, redis: Redis, membership: Membership, events_cap: int,
                 bus_for: Callable[[str], SessionBus | None]) -> None:
        self.redis = redis
        self.membership = membership
        self.events_cap = events_cap
        self.bus_for = bus_for  # a session's live bus here (its epoch and ring), if any
        lease_s = membership.lease_s
        # An admission Redis has not taken within half a lease is refused (the 202 is not
        # given): the client asks again, on whichever node owns the session by then.
        self.admission_bound_s: float | None = lease_s / 2
        # A terminal waits at most two leases for Redis (10 s at most, as on a single node),
        # then the session is degraded until Redis has caught up.
        self.durable_bound_s: float | None = min(10.0, 2 * lease_s)
        self.logs: dict[str, OpLog] = {}
        self.durable: dict[str, int] = {}
        self.lagging: dict[str, int] = {}  # session -> the seq Redis must acknowledge
        # session -> (since when, its newest event then, its durableEventId then) while lagging
        self._lag_start: dict[str, tuple[int, int, int]] = {}
        self.recoveries: dict[str, TranscriptRecovery] = {}  # each session's newest one
        self._pending: deque[_Pending] = deque()
        self._shipping: frozenset[str] = frozenset()  # sessions of the batch being shipped
        self._wakeup = trio.Event()
        self._progress = trio.Event()
        self._resolved = 0
        self._failed_seqs: set[int] = set()
        self._last_seq = 0
        self.appends = 0
        self.appends_fenced = 0
        self.compactions = 0
        membership.on_claimed.append(self._claimed)
        membership.on_lost.append(self._forget)

    def _claimed(self, session_id: str, log_length: int) -> None:
        # What the log holds already is compacted at a takeover (compact_log); this node's
        # own turns are compacted as they end.
        self.logs[session_id] = OpLog(log_length, tail=LogTail(log_length))

    def _forget(self, session_id: str) -> None:
        self.logs.pop(session_id, None)
        self.recoveries.pop(session_id, None)
        lagged = self._lag_start.pop(session_id, None)
        if self.lagging.pop(session_id, None) is not None and lagged is not None:
            # Lost while lagging: what this node published that Redis never took is gone.
            bus = self.bus_for(session_id)
            newest = bus.ring.last_id if bus is not None else lagged[1]
            log.warning("event=transcript_not_recovered session=%s lost_events=%d "
                        "durable_event_id=%d", session_id,
                        max(0, newest - self.durable.get(session_id, 0)),
                        self.durable.get(session_id, 0))

    def recovery(self, session_id: str) -> TranscriptRecovery | None:
        """The session's newest recovery from lagging behind Redis (see hold_back)."""
        return self.recoveries.get(session_id)

    # -- the writer's replica -------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def accept(self, seq: int, op: Op, *, local_only: bool = False) -> None:
        """The writer's op ``seq``, queued for Redis. ``local_only``: an op that stays in the
        local store (the op log of a session taken over, replayed here): only its place in
        the sequence is kept."""
        self._last_seq = seq
        self._pending.append(_Pending(seq, op, local_only))
        self._wakeup.set()

    async def wait_acked(self, seq: int) -> bool:
        while self._resolved < seq:
            await self._progress.wait()
        return seq not in self._failed_seqs

    def acked(self, seq: int) -> bool | None:
        """Is op ``seq`` in Redis (``None``: not resolved yet; ``False``: fenced)?"""
        if self._resolved < seq:
            return None
        return seq not in self._failed_seqs

    def idle(self, session_id: str) -> bool:
        """Nothing of ``session_id`` waits to be shipped or is being shipped."""
        return session_id not in self._shipping \
            and not any(p.session_id == session_id for p in self._pending)

    def durable_event_id(self, session_id: str) -> int:
        return self.durable.get(session_id, 0)

    def reset_durable(self, session_id: str) -> None:
        self.durable.pop(session_id, None)

    def is_lagging(self, session_id: str) -> bool:
        return session_id in self.lagging

    def hold_back(self, session_id: str, seq: int, why: str) -> bool:
        """A commit up to ``seq`` did not finish in time: True when Redis has not answered
        it yet, so the session counts as lagging (degraded) until it does, and nothing is
        latched; False when Redis answered (the local store is what lags)."""
        if self.acked(seq) is not None:
            return False
        if session_id not in self.lagging:
            log.warning("event=transcript_lagging session=%s reason=redis_not_acknowledging "
                        "error=%r", session_id, why)
            bus = self.bus_for(session_id)
            self._lag_start[session_id] = (now_ms(), bus.ring.last_id if bus is not None else 0,
                                           self.durable.get(session_id, 0))
        self.lagging[session_id] = seq
        return True

    def _resolve(self, upto: int, failed: list[int]) -> None:
        self._failed_seqs.update(failed)
        self._resolved = max(self._resolved, upto)
        self._progress.set()
        self._progress = trio.Event()
        for session_id, seq in list(self.lagging.items()):
            if seq <= self._resolved:
                del self.lagging[session_id]
                self._recovered(session_id)

    def _recovered(self, session_id: str) -> None:
        """Redis caught up with the session: say what it lost, if anything (in the log and in
        the session's status): the events it had published when it started lagging that Redis
        still does not hold."""
        lagged_at, newest, durable_then = self._lag_start.pop(session_id, (now_ms(), 0, 0))
        durable = self.durable.get(session_id, 0)
        recovery = TranscriptRecovery(
            lagged_at=lagged_at, recovered_at=now_ms(),
            caught_up_events=max(0, durable - durable_then),
            lost_events=max(0, newest - durable))
        self.recoveries[session_id] = recovery
        log.warning("event=transcript_recovered session=%s lagged_ms=%d caught_up_events=%d "
                    "lost_events=%d", session_id, recovery.recovered_at - lagged_at,
                    recovery.caught_up_events, recovery.lost_events)

    # -- the loop ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        while True:
            if not self._pending:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            batch = list(self._pending)
            self._pending.clear()
            failed: list[int] = []
            by_session: dict[str, list[_Pending]] = {}
            for item in batch:
                by_session.setdefault(item.session_id, []).append(item)
            self._shipping = frozenset(by_session)
            try:
                for session_id, items in by_session.items():
                    if not await self._ship_with_retry(session_id, items):
                        failed += [item.seq for item in items]
            finally:
                self._shipping = frozenset()
            self._resolve(batch[-1].seq, failed)

    async def _ship_with_retry(self, session_id: str, items: list[_Pending]) -> bool:
        """Ship one session's ops; Redis unreachable or failing is retried (with a growing
        pause, up to a second) until it answers, so the op log never gets a hole: nothing
        after a failed batch can land before it. Only fencing ends it with ``False``."""
        pause = 0.05
        progress = [0]  # items already in Redis: a retry starts after them
        while True:
            try:
                return await self._ship_session(session_id, items, progress)
            except Exception as exc:
                log.warning("event=cluster_append_failed session=%s error=%r retry_s=%.2f",
                            session_id, exc, pause)
            await trio.sleep(pause)
            pause = min(1.0, pause * 2)

    async def _ship_session(self, session_id: str, items: list[_Pending],
                            progress: list[int]) -> bool:
        """Ship ``items[progress[0]:]``: one fenced script call per stretch between two
        UpsertSessions (each of which first claims or sets the new bus's epoch). ``progress``
        is advanced past every stretch Redis confirmed, so a retry after an error repeats
        none of them."""
        if all(item.local_only for item in items):
            return True
        if session_id in self.membership.fenced:
            return False
        ops: list[Op] = []
        runs: list[tuple[int, int, bytes]] = []
        last_event = 0
        closed = False
        for index in range(progress[0], len(items)):
            item = items[index]
            if item.local_only:
                continue
            op = item.op
            if isinstance(op, UpsertSession):
                if not await self._flush(session_id, ops, runs, last_event):
                    return False
                progress[0] = index
                ops, runs, last_event = [], [], 0
                if not await self._start_bus(session_id, op, items[index + 1:]):
                    return False
            ops.append(op)
            oplog = self.logs.get(session_id)
            if isinstance(op, AppendEvent) and oplog is not None and oplog.epoch is not None:
                runs.append(event_run(op))
                last_event = op.event_id
            if isinstance(op, MarkClosed):
                closed = True
            if isinstance(op, FinishTurn):
                # The turn boundary ends a stretch: once Redis has it, the turn's raw events
                # are compacted away (a script of their own, retried until it answers).
                # (the compaction runs before the FinishTurn counts as acknowledged: a
                # terminal shown, see Session._finish, means a compacted log)
                if not await self._flush(session_id, ops, runs, last_event):
                    return False
                progress[0] = index + 1
                ops, runs, last_event = [], [], 0
        if not await self._flush(session_id, ops, runs, last_event):
            return False
        progress[0] = len(items)  # all in Redis: a retry (of the release) resends nothing
        if closed or any(isinstance(item.op, MarkClosed) and not item.local_only
                         for item in items):
            await self.membership.release(session_id, closed=True)
        return True

    async def _start_bus(self, session_id: str, op: UpsertSession, rest: list[_Pending]) -> bool:
        """An UpsertSession starts a bus (a new session here, or a restore): claim the lease
        if this node does not hold it yet, and publish the bus's epoch and first event id."""
        bus = self.bus_for(session_id)
        epoch = bus.epoch if bus is not None else ""
        base = next((event_run(p.op)[0] for p in rest
                     if not p.local_only and isinstance(p.op, AppendEvent)),
                    bus.ring.next_id if bus is not None else 1)
        membership = self.membership
        if not membership.owns(session_id):
            if await membership.claim(session_id, op.workspace_cwd, epoch) is None:
                membership.lost(session_id, "claimed elsewhere")
                return False
        generation = membership.generation(session_id)
        oplog = self.logs.get(session_id)
        if generation is None or oplog is None:
            return False
        keys = session_keys(session_id)
        ok = await self.redis.call(lambda: self.redis.scripts.set_epoch(
            keys=[keys.directory, keys.lease],
            args=[membership.node_id, generation, epoch, base]))
        if not int(ok):
            membership.lost(session_id, "epoch refused")
            return False
        oplog.epoch = epoch
        return True

    async def _flush(self, session_id: str, ops: list[Op],
                     runs: list[tuple[int, int, bytes]], last_event: int) -> bool:
        if not ops:
            return True
        generation = self.membership.generation(session_id)
        oplog = self.logs.get(session_id)
        if generation is None or oplog is None:
            return False
        keys = session_keys(session_id)
        keep_from = 0
        if runs:
            bus = self.bus_for(session_id)
            keep_from = stream_keep_from(bus.ring.first_id if bus is not None else None,
                                         runs[-1][1], self.events_cap)
        args = append_args(self.membership.node_id, generation, oplog.epoch or "", keep_from, oplog.length,
                           [encode_op(op) for op in ops], runs,
                           self.membership.idle_retention_ms)
        ok = await self.redis.call(lambda: self.redis.scripts.append(
            keys=[keys.directory, keys.ops, keys.events], args=args))
        self.appends += 1
        if int(ok) != 1:
            self.appends_fenced += 1
            self.membership.lost(session_id,
                                 "append fenced" if int(ok) == 0 else "op log diverged")
            return False
        oplog.length += len(ops)
        if last_event:
            self.durable[session_id] = max(self.durable.get(session_id, 0), last_event)
        compaction = None
        for op in ops:  # a stretch holds at most one FinishTurn, as its last op
            compaction = oplog.tail.add(op) or compaction
        if compaction is not None:
            return await self._compact(session_id, generation, oplog, compaction)
        return True

    async def _compact(self, session_id: str, generation: int, oplog: OpLog,
                       compaction: Compaction) -> bool:
        """Run one compaction of the op log, retried (like an append) until Redis answers:
        its outcome decides the log's length the next append expects."""
        keys = session_keys(session_id)
        pause = 0.05
        while True:
            try:
                ok = await self.redis.call(lambda: self.redis.scripts.compact(
                    keys=[keys.directory, keys.ops],
                    args=compaction.args(self.membership.node_id, generation)))
                break
            except Exception as exc:
                log.warning("event=cluster_compact_failed session=%s error=%r retry_s=%.2f",
                            session_id, exc, pause)
            await trio.sleep(pause)
            pause = min(1.0, pause * 2)
        if int(ok) != 1:
            self.membership.lost(session_id, "compaction fenced" if int(ok) == 0
                                 else "op log diverged")
            return False
        oplog.length = compaction.new_length
        self.compactions += 1
        return True

    async def compact_log(self, session_id: str, ops: list[Op]) -> list[Op]:
        """At a takeover: compact the whole op log just read (what its previous owner left
        uncompacted: the interrupted turn's raw events stay, a finished turn's go) and set the
        tail this node appends after. The ops kept, which replay to the same transcript."""
        generation = self.membership.generation(session_id)
        oplog = self.logs.get(session_id)
        if generation is None or oplog is None:
            # Lost or let go while its op log was read: a 503, and the client asks again.
            raise ClusterUnavailable(f"{session_id} was lost during its takeover")
        keep = compact_ops(ops)
        kept = [ops[i] for i in keep]
        if len(keep) < len(ops) and not await self._compact(
                session_id, generation, oplog, Compaction(0, len(ops), tuple(keep))):
            # Another writer moved the log meanwhile: a 503, and the client asks again.
            raise ClusterUnavailable(f"the op log of {session_id} changed during its takeover")
        tail = LogTail.of(kept)
        oplog.tail = tail
        oplog.length = tail.start + tail.length
        return kept
