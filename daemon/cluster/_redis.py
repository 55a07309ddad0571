"""The cluster's Redis: joining it (a Redis without AOF is refused), the scripts, the reads of
the directory, and every call with a deadline. Trio shell over coredis.

Every Redis call goes through :meth:`Redis.call`: half the lease, between 0.5 and 5 s (reads of
a whole op log or stream get :data:`BULK_TIMEOUT_S` at least). Past it, or when Redis refuses
or fails, the call raises :class:`ClusterUnavailable` and :attr:`Redis.link` notes the outage
(and, once Redis answers again, the grace after it: see :mod:`daemon.core.cluster_lease`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import coredis
import trio

from ..core.cluster import (
    APPEND_SCRIPT,
    CLAIM_SCRIPT,
    COMPACT_SCRIPT,
    LOOKUP_SCRIPT,
    READERS_FRESH_MS,
    READERS_GET_SCRIPT,
    READERS_SET_SCRIPT,
    RELEASE_SCRIPT,
    RENEW_SCRIPT,
    SET_EPOCH_SCRIPT,
    DirectoryEntry,
    decode_op,
    readers_by_node,
    session_keys,
)
from ..core.cluster_identity import JOIN_SCRIPT, REFRESH_SCRIPT
from ..core.cluster_lease import RedisLink
from ..core.transcript_ops import Op
from ..errors import DaemonStartError

log = logging.getLogger("daemon.cluster")
# coredis logs each EVALSHA that falls back to EVAL (a script's first use on a server) at info:
# the daemon's own lines say what matters.
logging.getLogger("coredis").setLevel(logging.WARNING)

# DEADLINES. Every Redis call gets call_timeout_s (half the lease, 0.5 to 5 s): past it
# Redis counts as unavailable for that call (a third of the lease was too tight for a loaded
# 2-core machine: a starved node missed it while Redis was fine). Reads of a whole op log or
# stream get BULK_TIMEOUT_S at least.
BULK_TIMEOUT_S = 10.0
# A status must not wait for a Redis that does not answer (paused, partitioned): past this it
# shows the owner's own readers only.
READERS_LOOKUP_S = 0.2
T = TypeVar("T")
Client = coredis.Redis[bytes] | coredis.RedisCluster[bytes]


class ClusterUnavailable(Exception):
    """Redis did not answer (refused, failed or past the call's deadline): the request that
    needed it is answered 503 ``cluster_unavailable`` with ``Retry-After``."""


class ClusterStartError(DaemonStartError):
    """The node cannot join the cluster, or must leave it (the message is the one-line
    reason; the daemon exits with status 1)."""


@dataclass(frozen=True)
class Scripts:
    """The cluster's scripts, registered on the node's client (see daemon.core.cluster)."""

    claim: Any
    renew: Any
    append: Any
    set_epoch: Any
    release: Any
    compact: Any
    readers_set: Any
    readers_get: Any
    lookup: Any
    join: Any
    refresh: Any


def leaf(exc: BaseException) -> BaseException:
    """The one exception a (nested) exception group holds (coredis' task groups wrap theirs)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def decode_hash(raw: dict[Any, Any]) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else str(k)):
            (v.decode() if isinstance(v, bytes) else str(v)) for k, v in raw.items()}


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Redis:
    """The node's Redis: one client (and one more per mirror, see :meth:`new_client`), the
    scripts, and the calls with deadlines."""

    def __init__(self, url: str, node_id: str, lease_s: float) -> None:
        self.url = url
        self.node_id = node_id  # for the log lines
        self.lease_s = lease_s
        self.call_timeout_s = min(5.0, max(0.5, lease_s / 2))
        self.bulk_timeout_s = max(BULK_TIMEOUT_S, lease_s)
        self.link = RedisLink(lease_s)
        self.is_cluster = False
        self.client: Client | None = None
        self._scripts: Scripts | None = None

    @property
    def scripts(self) -> Scripts:
        assert self._scripts is not None, "Redis.open() first"
        return self._scripts

    @property
    def retry_after_s(self) -> int:
        """The ``Retry-After`` of a 503 for Redis trouble: half a lease, at least 1 s."""
        return max(1, round(self.lease_s / 2))

    # -- joining ------------------------------------------------------------------------------

    async def check(self) -> None:
        """Find out whether the URL is a Redis Cluster, and refuse any master without AOF
        (:class:`ClusterStartError`)."""
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
            exc = leaf(raised)
            if isinstance(exc, ClusterStartError):
                raise exc from None
            raise ClusterStartError(
                f"cannot join the cluster at {self.url}: {type(exc).__name__}: {exc}") from None

    @staticmethod
    async def _check_aof(client: coredis.Redis[bytes], where: str) -> None:
        got = await client.config_get(["appendonly"])
        value = got.get(b"appendonly", b"")
        if value != b"yes":
            raise ClusterStartError(
                f"Redis at {where} has AOF persistence off (appendonly {value.decode() or 'unknown'}): cluster mode "
                "keeps the transcript there and refuses to run without it "
                "(CONFIG SET appendonly yes, or appendonly yes in redis.conf)")

    def new_client(self) -> Client:
        """A client of the cluster's Redis with connections of its own."""
        if self.is_cluster:
            return coredis.RedisCluster.from_url(self.url)
        return coredis.Redis.from_url(self.url)

    @asynccontextmanager
    async def open(self) -> AsyncIterator[None]:
        """The node's client, with the scripts registered, for the node's lifetime."""
        client = self.new_client()
        async with client:
            self.client = client
            self._scripts = Scripts(
                claim=client.register_script(CLAIM_SCRIPT),
                renew=client.register_script(RENEW_SCRIPT),
                append=client.register_script(APPEND_SCRIPT),
                set_epoch=client.register_script(SET_EPOCH_SCRIPT),
                release=client.register_script(RELEASE_SCRIPT),
                compact=client.register_script(COMPACT_SCRIPT),
                readers_set=client.register_script(READERS_SET_SCRIPT),
                readers_get=client.register_script(READERS_GET_SCRIPT),
                lookup=client.register_script(LOOKUP_SCRIPT),
                join=client.register_script(JOIN_SCRIPT),
                refresh=client.register_script(REFRESH_SCRIPT))
            yield

    # -- calls, each with a deadline ------------------------------------------------------------

    async def call(self, fn: Callable[[], Awaitable[T]], *, timeout: float | None = None) -> T:
        """``await fn()`` (one Redis call) within ``timeout`` (``call_timeout_s``); Redis
        refusing, failing or not answering in time raises :class:`ClusterUnavailable` and is
        noted in :attr:`link` (an outage, then the grace after it)."""
        limit = self.call_timeout_s if timeout is None else timeout
        with trio.move_on_after(limit):
            try:
                result = await fn()
            except Exception as exc:  # coredis wraps its errors in exception groups
                self._link_failed(repr(leaf(exc)))
                raise ClusterUnavailable(f"Redis failed: {leaf(exc)!r}") from None
            if self.link.answered(trio.current_time()):
                log.warning("event=redis_available node=%s grace_ms=%d", self.node_id,
                            round(self.lease_s * 1000))
            return result
        self._link_failed(f"no answer within {limit:g} s")
        raise ClusterUnavailable(f"Redis did not answer within {limit:g} s")

    def _link_failed(self, why: str) -> None:
        if self.link.failed(trio.current_time()):
            log.warning("event=redis_unavailable node=%s error=%s", self.node_id, why)

    # -- reading the directory ------------------------------------------------------------------

    async def lookup(self, session_id: str) -> tuple[DirectoryEntry | None, int, dict[str, str]]:
        """The directory entry, the lease's remaining ms (negative: none) and the raw hash."""
        keys = session_keys(session_id)
        got: Any = await self.call(lambda: self.scripts.lookup(
            keys=[keys.directory, keys.lease]))
        flat, pttl = list(got[0]), int(got[1])
        fields = decode_hash(dict(zip(flat[::2], flat[1::2], strict=True)))
        return DirectoryEntry.from_hash(fields), pttl, fields

    async def op_log(self, session_id: str) -> list[Op]:
        client = self.client
        assert client is not None
        raw = await self.call(lambda: client.lrange(session_keys(session_id).ops, 0, -1),
                              timeout=self.bulk_timeout_s)
        return [decode_op(item) for item in raw]

    async def events(self, session_id: str) -> Any:
        """Every entry of the session's event stream (``XRANGE``)."""
        client = self.client
        assert client is not None
        return await self.call(lambda: client.xrange(session_keys(session_id).events),
                               timeout=self.bulk_timeout_s)

    async def readers(self, session_id: str, own: int) -> dict[str, int]:
        """The session's subscribers per node: ``own`` here (the owner) and what the mirrors
        on other nodes report (see ``READERS_GET_SCRIPT``)."""
        flat: Any = []
        with trio.move_on_after(READERS_LOOKUP_S):
            try:
                flat = await self.call(lambda: self.scripts.readers_get(
                    keys=[session_keys(session_id).readers], args=[READERS_FRESH_MS]))
            except ClusterUnavailable as exc:  # Redis away: the owner's own count still answers
                log.warning("event=mirror_readers_failed session=%s error=%r", session_id, exc)
        return readers_by_node(list(flat), self.node_id, own)

    async def report_readers(self, session_id: str, count: int) -> None:
        await self.call(lambda: self.scripts.readers_set(
            keys=[session_keys(session_id).readers], args=[self.node_id, count,
                                                           READERS_FRESH_MS]))
