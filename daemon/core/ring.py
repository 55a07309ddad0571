"""Event ring and the resume decision. Pure core: no trio, no clock, no I/O.

The ring holds the last ``capacity`` published events of one bus, and no more than ``max_bytes``
of them (the newest event always stays, however large). Ids are contiguous, so event ``i`` lives
at slot ``i % size`` of an array of ``size`` slots: append, lookup and the byte count of a suffix
are all O(1) (amortized O(1) when the byte cap drops several old events at once, or the array
grows). The array starts small and doubles, up to ``capacity``, only as events arrive: an idle
session's ring costs a few hundred bytes, not the ``capacity`` slots (128 KB at the default
8,000) it may grow to. An event dropped for
bytes leaves the ring exactly like one dropped for count: its id is below ``first_id``, so a
cursor before it gets ``ring_evicted`` on resume and a live subscriber still waiting for it is
evicted. The byte count comes from cumulative offsets (bytes published up to and
including each event), which is how the bus measures a subscriber's lag in bytes.

:func:`decide_resume` is the whole of the SSE/WS resume algorithm: given the ring and a client's
cursor and epoch it returns the synthetic frames and ring events to send, and the id after which
live delivery continues. It never yields a duplicate, and every gap it leaves is announced by a
``state_resync_required`` frame sent before the events that follow the gap.
"""

from __future__ import annotations

from itertools import accumulate
from operator import attrgetter
from typing import Final

import msgspec

from daemon.core.envelope import Event, typed_synthetic
from sdk.protocol.constants import (
    RESYNC_EPOCH_MISMATCH,
    RESYNC_EPOCH_RESET,
    RESYNC_REPLAY_BUDGET_EXCEEDED,
    RESYNC_RING_EVICTED,
    RESYNC_SEEDED_REPLAY_NOT_IN_RING,
)
from sdk.protocol.events import ReplayCompleteData, StateResyncRequiredData

__all__ = [
    "DEFAULT_RING_BYTES",
    "DEFAULT_RING_SIZE",
    "REPLAY_BUDGET_BYTES",
    "EventRing",
    "ResumePlan",
    "decide_resume",
]

DEFAULT_RING_SIZE: Final = 8000
# Twice the replay budget: any cursor a replay could serve in full is still in the ring.
DEFAULT_RING_BYTES: Final = 16 * 1024 * 1024
REPLAY_BUDGET_BYTES: Final = 8 * 1024 * 1024
# Slots a new ring starts with (then doubled as needed, up to its capacity).
INITIAL_SLOTS: Final = 64

_size = attrgetter("size")


