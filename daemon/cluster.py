"""Cluster mode: many daemons on one Redis (or a Redis Cluster). Trio shell over coredis.

Imported only when the daemon starts with ``--cluster-redis``: single-node mode never loads
coredis. The rules (keys, scripts, routing) are the pure :mod:`daemon.core.cluster`; this module
runs them:

- :class:`ClusterNode` connects (refusing a Redis without AOF, and a node id a live process
  holds, before the daemon serves anything), renews the leases of the sessions it owns, and
  ships every transcript op of an owned session to Redis in order, fenced by the lease
  generation: the op log (``tk:{id}:ops``, the transcript every node can read) and, for the
  events of the current bus, the session's event stream (``tk:{id}:events``, holding at most
  the ring's events). Every Redis call has a deadline (:meth:`ClusterNode.call`); the lease
  clock (:mod:`daemon.core.cluster_lease`) tells when this node may no longer be sure it owns a
  session: its readers are cut and its requests wait until Redis confirms or denies the lease.
- :class:`ClusterWriter` is the transcript writer of a cluster node: the local SQLite store as
  in single-node mode plus the Redis shipping; ``durableEventId`` is what Redis acknowledged.
- :class:`ClusterRouter` sits in front of the app (``DaemonASGI``): a request for a session
  this node does not run is forwarded to its owner, answered ``503`` while a dead owner's lease
  runs, or takes the session over once the lease is gone (the op log is replayed into the local
  store and the single-node cold restore runs on it); an event stream of a session owned
  elsewhere is served from a mirror of its Redis stream with the single-node stream code.
  Forwards are signed (:mod:`daemon.core.cluster_auth`); Redis trouble is a 503
  ``cluster_unavailable`` with ``Retry-After``.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import coredis
import httpx
import msgspec
import trio

from sdk.protocol import routes
from sdk.protocol.constants import RESYNC_EPOCH_MISMATCH, RESYNC_EPOCH_RESET
from sdk.protocol.events import StateResyncRequiredData
from sdk.protocol.headers import CLUSTER_NODE, CLUSTER_PROBE, lower
from sdk.protocol.http import ErrorBody, route_not_found, session_not_found, view_session_id

from .bus import SessionBus, Subscription, now_ms
from .core import cluster_auth
from .core.cluster import (
    APPEND_SCRIPT,
    CLAIM_SCRIPT,
    CLOSED_RETENTION_MS,
    COMPACT_SCRIPT,
    IDLE_RETENTION_MS,
    LOOKUP_SCRIPT,
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
    stream_keep_from,
)
from .core.cluster_identity import (
    JOIN_SCRIPT,
    REFRESH_SCRIPT,
    WATCH_REFRESHES,
    join_result,
    refusal,
)
from .core.cluster_lease import LeaseClock, RedisLink
from .core.envelope import Event, decode_json, encode_json, typed_synthetic
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
from .server import DaemonStartError
from .streams import StreamRequestError
from .transcript_store import TranscriptStore
from .transcript_writer import TranscriptWriter

log = logging.getLogger("daemon.cluster")
# coredis logs each EVALSHA that falls back to EVAL (a script's first use on a server) and httpx
# each forwarded request at info: the daemon's own lines say what matters.
logging.getLogger("coredis").setLevel(logging.WARNING)
logging.getLogger("httpx").setLevel(logging.WARNING)

FORWARDED_HEADER = cluster_auth.FORWARDED_HEADER
SIGNATURE_HEADER = cluster_auth.SIGNATURE_HEADER
# Hop-by-hop headers, those the HTTP client sets itself, and the forward's own (signed anew at
# every hop). Everything else a client sent is carried through unchanged.
_DROP_REQUEST = frozenset({"host", "content-length", "connection", "keep-alive",
                           "transfer-encoding", "upgrade", FORWARDED_HEADER, SIGNATURE_HEADER})
_DROP_RESPONSE = frozenset({"content-length", "connection", "keep-alive", "transfer-encoding",
                            "date", "server"})
# A node checks that its --node-url reaches itself by asking it for a nonce only it knows.
PROBE_PATH = routes.NODE_PROBE.path
PROBE_HEADER = lower(CLUSTER_PROBE)
_NODE_HEADER = lower(CLUSTER_NODE)
MIRROR_BLOCK_MS = 500
READERS_LOOKUP_S = 0.2
TERMINAL_SESSION_EVENTS = frozenset({b"session_closed", b"session_died"})
# DEADLINES. Every Redis call gets call_timeout_s (half the lease, 0.5 to 5 s): past it
# Redis counts as unavailable for that call (a third of the lease was too tight for a loaded
# 2-core machine: a starved node missed it while Redis was fine). Reads of a whole op log or stream get
# BULK_TIMEOUT_S at least. A forward gets the lease: an owner that does not answer within its
# own lease cannot be relied on to still hold it.
BULK_TIMEOUT_S = 10.0
T = TypeVar("T")


class ClusterUnavailable(Exception):
    """Redis did not answer (refused, failed or past the call's deadline): the request that
    needed it is answered 503 ``cluster_unavailable`` with ``Retry-After``."""


class ClusterStartError(DaemonStartError):
    """The node cannot join the cluster, or must leave it (the message is the one-line
    reason; the daemon exits with status 1)."""


@dataclass
class Owned:
    """A session this node owns: its lease generation and what has been set up in Redis."""

    generation: int
    log_len: int  # the op log's length in Redis, as this node's appends left it
    epoch: str | None = None  # the current bus's epoch once its UpsertSession was shipped
    tail: LogTail = field(default_factory=lambda: LogTail(0))  # since the last turn boundary
    closing: bool = False  # deleted by a client: its release must mark it closed


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
            self._resyncs[sub] = typed_synthetic(StateResyncRequiredData(
                reason=RESYNC_EPOCH_RESET, detail=RESYNC_EPOCH_MISMATCH,
                last_delivered_id=state.cursor, earliest_available_id=self.ring.next_id,
            ), now_ms=stamp)
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


def _decode_hash(raw: dict[Any, Any]) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else str(k)):
            (v.decode() if isinstance(v, bytes) else str(v)) for k, v in raw.items()}


class ClusterNode:
    """This daemon's membership of the cluster (owned by the server's root nursery)."""

    def __init__(self, url: str, node_id: str, node_url: str, lease_ms: int,
                 events_cap: int, secret: str, *, idle_retention_ms: int = IDLE_RETENTION_MS,
                 closed_retention_ms: int = CLOSED_RETENTION_MS) -> None:
        self.url = url
        self.idle_retention_ms = idle_retention_ms
        self.closed_retention_ms = closed_retention_ms
        self.node_id = node_id
        self.node_url = node_url
        self.lease_ms = lease_ms
        self.lease_s = lease_ms / 1000
        self.events_cap = events_cap
        self.secret = secret.encode()
        self.instance = secrets.token_hex(8)  # this process (see cluster_identity)
        self.call_timeout_s = min(5.0, max(0.5, self.lease_s / 2))
        self.lease = LeaseClock(self.lease_s)
        self.link = RedisLink(self.lease_s)
        self.client: coredis.Redis[bytes] | coredis.RedisCluster[bytes] | None = None
        self.is_cluster = False
        self.owned: dict[str, Owned] = {}
        self.busy: set[str] = set()  # sessions being taken over here (owned, not yet running)
        self.fenced: set[str] = set()
        self.durable: dict[str, int] = {}
        self.manager: Any = None  # daemon.manager.SessionManager, set by attach()
        self.on_acked: Callable[[int], None] | None = None  # the writer's (ClusterWriter)
        self._pending: deque[_Pending] = deque()
        self._wakeup = trio.Event()
        self._progress = trio.Event()
        self._resolved = 0
        self._failed_seqs: set[int] = set()
        self._last_seq = 0
        self._confirming: dict[str, trio.Event] = {}
        self.probe_nonce: str | None = None  # while verify_url runs
        self._nursery: trio.Nursery | None = None
        self.appends = 0
        self.appends_fenced = 0
        self.compactions = 0

    def attach(self, manager: Any) -> None:
        self.manager = manager

    # -- Redis calls, each with a deadline -------------------------------------------------------

    async def call(self, fn: Callable[[], Awaitable[T]], *, timeout: float | None = None) -> T:
        """``await fn()`` (one Redis call) within ``timeout`` (``call_timeout_s``); Redis
        refusing, failing or not answering in time raises :class:`ClusterUnavailable` and is
        noted in :attr:`link` (an outage, then the grace after it)."""
        limit = self.call_timeout_s if timeout is None else timeout
        with trio.move_on_after(limit):
            try:
                result = await fn()
            except Exception as exc:  # coredis wraps its errors in exception groups
                self._link_failed(repr(_leaf(exc)))
                raise ClusterUnavailable(f"Redis failed: {_leaf(exc)!r}") from None
            if self.link.answered(trio.current_time()):
                log.warning("event=redis_available node=%s grace_ms=%d", self.node_id,
                            self.lease_ms)
            return result
        self._link_failed(f"no answer within {limit:g} s")
        raise ClusterUnavailable(f"Redis did not answer within {limit:g} s")

    def _link_failed(self, why: str) -> None:
        if self.link.failed(trio.current_time()):
            log.warning("event=redis_unavailable node=%s error=%s", self.node_id, why)

    @property
    def retry_after_s(self) -> int:
        """The ``Retry-After`` of a 503 for Redis trouble: half a lease, at least 1 s."""
        return max(1, round(self.lease_s / 2))

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
            self._lookup = client.register_script(LOOKUP_SCRIPT)
            self._join = client.register_script(JOIN_SCRIPT)
            self._refresh = client.register_script(REFRESH_SCRIPT)
            try:
                await self._join_as_this_node()
            except ClusterStartError:
                raise
            except Exception as raised:
                exc = _leaf(raised)
                raise ClusterStartError(f"cannot join the cluster at {self.url}: "
                                        f"{type(exc).__name__}: {exc}") from None
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._ship_loop)
                nursery.start_soon(self._renew_loop)
                log.info("event=cluster_joined node=%s instance=%s redis_cluster=%s "
                         "lease_ms=%d", self.node_id, self.instance, self.is_cluster,
                         self.lease_ms)
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

    async def _join_as_this_node(self) -> None:
        """Register this process as the node id, refusing an id a live process holds (see
        :mod:`daemon.core.cluster_identity`)."""
        key = node_key(self.node_id)
        args: list[str | int] = [self.instance, self.node_url, node_ttl_ms(self.lease_ms)]
        holder = join_result(await self._join(keys=[key], args=[*args, "", ""]))
        if holder is None:
            return
        watch_ms = round(WATCH_REFRESHES * renew_interval_ms(self.lease_ms) * 1.2)
        log.info("event=node_id_held node=%s holder_url=%s watching_ms=%d", self.node_id,
                 holder.url, watch_ms)
        await trio.sleep(watch_ms / 1000)  # the holder's heartbeat, if it lives, moves
        later = join_result(await self._join(keys=[key], args=[
            *args, holder.instance, holder.beat]))
        if later is not None:
            raise ClusterStartError(refusal(self.node_id, later))
        log.info("event=node_id_taken_from_dead_process node=%s", self.node_id)

    async def _refresh_registration(self) -> None:
        key = node_key(self.node_id)
        ok: Any = await self.call(lambda: self._refresh(
            keys=[key], args=[self.instance, self.node_url, node_ttl_ms(self.lease_ms)]))
        if not int(ok):
            raise ClusterStartError(
                f"node id {self.node_id!r} was taken over by another process while this one "
                "did not refresh it (paused?): this process leaves the cluster")

    async def verify_url(self, probe: Callable[[str], Awaitable[bool]]) -> None:
        """Check that ``--node-url`` reaches this very process: ``probe`` asks the URL for
        a fresh nonce that only this process knows (the router answers it)."""
        self.probe_nonce = secrets.token_hex(16)
        reached: bool | None = None
        try:
            with trio.move_on_after(max(2.0, self.lease_s)):
                reached = await probe(self.probe_nonce)
        except httpx.HTTPError as exc:
            raise ClusterStartError(
                f"--node-url {self.node_url} does not reach this node ({type(exc).__name__}: "
                f"{exc}): the other nodes could never forward to it") from None
        finally:
            self.probe_nonce = None
        if reached is None:
            raise ClusterStartError(f"--node-url {self.node_url} did not answer in time: the "
                                    "other nodes could never forward to it")
        if not reached:
            raise ClusterStartError(
                f"--node-url {self.node_url} does not reach this node (another server "
                "answered it): the other nodes could never forward to it")

    # -- leases -----------------------------------------------------------------------------

    async def claim(self, session_id: str, workspace: str, epoch: str) -> int | None:
        """Take the session's lease; its new generation, or ``None`` if another node has it."""
        keys = session_keys(session_id)
        sent_at = trio.current_time()
        result: Any = await self.call(lambda: self._claim(
            keys=keys.all(),
            args=[self.node_id, self.node_url, workspace, epoch, self.lease_ms,
                  self.idle_retention_ms]))
        ok, value = int(result[0]), int(result[1])
        if not ok:
            return None
        log_len = int(result[2])
        # What the log holds already is compacted at a takeover (compact_log); this node's
        # own turns are compacted as they end.
        self.owned[session_id] = Owned(value, log_len, tail=LogTail(log_len))
        self.fenced.discard(session_id)
        self.lease.confirmed(session_id, sent_at)
        log.info("event=lease_claimed session=%s generation=%d", session_id, value)
        return value

    async def _renew_loop(self) -> None:
        period = renew_interval_ms(self.lease_ms) / 1000
        while True:
            await trio.sleep(period)
            try:
                await self._refresh_registration()
            except ClusterUnavailable as exc:
                log.warning("event=lease_renew_failed error=%r", exc)
                continue
            for session_id in list(self.owned):
                try:
                    if not self._runs(session_id) and session_id not in self.busy \
                            and self.ship_idle(session_id):
                        await self.release(session_id, closed=False)
                        continue
                    await self.renew(session_id)
                except ClusterUnavailable as exc:  # the next round retries
                    log.warning("event=lease_renew_failed session=%s error=%r", session_id,
                                exc)
                    break

    async def renew(self, session_id: str) -> bool:
        """Renew one lease now; False (and the session let go) when it is not ours any
        more. Raises :class:`ClusterUnavailable` when Redis does not answer."""
        owned = self.owned.get(session_id)
        if owned is None:
            return False
        keys = session_keys(session_id)
        sent_at = trio.current_time()
        ok: Any = await self.call(lambda: self._renew(keys=keys.all(), args=[
            self.node_id, owned.generation, self.lease_ms, self.idle_retention_ms]))
        if not int(ok):
            self._lost(session_id, "renew refused")
            return False
        self.lease.confirmed(session_id, sent_at)
        return True

    # -- the lease clock: is this node still the owner? ----------------------------------------

    def may_publish(self, session_id: str) -> bool:
        """The bus's guard (see daemon.core.cluster_lease): True while this node is sure it
        owns ``session_id``; False starts a confirmation with Redis. A session not claimed
        yet (a new one, whose claim ships with its creation) passes; a fenced one never."""
        if session_id not in self.owned:
            return session_id not in self.fenced
        if self.lease.valid(session_id, trio.current_time()):
            return True
        self.start_confirm(session_id)
        return False

    def in_doubt(self, session_id: str) -> bool:
        return session_id in self.owned and not self.lease.valid(session_id, trio.current_time())

    def start_confirm(self, session_id: str) -> trio.Event:
        """Renew ``session_id`` now, in the background (once at a time); the event is set
        when the lease is confirmed, lost, or Redis did not answer."""
        done = self._confirming.get(session_id)
        if done is not None:
            return done
        done = self._confirming[session_id] = trio.Event()

        async def confirm() -> None:
            try:
                # The node id first: a process whose id was taken over while it was paused
                # must leave (ClusterStartError), not renew "its" leases.
                await self._refresh_registration()
                if await self.renew(session_id):
                    log.info("event=lease_confirmed session=%s", session_id)
            except ClusterUnavailable as exc:
                log.warning("event=lease_in_doubt session=%s error=%r", session_id, exc)
            finally:
                del self._confirming[session_id]
                done.set()

        if self._nursery is not None:
            self._nursery.start_soon(confirm)
        else:
            done.set()
        return done

    async def settle(self, session_id: str, timeout: float) -> bool:
        """Wait (up to ``timeout``) until this node knows whether it owns ``session_id``;
        True when it does (its lease is confirmed), False when it lost it or Redis would
        not say in time."""
        with trio.move_on_after(timeout):
            while self.in_doubt(session_id):
                await self.start_confirm(session_id).wait()
                if self.in_doubt(session_id):
                    await trio.sleep(0.05)  # Redis did not answer: ask again (paced)
        return session_id in self.owned and not self.in_doubt(session_id)

    def _runs(self, session_id: str) -> bool:
        return self.manager is not None and session_id in self.manager.sessions

    def ship_idle(self, session_id: str) -> bool:
        return not any(p.op.session_id == session_id for p in self._pending)

    async def release(self, session_id: str, *, closed: bool) -> None:
        """Give the lease up (``closed``: the session was deleted for good). When Redis does
        not answer, the session stays owned (and a close is remembered) for the next try."""
        owned = self.owned.get(session_id)
        if owned is None:
            return
        owned.closing = owned.closing or closed
        keys = session_keys(session_id)
        flag = "1" if owned.closing else "0"
        await self.call(lambda: self._release(keys=keys.all(), args=[
            self.node_id, owned.generation, flag, self.closed_retention_ms]))
        self.owned.pop(session_id, None)
        self.lease.forget(session_id)
        log.info("event=lease_released session=%s closed=%s", session_id, owned.closing)

    def _lost(self, session_id: str, why: str) -> None:
        """Another node owns the session now: nothing of it may be written here again, and
        the local copy ends. Its readers here are cut first (their streams end; they resume
        from the new owner's stream), so nothing it publishes from now on reaches them."""
        if session_id in self.fenced:
            return
        self.fenced.add(session_id)
        self.owned.pop(session_id, None)
        self.lease.forget(session_id)
        log.warning("event=lease_lost session=%s reason=%s", session_id, why)
        manager = self.manager
        session = manager.sessions.get(session_id) if manager is not None else None
        if session is not None:
            session.bus.cut_subscribers("lease_lost")
            session.bus.close()
            manager.nursery.start_soon(session.close, "lease_lost")

    async def release_all(self) -> None:
        """Graceful stop: ship what is queued, then give every lease up at once."""
        with trio.move_on_after(2):
            await self.wait_acked(self._last_seq)
        for session_id in list(self.owned):
            with trio.move_on_after(1):
                try:
                    await self.release(session_id, closed=False)
                except ClusterUnavailable as exc:
                    log.warning("event=lease_release_failed session=%s error=%r", session_id,
                                exc)

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

    def acked(self, seq: int) -> bool | None:
        """Is op ``seq`` in Redis (``None``: not resolved yet; ``False``: fenced)?"""
        if self._resolved < seq:
            return None
        return seq not in self._failed_seqs

    def _resolve(self, upto: int, failed: list[int]) -> None:
        self._failed_seqs.update(failed)
        self._resolved = max(self._resolved, upto)
        self._progress.set()
        self._progress = trio.Event()
        if self.on_acked is not None:
            self.on_acked(self._resolved)

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
        progress[0] = len(items)  # all in Redis: a retry (of the release) resends nothing
        if closed or any(isinstance(item.op, MarkClosed) for item in items):
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
        generation = owned.generation
        ok: Any = await self.call(lambda: self._set_epoch(
            keys=[keys.directory, keys.lease], args=[self.node_id, generation, epoch, base]))
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
        keep_from = 0
        if runs:
            session = self.manager.sessions.get(session_id) if self.manager is not None \
                else None
            ring = session.bus.ring if session is not None else None
            keep_from = stream_keep_from(ring.first_id if ring is not None else None,
                                         runs[-1][1], self.events_cap)
        args = append_args(owned.generation, owned.epoch or "", keep_from, owned.log_len,
                           [encode_op(op) for op in ops], runs, self.idle_retention_ms)
        ok: Any = await self.call(lambda: self._append(
            keys=[keys.directory, keys.ops, keys.events], args=args))
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
                ok: Any = await self.call(lambda: self._compact(
                    keys=[keys.directory, keys.ops], args=compaction.args(owned.generation)))
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
            # Another writer moved the log meanwhile: a 503, and the client asks again.
            raise ClusterUnavailable(f"the op log of {session_id} changed during its takeover")
        tail = LogTail.of(kept)
        owned.tail = tail
        owned.log_len = tail.start + tail.length
        return kept

    # -- reading ----------------------------------------------------------------------------

    async def lookup(self, session_id: str) -> tuple[DirectoryEntry | None, int, dict[str, str]]:
        """The directory entry, the lease's remaining ms (negative: none) and the raw hash."""
        keys = session_keys(session_id)
        got: Any = await self.call(lambda: self._lookup(keys=[keys.directory, keys.lease]))
        flat, pttl = list(got[0]), int(got[1])
        fields = _decode_hash(dict(zip(flat[::2], flat[1::2], strict=True)))
        return DirectoryEntry.from_hash(fields), pttl, fields

    async def readers(self, session_id: str, own: int) -> dict[str, int]:
        """The session's subscribers per node: ``own`` here (the owner) and what the mirrors
        on other nodes report (see ``READERS_GET_SCRIPT``)."""
        flat: Any = []
        # A status must not wait for a Redis that does not answer (paused, partitioned): past
        # READERS_LOOKUP_S it shows the owner's own readers only.
        with trio.move_on_after(READERS_LOOKUP_S):
            try:
                flat = await self.call(lambda: self._readers_get(
                    keys=[session_keys(session_id).readers], args=[READERS_FRESH_MS]))
            except ClusterUnavailable as exc:  # Redis away: the owner's own count still answers
                log.warning("event=mirror_readers_failed session=%s error=%r", session_id, exc)
        return readers_by_node(list(flat), self.node_id, own)

    async def report_readers(self, session_id: str, count: int) -> None:
        await self.call(lambda: self._readers_set(keys=[session_keys(session_id).readers],
                                                  args=[self.node_id, count,
                                                        READERS_FRESH_MS]))

    async def op_log(self, session_id: str) -> list[Op]:
        client = self.client
        assert client is not None
        raw = await self.call(lambda: client.lrange(session_keys(session_id).ops, 0, -1),
                              timeout=max(BULK_TIMEOUT_S, self.lease_s))
        return [decode_op(item) for item in raw]


