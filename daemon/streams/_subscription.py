"""One reader of a bus and what every transport does with it: the subscription (cursor, warning
latch, writes in flight), the watchers that cut a stalled or evicted stream, the pump that takes
the next events or shared frames after the cursor, and the replay of a resume plan in groups.
Trio shell."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import trio

from ..bus import SessionBus
from ..clock import now_ms
from ..core.envelope import Event
from ..core.flow_control import worth_gathering
from ..core.frame_codec import ws_frames
from ..core.shared_frames import SharedFrames
from ..core.subscriber import (
    SubscriberState,
    Warning,
    slow_client_warning_event,
)
from ..metrics import totals
from ._request import Receive, Send

log = logging.getLogger("daemon.streams")


class Subscription:
    """One SSE/WS reader of a bus: its ring cursor, warning latch and the scope that stops it
    (what the bus needs of it: :class:`daemon.fanout.BusReader`)."""

    __slots__ = ("_idle", "abort", "evicted", "flow_stalled_at", "pending_warning", "scope",
                 "sending", "state", "writes_done")

    def __init__(self, state: SubscriberState) -> None:
        self.state = state
        self.scope: trio.CancelScope | None = None
        # Cuts the transport when a write is stalled (the server does not let it be cancelled).
        self.abort: Callable[[], object] | None = None
        self.pending_warning: Warning | None = None
        # True while a write is in flight. Only then can lag build up: an idle subscriber
        # takes every new event the moment it runs (they are handed over in one write).
        self.sending = False
        # Writes completed so far: one that stays in flight with this count unchanged is
        # stalled (see watch_stalled_writes).
        self.writes_done = 0
        # writes_done when flow control last found a write of this subscriber stalled.
        self.flow_stalled_at: int | None = None
        self._idle = trio.Event()
        self.evicted = trio.Event()

    def begin_write(self) -> None:
        self.sending = True
        self._idle = trio.Event()

    def end_write(self) -> None:
        self.sending = False
        self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no write is in flight."""
        if self.sending:
            await self._idle.wait()


EVICTED_FRAME_TIMEOUT_S = 0.5
EVICTED_WRITE_GRACE_S = 1.0


async def watch_eviction(sub: Subscription) -> None:
    """Once evicted, give the write in flight a moment to finish (the stream then says
    ``client_evicted`` and closes); a write still stalled after that is cut off."""
    await sub.evicted.wait()
    with trio.move_on_after(EVICTED_WRITE_GRACE_S):
        await sub.wait_idle()
        return
    if sub.scope is not None:
        sub.scope.cancel()
    if sub.abort is not None:
        sub.abort()


async def watch_stalled_writes(sub: Subscription, limit_s: float) -> None:
    """Cut a connection whose write has made no progress for ``limit_s``: its peer stopped
    reading. The slow-client rules evict a stalled subscriber once the session publishes past
    its caps; this also frees its slot while nothing is published (a stalled replay of a
    quiet session would otherwise hold it for as long as the peer keeps the socket open)."""
    period = limit_s / 4
    mark: tuple[int, float] | None = None  # (writes_done, first seen stuck at)
    while True:
        await trio.sleep(period)
        if not sub.sending:
            mark = None
            continue
        now = trio.current_time()
        if mark is None or mark[0] != sub.writes_done:
            mark = (sub.writes_done, now)
            continue
        if now - mark[1] >= limit_s:
            log.info("event=stalled_write_cut stalled_ms=%d", round((now - mark[1]) * 1000))
            if sub.scope is not None:
                sub.scope.cancel()
            if sub.abort is not None:
                sub.abort()
            return


async def final_send(sub: Subscription, send: Send, messages: list[MutableMapping[str, Any]],
                     timeout: float) -> None:
    """Best-effort closing messages. The server's writes cannot be cancelled, so a peer that
    stopped reading would hold them forever: past ``timeout`` the connection is cut."""

    async def cut_after_timeout() -> None:
        await trio.sleep(timeout)
        if sub.abort is not None:
            sub.abort()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut_after_timeout)
            for message in messages:
                await send(message)
            nursery.cancel_scope.cancel()
    except Exception:
        log.debug("event=stream_close_failed", exc_info=True)


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope, kind: str) -> None:
    while True:
        message = await receive()
        if message["type"] == kind:
            scope.cancel()
            return


