"""Cluster mode: many daemons on one Redis (or a Redis Cluster). Trio shell over coredis.

Imported only when the daemon starts with ``--cluster-redis``: single-node mode never loads
coredis. The rules (keys, scripts, routing) are the pure :mod:`daemon.core.cluster`; this module
runs them:

- :class:`ClusterNode` connects (refusing a Redis without AOF before the daemon serves
  anything), registers the node, renews the leases of the sessions it owns, and ships every
  transcript op of an owned session to Redis in order, fenced by the lease generation: the op
  log (``tk:{id}:ops``, the transcript every node can read) and, for the events of the current
  bus, the session's event stream (``tk:{id}:events``, capped at the ring size).
- :class:`ClusterWriter` is the transcript writer of a cluster node: the local SQLite store as
  in single-node mode plus the Redis shipping; ``durableEventId`` is what Redis acknowledged.
- :class:`ClusterRouter` sits in front of the app (``DaemonASGI``): a request for a session
  this node does not run is forwarded to its owner, answered ``503`` while a dead owner's lease
  runs, or takes the session over once the lease is gone (the op log is replayed into the local
  store and the single-node cold restore runs on it); an event stream of a session owned
  elsewhere is served from a mirror of its Redis stream with the single-node stream code.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

import coredis
import httpx
import trio

from sdk.protocol.http import view_session_id

from .bus import SessionBus, Subscription, now_ms
from .core.cluster import (
    APPEND_SCRIPT,
    CLAIM_SCRIPT,
    CLOSED_RETENTION_MS,
    COMPACT_SCRIPT,
    IDLE_RETENTION_MS,
    READERS_FRESH_MS,
    READERS_GET_SCRIPT,
    READERS_REFRESH_MS,
    READERS_SET_SCRIPT,
    RELEASE_SCRIPT,
    RENEW_SCRIPT,
    SET_EPOCH_SCRIPT,
    Compaction,
    DirectoryEntry,
    Forward,
    Local,
    LogTail,
    TakeOver,
    Unavailable,
    Unknown,
    append_args,
    compact_ops,
    decode_op,
    encode_op,
    event_run,
    node_key,
    node_ttl_ms,
    readers_by_node,
    renew_interval_ms,
    route,
    session_keys,
    split_run,
)
from .core.envelope import Event, decode_json, encode_json, synthetic
from .core.ring import EventRing
from .core.transcript_ops import (
    AppendEvent,
    DeleteSession,
    FinishTurn,
    MarkClosed,
    Op,
    UpsertSession,
)
from .manager import _KeyedLocks
from .transcript_store import TranscriptStore
from .transcript_writer import TranscriptWriter

log = logging.getLogger("daemon.cluster")
# coredis logs each EVALSHA that falls back to EVAL (a script's first use on a server) and httpx
# each forwarded request at info: the daemon's own lines say what matters.
logging.getLogger("coredis").setLevel(logging.WARNING)
logging.getLogger("httpx").setLevel(logging.WARNING)

# A forwarded request is answered by the owner from memory or its local store; one that is not
# answered in this time counts as an owner that does not answer (503 while its lease runs).
FORWARD_TIMEOUT = httpx.Timeout(10.0, connect=2.0)
FORWARDED_HEADER = "x-turnkeeper-forwarded"
# Hop-by-hop headers and those the HTTP client sets itself.
_DROP_REQUEST = frozenset({"host", "content-length", "connection", "keep-alive",
                           "transfer-encoding", "upgrade", FORWARDED_HEADER})
_DROP_RESPONSE = frozenset({"content-length", "connection", "keep-alive", "transfer-encoding",
                            "date", "server"})
SESSION_PATH_PREFIX = "/session/"
MIRROR_BLOCK_MS = 500
READERS_LOOKUP_S = 0.2
TERMINAL_SESSION_EVENTS = frozenset({b"session_closed", b"session_died"})


class ClusterStartError(Exception):
    """The node cannot join the cluster (the message is the one-line reason)."""


@dataclass
class Owned:
    """A session this node owns: its lease generation and what has been set up in Redis."""

    generation: int
    log_len: int  # the op log's length in Redis, as this node's appends left it
    epoch: str | None = None  # the current bus's epoch once its UpsertSession was shipped
    tail: LogTail = field(default_factory=lambda: LogTail(0))  # since the last turn boundary


@dataclass(frozen=True)
class LocalOnly:
    """A placeholder in the shipping queue for an op that stays in the local store (the op
    log of a session taken over, replayed here): it keeps the ack sequence contiguous."""

    session_id: str


@dataclass
class _Pending:
    seq: int
    op: Op | LocalOnly


class MirrorBus(SessionBus):
    """A writer-less bus whose ring is fed from a remote owner's Redis stream. At a takeover
    it moves to the new owner's epoch in place: every reader keeps its stream, is sent the
    resync a client with the old epoch would get on reconnecting, and reads on from the new
    epoch's first event."""

    def __init__(self, session_id: str, limits: Any, epoch: str, first_id: int) -> None:
        super().__init__(session_id, limits, None, first_id=first_id)
        self.epoch = epoch
        self._resyncs: dict[Subscription, Event] = {}
        self.readers_changed = trio.Event()  # set when a reader comes or goes

    def switch_epoch(self, epoch: str, first_id: int) -> None:
        old = self.ring
        self.ring = EventRing(old.capacity, next_id=max(1, first_id), max_bytes=old.max_bytes)
        self.epoch = epoch
        self.frames.clear()  # built for the old epoch's ids
        stamp = now_ms()
        for sub in self.subscribers:
            state = sub.state
            self._resyncs[sub] = synthetic("state_resync_required", {
                "reason": "epoch_reset", "detail": "epoch_mismatch",
                "lastDeliveredId": state.cursor, "earliestAvailableId": self.ring.next_id,
            }, now_ms=stamp)
            state.cursor = self.ring.next_id - 1
        self._dirty = True
        self.flush()

    def take_resync(self, sub: Subscription) -> Event | None:
        return self._resyncs.pop(sub, None)

    def add_subscriber(self, sub: Subscription) -> None:
        super().add_subscriber(sub)
        self.readers_changed.set()

    def remove_subscriber(self, sub: Subscription) -> None:
        self._resyncs.pop(sub, None)
        super().remove_subscriber(sub)
        self.readers_changed.set()