class ClusterWriter(TranscriptWriter):
    """The transcript writer of a cluster node: the local store (restore, pages and loads
    read it as in single-node mode) and, for every op, the shipping to Redis. An op counts as
    committed once both have it; ``durableEventId`` is the newest event Redis acknowledged.

    Redis is the cluster's transcript, so a commit that does not finish in time because Redis
    does not answer latches nothing: the shipping retries until Redis answers (the op log
    never gets a hole), the session is ``transcriptDegraded`` meanwhile, and the flag clears
    once Redis has acknowledged everything up to where it was raised. A failure of the local
    store itself latches the session as in single-node mode."""

    def __init__(self, store: TranscriptStore, node: ClusterNode) -> None:
        super().__init__(store)
        self.node = node
        # An admission Redis has not taken within half a lease is refused (the 202 is not
        # given): the client asks again, on whichever node owns the session by then.
        self.admission_bound_s = node.lease_s / 2
        # A terminal waits at most two leases for Redis (10 s at most, as on a single node),
        # then the session is degraded until Redis has caught up.
        self.durable_bound_s = min(10.0, 2 * node.lease_s)
        self.lagging: dict[str, int] = {}  # session -> the seq Redis must acknowledge
        node.on_acked = self._acked

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

    async def wait_admitted(self, seq: int) -> bool:
        return await self.node.wait_acked(seq)

    def publish_guard(self, session_id: str) -> Callable[[], bool] | None:
        return lambda: self.node.may_publish(session_id)

    def is_degraded(self, session_id: str) -> bool:
        return session_id in self.lagging or super().is_degraded(session_id)

    def mark_failed(self, session_id: str, exc: BaseException) -> None:
        seq = self.last_seq
        if self.node.acked(seq) is not None:  # Redis answered: the local store is behind
            super().mark_failed(session_id, exc)
            return
        if session_id not in self.lagging:
            log.warning("event=transcript_lagging session=%s reason=redis_not_acknowledging "
                        "error=%r", session_id, str(exc))
        self.lagging[session_id] = seq

    def _acked(self, upto: int) -> None:
        for session_id, seq in list(self.lagging.items()):
            if seq <= upto:
                del self.lagging[session_id]
                log.warning("event=transcript_recovered session=%s", session_id)

    def durable_event_id(self, session_id: str) -> int:
        return self.node.durable.get(session_id, 0)

    def reset_durable(self, session_id: str) -> None:
        super().reset_durable(session_id)
        self.node.durable.pop(session_id, None)


