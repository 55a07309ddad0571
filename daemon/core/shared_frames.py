"""A bus's newest events framed once and shared by every subscriber of one transport. Pure.

The frames are SSE's (:data:`sdk.protocol.sse.SSE_FRAME`, the one definition of their layout,
formatted many at a time: :func:`daemon.core.frame_codec.sse_frames`) or WebSocket text
messages (:func:`daemon.core.frame_codec.ws_frames`): a bus keeps one :class:`SharedFrames` of
each.

Subscribers that keep up are woken together and all want the same events: the frames of one
wake-up's events (``id:``/``event:`` lines, ``data:`` and the envelope, joined into one bytes
object) are built by the first subscriber that asks and reused by the others, so the per-event
work of a write does not grow with the number of subscribers, and each write is one send.

A *segment* is one such bytes object for a contiguous id range, found by its first id; a
subscriber whose cursor ends a segment takes the next one, and builds it if nobody has yet. The
segments held are bounded in bytes (the oldest go first): a subscriber that is further behind
builds its own bytes from the ring, as every subscriber did before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

from daemon.core.envelope import Event
from daemon.core.frame_codec import sse_frames

__all__ = ["DEFAULT_MAX_BYTES", "SharedFrames"]

DEFAULT_MAX_BYTES: Final = 1024 * 1024


class _Ring(Protocol):
    @property
    def last_id(self) -> int: ...
    def since(self, after_id: int) -> list[Event]: ...


class SharedFrames:
    """Segments of frames by first id, at most ``max_bytes`` of them (bar the newest);
    ``build`` frames a run of ring events (SSE frames by default)."""

    __slots__ = ("_build", "_by_start", "_held", "_order", "max_bytes")

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES,
                 build: Callable[[list[Event]], bytes] = sse_frames) -> None:
        self.max_bytes = max_bytes
        self._build = build
        self._by_start: dict[int, tuple[int, bytes]] = {}  # first id -> (last id, frames)
        self._order: deque[int] = deque()
        self._held = 0

    @property
    def held_bytes(self) -> int:
        return self._held

    def __len__(self) -> int:
        return len(self._by_start)

    def since(self, ring: _Ring, cursor: int) -> tuple[list[bytes], int]:
        """The frames of every ring event with id > ``cursor`` (one segment, or none) and the
        id they end at. The caller checked that the event after ``cursor`` is in the ring."""
        last = ring.last_id
        start = cursor + 1
        out: list[bytes] = []
        by_start = self._by_start
        while cursor < last:
            found = by_start.get(cursor + 1)
            if found is None:
                break
            end, blob = found
            if end > last:  # cannot happen within one bus (ids only grow); stay exact anyway
                break
            out.append(blob)
            cursor = end
        if cursor < last:
            events = ring.since(cursor)
            newest = events[-1].id if events else None
            if newest is not None:
                blob = self._build(events)
                self._keep(cursor + 1, newest, blob)
                out.append(blob)
                cursor = newest
        if len(out) > 1:
            # Several segments go out in one send, so they are joined anyway: join them once
            # and keep the join under its first id, so that the other subscribers at the same
            # cursor take it whole instead of each joining (copying) the same bytes again.
            # (Subscribers that gather their writes, see daemon.streams, are woken at the
            # same cursor but build and take segments in turns: most take 2-3 of them.)
            blob = b"".join(out)
            self._keep(start, cursor, blob)
            out = [blob]
        return out, cursor

    def _keep(self, start: int, end: int, blob: bytes) -> None:
        old = self._by_start.get(start)
        if old is not None:  # a longer one replaces a shorter one with the same start
            self._held -= len(old[1])
        else:
            self._order.append(start)
        self._by_start[start] = (end, blob)
        self._held += len(blob)
        order = self._order
        while self._held > self.max_bytes and len(order) > 1:
            dropped = self._by_start.pop(order.popleft())
            self._held -= len(dropped[1])

    def clear(self) -> None:
        self._by_start.clear()
        self._order.clear()
        self._held = 0