class EventPump:
    """Moves ring events to one transport: replay first, then live batches."""

    def __init__(self, bus: SessionBus, sub: Subscription, heartbeat_s: float) -> None:
        self.bus = bus
        self.sub = sub
        self.heartbeat_s = heartbeat_s

    def _evicted(self) -> bool:
        """Evict the subscriber if its next event already left the ring; True once evicted."""
        sub, ring = self.sub, self.bus.ring
        state = sub.state
        if state.evicted is None:
            first = ring.first_id
            if first is not None and first > state.cursor + 1:
                state.evict_now("queue_overflow", ring)  # the next event left the ring
        if state.evicted is not None:
            self.bus.evict(sub)
            return True
        return False

    def _take_warning(self) -> Event | None:
        bus = self.bus
        if bus.resyncs:  # the bus moved to a new epoch (a cluster mirror)
            resync = bus.take_resync(self.sub)
            if resync is not None:
                return resync
        warning = self.sub.pending_warning
        self.sub.pending_warning = None
        if warning is None:
            return None
        return slow_client_warning_event(warning, now_ms())

    def worth_gathering(self) -> bool:
        """True when the subscriber's next live write would be small and more may come
        (:func:`daemon.core.flow_control.worth_gathering`): the caller then yields once, so
        the publisher, if it has more read, publishes another group first and the write
        carries both. The caller asks at most GATHER_PASSES times per write: never a wait for
        events that do not come (an idle publisher has nothing to run)."""
        bus = self.bus
        if bus.closed:
            return False
        ring, state = bus.ring, self.sub.state
        pending = ring.last_id - state.cursor
        return pending > 0 and worth_gathering(ring.bytes_since(state.cursor), pending,
                                               state.max_queued)

    def next_batch(self) -> list[Event] | None:
        """Live events after the cursor (with a pending warning first); ``None`` when evicted.
        Advances the cursor: these events count as handed to the transport."""
        if self._evicted():
            return None
        sub, ring = self.sub, self.bus.ring
        out: list[Event] = []
        warning = self._take_warning()
        if warning is not None:
            out.append(warning)
        events = ring.since(sub.state.cursor)
        if events:
            last_id = events[-1].id
            assert last_id is not None
            sub.state.cursor = last_id
            totals.events_delivered += len(events)
            out.extend(events)
        return out

    def next_sse(self) -> list[bytes] | None:
        """:meth:`next_batch` as SSE bytes to write: the frames shared by the bus's SSE
        subscribers (``bus.frames``), so a wake-up's events are framed once for all of them."""
        return self._next_frames(self.bus.frames, _sse_frame)

    def next_ws(self) -> list[bytes] | None:
        """:meth:`next_batch` as WebSocket frames to write, one text message per event: the
        frames shared by the bus's WebSocket subscribers (``bus.ws_frames``)."""
        return self._next_frames(self.bus.ws_frames, _ws_frame)

    def _next_frames(self, shared: SharedFrames, frame: Callable[[Event], bytes]
                     ) -> list[bytes] | None:
        if self._evicted():
            return None
        ring, state = self.bus.ring, self.sub.state
        out: list[bytes] = []
        warning = self._take_warning()
        if warning is not None:
            out.append(frame(warning))
        cursor = state.cursor
        if ring.last_id > cursor:
            frames, state.cursor = shared.since(ring, cursor)
            totals.events_delivered += state.cursor - cursor
            out += frames
        return out

    async def wait(self) -> bool:
        """Wait for new events; False when the heartbeat interval passed with none."""
        with trio.move_on_after(self.heartbeat_s):
            await self.bus.wait_for_events(self.sub.state.cursor)
            return True
        return False


def _sse_frame(event: Event) -> bytes:
    return event.sse_frame


def _ws_frame(event: Event) -> bytes:
    return ws_frames([event])


REPLAY_CHUNK_BYTES = 1024 * 1024


def replay_groups(events: Sequence[Event], max_bytes: int = REPLAY_CHUNK_BYTES
                  ) -> list[Sequence[Event]]:
    """``events`` cut into consecutive groups of about ``max_bytes`` (one event at least),
    each written in one go."""
    groups: list[Sequence[Event]] = []
    start, size = 0, 0
    for i, event in enumerate(events):
        size += event.size
        if size >= max_bytes:
            groups.append(events[start:i + 1])
            start, size = i + 1, 0
    if start < len(events):
        groups.append(events[start:])
    return groups


async def replay_events(sub: Subscription, events: Sequence[Event],
                        write: Callable[[Sequence[Event]], Awaitable[None]]) -> bool:
    """Replay ``events`` group by group, keeping the subscriber's replay position current so
    the slow-client rules see a stalled replay. False if it was evicted meanwhile
    (the rest of the replay is not sent)."""
    state = sub.state
    if not events:
        return state.evicted is None
    first = events[0].id
    assert first is not None
    state.replay_pos = first - 1
    try:
        for group in replay_groups(events):
            if state.evicted is not None:
                return False
            await write(group)
            totals.events_delivered += len(group)
            last = group[-1].id
            assert last is not None
            state.replay_pos = last
    finally:
        state.replay_pos = None
    return state.evicted is None
