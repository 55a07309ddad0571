"""A subscriber's position in the shared ring and the slow-client rules. Pure.

Subscribers never hold a copy of events: each has a cursor into the bus's ring, and its *lag*
is how far that cursor is behind the newest event. Lag in frames is ``last_id - cursor``; lag in
bytes comes from the ring's cumulative byte offsets, so checking a subscriber is O(1).

While a subscriber replays, its cursor is already where live delivery will resume,
so the replayed frames do not count against the caps, but what is published meanwhile does;
and its replay position (the last replayed id handed to the transport) must stay in the ring:
a replay stalled until its next event left the ring is evicted like a live subscriber would be.
"""

from __future__ import annotations

from typing import Final, Protocol

import msgspec

from daemon.core.envelope import Event, typed_synthetic
from sdk.protocol.events import ClientEvictedData, SlowClientWarningData

MAX_QUEUED_DEFAULT: Final = 256
MAX_QUEUED_MIN: Final = 16
MAX_QUEUED_MAX: Final = 2048
MAX_QUEUED_BYTES: Final = 2 * 1024 * 1024
WARN_FRACTION: Final = 0.75
REARM_FRACTION: Final = 0.375


class RingView(Protocol):
    @property
    def last_id(self) -> int: ...
    @property
    def first_id(self) -> int | None: ...
    def bytes_since(self, after_id: int) -> int: ...


class Warning(msgspec.Struct, frozen=True):
    data: SlowClientWarningData


class Eviction(msgspec.Struct, frozen=True):
    data: ClientEvictedData


def slow_client_warning_event(warning: Warning, now_ms: int) -> Event:
    """The id-less ``slow_client_warning`` frame of ``warning``."""
    return typed_synthetic(warning.data, now_ms=now_ms)


def client_evicted_event(eviction: Eviction, now_ms: int) -> Event:
    """The id-less ``client_evicted`` frame that ends an evicted subscriber's stream."""
    return typed_synthetic(eviction.data, now_ms=now_ms)


class SubscriberState:
    """Cursor and warning latch of one SSE/WS subscriber."""

    __slots__ = ("cursor", "evicted", "max_queued", "max_queued_bytes", "replay_pos", "warned")

    def __init__(
        self, cursor: int, max_queued: int = MAX_QUEUED_DEFAULT,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
    ) -> None:
        self.cursor = cursor  # last id handed to the transport
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        self.warned = False
        self.evicted: Eviction | None = None
        # While replaying: the last replayed id handed to the transport (or the id before the
        # first one); None once the replay is over.
        self.replay_pos: int | None = None

    def check(self, ring: RingView) -> Warning | Eviction | None:
        """Apply the slow-client rules against the ring's current head.

        Returns an :class:`Eviction` (sticky) when the lag overflows or the subscriber's next
        event (live, or the next one to replay) has already left the ring, a :class:`Warning`
        once when the lag crosses 75% of a cap (re-armed below 37.5%), else ``None``.
        """
        if self.evicted is not None:
            return self.evicted
        last = ring.last_id
        pos = self.replay_pos
        if pos is not None:
            first_held = ring.first_id
            if first_held is not None and first_held > pos + 1:
                return self._evict("queue_overflow", last - pos, ring.bytes_since(pos))
        frames = last - self.cursor
        if frames <= 0:
            if self.warned:
                self.warned = False
            return None
        first = ring.first_id
        queued_bytes = ring.bytes_since(self.cursor)
        if first is not None and first > self.cursor + 1:
            return self._evict("queue_overflow", frames, queued_bytes)
        if frames > self.max_queued:
            return self._evict("queue_overflow", frames, queued_bytes)
        if queued_bytes > self.max_queued_bytes:
            return self._evict("queue_bytes_overflow", frames, queued_bytes)
        over_frames = frames >= WARN_FRACTION * self.max_queued
        over_bytes = queued_bytes >= WARN_FRACTION * self.max_queued_bytes
        if self.warned:
            if (frames < REARM_FRACTION * self.max_queued
                    and queued_bytes < REARM_FRACTION * self.max_queued_bytes):
                self.warned = False
            return None
        if over_frames or over_bytes:
            self.warned = True
            threshold = (
                "frames_and_bytes" if over_frames and over_bytes
                else "frames" if over_frames else "bytes"
            )
            return Warning(SlowClientWarningData(
                queue_size=frames, max_queued=self.max_queued, last_event_id=self.cursor,
                queued_bytes=queued_bytes, max_queued_bytes=self.max_queued_bytes,
                threshold=threshold))
        return None

    def evict_now(self, reason: str, ring: RingView) -> Eviction:
        return self._evict(reason, ring.last_id - self.cursor, ring.bytes_since(self.cursor))

    def _evict(self, reason: str, frames: int, queued_bytes: int) -> Eviction:
        # droppedAfter: the last id handed over (mid-replay, the last replayed one).
        dropped = self.cursor if self.replay_pos is None else self.replay_pos
        self.evicted = Eviction(ClientEvictedData(
            reason=reason, dropped_after=dropped, queue_size=frames,
            max_queued=self.max_queued, queued_bytes=queued_bytes,
            max_queued_bytes=self.max_queued_bytes))
        return self.evicted