@dataclass
class Mirror:
    """The local view of a remote owner's event stream: a writer-less bus whose ring is fed
    from Redis, so the single-node SSE/WebSocket code serves it unchanged."""

    bus: MirrorBus
    stream_pos: str
    done: trio.Event = field(default_factory=trio.Event)


async def _decode_hash(raw: dict[Any, Any]) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else str(k)):
            (v.decode() if isinstance(v, bytes) else str(v)) for k, v in raw.items()}


class ClusterNode:
    """This daemon's membership of the cluster (owned by the server's root nursery)."""

    def __init__(self, url: str, node_id: str, node_url: str, lease_ms: int,
                 events_cap: int, *, idle_retention_ms: int = IDLE_RETENTION_MS,
                 closed_retention_ms: int = CLOSED_RETENTION_MS) -> None:
        self.url = url
        self.idle_retention_ms = idle_retention_ms
        self.closed_retention_ms = closed_retention_ms
        self.node_id = node_id
        self.node_url = node_url
        self.lease_ms = lease_ms
        self.events_cap = events_cap
        self.client: coredis.Redis[bytes] | coredis.RedisCluster[bytes] | None = None
        self.is_cluster = False
        self.owned: dict[str, Owned] = {}
        self.busy: set[str] = set()  # sessions being taken over here (owned, not yet running)
        self.fenced: set[str] = set()
        self.durable: dict[str, int] = {}
        self.manager: Any = None  # daemon.manager.SessionManager, set by attach()
        self._pending: deque[_Pending] = deque()
        self._wakeup = trio.Event()
        self._progress = trio.Event()
        self._resolved = 0
        self._failed_seqs: set[int] = set()
        self._last_seq = 0
        self.appends = 0
        self.appends_fenced = 0
        self.compactions = 0

    def attach(self, manager: Any) -> None:
        self.manager = manager

    # -- start-up ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            probe: coredis.Redis[bytes] = coredis.Redis.from_url(self.url)
            async with probe:
                info = await probe.info("cluster")
                self.is_cluster = str(info.get("cluster_enabled", 0)) == "1"
                targets = [(None, None)] if not self.is_cluster else [
                    (node["host"], int(node["port"])) for node in await probe.cluster_nodes()
                    if "master" in str(node.get("flags", ""))]
                if not self.is_cluster:
                    await self._check_aof(probe, self.url)
            if self.is_cluster:
                for host, port in targets:
                    one: coredis.Redis[bytes] = coredis.Redis(host=str(host), port=int(port or 0))
                    async with one:
                        await self._check_aof(one, f"{host}:{port}")
        except Exception as raised:
            exc = _leaf(raised)  # coredis' task groups wrap what went wrong
            if isinstance(exc, ClusterStartError):
                raise exc from None
            raise ClusterStartError(
                f"cannot join the cluster at {self.url}: {type(exc).__name__}: {exc}") from None
        client = self.new_client()
        async with client:
            self.client = client
            self._claim = client.register_script(CLAIM_SCRIPT)
            self._renew = client.register_script(RENEW_SCRIPT)
            self._append = client.register_script(APPEND_SCRIPT)
            self._set_epoch = client.register_script(SET_EPOCH_SCRIPT)
            self._release = client.register_script(RELEASE_SCRIPT)
            self._compact = client.register_script(COMPACT_SCRIPT)
            self._readers_set = client.register_script(READERS_SET_SCRIPT)
            self._readers_get = client.register_script(READERS_GET_SCRIPT)
            await self._register()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._ship_loop)
                nursery.start_soon(self._renew_loop)
                log.info("event=cluster_joined node=%s redis_cluster=%s lease_ms=%d",
                         self.node_id, self.is_cluster, self.lease_ms)
                task_status.started()

    def new_client(self) -> coredis.Redis[bytes] | coredis.RedisCluster[bytes]:
        """A client of the cluster's Redis with connections of its own."""
        if self.is_cluster:
            return coredis.RedisCluster.from_url(self.url)
        return coredis.Redis.from_url(self.url)

    @staticmethod
    async def _check_aof(client: coredis.Redis[bytes], where: str) -> None:
        got = await client.config_get(["appendonly"])
        value = got.get(b"appendonly", b"")
        if value != b"yes":
            raise ClusterStartError(
                f"Redis at {where} has AOF persistence off (appendonly {value.decode() or 'unknown'}): cluster mode "
                "keeps the transcript there and refuses to run without it "
                "(CONFIG SET appendonly yes, or appendonly yes in redis.conf)")

    async def _register(self) -> None:
        assert self.client is not None
        key = node_key(self.node_id)
        await self.client.hset(key, {"url": self.node_url})
        await self.client.pexpire(key, node_ttl_ms(self.lease_ms))

    # -- leases -----------------------------------------------------------------------------

    async def claim(self, session_id: str, workspace: str, epoch: str) -> int | None:
        """Take the session's lease; its new generation, or ``None`` if another node has it."""
        keys = session_keys(session_id)
        result: Any = await self._claim(
            keys=keys.all(),
            args=[self.node_id, self.node_url, workspace, epoch, self.lease_ms,
                  self.idle_retention_ms])
        ok, value = int(result[0]), int(result[1])
        if not ok:
            return None
        log_len = int(result[2])
        # What the log holds already is compacted at a takeover (compact_log); this node's
        # own turns are compacted as they end.
        self.owned[session_id] = Owned(value, log_len, tail=LogTail(log_len))
        self.fenced.discard(session_id)
        log.info("event=lease_claimed session=%s generation=%d", session_id, value)
        return value

    async def _renew_loop(self) -> None:
        period = renew_interval_ms(self.lease_ms) / 1000
        while True:
            await trio.sleep(period)
            try:
                await self._register()
                for session_id, owned in list(self.owned.items()):
                    keys = session_keys(session_id)
                    if not self._runs(session_id) and session_id not in self.busy \
                            and self._ship_idle(session_id):
                        await self.release(session_id, closed=False)
                        continue
                    ok: Any = await self._renew(keys=keys.all(), args=[
                        self.node_id, owned.generation, self.lease_ms, self.idle_retention_ms])
                    if not int(ok):
                        self._lost(session_id, "renew refused")
            except Exception as exc:  # Redis unreachable for a moment: the next round retries
                log.warning("event=lease_renew_failed error=%r", exc)

    def _runs(self, session_id: str) -> bool:
        return self.manager is not None and session_id in self.manager.sessions

    def _ship_idle(self, session_id: str) -> bool:
        return not any(p.op.session_id == session_id for p in self._pending)

    async def release(self, session_id: str, *, closed: bool) -> None:
        owned = self.owned.pop(session_id, None)
        if owned is None:
            return
        keys = session_keys(session_id)
        await self._release(keys=keys.all(), args=[
            self.node_id, owned.generation, "1" if closed else "0", self.closed_retention_ms])
        log.info("event=lease_released session=%s closed=%s", session_id, closed)

    def _lost(self, session_id: str, why: str) -> None:
        """Another node owns the session now: nothing of it may be written here again, and
        the local copy ends (its late events reach nobody but its own local readers)."""
        if session_id in self.fenced:
            return
        self.fenced.add(session_id)
        self.owned.pop(session_id, None)
        log.warning("event=lease_lost session=%s reason=%s", session_id, why)
        manager = self.manager
        session = manager.sessions.get(session_id) if manager is not None else None
        if session is not None:
            session.bus.close()
            manager.nursery.start_soon(session.close, "lease_lost")

    async def release_all(self) -> None:
        """Graceful stop: ship what is queued, then give every lease up at once."""
        with trio.move_on_after(2):
            await self.wait_acked(self._last_seq)
        for session_id in list(self.owned):
            with trio.move_on_after(1):
                await self.release(session_id, closed=False)

    # -- shipping the transcript ------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def enqueue(self, seq: int, op: Op | LocalOnly) -> None:
        self._last_seq = seq
        self._pending.append(_Pending(seq, op))
        self._wakeup.set()

    async def wait_acked(self, seq: int) -> bool:
        while self._resolved < seq:
            await self._progress.wait()
        return seq not in self._failed_seqs

    def _resolve(self, upto: int, failed: list[int]) -> None:
        self._failed_seqs.update(failed)
        self._resolved = max(self._resolved, upto)
        self._progress.set()
        self._progress = trio.Event()

    async def _ship_loop(self) -> None:
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
                by_session.setdefault(item.op.session_id, []).append(item)
            for session_id, items in by_session.items():
                if not await self._ship_with_retry(session_id, items):
                    failed += [item.seq for item in items]
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
        if all(isinstance(item.op, LocalOnly) for item in items):
            return True
        if session_id in self.fenced:
            return False
        ops: list[Op] = []
        runs: list[tuple[int, int, bytes]] = []
        last_event = 0
        closed = False
        for index in range(progress[0], len(items)):
            op = items[index].op
            if isinstance(op, LocalOnly):
                continue
            if isinstance(op, UpsertSession):
                if not await self._flush(session_id, ops, runs, last_event):
                    return False
                progress[0] = index
                ops, runs, last_event = [], [], 0
                if not await self._start_bus(session_id, op, items[index + 1:]):
                    return False
            ops.append(op)
            owned = self.owned.get(session_id)
            if isinstance(op, AppendEvent) and owned is not None and owned.epoch is not None:
                runs.append(event_run(op))
                last_event = op.event_id
            if isinstance(op, MarkClosed):
                closed = True
            if isinstance(op, FinishTurn):
                # The turn boundary ends a stretch: once Redis has it, the turn's raw events
                # are compacted away (a script of their own, retried until it answers).
                if not await self._flush(session_id, ops, runs, last_event):
                    return False
                progress[0] = index + 1
                ops, runs, last_event = [], [], 0
        if not await self._flush(session_id, ops, runs, last_event):
            return False
        if closed:
            await self.release(session_id, closed=True)
        return True

    async def _start_bus(self, session_id: str, op: UpsertSession, rest: list[_Pending]) -> bool:
        """An UpsertSession starts a bus (a new session here, or a restore): claim the lease
        if this node does not hold it yet, and publish the bus's epoch and first event id."""
        session = self.manager.sessions.get(session_id) if self.manager is not None else None
        epoch = session.bus.epoch if session is not None else ""
        base = next((event_run(p.op)[0] for p in rest if isinstance(p.op, AppendEvent)),
                    session.bus.ring.next_id if session is not None else 1)
        owned = self.owned.get(session_id)
        if owned is None:
            generation = await self.claim(session_id, op.workspace_cwd, epoch)
            if generation is None:
                self._lost(session_id, "claimed elsewhere")
                return False
            owned = self.owned[session_id]
        keys = session_keys(session_id)
        ok: Any = await self._set_epoch(keys=[keys.directory, keys.lease],
                                   args=[self.node_id, owned.generation, epoch, base])
        if not int(ok):
            self._lost(session_id, "epoch refused")
            return False
        owned.epoch = epoch
        return True

    async def _flush(self, session_id: str, ops: list[Op],
                     runs: list[tuple[int, int, bytes]], last_event: int) -> bool:
        if not ops:
            return True
        owned = self.owned.get(session_id)
        if owned is None:
            return False
        keys = session_keys(session_id)
        ok: Any = await self._append(
            keys=[keys.directory, keys.ops, keys.events],
            args=append_args(owned.generation, owned.epoch or "", self.events_cap,
                             owned.log_len, [encode_op(op) for op in ops], runs,
                             self.idle_retention_ms))
        self.appends += 1
        if int(ok) != 1:
            self.appends_fenced += 1
            self._lost(session_id, "append fenced" if int(ok) == 0 else "op log diverged")
            return False
        owned.log_len += len(ops)
        if last_event:
            self.durable[session_id] = max(self.durable.get(session_id, 0), last_event)
        compaction = None
        for op in ops:  # a stretch holds at most one FinishTurn, as its last op
            compaction = owned.tail.add(op) or compaction
        if compaction is not None:
            return await self.compact(session_id, owned, compaction)
        return True

    async def compact(self, session_id: str, owned: Owned, compaction: Compaction) -> bool:
        """Run one compaction of the op log, retried (like an append) until Redis answers:
        its outcome decides the log's length the next append expects."""
        keys = session_keys(session_id)
        pause = 0.05
        while True:
            try:
                ok: Any = await self._compact(keys=[keys.directory, keys.ops],
                                              args=compaction.args(owned.generation))
                break
            except Exception as exc:
                log.warning("event=cluster_compact_failed session=%s error=%r retry_s=%.2f",
                            session_id, exc, pause)
            await trio.sleep(pause)
            pause = min(1.0, pause * 2)
        if int(ok) != 1:
            self._lost(session_id, "compaction fenced" if int(ok) == 0 else "op log diverged")
            return False
        owned.log_len = compaction.new_length
        self.compactions += 1
        return True

    async def compact_log(self, session_id: str, ops: list[Op]) -> list[Op]:
        """At a takeover: compact the whole op log just read (what its previous owner left
        uncompacted: the interrupted turn's raw events stay, a finished turn's go) and set the
        tail this node appends after. The ops kept, which replay to the same transcript."""
        owned = self.owned[session_id]
        keep = compact_ops(ops)
        kept = [ops[i] for i in keep]
        if len(keep) < len(ops) and not await self.compact(
                session_id, owned, Compaction(0, len(ops), tuple(keep))):
            raise RuntimeError(f"the op log of {session_id} changed during its takeover")
        tail = LogTail.of(kept)
        owned.tail = tail
        owned.log_len = tail.start + tail.length
        return kept

    # -- reading ----------------------------------------------------------------------------

    async def lookup(self, session_id: str) -> tuple[DirectoryEntry | None, int, dict[str, str]]:
        """The directory entry, the lease's remaining ms (negative: none) and the raw hash."""
        assert self.client is not None
        keys = session_keys(session_id)
        fields = await _decode_hash(await self.client.hgetall(keys.directory))
        pttl = int(await self.client.pttl(keys.lease))
        return DirectoryEntry.from_hash(fields), pttl, fields

    async def readers(self, session_id: str, own: int) -> dict[str, int]:
        """The session's subscribers per node: ``own`` here (the owner) and what the mirrors
        on other nodes report (see ``READERS_GET_SCRIPT``)."""
        flat: Any = []
        # A status must not wait for a Redis that does not answer (paused, partitioned): past
        # READERS_LOOKUP_S it shows the owner's own readers only.
        with trio.move_on_after(READERS_LOOKUP_S):
            try:
                flat = await self._readers_get(keys=[session_keys(session_id).readers],
                                               args=[READERS_FRESH_MS])
            except Exception as exc:  # Redis away: the owner's own count still answers
                log.warning("event=mirror_readers_failed session=%s error=%r", session_id, exc)
        return readers_by_node(list(flat), self.node_id, own)

    async def report_readers(self, session_id: str, count: int) -> None:
        await self._readers_set(keys=[session_keys(session_id).readers],
                                args=[self.node_id, count, READERS_FRESH_MS])

    async def op_log(self, session_id: str) -> list[Op]:
        assert self.client is not None
        raw = await self.client.lrange(session_keys(session_id).ops, 0, -1)
        return [decode_op(item) for item in raw]