class EventRing:
    """The last ``capacity`` events of a bus, by id, within ``max_bytes`` (bar the newest)."""

    __slots__ = ("_count", "_ends", "_events", "_held", "_total", "capacity", "max_bytes",
                 "next_id")

    def __init__(
        self,
        capacity: int = DEFAULT_RING_SIZE,
        next_id: int = 1,
        max_bytes: int = DEFAULT_RING_BYTES,
        *,
        initial_slots: int = INITIAL_SLOTS,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"event ring capacity must be a positive int, got {capacity!r}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"event ring max_bytes must be a positive int, got {max_bytes!r}")
        if isinstance(next_id, bool) or not isinstance(next_id, int) or next_id < 1:
            raise ValueError(f"event ring next_id must be an int >= 1, got {next_id!r}")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.next_id = next_id
        slots = max(1, min(capacity, initial_slots))
        self._events: list[Event | None] = [None] * slots
        # _ends[i % slots]: bytes appended to this ring up to and including event i.
        self._ends: list[int] = [0] * slots
        self._total = 0
        self._held = 0  # bytes of the events held now
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def first_id(self) -> int | None:
        """Oldest id still held, None when empty."""
        return self.next_id - self._count if self._count else None

    @property
    def last_id(self) -> int:
        """Newest id published on this bus (``next_id - 1``; 0 before the first)."""
        return self.next_id - 1

    @property
    def slots(self) -> int:
        """Slots allocated now (grows with the events held, up to ``capacity``)."""
        return len(self._events)

    @property
    def total_bytes(self) -> int:
        """Bytes of the events held now."""
        return self._held

    @property
    def appended_bytes(self) -> int:
        """Bytes of every event appended so far, held or not."""
        return self._total

    def append(self, event: Event) -> None:
        """Hold ``event`` (whose id must be ``next_id``), then drop the oldest events while
        more than ``capacity`` are held, or more than ``max_bytes`` and more than one."""
        if event.id != self.next_id:
            raise ValueError(
                f"event ring expects id {self.next_id} next, got {event.id!r} ({event.type})"
            )
        if self._count == len(self._events) < self.capacity:
            self._grow(self._count + 1)
        events = self._events
        slot = event.id % len(events)
        if self._count == self.capacity:
            overwritten = events[slot]  # the oldest event: it leaves for count
            assert overwritten is not None
            self._held -= overwritten.size
            self._count -= 1
        self._total += event.size
        self._held += event.size
        events[slot] = event
        self._ends[slot] = self._total
        self.next_id += 1
        self._count += 1
        if self._held > self.max_bytes:
            self._drop_for_bytes()

    def extend(self, events: list[Event]) -> list[int]:
        """:meth:`append` of each of ``events`` (ids ``next_id`` onwards, consecutive), with
        the slots, offsets and counts updated a slice at a time.

        Returns the run's cumulative offsets, ``len(events) + 1`` of them: element ``k`` is
        the bytes appended to this ring before ``events[k]`` (the last: after the run), so
        ``offsets[j] - offsets[i]`` is the size of ``events[i:j]``. The live journals take
        them as they are (``LiveJournals.append_chunks``) instead of adding the sizes up again.
        """
        count = len(events)
        if count == 1:  # a paced turn's usual run: append's work is all there is
            before = self._total
            self.append(events[0])
            return [before, self._total]
        if not count:
            return [self._total]
        first = self.next_id
        if events[0].id != first or events[-1].id != first + count - 1:
            raise ValueError(
                f"event ring expects ids {first}..{first + count - 1} next, got "
                f"{events[0].id!r}..{events[-1].id!r}")
        # offsets[k + 1] is what _ends holds for events[k].
        offsets = list(accumulate(map(_size, events), initial=self._total))
        if count > self.capacity:  # only the newest capacity of them could stay
            for event in events:
                self.append(event)
            return offsets
        if self._count + count > len(self._events) < self.capacity:
            self._grow(self._count + count)
        slots = self._events
        # The array holds every event of the run and the held ones, or is at capacity (then
        # the oldest make room, as below).
        capacity = len(slots)
        # Slots the run overwrites still hold the oldest events (or None once dropped for
        # bytes): they leave now, as append would have made them leave one by one.
        overflow = self._count + count - capacity
        if overflow > 0:
            # Their bytes from the offsets (all of them are held, so their offsets are valid).
            oldest = (first - self._count) % capacity
            newest_gone = (first - self._count + overflow - 1) % capacity
            oldest_event = slots[oldest]
            assert oldest_event is not None
            self._held -= self._ends[newest_gone] - self._ends[oldest] + oldest_event.size
            self._count -= overflow
        lo = first % capacity
        head = min(count, capacity - lo)
        slots[lo:lo + head] = events[:head]
        self._ends[lo:lo + head] = offsets[1:head + 1]
        if head < count:
            slots[:count - head] = events[head:]
            self._ends[:count - head] = offsets[head + 1:]
        self._held += offsets[-1] - self._total
        self._total = offsets[-1]
        self.next_id = first + count
        self._count += count
        if self._held > self.max_bytes:
            self._drop_for_bytes()
        return offsets

    def _grow(self, needed: int) -> None:
        """Double the array until it holds ``needed`` events (at most ``capacity`` slots),
        moving each held event (and its offset) to its slot in the new array."""
        old_events, old_ends = self._events, self._ends
        old_size = len(old_events)
        size = old_size
        while size < needed and size < self.capacity:
            size *= 2
        size = min(size, self.capacity)
        events: list[Event | None] = [None] * size
        ends = [0] * size
        for event_id in range(self.next_id - self._count, self.next_id):
            events[event_id % size] = old_events[event_id % old_size]
            ends[event_id % size] = old_ends[event_id % old_size]
        self._events, self._ends = events, ends

    def _drop_for_bytes(self) -> None:
        events = self._events
        capacity = len(events)
        while self._held > self.max_bytes and self._count > 1:
            slot = (self.next_id - self._count) % capacity
            oldest = events[slot]
            assert oldest is not None
            # The slot is freed now (the event's bytes go with it); _ends keeps its offset,
            # which bytes_since never reads for an id below first_id.
            events[slot] = None
            self._held -= oldest.size
            self._count -= 1

    def get(self, event_id: int) -> Event | None:
        if self._count and self.next_id - self._count <= event_id < self.next_id:
            return self._events[event_id % len(self._events)]
        return None

    def since(self, after_id: int) -> list[Event]:
        """Held events with id > ``after_id``, ascending."""
        start = max(after_id + 1, self.next_id - self._count)
        if start >= self.next_id:
            return []
        events = self._events
        capacity = len(events)
        lo = start % capacity
        hi = lo + (self.next_id - start)
        chunk = events[lo:hi] if hi <= capacity else events[lo:] + events[: hi - capacity]
        return chunk  # type: ignore[return-value]  # every slot in the held range is filled

    def bytes_since(self, after_id: int) -> int:
        """Total size of the held events with id > ``after_id``, in O(1)."""
        first = self.next_id - self._count
        if after_id >= self.next_id - 1 or not self._count:
            return 0
        size = len(self._events)
        if after_id < first:
            oldest = self._events[first % size]
            assert oldest is not None
            return self._total - self._ends[first % size] + oldest.size
        return self._total - self._ends[after_id % size]


class ResumePlan(msgspec.Struct, frozen=True):
    """What a subscriber with a cursor is sent before live delivery.

    Send ``before``, then ``replay``, then ``after``; then deliver live events with
    id > ``cursor``.
    """

    before: list[Event]
    replay: list[Event]
    after: list[Event]
    cursor: int

    def frames(self) -> list[Event]:
        """All frames of the plan in sending order."""
        return [*self.before, *self.replay, *self.after]


def _resync(reason: str, last_delivered_id: int, earliest_available_id: int,
            now_ms: int | None, detail: str | None = None) -> Event:
    return typed_synthetic(StateResyncRequiredData(
        reason=reason, detail=detail, last_delivered_id=last_delivered_id,
        earliest_available_id=earliest_available_id), now_ms=now_ms)


def decide_resume(
    ring: EventRing,
    cursor: int | None,
    client_epoch: str | None,
    bus_epoch: str,
    *,
    now_ms: int | None = None,
    budget_bytes: int = REPLAY_BUDGET_BYTES,
) -> ResumePlan:
    """Where a reconnecting reader resumes: live only, a replay from the ring, or a resync.

    ``cursor`` is the client's Last-Event-ID (None: live only, no ``replay_complete``; 0 replays
    the whole ring); ``client_epoch`` its epoch header (None when absent or invalid). Synthetic
    frames carry ``_meta.serverTimestamp = now_ms`` when ``now_ms`` is given.
    """
    newest = ring.last_id
    if cursor is None:
        return ResumePlan([], [], [], newest)
    if cursor < 0:
        raise ValueError(f"resume cursor must be >= 0, got {cursor}")
    first = ring.first_id
    earliest = first if first is not None else ring.next_id
    before: list[Event] = []

    epoch_mismatch = client_epoch is not None and client_epoch != bus_epoch
    if epoch_mismatch or cursor >= ring.next_id:
        before.append(_resync(RESYNC_EPOCH_RESET, cursor, earliest, now_ms,
                              detail=RESYNC_EPOCH_MISMATCH if epoch_mismatch else None))
        after_id = 0  # the client's ids mean nothing on this bus: the whole ring
    else:
        if first is None:
            if cursor < newest:
                before.append(_resync(RESYNC_SEEDED_REPLAY_NOT_IN_RING, cursor, earliest,
                                      now_ms))
        elif first > cursor + 1:
            before.append(_resync(RESYNC_RING_EVICTED, cursor, earliest, now_ms))
        after_id = cursor

    replay = ring.since(after_id)
    after: list[Event] = []
    if replay and ring.bytes_since(after_id) > budget_bytes:
        used = 0
        sent = 0
        for event in replay:
            if sent and used + event.size > budget_bytes:
                break
            used += event.size
            sent += 1
        if sent < len(replay):
            replay = replay[:sent]
            after.append(_resync(RESYNC_REPLAY_BUDGET_EXCEEDED, replay[-1].id or 0,
                                 newest + 1, now_ms))

    last_replayed = replay[-1].id if replay else None
    after.append(typed_synthetic(ReplayCompleteData(
        last_replayed_event_id=last_replayed, last_event_id=last_replayed,
        replayed_count=len(replay)), now_ms=now_ms))
    return ResumePlan(before, replay, after, newest)
