"""This node's membership of the cluster: its registration and the leases of its sessions.
Trio shell over :mod:`daemon.core.cluster_identity` and :mod:`daemon.core.cluster_lease`.

- **Identity.** One node id is one live process: a starting node registers only if the id is
  free or its holder's heartbeat stood still (a crash), and a process whose id was taken over
  while it was paused leaves (:class:`ClusterStartError`). ``--node-url`` must reach this very
  process (:meth:`Membership.verify_url`).
- **Leases.** A claim takes a free lease and raises its generation; the owner renews every third
  of a lease; a release retires the generation (Redis refuses whatever of it arrives later);
  a refused renewal means another node owns the session now (:meth:`lost`), unless this node
  gave that lease up meanwhile (a renewal sent before the release, answered after it). The
  lease clock tells when this node may no longer be sure it owns a session: its bus's guard
  (:meth:`may_publish`) then starts a renewal, requests wait for it (:meth:`settle`), and so
  does a prompt about to be handed to the agent (:meth:`may_act`).

Who else must know is told through two lists of callbacks, :attr:`on_claimed` (the op-log
shipping learns the log's length) and :attr:`on_lost` (the shipping forgets the session, the
session here ends).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import trio

from ..core.cluster import (
    CLOSED_RETENTION_MS,
    IDLE_RETENTION_MS,
    node_key,
    node_ttl_ms,
    renew_interval_ms,
    session_keys,
)
from ..core.cluster_identity import WATCH_REFRESHES, join_result, refusal
from ..core.cluster_lease import LeaseClock
from ._redis import ClusterStartError, ClusterUnavailable, Redis, leaf

log = logging.getLogger("daemon.cluster")


@dataclass
class Lease:
    """A lease this node holds: its generation, whether its release must mark the session
    closed (a client deleted it), and the latest release sent for it (set once answered)."""

    generation: int
    closing: bool = False
    releasing: trio.Event | None = None


class Membership:
    """This node's registration and the leases it holds (see the module docstring)."""

    def __init__(self, redis: Redis, node_id: str, node_url: str, lease_ms: int, *,
                 idle_retention_ms: int = IDLE_RETENTION_MS,
                 closed_retention_ms: int = CLOSED_RETENTION_MS) -> None:
        self.redis = redis
        self.node_id = node_id
        self.node_url = node_url
        self.lease_ms = lease_ms
        self.lease_s = lease_ms / 1000
        self.idle_retention_ms = idle_retention_ms
        self.closed_retention_ms = closed_retention_ms
        self.instance = secrets.token_hex(8)  # this process (see cluster_identity)
        self.lease = LeaseClock(self.lease_s)
        self.leases: dict[str, Lease] = {}
        self.busy: set[str] = set()  # sessions being taken over here (owned, not yet running)
        self.fenced: set[str] = set()
        self.probe_nonce: str | None = None  # while verify_url runs
        # (session id, the op log's length at the claim), for each successful claim.
        self.on_claimed: list[Callable[[str, int], None]] = []
        # (session id), once another node owns a session this node held.
        self.on_lost: list[Callable[[str], None]] = []
        # May an owned session's lease be given up now (nothing runs it here, nothing of it
        # waits to be shipped)? Set by whoever knows (daemon.cluster.Cluster).
        self.idle: Callable[[str], bool] = lambda session_id: False
        self._confirming: dict[str, trio.Event] = {}
        self._nursery: trio.Nursery | None = None

    def owns(self, session_id: str) -> bool:
        return session_id in self.leases

    def generation(self, session_id: str) -> int | None:
        lease = self.leases.get(session_id)
        return lease.generation if lease is not None else None

    # -- identity ---------------------------------------------------------------------------

    async def join(self) -> None:
        """Register this process as the node id, refusing an id a live process holds (see
        :mod:`daemon.core.cluster_identity`)."""
        key = node_key(self.node_id)
        join = self.redis.scripts.join
        args: list[str | int] = [self.instance, self.node_url, node_ttl_ms(self.lease_ms)]
        try:
            holder = join_result(await join(keys=[key], args=[*args, "", ""]))
            if holder is None:
                return
            watch_ms = round(WATCH_REFRESHES * renew_interval_ms(self.lease_ms) * 1.2)
            log.info("event=node_id_held node=%s holder_url=%s watching_ms=%d", self.node_id,
                     holder.url, watch_ms)
            await trio.sleep(watch_ms / 1000)  # the holder's heartbeat, if it lives, moves
            later = join_result(await join(keys=[key], args=[
                *args, holder.instance, holder.beat]))
        except ClusterStartError:
            raise
        except Exception as raised:
            exc = leaf(raised)
            raise ClusterStartError(f"cannot join the cluster at {self.redis.url}: "
                                    f"{type(exc).__name__}: {exc}") from None
        if later is not None:
            raise ClusterStartError(refusal(self.node_id, later))
        log.info("event=node_id_taken_from_dead_process node=%s", self.node_id)

    async def refresh_registration(self) -> None:
        key = node_key(self.node_id)
        ok = await self.redis.call(lambda: self.redis.scripts.refresh(
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
        """Take the session's lease; its new generation, or ``None`` if another node has it
        or the session is closed."""
        keys = session_keys(session_id)
        sent_at = trio.current_time()
        result = await self.redis.call(lambda: self.redis.scripts.claim(
            keys=keys.all(),
            args=[self.node_id, self.node_url, workspace, epoch, self.lease_ms,
                  self.idle_retention_ms]))
        ok, value = int(result[0]), int(result[1])
        if not ok:
            if value < 0:
                log.info("event=lease_claim_refused session=%s reason=closed", session_id)
            return None
        self.leases[session_id] = Lease(value)
        self.fenced.discard(session_id)
        self.lease.confirmed(session_id, sent_at)
        log.info("event=lease_claimed session=%s generation=%d", session_id, value)
        for claimed in self.on_claimed:
            claimed(session_id, int(result[2]))
        return value

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Renew the leases (every third of a lease) and run the confirmations the lease
        clock starts, for the node's lifetime."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self._renew_loop()

    async def _renew_loop(self) -> None:
        period = renew_interval_ms(self.lease_ms) / 1000
        while True:
            await trio.sleep(period)
            try:
                await self.refresh_registration()
            except ClusterUnavailable as exc:
                log.warning("event=lease_renew_failed error=%r", exc)
                continue
            for session_id in list(self.leases):
                try:
                    if session_id not in self.busy and self.idle(session_id):
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
        lease = self.leases.get(session_id)
        if lease is None:
            return False
        keys = session_keys(session_id)
        sent_at = trio.current_time()
        ok = await self.redis.call(lambda: self.redis.scripts.renew(keys=keys.all(), args=[
            self.node_id, lease.generation, self.lease_ms, self.idle_retention_ms]))
        if not int(ok):
            if lease.releasing is not None:
                # A release of this lease is out: Redis ran it before this renewal, whose
                # refusal may be read first. Its answer says whether the lease was given up.
                await lease.releasing.wait()
            if self.leases.get(session_id) is lease:  # not released or claimed anew meanwhile
                self.lost(session_id, "renew refused")
            return False
        self.lease.confirmed(session_id, sent_at)
        return True

    # -- the lease clock: is this node still the owner? ----------------------------------------

    def may_publish(self, session_id: str) -> bool:
        """The bus's guard (see daemon.core.cluster_lease): True while this node is sure it
        owns ``session_id``; False starts a confirmation with Redis. A session not claimed
        yet (a new one, whose claim ships with its creation) passes; a fenced one never."""
        if session_id not in self.leases:
            return session_id not in self.fenced
        if self.lease.valid(session_id, trio.current_time()):
            return True
        self.start_confirm(session_id)
        return False

    def in_doubt(self, session_id: str) -> bool:
        return session_id in self.leases and not self.lease.valid(session_id,
                                                                   trio.current_time())

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
                await self.refresh_registration()
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
        return session_id in self.leases and not self.in_doubt(session_id)

    async def may_act(self, session_id: str) -> bool:
        """The session runner's gate before it hands a prompt to the agent: True while this
        node is sure it owns ``session_id`` (a lease in doubt is confirmed with Redis first),
        False once it lost it. While Redis does not answer it keeps asking (paced, as
        :meth:`settle`), however long: nothing is handed over unconfirmed (the caller's
        cancellation ends the wait). A session not claimed yet passes, as with
        :meth:`may_publish`."""
        while self.in_doubt(session_id):
            await self.start_confirm(session_id).wait()
            if self.in_doubt(session_id):
                await trio.sleep(0.05)  # Redis did not answer: ask again (paced)
        return session_id in self.leases or session_id not in self.fenced

    async def release(self, session_id: str, *, closed: bool) -> None:
        """Give the lease up (``closed``: the session was deleted for good). When Redis does
        not answer, the session stays owned (and a close is remembered) for the next try."""
        lease = self.leases.get(session_id)
        if lease is None:
            return
        lease.closing = lease.closing or closed
        keys = session_keys(session_id)
        flag = "1" if lease.closing else "0"
        answered = lease.releasing = trio.Event()
        try:
            await self.redis.call(lambda: self.redis.scripts.release(keys=keys.all(), args=[
                self.node_id, lease.generation, flag, self.closed_retention_ms]))
            if self.leases.get(session_id) is not lease:
                return  # claimed again meanwhile: that lease is not the one given up
            self.leases.pop(session_id, None)
            self.lease.forget(session_id)
            log.info("event=lease_released session=%s closed=%s", session_id, lease.closing)
        finally:
            answered.set()  # after the lease is gone here: a renewal waiting on it sees that

    def lost(self, session_id: str, why: str) -> None:
        """Another node owns the session now: nothing of it may be written here again, and
        everyone on :attr:`on_lost` is told (the session here ends)."""
        if session_id in self.fenced:
            return
        self.fenced.add(session_id)
        self.leases.pop(session_id, None)
        self.lease.forget(session_id)
        log.warning("event=lease_lost session=%s reason=%s", session_id, why)
        for told in self.on_lost:
            told(session_id)

    async def release_all(self) -> None:
        """Graceful stop: give every lease up at once (the caller shipped what was queued)."""
        for session_id in list(self.leases):
            with trio.move_on_after(1):
                try:
                    await self.release(session_id, closed=False)
                except ClusterUnavailable as exc:
                    log.warning("event=lease_release_failed session=%s error=%r", session_id,
                                exc)
