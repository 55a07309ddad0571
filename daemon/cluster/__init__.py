"""Cluster mode: many daemons on one Redis (or a Redis Cluster).

Imported only when the daemon starts with ``--cluster-redis``: single-node mode never loads
coredis. The rules (keys, scripts, routing, leases) are the pure ``daemon.core.cluster*``
modules; this package runs them, in four parts composed by :class:`Cluster`:

- ``_membership``: this node's registration (one live process per node id, a ``--node-url``
  that reaches it) and the leases of the sessions it owns, with the lease clock;
- ``_shipping``: every transcript op of an owned session shipped to Redis in order, fenced by
  the lease generation: the transcript writer's replica (``TranscriptWriter(replicas=...)``);
- ``_router``: requests for sessions this node does not run: forwarded, answered 503, or the
  session taken over;
- ``_mirror``: event streams of sessions owned elsewhere, fed from Redis into ordinary buses;

over ``_redis``, the node's Redis with a deadline on every call. The parts meet the rest of the
daemon through small interfaces only: the writer's replica list, the bus's guard and its
public feeding methods, the manager's session table.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable

import trio

from ..bus import SessionBus
from ..core.cluster import CLOSED_RETENTION_MS, IDLE_RETENTION_MS
from ..manager import SessionManager
from ..transcript_writer import TranscriptWriter
from ._membership import Membership
from ._mirror import Mirrors
from ._redis import ClusterStartError, ClusterUnavailable, Redis
from ._router import ClusterRouter
from ._shipping import Shipping

__all__ = ["Cluster", "ClusterRouter", "ClusterStartError", "ClusterUnavailable"]

log = logging.getLogger("daemon.cluster")

# Test seam (tests/cluster): with this set to a directory, a session's dispatch gate first
# writes ``held`` there, then waits until ``go`` exists (shielded: a close does not end it),
# so that a test can stop the node between a prompt's 202 and its hand-off to the agent.
DISPATCH_HOLD_ENV = "TURNKEEPER_TEST_DISPATCH_HOLD"


class Cluster:
    """This daemon as a node of the cluster (its tasks run in the server's root nursery)."""

    def __init__(self, url: str, node_id: str, node_url: str, lease_ms: int,
                 events_cap: int, secret: str, *, idle_retention_ms: int = IDLE_RETENTION_MS,
                 closed_retention_ms: int = CLOSED_RETENTION_MS) -> None:
        self.redis = Redis(url, node_id, lease_ms / 1000)
        self.membership = Membership(self.redis, node_id, node_url, lease_ms,
                                     idle_retention_ms=idle_retention_ms,
                                     closed_retention_ms=closed_retention_ms)
        self.shipping = Shipping(self.redis, self.membership, events_cap, self._bus_for)
        self.mirrors = Mirrors(self.redis)
        self.secret = secret.encode()
        self.manager: SessionManager | None = None
        self.membership.idle = self._idle
        self.membership.on_lost.append(self._end_session)
        self._dispatch_hold = os.environ.get(DISPATCH_HOLD_ENV) or None

    @property
    def node_id(self) -> str:
        return self.membership.node_id

    @property
    def node_url(self) -> str:
        return self.membership.node_url

    @node_url.setter
    def node_url(self, url: str) -> None:
        self.membership.node_url = url

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Join (refusing a Redis without AOF and a node id a live process holds, before the
        daemon serves anything), then ship ops and renew leases for the node's lifetime."""
        await self.redis.check()
        async with self.redis.open():
            await self.membership.join()
            async with trio.open_nursery() as nursery:
                await nursery.start(self.shipping.run)
                await nursery.start(self.membership.run)
                log.info("event=cluster_joined node=%s instance=%s redis_cluster=%s "
                         "lease_ms=%d", self.node_id, self.membership.instance,
                         self.redis.is_cluster, self.membership.lease_ms)
                task_status.started()

    def attach(self, manager: SessionManager, writer: TranscriptWriter, *,
               token: str | None = None) -> ClusterRouter:
        """Serve ``manager``'s sessions as this node's: its buses get the lease clock as their
        guard, its runners the dispatch gate (:meth:`Membership.may_act`), its status counts
        the mirrors' readers; returns the router for the ASGI app."""
        self.manager = manager
        manager.node_id = self.node_id
        manager.cluster_readers = self.redis.readers
        manager.cluster_recovery = self.shipping.recovery
        manager.publish_guard = self._publish_guard
        manager.dispatch_gate = self._dispatch_gate
        return ClusterRouter(self.redis, self.membership, self.shipping, self.mirrors,
                             manager, writer, self.secret, token=token)

    async def verify_url(self, probe: Callable[[str], Awaitable[bool]]) -> None:
        await self.membership.verify_url(probe)

    async def release_all(self) -> None:
        """Graceful stop: ship what is queued, then give every lease up at once."""
        with trio.move_on_after(2):
            await self.shipping.wait_acked(self.shipping.last_seq)
        await self.membership.release_all()

    def _publish_guard(self, session_id: str) -> Callable[[], bool]:
        membership = self.membership
        return lambda: membership.may_publish(session_id)

    def _dispatch_gate(self, session_id: str) -> Callable[[], Awaitable[bool]]:
        membership = self.membership
        hold = self._dispatch_hold
        if hold is None:
            return lambda: membership.may_act(session_id)

        async def held() -> bool:
            with trio.CancelScope(shield=True):
                await _held_until_go(trio.Path(hold))
            return await membership.may_act(session_id)
        return held

    def _bus_for(self, session_id: str) -> SessionBus | None:
        session = self.manager.sessions.get(session_id) if self.manager is not None else None
        return session.bus if session is not None else None

    def _idle(self, session_id: str) -> bool:
        """May the lease of ``session_id`` be given up: it does not run here and nothing of
        it waits to be shipped."""
        runs = self.manager is not None and session_id in self.manager.sessions
        return not runs and self.shipping.idle(session_id)

    def _end_session(self, session_id: str) -> None:
        """Another node owns the session now: the local copy ends. Its readers here are cut
        first (their streams end; they resume from the new owner's stream), so nothing it
        publishes from now on reaches them."""
        manager = self.manager
        session = manager.sessions.get(session_id) if manager is not None else None
        if manager is not None and session is not None:
            session.bus.cut_subscribers("lease_lost")
            session.bus.close()
            manager.nursery.start_soon(session.close, "lease_lost")


async def _held_until_go(directory: trio.Path) -> None:
    """The test seam's wait (see :data:`DISPATCH_HOLD_ENV`)."""
    await (directory / "held").touch()
    while not await (directory / "go").exists():
        await trio.sleep(0.02)  # a test seam: polling the test's file