class ClusterRouter:
    """Routes session requests in front of the app (see the module docstring)."""

    def __init__(self, node: ClusterNode, manager: Any, writer: ClusterWriter, *,
                 token: str | None = None) -> None:
        self.node = node
        self.manager = manager
        self.writer = writer
        self.token = token  # the daemon's own, for the --node-url probe through its guard
        # A forward gets the lease (see DEADLINES), its connection at most 2 s of it.
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(
            max(node.lease_s, 0.5), connect=min(2.0, max(node.lease_s, 0.5))))
        self.mirrors: dict[str, Mirror] = {}
        self._takeover_locks = _KeyedLocks()
        self._nonces = cluster_auth.NonceWindow()
        self.ready = False  # set once --node-url was checked: until then sessions wait
        self.forwarded = 0
        self.takeovers = 0
        self.forwards_rejected = 0

    @staticmethod
    def session_id_of(path: str) -> str | None:
        return routes.session_of(path)

    def _grace_left_ms(self) -> int:
        return round(self.node.link.grace_left(trio.current_time()) * 1000)

    async def decide(self, session_id: str) -> Any:
        if self.manager.get(session_id) is not None and session_id not in self.node.fenced:
            return Local()
        entry, pttl, _ = await self.node.lookup(session_id)
        return route(entry, pttl, self.node.node_id, live_here=False,
                     grace_left_ms=self._grace_left_ms())

    async def _local(self, session_id: str) -> bool:
        """Is the session live here and this node still its owner? A lease in doubt (this
        node was paused, or Redis did not answer its renewals) is settled with Redis first:
        False once it turned out lost; :class:`ClusterUnavailable` when Redis would not say
        within a lease."""
        node = self.node
        if self.manager.get(session_id) is None or session_id in node.fenced:
            return False
        if not node.in_doubt(session_id) or await node.settle(session_id, node.lease_s):
            return True
        if session_id in node.owned:
            raise ClusterUnavailable("this node's lease of the session is in doubt and Redis "
                                     "does not answer")
        return False  # lost: the session ends here; the request goes to the new owner

    async def take_over(self, session_id: str) -> bool:
        """Restore the session here after its owner's lease ran out: claim the lease, replay
        its op log into the local store, then the single-node cold restore."""
        async with self._takeover_locks.hold(session_id):
            if self.manager.get(session_id) is not None:
                return True
            if not self.node.ship_idle(session_id):
                # It just ended here (closed, its agent died): what it wrote last (a close,
                # a release) decides what the directory says. Let it land first.
                with trio.move_on_after(self.node.lease_s):
                    await self.node.wait_acked(self.node.last_seq)
            entry, pttl, _ = await self.node.lookup(session_id)
            decision = route(entry, pttl, self.node.node_id, live_here=False,
                             grace_left_ms=self._grace_left_ms())
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
        the lease): a client may take the session id to any other node at once. If Redis
        does not take it within a lease, the answer is 503 ``cluster_unavailable`` instead."""
        if method != routes.CREATE_SESSION.method or path != routes.CREATE_SESSION.path:
            return send
        node = self.node
        refused = False

        async def send_when_shipped(message: MutableMapping[str, Any]) -> None:
            nonlocal refused
            if refused:
                return
            if message["type"] == "http.response.start" and message.get("status") == 200:
                acked = False
                with trio.move_on_after(node.lease_s):
                    acked = await node.wait_acked(node.last_seq)
                if not acked:
                    refused = True
                    await _send_unavailable(send, node, None, "the new session did not reach "
                                            "the cluster's Redis in time")
                    return
            await send(message)

        return send_when_shipped

    async def handle(self, scope: MutableMapping[str, Any], receive: Any, send: Any,
                     headers: dict[str, str], body: bytes | None) -> bool:
        """Answer a request for a session this node does not run (or no longer owns); False
        to let the app (or the local stream) answer it as in single-node mode. Redis trouble
        is a 503 ``cluster_unavailable`` with ``Retry-After``, never a 500 or a hang."""
        path: str = scope["path"]
        if path == PROBE_PATH:
            await self._answer_probe(send, headers)
            return True
        session_id = self.session_id_of(path)
        creating = session_id is None and path == routes.CREATE_SESSION.path \
            and scope.get("method") == routes.CREATE_SESSION.method
        if creating and body:
            session_id = _requested_session_id(body)  # attach to a session of the cluster
        if not self.ready and (session_id is not None or creating):
            await _send_unavailable(send, self.node, session_id, "this node is still starting")
            return True
        if session_id is None:
            return False
        forwarded = self._verified_forward(scope, headers, body or b"")
        try:
            return await self._route(scope, send, headers, body or b"", session_id, forwarded)
        except ClusterUnavailable as exc:
            log.info("event=cluster_unavailable session=%s error=%s", session_id, exc)
            await _send_unavailable(send, self.node, session_id, str(exc))
            return True

    async def _route(self, scope: MutableMapping[str, Any], send: Any, headers: dict[str, str],
                     body: bytes, session_id: str, forwarded: bool) -> bool:
        for _ in range(3):  # a takeover lost to another node is routed again
            if await self._local(session_id):
                return False
            entry, pttl, _fields = await self.node.lookup(session_id)
            decision = route(entry, pttl, self.node.node_id, live_here=False,
                             grace_left_ms=self._grace_left_ms())
            if isinstance(decision, Unknown):
                if entry is None:
                    return False  # not in the cluster: the app answers (404)
                # Closed for good: never restored from a stale local copy.
                await _send_json(send, 404, session_not_found(session_id), [])
                return True
            if isinstance(decision, TakeOver):
                if await self.take_over(session_id):
                    return False
                continue
            assert isinstance(decision, Forward)
            if not forwarded:
                try:
                    await self._forward(scope, send, headers, body, decision)
                    return True
                except (httpx.TransportError, httpx.TimeoutException) as exc:
                    log.info("event=owner_unreachable session=%s owner=%s error=%r",
                             session_id, decision.owner_node_id, exc)
            # The owner does not answer, or this is a forward the directory says belongs
            # elsewhere (never forwarded twice): 503 until the lease (or the grace) is over.
            entry, pttl, _fields = await self.node.lookup(session_id)
            again = route(entry, pttl, self.node.node_id, live_here=False,
                          owner_unreachable=True, grace_left_ms=self._grace_left_ms())
            if isinstance(again, Unavailable):
                wait = again.retry_after_s
                await _send_json(send, 503, ErrorBody(
                    error="The session's node does not answer; retry once its lease expires",
                    code="session_owner_unavailable", session_id=session_id, retryable=True,
                    retry_after_ms=wait * 1000),
                    [(b"retry-after", str(wait).encode())])
                return True
        return False

    def _verified_forward(self, scope: MutableMapping[str, Any], headers: dict[str, str],
                          body: bytes) -> bool:
        """Is this request a genuine forward of another node (see daemon.core.cluster_auth)?
        A client's ``X-Turnkeeper-Forwarded`` without a valid signature counts for nothing."""
        sender = headers.get(FORWARDED_HEADER)
        signature = headers.get(SIGNATURE_HEADER)
        if sender is None and signature is None:
            return False
        why = "unsigned" if not sender or signature is None else cluster_auth.verify(
            self.node.secret, scope.get("method", "GET"), _target(scope), sender, signature,
            body, time.time_ns() // 1_000_000, self._nonces)
        if why is None:
            return True
        self.forwards_rejected += 1
        log.warning("event=forward_rejected reason=%s claimed_sender=%s path=%s", why,
                    (sender or "")[:64], scope["path"])
        return False

    async def _forward(self, scope: MutableMapping[str, Any], send: Any,
                       headers: dict[str, str], body: bytes, target: Forward) -> None:
        method = scope.get("method", "GET")
        path = _target(scope)
        url = target.node_url.rstrip("/") + path
        out = {k: v for k, v in headers.items() if k not in _DROP_REQUEST}
        out[FORWARDED_HEADER] = self.node.node_id
        out[SIGNATURE_HEADER] = cluster_auth.sign(
            self.node.secret, method, path, self.node.node_id, time.time_ns() // 1_000_000,
            secrets.token_hex(12), body)
        response = await self.http.request(method, url, headers=out, content=body)
        self.forwarded += 1
        raw = response.content
        answer = [(k.encode("latin-1"), v.encode("latin-1"))
                  for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE]
        answer.append((b"content-length", str(len(raw)).encode()))
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": answer})
        await send({"type": "http.response.body", "body": raw, "more_body": False})

    # -- the --node-url check ------------------------------------------------------------------

    async def probe(self, nonce: str) -> bool:
        """Ask ``--node-url`` for the start-up nonce (ClusterNode.verify_url): True when
        this very process answered."""
        headers = {PROBE_HEADER: nonce}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        response = await self.http.get(self.node.node_url.rstrip("/") + PROBE_PATH,
                                       headers=headers)
        return response.status_code == 204 \
            and response.headers.get(_NODE_HEADER) == self.node.node_id

    async def _answer_probe(self, send: Any, headers: dict[str, str]) -> None:
        nonce = self.node.probe_nonce
        given = headers.get(PROBE_HEADER, "")
        if nonce is not None and hmac.compare_digest(given.encode(), nonce.encode()):
            await send({"type": "http.response.start", "status": 204, "headers": [
                (_NODE_HEADER.encode(), self.node.node_id.encode())]})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await _send_json(send, 404, route_not_found(), [])

    # -- event streams ---------------------------------------------------------------------------

    async def stream_bus(self, session_id: str, limits: Any) -> SessionBus | None:
        """The bus an event stream of ``session_id`` reads: the local one, a mirror of the
        owner's Redis stream, or ``None`` (unknown: 404). Redis trouble (or this node's lease
        in doubt with Redis silent) raises :class:`StreamRequestError` 503."""
        try:
            return await self._stream_bus(session_id, limits)
        except ClusterUnavailable as exc:
            retry = self.node.retry_after_s
            raise StreamRequestError(503, _unavailable_body(session_id, str(exc), retry),
                                     {"Retry-After": str(retry)}) from None

    async def _stream_bus(self, session_id: str, limits: Any) -> SessionBus | None:
        if await self._local(session_id):
            return self.manager.get(session_id).bus  # type: ignore[no-any-return]
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
        client = self.node.client
        assert client is not None
        entry, _, fields = await self.node.lookup(session_id)
        if entry is None:
            return None
        base = int(fields.get("base", "1") or 1)
        entries = await self.node.call(lambda: client.xrange(session_keys(session_id).events),
                                       timeout=max(BULK_TIMEOUT_S, self.node.lease_s))
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


def _target(scope: MutableMapping[str, Any]) -> str:
    """A request's path and query as signed (see daemon.core.cluster_auth)."""
    query = scope.get("query_string", b"").decode("latin-1")
    path: str = scope["path"]
    return path + (f"?{query}" if query else "")


def _unavailable_body(session_id: str | None, why: str, retry_s: int) -> ErrorBody:
    return ErrorBody(error=f"The cluster cannot serve this now ({why}); retry",
                     code="cluster_unavailable",
                     session_id=session_id if session_id is not None else msgspec.UNSET,
                     retryable=True, retry_after_ms=retry_s * 1000)


async def _send_unavailable(send: Any, node: ClusterNode, session_id: str | None,
                            why: str) -> None:
    retry = node.retry_after_s
    await _send_json(send, 503, _unavailable_body(session_id, why, retry),
                     [(b"retry-after", str(retry).encode())])


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def _send_json(send: Any, status: int, body: ErrorBody,
                     extra: list[tuple[bytes, bytes]]) -> None:
    raw = encode_json(body)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
        *extra]})
    await send({"type": "http.response.body", "body": raw, "more_body": False})