class ClusterWriter(TranscriptWriter):
    """The transcript writer of a cluster node: the local store (restore, pages and loads
    read it as in single-node mode) and, for every op, the shipping to Redis. An op counts as
    committed once both have it; ``durableEventId`` is the newest event Redis acknowledged."""

    def __init__(self, store: TranscriptStore, node: ClusterNode) -> None:
        super().__init__(store)
        self.node = node

    def submit(self, op: Op) -> int:
        seq = super().submit(op)
        self.node.enqueue(seq, op)
        return seq

    def submit_local(self, op: Op) -> int:
        """Into the local store only (replaying the op log of a session taken over)."""
        seq = super().submit(op)
        self.node.enqueue(seq, LocalOnly(op.session_id))
        return seq

    async def wait_committed(self, seq: int) -> bool:
        local = await super().wait_committed(seq)
        shipped = await self.node.wait_acked(seq)
        return local and shipped

    def durable_event_id(self, session_id: str) -> int:
        return self.node.durable.get(session_id, 0)

    def reset_durable(self, session_id: str) -> None:
        super().reset_durable(session_id)
        self.node.durable.pop(session_id, None)


class ClusterRouter:
    """Routes session requests in front of the app (see the module docstring)."""

    def __init__(self, node: ClusterNode, manager: Any, writer: ClusterWriter) -> None:
        self.node = node
        self.manager = manager
        self.writer = writer
        self.http = httpx.AsyncClient(timeout=FORWARD_TIMEOUT)
        self.mirrors: dict[str, Mirror] = {}
        self._takeover_locks = _KeyedLocks()
        self.forwarded = 0
        self.takeovers = 0

    @staticmethod
    def session_id_of(path: str) -> str | None:
        if not path.startswith(SESSION_PATH_PREFIX):
            return None
        rest = path[len(SESSION_PATH_PREFIX):]
        session_id = rest.split("/", 1)[0]
        return session_id or None

    async def decide(self, session_id: str) -> Any:
        if self.manager.get(session_id) is not None:
            return Local()
        entry, pttl, _ = await self.node.lookup(session_id)
        return route(entry, pttl, self.node.node_id, live_here=False)

    async def take_over(self, session_id: str) -> bool:
        """Restore the session here after its owner's lease ran out: claim the lease, replay
        its op log into the local store, then the single-node cold restore."""
        async with self._takeover_locks.hold(session_id):
            if self.manager.get(session_id) is not None:
                return True
            entry, pttl, _ = await self.node.lookup(session_id)
            decision = route(entry, pttl, self.node.node_id, live_here=False)
            if not isinstance(decision, TakeOver) or entry is None:
                return False
            self.node.busy.add(session_id)
            try:
                generation = await self.node.claim(session_id, entry.workspace, entry.epoch)
                if generation is None:
                    return False
                ops = await self.node.compact_log(session_id,
                                                  await self.node.op_log(session_id))
                self.writer.submit_local(DeleteSession(session_id))
                for op in ops:
                    self.writer.submit_local(op)
                session = await self.manager.restore(session_id)
            finally:
                self.node.busy.discard(session_id)
            if session is None:
                await self.node.release(session_id, closed=False)
                return False
            self.takeovers += 1
            log.info("event=session_taken_over session=%s generation=%d previous_owner=%s "
                     "ops=%d", session_id, generation, entry.owner_node_id, len(ops))
            return True

    # -- the ASGI side ----------------------------------------------------------------------

    def wrap_send(self, method: str, path: str, send: Any) -> Any:
        """``POST /session`` answers once Redis holds what it created (the directory entry and
        the lease): a client may take the session id to any other node at once."""
        if method != "POST" or path != "/session":
            return send
        node = self.node

        async def send_when_shipped(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                with trio.move_on_after(FORWARD_TIMEOUT.connect or 2.0):
                    await node.wait_acked(node.last_seq)
            await send(message)

        return send_when_shipped

    async def handle(self, scope: MutableMapping[str, Any], receive: Any, send: Any,
                     headers: dict[str, str], body: bytes | None) -> bool:
        """Answer a request for a session this node does not run; False to let the app (or
        the local stream) answer it as in single-node mode."""
        session_id = self.session_id_of(scope["path"])
        if session_id is None and scope["path"] == "/session" and scope.get("method") == "POST" \
                and body:
            session_id = _requested_session_id(body)  # attach to a session of the cluster
        if session_id is None or headers.get(FORWARDED_HEADER) == "1":
            return False
        for _ in range(3):  # a takeover lost to another node is routed again
            entry, pttl, _fields = (None, -2, {}) if self.manager.get(session_id) is not None \
                else await self.node.lookup(session_id)
            decision = route(entry, pttl, self.node.node_id,
                             live_here=self.manager.get(session_id) is not None)
            if isinstance(decision, Local):
                return False
            if isinstance(decision, Unknown):
                if entry is None:
                    return False  # not in the cluster: the app answers (404)
                # Closed for good: never restored from a stale local copy.
                await _send_json(send, 404, {"error": f'No session with id "{session_id}"',
                                             "code": "session_not_found",
                                             "sessionId": session_id}, [])
                return True
            if isinstance(decision, TakeOver):
                if await self.take_over(session_id):
                    return False
                continue
            assert isinstance(decision, Forward)
            try:
                await self._forward(scope, send, headers, body or b"", decision)
                return True
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                log.info("event=owner_unreachable session=%s owner=%s error=%r", session_id,
                         decision.owner_node_id, exc)
            entry, pttl, _fields = await self.node.lookup(session_id)
            again = route(entry, pttl, self.node.node_id, live_here=False,
                          owner_unreachable=True)
            if isinstance(again, Unavailable):
                wait = again.retry_after_s
                await _send_json(send, 503, {
                    "error": "The session's node does not answer; retry once its lease "
                             "expires", "code": "session_owner_unavailable", "retryable": True,
                    "sessionId": session_id, "retryAfterMs": wait * 1000},
                    [(b"retry-after", str(wait).encode())])
                return True
        return False

    async def _forward(self, scope: MutableMapping[str, Any], send: Any,
                       headers: dict[str, str], body: bytes, target: Forward) -> None:
        query = scope.get("query_string", b"").decode("latin-1")
        url = target.node_url.rstrip("/") + scope["path"] + (f"?{query}" if query else "")
        out = {k: v for k, v in headers.items() if k not in _DROP_REQUEST}
        out[FORWARDED_HEADER] = "1"
        response = await self.http.request(scope.get("method", "GET"), url, headers=out,
                                           content=body)
        self.forwarded += 1
        raw = response.content
        answer = [(k.encode("latin-1"), v.encode("latin-1"))
                  for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE]
        answer.append((b"content-length", str(len(raw)).encode()))
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": answer})
        await send({"type": "http.response.body", "body": raw, "more_body": False})

    async def stream_bus(self, session_id: str, limits: Any) -> SessionBus | str | None:
        """The bus an event stream of ``session_id`` reads: the local one, a mirror of the
        owner's Redis stream, ``"unavailable"``, or ``None`` (unknown: 404)."""
        local = self.manager.get(session_id)
        if local is not None:
            return local.bus  # type: ignore[no-any-return]
        decision = await self.decide(session_id)
        if isinstance(decision, TakeOver):
            if await self.take_over(session_id):
                live = self.manager.get(session_id)
                return live.bus if live is not None else None
            decision = await self.decide(session_id)
        if isinstance(decision, Local):
            live = self.manager.get(session_id)
            return live.bus if live is not None else None
        if not isinstance(decision, Forward):
            return None
        mirror = self.mirrors.get(session_id)
        if mirror is None or mirror.bus.closed:
            mirror = await self._open_mirror(session_id, limits)
            if mirror is None:
                return None
        return mirror.bus

    async def _open_mirror(self, session_id: str, limits: Any) -> Mirror | None:
        assert self.node.client is not None
        entry, _, fields = await self.node.lookup(session_id)
        if entry is None:
            return None
        base = int(fields.get("base", "1") or 1)
        entries = await self.node.client.xrange(session_keys(session_id).events)
        current = [e for e in entries if _text(e.field_values.get(b"e", b"")) == entry.epoch]
        first = int(current[0].field_values[b"f"]) if current else base
        bus = MirrorBus(session_id, limits, entry.epoch, first)
        mirror = Mirror(bus, _text(entries[-1].identifier) if entries else "0-0")
        for item in current:
            self._feed(mirror, item.field_values)
        bus.flush()
        self.mirrors[session_id] = mirror
        self.manager.nursery.start_soon(self._follow, session_id, mirror)
        self.manager.nursery.start_soon(self._report_readers, session_id, mirror)
        return mirror

    async def _report_readers(self, session_id: str, mirror: Mirror) -> None:
        """Keep this mirror's reader count in Redis for the owner's status: at once when it
        changes, refreshed every READERS_REFRESH_MS; withdrawn when the mirror ends."""
        bus = mirror.bus
        try:
            while not mirror.done.is_set():
                bus.readers_changed = trio.Event()
                try:
                    await self.node.report_readers(session_id, len(bus.subscribers))
                except Exception as exc:  # Redis away for a moment: the next round reports
                    log.warning("event=mirror_readers_failed session=%s error=%r",
                                session_id, exc)
                with trio.move_on_after(READERS_REFRESH_MS / 1000):
                    async with trio.open_nursery() as wait:
                        async def on(event: trio.Event) -> None:
                            await event.wait()
                            wait.cancel_scope.cancel()
                        wait.start_soon(on, bus.readers_changed)
                        wait.start_soon(on, mirror.done)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                try:
                    await self.node.report_readers(session_id, 0)
                except Exception as exc:
                    log.warning("event=mirror_readers_failed session=%s error=%r",
                                session_id, exc)

    def _feed(self, mirror: Mirror, values: Any) -> bool:
        """Append one stream entry's events to the mirror's ring; False when the session
        ended with them."""
        ended = False
        first, last = int(values[b"f"]), int(values[b"l"])
        ring = mirror.bus.ring
        for event_id, raw in split_run(first, last, values[b"b"]):
            if event_id < ring.next_id:
                continue  # already held
            if event_id > ring.next_id:  # a gap the stream's trimming made: start after it
                mirror.bus.ring = type(ring)(ring.capacity, next_id=event_id,
                                             max_bytes=ring.max_bytes)
                ring = mirror.bus.ring
            event = Event.with_env(decode_json(raw), raw)
            event.release()
            ring.append(event)
            mirror.bus._dirty = True
            if event.type.encode() in TERMINAL_SESSION_EVENTS:
                ended = True
        return not ended

    @staticmethod
    def _new_epoch(session_id: str, mirror: Mirror, epoch: str, first_id: int) -> None:
        log.info("event=mirror_epoch_changed session=%s readers=%d", session_id,
                 len(mirror.bus.subscribers))
        mirror.bus.switch_epoch(epoch, first_id)

    async def _follow(self, session_id: str, mirror: Mirror) -> None:
        """Feed the mirror from the stream until the session ends or nobody reads it; a new
        epoch (a takeover) moves the mirror to it, its readers keep their streams."""
        key = session_keys(session_id).events
        # A client of its own: a blocking XREAD holds its connection for up to
        # MIRROR_BLOCK_MS, which the node's lookups, appends and renewals must not wait for
        # (measured: forwarded requests waited up to 270 ms behind it).
        client = self.node.new_client()
        try:
            async with client:
                await self._read_stream(client, key, session_id, mirror)
        except Exception as exc:
            log.warning("event=mirror_failed session=%s error=%r", session_id, exc)
        finally:
            mirror.bus.close()
            if self.mirrors.get(session_id) is mirror:
                del self.mirrors[session_id]
            mirror.done.set()

    async def _read_stream(self, client: coredis.Redis[bytes] | coredis.RedisCluster[bytes],
                           key: str, session_id: str, mirror: Mirror) -> None:
        idle_rounds = 0
        while True:
            got = await client.xread({key: mirror.stream_pos}, count=512,
                                     block=MIRROR_BLOCK_MS)
            entries = next(iter(got.values()), ()) if got else ()
            for item in entries:
                mirror.stream_pos = _text(item.identifier)
                values = item.field_values
                epoch = _text(values.get(b"e", b""))
                if epoch != mirror.bus.epoch:
                    self._new_epoch(session_id, mirror, epoch, int(values[b"f"]))
                if not self._feed(mirror, values):
                    mirror.bus.flush()
                    return
                # One entry is one of the owner's publish batches: published here as one,
                # with the owner's flow control (wait, rationed, for the readers that are
                # behind). Redis holds what is not read yet, so the owner never waits.
                mirror.bus.flush()
                await trio.lowlevel.checkpoint()  # the woken readers take their batch
                await mirror.bus.wait_for_subscribers()
            if not entries:
                entry, _, fields = await self.node.lookup(session_id)
                if entry is None or entry.closed:
                    return
                if entry.epoch and entry.epoch != mirror.bus.epoch:
                    self._new_epoch(session_id, mirror, entry.epoch,
                                    int(fields.get("base") or 1))
                idle_rounds = idle_rounds + 1 if not mirror.bus.subscribers else 0
                if idle_rounds >= 4:
                    return

    async def aclose(self) -> None:
        await self.http.aclose()


def _requested_session_id(body: bytes) -> str | None:
    """The ``sessionId`` a ``POST /session`` body asks for (lower-case, as the app keeps it),
    if it is a well-formed one; anything else is the app's to answer."""
    try:
        value = view_session_id(decode_json(body))
        return str(uuid.UUID(value)) if isinstance(value, str) else None
    except Exception:  # not JSON, not an object, not a UUID: the app answers it
        return None


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def _send_json(send: Any, status: int, body: dict[str, Any],
                     extra: list[tuple[bytes, bytes]]) -> None:
    raw = encode_json(body)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
        *extra]})
    await send({"type": "http.response.body", "body": raw, "more_body": False})


