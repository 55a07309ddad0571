"""Flow control between the agent reader (the publisher) and a bus's subscribers. Pure.

The rules, as decisions over numbers and times the shell passes in (``daemon.bus`` waits, the
agent channel paces its reads, ``daemon.streams`` gathers its writes):

- **Behind.** A subscriber whose write is in flight while it is :data:`FLOW_FRACTION` of the way
  to its caps (frames or bytes) is *behind* (:func:`behind`): the publisher waits for that write
  to finish before it publishes more, so a reader that keeps reading sets the pace instead of
  being evicted for a moment of not being scheduled. A write that does not finish within
  :data:`FLOW_STALL_S` is stalled: its subscriber is not waited for again until one of its
  writes completes, so a peer that stopped reading costs the turn :data:`FLOW_STALL_S` once and
  then reaches its caps and is evicted as before.
- **The waiting is rationed** per bus (:class:`WaitBudget`), so that readers who keep reading,
  but slowly (or a hostile one that reads just fast enough never to stall), cannot pace the
  agent: the publisher earns :data:`FLOW_BUDGET_RATE` seconds of waiting per second and holds
  at most :data:`FLOW_BUDGET_MAX` of it. Over any stretch of time T the whole bus waits at most
  ``FLOW_BUDGET_MAX + FLOW_BUDGET_RATE * T``; past that, slow subscribers meet their caps as
  they would without flow control.
- **Dispatch groups.** The agent reader publishes at most :func:`dispatch_group_lines` lines of
  a read before it yields so that subscribers write: a quarter of the smallest subscriber's
  ``maxQueued``, so that one group moves a subscriber that flow control let through (under half
  its cap) to under three quarters of it, never over; and never more than
  :data:`DISPATCH_GROUP_MAX`: larger groups let one load generator feeding 64 subscribers fall
  behind until the budget ran out and readers were evicted (the e2e benchmark's 64-subscriber
  row). Every group costs a flush, a wake-up and a write per subscriber whatever its size, so the
  largest safe group is the cheapest.
- **Gathering.** A live write that would be small first lets the publisher run a few more
  scheduler passes (:func:`worth_gathering`; never a timed wait): every write costs the server
  the same fixed price whatever its size, so a write that carries three dispatch groups instead
  of one pays it a third as often per event. Bounded by bytes (:data:`GATHER_BYTES`, about 350
  chunk frames) and by frames (a quarter of ``maxQueued``, so that with the next group the
  subscriber stays under half its cap, where flow control starts), and to
  :data:`GATHER_PASSES` passes per write (the figures behind these bounds:
  benchmarks/README.md, "Figures behind the code").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

__all__ = [
    "DISPATCH_GROUP_FRACTION",
    "DISPATCH_GROUP_MAX",
    "FLOW_BUDGET_MAX",
    "FLOW_BUDGET_RATE",
    "FLOW_FRACTION",
    "FLOW_STALL_S",
    "GATHER_BYTES",
    "GATHER_PASSES",
    "WaitBudget",
    "behind",
    "dispatch_group_lines",
    "worth_gathering",
]

FLOW_FRACTION: Final = 0.5
FLOW_STALL_S: Final = 0.5
FLOW_BUDGET_RATE: Final = 0.1
FLOW_BUDGET_MAX: Final = FLOW_STALL_S
DISPATCH_GROUP_FRACTION: Final = 0.25
DISPATCH_GROUP_MAX: Final = 64
GATHER_BYTES: Final = 128 * 1024
GATHER_PASSES: Final = 3


def behind(queued: int, queued_bytes: int, max_queued: int, max_queued_bytes: int) -> bool:
    """Is a subscriber with ``queued`` frames (``queued_bytes`` bytes) not yet written, and
    those caps, far enough behind that the publisher should wait for its write in flight?"""
    return (queued >= FLOW_FRACTION * max_queued
            or queued_bytes >= FLOW_FRACTION * max_queued_bytes)


def dispatch_group_lines(max_queueds: Iterable[int]) -> int:
    """How many agent lines may be published between two yields to subscribers whose
    ``maxQueued`` are ``max_queueds`` (none: :data:`DISPATCH_GROUP_MAX`)."""
    smallest = min(max_queueds, default=None)
    if smallest is None:
        return DISPATCH_GROUP_MAX
    return max(1, min(DISPATCH_GROUP_MAX, int(smallest * DISPATCH_GROUP_FRACTION)))


def worth_gathering(pending_bytes: int, pending: int, max_queued: int) -> bool:
    """Should a subscriber whose next live write would carry ``pending`` frames
    (``pending_bytes`` bytes) yield once more first, to let the publisher add to it?"""
    return 0 < pending_bytes < GATHER_BYTES and pending <= max_queued // 4


class WaitBudget(msgspec.Struct):
    """The publisher's ration of waiting for subscribers (see the module docstring); times are
    the shell's monotonic clock, in seconds."""

    left: float = FLOW_BUDGET_MAX
    at: float | None = None  # when ``left`` was last brought up to date

    def refill(self, now: float) -> None:
        """Earn what the time since the last update is worth (up to the maximum)."""
        if self.at is not None:
            self.left = min(FLOW_BUDGET_MAX, self.left + (now - self.at) * FLOW_BUDGET_RATE)
        self.at = now

    def allowance(self, stall_s: float = FLOW_STALL_S) -> float:
        """How long the next wait may last; 0 or less: rationed out."""
        return min(stall_s, self.left)

    def spend(self, waited: float) -> None:
        self.left -= waited
