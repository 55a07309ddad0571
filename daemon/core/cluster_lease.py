"""When a cluster node may act as a session's owner, and when it may take a session over, as
decisions over times the shell passes in. Pure: no clock, no Redis.

**The lease clock.** Redis expires a lease ``--lease-ms`` after it processed the claim or the
renewal that set it, and no other node can claim the session before that. So a node that sent a
successful claim or renewal at (monotonic) time ``t`` knows that nobody else owns the session
until ``t + lease`` at the earliest: until then everything it publishes is the owner's. Past it
(the node was paused, or Redis did not answer its renewals) the lease is *in doubt*: another node
may have taken the session over, and nothing more of it may reach a client until a renewal
confirms the lease again (or shows it lost). :class:`LeaseClock` keeps that deadline per
session, a little short of the lease (:data:`LEASE_SAFETY`) so that clocks running at slightly
different rates on the node and on Redis cannot make it late.

**The grace after Redis comes back.** A Redis outage longer than the lease (a restart, a freeze)
lets every lease expire although every owner is alive: the first node to reach Redis afterwards
would take sessions from healthy owners. :class:`RedisLink` records what this node saw of Redis;
for :data:`GRACE_LEASES` leases after Redis answered again following a failure, this node takes
over nothing: it forwards to the owner the directory names, which renews its leases in that time
(its renewal loop runs every third of a lease, and any request for a session whose lease it
doubts renews at once). Two leases: the owner may itself need a moment to reconnect, and one
forward to a silent owner takes up to a lease. A truly dead owner's sessions are taken over once
the grace is over, two leases later than usual. (Every node notices an outage long enough to
expire a lease: a lease expires only after two renewal periods without an answer, and every
node refreshes its own registration each period.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

# The lease clock trusts a confirmed lease for this fraction of it (see the module docstring).
LEASE_SAFETY: Final = 0.9
# How long, in leases, a node that saw Redis fail and come back takes nothing over.
GRACE_LEASES: Final = 2.0


@dataclass
class LeaseClock:
    """Per owned session, until when this node is sure nobody else owns it."""

    lease_s: float
    _until: dict[str, float] = field(default_factory=dict)

    def confirmed(self, session_id: str, sent_at: float) -> None:
        """A claim or renewal of ``session_id`` sent at ``sent_at`` succeeded."""
        until = sent_at + self.lease_s * LEASE_SAFETY
        if until > self._until.get(session_id, float("-inf")):
            self._until[session_id] = until

    def valid(self, session_id: str, now: float) -> bool:
        """Is the lease of ``session_id`` certainly this node's at ``now``? ``False`` for a
        session this node never confirmed (or forgot)."""
        return now < self._until.get(session_id, float("-inf"))

    def remaining(self, session_id: str, now: float) -> float:
        return max(0.0, self._until.get(session_id, float("-inf")) - now)

    def forget(self, session_id: str) -> None:
        self._until.pop(session_id, None)


@dataclass
class RedisLink:
    """What this node saw of Redis: whether its last call failed, and since when it answers
    again after a failure (the start of the grace, see the module docstring)."""

    lease_s: float
    down_since: float | None = None
    back_at: float | None = None
    failures: int = 0

    def failed(self, now: float) -> bool:
        """A call to Redis failed or did not answer in time; True when this starts an outage
        (the previous call had succeeded)."""
        self.failures += 1
        if self.down_since is None:
            self.down_since = now
            return True
        return False

    def answered(self, now: float) -> bool:
        """A call to Redis succeeded; True when this ends an outage (the grace starts)."""
        if self.down_since is None:
            return False
        self.down_since = None
        self.back_at = now
        return True

    @property
    def up(self) -> bool:
        return self.down_since is None

    def in_grace(self, now: float) -> bool:
        """Must this node leave expired leases to their owners now?"""
        return self.back_at is not None and now < self.back_at + self.lease_s * GRACE_LEASES

    def grace_left(self, now: float) -> float:
        if self.back_at is None:
            return 0.0
        return max(0.0, self.back_at + self.lease_s * GRACE_LEASES - now)
